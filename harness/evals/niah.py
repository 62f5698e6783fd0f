"""niah: Needle in a Haystack (gkamradt/LLMTest_NeedleInAHaystack), as run by the controlled study
(``Leooyii/LCEG needle/needle_in_haystack.py``, = ``FranxYao/Long-Context-Data-Engineering``).

Per cell (context length L x depth d): the haystack (Paul Graham essays in glob order, concatenated and repeated
until it is at least max(L) tokens) is cut to L tokens, then ``L - buffer`` minus the needle's length; the needle
``"\\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\\n"`` goes at
the end for d = 100, else at ``int(len * d / 100)`` walked back until the preceding token is a '.' token (the
insertion lands right after a sentence end); the tokens are decoded back to text and put in LCEG's prompt for base
models ``"<|im_start|> This is a very long story book: <book> {context} </book>.\\n Based on the content of the
book, Question: {question}\\nAnswer:"``; greedy decoding of ``gen_tokens`` (original: 50) new tokens.

Grid: ``context_lengths: [min, max, n]`` gives ``np.round(np.linspace(min, max, n))`` (LCEG: 1000..128000, 40
points, only those <= the method's limit run, the others are skip entries); else the eval lengths. Depths:
``np.round(np.linspace(0, 100, depth_intervals))`` (LCEG: 10 -> 0, 11, 22, ..., 100).

Score (``scorer``): ``lceg`` (default, reported) is the score of LCEG's heatmaps (``needle/needle_plot.py``), which
the paper's figures show: ``|set(response.lower().split()) & expected| / len(expected)`` with ``expected = "eat a
sandwich and sit in Dolores Park on a sunny day.".lower().split()`` -- "a" is counted twice in the denominator and
"day." keeps its period, so a perfect answer scores 11/12 (0.9167), kept as is. ``rouge`` reports the score
FranxYao/LCEG compute at run time, ROUGE-1 F (Google ``rouge_score``, stemmer) of the needle vs the response,
divided by 10 here (0..1 instead of 0..10). Both are stored per cell in the samples file.

Differences: period tokens are the tokenizer's ids for "." and " ." (the original hard-codes LLaMA's 29889/869 and
uses ``encode('.')`` otherwise); tokens are encoded without special tokens (LLaMA's ``encode`` would insert a BOS
into the needle and the haystack); ``buffer`` (original 200 tokens: "system message, question and response") may
be ``-1`` = exactly the prompt template plus ``gen_tokens``, so that short windows keep a haystack (tiny suite).
Without a local essay directory the haystack is the Shakespeare test split (offline prose). Cells are decoded in
lexicographic order of their prompts (``reuse_order``), so each reuses the KV cache of the longest head it shares
with the previous one (the haystack up to the needle, across depths and lengths); scores do not depend on the order.
The row keeps the score per cell (``grid``: one needle per depth, the samples of a length) and a 95%
interval per length over the depths (``ci``, Wilson on the summed scores: ``harness.stats.bounded_interval``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.config import ConfigError
from harness.data.sources import load_source
from harness.evals import (
    EVALS,
    EvalArgs,
    Spec,
    check_lengths,
    check_positive,
    lengths_within,
    split_lengths,
    write_jsonl,
)
from harness.evals.common import PrefixCache, reuse_order
from harness.evals.templates import NIAH_NEEDLE, NIAH_PROMPT, NIAH_QUESTION
from harness.stats import bounded_interval

LCEG_EXPECTED = "eat a sandwich and sit in Dolores Park on a sunny day."


def lceg_score(response: str) -> float:
    """LCEG needle_plot.py: word overlap with the expected answer (max 11/12, see the module docstring)."""
    expected = LCEG_EXPECTED.lower().split()
    return len(set(response.lower().split()) & set(expected)) / len(expected)


def rouge_score(response: str, needle: str = NIAH_NEEDLE) -> float:
    """FranxYao / LCEG run-time score: ROUGE-1 F-measure x 10 (0..10)."""
    from rouge_score import rouge_scorer

    sc = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    return sc.score(needle, response)["rouge1"].fmeasure * 10


def haystack_text(haystack_dir: str = "") -> tuple[str, str]:
    """(text, source): Paul Graham essays (*.txt, glob order sorted) when the directory exists, else the
    Shakespeare test split."""
    if haystack_dir and Path(haystack_dir).is_dir():
        files = sorted(Path(haystack_dir).glob("*.txt"))
        if files:
            return "".join(f.read_text(encoding="utf-8", errors="ignore") for f in files), haystack_dir

    return "\n".join(d.text for d in load_source("shakespeare", "test")), "shakespeare_test"


_HAYSTACKS: dict = {}  # (id of the tokenizer, hash of the text) -> (the tokenizer, its ids of the text)


def haystack_ids(tokenizer, text: str) -> list[int]:
    """The haystack's token ids, tokenised once per tokenizer and text in a process (the whole Shakespeare test split
    is ~0.3 s per call: once per run's entry before, once per unit of a cut suite and per sharded length); the
    cached entry holds the tokenizer itself, so a new tokenizer at a reused address is never given another's ids."""
    key = (id(tokenizer), hash(text))
    hit = _HAYSTACKS.get(key)
    if hit is None or hit[0] is not tokenizer:
        hit = _HAYSTACKS[key] = (tokenizer, tokenizer(text, add_special_tokens=False).input_ids)
    return hit[1]


