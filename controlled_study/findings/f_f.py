"""Finding (f) of the paper: LM-Infinite keeps PPL flat but fails retrieval outside its local window."""
from __future__ import annotations

from controlled_study import estimates as est
from controlled_study.findings.rule import TRAIN_F, Evidence, Finding, Part, part_prop, ppl_part
from controlled_study.paper import Paper
from harness import stats

PPL_FLAT = 1.25   # (f) "keeps PPL flat": PPL at 8C within 25% of its PPL at C


def f_f(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("f", "LM-Infinite keeps PPL flat but fails retrieval outside its local window",
                f"PPL (books) at 8C / PPL at C, the same books, every non-overlapping window where the rows have them "
                f"(interval clustered by book), else the first window of each (flat: < {PPL_FLAT}); passkey accuracy "
                "at C minus at 2C..16C pooled (the needle mostly outside the local window)",
                "Table 2 PG19: 6.30 at 4k, 6.71 at 32k (x1.07); Fig. 1 / Sec. 6: fails to retrieve beyond 4k")
    f.evidence = ("paper: Table 2 PG19 perplexity and Fig. 1 NIAH (Sec. 6) \u2192 ours: PPL on the held-out books; "
                  f"{ev.needle_name()}")
    e = ev.entry("lm_infinite", True)
    if e is None:
        f.parts = [Part("LM-Infinite", why="no rows: lm_infinite (frozen)")]
        return f.decide()
    # the longest length up to 8C the rows have (the real-model track stops at 2C)
    far = max([x for x in est.lengths_of(ev.rs, e, "ppl_pg19") if 1 < x <= TRAIN_F] or [TRAIN_F])
    tag = f"LM-Infinite: PPL {far:g}C / PPL C"
    first = ppl_part(tag, ev.at(e, "ppl_pg19", far), ev.at(e, "ppl_pg19", 1.0), -1, PPL_FLAT)
    wa, wb = ev.windows(e, far), ev.windows(e, 1.0)
    ci = stats.cluster_ppl_ratio(wa[0], wa[1], wb[0], wb[1]) if wa and wb else None
    if ci is not None:
        (xa, ga), (xb, gb) = wa, wb
        books = len(set(ga) & set(gb))
        f.parts.append(Part(f"{tag}, every window ({len(xa)} of {far:g}C, {len(xb)} of C, {books} books; clustered "
                            "by book)", ci, -1, PPL_FLAT, "", 3,
                            lambda lv: stats.cluster_ppl_ratio(xa, ga, xb, gb, level=lv),
                            stats.cluster_ppl_ratio(xa, ga, xb, gb, "bootstrap"), "cluster bootstrap", key=tag))
        first.what += ", first window of each book"
        f.controls.append(first)
    else:
        f.parts.append(first)
    src = ev.needle_source
    if src is None:
        f.parts.append(Part("retrieval C - beyond", why=ev.needle_note))
        return f.decide()
    inside = ev.at(e, src, 1.0)
    outside = est.pooled([ev.at(e, src, x) for x in est.lengths_of(ev.rs, e, src) if x >= 2])
    if outside is not None:
        outside.paired = False
    f.parts.append(part_prop(f"{src} at C - at 2C..16C", inside, outside, "lm_infinite at C",
                              "lm_infinite beyond C"))
    return f.decide()


# how the convergence gate could bias this finding on gated rows (the report's "gate" line)
GATE_BIAS = "none: LM-Infinite is frozen"
# the gate does not measure what this finding tests
GATE_QUANTITY = None

