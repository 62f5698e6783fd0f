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
    # the claim's length, 8C; a track whose rows stop earlier (the real-model CPU track: 2C) shows its longest length
    # beside the parts, not in the verdict: no margin is argued for a shorter length (at 2C half of every window is
    # the native one, and every frozen method stays flat), so the claim's part reads "not measured"
    have = [x for x in est.lengths_of(ev.rs, e, "ppl_pg19") if 1 < x <= TRAIN_F]
    far = max(have or [TRAIN_F])
    tag = f"LM-Infinite: PPL {far:g}C / PPL C"
    first = ppl_part(tag, ev.at(e, "ppl_pg19", far), ev.at(e, "ppl_pg19", 1.0), -1, PPL_FLAT)
    wa, wb = ev.windows(e, far), ev.windows(e, 1.0)
    ci = stats.cluster_ppl_ratio(wa[0], wa[1], wb[0], wb[1]) if wa and wb else None
    parts = []
    if ci is not None:
        (xa, ga), (xb, gb) = wa, wb
        books = len(set(ga) & set(gb))
        parts.append(Part(f"{tag}, every window ({len(xa)} of {far:g}C, {len(xb)} of C, {books} books; clustered "
                          "by book)", ci, -1, PPL_FLAT, "", 3,
                          lambda lv: stats.cluster_ppl_ratio(xa, ga, xb, gb, level=lv),
                          stats.cluster_ppl_ratio(xa, ga, xb, gb, "bootstrap"), "cluster bootstrap", key=tag))
        first.what += ", first window of each book"
        f.controls.append(first)
    else:
        parts.append(first)
    if far < TRAIN_F and have:
        for p in parts:
            p.what += f" (tested at {far:g}C, the claim's {TRAIN_F:g}C not measured: shown, not in the verdict)"
        f.controls = parts + f.controls
        f.parts.append(Part(f"LM-Infinite: PPL {TRAIN_F:g}C / PPL C",
                            why=f"not measured: the rows stop at {far:g}C (no margin is argued for {far:g}C)"))
        f.tested_at = f"PPL at {far:g}C; {TRAIN_F:g}C not measured"
    else:
        f.parts += parts
    src = ev.needle_source
    if src is None:
        f.parts.append(Part("retrieval C - beyond", why=ev.needle_note))
        return f.decide()
    inside = ev.at(e, src, 1.0)
    beyond = [x for x in est.lengths_of(ev.rs, e, src) if x >= 2]
    outside = est.pooled([ev.at(e, src, x) for x in beyond], beyond)
    what = f"{src} at C - at {est.lengths_text(outside.over if outside else beyond) or '2C..16C'}"
    if outside is not None:
        outside.paired, outside.over = False, ()   # its lengths are in the part's name
    f.parts.append(part_prop(what, inside, outside, "lm_infinite at C", "lm_infinite beyond C"))
    return f.decide()


# how the convergence gate could bias this finding on gated rows (the report's "gate" line)
GATE_BIAS = "none: LM-Infinite is frozen"
# the gate does not measure what this finding tests
GATE_QUANTITY = None

