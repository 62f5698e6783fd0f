"""nll_by_position: mean negative log-likelihood per token position (the controlled study's Figure 3: NLL as a
function of context position, which shows whether a method keeps using context beyond its training window).

Each of the first ``samples`` documents with at least ``length - 1`` tokens is scored as one window
``[BOS] + doc[:length-1]`` (the YaRN truncated protocol of ``ppl``); position p is the index of the predicted token
in that window (1 .. length-1). Per-position NLL is averaged over documents, then over ``buckets`` equal-width
position buckets. ``length: 0`` uses the largest evaluation length the method supports (lengths beyond the method's
limit are skipped, never run). Never materialises a [length x vocab] logit tensor (``token_nll``). The row keeps
the per-document bucket means (``per_doc``) and a bootstrap 95% band over documents per bucket (``ci_lo``/``ci_hi``);
documents are the same for every method, so curves can be compared document by document.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.evals import (
    EVALS,
    EvalArgs,
    Spec,
    check_nonneg,
    check_positive,
    lengths_within,
    split_lengths,
    write_jsonl,
)
from harness.evals.common import window_nlls
from harness.evals.ppl import check_dataset, load_documents
from harness.stats import bootstrap_mean


def bucket_means(nll: np.ndarray, buckets: int) -> tuple[list[int], list[float]]:
    """nll[i] is the NLL of position i+1. Returns (bucket start positions, mean NLL per bucket)."""
    n = len(nll)
    buckets = max(1, min(buckets, n))
    edges = np.linspace(0, n, buckets + 1).round().astype(int)
    starts, means = [], []
    for b, e in zip(edges[:-1], edges[1:]):
        if e > b:
            starts.append(int(b) + 1)
            means.append(round(float(nll[b:e].mean()), 5))
    return starts, means


@EVALS.register("nll_by_position")
class NLLByPosition:
    spec = Spec(
        metric="nll")  # the headline metric (harness.evals: what an evaluator declares)

    def count_prompts(self, lengths, limit):
        """{length: documents}: each document scored once at the evaluated length."""
        a = self.args
        L = int(a.length or max(lengths_within(a.lengths, lengths, limit) or [0]))
        return ({L: a.samples} if L else {}), "documents x length"
    @dataclass
    class Args(EvalArgs):
        name: str = "nll_by_position"
        dataset: str = "shakespeare"  # a text source name, or dir:<path> (PG19 on a cluster)
        split: str = "test"
        samples: int = 4  # documents
        length: int = 0  # 0 = the largest supported evaluation length
        buckets: int = 32
        chunk: int = 1024

    def __init__(self, args):
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, samples=a.samples, buckets=a.buckets, chunk=a.chunk)
        check_nonneg(where, length=a.length)

    def check_data(self, where: str) -> None:
        check_dataset(self.args.dataset, where)

    def max_length(self) -> int:
        return self.args.length or max([int(x) for x in self.args.lengths] or [0])

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        wanted = [a.length] if a.length > 0 else list(a.lengths)
        ok, skipped = split_lengths(wanted, handle, method)
        if not ok:
            return {"positions": [], "nll": [], "length": None, "skipped": skipped}
        L = max(ok)
        tok = handle.tokenizer
        bos = tok.bos_token_id
        need = L - 1 if bos is not None else L
        docs, short = [], 0
        for d in load_documents(a.dataset, a.split):
            ids = tok(d.text, add_special_tokens=False).input_ids
            if len(ids) >= need:
                docs.append(ids[:need])
            else:
                short += 1
            if len(docs) == a.samples:
                break
        if not docs:
            return {"positions": [], "nll": [], "length": L, "skipped": {str(L): "no document is long enough"},
                    "documents_too_short": short}
        wins = [([bos] if bos is not None else []) + d for d in docs]
        per_doc = [np.asarray(x, dtype=np.float64) for x in
                   window_nlls(handle.model, wins, a.chunk, ctx.autocast, ctx.batch_tokens, ctx.nll_cache)]
        mean = np.mean(per_doc, axis=0)
        positions, values = bucket_means(mean, a.buckets)
        doc_buckets = [bucket_means(x, a.buckets)[1] for x in per_doc]  # per document: bands, paired comparisons
        lo, hi = [], []
        for b in range(len(values)):
            est = bootstrap_mean([d[b] for d in doc_buckets]) if len(doc_buckets) >= 3 else None
            lo.append(round(est[1], 5) if est else None)
            hi.append(round(est[2], 5) if est else None)
        write_jsonl(ctx.samples_path("nll_by_position"),
                    [{"length": L, "positions": positions, "nll": values, "documents": len(docs)}])
        return {"positions": positions, "nll": values, "length": L, "documents": len(docs),
                "documents_too_short": short, "dataset": a.dataset, "skipped": skipped,
                "ci_lo": lo, "ci_hi": hi, "per_doc": doc_buckets}
