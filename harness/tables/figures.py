"""The study's figures from the rows (PNG + PDF under ``results/figures/``), one set per model, drawn for a reader:
small multiples by method family, the base model as a reference in every panel, 95% intervals as bars or bands,
short labels (the tables' legend says what they stand for), evaluators at the floor left out with a note.

- ``passkey_<model>``: accuracy vs length (multiples of C), Wilson bars, one panel per family, the base in grey.
- ``nll_<model>``: Figure 3, averaged NLL by position, one panel per family, bootstrap bands over documents where
  the rows keep per-document NLL, the base dashed in every panel.
- ``niah_<model>``: Figure 1/5 heatmaps (depth x length) for the configurations that are not at the floor; NIAH
  where it is measurable for the model, else passkey accuracy by needle depth (said in the title); each cell
  annotated with its number of prompts where the row keeps them.
- ``ppl_vs_downstream_<model>``: Figure 4, PPL at 8C vs the downstream scores that are measurable for the model
  (Needle, RULER, LongBench), x and y error bars, Spearman's rho with its interval over exact-attention methods; a
  second row shows the paper's Table 1 points.
- ``manyshot_<model>``: Figure 2, many-shot accuracy vs number of in-context examples.

What is left out (a panel at the floor, a figure with nothing measurable) is listed by ``build_figures`` in the
errors / notes it returns, so ``results/tables/index.md`` says it.
"""
from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from harness import stats
from harness.results import atomic_write
from harness.tables import estimates as est
from harness.tables.build import _task_mean, attention
from harness.tables.paper import Paper
from harness.tables.rows import Entry, RowSet, num

MARKERS = {("exact", "frozen"): "^", ("exact", "fine-tuned"): "o", ("approximate", "frozen"): "v",
           ("approximate", "fine-tuned"): "s"}
PAPER_FT = ("pi", "yarn", "clex", "ntk_32k", "ntk_64k", "ntk_64k_2b")
BASE_STYLE = dict(color="0.25", ls="--", lw=1.4)



def _suptitle(fig, text: str, fontsize: float = 10) -> None:
    """A figure title wrapped to the figure's width (a long caption must not run off both edges)."""
    width = max(40, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    fig.suptitle("\n".join(textwrap.wrap(text, width)), fontsize=fontsize)

def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    try:  # temp file + rename: a full disk keeps the previous figure
        atomic_write(paths[0], lambda f: fig.savefig(f, format="png", dpi=110))
        atomic_write(paths[1], lambda f: fig.savefig(f, format="pdf"))
    finally:
        plt.close(fig)
    return paths


def family(rs: RowSet, e: Entry) -> tuple[str, str]:
    return attention(rs, e), "frozen" if e.frozen else "fine-tuned"


def panels_by_family(rs: RowSet, ents: list[Entry]) -> list[tuple[str, list[Entry]]]:
    """Small multiples: frozen exact, frozen approximate, fine-tuned exact (the paper's methods), fine-tuned exact
    (other RoPE methods), fine-tuned approximate; the base model is drawn in every panel, not as a member."""
    groups = [("frozen, exact attention", lambda e: family(rs, e) == ("exact", "frozen")),
              ("frozen, approximate attention", lambda e: family(rs, e) == ("approximate", "frozen")),
              ("fine-tuned, exact (the paper's)", lambda e: family(rs, e) == ("exact", "fine-tuned")
               and e.method in PAPER_FT),
              ("fine-tuned, exact (other RoPE methods)", lambda e: family(rs, e) == ("exact", "fine-tuned")
               and e.method not in PAPER_FT),
              ("fine-tuned, approximate attention", lambda e: family(rs, e) == ("approximate", "fine-tuned"))]
    out = []
    for title, pred in groups:
        members = [e for e in ents if pred(e) and not _is_base(e)]
        if members:
            out.append((title, members))
    return out


def _is_base(e: Entry) -> bool:
    return e.method == "base" and e.frozen


def _base(ents: list[Entry]) -> Entry | None:
    b = [e for e in ents if _is_base(e)]
    return b[0] if b else None


def _grid_axes(n: int, ncol: int = 3, w: float = 4.6, h: float = 3.4):
    ncol = min(ncol, n)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(w * ncol, h * nrow + 0.9), squeeze=False, layout="constrained")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, list(axes.flat)[:n]


