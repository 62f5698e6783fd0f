"""babilong: BABILong, reasoning in a haystack (Kuratov et al. 2024, ``booydar/babilong``), tasks qa1-qa5.

The original takes the bAbI stories of qa1-qa5 (single / two / three supporting facts, two-argument relations,
three-argument relations), hides each story's facts, in order, between consecutive sentences of PG19 books
(``babilong/babilong_utils.py``: ``SentenceSampler`` + ``NoiseInjectionDataset``: ``sample_size`` tokens in all,
fact positions drawn with replacement among the gaps between sentences and sorted, so several facts may share a gap),
and asks the story's question after the context. Prompt (``babilong/prompts.py``): ``DEFAULT_TEMPLATE =
"{instruction}\\n{examples}\\n{post_prompt}\\n<context>\\n{context}\\n</context>\\nQuestion: {question}"``, stripped,
with the task's instruction / in-context examples / post-prompt each on or off (``scripts/run_model_on_babilong.py``
flags ``--use_instruction --use_examples --use_post_prompt``: all off by default, and off in the original's scripts
for base models such as ``run_LLaMA-2-7B-32K_no_instruct.sh``; the ``_with_instruct`` scripts of the leaderboard
turn all three on). No chat template for base models; greedy decoding of ``max_new_tokens=15``, output stripped.
Metric (``babilong/metrics.py`` ``compare_answers``): the output, lower-cased, is cut at the first '.', then at
'<context>', '<example>' and 'Question' (the last never matches after lower-casing: kept); the task's labels
(``TASK_LABELS``: the six bAbI locations for qa1-qa4; Bill, Fred, Jeff, Mary, apple, football, milk for qa5) found
as substrings of it, minus those in the question, must be exactly the target. Accuracy per task and length, 0..100.

Data: when ``data_dir`` holds released BABILong files (``RMT-team/babilong`` / ``babilong-1k-samples`` layout:
``{split}/{task}-*.parquet`` or ``{split}/{task}/*.parquet``, or ``{split}/{task}.json`` / ``.jsonl``; fields
``input``, ``question``, ``target``; the split of length L is ``release_splits[L]`` or ``"{L // 1024}k"``), the first
``samples`` items are read and prompted as they are. Otherwise our own deterministic generator (seeded per task,
length and sample) writes the samples. How it differs from the released data:

- Stories: a small bAbI-style world simulator with bAbI's vocabulary (people Mary, John, Daniel, Sandra; Bill, Fred,
  Jeff, Mary for qa5; the six locations; apple, football, milk; bAbI's verbs and question forms), not the bAbI
  test stories themselves (not available offline). Story sizes are drawn from ``facts`` (per task ``[min, max]``
  facts; bAbI's qa3 stories run to ~100+ facts, here capped so that stories fit miniature windows). Every question
  is checked to have exactly one answer in its story (qa3 asks about a location the object visited once; qa5 only
  asks questions whose answer is unique over all giving events); qa4 has bAbI's two relation facts per story.
- Haystack: the Shakespeare test split (offline books, the same the passkey / NIAH / RULER evaluators use), split
  into sentences by ``ruler_data.split_sentences`` (the original: ``nltk.PunktSentenceTokenizer`` on PG19),
  keeping sentences of at least ``min_sentence_tokens`` tokens (the original's ``min_sentence_len``), read in order
  from a seeded random start (the original's ``shuffle=True`` sampler starts at a random point of a random book).
- Length: L is the whole input, prompt + ``max_new_tokens`` <= L tokens (BOS included), as every evaluator here;
  the original's ``sample_size`` counts the context (facts + book) only and adds the prompt on top. The context is
  whole sentences (the original cuts the last sentence to the exact token count) and is joined as text with spaces
  (the original concatenates token ids and decodes them).

The samples of one task and length are decoded in lexicographic order of their prompts (``reuse_order``), each
reusing the KV cache of the head it shares with the previous one (``reuse_prefix``); the row keeps every sample's
0/1 score in sample order (``per_sample``), a Wilson interval per task and length (``task_ci``) and, for the
per-length average over the tasks that ran, Wilson on the pooled samples (``ci``, ``harness.stats.bounded_interval``).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from harness.config import ConfigError
from harness.data.sources import load_source
from harness.evals import (
    EVALS,
    EvalArgs,
    Spec,
    check_nonneg,
    check_positive,
    split_lengths,
    tasks_x_samples,
    write_jsonl,
)
from harness.evals.common import PrefixCache, reuse_order
from harness.evals.ruler_data import DoesNotFit, split_sentences
from harness.evals.templates import BABILONG_PROMPTS, BABILONG_TEMPLATE
from harness.stats import bounded_interval, wilson

TASKS = ["qa1", "qa2", "qa3", "qa4", "qa5"]
PERSONS = ["Mary", "John", "Daniel", "Sandra"]  # bAbI qa1-qa3
PERSONS_QA5 = ["Bill", "Fred", "Jeff", "Mary"]  # bAbI qa5
LOCATIONS = ["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"]
OBJECTS = ["apple", "football", "milk"]
MOVE = ["moved to", "went to", "journeyed to", "travelled to", "went back to"]
GRAB = ["got", "picked up", "grabbed", "took"]
DROP = ["dropped", "discarded", "put down", "left"]
GIVE = ["gave", "handed", "passed"]
DIRECTIONS = ["north", "south", "east", "west"]
# babilong/metrics.py TASK_LABELS (qa1-qa5)
TASK_LABELS = {
    "qa1": set(LOCATIONS), "qa2": set(LOCATIONS), "qa3": set(LOCATIONS), "qa4": set(LOCATIONS),
    "qa5": {"Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"},
}
DEFAULT_FACTS = {"qa1": [2, 10], "qa2": [4, 20], "qa3": [6, 30], "qa4": [2, 2], "qa5": [4, 20]}


# --- metric (babilong/metrics.py) ---------------------------------------------------------------------------------
def preprocess_output(output: str) -> str:
    output = output.lower()
    output = output.split(".")[0]  # the first sentence only
    output = output.split("<context>")[0]  # the model continuing with more examples
    output = output.split("<example>")[0]
    return output.split("Question")[0]  # never matches after lower() (kept as in the original)


def compare_answers(target: str, output: str, question: str, task_labels) -> bool:
    """True when the target is the only task label in the output that the question does not mention."""
    output = preprocess_output(output)
    target = target.lower()
    labels = {x.lower() for x in task_labels}
    in_question = {x for x in labels if x in question.lower()}
    in_output = {x for x in labels if x in output} - in_question
    return target in in_output and len(in_output) == 1


def format_prompt(context: str, question: str, task: str, instruction: bool, examples: bool,
                  post_prompt: bool) -> str:
    """``get_formatted_input`` with the parts the flags turn on (the others are empty strings)."""
    p = BABILONG_PROMPTS[task]
    return BABILONG_TEMPLATE.format(instruction=p["instruction"] if instruction else "",
                                    examples=p["examples"] if examples else "",
                                    post_prompt=p["post_prompt"] if post_prompt else "",
                                    context=context, question=question).strip()


# --- bAbI-style stories ---------------------------------------------------------------------------------------------
def _story_qa1(rng: random.Random, n: int):
    loc, facts = {}, []
    for _ in range(n):
        p = rng.choice(PERSONS)
        loc[p] = rng.choice([x for x in LOCATIONS if x != loc.get(p)])
        facts.append(f"{p} {rng.choice(MOVE)} the {loc[p]}.")
    p = rng.choice(sorted(loc))
    return facts, f"Where is {p}?", loc[p]


class _World:
    """People moving, picking up, dropping and giving objects; object locations follow their holder."""

    def __init__(self, rng: random.Random, persons: list[str]):
        self.rng, self.persons = rng, persons
        self.loc: dict = {}
        self.holder: dict = {}
        self.obj_loc: dict = {}
        self.trail: dict = {o: [] for o in OBJECTS}  # the locations each object has been in, in order
        self.gives: list = []  # (giver, object, receiver)

    def _at(self, o):
        h = self.holder.get(o)
        return self.loc.get(h) if h else self.obj_loc.get(o)

    def _visit(self, o):
        where = self._at(o)
        if where and (not self.trail[o] or self.trail[o][-1] != where):
            self.trail[o].append(where)

    def step(self, weights: dict) -> str | None:
        rng = self.rng
        action = rng.choices(list(weights), list(weights.values()))[0]
        if action == "move":
            p = rng.choice(self.persons)
            self.loc[p] = rng.choice([x for x in LOCATIONS if x != self.loc.get(p)])
            for o, h in self.holder.items():
                if h == p:
                    self._visit(o)
            return f"{p} {rng.choice(MOVE)} the {self.loc[p]}."
        if action == "grab":
            opts = [(p, o) for p in self.persons if self.loc.get(p) for o in OBJECTS
                    if not self.holder.get(o) and self.obj_loc.get(o) in (None, self.loc[p])]
            if not opts:
                return None
            p, o = rng.choice(opts)
            self.holder[o], self.obj_loc[o] = p, None
            self._visit(o)
            return f"{p} {rng.choice(GRAB)} the {o} there."
        if action == "drop":
            opts = [(p, o) for o, p in self.holder.items() if p]
            if not opts:
                return None
            p, o = rng.choice(sorted(opts))
            self.holder[o], self.obj_loc[o] = None, self.loc[p]
            return f"{p} {rng.choice(DROP)} the {o}."
        if action == "give":
            opts = [(p, o, q) for o, p in self.holder.items() if p for q in self.persons
                    if q != p and self.loc.get(q) == self.loc.get(p)]
            if not opts:
                return None
            p, o, q = rng.choice(sorted(opts))
            self.holder[o] = q
            self.gives.append((p, o, q))
            return f"{p} {rng.choice(GIVE)} the {o} to {q}."
        raise ValueError(action)

    def run(self, n: int, weights: dict) -> list[str]:
        facts = []
        while len(facts) < n:
            s = self.step(weights)
            if s:
                facts.append(s)
        return facts


def _story_qa2(rng, n):
    w = _World(rng, PERSONS)
    facts = w.run(n, {"move": 0.5, "grab": 0.3, "drop": 0.2})
    objs = [o for o in OBJECTS if w.trail[o] and w._at(o)]
    if not objs:
        return None
    o = rng.choice(objs)
    return facts, f"Where is the {o}?", w._at(o)


def _story_qa3(rng, n):
    w = _World(rng, PERSONS)
    facts = w.run(n, {"move": 0.5, "grab": 0.3, "drop": 0.2})
    opts = []
    for o, t in w.trail.items():
        for i in range(1, len(t)):
            if t.count(t[i]) == 1:  # "before the X" is unambiguous only for a location visited once
                opts.append((o, t[i], t[i - 1]))
    if not opts:
        return None
    o, now, before = rng.choice(opts)
    return facts, f"Where was the {o} before the {now}?", before


def _story_qa4(rng, n):
    a, b, c = rng.sample(LOCATIONS, 3)
    d1, d2 = rng.choice(DIRECTIONS), rng.choice(DIRECTIONS)
    facts = [f"The {a} is {d1} of the {b}.", f"The {c} is {d2} of the {a}."]
    rels = [(a, d1, b), (c, d2, a)]
    x, d, y = rng.choice(rels)
    if rng.random() < 0.5:
        return facts, f"What is the {x} {d} of?", y
    return facts, f"What is {d} of the {y}?", x


def _story_qa5(rng, n):
    w = _World(rng, PERSONS_QA5)
    facts = w.run(n, {"move": 0.35, "grab": 0.3, "give": 0.25, "drop": 0.1})
    if not w.gives:
        return None
    qs: dict = {}
    for p, o, q in w.gives:
        for question, answer in ((f"Who gave the {o}?", p), (f"Who received the {o}?", q),
                                 (f"What did {p} give to {q}?", o), (f"Who did {p} give the {o} to?", q),
                                 (f"Who gave the {o} to {q}?", p)):
            qs.setdefault(question, set()).add(answer)
    unique = sorted((question, a.pop()) for question, a in qs.items() if len(a) == 1)
    if not unique:
        return None
    question, answer = rng.choice(unique)
    return facts, question, answer


STORIES = {"qa1": _story_qa1, "qa2": _story_qa2, "qa3": _story_qa3, "qa4": _story_qa4, "qa5": _story_qa5}


def make_story(task: str, rng: random.Random, n_range) -> tuple[list[str], str, str]:
    """(facts, question, target) of a bAbI-style story with ``n_range[0]..n_range[1]`` facts."""
    for _ in range(1000):
        out = STORIES[task](rng, rng.randint(int(n_range[0]), int(n_range[1])))
        if out is not None:
            return out
    raise RuntimeError(f"babilong: could not draw a {task} story with {n_range} facts")


# --- haystack -------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def _book_sentences(tokenizer_key, tokenizer, min_tokens: int) -> tuple[list[str], list[int]]:
    import re

    text = re.sub(r"\s+", " ", "\n".join(d.text for d in load_source("shakespeare", "test"))).strip()
    sents = split_sentences(text)
    counts = [len(x) for x in tokenizer(sents, add_special_tokens=False).input_ids]
    keep = [(s, n) for s, n in zip(sents, counts) if n >= min_tokens]
    return [s for s, _ in keep], [n for _, n in keep]


def book_sentences(tokenizer, min_tokens: int = 10) -> tuple[list[str], list[int]]:
    """Sentences of the Shakespeare test split with at least ``min_tokens`` tokens, and their token counts."""
    return _book_sentences(getattr(tokenizer, "name_or_path", id(tokenizer)), tokenizer, min_tokens)


def weave(facts: list[str], sentences: list[str], rng: random.Random) -> tuple[str, list[int]]:
    """NoiseInjectionDataset: facts, in order, before the sentences at sorted positions drawn with replacement
    from ``0..len(sentences)``. Returns the text and the positions."""
    pos = sorted(rng.choice(range(len(sentences) + 1)) for _ in facts)
    gaps: list[list[str]] = [[] for _ in range(len(sentences) + 1)]
    for f, p in zip(facts, pos):
        gaps[p].append(f)
    for i, s in enumerate(sentences):
        gaps[i].append(s)
    return " ".join(x for g in gaps for x in g), pos


class BabilongGenerator:
    def __init__(self, tokenizer, seed: int = 0, facts: dict | None = None, instruction: bool = False,
                 examples: bool = False, post_prompt: bool = False, min_sentence_tokens: int = 10):
        self.tok, self.seed = tokenizer, seed
        self.facts = {**DEFAULT_FACTS, **(facts or {})}
        self.flags = (instruction, examples, post_prompt)
        self.min_sentence_tokens = min_sentence_tokens

    def count(self, text: str) -> int:
        return len(self.tok(text).input_ids)

    def sample(self, task: str, L: int, index: int, gen_tokens: int) -> dict:
        rng = random.Random(f"babilong-{self.seed}-{task}-{L}-{index}")
        facts, question, target = make_story(task, rng, self.facts[task])
        budget = L - gen_tokens
        build = lambda ss: weave(facts, ss, random.Random(f"babilong-pos-{self.seed}-{task}-{L}-{index}"))  # noqa
        prompt0 = format_prompt(build([])[0], question, task, *self.flags)
        n0 = self.count(prompt0)
        if n0 > budget:
            raise DoesNotFit(f"{task}: the prompt without book text has {n0} tokens, more than {L} - {gen_tokens}")
        sents, counts = book_sentences(self.tok, self.min_sentence_tokens)
        start = rng.randrange(len(sents))
        chosen, have = [], n0
        i = start
        while True:  # estimate: token counts add up (a token or so per seam), then shrink to fit exactly
            c = counts[i % len(sents)] + 1
            if have + c > budget or len(chosen) >= len(sents):
                break
            chosen.append(sents[i % len(sents)])
            have += c
            i += 1
        while True:
            context, pos = build(chosen)
            prompt = format_prompt(context, question, task, *self.flags)
            n = self.count(prompt)
            if n <= budget or not chosen:
                break
            chosen = chosen[: max(0, len(chosen) - max(1, (n - budget) // 8))]
        return {"index": index, "task": task, "input": context, "question": question, "target": target,
                "facts": facts, "prompt": prompt, "prompt_tokens": n, "sentences": len(chosen),
                "depths": [round(p / max(len(chosen), 1), 4) for p in pos]}


# --- released files -------------------------------------------------------------------------------------------------
def release_files(data_dir: str, split: str, task: str) -> list[Path]:
    d = Path(data_dir) / split
    return sorted(d.glob(f"{task}-*.parquet")) or sorted((d / task).glob("*.parquet")) or \
        [p for p in (d / f"{task}.json", d / f"{task}.jsonl") if p.is_file()]


def read_release(files: list[Path], n: int) -> list[dict]:
    rows: list = []
    for f in files:
        if f.suffix == ".parquet":
            import pandas as pd

            rows += pd.read_parquet(f, columns=["input", "question", "target"]).to_dict("records")
        elif f.suffix == ".jsonl":
            rows += [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
        else:
            data = json.loads(f.read_text(encoding="utf-8"))
            rows += data if isinstance(data, list) else list(data.values())
        if n and len(rows) >= n:
            break
    for r in rows:
        if not {"input", "question", "target"} <= set(r):
            raise ConfigError(f"babilong: {files[0]} rows need the fields input, question, target")
    return rows[:n] if n else rows


@EVALS.register("babilong")
class Babilong:
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ruler",  # RULER's output shape: a length's mean over tasks with its interval (0..100)
        records={"length": "length", "task": "task", "score": ("score", "correct")},  # samples/babilong.jsonl fields
        floor={"threshold": 50, "chance": 0.0, "ceiling": 100},  # the tables' floor rule, 0..100
        extended="BABILong",  # its column in the 2024-benchmarks table
        extended_note="mean accuracy over qa1-qa5",  # its line in that table's notes
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map (each task x length)

    def count_prompts(self, lengths, limit):
        return tasks_x_samples(self.args, lengths, limit)

    @dataclass
    class Args(EvalArgs):
        name: str = "babilong"
        tasks: list = field(default_factory=lambda: list(TASKS))
        samples: int = 100  # per task and length (the released babilong-1k-samples: 1000; babilong: 100)
        max_new_tokens: int = 15  # scripts/run_model_on_babilong.py
        use_instruction: bool = False  # the original's flags (off by default and for base models)
        use_examples: bool = False
        use_post_prompt: bool = False
        facts: dict = field(default_factory=dict)  # {task: [min, max]} facts per story; {} = DEFAULT_FACTS
        min_sentence_tokens: int = 10  # SentenceSampler min_sentence_len
        seed: int = 0  # added to the run seed
        data_dir: str = ""  # released BABILong files ({split}/{task}-*.parquet ...); "" = generate
        release_splits: dict = field(default_factory=dict)  # {length: split name}; default "{L // 1024}k"
        reuse_prefix: bool = True

    def __init__(self, args):
        bad = [t for t in args.tasks if t not in TASKS]
        if bad:
            raise ConfigError(f"babilong: unknown tasks {bad}; known: {TASKS}")
        for t, r in (args.facts or {}).items():
            if t not in TASKS or not (isinstance(r, (list, tuple)) and len(r) == 2 and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in r) and 1 <= r[0] <= r[1]):
                raise ConfigError(f"babilong.facts.{t}: must be [min, max] with 1 <= min <= max for a task in "
                                  f"{TASKS}, got {r!r}")
        for k, v in (args.release_splits or {}).items():
            if not str(k).isdigit() or not isinstance(v, str) or not v:
                raise ConfigError(f"babilong.release_splits: {k!r}: {v!r} must map a length in tokens to a split "
                                  f"name such as \"4k\"")
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, samples=a.samples, max_new_tokens=a.max_new_tokens)
        check_nonneg(where, min_sentence_tokens=a.min_sentence_tokens)

    def check_data(self, where: str) -> None:
        d = self.args.data_dir
        if d and not Path(d).is_dir():
            raise ConfigError(f"{where}.data_dir: {d} is not a directory (released BABILong files; \"\" = generate)")

    def split_name(self, L: int) -> str:
        rs = {int(k): v for k, v in (self.args.release_splits or {}).items()}
        return rs.get(int(L), f"{int(L) // 1024}k")

    def generator(self, tokenizer, seed: int = 0) -> BabilongGenerator:
        a = self.args
        return BabilongGenerator(tokenizer, a.seed + seed, a.facts, a.use_instruction, a.use_examples,
                                 a.use_post_prompt, a.min_sentence_tokens)

    def samples(self, tokenizer, task: str, L: int, seed: int = 0) -> list[dict]:
        """The prompts of one task at one length (generated, or read from the released files). Raises DoesNotFit."""
        a = self.args
        if a.data_dir:
            split = self.split_name(L)
            files = release_files(a.data_dir, split, task)
            if not files:
                raise DoesNotFit(f"no released file for {task} at split {split} under {a.data_dir}")
            out = []
            for i, r in enumerate(read_release(files, a.samples)):
                prompt = format_prompt(r["input"], r["question"], task, a.use_instruction, a.use_examples,
                                       a.use_post_prompt)
                out.append({"index": i, "task": task, "question": r["question"], "target": r["target"],
                            "prompt": prompt, "prompt_tokens": len(tokenizer(prompt).input_ids), "split": split})
            return out
        gen = self.generator(tokenizer, seed)
        return [gen.sample(task, L, i, a.max_new_tokens) for i in range(a.samples)]

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        lengths, skipped_lengths = split_lengths(a.lengths, handle, method)
        tok, model = handle.tokenizer, handle.model
        runner = PrefixCache(model, ctx.autocast, enabled=a.reuse_prefix)
        stops = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
        acc: dict = {t: {} for t in a.tasks}
        per_sample: dict = {t: {} for t in a.tasks}
        task_ci: dict = {t: {} for t in a.tasks}
        average, ci, average_over, skipped = {}, {}, {}, {}
        reused = encoded = 0  # summed over the ranks' prompts (a rank's first prompt is encoded whole)
        for L in lengths:
            for task in a.tasks:
                try:
                    samples = self.samples(tok, task, L, ctx.seed)
                except DoesNotFit as e:
                    skipped.setdefault(str(L), {})[task] = str(e)
                    continue
                ids = [tok(s["prompt"]).input_ids for s in samples]
                recs: list = [None] * len(samples)

                def one(i: int, ids=ids):
                    r0, e0 = runner.tokens_reused, runner.tokens_encoded
                    out = runner.generate(ids[i], a.max_new_tokens, stop_ids=stops)
                    return (tok.decode(out, skip_special_tokens=True).strip(), runner.tokens_reused - r0,
                            runner.tokens_encoded - e0)

                order = reuse_order(ids) if a.reuse_prefix else list(range(len(samples)))
                for i, (pred, n_reused, n_encoded) in zip(order, ctx.map(one, order)):
                    s = samples[i]
                    reused, encoded = reused + n_reused, encoded + n_encoded
                    ok = compare_answers(s["target"], pred, s["question"], TASK_LABELS[task])
                    recs[i] = {"task": task, "length": L, "index": s["index"], "prompt_tokens": len(ids[i]),
                               "question": s["question"], "target": s["target"], "pred": pred,
                               "correct": int(ok), "score": 100.0 * ok}
                    if "depths" in s:
                        recs[i]["depths"] = s["depths"]
                write_jsonl(ctx.samples_path("babilong"), recs)
                k = sum(r["correct"] for r in recs)
                acc[task][str(L)] = round(100.0 * k / len(recs), 2)
                per_sample[task][str(L)] = [r["correct"] for r in recs]  # sample order: paired across methods
                lo, hi = wilson(k, len(recs))
                task_ci[task][str(L)] = [round(100 * lo, 2), round(100 * hi, 2)]
            ran = [t for t in a.tasks if str(L) in acc[t]]
            average_over[str(L)] = ran
            average[str(L)] = round(sum(acc[t][str(L)] for t in ran) / len(ran), 2) if ran else None
            est = bounded_interval([per_sample[t][str(L)] for t in ran]) if ran else None
            ci[str(L)] = [round(100 * est[1], 2), round(100 * est[2], 2)] if est else None
        flags = (a.use_instruction, a.use_examples, a.use_post_prompt)
        return {"average": average, "ci": ci, "tasks": acc, "task_ci": task_ci, "per_sample": per_sample,
                "average_over": average_over, "skipped": {**skipped_lengths, **skipped},
                "samples_per_task": a.samples, "data": a.data_dir or "generated",
                "prompt": "_".join(f"{k}_{'yes' if f else 'no'}" for k, f in
                                   zip(("instruction", "examples", "post_prompt"), flags)),
                "tokens_reused": reused, "tokens_encoded": encoded}
