"""Finding (g) of the paper: NTK-frozen generalises only to about 2x its window."""
from __future__ import annotations

from controlled_study import estimates as est
from controlled_study.findings.rule import Evidence, Finding, Part, label_of, part_prop, prop_diff
from controlled_study.paper import Paper
from controlled_study.rows import Entry
from harness import stats


def f_g(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("g", "NTK-frozen generalises only to about 2x its window",
                "RULER at 2C: NTK-F minus the base (generalises to 2C); NTK-F at 2C minus NTK-F at 4C, the next "
                "length (fails beyond); beside: the same on Needle, NTK-F minus the base at every length and where "
                "its score drops most",
                "Sec. 6: NTK-F generalises up to 8k (2x) but fails to extend further; Table 3: 44.45 at 8k, 14.79 at "
                "16k, 0.72 at 32k")
    ok, name = ev.ruler_source()
    src = ev.needle_source
    f.evidence = ("paper: Table 3 RULER (81.14 at 4k, 44.45 at 8k, 14.79 at 16k) and Fig. 1 NIAH \u2192 ours: "
                  + (f"{name}; {ev.needle_name()} beside" if ok else
                     f"{name}: read on {ev.needle_name()}" if src else name))
    if not ok and src is None:
        f.parts = [Part("NTK-F", why=ev.needle_note)]
        return f.decide()
    e, base = ev.entry("ntk_frozen", True), ev.entry("base", True)
    bl = label_of(base, "base")

    def parts(get, tag):
        return [part_prop(f"NTK-F - {bl} at 2C, {tag}", get(e, 2.0) if e else None, get(base, 2.0) if base else None,
                           "ntk_frozen at 2C", "base at 2C"),
                part_prop(f"NTK-F at 2C - at 4C, {tag}", get(e, 2.0) if e else None, get(e, 4.0) if e else None,
                           "ntk_frozen at 2C", "ntk_frozen at 4C")]

    needle = (lambda x, fc: ev.at(x, src, fc)) if src else None
    if ok:
        f.parts = parts(ev.ruler, "RULER-style")
        if needle:
            f.controls = parts(needle, src)
    else:
        f.parts = parts(needle, src)
    if e is not None and base is not None:
        if ok:
            f.notes += _reach(ev, e, base, "RULER-style", [x for x in est.lengths_of(ev.rs, e, "ruler")
                                                           if x >= 1], ev.ruler)
        if src:
            f.notes += _reach(ev, e, base, src, [x for x in est.lengths_of(ev.rs, e, src) if x >= 1],
                              lambda x, fc: ev.at(x, src, fc))
    return f.decide()


def _reach(ev: Evidence, e: Entry, base: Entry, src: str, fs: list[float], get) -> list[str]:
    """Where ``e`` stops beating ``base`` (the longest run of lengths beyond C, from the first on, where its difference,
    same prompts, excludes 0 on the positive side) and between which two evaluated lengths its own score drops most;
    ``get(entry, factor)``: the score read (passkey, RULER-style)."""
    xs = {x: get(e, x) for x in fs}
    diffs = {x: prop_diff(xs[x], get(base, x)) for x in fs}
    shown = [f"{x:g}C {d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}]" for x, d in diffs.items() if d is not None]
    out = [f"{e.label} - {base.label}, {src}, by length: " + ", ".join(shown)] if shown else []
    reach = None
    for x in [x for x in fs if x > 1]:
        if diffs[x] is None or stats.excludes(diffs[x]) != 1:
            break
        reach = x
    steps = [(a, b, prop_diff(xs[b], xs[a])) for a, b in zip(fs, fs[1:])
             if xs[a] is not None and xs[b] is not None]
    steps = [t for t in steps if t[2] is not None]
    if reach is not None:
        out.append(f"{src}: {e.label} beats {base.label} at every length beyond C up to {reach:g}C (the interval "
                   "excludes 0 at each)")
    if steps:
        a, b, d = min(steps, key=lambda t: t[2][0])
        what = "its largest drop" if d[0] < 0 else f"no drop from one length to the next up to {steps[-1][1]:g}C; " \
            "its smallest change"
        out.append(f"{src}: {what}: {a:g}C \u2192 {b:g}C, {xs[a].value:.2f} \u2192 {xs[b].value:.2f} "
                   f"({d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}])")
    return out


# how the convergence gate could bias this finding on gated rows (the report's "gate" line)
GATE_BIAS = "none: NTK-F and the base are frozen"
# the gate does not measure what this finding tests
GATE_QUANTITY = None

