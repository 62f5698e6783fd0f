"""One results row per run: a JSON file under ``results/runs/``, written atomically (temp file + rename).

Row schema (``ROW_FIELDS``, version ``SCHEMA_VERSION``):

- ``run_id``: unique id (UTC time + random suffix); also the file name, so two runs never overwrite each other.
- ``status``: ``running`` | ``ok`` | ``failed``; ``error``: one line when failed.
- ``time_start`` / ``time_end`` (ISO, UTC), ``timings`` (seconds per phase and per evaluator).
- ``model``, ``method``, ``data``, ``train``, ``eval``: the option chosen in each config group (stable short names).
- ``method_params``: the method's parameters; ``train_info``: what fine-tuning actually did (tokens seen,
  effective global batch, schedule, EMA) or ``null`` for frozen runs.
- ``metrics``: ``{suite entry: evaluator output}``, e.g. ``metrics.passkey.accuracy["1024"]``.
- ``config`` (resolved) and ``config_hash``; ``git_sha``; ``command``; ``versions`` (packages); ``hardware``.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

SCHEMA_VERSION = 1
ROW_FIELDS = (
    "schema", "run_id", "status", "error", "time_start", "time_end", "model", "method", "data", "train", "eval",
    "method_params", "train_info", "metrics", "timings", "config", "config_hash", "git_sha", "command", "versions",
    "hardware", "run_dir",
)
PACKAGES = ("torch", "transformers", "peft", "deepspeed", "datasets", "hydra-core", "lm_eval", "tokenizers")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def config_hash(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_sha(cwd: str | Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent, capture_output=True,
                             text=True, timeout=5)
        sha = out.stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd or Path(__file__).parent,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def hardware() -> dict:
    import torch

    hw = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
          "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return hw


def atomic_write_json(path: str | Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` so that readers see either the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, sort_keys=False, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def new_row(run_id: str, cfg: dict, names: dict, run_dir: str | Path) -> dict:
    row = {k: None for k in ROW_FIELDS}
    row.update(schema=SCHEMA_VERSION, run_id=run_id, status="running", time_start=now_iso(), metrics={}, timings={},
               config=cfg, config_hash=config_hash(cfg), git_sha=git_sha(), command=" ".join(sys.argv),
               versions=versions(), hardware=hardware(), run_dir=str(run_dir), **names)
    return row


def row_path(results_dir: str | Path, run_id: str) -> Path:
    return Path(results_dir) / "runs" / f"{run_id}.json"


def write_row(results_dir: str | Path, row: dict) -> Path:
    p = row_path(results_dir, row["run_id"])
    atomic_write_json(p, row)
    return p


def read_rows(results_dir: str | Path) -> list[dict]:
    """Every intact row under ``results_dir/runs`` (malformed files are skipped with a warning)."""
    rows = []
    for f in sorted(Path(results_dir, "runs").glob("*.json")):
        try:
            rows.append(json.loads(f.read_text()))
        except (json.JSONDecodeError, OSError) as e:
            print(f"warning: skipping unreadable row {f}: {e}", file=sys.stderr)
    return rows
