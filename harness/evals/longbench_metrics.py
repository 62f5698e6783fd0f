"""LongBench v1 task table and official metrics, reimplemented from ``THUDM/LongBench LongBench/{metrics,eval}.py``
and ``config/{dataset2prompt,dataset2maxlen}.json`` (commit 2e00731f), English + code tasks only.

Every quirk of the originals is kept on purpose, because the published numbers depend on them:

* ``normalize_answer``: lower -> drop ``string.punctuation`` -> ``\\b(a|an|the)\\b`` -> " " -> collapse whitespace.
  Articles are removed *after* punctuation, so "the-end" becomes "theend" (kept) and "a.b" becomes "ab".
* ``qa_f1_score``: token F1 on the normalised ``.split()`` tokens with Counter intersection; 0 without overlap
  (the int 0, as in the original).
* ``rouge_score``: the ``rouge`` PyPI package (not Google's ``rouge_score``), ROUGE-L F; *any* exception (empty
  prediction, prediction of only punctuation, ...) scores 0.0.
* ``classification_score`` (TREC): classes that are substrings of the prediction; then every match that is a
  substring of the gold label but not equal to it is removed with ``list.remove`` *inside a for-loop over the same
  list*, which skips the element after each removal; score = 1/len(matches) if the gold label survived, else 0.
* ``count_score`` / ``retrieval_score``: fraction of the integers in the prediction equal to the gold number.
* ``code_sim_score``: the first line of ``pred.lstrip('\\n')`` containing none of backtick, ``#``, ``//`` (an
  empty string if none), scored with ``fuzzywuzzy.fuzz.ratio / 100``. fuzzywuzzy without python-Levenshtein falls
  back to difflib's SequenceMatcher; the LongLoRA golden check below was reproduced with exactly that setup.
* Task score = ``round(100 * mean_i max_{gt in answers_i} metric(pred_i, gt), 2)``.

Golden check (run while writing this file, see docs/evals_extrinsic.md): re-scoring the 16 prediction files LongLoRA
ships (``dvlab-research/LongLoRA benchmarks/Pred_LongBench/*.jsonl``) with these functions and LongBench's first-line
task set reproduces their ``result.json`` to two decimals.
"""
from __future__ import annotations

import re
import string
from collections import Counter

# --- task table -------------------------------------------------------------------------------------------------
# Prompts: LongBench/config/dataset2prompt.json, verbatim (typos included: "asconcisely", the space before
# "Answer the question" in qasper, the trailing spaces of passage_count / passage_retrieval_en).
PROMPTS = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",  # noqa: E501
    "qasper": "You are given a scientific article and a question. Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",  # noqa: E501
    "multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",  # noqa: E501
    "hotpotqa": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",  # noqa: E501
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",  # noqa: E501
    "qmsum": "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",  # noqa: E501
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",  # noqa: E501
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",  # noqa: E501
    "triviaqa": "Answer the question based on the given passage. Only give me the answer and do not output any other words. The following are some examples.\n\n{context}\n\n{input}",  # noqa: E501
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",  # noqa: E501
    "passage_count": "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: ",  # noqa: E501
    "passage_retrieval_en": "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph that the abstract is from. The answer format must be like \"Paragraph 1\", \"Paragraph 2\", etc.\n\nThe answer is: ",  # noqa: E501
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}
PROMPTS["2wikimqa"] = PROMPTS["hotpotqa"]
PROMPTS["musique"] = PROMPTS["hotpotqa"]

# LongBench/config/dataset2maxlen.json
MAX_GEN = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "hotpotqa": 32, "2wikimqa": 32, "musique": 32,
    "gov_report": 512, "qmsum": 512, "multi_news": 512, "trec": 64, "triviaqa": 32, "samsum": 128,
    "passage_count": 32, "passage_retrieval_en": 32, "lcc": 64, "repobench-p": 64,
}

# The paper's Table-4 order and the README's six English categories.
CATEGORIES = {
    "single_doc_qa": ["narrativeqa", "qasper", "multifieldqa_en"],
    "multi_doc_qa": ["hotpotqa", "2wikimqa", "musique"],
    "summarization": ["gov_report", "qmsum", "multi_news"],
    "few_shot": ["trec", "triviaqa", "samsum"],
    "synthetic": ["passage_count", "passage_retrieval_en"],
    "code": ["lcc", "repobench-p"],
}
TASKS = [t for ts in CATEGORIES.values() for t in ts]
# Entropy-ABF (Zhang et al. 2024) Table 2: 12 tasks, no synthetic and no code; "Macro" = mean of the 12.
ENTROPY_ABF_TASKS = CATEGORIES["single_doc_qa"] + CATEGORIES["multi_doc_qa"] + CATEGORIES["summarization"] + \
    CATEGORIES["few_shot"]

