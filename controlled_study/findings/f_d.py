"""Finding (d) of the paper: Perplexity correlates with downstream scores for exact-attention methods (Fig. 4)."""
from __future__ import annotations

import math

from controlled_study import estimates as est
from controlled_study.findings.rule import TRAIN_F, Evidence, Finding, Part, needle_missing
from controlled_study.paper import Paper
from harness import stats


def f_d(ev: Evidence, paper: Paper) -> Finding:
    t1 = paper.table("table1")
    ex = [r["values"] for r in t1["rows"] if r["attention"] == "exact"]
    rho_p = stats.spearman([v[0] for v in ex], [v[1] for v in ex])
    f = Finding("d", "Perplexity correlates with downstream scores for exact-attention methods (Fig. 4)",
                "Spearman rank correlation, over exact-attention configurations, of PPL (books) at 8C and Needle "
                "(pooled over C..16C), and of PPL at 8C and RULER at 8C (Table 1's RULER column); bootstrap over "
                "configurations",
                f"Fig. 4: a general correlation; Table 1 exact methods: Spearman(PPL, Needle) = {rho_p:.2f} (n = "
                f"{len(ex)})")
    ok, name = ev.ruler_source()
    f.evidence = (f"paper: Fig. 4 (PPL against NIAH, LongBench and RULER) \u2192 ours: {ev.needle_name()}; "
                  + (name if ok else f"{name}: the Needle panel only") + "; LongBench not run at this scale")
    if needle_missing(ev):
        f.parts = [Part("rank correlation", why=needle_missing(ev))]
        return f.decide()
    f.parts = [_spearman_part(ev, "Needle", ev.needle)]
    if ok:
        f.parts.append(_spearman_part(ev, "RULER-style 8C", lambda e: ev.ruler(e, TRAIN_F)))
    return f.decide()


def _spearman_part(ev: Evidence, name: str, score) -> Part:
    pairs = []
    for e in ev.entries:
        if ev.family(e) != "exact":
            continue
        if (e.method == "base" and not e.frozen) or ev.beyond_paper(e) or not ev.counted(e):  # controls, duplicates
            continue
        p = est.at(ev.rs, e, "ppl_pg19", TRAIN_F)
        n = score(e)
        if p is None or n is None or p.value is None or n.value is None or not math.isfinite(p.value):
            continue
        ev._use(e, p)
        pairs.append((e.label, p.value, n.value))
    pairs.sort()  # the bootstrap resamples by index: a fixed order keeps the interval from moving with unrelated rows
    xs, ys = [x for _, x, _ in pairs], [y for _, _, y in pairs]
    ci = stats.spearman_interval(xs, ys) if len(xs) >= 5 else None
    why = "" if ci else (f"no rows: {len(xs)} exact-attention configurations with PPL at 8C and {name} (need 5)"
                         if len(xs) < 5 else "no interval: constant ranks")
    return Part(f"Spearman(PPL 8C, {name}), n = {len(xs)}", ci, -1, 0.0, why,
                at_level=(lambda lv: stats.spearman_interval(xs, ys, level=lv)) if ci else None,
                key=f"Spearman(PPL 8C, {name})")


# how the convergence gate could bias this finding on gated rows (the report's "gate" line)
GATE_BIAS = (
    "keeps only configurations with PPL(C) within 10% and passkey(C) >= 0.9: a restricted range weakens a "
    "correlation (toward inconclusive)")
# the gate does not measure what this finding tests
GATE_QUANTITY = None

