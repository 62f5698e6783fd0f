"""Finding (c) of the paper: PI and YaRN degrade beyond their training length."""
from __future__ import annotations

from controlled_study.findings.rule import LONG_F, TRAIN_F, Evidence, Finding, label_of, missing_rows, ppl_part
from controlled_study.paper import Paper


def f_c(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("c", "PI and YaRN degrade beyond their training length",
                "PPL (books) at 16C / PPL at 8C, same documents, for PI and YaRN fine-tuned at 8C (degrades: > 1)",
                "Table 2 PG19: PI 5.95 at 32k, '-' at 64k; YaRN 5.93 at 32k, '-' at 64k (Proof-pile 2.59 -> 106.38)")
    f.evidence = "paper: Table 2 PG19 perplexity \u2192 ours: PPL on the held-out books (ppl_books)"
    for k in ("pi", "yarn"):
        e = ev.entry(k, False)
        f.parts.append(ppl_part(f"{label_of(e, k)}: PPL 16C / PPL 8C", ev.at(e, "ppl_pg19", LONG_F) if e else None,
                                 ev.at(e, "ppl_pg19", TRAIN_F) if e else None, +1,
                                 missing=missing_rows(**{f"{k} (fine-tuned)": e})))
    return f.decide()


# how the convergence gate could bias this finding on gated rows (the report's "gate" line)
GATE_BIAS = "selects on PPL at C, not at 8C or 16C: no direct bias; a method that fails leaves (no rows)"
# the gate does not measure what this finding tests
GATE_QUANTITY = None

