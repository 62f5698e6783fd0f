"""The study's figures from the rows (PNG + PDF under ``results/figures/``), one set per model, drawn for a reader:
small multiples by method family, the base model as a grey dashed reference in every panel, 95% intervals as bars
or bands, short labels (the tables' legend says what they stand for).

- ``passkey_<model>``: accuracy vs length (multiples of C), Wilson bars, one panel per family.
- ``nll_<model>``: Figure 3, averaged NLL by position, one panel per family, bootstrap bands over documents where
  the rows keep per-document NLL.
- ``passkey_depth_<model>`` (``niah_depth_<model>`` where NIAH is measurable for the model): Figure 1/5 heatmaps,
  score by needle depth x length, one panel per configuration that is not at 0 everywhere. No numbers in the cells:
  a cell whose 95% Wilson interval is wider than ``WIDE_CELL`` (too few prompts to trust its colour) is hatched, and
  the title gives the prompts per cell.
- ``ppl_vs_downstream_<model>``: Figure 4, PPL at 8C vs the downstream scores that are measurable for the model
  (Needle, RULER, LongBench), x and y error bars, Spearman's rho with its interval over exact-attention methods; a
  second row shows the paper's Table 1 points.
- ``manyshot_<model>``: Figure 2, many-shot accuracy vs number of in-context examples.

Three rules hold in every figure, so that a reader can trust what the eye picks up:

- One style per method: its colour (Paul Tol's colour-blind-safe "muted" palette) and marker are the method's facts
  (``color``, ``marker`` in ``conf/method/<name>.yaml``; ``method_style``), so a method looks the same in every
  panel, figure, run and study, whatever other rows are drawn; configurations of one method (frozen and fine-tuned,
  ``#2``) differ by line style (``method_styles``). Heatmaps use viridis (no red-green contrast).
- No axis clips a curve: limits are set from every point and interval end drawn; where values span more than a
  factor of ``LOG_RANGE`` (perplexity past the window) the axis is logarithmic.
- Nothing the tables print as ``n.m.`` is drawn: every figure and panel asks ``estimates.floor``, the rule behind
  each ``n.m.`` (the evaluator's ``floor``, harness.evals).
- Point labels are placed by adjustText, inside the axes and clear of each other, with a leader line when moved; in
  an axes where some labels still overlap after placement, the labels are replaced by a legend.

What is left out (a figure or panel not measurable, a configuration at 0) is listed by ``build_figures`` in the
notes it returns, so ``results/tables/index.md`` says it.
"""
from __future__ import annotations

import math
import sys
import textwrap
import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
from adjustText import adjust_text
from matplotlib.colors import to_rgba
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from controlled_study import estimates as est
from controlled_study import samples
from controlled_study.build import attention, task_mean
from controlled_study.paper import Paper
from controlled_study.rows import Entry, RowSet, num
from harness import stats
from harness.methods import METHODS
from harness.results import atomic_write
from harness.safe import safe_file

# one colour per method (its facts declare it): Paul Tol's "muted" nine, his "bright" and "vibrant" sets' other
# colours, and two more, so that no two methods drawn in one panel share a colour (22 methods and a variant; the
# marker and the line style tell configurations of one method apart). A method without facts of its own (a
# plugin) gets a pair of ``PALETTE`` x ``MARKERS`` fixed by its name.
PALETTE = ("#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99", "#999933", "#AA4499",
           "#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377", "#EE7733", "#0077BB", "#33BBEE",
           "#EE3377", "#CC3311", "#009988", "#8C564B", "#7F3C8D")
MARKERS = ("o", "s", "D", "^", "v", "P")       # the second, third, ... pass through the palette
LINESTYLES = ("-", "--", ":", "-.")            # configurations of one method: the first, the second, ...
HEATMAP = "viridis"                              # perceptually uniform, colour-blind safe
LOG_RANGE = 3.0                                  # values spanning more than this factor: a logarithmic axis
WIDE_CELL = 0.5                                  # a heatmap cell whose 95% interval is wider than this is hatched
DRAWN = ("passkey", "niah", "nll", "manyshot", "ppl_pg19")   # the spec.yaml sources some figure draws
PANELS = ("frozen, exact attention", "frozen, approximate attention", "fine-tuned, exact (the paper's)",
          "fine-tuned, exact (other RoPE methods)", "fine-tuned, approximate attention")


