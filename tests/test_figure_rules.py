"""Figures for any rows (issue 45): every point and interval inside its axes, and each method's colour and marker
taken from its facts, the same whatever rows are drawn."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D

from controlled_study.paper import Paper
from controlled_study.rows import RowSet, load_spec
from harness.methods import METHODS, facts
from tests.test_tables import make_row


def _draw(monkeypatch, rows) -> dict:
    """Every figure of ``rows``: ``{figure name: figure}`` (``_save`` replaced by a collector; nothing written)."""
    from controlled_study import figures

    figs: dict = {}

    def keep(fig, out_dir, name):
        fig.canvas.draw()
        figs[name] = fig
        return []

    monkeypatch.setattr(figures, "_save", keep)
    figures.build_figures(RowSet(rows, load_spec()), Paper(), "unused")
    return figs


def _outside(ax) -> list:
    """Data points (lines, error bars, bands) of ``ax`` outside its limits."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    tol_x, tol_y = 1e-9 * max(1.0, abs(x1)), 1e-9 * max(1.0, abs(y1))
    pts = []
    for a in ax.get_children():
        if isinstance(a, Line2D):
            xy = np.column_stack([np.asarray(a.get_xdata(), float), np.asarray(a.get_ydata(), float)]) \
                if len(a.get_xdata()) else np.zeros((0, 2))
            if a.get_transform() != ax.transData:   # an axes-fraction line (a reference), not data
                continue
            pts.append(xy)
        elif isinstance(a, LineCollection):
            pts += [np.asarray(s, float) for s in a.get_segments()]
        elif isinstance(a, PolyCollection):
            pts += [np.asarray(p.vertices, float) for p in a.get_paths()]
    bad = []
    for xy in pts:
        for x, y in xy:
            if not (math.isfinite(x) and math.isfinite(y)):
                continue
            if x < x0 - tol_x or x > x1 + tol_x or y < y0 - tol_y or y > y1 + tol_y:
                bad.append((x, y))
    return bad


def _styles(figs: dict) -> dict:
    """{legend label: {(colour, marker)}} over every figure."""
    out: dict = {}
    for fig in figs.values():
        for ax in fig.axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                line = h[0] if isinstance(h, tuple) else h
                out.setdefault(lab, set()).add((to_hex(line.get_color()), line.get_marker()))
        for leg in fig.legends:
            for h, t in zip(leg.legend_handles, leg.get_texts()):
                line = h[0] if isinstance(h, tuple) else h
                if hasattr(line, "get_marker") and line.get_marker() not in (None, "None", ""):
                    out.setdefault(t.get_text(), set()).add((to_hex(line.get_color()), line.get_marker()))
    return out


def _rows(tmp, which: tuple, explode: bool = False) -> list[dict]:
    rows = []
    for m in which:
        r = make_row(tmp, f"{m}-row", m, train="none" if m in ("base", "self_extend", "lm_infinite") else "tiny")
        if explode and m == "base":   # the base's perplexity explodes past the window: 20 -> 20,000
            for k in ("ppl_books", "ppl_code"):
                e = r["metrics"].get(k)
                if e:
                    order = sorted(e["ppl"], key=int)
                    e["ppl"] = {L: e["ppl"][L] * 10 ** i for i, L in enumerate(order)}
                    e["per_sample"] = {L: [x + i * math.log(10) for x in e["per_sample"][L]]
                                       for i, L in enumerate(order)}
            nll = r["metrics"].get("nll_by_position")
            if nll:
                nll["nll"] = [v * (1 + 4 * i / len(nll["nll"])) for i, v in enumerate(nll["nll"])]
        rows.append(r)
    return rows


def test_no_point_or_interval_outside_its_axes(tmp_path, monkeypatch):
    figs = _draw(monkeypatch, _rows(tmp_path, ("base", "pi", "yarn", "self_extend", "longlora"), explode=True))
    assert {"lengths_tiny_llama", "nll_tiny_llama", "passkey_tiny_llama"} <= set(figs)
    for name, fig in figs.items():
        for ax in fig.axes:
            bad = _outside(ax)
            assert not bad, (name, ax.get_title(), bad[:5], ax.get_xlim(), ax.get_ylim())
    plt.close("all")


