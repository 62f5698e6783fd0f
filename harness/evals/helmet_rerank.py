"""helmet_rerank: HELMET's passage re-ranking category (``configs/rerank.yaml``): MS MARCO passages (``data.py``
``load_msmarco_rerank``), NDCG@10 of the generated ranking.

Prompt: ``"You are provided with a list of documents, each indicated by their ID. Rank each document based on their
relevance to the question in descending order from most relelvant to least relevant texts. Include all documents in
the rankings. Write your answer using the unique IDs, with the following format:\\nRanking: ID3 > ID1 >
ID2\\n\\n{demos}{context}\\n\\nQuery: {question}"`` + ``"\\n"`` + ``"Ranking:"`` (the original's spelling), each
passage ``"[ID: {id}] Document (Title: {title}): {text}"`` (``"[ID: {id}] Document: {text}"`` without a title),
``shots: 2`` demos from the ``k10`` file (their passages, the query and the gold ranking by label). Generation: 200
tokens, stopping at a newline. Score: ``parse_rankings`` (the longest ``a > b > c`` run of integer ids) scored by
NDCG@10 against the passages' relevance labels (``harness.evals.helmet.ndcg_at``: trec_eval's ``ndcg_cut.10``
through ``pytrec_eval``, as HELMET reads it; tested against hand-computed values).

Files: ``<data_dir>/msmarco/test_reranking_data_k1000_dep3.jsonl`` (fields ``qid, query, ctxs: [{id, title?, text,
label}]``), fitted to each length (passages with a label > 0 kept), and ``test_reranking_data_k10_dep3.jsonl`` for
the demos (a demo's query never the test sample's).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.evals import EVALS, Spec
from harness.evals.helmet import HelmetArgs, HelmetCategory, Task, ndcg_at, parse_rankings
from harness.evals.templates import HELMET_RERANK_PASSAGE, HELMET_RERANK_PASSAGE_NO_TITLE, HELMET_RERANK_USER


def passages(ctxs: list[dict]) -> str:
    return "\n\n".join((HELMET_RERANK_PASSAGE if "title" in c else HELMET_RERANK_PASSAGE_NO_TITLE).format(**c)
                       for c in ctxs)


def gold_ranking(ctxs: list[dict]) -> str:
    return " > ".join(c["id"] for c in sorted(ctxs, key=lambda c: c["label"], reverse=True))


def build(sample: dict, demos: list[dict], prompt=None) -> str:
    demo_text = "".join(passages(d["ctxs"]) + f"\n\nQuery: {d['query']}\nRanking: {gold_ranking(d['ctxs'])}" + "\n\n"
                        for d in demos)
    return HELMET_RERANK_USER.format(demos=demo_text, context=passages(sample["ctxs"]),
                                     question=sample["query"]) + "\nRanking:"


def score(prediction: str, sample: dict) -> float:
    """NDCG@10 of the parsed ranking against the passages of the prompt (HELMET's ``qrel``: the ``ctxs`` of the
    file of that length; here the ones kept by the fit)."""
    qrel = {c["id"]: int(c["label"]) for c in sample["ctxs"]}
    return ndcg_at(parse_rankings(prediction), qrel, 10)


@EVALS.register("helmet_rerank")
class HelmetRerank(HelmetCategory):
    NAME = "helmet_rerank"
    TASKS = {"msmarco": Task(file="msmarco/test_reranking_data_k1000_dep3.jsonl",
                             demo_file="msmarco/test_reranking_data_k10_dep3.jsonl", key="qid", build=build,
                             score=score, metric="NDCG@10", gen_tokens=200, stop_new_line=True,
                             gold=lambda c: int(c["label"]) > 0, exclude="drawn")}
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ruler",  # RULER's output shape: a length's mean over tasks with its interval (0..100)
        records={"length": "length", "task": "task", "score": ("score",)},  # samples/helmet_rerank.jsonl fields
        floor={"threshold": 50, "chance": 0.0, "ceiling": 100},  # the tables' floor rule, 0..100
        extended="HELMET re-rank",  # its column in the 2024-benchmarks table
        extended_note="NDCG@10 of the generated ranking (MS MARCO)",  # its line in that table's notes
        by_length=True,  # samples drawn once, fitted per length: one shard per length is exact
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map

    @dataclass
    class Args(HelmetArgs):
        name: str = "helmet_rerank"
