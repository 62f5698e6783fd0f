"""helmet_recall: HELMET's synthetic recall category (Yen et al. 2024, ``princeton-nlp/HELMET``,
``configs/recall.yaml``): ``json_kv``, ``ruler_niah_mk_2``, ``ruler_niah_mk_3``, ``ruler_niah_mv``; the category score
is their mean.

``json_kv`` (``data.py`` ``load_json_kv``; prompt from ``nelson-liu/lost-in-the-middle`` ``kv_retrieval.prompt``):
``"JSON data:\n"`` + a JSON object of ``k`` UUID keys -> UUID values; prompt ``"{context}\\n\\nExtract the value
corresponding to the specified key in the JSON object below.\\n\\n{demos}Key: {question}" + "\\n" +
"Corresponding value:"`` with ``shots: 2`` demos ``"Key: {key}\\nCorresponding value: {value}"`` joined by blank
lines; ``generation_max_length: 100``. Score: ``substring_exact_match`` (``utils.py``: SQuAD ``normalize_answer`` of
the gold value is a substring of
the normalised prediction), the max of the raw prediction's and of ``parse_output(prediction, "corresponding
value:")``'s. ``k`` is the largest number of pairs whose prompt fits L (the released files fix it per length and
tokenizer: ``test_k50_dep6`` = 4k for LLaMA-2 ... ``test_k1800_dep6`` = 128k).

``ruler_niah_mk_2`` / ``ruler_niah_mk_3`` / ``ruler_niah_mv`` (``data.py`` ``load_ruler``): RULER's niah_multikey_2
(a haystack of distractor needles, word keys, number values), niah_multikey_3 (the same with UUID keys and values)
and niah_multivalue (essay haystack, 4 values for one key), generated here by RULER's own generator
(``harness.evals.ruler_data``, the ``ruler`` evaluator's), with HELMET's template: RULER's, singular when one value
is asked for, and the answer prefix on its own line (``user_template + "\\n" + system_template``) instead of after a
space. Generation 50 / 100 / 50 tokens. Score: ``ruler_recall`` = the fraction of the gold values contained in the
lower-cased raw prediction (no post-processing).

No chat template (``use_chat_template: false`` in ``configs/recall.yaml``). Length: prompt + generation budget <= L
tokens (BOS included); HELMET's files are generated for an input budget with the LLaMA-2 / LLaMA-3 tokenizers.

Differences: the JSON-kv samples come from our seeded generator (UUIDs from ``random.Random``, ``uuid4`` layout) rather
than the released ``data/json_kv/*.jsonl`` (fields ``context, demos, question, answer, depth, num_kvs``). The
``context`` is lost-in-the-middle's ``"JSON data:\n"`` + the object formatted as there (``{"k1": "v1",\n "k2":
"v2", ...}``; loaders of the released files parse ``context.split("\n", 1)[1]`` as JSON), the key in the question
and in the demos is in double quotes as in lost-in-the-middle's ``Key: "{key}"``, and the two demos are UUID pairs of
their own (not in the object): the released strings were not available offline to confirm the quotes and the
demos. The gold pair's position is drawn uniformly (seeded) and recorded as ``depth`` (the released files' ``dep6``).
The RULER subsets differ from RULER exactly as the ``ruler`` evaluator's generator does (word lists, sentence
splitter, haystack: its docstring).

Scores are 0..100 per task and length; ``average`` is the mean over the tasks that ran at that length (HELMET's
"Recall"), ``average_over`` names them. The row keeps every sample's score in sample order (``per_sample``), a 95%
interval per task and length (``task_ci``: Wilson, or Wilson on the summed graded scores for mv) and per length for
the average (``ci``, ``harness.stats.bounded_interval`` over the tasks as strata).
"""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

