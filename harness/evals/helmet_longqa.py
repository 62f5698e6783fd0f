"""helmet_longqa: HELMET's long-document QA category (``configs/longqa.yaml``): NarrativeQA, InfiniteBench's English
book QA and multiple choice (``data.py`` ``load_narrativeqa``, ``load_infbench``).

Prompts: NarrativeQA ``"You are given a story, which can be either a novel or a movie script, and a question. Answer
the question as concisely as you can, using a single phrase if possible.\\n\\n{demo}{context}\\n\\nQuestion:
{question}"`` + ``"\\n"`` + ``"Answer:"`` (demos ``"For example:\\n\\n" + "Question: ...\\nAnswer: ..." ... +
"\\n\\nNow, use the following story to answer the question:\\n\\n"``); InfiniteBench QA and choice their own (``"You
are given a story and a question ..."``, options ``"A. ...\\nB. ..."``), + ``"\\n\\n"`` + ``"Answer:"``, demos of
``"[story text]\\nQuestion: ...\\nAnswer: ..."``. The story is cut to fit the length with HELMET's postfix (HELMET:
the LLaMA-2 tokenizer at the bin's length). Generation: 100 / 10 / 10 tokens. Chat template: HELMET's
``use_chat_template: true``; plain prompts here (base models).

Scores, model-free: InfiniteBench QA ``rougeL_f1`` and choice ``exact_match`` (``choice_post_process``: the letter,
or the option's "A. text" anywhere in the prediction) are HELMET's own; NarrativeQA's HELMET score is GPT-4o's
judgement (``scripts/eval_gpt4_longqa.py``): left out (``not_measured``), its model-free ``rougeL_f1``
(``default_post_process``) reported in its place.

Files (JSONL, written by ``harness prepare-eval --only helmet`` from the hub datasets HELMET loads):
``<data_dir>/longqa/narrativeqa.jsonl`` (``id, context, question, answer: [...]``), ``infbench_qa_eng.jsonl`` and
``infbench_choice_eng.jsonl`` (InfiniteBench's ``id, context, input, answer, options``).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.evals import EVALS, Spec
from harness.evals.helmet import HelmetArgs, HelmetCategory, Task, calculate_metrics, default_post_process, parse_output
from harness.evals.templates import HELMET_INFBENCH_CHOICE_USER, HELMET_INFBENCH_QA_USER, HELMET_NARRATIVEQA_USER


def options(sample: dict) -> str:
    return "A. {}\nB. {}\nC. {}\nD. {}".format(*sample["options"])


def choice_answer(sample: dict) -> list[str]:
    """``load_infbench``: the gold option's letter, and ``"<letter>. <text>"``."""
    letter = chr(ord("A") + sample["options"].index(sample["answer"][0]))
    return [letter, f"{letter}. {sample['answer'][0]}"]


def build_narrativeqa(sample: dict, demos: list[dict], prompt=None) -> str:
    demo = "" if not demos else "For example:\n\n" + "\n\n".join(
        f"Question: {d['question']}\nAnswer: {d['answer'][0]}" for d in demos) + \
        "\n\nNow, use the following story to answer the question:\n\n"
    return HELMET_NARRATIVEQA_USER.format(demo=demo, context=sample["context"], question=sample["question"]) + \
        "\nAnswer:"


def _infbench_demo(demos: list[dict], line) -> str:
    return "" if not demos else "For example:\n\n" + "\n\n".join(line(d) for d in demos) + \
        "\n\nNow, read the following story:\n\n"


def build_qa(sample: dict, demos: list[dict], prompt=None) -> str:
    demo = _infbench_demo(demos, lambda d: f"[story text]\nQuestion: {d['input']}\nAnswer: {d['answer'][0]}")
    return HELMET_INFBENCH_QA_USER.format(demo=demo, context=sample["context"], question=sample["input"]) + \
        "\n\nAnswer:"


def build_choice(sample: dict, demos: list[dict], prompt=None) -> str:
    demo = _infbench_demo(demos, lambda d: f"[story text]\nQuestion: {d['input']}\nOptions:\n{options(d)}\n"
                                           f"Answer: {choice_answer(d)[0]}")
    return HELMET_INFBENCH_CHOICE_USER.format(demo=demo, context=sample["context"], question=sample["input"],
                                              options=options(sample)) + "\n\nAnswer:"


def choice_score(prediction: str, sample: dict) -> float:
    """``choice_post_process``: exact match of the raw or parsed prediction with the letter, or the gold option
    "A. text" anywhere in the lower-cased prediction."""
    answer = choice_answer(sample)
    em = calculate_metrics(prediction, answer, with_rouge=False)["exact_match"]
    parsed = parse_output(prediction)
    if parsed is not None:
        em = max(em, calculate_metrics(parsed, answer, with_rouge=False)["exact_match"])
    return float(em or answer[1].lower() in prediction.lower())


def rouge_l(prediction: str, sample: dict) -> float:
    return default_post_process(prediction, sample["answer"])["rougeL_f1"]


def _task(file: str, build, score, metric: str, gen_tokens: int) -> Task:
    return Task(file=f"longqa/{file}", key="id", build=build, score=score, metric=metric, gen_tokens=gen_tokens,
                passages=None, draw="shuffle", demos="seeded")


@EVALS.register("helmet_longqa")
class HelmetLongQA(HelmetCategory):
    NAME = "helmet_longqa"
    TASKS = {"narrativeqa": _task("narrativeqa.jsonl", build_narrativeqa, rouge_l,
                                  "rougeL_f1 (HELMET's: GPT-4o's score, not measured)", 100),
             "infbench_qa": _task("infbench_qa_eng.jsonl", build_qa, rouge_l, "rougeL_f1", 10),
             "infbench_choice": _task("infbench_choice_eng.jsonl", build_choice, choice_score, "exact_match", 10)}
    NOT_MEASURED = ("narrativeqa's gpt-4-score (HELMET's LongQA averages it in): it needs GPT-4o as the judge; its "
                    "model-free rougeL_f1 stands in")
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ruler",  # RULER's output shape: a length's mean over tasks with its interval (0..100)
        records={"length": "length", "task": "task", "score": ("score",)},  # samples/helmet_longqa.jsonl fields
        floor={"threshold": 50, "chance": 0.0, "ceiling": 100},  # the tables' floor rule, 0..100
        extended="HELMET LongQA",  # its column in the 2024-benchmarks table
        extended_note=("mean of NarrativeQA ROUGE-L F1 (HELMET: GPT-4o's score), InfiniteBench QA ROUGE-L F1 and "
                       "choice accuracy"),  # the table's notes
        by_length=True,  # samples drawn once, fitted per length: one shard per length is exact
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map

    @dataclass
    class Args(HelmetArgs):
        name: str = "helmet_longqa"