def _suptitle(fig, text: str, fontsize: float = 10) -> None:
    """A figure title wrapped to the figure's width (a long caption must not run off both edges)."""
    width = max(40, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    fig.suptitle("\n".join(textwrap.wrap(text, width)), fontsize=fontsize)


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [safe_file(out_dir, name, suffix, "figure name") for suffix in (".png", ".pdf")]  # never outside out_dir
    try:  # temp file + rename: a full disk keeps the previous figure
        atomic_write(paths[0], lambda f: fig.savefig(f, format="png", dpi=110))
        # no creation date in the PDF: the same rows give the same bytes (a regenerated study diffs clean)
        atomic_write(paths[1], lambda f: fig.savefig(f, format="pdf", metadata={"CreationDate": None}))
    finally:
        plt.close(fig)
    return paths


def _measurable(rs: RowSet, model: str, source: str, what: str, notes: list) -> bool:
    """Whether the tables print numbers (not ``n.m.``) for ``source`` of ``model``: ``estimates.floor``, the rule
    behind every ``n.m.``. When not, a note says that ``what`` is left out and why."""
    fl = est.floor(rs, model, source)
    if not fl.measurable:
        notes.append(f"{what}: not drawn, {fl.reason}")
    return fl.measurable


# -- families, panels and one style per configuration ----------------------------------------------------------------
def family(rs: RowSet, e: Entry) -> tuple[str, str]:
    return attention(rs, e), "frozen" if e.frozen else "fine-tuned"


def _is_base(e: Entry) -> bool:
    return e.method == "base" and e.frozen


def _base(ents: list[Entry]) -> Entry | None:
    b = [e for e in ents if _is_base(e)]
    return b[0] if b else None


def _paper_finetuned(paper: Paper) -> set:
    """The method keys the paper fine-tuned with exact attention (its Table 1 rows)."""
    return {r["key"] for r in paper.table("table1")["rows"]
            if r.get("training") == "fine-tuned" and r.get("attention") == "exact"}


def panel_of(rs: RowSet, e: Entry, paper: Paper) -> int | None:
    """Index into ``PANELS`` of the entry's small multiple; None for the base model, drawn in every panel."""
    if _is_base(e):
        return None
    att, tr = family(rs, e)
    if tr == "frozen":
        return 0 if att == "exact" else 1
    if att == "approximate":
        return 4
    return 2 if e.method in _paper_finetuned(paper) else 3


def panels_by_family(rs: RowSet, paper: Paper, ents: list[Entry]) -> list[tuple[str, list[Entry]]]:
    """Small multiples: (title, members) for each non-empty family in ``PANELS`` order."""
    by: dict = {}
    for e in ents:
        i = panel_of(rs, e, paper)
        if i is not None:
            by.setdefault(i, []).append(e)
    return [(PANELS[i], by[i]) for i in sorted(by)]


def style_key(e: Entry) -> tuple[str, str]:
    """What a style belongs to: the method and the label's suffix (`` (FT)``, `` #2``), i.e. one configuration,
    the same key in every model's figures. A paper row is ``(key, "")``, the key of our row of that method."""
    return e.method, e.suffix


def method_style(key: str) -> dict:
    """``{"color", "marker"}`` of a method (or a variant key): what its facts declare (``color``, ``marker``,
    ``conf/method/<name>.yaml``), the same in every figure, run and study; a method without them (a plugin) gets a
    pair from ``PALETTE`` x ``MARKERS`` fixed by its name."""
    f = METHODS.facts(key)
    if f is not None and f.color and f.marker:
        return {"color": f.color, "marker": f.marker}
    i = zlib.crc32(str(key).encode()) % (len(PALETTE) * len(MARKERS))
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i // len(PALETTE)]}


def method_styles(rs: RowSet, paper: Paper) -> dict[tuple[str, str], dict]:
    """``{style_key: {"color", "marker", "ls"}}`` for every configuration of the rows (all models) and every row of
    the paper's Table 1. Colour and marker are the method's (``method_style``: its facts), so a method looks the same
    whatever rows are drawn; the line style tells apart configurations of one method (a frozen and a fine-tuned
    YaRN, ``NTK-F`` and ``NTK-F #2``): solid for the first by the time of its first row, then dashed, dotted,
    dash-dotted."""
    first: dict = {}
    for e in rs.entries:
        if _is_base(e):   # the frozen base: BASE, its own dashed grey line
            continue
        t = min(str(r.get("time_start") or r.get("time_end") or "") for rows in e.by_seed.values() for r in rows)
        first[style_key(e)] = min(first.get(style_key(e), t), t)
    out: dict = {}
    by_method: dict = {}
    for k in sorted(first, key=lambda k: (first[k], k)):
        by_method.setdefault(k[0], []).append(k)
    for method, keys in by_method.items():
        for i, k in enumerate(keys):
            out[k] = {**method_style(method), "ls": LINESTYLES[i % len(LINESTYLES)]}
    for k in dict.fromkeys((r["key"], "") for r in paper.table("table1")["rows"]):
        out.setdefault(k, {**method_style(k[0]), "ls": "-"})
    return out


BASE = {**method_style("base"), "ls": "--"}    # the frozen base model, in every figure (its facts' grey star)
BASE_LINE = dict(color=BASE["color"], ls="--", lw=1.4)


def _style(styles: dict, e: Entry) -> dict:
    return BASE if _is_base(e) else styles[style_key(e)]


def _grid_axes(n: int, ncol: int = 3, w: float = 4.6, h: float = 3.4):
    ncol = min(ncol, n)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(w * ncol, h * nrow + 0.9), squeeze=False, layout="constrained")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, list(axes.flat)[:n]