def test_each_method_keeps_its_colour_and_marker_across_row_sets(tmp_path, monkeypatch):
    """Two `make tables` runs with different rows: every method drawn in both has the colour and marker of its facts
    in both (the old styles were assigned by the order of the rows, so adding a row recoloured others)."""
    one = _styles(_draw(monkeypatch, _rows(tmp_path, ("base", "yarn", "self_extend"))))
    plt.close("all")
    two = _styles(_draw(monkeypatch, _rows(tmp_path, ("base", "pi", "ntk_dynamic", "longlora", "self_extend",
                                                     "yarn", "abf"))))
    plt.close("all")
    for label in ("YaRN", "Self-Extend"):
        assert one[label] == two[label] and len(one[label]) == 1, (label, one[label], two[label])
        f = facts({"YaRN": "yarn", "Self-Extend": "self_extend"}[label])
        assert one[label] == {(f.color.lower(), f.marker)}


def test_every_method_declares_its_own_colour_and_marker_from_the_palette():
    from controlled_study.figures import PALETTE
    from harness.methods import variants

    keys = list(METHODS.names()) + [pf["key"] for _, pf in variants().values()]
    seen: dict = {}
    for k in dict.fromkeys(keys):
        f = facts(k)
        assert f.color and f.marker, f"{k}: facts without color / marker"
        assert f.color.upper() in PALETTE or k == "base", (k, f.color)   # the base: neutral grey
        assert f.color.upper() not in seen or k == "base", (k, seen.get(f.color.upper()))   # one colour each
        seen[f.color.upper()] = k


def test_no_two_methods_drawn_in_one_panel_share_a_colour(tmp_path, monkeypatch):
    """Every panel of every figure the tables draw for rows of every method: the legend's methods each have a colour
    of their own (22 methods shared 10 colours: ABF and Self-Extend both sand, YaRN and STRING both teal, DCA and
    PoSE both green; the 20-line lengths figure could not be read). The configurations of one method share its
    colour and differ in line style."""
    from collections import defaultdict

    rows = _rows(tmp_path, tuple(METHODS.names()))
    figs = _draw(monkeypatch, rows)
    plt.close("all")
    checked = 0
    for name, fig in figs.items():
        for ax in fig.axes:
            by_colour = defaultdict(set)
            for h, lab in zip(*ax.get_legend_handles_labels()):
                line = h[0] if isinstance(h, tuple) else h
                if hasattr(line, "get_color"):
                    by_colour[to_hex(line.get_color())].add(lab.split(" #")[0].split(" (")[0])
            shared = {c: labs for c, labs in by_colour.items() if len(labs) > 1}
            assert not shared, (name, ax.get_title(), shared)
            checked += bool(by_colour)
    assert checked >= 3


def test_two_configurations_with_the_same_outcome_on_every_prompt_are_named_where_one_line_hides_the_other(
        tmp_path, monkeypatch):
    """StreamingLLM right and wrong on exactly LM-Infinite's prompts at every length (the tiny study's case: different
    keys attended, a few prompts decoded differently, the same outcomes): the passkey table says so in a footnote
    and the passkey figure in its caption; a configuration that differs on one prompt is not named."""
    import copy

    from controlled_study import build, figures
    from tests.test_findings import world

    rows = world("paper")
    lm = next(r for r in rows if r["method"] == "lm_infinite")
    twin = copy.deepcopy(lm)
    twin.update(run_id="streaming-f", method="streaming_llm")
    rows.append(twin)
    rs = RowSet(rows, load_spec())
    t = build.summary_table(rs, Paper(), "tiny_llama", "passkey")
    hit = [n for n in t.footnotes if "the same passkey outcome on every one of the 250 prompts" in n]
    assert len(hit) == 1 and "LM-Infinite" in hit[0] and "StreamingLLM" in hit[0]
    captions = []
    monkeypatch.setattr(figures, "_suptitle", lambda fig, text, fontsize=10: captions.append(text))
    figures.passkey_figure(rs, Paper(), "tiny_llama", tmp_path, [])
    assert any("the same passkey outcome" in c and "StreamingLLM" in c for c in captions), captions
    k = next(i for i, v in enumerate(twin["metrics"]["passkey"]["correct"]["512"]) if v in (0, 1))
    twin["metrics"]["passkey"]["correct"]["512"][k] ^= 1   # one prompt differs: no longer the same outcomes
    t = build.summary_table(RowSet(rows, load_spec()), Paper(), "tiny_llama", "passkey")
    assert not [n for n in t.footnotes if "the same passkey outcome" in n]