# pred.py: tasks that never get the chat template (chat models "are better off without" it).
NO_CHAT_TASKS = {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"}
# eval.py: tasks scored on the first line of the prediction. THUDM's set, and LCEG's (longbench/eval.py) larger one.
FIRST_LINE_TASKS = {
    "longbench": {"trec", "triviaqa", "samsum", "lsht"},
    "lceg": {"narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique", "trec", "triviaqa",
             "samsum", "lsht", "passage_count", "passage_retrieval_en"},
}


# --- metrics ----------------------------------------------------------------------------------------------------
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction: list, ground_truth: list):
    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = num_same / len(prediction)
    recall = num_same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **kwargs):
    return f1_score(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def rouge_score(prediction: str, ground_truth: str, **kwargs) -> float:
    from rouge import Rouge

    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # noqa: BLE001 - the original's bare except: any failure scores 0
        return 0.0
    return scores["rouge-l"]["f"]


def classification_score(prediction: str, ground_truth: str, **kwargs) -> float:
    matches = [c for c in kwargs["all_classes"] if c in prediction]
    # The original removes from the list it is iterating over; Python's list iterator then skips the element
    # that follows each removed one. Reproduced by iterating over the live list exactly the same way.
    for term in matches:
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def count_score(prediction: str, ground_truth, **kwargs) -> float:
    numbers = re.findall(r"\d+", prediction)
    right = sum(1 for n in numbers if str(n) == str(ground_truth))
    return 0.0 if not numbers else float(right / len(numbers))


def retrieval_score(prediction: str, ground_truth: str, **kwargs) -> float:
    gt_id = re.findall(r"Paragraph (\d+)", ground_truth)[0]
    numbers = re.findall(r"\d+", prediction)
    right = sum(1 for n in numbers if str(n) == str(gt_id))
    return 0.0 if not numbers else float(right / len(numbers))


def code_sim_score(prediction: str, ground_truth: str, **kwargs) -> float:
    import warnings

    with warnings.catch_warnings():  # "Using slow pure-python SequenceMatcher": deliberate, see module docstring
        warnings.simplefilter("ignore")
        from fuzzywuzzy import fuzz

    line = ""
    for cand in prediction.lstrip("\n").split("\n"):
        if "`" not in cand and "#" not in cand and "//" not in cand:
            line = cand
            break
    return fuzz.ratio(line, ground_truth) / 100


METRICS = {
    "narrativeqa": qa_f1_score, "qasper": qa_f1_score, "multifieldqa_en": qa_f1_score, "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score, "musique": qa_f1_score, "gov_report": rouge_score, "qmsum": rouge_score,
    "multi_news": rouge_score, "trec": classification_score, "triviaqa": qa_f1_score, "samsum": rouge_score,
    "passage_count": count_score, "passage_retrieval_en": retrieval_score, "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}


def postprocess(task: str, prediction: str, first_line_tasks) -> str:
    if task in first_line_tasks:
        return prediction.lstrip("\n").split("\n")[0]
    return prediction


def sample_score(task: str, prediction: str, answers: list, all_classes=None, first_line_tasks=()) -> float:
    """max over the gold answers of the task metric, after the first-line post-processing (eval.py ``scorer``)."""
    pred = postprocess(task, prediction, first_line_tasks)
    metric = METRICS[task]
    score = 0.0
    for gt in answers:
        score = max(score, metric(pred, gt, all_classes=all_classes))
    return score


def task_score(task: str, predictions: list, answers: list, all_classes=None, first_line_tasks=()) -> float:
    """``round(100 * mean, 2)`` as eval.py (``all_classes`` is one list for the task, as in the original)."""
    total = sum(sample_score(task, p, a, all_classes, first_line_tasks) for p, a in zip(predictions, answers))
    return round(100 * total / len(predictions), 2)


def averages(task_scores: dict, categories: dict | None = None) -> dict:
    """Category means (over the tasks present) and the two overall averages: the LongBench README's mean of the
    category means, and the plain mean over tasks (the controlled study's Table 4 / Table 11 "Avg.", e.g. LLaMA2
    base 32.92 = mean of its 16 task scores; the README convention would give 33.18)."""
    categories = categories or CATEGORIES
    cats = {}
    for c, ts in categories.items():
        vals = [task_scores[t] for t in ts if t in task_scores]
        if vals:
            cats[c] = round(sum(vals) / len(vals), 2)
    vals = list(task_scores.values())
    return {
        "categories": cats,
        "category_average": round(sum(cats.values()) / len(cats), 2) if cats else None,
        "task_average": round(sum(vals) / len(vals), 2) if vals else None,
    }