def _fit_y(ax, lo: float, hi: float, floor0: bool = False) -> None:
    """Y limits that hold every value from ``lo`` to ``hi`` with a margin; logarithmic when the values are positive
    and span more than ``LOG_RANGE`` (a curve that explodes past the window keeps the others readable)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return
    if lo > 0 and hi / lo > LOG_RANGE and not floor0:
        ax.set_yscale("log")
        ax.set_ylim(lo / 1.08, hi * 1.08)
        plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))   # 2, 5, 20, 50, ... between the decades
    else:
        pad = 0.05 * (hi - lo) or 0.05 * max(abs(hi), 1.0)
        ax.set_ylim(lo - pad, hi + pad)


def _legend_below(ax) -> None:
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)


# -- passkey accuracy by length ----------------------------------------------------------------------------------
def passkey_figure(rs: RowSet, paper: Paper, model: str, out_dir: Path, notes: list) -> list[Path]:
    ents = [e for e in rs.for_model(model) if est.lengths_of(rs, e, "passkey")]
    if not ents or not _measurable(rs, model, "passkey", f"passkey_{model}", notes):
        return []
    styles = method_styles(rs, paper)
    base = _base(ents)
    panels = panels_by_family(rs, paper, ents) or [("base", [])]  # the base row alone: one panel, as nll_figure
    fig, axes = _grid_axes(len(panels), h=3.9)
    c = ents[0].native_ctx
    n_seen = set()

    def series(e):
        fs = est.lengths_of(rs, e, "passkey")
        xs = [est.at(rs, e, "passkey", f) for f in fs]
        return [(f, x) for f, x in zip(fs, xs) if x is not None]

    for ax, (title, members) in zip(axes, panels):
        if base is not None:
            pts = series(base)
            ax.errorbar([f for f, _ in pts], [x.value for _, x in pts], yerr=_yerr(pts), capsize=0, elinewidth=3,
                        ecolor=to_rgba(BASE["color"], 0.18), label=f"{base.label} (base)", **BASE_LINE)
        trains = set()
        for i, e in enumerate(members):
            pts = series(e)
            off = 2 ** (0.06 * (i - (len(members) - 1) / 2))   # dodge the bars of one length apart
            st = _style(styles, e)
            ax.errorbar([f * off for f, _ in pts], [x.value for _, x in pts], yerr=_yerr(pts), capsize=1.5,
                        elinewidth=0.9, ecolor=to_rgba(st["color"], 0.5), marker=st["marker"], ms=4.5, lw=1.4,
                        ls=st.get("ls", "-"), color=st["color"], label=e.label)
            n_seen |= {x.n for _, x in pts if x.n}
            if e.train_len and c:
                trains.add(e.train_len / c)
        for tf in trains:
            ax.plot([tf], [-0.05], marker="^", color="0.35", ms=7, clip_on=False, zorder=5)
        ax.set_xscale("log", base=2)
        fs = sorted({f for e in ents for f in est.lengths_of(rs, e, "passkey")})
        ax.set_xticks(fs, [f"{f:g}C" for f in fs])
        ax.minorticks_off()
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        _legend_below(ax)
        ax.set_xlabel(f"prompt length (C = {c} tokens)", fontsize=9)
        ax.set_ylabel("passkey accuracy", fontsize=9)
    n = ", ".join(str(x) for x in sorted(n_seen))
    same = "".join(f"; {line}" for line in est.same_outcome_notes(rs, ents, "passkey", "passkey"))
    _suptitle(fig, f"Passkey retrieval by length ({model}); bars: 95% Wilson intervals, n = {n} prompts per point; "
              f"\u25b2 on the axis: training lengths of the panel's methods{same}")
    return _save(fig, out_dir, f"passkey_{model}")


def _yerr(pts):
    lo = [max(0.0, x.value - x.lo) if x.ci else 0 for _, x in pts]
    hi = [max(0.0, x.hi - x.value) if x.ci else 0 for _, x in pts]
    return [lo, hi]


# -- every evaluator's headline metric by length (any model, any rows) ------------------------------------------------
LENGTH_SOURCES = ("ppl_pg19", "ppl_proofpile", "passkey", "niah", "ruler", "babilong", "helmet_recall", "longbench_v2")


def _length_lines(rs: RowSet, model: str, source: str) -> list:
    """[(entry, [(factor, Est)])] of every configuration of ``model`` with ``source``'s headline metric by length."""
    out = []
    for e in sorted(rs.for_model(model), key=lambda e: (not _is_base(e), e.label)):
        pts = [(f, x) for f in est.lengths_of(rs, e, source)
               if (x := est.at(rs, e, source, f)) is not None and x.value is not None and math.isfinite(x.value)]
        if pts:
            out.append((e, pts))
    return out


