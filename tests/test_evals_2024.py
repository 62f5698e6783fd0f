"""2024 long-context benchmarks (issue 19): BABILong, HELMET's synthetic recall, LongBench v2.

Generators: the answer is in the prompt's context, prompt + generation budget <= L tokens (and the context fills
L), same seed -> same samples; metrics against the originals' functions re-derived here from their code
(``booydar/babilong babilong/metrics.py``, ``princeton-nlp/HELMET utils.py`` + ``data.py``, ``THUDM/LongBench``
``pred.py``); templates registered with the filter that keeps them out of training data; one end-to-end run of each
evaluator on the shipped tiny model with per-sample scores and intervals."""
from __future__ import annotations

import json
import random
import re
import string
from pathlib import Path

import pytest

from harness.config import ConfigError
from harness.evals import EvalContext
from harness.evals import babilong as B
from harness.evals import helmet_recall as H
from harness.evals import longbench_v2 as V
from harness.evals.ruler_data import DoesNotFit
from harness.evals.templates import (
    BABILONG_PROMPTS,
    BABILONG_TEMPLATE,
    EVAL_FRAGMENTS,
    HELMET_JSON_KV_DEMO,
    HELMET_JSON_KV_SYSTEM,
    HELMET_JSON_KV_USER,
    LONGBENCH_V2_TEMPLATE,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ROOT / "harness" / "assets" / "tiny_llama"))


class Limit:
    name = "limit"

    def __init__(self, n=None):
        self.n = n

    def max_length(self, handle):
        return self.n


# --- templates stay out of training ---------------------------------------------------------------------------------
def test_new_templates_are_registered_with_the_training_filter():
    from harness.data.synthetic import KINDS, FillerFactory, contains_eval_template, synthetic_document

    for t in BABILONG_PROMPTS.values():
        assert contains_eval_template(t["instruction"]) and contains_eval_template(t["post_prompt"])
    assert contains_eval_template(HELMET_JSON_KV_USER) and contains_eval_template(HELMET_JSON_KV_SYSTEM)
    assert contains_eval_template(LONGBENCH_V2_TEMPLATE)
    new = [f for f in EVAL_FRAGMENTS if f in " ".join([HELMET_JSON_KV_USER, HELMET_JSON_KV_SYSTEM,
                                                       LONGBENCH_V2_TEMPLATE] + [x for t in BABILONG_PROMPTS.values()
                                                                                  for x in t.values()])]
    assert len(new) >= 6
    # the synthetic training documents never carry them (the filter refuses them), and drawing still works
    filler = FillerFactory(["A line of filler text.", "Another line, longer than the first one."], 0)
    rng = random.Random(0)
    for kind in KINDS:
        for _ in range(20):
            doc = synthetic_document(rng, filler, 300, kind=kind)
            assert not any(f in doc for f in new), kind
    # nor does the natural training text (the Shakespeare train split)
    from harness.data.sources import load_source

    text = "\n".join(d.text for d in load_source("shakespeare", "train"))
    assert not any(f in text for f in new)


# --- BABILong -------------------------------------------------------------------------------------------------------
def ref_compare_answers(target, output, question, task_labels):
    """booydar/babilong babilong/metrics.py, written out from the original."""
    output = output.lower()
    output = output.split(".")[0]
    output = output.split("<context>")[0]
    output = output.split("<example>")[0]
    output = output.split("Question")[0]
    target = target.lower()
    task_labels = {label.lower() for label in task_labels}
    labels_in_question = {label for label in task_labels if label in question.lower()}
    labels_in_output = {label for label in task_labels if label in output}
    labels_in_output = labels_in_output - labels_in_question
    return target in labels_in_output and len(labels_in_output) == 1


