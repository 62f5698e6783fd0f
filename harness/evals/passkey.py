"""passkey: passkey retrieval (Mohtashami & Jaggi 2023; ``epfml/landmark-attention llama/run_test.py``).

The prompt is byte-identical to the original: ``"\\n".join([task, garbage_prefix, info_line, garbage_suffix,
question])`` with character-level garbage slices (which may cut mid-word) and ``pass_key = randint(1, 50000)``.
Length control follows YaRN's ``eval/passkey.py`` (grow the garbage in 128-character steps up to the target token
count), here computed by bisection on the number of 128-char steps so that prompt + generation budget <= L. The
needle's character offset is ``randint(0, n_garbage)`` as in the original. Scoring: the first integer in the
greedy continuation equals the pass key (original: ``max_new_tokens=10``; here 8 by default, enough for 5 digits
plus a space on every tokenizer used). ``template: gate`` swaps the four strings for the convergence gate's
held-out variant (``harness.evals.templates``; same structure, other words), which no suite uses.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

from harness.config import ConfigError
from harness.evals import EVALS, EvalArgs, Spec, check_positive, lengths_within, split_lengths, write_jsonl
from harness.evals.common import PrefixCache, greedy_generate, reuse_order
from harness.evals.templates import PASSKEY_TEMPLATES
from harness.stats import wilson

STEP = 128  # characters of garbage added per step (YaRN eval/passkey.py)


def passkey_prompt(n_garbage: int, n_prefix: int, pass_key: int, template: str = "original") -> str:
    """The prompt of ``template`` (``harness.evals.templates.PASSKEY_TEMPLATES``: ``original``, the suites';
    ``gate``, the convergence gate's held-out variant) with ``n_garbage`` filler characters, the needle after
    ``n_prefix`` of them."""
    task, garbage, info, question = PASSKEY_TEMPLATES[template]
    garbage_inf = " ".join([garbage] * (n_garbage // len(garbage) + 2))
    prefix = garbage_inf[:n_prefix]
    suffix = garbage_inf[: n_garbage - n_prefix]
    return "\n".join([task, prefix, info.format(pass_key=pass_key), suffix, question])


def garbage_steps(n_tok, budget: int, pass_key: int, template: str, guess: int | None = None) -> int:
    """The most 128-character garbage steps k whose prompt (needle in the middle) fits ``budget`` tokens: the
    largest k with ``n_tok(prompt(k)) <= budget < n_tok(prompt(k + 1))``, by doubling then bisection. ``guess``
    (the previous prompt's k at this length: the count moves with the pass key's digits by a token at most, a step
    adds tens) is checked first with two tokenisations, so a length's prompts search once, not about 20 times each
    at 16k tokens; the bisection runs only where the guess does not hold, and gives the same k."""
    fits = lambda k: n_tok(passkey_prompt(k * STEP, k * STEP // 2, pass_key, template)) <= budget  # noqa: E731
    if guess is not None and guess > 0 and fits(guess) and not fits(guess + 1):
        return guess
    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def make_sample(tokenizer, length: int, rng: random.Random, gen_tokens: int, template: str = "original",
                guess: int | None = None) -> dict:
    """A prompt whose token count (BOS included) is at most ``length - gen_tokens``, as long as possible
    (``guess``: :func:`garbage_steps`'s starting point, the previous prompt's steps; the record's ``steps``)."""
    budget = length - gen_tokens
    n_tok = lambda s: len(tokenizer(s).input_ids)  # noqa: E731
    pass_key = rng.randint(1, 50000)
    lo = garbage_steps(n_tok, budget, pass_key, template, guess)
    n_garbage = lo * STEP
    n_prefix = rng.randint(0, n_garbage)
    prompt = passkey_prompt(n_garbage, n_prefix, pass_key, template)
    while n_garbage > 0 and n_tok(prompt) > budget:  # the random split can change the count by a token or two
        n_garbage -= STEP
        n_prefix = min(n_prefix, n_garbage)
        prompt = passkey_prompt(n_garbage, n_prefix, pass_key, template)
    if n_tok(prompt) > budget:
        raise ValueError(f"passkey: length {length} is too short for the template itself")
    depth = n_prefix / n_garbage if n_garbage else 0.0
    return {"prompt": prompt, "pass_key": pass_key, "depth": depth, "n_garbage": n_garbage, "steps": lo}


def score(continuation: str, pass_key: int) -> bool:
    m = re.search(r"\d+", continuation)
    return bool(m) and int(m.group()) == pass_key


def passkey_samples(tokenizer, length: int, n_samples: int, seed: int, gen_tokens: int = 8,
                    template: str = "original") -> list[dict]:
    """The ``n_samples`` prompts of one length, drawn in order from the generator of (seed, length): the same
    prompts for every method, and what ``run_passkey`` decodes."""
    rng = random.Random(f"passkey-{seed}-{length}")
    out: list[dict] = []
    for _ in range(n_samples):
        out.append(make_sample(tokenizer, length, rng, gen_tokens, template, out[-1]["steps"] if out else None))
    return out


def run_passkey(model, tokenizer, length: int, n_samples: int, seed: int, gen_tokens: int = 8,
                dtype: str = "auto", reuse_prefix: bool = True, ctx=None, template: str = "original") -> list[dict]:
    """Consecutive prompts share the task line and the garbage up to the earlier needle: with ``reuse_prefix`` the
    prompts are decoded in lexicographic order of their token ids (``reuse_order``: neighbours share the longest
    heads) and that head is not re-encoded (``PrefixCache``; same greedy tokens as ``greedy_generate``). The prompts
    themselves, drawn in order from the seeded generator (every rank draws them all), and the records (in prompt
    order) do not depend on it. ``ctx.map`` spreads the decoding over the ranks of a data-parallel evaluation."""
    runner = PrefixCache(model, dtype) if reuse_prefix else None
    samples = passkey_samples(tokenizer, length, n_samples, seed, gen_tokens, template)
    ids = [tokenizer(s["prompt"]).input_ids for s in samples]

    def one(i: int) -> dict:
        s = samples[i]
        r0, e0 = (runner.tokens_reused, runner.tokens_encoded) if runner else (0, 0)
        new = runner.generate(ids[i], gen_tokens) if runner else \
            greedy_generate(model, torch.tensor([ids[i]]), gen_tokens, dtype=dtype)
        text = tokenizer.decode(new, skip_special_tokens=True)
        reused, encoded = (runner.tokens_reused - r0, runner.tokens_encoded - e0) if runner else (0, len(ids[i]))
        return {"length": length, "i": i, "pass_key": s["pass_key"], "depth": round(s["depth"], 4),
                "prompt_tokens": len(ids[i]), "prediction": text, "correct": score(text, s["pass_key"]),
                "tokens_reused": reused, "tokens_encoded": encoded}

    order = reuse_order(ids) if reuse_prefix else list(range(n_samples))
    records: list = [None] * n_samples
    for i, rec in zip(order, ctx.map(one, order) if ctx is not None else map(one, order)):
        records[i] = rec
    return records


def reuse_of(records: list[dict]) -> tuple[int, int]:
    """(prompt tokens not encoded again, prompt tokens encoded) over a length's records: what prefix reuse saved
    (summed over the ranks' prompts; a rank's first prompt is encoded whole), as NIAH and RULER report it."""
    return sum(r.get("tokens_reused", 0) for r in records), sum(r.get("tokens_encoded", 0) for r in records)


def passkey_accuracy(model, tokenizer, length: int, n_samples: int = 50, seed: int = 0) -> float:
    recs = run_passkey(model, tokenizer, length, n_samples, seed)
    return sum(r["correct"] for r in recs) / len(recs)


@EVALS.register("passkey")
class Passkey:
    spec = Spec(
        metric="accuracy",  # the headline metric (harness.evals: what an evaluator declares)
        reader="proportion",  # the tables read a length's accuracy as a proportion over prompts (Wilson)
        records={"length": "length", "score": ("correct", "score")},  # samples/passkey.jsonl fields
        floor={"threshold": 0.5, "chance": 0.0, "ceiling": 1.0},  # the tables' floor rule, accuracy 0..1
        by_length=True,  # prompts seeded per length: one shard per length is exact
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map

    def count_prompts(self, lengths, limit):
        """{length: prompts} and its basis."""
        return {L: self.args.samples for L in lengths_within(self.args.lengths, lengths, limit)}, "prompts x lengths"

    @dataclass
    class Args(EvalArgs):
        name: str = "passkey"
        samples: int = 20  # prompts per length (original: 50; YaRN: 20)
        gen_tokens: int = 8
        depth_bins: int = 5
        reuse_prefix: bool = True  # reuse the KV cache of the prompts' common head
        template: str = "original"  # original (the suites') | gate (the convergence gate's own; no suite uses it)

    def __init__(self, args):
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, samples=a.samples, gen_tokens=a.gen_tokens, depth_bins=a.depth_bins)
        if a.template not in PASSKEY_TEMPLATES:
            raise ConfigError(f"{where}.template: unknown passkey template {a.template!r} (valid: "
                              f"{', '.join(PASSKEY_TEMPLATES)})")

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        lengths, skipped = split_lengths(a.lengths, handle, method)
        acc, by_depth, correct, depth, ci = {}, {}, {}, {}, {}
        reused = encoded = 0
        for L in lengths:
            recs = run_passkey(handle.model, handle.tokenizer, L, a.samples, ctx.seed, a.gen_tokens, ctx.autocast,
                               a.reuse_prefix, ctx, a.template)
            r, e = reuse_of(recs)
            reused, encoded = reused + r, encoded + e
            recs = [{k: v for k, v in x.items() if k not in ("tokens_reused", "tokens_encoded")} for x in recs]
            write_jsonl(ctx.samples_path("passkey"), recs)
            k = sum(r["correct"] for r in recs)
            acc[str(L)] = k / len(recs)
            ci[str(L)] = [round(x, 4) for x in wilson(k, len(recs))]
            correct[str(L)] = [int(r["correct"]) for r in recs]  # per prompt, in prompt order (same prompts for
            depth[str(L)] = [r["depth"] for r in recs]           # every method: paired comparisons)
            bins = [[] for _ in range(a.depth_bins)]
            for r in recs:
                bins[min(int(r["depth"] * a.depth_bins), a.depth_bins - 1)].append(r["correct"])
            by_depth[str(L)] = [round(sum(b) / len(b), 4) if b else None for b in bins]
        return {"accuracy": acc, "ci": ci, "accuracy_by_depth": by_depth, "samples_per_length": a.samples,
                "correct": correct, "depth": depth, "skipped": skipped, "tokens_reused": reused,
                "tokens_encoded": encoded}
