"""longbench_v2: LongBench v2 (Bai et al. 2024, ``THUDM/LongBench`` v2: ``pred.py``, ``prompts/0shot.txt``,
``result.py``), 503 four-choice questions over 8k..2M-word contexts, 0-shot without chain of thought.

Per item, as ``pred.py``: the template ``prompts/0shot.txt`` with ``$DOC$`` <- ``context.strip()``, ``$Q$`` <-
``question.strip()``, ``$C_A$``..``$C_D$`` <- ``choice_X.strip()``; tokenised (BOS included); longer than the prompt
budget ``max_len`` -> ``input_ids[:max_len//2] + input_ids[-max_len//2:]`` (**middle truncation**; with Python's
floor division the tail keeps ``ceil(max_len/2)`` tokens, so exactly ``max_len`` are kept); decoding up to
``max_new_tokens=128``; the answer is extracted from the response with ``*`` removed by ``The correct answer is
\\(([A-D])\\)``, else ``The correct answer is ([A-D])``, else None; ``judge = pred == answer``. Accuracy overall and by
``difficulty`` (easy / hard) and ``length`` (short / medium / long), in % (``result.py``); ``compensated: true``
counts an unparsed answer as 0.25, as ``result.py``'s flag does.

Differences, as flags or notes: the prompt budget of length L is ``L - max_new_tokens`` so that prompt and answer fit
in L tokens (the original's ``max_len`` is the model's window from ``config/model2maxlen.json``, generation on top);
``truncation: tokens`` (default) feeds the spliced ids, ``text`` reproduces ``pred.py`` literally (both halves
decoded with ``skip_special_tokens=True`` and re-tokenised, which can move a token or two at the seam); decoding is
greedy (the original samples at ``temperature=0.1`` through an OpenAI-compatible server, with the model's chat
template; the study's models are base models, so the prompt is fed as is). ``result.py`` counts ``length ==
"short"`` twice (its medium bucket stays empty); the buckets here are the three the paper reports.

Data: the released ``data.json`` (a JSON list with ``_id, domain, sub_domain, difficulty, length, question,
choice_A..choice_D, answer, context``) from ``data_path``; "" = the shipped fixture
``harness/assets/fixtures/longbench_v2/data.json`` (a few made-up items in the official format, for tests only:
its numbers mean nothing). The row keeps every item's 0/1 score in item order per length (``per_sample``), Wilson
intervals per length (``ci``) and per bucket (``by_length_ci``, ``by_difficulty_ci``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from harness.config import ConfigError
from harness.evals import (
    EVALS,
    EvalArgs,
    Spec,
    check_nonneg,
    check_positive,
    lengths_within,
    split_lengths,
    write_jsonl,
)
from harness.evals.common import PrefixCache
from harness.evals.templates import LONGBENCH_V2_TEMPLATE
from harness.stats import bounded_interval

FIXTURE = Path(__file__).resolve().parents[1] / "assets" / "fixtures" / "longbench_v2" / "data.json"
FIELDS = ("_id", "domain", "sub_domain", "difficulty", "length", "question", "choice_A", "choice_B", "choice_C",
          "choice_D", "answer", "context")
LENGTHS = ("short", "medium", "long")
RELEASED_ITEMS = 503  # items of the released data.json (samples: 0 = all)
DIFFICULTIES = ("easy", "hard")


def load_items(path: str | Path, samples: int = 0) -> list[dict]:
    p = Path(path)
    try:
        rows = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"longbench_v2: cannot read {p} as JSON ({e.__class__.__name__})") from None
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"longbench_v2: {p} must hold a non-empty JSON list of items")
    for r in rows:
        missing = [f for f in FIELDS if f not in r]
        if missing:
            raise ConfigError(f"longbench_v2: {p} item {r.get('_id', '?')} lacks fields {missing}")
    return rows[:samples] if samples > 0 else rows


def format_prompt(item: dict) -> str:
    return (LONGBENCH_V2_TEMPLATE.replace("$DOC$", item["context"].strip())
            .replace("$Q$", item["question"].strip())
            .replace("$C_A$", item["choice_A"].strip()).replace("$C_B$", item["choice_B"].strip())
            .replace("$C_C$", item["choice_C"].strip()).replace("$C_D$", item["choice_D"].strip()))


def middle_truncate(ids: list[int], max_len: int) -> list[int]:
    """``input_ids[:max_len//2] + input_ids[-max_len//2:]`` when longer than ``max_len``."""
    if len(ids) <= max_len:
        return list(ids)
    return list(ids[: max_len // 2]) + list(ids[-max_len // 2:])


def build_input(tokenizer, item: dict, max_len: int, truncation: str = "tokens") -> tuple[list[int], bool]:
    prompt = format_prompt(item)
    ids = tokenizer(prompt).input_ids
    if len(ids) <= max_len:
        return ids, False
    cut = middle_truncate(ids, max_len)
    if truncation == "tokens":
        return cut, True
    return tokenizer(tokenizer.decode(cut, skip_special_tokens=True)).input_ids, True


def extract_answer(response: str) -> str | None:
    response = response.replace("*", "")
    m = re.search(r"The correct answer is \(([A-D])\)", response)
    if m:
        return m.group(1)
    m = re.search(r"The correct answer is ([A-D])", response)
    return m.group(1) if m else None


def item_score(pred: str | None, answer: str, compensated: bool = False) -> float:
    if compensated and pred is None:
        return 0.25
    return float(pred == answer)


def summarize(records: list[dict]) -> dict:
    """Accuracy (%) overall, by difficulty and by length bucket, with Wilson intervals (bounded for 0.25s)."""
    def acc(rs):
        if not rs:
            return None, None
        s = [r["score"] for r in rs]
        est = bounded_interval(s)
        return round(100 * sum(s) / len(s), 1), [round(100 * est[1], 1), round(100 * est[2], 1)]

    out = {"overall": acc(records)}
    out.update({d: acc([r for r in records if r["difficulty"] == d]) for d in DIFFICULTIES})
    out.update({b: acc([r for r in records if r["length_bucket"] == b]) for b in LENGTHS})
    return out


@EVALS.register("longbench_v2")
class LongBenchV2:
    spec = Spec(
        metric="accuracy",  # the headline metric (harness.evals: what an evaluator declares)
        reader="percent",  # the tables read a length's accuracy in % over items
        records={"length": "length", "score": ("score",)},  # samples/longbench_v2.jsonl fields
        floor={"threshold": 25, "chance": 25, "ceiling": 100},  # four choices: 25% is chance
        extended="LongBench v2",  # its column in the 2024-benchmarks table
        extended_note="accuracy (%)",  # its line in that table's notes
        generates=True)  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)

    def count_prompts(self, lengths, limit):
        """{length: items} and its basis (every item truncated to each length)."""
        n = self.args.samples or RELEASED_ITEMS
        return ({L: n for L in lengths_within(self.args.lengths, lengths, limit)},
                f"{n} items x lengths" + ("" if self.args.samples else " (all of the release)"))

    @dataclass
    class Args(EvalArgs):
        name: str = "longbench_v2"
        data_path: str = ""  # the released data.json; "" = the shipped fixture (made-up items, tests only)
        samples: int = 0  # first N items (0 = all 503)
        max_new_tokens: int = 128  # pred.py, 0-shot without CoT
        truncation: str = "tokens"  # tokens (exact halves) | text (decode + re-tokenise, literal pred.py)
        compensated: bool = False  # result.py: an unparsed answer counts 0.25
        reuse_prefix: bool = False  # items share only the template head

    def __init__(self, args):
        if args.truncation not in ("tokens", "text"):
            raise ConfigError(f"longbench_v2.truncation must be tokens or text, got {args.truncation!r}")
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, max_new_tokens=a.max_new_tokens)
        check_nonneg(where, samples=a.samples)
        for L in a.lengths:
            if int(L) <= a.max_new_tokens:
                raise ConfigError(f"{where}.lengths: {L} leaves no prompt budget after max_new_tokens = "
                                  f"{a.max_new_tokens} (valid: lengths > max_new_tokens)")

    def check_data(self, where: str) -> None:
        p = Path(self.args.data_path or FIXTURE)
        if not p.is_file():
            raise ConfigError(f"{where}.data_path: {p} not found (LongBench v2 data.json; \"\" = the shipped fixture)")
        load_items(p, 1)

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        lengths, skipped = split_lengths(a.lengths, handle, method)
        tok, model = handle.tokenizer, handle.model
        items = load_items(a.data_path or FIXTURE, a.samples)
        runner = PrefixCache(model, ctx.autocast, enabled=a.reuse_prefix)
        stops = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
        accuracy, ci, per_sample, by_difficulty, by_length, bucket_ci, truncated = {}, {}, {}, {}, {}, {}, {}
        for L in lengths:
            budget = L - a.max_new_tokens
            recs = []
            for i, item in enumerate(items):
                ids, cut = build_input(tok, item, budget, a.truncation)
                out = runner.generate(ids, a.max_new_tokens, stop_ids=stops)
                response = tok.decode(out, skip_special_tokens=True).strip()
                pred = extract_answer(response)
                recs.append({"_id": item["_id"], "i": i, "length": L, "prompt_tokens": len(ids), "truncated": cut,
                             "difficulty": item["difficulty"], "length_bucket": item["length"],
                             "domain": item["domain"], "response": response, "pred": pred,
                             "answer": item["answer"], "judge": pred == item["answer"],
                             "score": item_score(pred, item["answer"], a.compensated)})
            write_jsonl(ctx.samples_path("longbench_v2"), recs)
            s = summarize(recs)
            accuracy[str(L)], ci[str(L)] = s["overall"]
            by_difficulty[str(L)] = {d: s[d][0] for d in DIFFICULTIES}
            by_length[str(L)] = {b: s[b][0] for b in LENGTHS}
            bucket_ci[str(L)] = {k: s[k][1] for k in (*DIFFICULTIES, *LENGTHS)}
            per_sample[str(L)] = [r["score"] for r in recs]  # item order: paired across methods
            truncated[str(L)] = sum(r["truncated"] for r in recs)
        return {"accuracy": accuracy, "ci": ci, "by_difficulty": by_difficulty, "by_length": by_length,
                "bucket_ci": bucket_ci, "per_sample": per_sample, "truncated": truncated, "items": len(items),
                "data": a.data_path or "fixture", "skipped": skipped, "compensated": a.compensated}