# -- passkey accuracy by length ----------------------------------------------------------------------------------
def passkey_figure(rs: RowSet, model: str, out_dir: Path, notes: list) -> list[Path]:
    ents = [e for e in rs.for_model(model) if est.lengths_of(rs, e, "passkey", "accuracy")]
    if not ents:
        return []
    fl = est.floor(rs, model, "passkey")
    if not fl.measurable:
        notes.append(f"passkey_{model}: not drawn, {fl.reason}")
        return []
    base = _base(ents)
    panels = panels_by_family(rs, ents)
    fig, axes = _grid_axes(len(panels), h=3.9)
    c = ents[0].native_ctx
    n_seen = set()

    def series(e):
        fs = est.lengths_of(rs, e, "passkey", "accuracy")
        xs = [est.at(rs, e, "passkey", f) for f in fs]
        return [(f, x) for f, x in zip(fs, xs) if x is not None]

    from matplotlib.colors import to_rgba

    for ax, (title, members) in zip(axes, panels):
        if base is not None:
            pts = series(base)
            ax.errorbar([f for f, _ in pts], [x.value for _, x in pts], yerr=_yerr(pts), capsize=0, elinewidth=3,
                        ecolor=to_rgba("0.25", 0.18), label=f"{base.label} (base)", **BASE_STYLE)
        trains = set()
        for i, e in enumerate(members):
            pts = series(e)
            off = 2 ** (0.06 * (i - (len(members) - 1) / 2))   # dodge the bars of one length apart
            col = f"C{i % 10}"
            ax.errorbar([f * off for f, _ in pts], [x.value for _, x in pts], yerr=_yerr(pts), capsize=1.5,
                        elinewidth=0.9, ecolor=to_rgba(col, 0.5), marker="o", ms=4, lw=1.4, color=col, label=e.label)
            n_seen |= {x.n for _, x in pts if x.n}
            if e.train_len and c:
                trains.add(e.train_len / c)
        for tf in trains:
            ax.plot([tf], [-0.05], marker="^", color="0.35", ms=7, clip_on=False, zorder=5)
        ax.set_xscale("log", base=2)
        fs = sorted({f for e in ents for f in est.lengths_of(rs, e, "passkey", "accuracy")})
        ax.set_xticks(fs, [f"{f:g}C" for f in fs])
        ax.minorticks_off()
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    for ax in axes:
        ax.set_xlabel(f"prompt length (C = {c} tokens)", fontsize=8)
        ax.set_ylabel("passkey accuracy", fontsize=8)
    n = ", ".join(str(x) for x in sorted(n_seen))
    _suptitle(fig, f"Passkey retrieval by length ({model}); bars: 95% Wilson intervals, n = {n} prompts per point; "
              "\u25b2 on the axis: training lengths of the panel's methods")
    return _save(fig, out_dir, f"passkey_{model}")


def _yerr(pts):
    lo = [max(0.0, x.value - x.lo) if x.ci else 0 for _, x in pts]
    hi = [max(0.0, x.hi - x.value) if x.ci else 0 for _, x in pts]
    return [lo, hi]


# -- NLL by position ------------------------------------------------------------------------------------------------
def _nll(rs: RowSet, e: Entry):
    p = rs.pick(e, "nll", lambda m, r: m if m.get("positions") and m.get("nll") else None)
    return p.value


