"""The results row's schema (``Row``, ``ROW_FIELDS``, ``SCHEMA_VERSION``), its one constructor (``new_row``), where it
lives (``row_path``), and what identifies and describes a run: ids, the config hash, the commit, versions,
hardware."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import secrets
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TypedDict

from harness.safe import safe_file

SCHEMA_VERSION = 1


class Row(TypedDict, total=False):
    """The results row (schema ``SCHEMA_VERSION``): one JSON object per run, keys in this order."""

    schema: int                    # SCHEMA_VERSION of the writer
    run_id: str                    # UTC time + random suffix; also the file name (results/runs/<run_id>.json)
    status: str                    # running | ok | failed
    error: str | None              # one line when failed
    time_start: str                # ISO, UTC
    time_end: str | None           # ISO, UTC; None while running
    model: str                     # the option chosen in each config group, a stable short name (tables' columns)
    method: str                    # ... the method (pi, yarn, ntk_dynamic, ...)
    data: str                      # ... the training data
    train: str                     # ... the recipe; "none" for a frozen run
    eval: str                      # ... the suite
    model_info: dict | None        # what was loaded and how it ran: path, window, device / GPUs, dtype, attention
    method_params: dict            # the method's parameters as applied (lengths resolved)
    train_info: dict | None        # what fine-tuning did (steps, tokens, schedule, EMA, the convergence gate); None
    metrics: dict                  # {suite entry: evaluator output}, e.g. metrics["passkey"]["accuracy"]["1024"]
    eval_versions: dict            # {suite entry: the evaluator's ``version``}: a scoring change shows in the data
    timings: dict                  # seconds per phase ("train") and per evaluator ("eval.<entry>")
    config: dict                   # the resolved Hydra config
    config_hash: str               # sha256 of ``config`` (16 hex): `make study` skips a point with an ok row of it
    git_sha: str | None            # the code's commit
    command: str                   # the command line
    versions: dict                 # package versions (PACKAGES)
    hardware: dict                 # platform, cpu_count, torch threads, CUDA devices
    run_dir: str                   # the run's directory: run.json, run.log, samples/, checkpoint/
    host: str                      # where the writing process runs ...
    pid: int                       # ... and its pid: with ``heartbeat``, how ``liveness`` tells a killed run
    heartbeat: str | None          # ISO, UTC; rewritten every ``heartbeat_every_s`` while the run lives
    heartbeat_every_s: float | None  # the heartbeat period the writer promised
    shards: dict                   # sharded evaluation only: {shard: ok | failed | missing}


ROW_FIELDS = tuple(k for k in Row.__annotations__ if k != "shards")  # the keys every row has (shards: sharded only)
PACKAGES = ("torch", "transformers", "peft", "deepspeed", "datasets", "hydra-core", "lm_eval", "tokenizers")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


# keys that say where and how a run executes (placement: folders, devices, ranks, the logger), how often it saves or
# logs, how much it may cost, or what a config group is for, not what the run measures (dotted: a key of a group; a
# bare group name: the whole group): a configuration keeps its hash (and a study its finished points, a sharded run
# its id) when they change or when a newer harness adds them. tests/test_config_hash.py lists what is in and what is
# out.
NOT_IN_CONFIG_HASH = ("paths", "device", "eval_world_size", "logger",
                      "data.cache_dir", "data.max_tokens", "data.scale", "data.larger",
                      "train.save_every", "train.save_every_s", "train.log_every", "train.keep_checkpoints",
                      "train.nodes",  # how the ranks are spread over nodes: the same batches and weights
                      "method.facts",  # method.facts: what the tables know about a method, not a setting
                      "model.shape",  # model.shape: the checkpoint's layer shapes for the plan, not a setting
                      "cost",  # cost.limit_s: a budget checked before the run, not a setting
                      "study.every_method")  # how an experiment finds its points, not a setting of one
# the rule before issue 46 (paths and the bookkeeping keys were in): every committed row's recorded hash is its
# config's under it (tests/test_config_hash.py), so recomputing on read changes no match
LEGACY_NOT_IN_CONFIG_HASH = ("device", "eval_world_size", "data.max_tokens", "data.scale", "data.larger",
                             "paths.eval_root", "method.facts")


def config_hash(cfg: dict, rule: tuple = NOT_IN_CONFIG_HASH) -> str:
    if isinstance(cfg, dict):
        cfg = _without(cfg, rule)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def row_hash(row: dict) -> str | None:
    """A row's config hash recomputed from its recorded ``config`` under today's rule (``NOT_IN_CONFIG_HASH``):
    what ``make study`` and the tables match on, so that a row written with other folders (``HARNESS_CKPT_DIR``) or
    under the older rule still matches its point, and a hand-edited ``config_hash`` matches nothing it was not run
    with. The recorded value for a row without a config (a command line that never composed)."""
    cfg = row.get("config")
    return config_hash(cfg) if isinstance(cfg, dict) and cfg else row.get("config_hash")


def _without(cfg: dict, keys) -> dict:
    out = {k: v for k, v in cfg.items() if k not in keys}
    for group in {k.split(".", 1)[0] for k in keys if "." in k}:
        if isinstance(out.get(group), dict):
            inner = {k.split(".", 1)[1] for k in keys if k.startswith(group + ".")}
            out[group] = {k: v for k, v in out[group].items() if k not in inner}
    return out


def git_sha(cwd: str | Path | None = None) -> str | None:
    try:
        here = cwd or Path(__file__).parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        sha = out.stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
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


GROUPS = ("model", "method", "data", "train", "eval")  # the config groups a row names (its columns in the tables)


def new_row(run_id: str, cfg: dict, names: dict | None, run_dir: str | Path) -> Row:
    """The one constructor of a ``running`` row: ``names`` None = each group's ``name`` in ``cfg`` (``GROUPS``)."""
    if names is None:
        names = {g: (cfg.get(g) or {}).get("name") for g in GROUPS}
    row = {k: None for k in ROW_FIELDS}
    row.update(schema=SCHEMA_VERSION, run_id=run_id, status="running", time_start=now_iso(), metrics={},
               eval_versions={}, timings={},
               config=cfg, config_hash=config_hash(cfg), git_sha=git_sha(), command=" ".join(sys.argv),
               versions=versions(), hardware=hardware(), run_dir=str(run_dir), host=socket.gethostname(),
               pid=os.getpid(), **names)
    return row


