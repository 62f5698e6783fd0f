"""The study's figures from the rows (PNG + PDF under ``results/figures/``), one set per model.

- ``niah_<model>``: Figure 1/5 style heatmaps per method, depth x length, the training length (frozen: the native
  window) as a dashed line; NIAH ``grid`` where run, else passkey ``accuracy_by_depth`` (said in the title).
- ``manyshot_<model>``: Figure 2, many-shot accuracy vs number of in-context examples.
- ``nll_<model>``: Figure 3, averaged NLL by token position.
- ``ppl_vs_downstream_<model>``: Figure 4, PPL at 8C vs Needle / LongBench / RULER, one marker per family
  (exact/approximate x frozen/fine-tuned), Pearson r per panel; a second row shows the paper's Table 1 points.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from harness.tables.build import _mean_series, _task_mean, attention, series_getter  # noqa: E402
from harness.tables.paper import Paper  # noqa: E402
from harness.tables.rows import Entry, RowSet, kfmt, num  # noqa: E402

MARKERS = {("exact", "frozen"): "^", ("exact", "fine-tuned"): "o", ("approximate", "frozen"): "v",
           ("approximate", "fine-tuned"): "s"}


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.savefig(paths[0], dpi=100)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def _grid(rs: RowSet, e: Entry):
    """(lengths, depths (percent), matrix [depth x length], source) or None."""
    p = rs.pick(e, "niah", lambda m, r: m.get("grid") if isinstance(m.get("grid"), dict) and m["grid"] else None)
    if p.value is not None:
        g = p.value
        lengths = sorted(g, key=lambda x: int(x))
        depths = sorted({float(d) for L in lengths for d in (g[L] or {})})
        mat = np.full((len(depths), len(lengths)), np.nan)
        for j, L in enumerate(lengths):
            for d, v in (g[L] or {}).items():
                v = num(v)
                if v is not None:
                    mat[depths.index(float(d)), j] = v
        return [int(L) for L in lengths], depths, mat, "NIAH"
    p = rs.pick(e, "passkey", lambda m, r: m.get("accuracy_by_depth") if isinstance(m.get("accuracy_by_depth"), dict)
                and m["accuracy_by_depth"] else None)
    if p.value is not None:
        g = p.value
        lengths = sorted(g, key=lambda x: int(x))
        nb = max(len(g[L] or []) for L in lengths)
        if nb == 0:
            return None
        depths = [100 * (i + 0.5) / nb for i in range(nb)]
        mat = np.full((nb, len(lengths)), np.nan)
        for j, L in enumerate(lengths):
            for i, v in enumerate(g[L] or []):
                v = num(v)
                if v is not None:
                    mat[i, j] = v
        return [int(L) for L in lengths], depths, mat, "passkey"
    return None


def niah_figure(rs: RowSet, model: str, out_dir: Path) -> list[Path]:
    panels = [(e, g) for e in rs.for_model(model) if (g := _grid(rs, e)) is not None]
    if not panels:
        return []
    n = len(panels)
    ncol = min(3, n)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow + 0.6), squeeze=False, layout="constrained")
    cmap = matplotlib.colormaps["RdYlGn"]
    im = None
    for ax, (e, (lengths, depths, mat, src)) in zip(axes.flat, panels):
        im = ax.imshow(mat, aspect="auto", cmap=cmap, vmin=0, vmax=1, origin="upper",
                       extent=(-0.5, len(lengths) - 0.5, len(depths) - 0.5, -0.5))
        c = e.native_ctx or 1
        ax.set_xticks(range(len(lengths)), [kfmt(4096 * L / c) for L in lengths], fontsize=8)
        step = max(1, len(depths) // 6)
        ax.set_yticks(range(0, len(depths), step), [f"{depths[i]:.0f}%" for i in range(0, len(depths), step)],
                      fontsize=8)
        tl = e.train_len or e.native_ctx
        if tl:
            k = sum(1 for L in lengths if L <= tl)
            ax.axvline(k - 0.5, color="white", ls="--", lw=2)
            ax.axvline(k - 0.5, color="black", ls="--", lw=0.8)
        ax.set_title(f"{e.label} ({src})", fontsize=9)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.supxlabel(f"context length (paper units: 4k = C = {panels[0][0].native_ctx} tokens of {model})", fontsize=9)
    fig.supylabel("depth of needle", fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label="retrieval accuracy")
    fig.suptitle(f"Needle in a haystack ({model}); dashed: longest training length", fontsize=10)
    return _save(fig, out_dir, f"niah_{model}")


def manyshot_figure(rs: RowSet, model: str, out_dir: Path) -> list[Path]:
    lines = []
    for e in rs.for_model(model):
        p = rs.pick(e, "manyshot", lambda m, r: m.get("accuracy") if isinstance(m.get("accuracy"), dict)
                    and m["accuracy"] else None)
        if p.value is not None:
            pts = sorted((int(k), num(v)) for k, v in p.value.items() if num(v) is not None)
            if pts:
                lines.append((e, pts))
    if not lines:
        return []
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    for e, pts in lines:
        fam = (attention(rs, e), "frozen" if e.frozen else "fine-tuned")
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker=MARKERS[fam], label=e.label,
                ls="-" if fam[0] == "exact" else "--")
    ax.set_xscale("log")
    ax.set_xlabel("number of examples in context")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Many-shot in-context learning, TREC ({model})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out_dir, f"manyshot_{model}")


def nll_figure(rs: RowSet, model: str, out_dir: Path) -> list[Path]:
    lines = []
    for e in rs.for_model(model):
        p = rs.pick(e, "nll", lambda m, r: m if m.get("positions") and m.get("nll") else None)
        if p.value is not None:
            lines.append((e, p.value))
    if not lines:
        return []
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    for e, m in lines:
        xs = [num(x) for x in m["positions"]]
        ys = [num(y) for y in m["nll"]]
        ax.plot(xs, ys, label=e.label, lw=1.2)
    c = lines[0][0].native_ctx
    if c:
        ax.axvline(c, color="grey", ls=":", lw=1)
        ax.text(c, ax.get_ylim()[1], " C", va="top", fontsize=8, color="grey")
    ax.set_xlabel("token position")
    ax.set_ylabel("averaged NLL")
    ax.set_title(f"Averaged NLL by position ({model})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out_dir, f"nll_{model}")


def _pearson(xs, ys):
    if len(xs) < 3:
        return None
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    if x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def scatter_points(rs: RowSet, model: str) -> dict:
    """{panel: [(label, family, ppl, score)]} for Needle / LongBench / RULER."""
    spec = rs.spec["table1"]
    out = {"Needle": [], "LongBench": [], "RULER": []}
    for e in rs.for_model(model):
        ppl = num(rs.pick(e, "ppl_pg19", series_getter("ppl", float(spec["PPL"]["at"]))).value)
        if ppl is None or not math.isfinite(ppl):
            continue
        fam = (attention(rs, e), "frozen" if e.frozen else "fine-tuned")
        needle = None
        for s in ("niah", "passkey"):
            sd = rs.spec["sources"][s]
            needle = num(rs.pick(e, s, lambda m, r, sd=sd: _mean_series(m, sd["metric"], sd.get("scale", 1))).value)
            if needle is not None:
                break
        lb = num(rs.pick(e, "longbench", lambda m, r: _task_mean(m)).value)
        ru = num(rs.pick(e, "ruler", series_getter("average", float(spec["RULER"]["at"]))).value)
        for k, v in (("Needle", needle), ("LongBench", lb), ("RULER", ru)):
            if v is not None:
                out[k].append((e.label, fam, ppl, v))
    return out


def scatter_figure(rs: RowSet, paper: Paper, model: str, out_dir: Path) -> list[Path]:
    pts = scatter_points(rs, model)
    if not any(pts.values()):
        return []
    pt = paper.table("table1")
    cols = pt["columns"]
    ppts = {"Needle": [], "LongBench": [], "RULER": []}
    for r in pt["rows"]:
        fam = (r["attention"], r["training"])
        v = dict(zip(cols, r["values"]))
        for k, c in (("Needle", "Needle"), ("LongBench", "LongB"), ("RULER", "RULER")):
            ppts[k].append((r["label"], fam, v["PPL"], v[c]))
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5), squeeze=False)
    for row, (data, who) in enumerate(((pts, f"ours ({model}, PPL at 8C)"), (ppts, "paper Table 1 (PPL at 32k)"))):
        for ax, k in zip(axes[row], ("Needle", "LongBench", "RULER")):
            d = data[k]
            for fam, mk in MARKERS.items():
                sel = [p for p in d if p[1] == fam]
                if sel:
                    ax.scatter([p[2] for p in sel], [p[3] for p in sel], marker=mk, s=45,
                               label=f"{fam[0]}, {fam[1]}", facecolors="none" if fam[1] == "frozen" else None,
                               edgecolors="C0" if fam[0] == "exact" else "C3",
                               c=None if fam[1] == "frozen" else ("C0" if fam[0] == "exact" else "C3"))
            for lab, _, x, y in d:
                ax.annotate(lab, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
            r = _pearson([p[2] for p in d], [p[3] for p in d])
            ex = [p for p in d if p[1][0] == "exact"]
            rx = _pearson([p[2] for p in ex], [p[3] for p in ex])
            fmt = lambda v, n: f"{v:.2f} (n={n})" if v is not None else f"n/a (n={n})"  # noqa: E731
            ax.set_title(f"{k} vs PPL: {who}\nPearson r all: {fmt(r, len(d))}; exact: {fmt(rx, len(ex))}",
                         fontsize=8)
            ax.set_xlabel("perplexity (PG19)", fontsize=8)
            ax.set_ylabel(k, fontsize=8)
            ax.grid(alpha=0.3)
    handles, labels = [], []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _save(fig, out_dir, f"ppl_vs_downstream_{model}")


def build_figures(rs: RowSet, paper: Paper, out_dir: str | Path, errors: list | None = None) -> list[Path]:
    out_dir = Path(out_dir)
    paths = []
    for model in rs.models():
        for fn, args in ((niah_figure, (rs, model, out_dir)), (manyshot_figure, (rs, model, out_dir)),
                         (nll_figure, (rs, model, out_dir)), (scatter_figure, (rs, paper, model, out_dir))):
            try:
                paths += fn(*args)
            except Exception as ex:  # noqa: BLE001 - reported, not hidden
                plt.close("all")
                msg = f"{fn.__name__}({model}) failed: {type(ex).__name__}: {ex}"
                print(f"warning: {msg}", file=sys.stderr)
                if errors is not None:
                    errors.append(msg)
    return paths