def period_ids(tokenizer) -> set[int]:
    out = set()
    for s in (".", " ."):
        ids = tokenizer(s, add_special_tokens=False).input_ids
        if len(ids) == 1:
            out.add(ids[0])
    return out


def insert_needle(context: list[int], needle: list[int], depth: float, context_length: int, buffer: int,
                  periods: set[int]) -> tuple[list[int], int]:
    """gkamradt ``insert_needle`` on token ids -> (new tokens, insertion index in the trimmed context)."""
    context_length -= buffer
    if len(context) + len(needle) > context_length:
        context = context[: max(context_length - len(needle), 0)]
    if depth == 100:
        return context + needle, len(context)
    point = int(len(context) * (depth / 100))
    while point > 0 and context[point - 1] not in periods:
        point -= 1
    return context[:point] + needle + context[point:], point


def grid(values, default):
    if values:
        lo, hi, n = values
        return [int(x) for x in np.round(np.linspace(lo, hi, num=int(n), endpoint=True)).astype(int)]
    return [int(x) for x in default]


@EVALS.register("niah")
class NeedleInAHaystack:
    spec = Spec(
        metric="score",  # the headline metric (harness.evals: what an evaluator declares)
        reader="niah",  # the tables read a length's summed word-overlap scores over depths
        # samples/niah.jsonl fields; lceg: the default scorer's per-sample score
        records={"length": "length", "score": ("score", "lceg", "correct")},
        floor={"threshold": 0.5, "chance": 0.0, "ceiling": 0.9167},  # LCEG word overlap: a perfect answer scores 11/12
        by_length=lambda a: not a.context_lengths,  # one shard per length, unless the LCEG grid sets the lengths
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map

    def count_prompts(self, lengths, limit):
        """{context length: depths} of the LCEG grid (or the lengths) and its basis."""
        a = self.args
        cl = [L for L in grid(a.context_lengths or [], lengths_within(a.lengths, lengths, limit))
              if limit is None or L <= limit]
        return {L: a.depth_intervals for L in cl}, "context lengths x depths (LCEG grid)"

    @dataclass
    class Args(EvalArgs):
        name: str = "niah"
        context_lengths: list = field(default_factory=list)  # [min, max, n] (LCEG: [1000, 128000, 40]); [] = lengths
        depth_intervals: int = 10
        gen_tokens: int = 50
        buffer: int = 200  # final_context_length_buffer; -1 = prompt template + gen_tokens exactly
        scorer: str = "lceg"  # lceg (needle_plot word overlap, reported by the paper) | rouge (ROUGE-1 F / 10)
        haystack_dir: str = ""  # PaulGrahamEssays/ (*.txt); else Shakespeare test split
        reuse_prefix: bool = True

    def __init__(self, args):
        if args.scorer not in ("lceg", "rouge"):
            raise ConfigError(f"niah: unknown scorer {args.scorer!r} (lceg | rouge)")
        if args.context_lengths and len(args.context_lengths) != 3:
            raise ConfigError("niah: context_lengths must be [min, max, n]")
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, depth_intervals=a.depth_intervals, gen_tokens=a.gen_tokens)
        if a.context_lengths:
            lo, hi, n = a.context_lengths
            if not (isinstance(n, int) and n >= 1 and 0 < lo <= hi):
                raise ConfigError(f"{where}.context_lengths must be [min, max, n] with 0 < min <= max and n >= 1, "
                                  f"got {list(a.context_lengths)}")
        lengths = check_lengths(self.lengths(), native_ctx, f"{where}.context_lengths")
        if a.buffer < -1:
            raise ConfigError(f"{where}.buffer must be -1 (template + gen_tokens) or >= 0 tokens, got {a.buffer}")
        if lengths and a.buffer >= min(lengths):
            raise ConfigError(f"{where}.buffer = {a.buffer} tokens leaves no haystack at the shortest context length "
                              f"{min(lengths)} (valid: -1 or 0..{min(lengths) - 1})")

    def check_data(self, where: str) -> None:
        d = self.args.haystack_dir
        if d and not (Path(d).is_dir() and any(Path(d).glob("*.txt"))):
            raise ConfigError(f"{where}.haystack_dir: {d} is not a directory of *.txt essays (\"\" = the "
                              f"Shakespeare test split)")

    def max_length(self) -> int:
        return max(self.lengths() or [0])

    def lengths(self) -> list[int]:
        return grid(self.args.context_lengths, self.args.lengths)

    def depths(self) -> list[int]:
        return grid([0, 100, self.args.depth_intervals], [])

    def prompts(self, tokenizer, lengths: list[int]):
        """Yield (L, depth, prompt text, insertion index, trimmed context length) for every cell."""
        a = self.args
        text, self.source = haystack_text(a.haystack_dir)
        base = haystack_ids(tokenizer, text)
        hay = list(base)
        while len(hay) < max(lengths):
            hay += base
        needle = tokenizer(NIAH_NEEDLE, add_special_tokens=False).input_ids
        periods = period_ids(tokenizer)
        overhead = len(tokenizer(NIAH_PROMPT.format(context="", question=NIAH_QUESTION)).input_ids)
        buffer = overhead + a.gen_tokens + 4 if a.buffer < 0 else a.buffer  # +4: re-tokenisation slack
        for L in lengths:
            ctx = hay[:L]
            for d in sorted(self.depths(), reverse=True):
                toks, point = insert_needle(ctx, needle, d, L, buffer, periods)
                prompt = NIAH_PROMPT.format(context=tokenizer.decode(toks), question=NIAH_QUESTION)
                yield L, d, prompt, point, len(toks) - len(needle)

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        lengths, skipped = split_lengths(self.lengths(), handle, method)
        tok = handle.tokenizer
        runner = PrefixCache(handle.model, ctx.autocast, enabled=a.reuse_prefix)
        stops = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
        cells: dict = {}
        recs, over_budget = [], []
        todo = [(L, d, point, n_ctx, tok(prompt).input_ids)
                for L, d, prompt, point, n_ctx in (self.prompts(tok, lengths) if lengths else [])]
        order = reuse_order([t[4] for t in todo]) if a.reuse_prefix else list(range(len(todo)))

        def one(i: int):
            ids = todo[i][4]
            r0, e0 = runner.tokens_reused, runner.tokens_encoded
            out = runner.generate(ids, a.gen_tokens, stop_ids=stops)
            resp = tok.decode(out, skip_special_tokens=True).strip()
            return resp, runner.tokens_reused - r0, runner.tokens_encoded - e0

        reused = encoded = 0  # summed over the ranks' prompts (a rank's first prompt is encoded whole)
        for i, (resp, n_reused, n_encoded) in zip(order, ctx.map(one, order)):
            L, d, point, n_ctx, ids = todo[i]
            reused, encoded = reused + n_reused, encoded + n_encoded
            if len(ids) + a.gen_tokens > L:
                over_budget.append([L, d, len(ids)])
            s_lceg, s_rouge = lceg_score(resp), rouge_score(resp)
            score = s_lceg if a.scorer == "lceg" else s_rouge / 10
            cells.setdefault(str(L), {})[str(d)] = round(score, 4)
            recs.append({"length": L, "depth": d, "prompt_tokens": len(ids), "insertion": point,
                         "context_tokens": n_ctx, "response": resp, "lceg": round(s_lceg, 4),
                         "rouge1x10": round(s_rouge, 4)})
        recs.sort(key=lambda r: (r["length"], r["depth"]))
        cells = dict(sorted(cells.items(), key=lambda kv: int(kv[0])))
        write_jsonl(ctx.samples_path("niah"), recs)
        score = {L: round(sum(g.values()) / len(g), 4) for L, g in cells.items()}
        grid_sorted = {L: dict(sorted(g.items(), key=lambda kv: int(kv[0]))) for L, g in cells.items()}
        ci = {}
        for L, g in grid_sorted.items():  # one needle per depth: the depths are the samples of a length
            est = bounded_interval(list(g.values()))
            ci[L] = [round(est[1], 4), round(est[2], 4)] if est else None
        return {"score": score, "ci": ci, "grid": grid_sorted, "scorer": a.scorer, "depths": self.depths(),
                "haystack": getattr(self, "source", None), "skipped": skipped, "over_budget": over_budget,
                "tokens_reused": reused, "tokens_encoded": encoded}