def row_path(results_dir: str | Path, run_id: str) -> Path:
    """``<results_dir>/runs/<run_id>.json`` for a safe ``run_id`` (``harness.safe.safe_file``)."""
    return safe_file(Path(results_dir) / "runs", run_id, ".json", "run_id")


# -- machine paths ---------------------------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]  # the checkout: committed results name its files relative to it
_ABS = re.compile(r"(?<![\w.~:/-])/(?:[^\s'\"=:,;()\[\]{}]+)")
_PYTHON = re.compile(r"^(?:.*/)?python[\d.]*$")
# a checkout's own top-level entries: in ``any_checkout`` mode the part of a path before the first of them is taken
# for a checkout's root (the rows of a study run in a git worktree of the repository name that worktree)
CHECKOUT_TOP = ("outputs", "results", "harness", "controlled_study", "scripts", "benchmarks", "conf", "tests",
                ".cache", ".venv", "run.py")


def portable(value, root: str | Path | None = None, outside: bool = False, any_checkout: bool = False):
    """``value`` (a row, a record; any JSON value) with machine paths made portable: an absolute path inside the
    checkout ``root`` (default: this one, ``REPO``; with ``any_checkout``, any folder holding one of the checkout's
    own entries, ``CHECKOUT_TOP``: another worktree of the repository) relative to it, a Python interpreter's path
    its name (``python3``); with ``outside``, any other absolute path ``.../<last two parts>`` (what a committed
    result may keep of a temporary folder). Keys and everything else as they are, so a config's hash never changes
    where its paths are not hashed (``NOT_IN_CONFIG_HASH``: ``paths``)."""
    r = str(Path(root or REPO))

    def one(m: re.Match) -> str:
        p = m.group(0)
        if p == r:
            return "."
        if p.startswith(r + "/"):
            return p[len(r) + 1:]
        if _PYTHON.match(p):
            return Path(p).name
        parts = [x for x in p.split("/") if x]
        if any_checkout:
            i = next((i for i, x in enumerate(parts) if x in CHECKOUT_TOP and i > 0), None)
            if i is not None:
                return "/".join(parts[i:])
        if outside:
            return ".../" + "/".join(parts[-2:])
        return p

    if isinstance(value, dict):
        return {k: portable(v, root, outside, any_checkout) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v, root, outside, any_checkout) for v in value]
    if isinstance(value, str) and "/" in value:
        return _ABS.sub(one, value)
    return value


def machine_paths(value, where: str = "") -> list[str]:
    """Every string of ``value`` that holds an absolute path (``<where>.<key>: <path>``): what a committed result
    must not carry."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in machine_paths(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in machine_paths(v, f"{where}[{i}]")]
    if isinstance(value, str) and _ABS.search(value):
        return [f"{where}: {_ABS.search(value).group(0)}"]
    return []
