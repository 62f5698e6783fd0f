"""Finding (h) of the paper: LongLoRA trails exact fine-tuning."""
from __future__ import annotations

from controlled_study.findings.rule import TRAIN_F, Evidence, Finding, ft_32k, label_of, missing_rows, ppl_part
from controlled_study.paper import Paper


def f_h(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("h", "LongLoRA trails exact fine-tuning",
                "PPL (books) at 8C: LongLoRA over each of PI, YaRN, CLEX, NTK-32K (fine-tuned at 8C), same documents "
                "(trails: > 1)",
                "Table 2 PG19 at 32k: LongLoRA 9.89 vs PI 5.95, YaRN 5.93, CLEX 5.82, NTK-32K 5.79")
    f.evidence = "paper: Table 2 PG19 perplexity \u2192 ours: PPL on the held-out books (ppl_books)"
    ll = ev.entry("longlora")
    for k in ft_32k(paper):
        o = ev.entry(k, False)
        f.parts.append(ppl_part(f"LongLoRA / {label_of(o, k)}, PPL 8C", ev.at(ll, "ppl_pg19", TRAIN_F) if ll else None,
                                 ev.at(o, "ppl_pg19", TRAIN_F) if o else None, +1,
                                 missing=missing_rows(longlora=ll, **{k: o})))
    return f.decide()


# how the convergence gate could bias this finding on gated rows (the report's "gate" line)
GATE_BIAS = (
    "LongLoRA fails the gate on retrieval at C, so on gated rows (h) has no LongLoRA; a LongLoRA row that passed "
    "would be one that does not trail: toward contradicted or untested")
# the gate does not measure what this finding tests
GATE_QUANTITY = None