def length_figure(rs: RowSet, paper: Paper, model: str, out_dir: Path, notes: list) -> list[Path]:
    """``lengths_<model>``: one panel per evaluator with a headline metric by length (perplexity, passkey, NIAH,
    RULER, BABILong, HELMET recall, LongBench v2: ``LENGTH_SOURCES``), every configuration of the model (a hub
    model's as much as the study's) as one line with its 95% interval at each length, in its method's colour and
    marker. An evaluator at the floor for the model gets no panel (``estimates.floor``, as the tables' ``n.m.``);
    perplexity is on a logarithmic axis where it spans more than ``LOG_RANGE``. A legend below, never point labels."""
    panels = []
    for src in LENGTH_SOURCES:
        if src not in rs.spec["sources"]:
            continue
        lines = _length_lines(rs, model, src)
        if lines and _measurable(rs, model, src, f"lengths_{model}, {src} panel", notes):
            panels.append((src, lines))
    if not panels:
        return []
    styles = method_styles(rs, paper)
    fig, axes = _grid_axes(len(panels), ncol=3, w=4.8, h=3.6)
    c = panels[0][1][0][0].native_ctx
    handles: dict = {}
    for ax, (src, lines) in zip(axes, panels):
        xs_all, ys_all, ns, units, kinds = [], [], set(), set(), set()
        for i, (e, pts) in enumerate(lines):
            st = _style(styles, e)
            off = 2 ** (0.025 * (i - (len(lines) - 1) / 2))   # dodge the bars of one length apart
            xs = [f * off for f, _ in pts]
            ys = [x.value for _, x in pts]
            h = ax.errorbar(xs, ys, yerr=_yerr(pts), color=st["color"], marker=st["marker"], ls=st.get("ls", "-"),
                            ms=4.5, lw=1.3, capsize=1.5, elinewidth=0.9, ecolor=to_rgba(st["color"], 0.5),
                            label=e.label)
            handles.setdefault(e.label, h)
            xs_all += xs
            ys_all += ys + [v for _, x in pts if x.ci for v in (x.lo, x.hi)]
            ns |= {x.n for _, x in pts if x.n}
            units |= {x.unit for _, x in pts if x.unit}
            kinds |= {x.kind for _, x in pts}
        fs = sorted({f for _, pts in lines for f, _ in pts})
        ax.set_xscale("log", base=2)
        ax.set_xticks(fs, [f"{f:g}C" for f in fs])
        ax.minorticks_off()
        ax.set_xlim(min(xs_all) / 1.25, max(xs_all) * 1.25)
        _fit_y(ax, min(ys_all), max(ys_all), floor0="ppl" not in kinds)
        what = f"{src} ({est.metric(rs, src)})"
        n = ", ".join(str(k) for k in sorted(ns))
        ax.set_title(f"{what}; n = {n or '?'} {'/'.join(sorted(units))} per point", fontsize=9)
        ax.set_xlabel(f"length (C = {c} tokens)", fontsize=9)
        ax.grid(alpha=0.3)
    fig.legend(handles=list(handles.values()), labels=list(handles), loc="outside lower center",
               ncol=min(6, max(1, len(handles))), fontsize=8, frameon=False)
    _suptitle(fig, f"Every evaluator's headline metric by length ({model}); bars: 95% intervals (Wilson for "
              "accuracies, Student t over documents for perplexity); one colour and marker per method")
    return _save(fig, out_dir, f"lengths_{model}")


# -- NLL by position ------------------------------------------------------------------------------------------------
def _nll(rs: RowSet, e: Entry):
    p = rs.pick(e, "nll", lambda m, r: m if m.get("positions") and m.get("nll") else None)
    return p.value


