"""Finding (e) of the paper: Among frozen methods Self-Extend is best."""
from __future__ import annotations

from controlled_study.findings.rule import TRAIN_F, Evidence, Finding, Part, needle_missing, part_prop
from controlled_study.paper import Paper


def f_e(ev: Evidence, paper: Paper) -> Finding:
    t1 = {r["key"]: r["values"] for r in paper.table("table1")["rows"]}
    f = Finding("e", "Among frozen methods Self-Extend is best",
                "Needle pooled over C..16C, and RULER at 8C (Table 1's RULER column): Self-Extend minus each other "
                "frozen configuration (same prompts)",
                f"Table 1 frozen: Self-Extend Needle {t1['self_extend'][1]}, LM-Infinite {t1['lm_infinite'][1]}, "
                f"NTK-F {t1['ntk_frozen'][1]}; RULER 29.50 / 12.34 / 0.72")
    ok, name = ev.ruler_source()
    f.evidence = (f"paper: Table 1 Needle and RULER columns (frozen rows) \u2192 ours: {ev.needle_name()}; "
                  + (name if ok else f"{name}: Needle only"))
    se = ev.entry("self_extend", True)
    if needle_missing(ev):
        f.parts = [Part("Self-Extend - others", why=needle_missing(ev))]
        return f.decide()
    others = [e for e in ev.entries if e.frozen and e is not se and ev.counted(e)]
    if se is None:
        f.parts = [Part("Self-Extend - others, Needle", why="no rows: self_extend (frozen)")]
        return f.decide()
    for o in others:
        a, b = ev.needle(se, o), ev.needle(o, se)   # over the lengths both have
        if b is None:
            continue
        part = part_prop(f"Self-Extend - {o.label}", a, b, "self_extend", o.label)
        (f.controls if ev.beyond_paper(o) else f.parts).append(part)
        if ok and ev.ruler(o, TRAIN_F) is not None:
            part = part_prop(f"Self-Extend - {o.label}, RULER-style 8C", ev.ruler(se, TRAIN_F), ev.ruler(o, TRAIN_F),
                              "self_extend (RULER)", f"{o.label} (RULER)")
            (f.controls if ev.beyond_paper(o) else f.parts).append(part)
    if not f.parts:
        f.parts = [Part("Self-Extend - others", why="no rows: no other frozen configuration with a Needle score")]
    return f.decide()


# how the convergence gate could bias this finding on gated rows (the report's "gate" line)
GATE_BIAS = "none: frozen configurations only (the gate measures fine-tuned rows)"
# the gate does not measure what this finding tests
GATE_QUANTITY = None

