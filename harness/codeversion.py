"""What changes results besides the config: content digests of the code that produces the data and the weights.

Keys built from these digests (the data cache, the resume key of training checkpoints) change when that code
changes, committed or not, and do not depend on where the repository, the cache or the checkpoints live. A git
sha would be coarser (a docs commit would invalidate every checkpoint) and blind to uncommitted edits.
Ground floor: imports nothing from the harness.
"""
from __future__ import annotations

import functools
import hashlib
import platform
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "harness"


def digest(files) -> str:
    """sha256 (16 hex) over the sorted (path relative to the repository, content) of ``files``."""
    h = hashlib.sha256()
    for f in sorted({Path(f).resolve() for f in files}):
        try:
            rel = f.relative_to(ROOT).as_posix()
        except ValueError:
            rel = f.name
        h.update(rel.encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _versions(*packages: str) -> dict:
    out = {"python": platform.python_version()}
    for p in packages:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


@functools.cache
def data_code_version() -> dict:
    """The data builders (every file under ``harness/data``, so a synthetic kind added later is covered) and the
    evaluation-template filter they apply, plus the library versions that tokenise and shuffle."""
    files = list((HARNESS / "data").rglob("*.py")) + [HARNESS / "contamination.py"]
    return {"code": digest(files), **_versions("numpy", "tokenizers", "transformers")}


# modules whose edits never change a trained weight: bookkeeping and reporting, the command-line checks and tools
# (harness/tools), the statistics, and what runs only after the weights are final (the evaluators, the factor search:
# LongRoPE's recovery search runs after fine-tuning and writes factors, not weights). ``NUMERICAL`` names the
# exceptions: the convergence gate measures the base model before fine-tuning starts, in the same process.
NOT_NUMERICAL = {"report.py", "tracking.py", "progress.py", "results", "lifecycle.py", "status.py", "app.py",
                 "shards.py", "sweeps.py", "evals", "search", "eval_distributed.py", "precheck.py", "plan.py", "cli.py",
                 "submit.py", "stats.py", "codeversion.py", "tools"}
NUMERICAL = {"evals/convergence.py"}


def train_code_files() -> list[Path]:
    """The files ``train_code_version`` digests: the harness less ``NOT_NUMERICAL`` (plus ``NUMERICAL``), and the
    distributed entry point."""
    files = [f for f in HARNESS.rglob("*.py")
             if not set(f.relative_to(HARNESS).parts) & NOT_NUMERICAL or f.relative_to(HARNESS).as_posix() in NUMERICAL]
    return [f for f in [*files, ROOT / "scripts" / "train_distributed.py"] if f.is_file()]


@functools.cache
def train_code_version() -> dict:
    """Everything that can change fine-tuned weights: the harness (models, methods, data, training step and
    engines, the gate's pre-training measurement; not ``NOT_NUMERICAL``), the distributed entry point and the
    numerical libraries."""
    return {"code": digest(train_code_files()),
            **_versions("torch", "transformers", "peft", "deepspeed", "numpy")}