@pytest.mark.parametrize("target,output,question,task,expected", [
    ("kitchen", "The most recent location of Mary is kitchen.", "Where is Mary?", "qa1", True),
    ("kitchen", "Kitchen. Then the garden.", "Where is Mary?", "qa1", True),  # only the first sentence counts
    ("kitchen", "kitchen or garden", "Where is Mary?", "qa1", False),  # two labels: wrong
    ("bathroom", "Before the kitchen the apple was in the bathroom", "Where was the apple before the kitchen?",
     "qa3", True),  # labels in the question never count
    ("garden", "garden<example>kitchen", "What is west of the bedroom?", "qa4", True),
    ("Fred", "fred", "Who did Mary give the apple to?", "qa5", True),
    ("apple", "The apple.", "What did Fred give to Bill?", "qa5", True),
    ("Jeff", "Mary gave it to Jeff", "Who did Mary give the apple to?", "qa5", True),
    ("Jeff", "Bill and Jeff", "Who gave the football?", "qa5", False),
    ("office", "", "Where is John?", "qa1", False),
    ("office", "Question: office", "Where is John?", "qa1", True),  # 'Question' never splits after lower()
])
def test_babilong_metric_matches_original(target, output, question, task, expected):
    labels = B.TASK_LABELS[task]
    assert B.compare_answers(target, output, question, labels) == expected
    assert ref_compare_answers(target, output, question, labels) == expected


def test_babilong_metric_fuzz_against_original():
    rng = random.Random(0)
    words = sorted(B.TASK_LABELS["qa5"] | B.TASK_LABELS["qa1"]) + ["the", ".", "<context>", "Question", "is", "x"]
    for _ in range(2000):
        task = rng.choice(B.TASKS)
        out = " ".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
        q = "Where is " + rng.choice(words) + "?"
        tgt = rng.choice(sorted(B.TASK_LABELS[task]))
        assert B.compare_answers(tgt, out, q, B.TASK_LABELS[task]) == \
            ref_compare_answers(tgt, out, q, B.TASK_LABELS[task])


def test_babilong_prompt_template():
    p = B.format_prompt("CTX", "Where is Mary?", "qa1", False, False, False)
    assert p == "<context>\nCTX\n</context>\nQuestion: Where is Mary?"  # the original's template, stripped
    full = B.format_prompt("CTX", "Where is Mary?", "qa2", True, True, True)
    assert full == BABILONG_TEMPLATE.format(**BABILONG_PROMPTS["qa2"], context="CTX", question="Where is Mary?").strip()
    assert full.startswith("I give you context") and "<example>" in full and full.endswith("Question: Where is Mary?")


def solve(task, facts, question):
    """An independent reading of the generated stories: the answer the facts imply."""
    if task == "qa1":
        who = question[len("Where is "):-1]
        return [re.match(rf"{who} .* the (\w+)\.$", f).group(1) for f in facts if f.startswith(who + " ")][-1]
    if task in ("qa2", "qa3"):
        loc, holder, at, trail = {}, {}, {}, {o: [] for o in B.OBJECTS}
        for f in facts:
            w = f.rstrip(".").split()
            p = w[0]
            if "there" in w:  # grab
                o = w[-2]
                holder[o], at[o] = p, None
            elif w[-1] in B.OBJECTS:  # drop
                o = w[-1]
                at[o], holder[o] = loc[p], None
            else:  # move
                loc[p] = w[-1]
            for o in B.OBJECTS:
                here = loc.get(holder.get(o)) if holder.get(o) else at.get(o)
                if here and (not trail[o] or trail[o][-1] != here):
                    trail[o].append(here)
        if task == "qa2":
            return trail[question.split()[-1].rstrip("?")][-1]
        m = re.match(r"Where was the (\w+) before the (\w+)\?", question)
        t = trail[m.group(1)]
        return t[t.index(m.group(2)) - 1]
    if task == "qa4":
        rel = [re.match(r"The (\w+) is (\w+) of the (\w+)\.", f).groups() for f in facts]
        m = re.match(r"What is the (\w+) (\w+) of\?", question)
        if m:
            return [y for x, d, y in rel if (x, d) == m.groups()][0]
        d, y = re.match(r"What is (\w+) of the (\w+)\?", question).groups()
        return [x for x, dd, yy in rel if (dd, yy) == (d, y)][0]
    return None