def nll_figure(rs: RowSet, model: str, out_dir: Path, notes: list) -> list[Path]:
    ents = [e for e in rs.for_model(model) if _nll(rs, e) is not None]
    if not ents:
        return []
    base = _base(ents)
    panels = panels_by_family(rs, ents)
    if not panels:
        panels = [("base", [])]
    fig, axes = _grid_axes(len(panels), ncol=3, w=4.8, h=3.9)
    c = ents[0].native_ctx or 1
    banded, docs = False, set()
    ylo, yhi = [], []

    def draw(ax, e, **kw):
        nonlocal banded
        m = _nll(rs, e)
        xs = np.asarray([num(x) for x in m["positions"]], float) / c
        ys = np.asarray([num(y) for y in m["nll"]], float)
        line = ax.plot(xs, ys, **kw)[0]
        lo, hi = m.get("ci_lo"), m.get("ci_hi")
        if isinstance(lo, list) and isinstance(hi, list) and all(v is not None for v in lo + hi):
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.18, lw=0)
            banded = True
        if m.get("documents"):
            docs.add(int(m["documents"]))
        ylo.append(np.nanpercentile(ys, 2))
        yhi.append(np.nanpercentile(ys, 98))

    for ax, (title, members) in zip(axes, panels):
        if base is not None:
            draw(ax, base, label=f"{base.label} (base)", **BASE_STYLE)
        for i, e in enumerate(members):
            draw(ax, e, label=e.label, lw=1.2, color=f"C{i % 10}")
        ax.axvline(1, color="0.5", ls=":", lw=1)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
        ax.set_xlabel(f"token position / C (C = {c} tokens)", fontsize=8)
        ax.set_ylabel("mean NLL (nats)", fontsize=8)
    if ylo:
        pad = 0.05 * (max(yhi) - min(ylo))
        for ax in axes:
            ax.set_ylim(min(ylo) - pad, max(yhi) + pad)
    band = ("bands: 95% bootstrap over documents" if banded else
            "no bands: these rows keep only the mean over documents (per-document NLL not recorded)")
    nd = ", ".join(str(d) for d in sorted(docs))
    _suptitle(fig, f"Averaged NLL by position ({model}, n = {nd} documents); dotted: C; {band}")
    if not banded:
        notes.append(f"nll_{model}: {band}")
    return _save(fig, out_dir, f"nll_{model}")


# -- NIAH / passkey-by-depth heatmaps -------------------------------------------------------------------------------
def _grid(rs: RowSet, e: Entry, source: str):
    """(lengths, depths (percent), matrix [depth x length], counts or None) or None."""
    if source == "niah":
        p = rs.pick(e, "niah", lambda m, r: m.get("grid") if isinstance(m.get("grid"), dict) and m["grid"] else None)
        if p.value is None:
            return None
        g = p.value
        lengths = sorted(g, key=lambda x: int(x))
        depths = sorted({float(d) for L in lengths for d in (g[L] or {})})
        mat = np.full((len(depths), len(lengths)), np.nan)
        for j, L in enumerate(lengths):
            for d, v in (g[L] or {}).items():
                v = num(v)
                if v is not None:
                    mat[depths.index(float(d)), j] = v
        return [int(L) for L in lengths], depths, mat, np.ones_like(mat)
    p = rs.pick(e, "passkey", lambda m, r: m if isinstance(m.get("accuracy_by_depth"), dict)
                and m["accuracy_by_depth"] else None)
    if p.value is None:
        return None
    m = p.value
    g = m["accuracy_by_depth"]
    lengths = sorted(g, key=lambda x: int(x))
    nb = max(len(g[L] or []) for L in lengths)
    if nb == 0:
        return None
    depths = [100 * (i + 0.5) / nb for i in range(nb)]
    mat = np.full((nb, len(lengths)), np.nan)
    counts = None
    if isinstance(m.get("depth"), dict) and isinstance(m.get("correct"), dict):
        counts = np.zeros((nb, len(lengths)))
    for j, L in enumerate(lengths):
        for i, v in enumerate(g[L] or []):
            v = num(v)
            if v is not None:
                mat[i, j] = v
        if counts is not None:
            for d in m["depth"].get(L) or []:
                counts[min(int(float(d) * nb), nb - 1), j] += 1
    return [int(L) for L in lengths], depths, mat, counts