def nll_figure(rs: RowSet, paper: Paper, model: str, out_dir: Path, notes: list) -> list[Path]:
    ents = [e for e in rs.for_model(model) if _nll(rs, e) is not None]
    if not ents or not _measurable(rs, model, "nll", f"nll_{model}", notes):
        return []
    styles = method_styles(rs, paper)
    base = _base(ents)
    panels = panels_by_family(rs, paper, ents) or [("base", [])]
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
        ends = [ys]
        if isinstance(lo, list) and isinstance(hi, list) and all(v is not None for v in lo + hi):
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.18, lw=0)
            banded = True
            ends += [np.asarray(lo, float), np.asarray(hi, float)]
        if m.get("documents"):
            docs.add(int(m["documents"]))
        ylo.append(min(np.nanmin(v) for v in ends))   # every value and band end: no curve leaves the axes
        yhi.append(max(np.nanmax(v) for v in ends))

    for ax, (title, members) in zip(axes, panels):
        if base is not None:
            draw(ax, base, label=f"{base.label} (base)", **BASE_LINE)
        for i, e in enumerate(members):   # markers staggered: lines on top of each other still show theirs
            st = _style(styles, e)
            draw(ax, e, label=e.label, lw=1.2, color=st["color"], ls=st.get("ls", "-"), marker=st["marker"], ms=4,
                 markevery=(i % 4, 4))
        ax.axvline(1, color="0.5", ls=":", lw=1)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        _legend_below(ax)
        ax.set_xlabel(f"token position / C (C = {c} tokens)", fontsize=9)
        ax.set_ylabel("mean NLL (nats)", fontsize=9)
    if ylo:
        for ax in axes:
            _fit_y(ax, min(ylo), max(yhi))
    band = ("bands: 95% bootstrap over documents" if banded else
            "no bands: these rows keep only the mean over documents (per-document NLL not recorded)")
    nd = ", ".join(str(d) for d in sorted(docs))
    _suptitle(fig, f"Averaged NLL by position ({model}, n = {nd} documents); dotted: C; {band}")
    if not banded:
        notes.append(f"nll_{model}: {band}")
    return _save(fig, out_dir, f"nll_{model}")


# -- score by needle depth x length (heatmaps) -----------------------------------------------------------------------
def _grid(rs: RowSet, e: Entry, source: str):
    """(lengths, depths (percent), matrix [depth x length], prompts per cell or None) or None. NIAH: one needle per
    cell (no counts); passkey: the row's per-prompt depths binned like ``accuracy_by_depth``, when it keeps them."""
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
        return [int(L) for L in lengths], depths, mat, None
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