from harness.config import ConfigError
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
from harness.evals.helmet import normalize_answer, parse_output
from harness.evals.ruler_data import DoesNotFit, RulerGenerator, largest_fitting
from harness.evals.templates import (
    HELMET_JSON_KV_DEMO,
    HELMET_JSON_KV_SYSTEM,
    HELMET_JSON_KV_USER,
    HELMET_PROMPT_JOIN,
    JSON_KV_CONTEXT,
)
from harness.stats import bounded_interval

TASKS = ["json_kv", "ruler_niah_mk_2", "ruler_niah_mk_3", "ruler_niah_mv"]
RULER_TASK = {"ruler_niah_mk_2": "niah_multikey_2", "ruler_niah_mk_3": "niah_multikey_3",
              "ruler_niah_mv": "niah_multivalue"}
GEN_TOKENS = {"json_kv": 100, "ruler_niah_mk_2": 50, "ruler_niah_mk_3": 100, "ruler_niah_mv": 50}  # recall.yaml


# --- metrics (HELMET utils.py / data.py) ----------------------------------------------------------------------------
def substring_exact_match(prediction: str, answers) -> bool:
    answers = [answers] if isinstance(answers, str) else answers
    return max(normalize_answer(a) in normalize_answer(prediction) for a in answers)


def json_kv_score(prediction: str, answer: str) -> float:
    """load_json_kv post_process: substring EM of the raw prediction, or of the parsed one (the max)."""
    raw = substring_exact_match(prediction, answer)
    parsed = parse_output(prediction, "corresponding value:")
    return float(max(raw, substring_exact_match(parsed, answer) if parsed is not None else False))


def ruler_recall(prediction: str, answers: list[str]) -> float:
    """load_ruler post_process: the fraction of the gold values contained in the lower-cased prediction."""
    return sum(a.lower() in prediction.lower() for a in answers) / len(answers)


# --- json_kv generator ------------------------------------------------------------------------------------------------
def format_kv_records(pairs: list[tuple[str, str]]) -> str:
    """lost-in-the-middle get_kv_retrieval_prompt: '{"k1": "v1",\\n "k2": "v2",\\n ... "kn": "vn"}'."""
    out = ""
    for i, (k, v) in enumerate(pairs):
        out += ("{" if i == 0 else " ") + f'"{k}": "{v}"' + (",\n" if i != len(pairs) - 1 else "}")
    return out


def json_kv_prompt(pairs, gold: int, demos: list[tuple[str, str]]) -> str:
    demo_text = "\n\n".join(HELMET_JSON_KV_DEMO.format(key=f'"{k}"', value=" " + v) for k, v in demos)
    demo_text += "\n\n" if demos else ""
    user = HELMET_JSON_KV_USER.format(context=JSON_KV_CONTEXT + format_kv_records(pairs), demos=demo_text,
                                      question=f'"{pairs[gold][0]}"')
    return user + "\n" + HELMET_JSON_KV_SYSTEM


class JsonKV:
    def __init__(self, tokenizer, seed: int = 0, shots: int = 2):
        self.tok, self.seed, self.shots = tokenizer, seed, shots

    def count(self, text: str) -> int:
        return len(self.tok(text).input_ids)

    def build(self, L: int, index: int, k: int) -> dict:
        rng = random.Random(f"helmet-json_kv-{self.seed}-{L}-{index}")
        u = lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4))  # noqa: E731
        demos = [(u(), u()) for _ in range(self.shots)]  # pairs of their own, not in the object
        pairs = [(u(), u()) for _ in range(k)]
        gold = rng.randrange(k)
        return {"prompt": json_kv_prompt(pairs, gold, demos), "answer": pairs[gold][1], "k": k,
                "depth": round(gold / max(k - 1, 1), 4)}

    def samples(self, L: int, n: int, gen_tokens: int) -> list[dict]:
        budget = L - gen_tokens
        m = largest_fitting(lambda k: self.count(self.build(L, 0, k)["prompt"]), budget)
        if m == 0:
            raise DoesNotFit(f"json_kv: one key-value pair does not fit in {L} tokens with {gen_tokens} to generate")
        out = []
        for i in range(n):
            k = m
            while k > 0:
                s = self.build(L, i, k)
                s["prompt_tokens"] = self.count(s["prompt"])
                if s["prompt_tokens"] <= budget:
                    break
                k -= 1
            if k == 0:
                raise DoesNotFit(f"json_kv does not fit in {L} tokens")
            out.append(dict(s, index=i))
        return out