def niah_figure(rs: RowSet, model: str, out_dir: Path, notes: list) -> list[Path]:
    ents = rs.for_model(model)
    fl_niah = est.floor(rs, model, "niah")
    has_niah = any(_grid(rs, e, "niah") is not None for e in ents)
    source = "niah" if has_niah and fl_niah.measurable else "passkey"
    if source == "passkey" and not est.floor(rs, model, "passkey").measurable:
        notes.append(f"niah_{model}: not drawn, NIAH and passkey not measurable at this scale")
        return []
    if has_niah and source == "passkey":
        notes.append(f"niah_{model}: NIAH not measurable at this scale ({fl_niah.reason}); the heatmaps show passkey "
                     "accuracy by needle depth instead")
    panels, floor_ = [], []
    order = {t: i for i, (t, _) in enumerate(panels_by_family(rs, ents))}
    fam_of = {id(e): t for t, ms in panels_by_family(rs, ents) for e in ms}
    ents = sorted(ents, key=lambda e: (not _is_base(e), order.get(fam_of.get(id(e)), 99)))
    for e in ents:
        g = _grid(rs, e, source)
        if g is None:
            continue
        if np.nanmax(g[2]) <= 0:
            floor_.append(e.label)
            continue
        panels.append((e, g))
    if not panels:
        notes.append(f"niah_{model}: every configuration at 0 ({source})")
        return []
    fig, axes = _grid_axes(len(panels), ncol=4, w=3.3, h=2.6)
    cmap = matplotlib.colormaps["RdYlGn"]
    im = None
    c = panels[0][0].native_ctx or 1
    annotated = False
    for ax, (e, (lengths, depths, mat, counts)) in zip(axes, panels):
        im = ax.imshow(mat, aspect="auto", cmap=cmap, vmin=0, vmax=1, origin="upper",
                       extent=(-0.5, len(lengths) - 0.5, len(depths) - 0.5, -0.5))
        ax.set_xticks(range(len(lengths)), [f"{L / c:g}C" for L in lengths], fontsize=7)
        step = max(1, len(depths) // 5)
        ax.set_yticks(range(0, len(depths), step), [f"{depths[i]:.0f}%" for i in range(0, len(depths), step)],
                      fontsize=7)
        if counts is not None and source == "passkey":
            annotated = True
            for i in range(len(depths)):
                for j in range(len(lengths)):
                    if counts[i, j]:
                        k = int(round(mat[i, j] * counts[i, j])) if not np.isnan(mat[i, j]) else 0
                        ax.text(j, i, f"{k}/{int(counts[i, j])}", ha="center", va="center", fontsize=5.5)
        tl = e.train_len or e.native_ctx
        if tl:
            k = sum(1 for L in lengths if L <= tl)
            ax.axvline(k - 0.5, color="white", ls="--", lw=2)
            ax.axvline(k - 0.5, color="black", ls="--", lw=0.8)
        ax.set_title(e.label, fontsize=9)
    what = "NIAH score (one needle per cell)" if source == "niah" else "passkey accuracy by needle depth"
    cells = "cells: correct/prompts" if annotated else "cells: few prompts each (counts not in these rows)"
    if source == "passkey":
        n = {x.n for e, _ in panels for f in est.lengths_of(rs, e, "passkey", "accuracy")
             if (x := est.at(rs, e, "passkey", f)) is not None and x.n}
        cells += f"; n = {', '.join(str(v) for v in sorted(n))} prompts per length"
    fig.colorbar(im, ax=axes, shrink=0.8, label=what.split(" (")[0])
    left = f"; at 0 everywhere, not drawn: {', '.join(floor_)}" if floor_ else ""
    _suptitle(fig, f"{what} ({model}); x: length (C = {c} tokens), y: needle depth; dashed: training length; "
              f"white: no prompt in that cell; {cells}{left}", fontsize=9)
    return _save(fig, out_dir, f"niah_{model}")


# -- many-shot -----------------------------------------------------------------------------------------------------
def manyshot_figure(rs: RowSet, model: str, out_dir: Path, notes: list) -> list[Path]:
    lines = []
    for e in rs.for_model(model):
        p = rs.pick(e, "manyshot", lambda m, r: m.get("accuracy") if isinstance(m.get("accuracy"), dict)
                    and m["accuracy"] else None)
        if p.value is not None:
            pts = sorted((int(k), num(v)) for k, v in p.value.items() if num(v) is not None)
            if pts:
                lines.append((e, pts, p.row))
    if not lines:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    from harness.tables import bootstrap as bs

    banded = False
    for e, pts, row in lines:
        fam = family(rs, e)
        ln = ax.plot([x for x, _ in pts], [y for _, y in pts], marker=MARKERS[fam], label=e.label,
                     ls="-" if fam[0] == "exact" else "--")[0]
        ci = [bs.interval_for(row, ["manyshot_trec"], ["correct", "score"], {"shots": x}, None, y) for x, y in pts]
        if all(c is not None for c in ci):
            ax.fill_between([x for x, _ in pts], [c[0] for c in ci], [c[1] for c in ci], color=ln.get_color(),
                            alpha=0.15, lw=0)
            banded = True
    ax.set_xscale("log")
    ax.set_xlabel("number of examples in context")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Many-shot in-context learning, TREC ({model})" +
                 ("; bands: bootstrap 95%" if banded else "; no bands: per-sample records not available"))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out_dir, f"manyshot_{model}")


