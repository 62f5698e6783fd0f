"""The evaluation-template filter: fragments of the evaluators' verbatim prompts (``harness.evals.templates``) that
no training document may contain. ``harness.data.synthetic`` redraws a document that would contain one, so the
study measures retrieval, not a memorised format.

Ground floor (imports nothing): the data builders apply it without importing the evaluators.
``harness.evals.templates`` re-exports ``EVAL_FRAGMENTS``; ``tests/test_architecture.py`` checks that every
evaluation template there is caught. A new evaluator's template adds its distinctive fragments here.
"""
from __future__ import annotations

EVAL_FRAGMENTS = (
    # passkey: harness.evals.templates.PASSKEY_TASK, PASSKEY_GARBAGE, "Remember it. " and PASSKEY_QUESTION
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there.",
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
    "Remember it. ",
    "What is the pass key? The pass key is",
    # the convergence gate's passkey variant: PASSKEY_GATE_TASK, PASSKEY_GATE_GARBAGE and its key name (in
    # PASSKEY_GATE_INFO and PASSKEY_GATE_QUESTION; no synthetic key name, in no training text)
    "A number is kept somewhere inside the long text below, among many lines that do not matter. Find it and keep "
    "it in mind; you will be asked for it at the end.",
    "The snow is white. The sea is deep. The moon is pale. Off we go. Over the hills and home again.",
    "locker number",
    # NIAH: the needle, the question and the LCEG prompt
    "best thing to do in San Francisco",
    "Dolores Park",
    "special magic",
    "This is a very long story book",
    # RULER: variable tracking, common / frequent words, QA
    "chain(s) of variable assignment",
    "variables are assgined the value",
    "appear most often in the list",
    "three most frequently appeared",
    "Answer the question based on the given documents",
    # BABILong: its instructions and output formats
    "hidden in some random text",
    "hidden in some random text and a question",
    "The most recent location of",
    "Always return your answer in the following format",
    "Your answer should contain only one word",
    # HELMET JSON key-value
    "Extract the value corresponding to the specified key",
    "Corresponding value:",
    # HELMET's RAG, re-ranking, citation, long-document QA and summarisation templates
    "Use the given documents to write a concise and short answer to the question",
    "Rank each document based on their relevance to the question",
    "using only the provided search results (some of which might be irrelevant) and cite them properly",
    "Answer the question as concisely as you can, using a single phrase if possible",
    "Choose the best answer from the options provided",
    "You are given a book and you are tasked to summarize it",
    "tasked to summarize the case",
    # LongBench v2
    "Please read the following text and answer the question below",
    "The correct answer is (insert answer here)",
)


def contains_eval_template(text: str) -> bool:
    return any(f in text for f in EVAL_FRAGMENTS)
