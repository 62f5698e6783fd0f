"""manyshot_trec: many-shot in-context classification on TREC, the controlled study's "ManyShots TREC" (Figure 2;
``Leooyii/LCEG longbench/pred.py`` + ``longbench/eval_trec.py``, data ``Leooyii/manyshots_trec``).

Format (LongBench TREC): 50 fine-grained classes with LongBench's descriptive names (``LONGBENCH_TREC_CLASSES``,
typo "Lasting time of somethin" included); each demonstration is ``"Question: {q}\\nType: {label}"``, demonstrations
joined by ``"\\n"`` form ``context``; ``input`` is ``"Question: {q}\\nType:"``; the prompt is LongBench's TREC
template (``PROMPTS["trec"]``: "Please determine the type of the question below. Here are some examples of
questions.\\n\\n{context}\\n{input}").
Greedy decoding (LCEG: ``max_gen=64``, no chat template), first line of the prediction, LongBench
``classification_score`` (substring match over the 50 classes, 1/len(matches), with its list-removal quirk);
accuracy per shot count = ``round(100 * mean, 2)``. This is not Bertsch et al.'s constrained decoding.

Data: ``data_dir`` with LCEG's ``trec_{n}shots.jsonl`` files (LongBench format, read as is), or (default) a
question bank ``{"question", "label", "split"}`` from which the LongBench-format records are built here: for shot
count n and test item i, the n demonstrations are drawn from the ``train`` split with
``random.Random(f"manyshot_trec-{seed}-{n}-{i}").sample`` (with replacement only when n exceeds the bank). The
shipped bank (``harness/assets/fixtures/trec/questions.jsonl``) was written for this project: 350 TREC-style
questions, 7 per class, one per class held out as the test split.

Length control: the evaluated length L (``max_length``, default the largest of ``lengths``) bounds the prompt,
BOS included. With ``over_length: skip`` (default) a shot count whose longest prompt exceeds L is reported under
``skipped`` with the reason; ``over_length: truncate`` middle-truncates to L instead, as LCEG's pred.py does at
its model2maxlen (32768 for the extended models).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.config import ConfigError
from harness.evals import EVALS, EvalArgs, Spec, check_nonneg, check_positive, lengths_within, write_jsonl
from harness.evals.common import greedy_generate
from harness.evals.longbench import middle_truncate
from harness.evals.longbench_metrics import PROMPTS, sample_score

BANK = Path(__file__).resolve().parents[1] / "assets" / "fixtures" / "trec" / "questions.jsonl"
SHOTS = [1, 5, 10, 25, 50, 75, 100, 200, 300, 400, 500, 625, 750, 875, 1000]
ASSUMED_ITEMS, ASSUMED_TOKENS_PER_SHOT = 500, 20  # ASSUMPTION (the plan): TREC test items; tokens per demonstration
LONGBENCH_TREC_CLASSES = [
    "Food", "Date", "Order, rank", "Speed", "Disease and medicine", "Word with a special property", "Abbreviation",
    "Language", "Letter like a-z", "Other entity", "Animal", "Expression abbreviated", "Price",
    "Techniques and method", "Musical instrument", "Mountain", "Currency name", "Event", "Product", "State",
    "Individual", "Organ of body", "Reason", "Manner of an action", "City", "Religion",
    "Invention, book and other creative piece", "Distance, linear measure", "Temperature", "Postcode or other code",
    "Size, area and volume", "Sport", "Country", "Other location", "Lasting time of somethin", "Equivalent term",
    "Description of something", "Weight", "Vehicle", "Color", "Other number", "Definition of something",
    "Element and substance", "Description of a person", "Symbols and sign", "Number of something", "Plant",
    "Percent, fraction", "Group or organization of person", "Title of a person",
]
FIRST_LINE = {"trec"}


def demo(q: str, label: str) -> str:
    return f"Question: {q}\nType: {label}"


def load_bank(path: str | Path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    bad = sorted({r["label"] for r in rows} - set(LONGBENCH_TREC_CLASSES))
    if bad:
        raise ConfigError(f"manyshot_trec: labels outside the 50 LongBench TREC classes: {bad}")
    return [r for r in rows if r.get("split") == "train"], [r for r in rows if r.get("split") == "test"]


def build_records(train: list[dict], test: list[dict], n: int, seed: int) -> list[dict]:
    """LongBench-format records (context/input/answers/all_classes/length) for n shots, seeded per (n, item)."""
    out = []
    for i, t in enumerate(test):
        rng = random.Random(f"manyshot_trec-{seed}-{n}-{i}")
        demos = rng.sample(train, n) if n <= len(train) else [rng.choice(train) for _ in range(n)]
        ctx = "\n".join(demo(d["question"], d["label"]) for d in demos)
        out.append({"input": f"Question: {t['question']}\nType:", "context": ctx, "answers": [t["label"]],
                    "all_classes": LONGBENCH_TREC_CLASSES, "length": len(ctx.split()), "dataset": "trec",
                    "language": "en", "_id": f"{n}-{i}"})
    return out


def load_lceg(data_dir: str | Path, n: int) -> list[dict] | None:
    p = Path(data_dir) / f"trec_{n}shots.jsonl"
    if not p.exists():
        return None
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_records(path: str | Path) -> list[dict]:
    p = Path(path)
    if p.is_dir():
        p = p / "samples" / "manyshot_trec.jsonl"
    return [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()] if p.exists() else []


@EVALS.register("manyshot_trec")
class ManyShotTrec:
    spec = Spec(
        metric="accuracy",  # the headline metric (harness.evals: what an evaluator declares)
        records={"length": "shots", "score": ("correct", "score")},  # samples/manyshot_trec.jsonl: per shot count
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # items generated through ctx.map (per shot count)

    def count_prompts(self, lengths, limit):
        """{prompt length: items}: each shot count's prompt of ``shots x ASSUMED_TOKENS_PER_SHOT`` tokens (at most
        the budget)."""
        a = self.args
        budget = int(a.max_length or max(lengths_within(a.lengths, lengths, limit) or [0]))
        items = a.samples or ASSUMED_ITEMS
        out: dict = {}
        for k in a.shots:
            L = min(budget, int(k) * ASSUMED_TOKENS_PER_SHOT)
            out[L] = out.get(L, 0) + items
        return out, f"ASSUMPTION {items} test items x shots x {ASSUMED_TOKENS_PER_SHOT} tokens per shot (<= budget)"

    @dataclass
    class Args(EvalArgs):
        name: str = "manyshot_trec"
        shots: list = field(default_factory=lambda: list(SHOTS))
        data_dir: str = ""  # directory of LCEG trec_{n}shots.jsonl; "" = build from ``bank``
        bank: str = ""  # question bank JSONL {"question","label","split"}; "" = the shipped fixture
        samples: int = 0  # test items per shot count (0 = all)
        max_length: int = 0  # evaluated length L (prompt budget); 0 = the largest of ``lengths``
        max_gen: int = 64  # LCEG/LongBench dataset2maxlen["trec"]
        over_length: str = "skip"  # skip | truncate (LCEG middle-truncates at model2maxlen)
        resume: bool = False
        resume_from: str = ""  # JSONL or run dir with earlier predictions; "" = this run's samples file

    def __init__(self, args):
        if args.over_length not in ("skip", "truncate"):
            raise ConfigError("manyshot_trec: over_length must be skip or truncate")
        if any(int(n) <= 0 for n in args.shots):
            raise ConfigError("manyshot_trec: shot counts must be positive")
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_nonneg(where, samples=a.samples, max_length=a.max_length)
        check_positive(where, max_gen=a.max_gen)
        if self.max_length() <= 0:
            raise ConfigError(f"{where}: set max_length (tokens) or lengths")

    def max_length(self) -> int:
        return int(self.args.max_length or max([int(x) for x in self.args.lengths] or [0]))

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        tok, model = handle.tokenizer, handle.model
        L = int(a.max_length or max([int(x) for x in a.lengths] or [0]))
        if L <= 0:
            raise ConfigError("manyshot_trec: set max_length or lengths")
        lim = method.max_length(handle) if method is not None else None
        out_path = ctx.samples_path("manyshot_trec")
        done = {}
        if a.resume:
            for r in read_records(a.resume_from or out_path):
                done[(r["shots"], str(r["_id"]), r["max_length"], r["max_gen"])] = r
        train = test = None
        acc, skipped, n_items, gen_time, generated = {}, {}, {}, 0.0, 0
        for n in [int(x) for x in a.shots]:
            if lim is not None and L > lim:
                skipped[str(n)] = f"method {method.name} supports at most {lim} tokens"
                continue
            recs = load_lceg(a.data_dir, n) if a.data_dir else None
            if recs is None:
                if a.data_dir:
                    raise ConfigError(f"manyshot_trec: {a.data_dir}/trec_{n}shots.jsonl not found")
                if train is None:
                    train, test = load_bank(a.bank or BANK)
                recs = build_records(train, test, n, ctx.seed)
            if a.samples > 0:
                recs = recs[: a.samples]
            prompts = [tok(PROMPTS["trec"].format(**r)).input_ids for r in recs]
            longest = max(len(p) for p in prompts)
            if longest > L and a.over_length == "skip":
                skipped[str(n)] = f"prompt of {longest} tokens exceeds the evaluated length {L}"
                continue
            scores = []
            items = [(i, r, ids, done.get((n, str(r.get("_id", i)), L, a.max_gen)))
                     for i, (r, ids) in enumerate(zip(recs, prompts))]

            def one(item, n=n):
                i, r, ids, _ = item
                ids = middle_truncate(ids, L)
                t0 = time.time()
                new = greedy_generate(model, torch.tensor([ids]), a.max_gen, eos_token_id=tok.eos_token_id,
                                      dtype=ctx.autocast)
                seconds = time.time() - t0
                pred = tok.decode(new, skip_special_tokens=True)
                s = sample_score("trec", pred, r["answers"], r["all_classes"], FIRST_LINE)
                rec = {"shots": n, "_id": str(r.get("_id", i)), "max_length": L, "max_gen": a.max_gen,
                       "pred": pred, "answers": r["answers"], "prompt_tokens": len(ids), "score": s}
                if ctx.world_size == 1:
                    write_jsonl(out_path, [rec])  # as soon as it exists: a killed run resumes from here
                return rec, seconds

            fresh = iter(ctx.map(one, [it for it in items if it[3] is None]))
            for _, _, _, prev in items:
                if prev is None:
                    prev, seconds = next(fresh)
                    gen_time += seconds
                    generated += 1
                    if ctx.world_size > 1:
                        write_jsonl(out_path, [prev])  # the main rank writes every rank's records, in item order
                elif a.resume_from and Path(a.resume_from) != out_path:
                    write_jsonl(out_path, [prev])
                scores.append(prev["score"])
            acc[str(n)] = round(100 * sum(scores) / len(scores), 2)
            n_items[str(n)] = len(scores)
        return {"accuracy": acc, "skipped": skipped, "n": n_items, "max_length": L,
                "data": a.data_dir or "fixtures", "generated": generated,
                "samples_per_s": round(generated / gen_time, 3) if gen_time > 0 else None}
