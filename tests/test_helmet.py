"""HELMET's categories (harness/evals/helmet*.py): the metrics against HELMET's arithmetic (hand-computed values and
``datasets``' own shuffle), the prompts HELMET's loaders build, the fit to a length, and each category on tiny_llama
from the fixtures in HELMET's formats."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.config import ConfigError
from harness.evals import EVALS, EvalContext
from harness.evals import helmet as H
from harness.evals.helmet_cite import HelmetCite
from harness.evals.helmet_longqa import HelmetLongQA, choice_score
from harness.evals.helmet_rag import HelmetRAG
from harness.evals.helmet_rerank import HelmetRerank
from harness.evals.helmet_summ import HelmetSumm

CATEGORIES = (HelmetRAG, HelmetRerank, HelmetCite, HelmetLongQA, HelmetSumm)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ROOT / "harness" / "assets" / "tiny_llama"))


# --- metrics ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pred,answers,sub,em", [
    ("Answer: Ada Merrow", ["ada merrow"], 1.0, 1.0),   # parsed after "Answer:", normalised
    ("It was the Ada Merrow, I think", ["Ada Merrow"], 1.0, 0.0),
    ("Tomas Vell", ["Ada Merrow", "Merrow"], 0.0, 0.0),
    ("The 1802.\nAnswer: no", ["1802"], 1.0, 0.0),     # parsed: "no"; the raw output holds 1802: substring only
    ("1802\nmore", ["1802"], 1.0, 1.0),                # no prefix: the first line is parsed, exact
])
def test_substring_and_exact_match_are_helmets(pred, answers, sub, em):
    m = H.default_post_process(pred, answers, with_rouge=False)
    assert m["substring_exact_match"] == sub and m["exact_match"] == em


def test_f1_yes_no_rule():
    assert H.f1_score("yes", "no") == 0.0 and H.f1_score("yes", "Yes.") == 1.0
    assert H.f1_score("the red house", "a red barn") == pytest.approx(0.5)  # {red} of {red, house} / {red, barn}


def test_parse_rankings_is_helmets():
    assert H.parse_rankings("Ranking: [ID: 12] > [ID: 3] > 7") == {"12": 3, "3": 2, "7": 1}
    assert H.parse_rankings("4 > 1\nthen 9 > 2 > 5") == {"9": 3, "2": 2, "5": 1}  # the longest run
    assert H.parse_rankings("3 > 3 > 1") == {"3": 3, "1": 1}  # a repeated id keeps its first rank
    assert H.parse_rankings("none") == {"none": 1}


def test_ndcg_matches_trec_eval_arithmetic():
    # DCG = 0/log2(2) + 3/log2(3) + 1/log2(4); ideal = 3/log2(2) + 1/log2(3) (linear gain, as trec_eval's ndcg_cut)
    got = H.ndcg_at({"a": 3, "b": 2, "c": 1}, {"a": 0, "b": 3, "c": 1, "d": 0}, 10)
    assert got == pytest.approx((3 / math.log2(3) + 0.5) / (3 + 1 / math.log2(3)))
    assert H.ndcg_at({"a": 2, "b": 1}, {"a": 1, "b": 2}, 1) == pytest.approx(1 / 2)  # the cut at 1
    assert H.ndcg_at({"x": 1}, {"a": 0}, 10) == 0.0  # nothing relevant: 0
    # equal scores: trec_eval ranks by document id, descending
    assert H.ndcg_at({"a": 1, "b": 1}, {"a": 1, "b": 0}, 1) == 0.0


def test_alce_metrics_are_eval_alce():
    qa = [{"short_answers": ["Ada Merrow"]}, {"short_answers": ["1802", "eighteen oh two"]}]
    assert H.str_em("Ada Merrow [1] built it.", qa) == 0.5
    assert H.str_em("Ada\nMerrow built it in 1802 [2][3].", qa) == 1.0  # newlines as spaces, citations removed
    groups = [["Ada Merrow", "Merrow"], ["Tomas Vell"], ["Owen Lark"]]
    assert H.qampari_rec_top5("Merrow [1], Owen Lark [2], Hugo Barr.", groups) == pytest.approx(2 / 3)
    six = [[f"n{i}"] for i in range(6)]
    assert H.qampari_rec_top5(", ".join(f"n{i}" for i in range(6)), six) == 1.0  # capped at 5 of min(5, 6)


def test_choice_score_is_helmets():
    s = {"options": ["Varn", "Miren", "Ostrel", "Eskby"], "answer": ["Ostrel"]}
    assert choice_score("C", s) == 1.0 and choice_score("Answer: c", s) == 1.0
    assert choice_score("I pick C. Ostrel because", s) == 1.0  # the option text anywhere
    assert choice_score("C Ostrel", s) == 1.0  # normalised, exactly the second answer "C. Ostrel"
    assert choice_score("B", s) == 0.0 and choice_score("Ostrel is C", s) == 0.0


def test_rouge_is_google_rouge_score():
    from rouge_score import rouge_scorer

    sc = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True).score("the cat sat on the mat", "a cat sat on a mat")
    assert H.rouge("a cat sat on a mat", ["the cat sat on the mat"])["rougeL_f1"] == sc["rougeL"].fmeasure


# --- draws: datasets' own shuffle ------------------------------------------------------------------------------------
def test_shuffle_draws_and_demos_match_datasets():
    from datasets import Dataset

    pool = [{"id": f"q{i % 9}", "v": i} for i in range(12)]  # ids repeat: drop_duplicates keeps the first
    for seed in (0, 42, 1234567):
        assert [r["v"] for r in H.hf_shuffle(pool, seed)] == Dataset.from_list(pool).shuffle(seed=seed)["v"]
        ds = Dataset.from_list(pool).shuffle(seed=seed)
        assert H.draw_shuffled(pool, 5, seed, "id") == ds.select(range(5)).to_list()
    sample = {"id": "q3"}
    ds = Dataset.from_list([d for d in pool if d["id"] != "q3"]).shuffle(seed=H.sample_hash("q3"))
    first, seen = [], set()
    for d in ds:
        if d["id"] not in seen:
            seen.add(d["id"])
            first.append(d)
    assert H.demos_hashed(pool, sample, "id", 2, {"q3"}) == first[:2]


def test_draw_keys_is_load_qa():
    import random

    pool = [{"id": f"k{i}"} for i in (5, 1, 3, 2, 4)]
    keys = random.Random(42).sample(sorted(d["id"] for d in pool), 3)
    assert [d["id"] for d in H.draw_keys(pool, 3, 42, "id")] == [d["id"] for d in pool if d["id"] in keys]


# --- prompts and fits ------------------------------------------------------------------------------------------------
def test_rag_prompt_is_load_qas(tok):
    ev = HelmetRAG(HelmetRAG.Args(tasks=["nq"], samples=2, shots=2, lengths=[4096]))
    s = ev.samples(tok, "nq", 4096)[0]
    chosen, pool, _ = ev.drawn("nq", 42)
    d = H.demos_hashed(pool, chosen[0], "id", 2, set())
    p = "\n\n".join(f"Document (Title: {c['title']}): {c['text']}" for c in chosen[0]["ctxs"])
    demo = "\n\n".join("\n\n".join(f"Document (Title: {c['title']}): {c['text']}" for c in x["ctxs"])
                       + f"\n\nQuestion: {x['question']}\nAnswer: {x['answers'][0]}" for x in d) + "\n\n"
    assert s["prompt"] == ("Use the given documents to write a concise and short answer to the question. Write your "
                           f"answer in the following format:\nAnswer: [answer]\n\n{demo}{p}\n\nQuestion: "
                           f"{chosen[0]['question']}\nAnswer:")
    assert s["k"] == len(chosen[0]["ctxs"]) and not s["dropped_gold"]


def test_passages_fit_the_length_and_keep_the_answer(tok):
    ev = HelmetRAG(HelmetRAG.Args(tasks=["nq"], samples=3, shots=0, lengths=[160]))
    for s in ev.samples(tok, "nq", 160):
        assert len(tok(s["prompt"]).input_ids) + 20 <= 160 and 1 <= s["k"] < 8
        assert any(c["has_answer"] for c in s["sample"]["ctxs"]) and not s["dropped_gold"]


def test_document_cut_with_helmets_postfix(tok):
    ev = HelmetLongQA(HelmetLongQA.Args(tasks=["narrativeqa"], samples=2, shots=1, lengths=[300]))
    for s in ev.samples(tok, "narrativeqa", 300):
        assert s["cut"] and s["sample"]["context"].endswith(H.TRUNCATION_POSTFIX)
        assert len(tok(s["prompt"]).input_ids) + 100 <= 300


def test_popqa_filter_and_rerank_demos_exclude_the_query(tok):
    rag = HelmetRAG(HelmetRAG.Args(tasks=["popqa"], samples=100, lengths=[4096]))
    chosen, pool, _ = rag.drawn("popqa", 42)
    assert chosen and all(math.log10(s["s_pop"]) < 3 for s in chosen + pool)
    rr = HelmetRerank(HelmetRerank.Args(samples=3, lengths=[4096]))
    chosen, pool, _ = rr.drawn("msmarco", 42)
    for i, s in enumerate(chosen):
        assert all(d["qid"] != s["qid"] for d in rr.demos("msmarco", i, s, chosen, pool, 42))


def test_unknown_task_and_missing_file_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="unknown tasks"):
        HelmetRAG(HelmetRAG.Args(tasks=["nq", "squad"]))
    ev = HelmetCite(HelmetCite.Args(data_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="asqa_eval_gtr_top2000.json not found"):
        ev.check_data("eval.suite.helmet_cite")


# --- each category on tiny_llama -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", CATEGORIES, ids=lambda c: c.NAME)
def test_category_end_to_end_on_tiny_model(cls, tiny, tmp_path):
    L = 1024
    ev = cls(cls.Args(samples=2, shots=1, lengths=[L], max_new_tokens=3,
                      generation_max_length={t: 24 for t in cls.TASKS}))
    out = ev.run(tiny, None, EvalContext(tmp_path, 0, "float32"))
    assert out["average_over"][str(L)] == list(cls.TASKS) and not out["skipped"]
    for t in cls.TASKS:
        x = out["per_sample"][t][str(L)]
        assert len(x) == 2 and all(0 <= v <= 100 for v in x)
        assert out["tasks"][t][str(L)] == pytest.approx(sum(x) / 2, abs=0.01)
        lo, hi = out["task_ci"][t][str(L)]
        assert lo <= out["tasks"][t][str(L)] <= hi
    lo, hi = out["ci"][str(L)]
    assert lo <= out["average"][str(L)] <= hi
    recs = [json.loads(x) for x in (tmp_path / "samples" / f"{cls.NAME}.jsonl").read_text().splitlines()]
    assert len(recs) == 2 * len(cls.TASKS) and all(r["prompt_tokens"] + 24 <= L for r in recs)
    assert EVALS.spec(cls.NAME).extended and out["metric"].keys() == cls.TASKS.keys()
