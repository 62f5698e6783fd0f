"""helmet_rag: HELMET's retrieval-augmented generation category (Yen et al. 2024, ``princeton-nlp/HELMET``,
``configs/rag.yaml``): Natural Questions, TriviaQA, HotpotQA and PopQA (popularity < 10^3) over KILT passages
(``data.py`` ``load_qa``); the category score is their mean.

Prompt (``load_qa``): ``"Use the given documents to write a concise and short answer to the question. Write your
answer in the following format:\\nAnswer: [answer]\\n\\n{demos}{context}\\n\\nQuestion: {question}"`` + ``"\\n"`` +
``"Answer:"``, each passage ``"Document (Title: {title}): {text}"`` joined by blank lines, ``shots: 2`` demos of
``"{documents}\\n\\nQuestion: {question}\\nAnswer: {answer}"`` (their own 3 passages, from the train files, seeded by
the test sample's id). Generation: 20 tokens, stopping at a newline (``stop_new_line: true``). Score:
``substring_exact_match`` (``utils.calculate_metrics``: a normalised gold answer inside the normalised
prediction), the max of the raw and the parsed (``parse_output``, after ``Answer:``) prediction.

Files (``<data_dir>/kilt/``, HELMET's names): the ``k1000`` test files (``nq-dev-multikilt_1000_k1000_dep6.jsonl``,
...) fitted to each length (``harness.evals.helmet.fit_passages``: passages dropped from the end, those that hold the
answer, ``has_answer``, kept), where HELMET ships one file per input length (k50 for 8k ... k1000 for 128k) built for
the LLaMA tokenizers; the ``k3`` train files for the demos (PopQA: its test file's, the sample itself left out).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.evals import EVALS, Spec
from harness.evals.helmet import HelmetArgs, HelmetCategory, Task, default_post_process
from harness.evals.templates import HELMET_RAG_DEMO, HELMET_RAG_PASSAGE, HELMET_RAG_USER


def passages(ctxs: list[dict]) -> str:
    return "\n\n".join(HELMET_RAG_PASSAGE.format(title=c.get("title", ""), text=c["text"]) for c in ctxs)


def build(sample: dict, demos: list[dict], prompt=None) -> str:
    demo_text = "".join(HELMET_RAG_DEMO.format(documents=passages(d["ctxs"]), question=d["question"],
                                               answer=d["answers"][0]) + "\n\n" for d in demos)
    return HELMET_RAG_USER.format(demos=demo_text, context=passages(sample["ctxs"]),
                                  question=sample["question"]) + "\nAnswer:"


def score(prediction: str, sample: dict) -> float:
    return default_post_process(prediction, sample["answers"], with_rouge=False)["substring_exact_match"]


def popular(sample: dict, threshold: float = 3.0) -> bool:
    """PopQA's filter (``rag.yaml``'s ``popularity_threshold: 3``): log10 of the subject's popularity below it."""
    return math.log10(float(sample["s_pop"])) < threshold


def has_answer(passage: dict) -> bool:
    return bool(passage.get("has_answer"))


def _task(test: str, demo: str, **kw) -> Task:
    return Task(file=f"kilt/{test}", demo_file=f"kilt/{demo}", key="id", build=build, score=score,
                metric="substring_exact_match", gen_tokens=20, stop_new_line=True, gold=has_answer, **kw)


@EVALS.register("helmet_rag")
class HelmetRAG(HelmetCategory):
    NAME = "helmet_rag"
    TASKS = {"nq": _task("nq-dev-multikilt_1000_k1000_dep6.jsonl", "nq-train-multikilt_1000_k3_dep6.jsonl"),
             "triviaqa": _task("triviaqa-dev-multikilt_1000_k1000_dep6.jsonl",
                               "triviaqa-train-multikilt_1000_k3_dep6.jsonl"),
             "hotpotqa": _task("hotpotqa-dev-multikilt_1000_k1000_dep3.jsonl",
                               "hotpotqa-train-multikilt_1000_k3_dep3.jsonl"),
             "popqa": _task("popqa_test_1000_k1000_dep6.jsonl", "popqa_test_1000_k3_dep6.jsonl", keep=popular,
                            exclude="self")}
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ruler",  # RULER's output shape: a length's mean over tasks with its interval (0..100)
        records={"length": "length", "task": "task", "score": ("score",)},  # samples/helmet_rag.jsonl fields
        floor={"threshold": 50, "chance": 0.0, "ceiling": 100},  # the tables' floor rule, 0..100
        extended="HELMET RAG",  # its column in the 2024-benchmarks table
        extended_note="mean substring exact match over NQ, TriviaQA, HotpotQA, PopQA",  # its line in that table's notes
        by_length=True,  # samples drawn per task, fitted per length: one shard per length is exact
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map

    @dataclass
    class Args(HelmetArgs):
        name: str = "helmet_rag"