def wide_cells(mat: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Cells whose 95% Wilson interval (``mat`` x ``counts`` correct of ``counts``) is wider than ``WIDE_CELL``:
    too few prompts for the colour to mean much (1/1 and 1/2 are hatched, 5/5 and 14/14 are not)."""
    out = np.zeros(mat.shape, bool)
    for i, j in zip(*np.nonzero(counts > 0)):
        if not np.isnan(mat[i, j]):
            lo, hi = stats.wilson(round(mat[i, j] * counts[i, j]), int(counts[i, j]))
            out[i, j] = hi - lo > WIDE_CELL
    return out


def depth_figure(rs: RowSet, paper: Paper, model: str, out_dir: Path, notes: list) -> list[Path]:
    ents = rs.for_model(model)
    fl_niah = est.floor(rs, model, "niah")
    has_niah = any(_grid(rs, e, "niah") is not None for e in ents)
    source = "niah" if has_niah and fl_niah.measurable else "passkey"
    name = f"{source}_depth_{model}"
    if not any(_grid(rs, e, source) is not None for e in ents) or not _measurable(rs, model, source, name, notes):
        return []
    if has_niah and source == "passkey":
        notes.append(f"{name}: drawn instead of NIAH by depth, which is not measurable at this scale "
                     f"({fl_niah.reason})")
    styles = method_styles(rs, paper)
    order = list(styles)
    ents = sorted(ents, key=lambda e: (not _is_base(e), panel_of(rs, e, paper) or 0,
                                       order.index(style_key(e)) if style_key(e) in order else 0))
    panels, floor_ = [], []
    for e in ents:
        g = _grid(rs, e, source)
        if g is None:
            continue
        if np.nanmax(g[2]) <= 0:
            floor_.append(e.label)
            continue
        panels.append((e, g))
    if not panels:
        notes.append(f"{name}: not drawn, every configuration at 0")
        return []
    fig, axes = _grid_axes(len(panels), ncol=5, w=3.0, h=2.5)
    cmap = matplotlib.colormaps[HEATMAP]
    im = None
    c = panels[0][0].native_ctx or 1
    per_cell, hatched = set(), False
    for ax, (e, (lengths, depths, mat, counts)) in zip(axes, panels):
        im = ax.imshow(mat, aspect="auto", cmap=cmap, vmin=0, vmax=1, origin="upper",
                       extent=(-0.5, len(lengths) - 0.5, len(depths) - 0.5, -0.5))
        ax.set_xticks(range(len(lengths)), [f"{L / c:g}C" for L in lengths], fontsize=8)
        step = max(1, len(depths) // 5)
        ax.set_yticks(range(0, len(depths), step), [f"{depths[i]:.0f}%" for i in range(0, len(depths), step)],
                      fontsize=8)
        if counts is not None:
            per_cell |= {int(k) for k in counts[counts > 0]}
            for i, j in zip(*np.nonzero(wide_cells(mat, counts))):
                hatched = True   # dark hatching on the light (high) end of the map, light on the rest
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=0, hatch="////",
                                       edgecolor="0.15" if mat[i, j] > 0.65 else "white"))
        tl = e.train_len or e.native_ctx
        if tl:
            k = sum(1 for L in lengths if L <= tl)
            ax.axvline(k - 0.5, color="white", ls="--", lw=2)
            ax.axvline(k - 0.5, color="black", ls="--", lw=0.8)
        ax.set_title(e.label, fontsize=9)
    what = "NIAH score" if source == "niah" else "passkey accuracy"
    fig.colorbar(im, ax=axes, shrink=0.6, label=what)
    handles = [Patch(facecolor="white", edgecolor="0.5", label="no prompt at that depth and length"),
               Line2D([], [], color="black", ls="--", lw=0.8, label="training length (frozen: C)")]
    if hatched:
        handles.insert(0, Patch(facecolor=cmap(0.45), edgecolor="white", hatch="////",
                                label=f"95% Wilson interval wider than {WIDE_CELL:g} (too few prompts in the cell)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles) if len(panels) >= 4 else 1, fontsize=8,
               frameon=False)   # one line where the figure is wide enough
    if source == "niah":
        cells = "n = 1 needle per cell"
    elif per_cell:
        cells = f"n = {'-'.join(str(k) for k in sorted({min(per_cell), max(per_cell)}))} prompts per cell"
    else:
        cells = "prompts per cell not in these rows"
    left = f"; at 0 everywhere, not drawn: {', '.join(floor_)}" if floor_ else ""
    _suptitle(fig, f"{what.capitalize()} by needle depth (y) and prompt length (x, C = {c} tokens), {model}, one "
              f"panel per configuration; {cells}{left}", fontsize=10)
    return _save(fig, out_dir, name)


# -- many-shot -----------------------------------------------------------------------------------------------------
def manyshot_figure(rs: RowSet, paper: Paper, model: str, out_dir: Path, notes: list) -> list[Path]:
    lines = []
    for e in rs.for_model(model):
        p = rs.pick(e, "manyshot", lambda m, r: m.get("accuracy") if isinstance(m.get("accuracy"), dict)
                    and m["accuracy"] else None)
        if p.value is not None:
            pts = sorted((int(k), num(v)) for k, v in p.value.items() if num(v) is not None)
            if pts:
                lines.append((e, pts, p.row))
    if not lines or not _measurable(rs, model, "manyshot", f"manyshot_{model}", notes):
        return []
    styles = method_styles(rs, paper)
    fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    banded = False
    ev = est.evaluator(rs, "manyshot")  # its per-sample records: the file's name and the fields (``records``)
    rec = ev.spec.records
    for e, pts, row in lines:
        st = _style(styles, e)
        ln = ax.plot([x for x, _ in pts], [y for _, y in pts], marker=st["marker"], color=st["color"],
                     label=e.label, ls=st.get("ls", "-"))[0]
        ci = [samples.interval_for(row, [ev.registered_name], list(rec["score"]), {rec["length"]: x}, None, y)
              for x, y in pts] if rec else [None]
        if all(c is not None for c in ci):
            ax.fill_between([x for x, _ in pts], [c[0] for c in ci], [c[1] for c in ci], color=ln.get_color(),
                            alpha=0.15, lw=0)
            banded = True
    ax.set_xscale("log")
    ax.set_xlabel("number of examples in context")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Many-shot in-context learning, TREC ({model})" +
                 ("; bands: bootstrap 95%" if banded else "; no bands: per-sample records not available"),
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out_dir, f"manyshot_{model}")


# -- PPL vs downstream ---------------------------------------------------------------------------------------------
def scatter_points(rs: RowSet, model: str, notes: list | None = None) -> dict:
    """{panel: [(label, family, ppl Est, score Est, entry)]} for the downstream metrics measurable for the model;
    ``notes`` gets what is left out and why."""
    notes = notes if notes is not None else []
    spec = rs.spec["table1"]
    ents = rs.for_model(model)
    what = f"ppl_vs_downstream_{model}"
    has_niah = any(est.lengths_of(rs, e, "niah") for e in ents)
    if has_niah and est.floor(rs, model, "niah").measurable:
        needle = "niah"
    else:  # as Table 1's Needle column: passkey where NIAH is not measurable or was not run
        needle = "passkey" if _measurable(rs, model, "passkey", f"{what}, Needle panel", notes) else None
    ruler = _measurable(rs, model, "ruler", f"{what}, RULER panel", notes)
    longbench = _measurable(rs, model, "longbench", f"{what}, LongBench panel", notes)
    out: dict = {}
    for e in ents:
        ppl = est.at(rs, e, "ppl_pg19", float(spec["PPL"]["at"]))
        if ppl is None or ppl.value is None or not math.isfinite(ppl.value):
            continue
        fam = family(rs, e)
        if needle:
            x = est.pooled([est.at(rs, e, needle, f) for f in est.lengths_of(rs, e, needle)])
            if x is not None:
                out.setdefault(f"Needle ({'NIAH' if needle == 'niah' else 'passkey'}, x100)", []).append(
                    (e.label, fam, ppl, _scaled(x, 100), e))
        if ruler:
            x = est.at(rs, e, "ruler", float(spec["RULER"]["at"]))
            if x is not None:
                out.setdefault("RULER at 8C", []).append((e.label, fam, ppl, x, e))
        lb = num(rs.pick(e, "longbench", lambda m, r: task_mean(m)).value) if longbench else None
        if lb is not None:
            out.setdefault("LongBench", []).append((e.label, fam, ppl, est.Est(lb), e))
    return out


def _scaled(x, k):
    return est.Est(x.value * k, x.lo * k if x.ci else None, x.hi * k if x.ci else None, x.n, x.unit, x.kind)


def _bars(ests) -> list[list[float]]:
    return [[max(0.0, x.value - x.lo) if x.ci else 0 for x in ests],
            [max(0.0, x.hi - x.value) if x.ci else 0 for x in ests]]


def _point(ax, x, y, st: dict, exact: bool, xerr=None, yerr=None) -> None:
    """One configuration: its colour and marker, filled for exact attention (the methods rho is computed over),
    hollow for approximate attention."""
    ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt=st["marker"], ms=8 if st is BASE else 7, color=st["color"],
                ecolor=to_rgba(st["color"], 0.6), elinewidth=0.8, capsize=2, mfc=st["color"] if exact else "white",
                mec=st["color"], mew=1.3, zorder=3)


def _labels(ax, pts: list[tuple[str, float, float]]) -> list:
    """The short labels at their points, laid out later by ``_place_labels`` (kept out of the layout)."""
    texts = []
    for lab, x, y in pts:
        t = ax.text(x, y, lab, fontsize=7.5, zorder=5,   # over the markers and bars, on a light backing
                    bbox=dict(boxstyle="square,pad=0.05", fc="white", ec="none", alpha=0.75))
        t.set_in_layout(False)
        texts.append(t)
    return texts


def _place_labels(fig, placed: list) -> None:
    """Fix the layout, then move each axes' labels apart with adjustText (inside the axes, clear of the points and
    of each other), with a leader line where a label moved away from its point."""
    fig.canvas.draw()
    fig.set_layout_engine("none")   # the labels are placed for these axes positions: keep them
    for ax, texts, xs, ys in placed:
        if not texts:
            continue
        # adjustText pushes overlapping texts apart along the line between them, so two labels that start on one
        # horizontal line stay on it (and stick at the axes' edge): such labels start stacked a line apart
        seen: list = []
        for t in texts:
            px, py = ax.transData.transform(t.get_position())
            w = t.get_window_extent().width
            k = sum(1 for qx, qy, qw in seen if abs(py - qy) < 2 and abs(px - qx) < max(w, qw))
            seen.append((px, py, w))
            if k:
                t.set_position(ax.transData.inverted().transform((px, py - 11 * k)))
        # a fixed number of iterations (adjustText's default is a time limit): the same rows, the same figure
        adjust_text(texts, x=xs, y=ys, target_x=xs, target_y=ys, ax=ax, expand=(1.2, 1.5), force_text=(0.4, 0.8),
                    force_static=(0.3, 0.6), iter_lim=2000, prevent_crossings=False, ensure_inside_axes=True,
                    arrowprops=dict(arrowstyle="-", color="0.45", lw=0.6))
        if _overlapping(ax, texts):   # labels that cannot be placed apart: a legend instead
            _labels_to_legend(ax, texts)


def _overlapping(ax, texts) -> bool:
    """Whether two labels of the axes still overlap, or one leaves the axes, after placement."""
    r = ax.figure.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in texts]
    inside = ax.get_window_extent(r)
    if any(b.x0 < inside.x0 - 1 or b.x1 > inside.x1 + 1 or b.y0 < inside.y0 - 1 or b.y1 > inside.y1 + 1
           for b in boxes):
        return True
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _labels_to_legend(ax, texts) -> None:
    """Remove the point labels (and their leader lines) and name the points in a legend below the axes, each with
    its point's colour and marker."""
    from matplotlib.text import Annotation

    names = [t.get_text() for t in texts]
    for t in texts:
        t.remove()
    for a in [c for c in ax.get_children() if isinstance(c, Annotation)]:
        a.remove()
    handles = []
    for lab, cont in zip(names, list(ax.containers)[:len(names)]):   # one errorbar container per point, in order
        line = cont[0]
        handles.append(Line2D([], [], ls="", marker=line.get_marker(), color=line.get_color(),
                              mfc=line.get_markerfacecolor(), mec=line.get_markeredgecolor(), label=lab))
    ax.legend(handles=handles, fontsize=6.5, loc="best", ncol=2 if len(handles) > 8 else 1, framealpha=0.85)