# -- PPL vs downstream ---------------------------------------------------------------------------------------------
def scatter_points(rs: RowSet, model: str) -> dict:
    """{panel: [(label, family, ppl Est, score Est)]} for the downstream metrics measurable for the model."""
    spec = rs.spec["table1"]
    ents = rs.for_model(model)
    fl = {k: est.floor(rs, model, k) for k in ("niah", "passkey", "ruler")}
    has_niah = any(est.lengths_of(rs, e, "niah", "score") for e in ents)
    needle = "niah" if has_niah and fl["niah"].measurable else ("passkey" if fl["passkey"].measurable else None)
    out: dict = {}
    for e in ents:
        ppl = est.at(rs, e, "ppl_pg19", float(spec["PPL"]["at"]))
        if ppl is None or ppl.value is None or not math.isfinite(ppl.value):
            continue
        fam = family(rs, e)
        if needle:
            metric = "score" if needle == "niah" else "accuracy"
            x = est.pooled([est.at(rs, e, needle, f) for f in est.lengths_of(rs, e, needle, metric)])
            if x is not None:
                out.setdefault(f"Needle ({'NIAH' if needle == 'niah' else 'passkey'}, x100)", []).append(
                    (e.label, fam, ppl, _scaled(x, 100)))
        if fl["ruler"].measurable:
            x = est.at(rs, e, "ruler", float(spec["RULER"]["at"]))
            if x is not None:
                out.setdefault("RULER at 8C", []).append((e.label, fam, ppl, x))
        lb = num(rs.pick(e, "longbench", lambda m, r: _task_mean(m)).value)
        if lb is not None:
            out.setdefault("LongBench", []).append((e.label, fam, ppl, est.Est(lb)))
    return out


def _scaled(x, k):
    return est.Est(x.value * k, x.lo * k if x.ci else None, x.hi * k if x.ci else None, x.n, x.unit, x.kind)


def _repel_labels(ax, pts, fontsize: float = 7):
    """Short labels beside their points, moved down past any label already placed there (top to bottom), with a
    leader line when moved, so that no label is printed over another. Offsets are in points: the layout may still
    move the axes."""
    fig = ax.figure
    fig.canvas.draw()
    k = 72.0 / fig.dpi                      # points per pixel
    h = 1.25 * fontsize / k                 # label height in pixels
    placed = []                             # (left, y, width) in pixels
    for lab, x, y in sorted(pts, key=lambda t: (-t[2], t[1])):
        px, py = ax.transData.transform((x, y))
        w = 0.62 * fontsize * len(lab) / k
        left, ty = px + 5, py
        for _ in range(80):
            clash = [q for q in placed if abs(ty - q[1]) < h and left < q[0] + q[2] + 3 and q[0] < left + w + 3]
            if not clash:
                break
            ty = min(q[1] for q in clash) - h
        placed.append((left, ty, w))
        moved = abs(ty - py) > 0.6 * h
        ann = ax.annotate(lab, (x, y), xytext=(5, (ty - py) * k), textcoords="offset points", fontsize=fontsize,
                          va="center", arrowprops=dict(arrowstyle="-", color="0.55", lw=0.5) if moved else None)
        ann.set_in_layout(False)


