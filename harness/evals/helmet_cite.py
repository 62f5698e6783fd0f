"""helmet_cite: HELMET's generation-with-citations category (``configs/cite.yaml``): ALCE's ASQA and QAMPARI over
retrieved passages (``data.py`` ``load_alce``, ``eval_alce.py``).

Prompt (``load_alce``): ``"{demo_text}{instruction}\\n\\nQuestion: {question}\\n\\n{context}"`` + ``"\\n\\n"`` +
``"Answer:"`` with the instruction, the demo prompt and the document prompt of ALCE's prompt files
(``prompts/asqa_revised.json``, ``prompts/qampari_revised.json``: ``"Document [{ID}](Title: {title}): {text}"``),
``shots: 2`` demos of their ``demos`` (their own 5 documents each), joined by two blank lines. Generation: 300
tokens (no newline stop). HELMET applies the chat template (``use_chat_template: true``); the harness's base models
get the plain prompt.

Score, model-free only: ASQA's ``str_em`` (``compute_str_em``: the share of the question's disambiguations whose
short answers appear in the output, citations removed and newlines as spaces) and QAMPARI's ``qampari_rec_top5``
(``compute_qampari_f1``). HELMET's Cite score also averages citation recall and precision (``compute_autoais``),
which need the TRUE NLI model (``google/t5_xxl_true_nli_mixture``, 11B): left out, said in the output
(``not_measured``), so this category scores answer correctness only.

Files: ``<data_dir>/alce/asqa_eval_gtr_top2000.json``, ``qampari_eval_gtr_top2000.json`` (``docs`` fitted to each
length; HELMET keeps 700 documents at 128k) and ``<data_dir>/prompts/asqa_revised.json``, ``qampari_revised.json``.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.evals import EVALS, Spec
from harness.evals.helmet import HelmetArgs, HelmetCategory, Task, qampari_rec_top5, str_em
from harness.evals.templates import HELMET_CITE_USER


def docs(doc_prompt: str, ds: list[dict]) -> str:
    return "\n\n".join(doc_prompt.format(**d, ID=i + 1) for i, d in enumerate(ds))


def build(sample: dict, demos: list[dict], prompt: dict) -> str:
    """``load_alce``'s prompt with the prompt file ``prompt`` (``instruction``, ``demo_prompt``, ``doc_prompt``)."""
    demo_text = "\n\n\n".join(prompt["demo_prompt"].format(**d, instruction=prompt["instruction"],
                                                           context=docs(prompt["doc_prompt"], d["docs"]))
                               for d in demos)
    demo_text += "\n\n\n" if demos else ""
    return HELMET_CITE_USER.format(demo_text=demo_text, instruction=prompt["instruction"], question=sample["question"],
                                   context=docs(prompt["doc_prompt"], sample["docs"])) + "\n\nAnswer:"


def _task(name: str, score, metric: str) -> Task:
    return Task(file=f"alce/{name}_eval_gtr_top2000.json", key="question", build=build, score=score, metric=metric,
                gen_tokens=300, passages="docs", draw="shuffle", demos="alce",
                prompt_file=f"prompts/{name}_revised.json")


@EVALS.register("helmet_cite")
class HelmetCite(HelmetCategory):
    NAME = "helmet_cite"
    TASKS = {"asqa": _task("asqa", lambda o, s: str_em(o, s["qa_pairs"]), "str_em"),
             "qampari": _task("qampari", lambda o, s: qampari_rec_top5(o, s["answers"]), "qampari_rec_top5")}
    NOT_MEASURED = ("citation_rec and citation_prec (HELMET's Cite averages them in): they need the TRUE NLI model "
                    "(google/t5_xxl_true_nli_mixture); answer correctness only")
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ruler",  # RULER's output shape: a length's mean over tasks with its interval (0..100)
        records={"length": "length", "task": "task", "score": ("score",)},  # samples/helmet_cite.jsonl fields
        floor={"threshold": 50, "chance": 0.0, "ceiling": 100},  # the tables' floor rule, 0..100
        extended="HELMET cite",  # its column in the 2024-benchmarks table
        extended_note=("mean of ASQA str_em and QAMPARI rec_top5 (no citation scores: they need an NLI model) "
                       ""),  # the table's notes
        by_length=True,  # samples drawn once, fitted per length: one shard per length is exact
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map

    @dataclass
    class Args(HelmetArgs):
        name: str = "helmet_cite"