@pytest.mark.parametrize("task", B.TASKS)
def test_babilong_samples_fit_hold_the_answer_and_are_deterministic(tok, task):
    gen = B.BabilongGenerator(tok, seed=1)
    fill = []
    for L in (512, 1024, 2048):
        for i in range(3):
            s = gen.sample(task, L, i, 15)
            n = len(tok(s["prompt"]).input_ids)
            assert n == s["prompt_tokens"] and n + 15 <= L
            fill.append((n + 15) / L)
            # the facts, in order, and so the answer, are in the context; the context is inside the prompt
            at = -1
            for f in s["facts"]:
                at = s["input"].index(f, at + 1)
            assert s["input"] in s["prompt"]
            assert s["target"] in " ".join(s["facts"])
            assert s["question"] in s["prompt"] and s["sentences"] > 0
            expected = solve(task, s["facts"], s["question"])
            assert expected is None or expected == s["target"], (task, s["facts"], s["question"], s["target"])
            assert B.compare_answers(s["target"], s["target"], s["question"], B.TASK_LABELS[task])
    assert min(fill) > 0.6 and sum(fill) / len(fill) > 0.9, fill  # the book fills the length (whole sentences)
    assert gen.sample(task, 1024, 0, 15) == B.BabilongGenerator(tok, seed=1).sample(task, 1024, 0, 15)
    assert gen.sample(task, 1024, 0, 15) != B.BabilongGenerator(tok, seed=2).sample(task, 1024, 0, 15)


def test_babilong_vocabulary_and_too_short(tok):
    gen = B.BabilongGenerator(tok, seed=0, instruction=True, examples=True, post_prompt=True)
    s = gen.sample("qa5", 1024, 0, 15)
    names = set(re.findall(r"\b[A-Z][a-z]+\b", " ".join(s["facts"])))
    assert names <= set(B.PERSONS_QA5) and s["prompt"].startswith(BABILONG_PROMPTS["qa5"]["instruction"])
    with pytest.raises(B.DoesNotFit):
        gen.sample("qa3", 128, 0, 15)