def scatter_figure(rs: RowSet, paper: Paper, model: str, out_dir: Path, notes: list) -> list[Path]:
    pts = scatter_points(rs, model)
    if not pts:
        notes.append(f"ppl_vs_downstream_{model}: no downstream metric is measurable at this scale")
        return []
    panels = list(pts)
    pt = paper.table("table1")
    cols = pt["columns"]
    colmap = {"Needle": "Needle", "RULER": "RULER", "LongBench": "LongB"}
    fig, axes = plt.subplots(2, len(panels), figsize=(6.2 * len(panels), 9.5), squeeze=False, layout="constrained")
    for j, k in enumerate(panels):
        ax = axes[0][j]
        d = pts[k]
        for fam, mk in MARKERS.items():
            sel = [p for p in d if p[1] == fam]
            if not sel:
                continue
            colr = "C0" if fam[0] == "exact" else "C3"
            xs = [p[2].value for p in sel]
            ys = [p[3].value for p in sel]
            xerr = [[max(0.0, p[2].value - p[2].lo) if p[2].ci else 0 for p in sel],
                    [max(0.0, p[2].hi - p[2].value) if p[2].ci else 0 for p in sel]]
            yerr = [[max(0.0, p[3].value - p[3].lo) if p[3].ci else 0 for p in sel],
                    [max(0.0, p[3].hi - p[3].value) if p[3].ci else 0 for p in sel]]
            ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt=mk, ms=7, color=colr, ecolor=colr, elinewidth=0.8,
                        alpha=0.9, capsize=2, mfc="white" if fam[1] == "frozen" else colr,
                        label=f"{fam[0]} attention, {fam[1]}")
        ax.margins(x=0.14, y=0.06)
        _repel_labels(ax, [(p[0], p[2].value, p[3].value) for p in d])
        ex = [p for p in d if p[1][0] == "exact"]
        rho = stats.spearman_interval([p[2].value for p in ex], [p[3].value for p in ex]) if len(ex) >= 5 else None
        rtxt = (f"Spearman rho (exact methods, n = {len(ex)}) = {rho[0]:.2f} [{rho[1]:.2f}, {rho[2]:.2f}]" if rho
                else f"Spearman rho: n/a (n = {len(ex)} exact methods)")
        noxci = any(p[2].ci is None for p in d)
        ax.set_title(f"ours ({model}): {k} vs PPL at 8C\n{rtxt}", fontsize=9)
        ax.set_xlabel("PPL on books at 8C" + (" (no x bars: per-document NLL not in these rows)" if noxci else ""),
                      fontsize=8)
        ax.set_ylabel(k, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        # the paper's Table 1 points
        pax = axes[1][j]
        c = colmap.get(k.split(" ")[0])
        if c in cols:
            for r in pt["rows"]:
                fam = (r["attention"], r["training"])
                v = dict(zip(cols, r["values"]))
                colr = "C0" if fam[0] == "exact" else "C3"
                pax.scatter([v["PPL"]], [v[c]], marker=MARKERS[fam], s=50, color=colr,
                            facecolors="white" if fam[1] == "frozen" else colr, edgecolors=colr)
            pax.margins(x=0.12, y=0.06)
            _repel_labels(pax, [(r["label"], dict(zip(cols, r["values"]))["PPL"], dict(zip(cols, r["values"]))[c])
                                for r in pt["rows"]])
            exr = [dict(zip(cols, r["values"])) for r in pt["rows"] if r["attention"] == "exact"]
            rp = stats.spearman([v["PPL"] for v in exr], [v[c] for v in exr])
            pax.set_title(f"paper, LLaMA2-7B (Table 1): {c} vs PPL at 32k\nSpearman rho (exact, n = {len(exr)}) = "
                          + (f"{rp:.2f}" if rp is not None else "n/a") + " (no intervals published)", fontsize=9)
            pax.set_xlabel("PPL on PG19 at 32k", fontsize=8)
            pax.set_ylabel(c, fontsize=8)
            pax.grid(alpha=0.3)
        else:
            pax.axis("off")
    _suptitle(fig, f"Perplexity and downstream scores ({model}); bars: 95% intervals")
    return _save(fig, out_dir, f"ppl_vs_downstream_{model}")


def build_figures(rs: RowSet, paper: Paper, out_dir: str | Path, errors: list | None = None,
                  notes: list | None = None) -> list[Path]:
    out_dir = Path(out_dir)
    paths = []
    notes = notes if notes is not None else []
    for model in rs.models():
        for fn, args in ((passkey_figure, (rs, model, out_dir, notes)), (niah_figure, (rs, model, out_dir, notes)),
                         (manyshot_figure, (rs, model, out_dir, notes)), (nll_figure, (rs, model, out_dir, notes)),
                         (scatter_figure, (rs, paper, model, out_dir, notes))):
            try:
                paths += fn(*args)
            except Exception as ex:  # noqa: BLE001 - reported, not hidden
                plt.close("all")
                msg = f"{fn.__name__}({model}) failed: {type(ex).__name__}: {ex}"
                print(f"warning: {msg}", file=sys.stderr)
                if errors is not None:
                    errors.append(msg)
    return paths