def scatter_figure(rs: RowSet, paper: Paper, model: str, out_dir: Path, notes: list) -> list[Path]:
    pts = scatter_points(rs, model, notes)
    if not pts:
        notes.append(f"ppl_vs_downstream_{model}: not drawn, no downstream metric is measurable at this scale")
        return []
    styles = method_styles(rs, paper)
    panels = list(pts)
    pt = paper.table("table1")
    cols = pt["columns"]
    colmap = {"Needle": "Needle", "RULER": "RULER", "LongBench": "LongB"}
    fig, axes = plt.subplots(2, len(panels), figsize=(6.4 * len(panels), 10), squeeze=False, layout="constrained")
    placed = []
    for j, k in enumerate(panels):
        ax = axes[0][j]
        d = pts[k]
        for _, fam, ppl, score, e in d:
            _point(ax, ppl.value, score.value, _style(styles, e), fam[0] == "exact", _bars([ppl]), _bars([score]))
        ax.margins(x=0.2, y=0.1)
        xs, ys = [p[2].value for p in d], [p[3].value for p in d]
        placed.append((ax, _labels(ax, [(p[0], p[2].value, p[3].value) for p in d]), xs, ys))
        ex = [p for p in d if p[1][0] == "exact"]
        rho = stats.spearman_interval([p[2].value for p in ex], [p[3].value for p in ex]) if len(ex) >= 5 else None
        rtxt = (f"Spearman rho (exact methods, n = {len(ex)}) = {rho[0]:.2f} [{rho[1]:.2f}, {rho[2]:.2f}]" if rho
                else f"Spearman rho: n/a (n = {len(ex)} exact methods)")
        noxci = any(p[2].ci is None for p in d)
        ax.set_title(f"ours ({model}): {k} vs PPL at 8C\n{rtxt}", fontsize=9)
        ax.set_xlabel("PPL on books at 8C" + (" (no x bars: per-document NLL not in these rows)" if noxci else ""),
                      fontsize=9)
        ax.set_ylabel(k, fontsize=9)
        ax.grid(alpha=0.3)
        # the paper's Table 1 points, in the colours of our configurations of the same methods
        pax = axes[1][j]
        c = colmap.get(k.split(" ")[0])
        if c not in cols:
            pax.axis("off")
            continue
        prow = [(r, dict(zip(cols, r["values"]))) for r in pt["rows"]]
        prow = [(r, v) for r, v in prow if isinstance(v["PPL"], (int, float)) and isinstance(v[c], (int, float))]
        for r, v in prow:
            _point(pax, v["PPL"], v[c], styles[(r["key"], "")], r["attention"] == "exact")
        pax.margins(x=0.2, y=0.1)
        placed.append((pax, _labels(pax, [(r["label"], v["PPL"], v[c]) for r, v in prow]),
                       [v["PPL"] for _, v in prow], [v[c] for _, v in prow]))
        exr = [v for r, v in prow if r["attention"] == "exact"]
        rp = stats.spearman([v["PPL"] for v in exr], [v[c] for v in exr])
        pax.set_title(f"paper, LLaMA2-7B (Table 1): {c} vs PPL at 32k\nSpearman rho (exact, n = {len(exr)}) = "
                      + (f"{rp:.2f}" if rp is not None else "n/a") + " (no intervals published)", fontsize=9)
        pax.set_xlabel("PPL on PG19 at 32k", fontsize=9)
        pax.set_ylabel(c, fontsize=9)
        pax.grid(alpha=0.3)
    dot = dict(ls="", marker="o", ms=7, color="0.35", mew=1.3)
    handles = [Line2D([], [], label="filled: exact attention (rho is over these)", **dot),
               Line2D([], [], mfc="white", label="hollow: approximate attention", **dot),
               Line2D([], [], ls="", marker=BASE["marker"], ms=8, color=BASE["color"], label="the base model")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3 if len(panels) > 1 else 1, fontsize=9,
               frameon=False)
    _suptitle(fig, f"Perplexity and downstream scores ({model}); bars: 95% intervals; one colour and marker per "
              "configuration, as in the other figures")
    _place_labels(fig, placed)
    return _save(fig, out_dir, f"ppl_vs_downstream_{model}")


FIGURES = (length_figure, passkey_figure, depth_figure, manyshot_figure, nll_figure, scatter_figure)


def build_figures(rs: RowSet, paper: Paper, out_dir: str | Path, errors: list | None = None,
                  notes: list | None = None) -> list[Path]:
    out_dir = Path(out_dir)
    paths = []
    notes = notes if notes is not None else []
    for model in rs.models():
        for fn in FIGURES:
            try:
                paths += fn(rs, paper, model, out_dir, notes)
            except Exception as ex:  # noqa: BLE001 - reported, not hidden
                plt.close("all")
                msg = f"{fn.__name__}({model}) failed: {type(ex).__name__}: {ex}"
                print(f"warning: {msg}", file=sys.stderr)
                if errors is not None:
                    errors.append(msg)
    return paths