@EVALS.register("helmet_recall")
class HelmetRecall:
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ruler",  # RULER's output shape: a length's mean over tasks with its interval (0..100)
        records={"length": "length", "task": "task", "score": ("score",)},  # samples/helmet_recall.jsonl fields
        floor={"threshold": 50, "chance": 0.0, "ceiling": 100},  # the tables' floor rule, 0..100
        extended="HELMET recall",  # its column in the 2024-benchmarks table
        extended_note="mean of json_kv and RULER MK-2/MK-3/MV",  # its line in that table's notes
        generates=True)  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)

    def count_prompts(self, lengths, limit):
        return tasks_x_samples(self.args, lengths, limit)

    @dataclass
    class Args(EvalArgs):
        name: str = "helmet_recall"
        tasks: list = field(default_factory=lambda: list(TASKS))
        samples: int = 100  # per task and length (configs/recall.yaml max_test_samples: 100)
        shots: int = 2  # json_kv demos (recall.yaml shots: 2)
        generation_max_length: dict = field(default_factory=dict)  # {task: tokens}; {} = recall.yaml's 100/50/100/50
        max_new_tokens: int = 0  # > 0 caps decoding (CPU budget); the length budget still reserves the above
        seed: int = 42  # added to the run seed (HELMET / RULER seed 42)
        essay_dir: str = ""  # RULER essay haystack for ruler_niah_mv; "" = the Shakespeare test split
        small_threshold: int = 4096  # RULER's small/large switch (niah multikey_2/3: +5 or +25 lines per step)
        essay_increment: int = 500  # RULER's essay length-search step (words)
        reuse_prefix: bool = True

    def __init__(self, args):
        bad = [t for t in args.tasks if t not in TASKS]
        if bad:
            raise ConfigError(f"helmet_recall: unknown tasks {bad}; known: {TASKS}")
        bad = [t for t in args.generation_max_length if t not in TASKS]
        if bad:
            raise ConfigError(f"helmet_recall.generation_max_length: unknown tasks {bad}; known: {TASKS}")
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, samples=a.samples, essay_increment=a.essay_increment)
        check_nonneg(where, shots=a.shots, max_new_tokens=a.max_new_tokens, small_threshold=a.small_threshold)
        for t, v in a.generation_max_length.items():
            check_positive(f"{where}.generation_max_length", **{t: v})

    def gen_tokens(self, task: str) -> int:
        return int(self.args.generation_max_length.get(task, GEN_TOKENS[task]))

    def gen_tokens_per_prompt(self) -> tuple[float, str]:
        """The plan's decode budget per prompt: the mean over the tasks of ``gen_tokens``, capped by
        ``max_new_tokens``."""
        cap = int(self.args.max_new_tokens or 0)
        per = [self.gen_tokens(t) for t in self.args.tasks]
        per = [min(cap, n) if cap > 0 else n for n in per]
        return (sum(per) / len(per) if per else 0), "mean of the per-task generation_max_length"

    def ruler(self, tokenizer, seed: int = 0) -> RulerGenerator:
        a = self.args
        return RulerGenerator(tokenizer, seed=a.seed + seed, model_template="base", essay_dir=a.essay_dir,
                              tokens_to_generate={RULER_TASK[t]: self.gen_tokens(t) for t in RULER_TASK},
                              small_threshold=a.small_threshold, essay_increment=a.essay_increment,
                              answer_prefix_join=HELMET_PROMPT_JOIN)

    def samples(self, tokenizer, task: str, L: int, seed: int = 0, ruler: RulerGenerator | None = None) -> list[dict]:
        """{prompt, answers, prompt_tokens, ...} of one task at one length. Raises DoesNotFit."""
        a = self.args
        if task == "json_kv":
            return [dict(s, answers=[s["answer"]]) for s in
                    JsonKV(tokenizer, a.seed + seed, a.shots).samples(L, a.samples, self.gen_tokens(task))]
        ruler = ruler or self.ruler(tokenizer, seed)
        return [{"index": s["index"], "prompt": s["input"], "answers": s["outputs"],
                 "prompt_tokens": s["length"] - s["tokens_to_generate"]}
                for s in ruler.samples(RULER_TASK[task], L, a.samples)]

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        lengths, skipped_lengths = split_lengths(a.lengths, handle, method)
        tok, model = handle.tokenizer, handle.model
        runner = PrefixCache(model, ctx.autocast, enabled=a.reuse_prefix)
        stops = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
        ruler = self.ruler(tok, ctx.seed)
        scores: dict = {t: {} for t in a.tasks}
        per_sample: dict = {t: {} for t in a.tasks}
        task_ci: dict = {t: {} for t in a.tasks}
        average, ci, average_over, skipped = {}, {}, {}, {}
        for L in lengths:
            for task in a.tasks:
                try:
                    samples = self.samples(tok, task, L, ctx.seed, ruler)
                except DoesNotFit as e:
                    skipped.setdefault(str(L), {})[task] = str(e)
                    continue
                ids = [tok(s["prompt"]).input_ids for s in samples]
                n_new = self.gen_tokens(task) if a.max_new_tokens <= 0 else min(a.max_new_tokens,
                                                                                 self.gen_tokens(task))
                recs: list = [None] * len(samples)
                for i in (reuse_order(ids) if a.reuse_prefix else range(len(samples))):
                    s = samples[i]
                    out = runner.generate(ids[i], n_new, stop_ids=stops)
                    pred = tok.decode(out, skip_special_tokens=True)
                    sc = json_kv_score(pred, s["answers"][0]) if task == "json_kv" else \
                        ruler_recall(pred, s["answers"])
                    recs[i] = {"task": task, "length": L, "index": s["index"], "prompt_tokens": len(ids[i]),
                               "answers": s["answers"], "pred": pred, "score": round(100.0 * sc, 4)}
                    for k in ("k", "depth"):
                        if k in s:
                            recs[i][k] = s[k]
                write_jsonl(ctx.samples_path("helmet_recall"), recs)
                per_sample[task][str(L)] = [r["score"] for r in recs]  # sample order: paired across methods
                scores[task][str(L)] = round(sum(per_sample[task][str(L)]) / len(recs), 2)
                est = bounded_interval(per_sample[task][str(L)], 100.0)
                task_ci[task][str(L)] = [round(est[1], 2), round(est[2], 2)]
            ran = [t for t in a.tasks if str(L) in scores[t]]
            average_over[str(L)] = ran
            average[str(L)] = round(sum(scores[t][str(L)] for t in ran) / len(ran), 2) if ran else None
            est = bounded_interval([per_sample[t][str(L)] for t in ran], 100.0) if ran else None
            ci[str(L)] = [round(est[1], 2), round(est[2], 2)] if est else None
        return {"average": average, "ci": ci, "tasks": scores, "task_ci": task_ci, "per_sample": per_sample,
                "average_over": average_over, "skipped": {**skipped_lengths, **skipped},
                "samples_per_task": a.samples, "metric": {t: ("substring_exact_match" if t == "json_kv" else
                                                              "ruler_recall") for t in a.tasks},
                "tokens_reused": runner.tokens_reused, "tokens_encoded": runner.tokens_encoded}
