"""Evaluators: one file + one YAML (``conf/evaluator/<name>.yaml``) each, registered by a stable short name.

An evaluator class has an ``Args`` dataclass (validated against its YAML) and ``run(handle, method, ctx)``
returning a JSON-able dict of metrics: ``{"metric": {length: value}, ...}`` plus whatever the tables need. Lengths
the method cannot serve are reported under ``"skipped"`` with a reason, never silently dropped. Per-sample records
go to ``ctx.samples_path(name)`` (JSONL beside the row).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.config import ConfigError, to_args
from harness.registry import Registry

EVALS: Registry = Registry("evaluator", "harness.evals")


@dataclass
class EvalArgs:
    name: str = ""
    lengths: list = field(default_factory=list)  # evaluation lengths in tokens


@dataclass
class EvalContext:
    """What an evaluator may use besides the model: where to write per-sample records, the seed, autocast, how many
    tokens to batch, and a cache of window NLLs valid for this one evaluation of one (fixed) model."""

    run_dir: Path
    seed: int = 0
    autocast: str = "auto"  # compute dtype: auto (bf16 where the hardware has it) | bfloat16 | float32
    batch_tokens: int = 8192  # windows of one length scored together up to this many tokens (0 = one at a time)
    nll_cache: dict | None = field(default_factory=dict)  # window NLLs shared by one run's evaluators; None = off

    def samples_path(self, evaluator: str) -> Path:
        p = Path(self.run_dir) / "samples" / f"{evaluator}.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        return p


def build_evaluators(suite_cfg) -> list:
    """The one builder for the eval suite: ``{name: node}`` -> evaluator instances, in order."""
    out = []
    for key, node in (suite_cfg or {}).items():
        name = (node or {}).get("name") or key
        cls = EVALS.get(name)
        out.append(cls(to_args(cls.Args, node, f"eval suite entry {key!r}")))
    return out


def split_lengths(lengths, handle, method) -> tuple[list[int], dict]:
    """Lengths the method supports, and {length: reason} for the ones it does not."""
    lim = method.max_length(handle) if method is not None else None
    ok, skipped = [], {}
    for L in lengths:
        L = int(L)
        if L <= 0:
            raise ConfigError(f"evaluation length must be positive, got {L}")
        if lim is not None and L > lim:
            skipped[str(L)] = f"method {method.name} supports at most {lim} tokens"
        else:
            ok.append(L)
    return ok, skipped


def write_jsonl(path: Path, records) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