def test_babilong_reads_released_files(tmp_path, tok):
    import pandas as pd

    d = tmp_path / "bl" / "1k"
    d.mkdir(parents=True)
    rows = [{"input": f"Filler. Mary went to the kitchen {i}.", "question": "Where is Mary?", "target": "kitchen"}
            for i in range(3)]
    pd.DataFrame(rows).to_parquet(d / "qa1-00000-of-00001.parquet")
    (d / "qa2.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ev = B.Babilong(B.Babilong.Args(data_dir=str(tmp_path / "bl"), samples=2, lengths=[1024]))
    ev.check_data("x")
    s = ev.samples(tok, "qa1", 1024)
    assert len(s) == 2 and s[1]["prompt"] == "<context>\nFiller. Mary went to the kitchen 1.\n</context>\n" \
                                            "Question: Where is Mary?"
    assert len(ev.samples(tok, "qa2", 1024)) == 2
    with pytest.raises(DoesNotFit):
        ev.samples(tok, "qa3", 1024)
    with pytest.raises(ConfigError, match="facts.qa1"):
        B.Babilong(B.Babilong.Args(facts={"qa1": [3, 2]}))


# --- HELMET recall --------------------------------------------------------------------------------------------------
def ref_normalize_answer(s):
    """HELMET utils.py normalize_answer."""
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def ref_parse_output(output, prefix="Answer:"):
    def lstrip_string(s, sub):
        return re.sub(f"^{re.escape(sub)}", "", s, flags=re.IGNORECASE)
    patterns = [re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")]
    for pat in patterns:
        matches = pat.search(output)
        if matches is not None:
            return lstrip_string(matches[1].strip(), prefix).strip()
    return None


def ref_json_kv(prediction, answer):
    """load_json_kv post_process: max of substring EM on the raw and on the parsed output."""
    sub = ref_normalize_answer(answer) in ref_normalize_answer(prediction)
    parsed = ref_parse_output(prediction, "corresponding value:")
    return max(sub, ref_normalize_answer(answer) in ref_normalize_answer(parsed))


@pytest.mark.parametrize("pred,answer,expected", [
    (" 3f2a-11 is it", "3f2a-11", 1.0),
    ("Corresponding value: 3F2A11\nmore", "3f2a-11", 1.0),  # normalisation drops hyphens and case
    ("the value is 3f2a", "3f2a-11", 0.0),
    ("", "3f2a-11", 0.0),
    ("Key: x\nCorresponding value: a b", "a-b", 0.0),  # "a" is an article: "a b" -> "b", "a-b" -> "ab"
])
def test_json_kv_metric_matches_helmet(pred, answer, expected):
    assert H.json_kv_score(pred, answer) == expected == float(ref_json_kv(pred, answer))
    assert H.normalize_answer(pred) == ref_normalize_answer(pred)
    assert H.parse_output(pred, "corresponding value:") == ref_parse_output(pred, "corresponding value:")


def test_ruler_recall_matches_helmet():
    ref = lambda p, a: sum([x.lower() in p.lower() for x in a]) / len(a)  # noqa: E731  data.py load_ruler
    for p, a in [("1234 and 5678", ["1234", "5678", "9"]), ("ABC", ["abc"]), ("", ["1"]), ("x 12", ["1", "2"])]:
        assert H.ruler_recall(p, a) == ref(p, a)


def test_json_kv_prompt_is_helmets(tok):
    s = H.JsonKV(tok, seed=3).samples(1024, 2, 100)
    for x in s:
        assert x["prompt_tokens"] + 100 <= 1024 and x["prompt_tokens"] == len(tok(x["prompt"]).input_ids)
        key = re.search(r'Key: "([0-9a-f-]{36})"\nCorresponding value:$', x["prompt"]).group(1)
        ctx = x["prompt"].split("\n\nExtract the value")[0]
        obj = json.loads(ctx.split("\n", 1)[1])  # "JSON data:\n" + the object
        assert ctx.startswith("JSON data:\n{") and obj[key] == x["answer"] and len(obj) == x["k"]
        assert list(obj).index(key) == round(x["depth"] * (x["k"] - 1))
        demos = re.findall(r'Key: "([0-9a-f-]{36})"\nCorresponding value: ([0-9a-f-]{36})', x["prompt"])
        assert len(demos) == 2 and not any(k in obj for k, _ in demos)
        user = HELMET_JSON_KV_USER.format(context=ctx, question=f'"{key}"', demos="\n\n".join(
            HELMET_JSON_KV_DEMO.format(key=f'"{k}"', value=" " + v) for k, v in demos) + "\n\n")
        assert x["prompt"] == user + "\n" + HELMET_JSON_KV_SYSTEM
    assert s == H.JsonKV(tok, seed=3).samples(1024, 2, 100) and s != H.JsonKV(tok, seed=4).samples(1024, 2, 100)
    more = H.JsonKV(tok, seed=3).samples(2048, 1, 100)[0]
    assert more["k"] > s[0]["k"] and more["prompt_tokens"] + 100 > 2048 - 80  # fills the length (a pair ~ 40 tokens)


HELMET_NIAH = ("A special magic {v} is hidden within the following text. Make sure to memorize it. I will quiz you "
               "about the {v} afterwards.\n{context}\nWhat is the special magic {v} for {query} mentioned in the "
               "provided text?", "The special magic {v} for {query} mentioned in the provided text is")
HELMET_NIAH_MV = ("Some special magic {v} are hidden within the following text. Make sure to memorize it. I will quiz "
                  "you about the {v} afterwards.\n{context}\nWhat are all the special magic {v} for {query} mentioned "
                  "in the provided text?", "The special magic {v} for {query} mentioned in the provided text are")


@pytest.mark.parametrize("task,v,tmpl", [("ruler_niah_mk_2", "number", HELMET_NIAH),
                                         ("ruler_niah_mk_3", "uuid", HELMET_NIAH),
                                         ("ruler_niah_mv", "numbers", HELMET_NIAH_MV)])
def test_helmet_ruler_subsets_use_helmets_template(tok, task, v, tmpl):
    ev = H.HelmetRecall(H.HelmetRecall.Args(samples=2, small_threshold=10**6, essay_increment=25))
    for L in (1024, 2048):
        for s in ev.samples(tok, task, L):
            p = s["prompt"]
            assert s["prompt_tokens"] == len(tok(p).input_ids) and s["prompt_tokens"] + ev.gen_tokens(task) <= L
            assert all(a in p for a in s["answers"]) and len(s["answers"]) == (4 if task == "ruler_niah_mv" else 1)
            query = re.search(r"for (\S+) mentioned in the provided text\?\n", p).group(1)
            head = tmpl[0].split("{context}")[0].format(v=v)
            tail = tmpl[0].split("{context}")[1].format(v=v, query=query) + "\n" + tmpl[1].format(v=v, query=query)
            assert p.startswith(head) and p.endswith(tail)
            context = p[len(head):-len(tail)]
            assert p == tmpl[0].format(v=v, context=context, query=query) + "\n" + tmpl[1].format(v=v, query=query)
    a, b = ev.samples(tok, task, 1024), ev.samples(tok, task, 1024)
    assert a == b


def test_ruler_generator_default_unchanged(tok):
    """The HELMET join is opt-in: RULER's own prompts still end with ' The special magic ...'."""
    from harness.evals.ruler_data import RulerGenerator

    s = RulerGenerator(tok).samples("niah_single_2", 2048, 1)[0]["input"]
    assert "? The special magic number for" in s


def test_helmet_args_refuse_bad_values():
    with pytest.raises(ConfigError, match="unknown tasks"):
        H.HelmetRecall(H.HelmetRecall.Args(tasks=["json_kv", "nope"]))
    ev = H.HelmetRecall(H.HelmetRecall.Args(generation_max_length={"json_kv": 0}))
    with pytest.raises(ConfigError, match="json_kv"):
        ev.check(512, "eval.suite.helmet_recall")


# --- LongBench v2 ---------------------------------------------------------------------------------------------------
def ref_extract_answer(response):
    """THUDM/LongBench pred.py extract_answer (v2)."""
    response = response.replace("*", "")
    match = re.search(r"The correct answer is \(([A-D])\)", response)
    if match:
        return match.group(1)
    match = re.search(r"The correct answer is ([A-D])", response)
    if match:
        return match.group(1)
    return None


@pytest.mark.parametrize("response,expected", [
    ("The correct answer is (B).", "B"), ("**The correct answer is (C)**", "C"), ("The correct answer is D", "D"),
    ("the correct answer is (A)", None), ("Answer: (A)", None), ("The correct answer is (E)", None),
    ("The correct answer is A. No wait, The correct answer is (B)", "B"), ("", None),
])
def test_longbench_v2_extract_answer_matches_original(response, expected):
    assert V.extract_answer(response) == ref_extract_answer(response) == expected


def test_longbench_v2_truncation_and_prompt(tok):
    ids = list(range(11))
    assert V.middle_truncate(ids, 5) == ids[: 5 // 2] + ids[-5 // 2:] == [0, 1, 8, 9, 10]  # tail keeps ceil
    assert V.middle_truncate(ids, 11) == ids
    items = V.load_items(V.FIXTURE)
    assert len(items) >= 6 and {i["length"] for i in items} == set(V.LENGTHS) and \
        {i["difficulty"] for i in items} == set(V.DIFFICULTIES)
    it = items[0]
    p = V.format_prompt(it)
    assert p == LONGBENCH_V2_TEMPLATE.replace("$DOC$", it["context"].strip()).replace("$Q$", it["question"]) \
        .replace("$C_A$", it["choice_A"]).replace("$C_B$", it["choice_B"]).replace("$C_C$", it["choice_C"]) \
        .replace("$C_D$", it["choice_D"])
    full = tok(p).input_ids
    cut, was = V.build_input(tok, it, 200)
    assert was and len(cut) == 200 and cut[:100] == full[:100] and cut[100:] == full[-100:]
    cut_text, _ = V.build_input(tok, it, 200, "text")
    assert abs(len(cut_text) - 200) <= 3
    assert V.build_input(tok, it, len(full)) == (full, False)


def test_longbench_v2_buckets_and_bad_data(tmp_path):
    recs = [{"score": s, "difficulty": d, "length_bucket": b} for s, d, b in
            [(1, "easy", "short"), (0, "hard", "short"), (1, "hard", "long"), (0.25, "easy", "medium")]]
    s = V.summarize(recs)
    assert s["overall"][0] == 56.2 and s["easy"][0] == 62.5 and s["short"][0] == 50.0 and s["long"][0] == 100.0
    assert s["overall"][1][0] <= 56.2 <= s["overall"][1][1]
    assert V.item_score(None, "A", compensated=True) == 0.25 and V.item_score("A", "A") == 1.0
    bad = tmp_path / "d.json"
    bad.write_text(json.dumps([{"_id": "x", "question": "q"}]))
    with pytest.raises(ConfigError, match="lacks fields"):
        V.load_items(bad)
    ev = V.LongBenchV2(V.LongBenchV2.Args(data_path=str(tmp_path / "missing.json"), lengths=[512]))
    with pytest.raises(ConfigError, match="not found"):
        ev.check_data("eval.suite.longbench_v2")
    with pytest.raises(ConfigError, match="max_new_tokens"):
        V.LongBenchV2(V.LongBenchV2.Args(lengths=[100])).check(512, "eval.suite.longbench_v2")


# --- suite and end to end on the tiny model -------------------------------------------------------------------------
def test_extended_suite_composes_and_checks():
    from omegaconf import OmegaConf

    from harness.conf_utils import compose
    from harness.evals import check_suite

    cfg = compose(["eval=extended"])
    evs = check_suite(OmegaConf.to_container(cfg.eval.suite, resolve=True), 512)
    assert [type(e).registered_name for e in evs] == ["babilong", "helmet_recall", "longbench_v2"]
    assert all(list(e.args.lengths) == [512, 1024, 2048] for e in evs)


def test_babilong_end_to_end_on_tiny_model(tiny, tmp_path):
    ctx = EvalContext(tmp_path, 0, "float32")
    b = B.Babilong(B.Babilong.Args(tasks=["qa1", "qa4"], samples=2, max_new_tokens=6, lengths=[512, 1024])) \
        .run(tiny, Limit(512), ctx)
    assert b["skipped"]["1024"].startswith("method limit supports at most")
    for t in ("qa1", "qa4"):
        x = b["per_sample"][t]["512"]
        assert len(x) == 2 and set(x) <= {0, 1} and b["tasks"][t]["512"] == 100 * sum(x) / 2
        lo, hi = b["task_ci"][t]["512"]
        assert lo <= b["tasks"][t]["512"] <= hi and hi > 0
    assert b["ci"]["512"][0] <= b["average"]["512"] <= b["ci"]["512"][1]
    recs = [json.loads(x) for x in (tmp_path / "samples" / "babilong.jsonl").read_text().splitlines()]
    assert len(recs) == 4 and all(r["prompt_tokens"] + 6 <= r["length"] and r["score"] == 100 * r["correct"]
                                  for r in recs)


def test_helmet_recall_end_to_end_on_tiny_model(tiny, tmp_path):
    h = H.HelmetRecall(H.HelmetRecall.Args(tasks=["json_kv", "ruler_niah_mk_2"], samples=2, lengths=[1024],
                                           generation_max_length={"json_kv": 40, "ruler_niah_mk_2": 16},
                                           max_new_tokens=4, small_threshold=10**6)) \
        .run(tiny, None, EvalContext(tmp_path, 0, "float32"))
    for t in ("json_kv", "ruler_niah_mk_2"):
        x = h["per_sample"][t]["1024"]
        assert len(x) == 2 and all(0 <= v <= 100 for v in x) and h["tasks"][t]["1024"] == sum(x) / 2
        assert h["task_ci"][t]["1024"][0] <= h["tasks"][t]["1024"] <= h["task_ci"][t]["1024"][1]
    assert h["average_over"]["1024"] == ["json_kv", "ruler_niah_mk_2"]
    assert h["ci"]["1024"][0] <= h["average"]["1024"] <= h["ci"]["1024"][1]
    recs = [json.loads(x) for x in (tmp_path / "samples" / "helmet_recall.jsonl").read_text().splitlines()]
    assert len(recs) == 4 and all(r["prompt_tokens"] + (40 if r["task"] == "json_kv" else 16) <= 1024 for r in recs)


def test_longbench_v2_end_to_end_on_tiny_model(tiny, tmp_path):
    v = V.LongBenchV2(V.LongBenchV2.Args(samples=2, max_new_tokens=4, lengths=[512])) \
        .run(tiny, None, EvalContext(tmp_path, 0, "float32"))
    assert len(v["per_sample"]["512"]) == 2 and v["ci"]["512"][0] <= v["accuracy"]["512"] <= v["ci"]["512"][1]
    recs = [json.loads(x) for x in (tmp_path / "samples" / "longbench_v2.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(r["prompt_tokens"] <= 512 - 4 for r in recs) and v["truncated"]["512"] >= 1
    assert v["accuracy"]["512"] == 100 * sum(r["score"] for r in recs) / 2


# --- make tables ----------------------------------------------------------------------------------------------------
def _extended_metrics(rng, good):
    C = 256
    out = {}
    for name, tasks in (("babilong", B.TASKS), ("helmet_recall", H.TASKS)):
        ps = {t: {str(L): [100.0 * (rng.random() < good) for _ in range(6)] for L in (C, 2 * C)} for t in tasks}
        sc = {t: {L: sum(v) / len(v) for L, v in d.items()} for t, d in ps.items()}
        out[name] = {"average": {L: sum(sc[t][L] for t in tasks) / len(tasks) for L in ("256", "512")},
                     "tasks": sc, "per_sample": ps, "average_over": {L: list(tasks) for L in ("256", "512")}}
    ps = {str(L): [float(rng.random() < good / 3) for _ in range(6)] for L in (C, 2 * C)}
    out["longbench_v2"] = {"accuracy": {L: 100 * sum(v) / 6 for L, v in ps.items()}, "per_sample": ps}
    return out


def test_extended_table_in_make_tables(tmp_path):
    from test_tables import make_row, write_rows

    from controlled_study import build_all

    rng = random.Random(0)
    rows = []
    for rid, method, train, good in (("e1-base", "base", "none", 0.8), ("e2-pi", "pi", "tiny", 0.6)):
        r = make_row(tmp_path, rid, method, train=train, suites=("ppl",))
        r["metrics"].update(_extended_metrics(rng, good))
        r["config"]["eval"]["suite"].update({k: {"name": k} for k in ("babilong", "helmet_recall", "longbench_v2")})
        rows.append(r)
    rows[0]["metrics"]["longbench_v2"]["per_sample"]["256"] = [0.0] * 6  # the base at C: no answer parsed
    rows[0]["metrics"]["longbench_v2"]["accuracy"]["256"] = 0.0
    out = build_all(write_rows(tmp_path, rows), tmp_path / "tables", figures=False)
    t = {x.id: x for x in out["tables"]}["extended_tiny_llama"]
    assert t.header[2:] == [f"{b} {f}C" for b in ("BABILong", "HELMET recall", "LongBench v2") for f in (1, 2)]
    base = t.rows[0]
    assert base[1] == "frozen" and len(t.rows) == 2
    cells = base[2:]
    bl = rows[0]["metrics"]["babilong"]
    assert cells[0].ours == pytest.approx(bl["average"]["256"]) and cells[0].n == 30
    assert cells[0].ci[0] <= cells[0].ours <= cells[0].ci[1] and cells[0].nm is None
    assert cells[4].nm and "longbench_v2" in cells[4].nm  # the base at C is below chance (25%): not measurable
    md = (tmp_path / "tables" / "extended_tiny_llama.md").read_text()
    assert "BABILong 1C" in md and "n.m." in md
