"""helmet_summ: HELMET's summarisation category (``configs/summ.yaml``): InfiniteBench's English book summaries and
Multi-LexSum's short case summaries (``data.py`` ``load_infbench`` sum_eng, ``load_multi_lexsum``).

Prompts: ``"You are given a book and you are tasked to summarize it. Write a summary of about 1000 to 1200 words.
..."`` and ``"You are given the legal documents in a civil rights lawsuit, and you are tasked to summarize the
case. ..."`` + ``"\\n\\n"`` + ``"Summary:"``, with their demos (``"[story text]\\nSummary: ..."``; ``"Example
summaries:\\n\\n" + "Summary: ..." ... + "\\n\\nNow, write a summary of the following legal documents.\\n"``). The
document is cut to fit the length with HELMET's postfix. Generation: 1200 / 400 tokens. Chat template: plain
prompts here (HELMET: ``use_chat_template: true``).

Score, model-free: ROUGE-L F1 (``utils.calculate_metrics``' ``rougeL_f1``, the max of the raw and the parsed
prediction, ``parse_output`` after ``Summary:`` for Multi-LexSum). HELMET's Summ score is GPT-4o's fluency x
key-point F1 (``scripts/eval_gpt4_summ.py``, ``gpt-4-f1``): it needs GPT-4o as the judge and is left out
(``not_measured``); ROUGE-L stands in, and is not comparable with HELMET's numbers.

Files (JSONL from the hub datasets, ``harness prepare-eval --only helmet``): ``<data_dir>/summ/infbench_sum_eng.jsonl``
(``id, context, answer: [...]``) and ``multi_lexsum.jsonl`` (``id, context`` = the sources joined by blank lines,
``answer`` = ``summary/short``).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.evals import EVALS, Spec
from harness.evals.helmet import HelmetArgs, HelmetCategory, Task, default_post_process
from harness.evals.templates import HELMET_INFBENCH_SUM_USER, HELMET_MULTI_LEXSUM_USER


def _answer(sample: dict) -> str:
    a = sample["answer"]
    return (a[0] if isinstance(a, list) else a).strip()


def build_infbench(sample: dict, demos: list[dict], prompt=None) -> str:
    demo = "" if not demos else "For example:\n\n" + "\n\n".join(f"[story text]\nSummary: {_answer(d)}"
                                                                 for d in demos) + \
        "\n\nNow, read the following story:\n\n"
    return HELMET_INFBENCH_SUM_USER.format(demo=demo, context=sample["context"]) + "\n\nSummary:"


def build_lexsum(sample: dict, demos: list[dict], prompt=None) -> str:
    demo = "" if not demos else "Example summaries:\n\n" + "\n\n".join(f"Summary: {_answer(d)}" for d in demos) + \
        "\n\nNow, write a summary of the following legal documents.\n"
    return HELMET_MULTI_LEXSUM_USER.format(demo=demo, context=sample["context"]) + "\n\nSummary:"


def _task(file: str, build, prefix: str, gen_tokens: int, draw: str) -> Task:
    return Task(file=f"summ/{file}", key="id", build=build, gen_tokens=gen_tokens, passages=None, draw=draw,
                demos="seeded", metric="rougeL_f1 (HELMET's: gpt-4-f1, not measured)",
                score=lambda o, s: default_post_process(o, s["answer"], prefix)["rougeL_f1"])


@EVALS.register("helmet_summ")
class HelmetSumm(HelmetCategory):
    NAME = "helmet_summ"
    TASKS = {"infbench_sum": _task("infbench_sum_eng.jsonl", build_infbench, "Answer:", 1200, "shuffle"),
             "multi_lexsum": _task("multi_lexsum.jsonl", build_lexsum, "Summary:", 400, "shuffle_if_more")}
    NOT_MEASURED = ("gpt-4-f1 (HELMET's Summ score): it needs GPT-4o as the judge; the model-free rougeL_f1 stands in "
                    "and is not comparable with HELMET's numbers")
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ruler",  # RULER's output shape: a length's mean over tasks with its interval (0..100)
        records={"length": "length", "task": "task", "score": ("score",)},  # samples/helmet_summ.jsonl fields
        floor={"threshold": 50, "chance": 0.0, "ceiling": 100},  # the tables' floor rule, 0..100
        extended="HELMET Summ",  # its column in the 2024-benchmarks table
        extended_note=("mean ROUGE-L F1 of InfiniteBench sum and Multi-LexSum (HELMET: GPT-4o's gpt-4-f1) "
                       ""),  # the table's notes
        by_length=True,  # samples drawn once, fitted per length: one shard per length is exact
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map

    @dataclass
    class Args(HelmetArgs):
        name: str = "helmet_summ"
