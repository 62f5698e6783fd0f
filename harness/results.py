"""One results row per run: a JSON file under ``results/runs/``, written atomically (temp file + rename).

Row schema (the ``Row`` TypedDict, a comment per key; ``ROW_FIELDS``; version ``SCHEMA_VERSION``):

- ``run_id``: unique id (UTC time + random suffix); also the file name, so two runs never overwrite each other.
- ``status``: ``running`` | ``ok`` | ``failed``; ``error``: one line when failed.
- ``time_start`` / ``time_end`` (ISO, UTC), ``timings`` (seconds per phase and per evaluator).
- ``model``, ``method``, ``data``, ``train``, ``eval``: the option chosen in each config group (stable short names).
- ``method_params``: the method's parameters; ``train_info``: what fine-tuning actually did (tokens seen,
  effective global batch, schedule, EMA with the base model's share of the evaluated weights) or ``null`` for
  frozen runs.
- ``metrics``: ``{suite entry: evaluator output}``, e.g. ``metrics.passkey.accuracy["1024"]``; ``eval_versions``:
  ``{suite entry: the evaluator's version}`` (its class attribute ``version``, 1 unless a change of its numbers
  bumped it), so rows measured by different versions of an evaluator can be told apart.
- ``config`` (resolved) and ``config_hash``; ``git_sha``; ``command``; ``versions`` (packages); ``hardware``.
- ``host``, ``pid`` of the process that writes the row, and ``heartbeat`` (ISO, UTC): rewritten every
  ``heartbeat_every_s`` seconds while the run lives (``start_heartbeat``), so a ``running`` row whose process was
  killed is recognisable: ``liveness(row)`` says ``stale`` when the process is gone (same host) or the heartbeat is
  older than a few periods (any host). ``python -m harness.status`` lists rows that way; the tables count them.

Files are created readable by the group and others as the umask allows (0644 under the usual 022), never 0600,
so teammates sharing a results directory can read every row.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TypedDict

from harness.safe import check_name, is_safe_name, nonfinite, safe_file

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
                      "train.save_every", "train.log_every", "train.keep_checkpoints",
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


def _umask() -> int:
    """The process umask (read without changing it where /proc allows; else set-and-restore once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file: mkstemp's 0600 is for secrets, not results


def atomic_write_json(path: str | Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` so that readers see either the old file or the complete new one."""
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False, default=str))


def atomic_write_text(path: str | Path, text: str) -> None:
    """``atomic_write_json`` for text. An ``OSError`` names ``path`` (not the temporary file)."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write(path: str | Path, writer) -> None:
    """``writer(f)`` fills a temporary binary file beside ``path``, which then replaces ``path`` in one rename:
    readers see the old file or the complete new one, and a failure (a full disk) leaves the old one and no
    temporary file. The file gets the umask's permissions (``FILE_MODE``). An ``OSError`` names ``path``."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(e, OSError) and e.errno is not None and e.filename != str(path.parent):
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise


# ------------------------------------------------------------------------------------------- folders swapped whole
HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextmanager
def signals_held():
    """Hold SIGTERM / SIGINT / SIGHUP for the block (delivered when it ends): a few renames that must all happen."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def terminate_raises():
    """SIGTERM raises ``SystemExit(143)`` in the main thread for the block (else the process dies at once, and no
    ``finally`` removes a half-written temporary file or folder)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class Staged:
    """The new versions of some folders, written beside them (``replacing_dirs``): ``path(final)`` is where the new
    contents go; ``on_commit(fn)`` runs ``fn`` right after the swap, signals still held (a file that must match)."""

    def __init__(self, dirs: dict):
        self.dirs, self.hooks = dirs, []

    def path(self, final) -> Path:
        return self.dirs[Path(final)]

    def on_commit(self, fn) -> None:
        self.hooks.append(fn)


STALE_STAGING_S = 3600.0  # a staging folder older than this is a leftover of a killed writer (SIGKILL)


@contextmanager
def replacing_dirs(targets: dict):
    """Replace whole folders at once: ``targets`` maps each final folder to ``owned(name)``, whether a file of the
    old folder is the writer's (replaced; ``*.md`` of a tables folder) or someone else's (moved into the new one).
    The block writes the new contents into hidden folders beside the finals (``Staged.path``); when it returns, each
    final is swapped for its new folder by two renames with SIGTERM / SIGINT / SIGHUP held, then the old ones are
    removed. When the block fails (a full disk) or is terminated (SIGTERM raises, ``terminate_raises``), the new
    folders are removed and the finals stay as they were: a reader sees the previous files or the new ones, never a
    mix. Yields a ``Staged``."""
    targets = {Path(k): v for k, v in targets.items()}
    dirs = {}
    with terminate_raises():
        try:
            for final in map(Path, targets):
                final.parent.mkdir(parents=True, exist_ok=True)
                _remove_stale_staging(final)
                tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.new-", dir=final.parent))
                os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the published folder from teammates
                dirs[final] = tmp
            stage = Staged(dirs)
            yield stage
            olds = []
            with signals_held():
                for final, tmp in dirs.items():
                    old = None
                    if final.exists():
                        old = final.parent / f".{final.name}.old-{secrets.token_hex(4)}"
                        os.rename(final, old)
                    os.rename(tmp, final)
                    olds.append(old)
                    if old is not None:
                        for f in old.iterdir():
                            if not targets[final](f.name) and not (final / f.name).exists():
                                os.rename(f, final / f.name)
                for fn in stage.hooks:
                    fn()
            for old in olds:
                if old is not None:
                    shutil.rmtree(old, ignore_errors=True)
        finally:
            for tmp in dirs.values():
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_staging(final: Path) -> None:
    for d in final.parent.glob(f".{final.name}.[no][el][wd]-*"):
        try:
            if time.time() - d.lstat().st_mtime > STALE_STAGING_S:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


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


# the last text written per row file: the heartbeat rewrites it with a new time, under the same lock as the
# writers, so a heartbeat never puts back an older state of the row and never reads a row being changed
_LAST: dict[Path, str] = {}
_BEATING: dict[Path, float] = {}
_LOCK = threading.Lock()
_THREAD: threading.Thread | None = None


def write_row(results_dir: str | Path, row: dict) -> Path:
    p = row_path(results_dir, row["run_id"])
    if row.get("status") == "running" and row.get("pid") == os.getpid():
        row["heartbeat"] = now_iso()
    text = json.dumps(row, indent=1, sort_keys=False, default=str)
    with _LOCK:
        atomic_write_text(p, text)
        if p in _BEATING:
            _LAST[p] = text
    return p


def start_heartbeat(results_dir: str | Path, row: dict, every_s: float | None = None) -> None:
    """Write ``row`` and rewrite its ``heartbeat`` every ``every_s`` seconds (env ``HARNESS_HEARTBEAT_S``, default
    60) from a daemon thread until ``stop_heartbeat``."""
    global _THREAD
    every = float(every_s or os.environ.get("HARNESS_HEARTBEAT_S") or 60.0)
    row["heartbeat_every_s"] = every
    p = row_path(results_dir, row["run_id"])
    with _LOCK:
        _BEATING[p] = every
    try:
        write_row(results_dir, row)
    except BaseException:
        stop_heartbeat(results_dir, row)
        raise
    with _LOCK:
        if _THREAD is None or not _THREAD.is_alive():
            _THREAD = threading.Thread(target=_beat_forever, name="row-heartbeat", daemon=True)
            _THREAD.start()


def stop_heartbeat(results_dir: str | Path, row: dict) -> None:
    p = row_path(results_dir, row["run_id"])
    with _LOCK:
        _BEATING.pop(p, None)
        _LAST.pop(p, None)


def _beat_forever() -> None:
    due: dict[Path, float] = {}
    while True:
        with _LOCK:
            items = dict(_BEATING)
        now = time.monotonic()
        for p, every in items.items():
            if p not in due:
                due[p] = now + every
            elif now >= due[p]:
                due[p] = now + every
                _beat(p)
        for p in [p for p in due if p not in items]:
            del due[p]
        time.sleep(max(0.05, min(min(items.values(), default=4.0) / 4, 5.0)))


def _beat(p: Path) -> None:
    with _LOCK:
        text = _LAST.get(p)
        if text is None or p not in _BEATING:
            return
        if not p.exists():  # the row was deleted (or its directory): nothing left to keep alive
            _BEATING.pop(p, None)
            _LAST.pop(p, None)
            return
        obj = json.loads(text)
        obj["heartbeat"] = now_iso()
        new = json.dumps(obj, indent=1, sort_keys=False, default=str)
        try:
            atomic_write_text(p, new)
            _LAST[p] = new
        except OSError:
            pass  # a full or read-only disk: the row goes stale, which is what it should say


def _after_fork_in_child() -> None:
    """A forked child has no heartbeat thread, and the lock may have been held by the parent's: start afresh."""
    global _LOCK, _THREAD
    _LOCK = threading.Lock()
    _THREAD = None
    _BEATING.clear()
    _LAST.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def age_s(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return (datetime.now(timezone.utc) - datetime.fromisoformat(iso)).total_seconds()
    except (TypeError, ValueError):
        return None


def liveness(row: dict, mtime: float | None = None) -> str:
    """``ok`` | ``failed`` | ``running`` | ``stale``: a ``running`` row is ``stale`` when its process is gone
    (same host: the pid no longer exists) or its heartbeat stopped (any host: older than 5 periods and at least
    2 minutes). A sharded row (``shards``) stays ``running`` while shards are missing: its jobs come and go.
    Rows written before heartbeats existed fall back on the row file's ``mtime`` with a 1-hour window."""
    status = row.get("status")
    if status != "running":
        return str(status)
    if row.get("shards") is not None:
        return "running"
    if row.get("host") == socket.gethostname() and row.get("pid") and not pid_alive(row["pid"]):
        return "stale"
    every = row.get("heartbeat_every_s")
    age = age_s(row.get("heartbeat"))
    if every and age is not None:
        return "stale" if age > max(5 * float(every), 120.0) else "running"
    if mtime is not None and not row.get("pid"):
        return "stale" if time.time() - mtime > 3600 else "running"
    return "running"


REQUIRED_KEYS = ("run_id", "status")  # what every reader of rows relies on (a failed pre-compose row has them too)
STATUSES = ("running", "ok", "failed")
# bounds of what a reader of a results folder reads (docs/bad_inputs.md): a row is a few KB to a few hundred KB (per-
# sample scores), nested a few levels (config groups, metrics by length)
MAX_FILE_BYTES = 64 << 20     # a row or job record larger than this is skipped, not read
MAX_JSON_DEPTH = 64           # ... nested deeper than this (a RecursionError elsewhere)
_STR = (str, type(None))
_DICT = (dict, type(None))
ROW_TYPES = {**{k: _STR for k in ("error", "time_start", "time_end", "model", "method", "data", "train", "eval",
                                   "config_hash", "git_sha", "command", "run_dir", "host", "heartbeat")},
             **{k: _DICT for k in ("model_info", "method_params", "train_info", "metrics", "eval_versions", "timings",
                                   "config", "versions", "hardware", "shards")},
             "schema": (int, type(None)), "pid": (int, type(None)), "heartbeat_every_s": (int, float, type(None))}


def read_json_file(path: str | Path, root: str | Path | None = None, max_bytes: int = MAX_FILE_BYTES,
                   max_depth: int = MAX_JSON_DEPTH) -> tuple[object, str | None]:
    """``(the JSON value, None)`` of a file in a results folder, or ``(None, why)``, reading only what is safe to
    read: a regular file (a FIFO, a device, a socket or a directory is refused without opening it for a blocking
    read), a symlink only when it resolves inside ``root`` (default: the file's folder), at most ``max_bytes`` bytes,
    UTF-8, JSON nested at most ``max_depth`` levels. The one low-level reader of row and job files."""
    path = Path(path)
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            base = Path(root or path.parent).resolve()
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):
                return None, "a broken or looping symlink"
            if base not in target.parents:
                return None, f"a symlink to {target}, outside {base}"
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return None, f"unreadable ({e.strerror or type(e).__name__})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                    stat.S_ISBLK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a socket"
                    if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            return None, f"{kind}, not a regular file"
        if st.st_size > max_bytes:
            return None, f"{st.st_size} bytes, over the {max_bytes}-byte limit of a results file"
        chunks, n = [], 0
        while n <= max_bytes:
            b = os.read(fd, min(1 << 20, max_bytes + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        text = b"".join(chunks)
    except OSError as e:
        return None, f"unreadable ({e.strerror or type(e).__name__})"
    finally:
        os.close(fd)
    if len(text) > max_bytes:
        return None, f"over the {max_bytes}-byte limit of a results file (it grew while read)"
    return decode_json(text, max_depth)


def decode_json(text: bytes, max_depth: int) -> tuple[object, str | None]:
    """``(value, None)`` for bytes that are UTF-8 JSON nested at most ``max_depth`` levels, else ``(None, why)``:
    empty, not UTF-8, not JSON (truncated), or nested deeper."""
    if not text.strip():
        return None, "empty file"
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 (byte 0x{text[e.start]:02x} at offset {e.start})"
    try:
        obj = json.loads(s)
    except RecursionError:
        return None, f"JSON nested deeper than {max_depth} levels"
    except ValueError as e:
        return None, f"not JSON, truncated? ({e})"
    if _deeper_than(obj, max_depth):
        return None, f"JSON nested deeper than {max_depth} levels"
    return obj, None


def _deeper_than(obj, limit: int) -> bool:
    stack = [(obj, 0)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            if d >= limit:
                return True
            stack += [(v, d + 1) for v in (x.values() if isinstance(x, dict) else x)]
    return False


def row_problem(text: bytes) -> tuple[dict | None, str | None]:
    """``(row, None)`` for the bytes of a row file that is a UTF-8 JSON object with string ``REQUIRED_KEYS``, else
    ``(None, why)``: empty, not UTF-8, not JSON (truncated), JSON that is not an object, or a key missing."""
    obj, why = decode_json(text, MAX_JSON_DEPTH)
    return (None, why) if why else (obj, check_row(obj))


def check_row(obj) -> str | None:
    """Why a parsed row file is not a row a reader can trust (None when it is): not an object, a required key
    missing, a field of the wrong type (``ROW_TYPES``), an unknown status, or a group name (model, method, ...) that
    is not a safe name (``harness.safe.check_name``: the tables build file names from them)."""
    if not isinstance(obj, dict):
        return f"a JSON {type(obj).__name__}, not an object"
    bad = [k for k in REQUIRED_KEYS if not isinstance(obj.get(k), str)]
    if bad:
        return f"no {' / '.join(bad)} (a row has string keys {', '.join(REQUIRED_KEYS)})"
    if obj["status"] not in STATUSES:
        return f"status {obj['status'][:40]!r} is not one of {', '.join(STATUSES)}"
    wrong = [f"{k} is a {type(obj[k]).__name__}" for k, types in ROW_TYPES.items()
             if k in obj and (not isinstance(obj[k], types) or isinstance(obj[k], bool) and bool not in types)]
    if wrong:
        return "wrong field types: " + ", ".join(wrong)
    for g in GROUPS:
        if obj.get(g) is not None and not is_safe_name(obj[g]):
            return f"{g} {str(obj[g])[:80]!r} is not a safe name (a name never becomes a path)"
    return None


def read_row_file(path: str | Path, warn=None, root: str | Path | None = None) -> dict | None:
    """The row in ``path``, or None after one warning naming the file and why it is not a row (``read_json_file``:
    not a regular file, too large or too deep, not JSON; ``check_row``: not a row). A finite-looking row's non-finite
    numbers (``NaN``, ``Infinity`` in ``metrics`` / ``train_info``: an old row, before non-finite results failed the
    run) are read as missing (None), with one warning naming them; its ``config_hash`` is recomputed from its
    ``config`` (``row_hash``: committed rows are never rewritten for a new hash rule). The one reader of row files:
    ``make status``, the tables, the export, the findings and ``make study`` all go through it."""
    warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))
    row, why = read_json_file(path, root)
    if why is None:
        why = check_row(row)
    if why:
        warn(f"warning: skipping {path}: {why}")
        return None
    row["config_hash"] = row_hash(row)  # under today's rule, from the recorded config: an edited hash matches nothing
    bad = [f"{k}.{p}" for k in ("metrics", "train_info") if isinstance(row.get(k), dict)
           for p in nonfinite(row[k], replace=True)]
    if bad:
        warn(f"warning: {path}: non-finite {', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''} read as missing "
             f"(a non-finite number is not a result)")
    return row


def read_rows_in(directory: str | Path, with_mtime: bool = False, warn=None) -> list:
    """Every row (``*.json``) directly in ``directory``, sorted by file name; anything that is not a row is skipped
    with one warning (``read_row_file``). ``with_mtime``: ``(row, file mtime)`` pairs."""
    out = []
    for f in sorted(Path(directory).glob("*.json")):
        row = read_row_file(f, warn, root=directory)
        if row is None:
            continue
        if with_mtime:
            try:
                out.append((row, f.stat().st_mtime))
            except OSError:  # removed since it was read
                out.append((row, None))
        else:
            out.append(row)
    return out


# ------------------------------------------------------------------------------------------------------ studies
# A row belongs to a study by declaration: the study names itself in its config (``study.experiment: <name>``, in
# its experiment YAML, ``experiment/<name>.yaml`` of a config folder, or ``+study.experiment=<name>`` on a command
# line), every row records it (``config.study.experiment``), and the row goes to ``<results>/<name>/runs/``. A row
# of no study (a plain ``run.py``, ``make run``, a sweep without ``experiment=``) goes to ``<results>/runs/``. Each
# study's tables, figures, findings and front page are built from its own folder only (``make tables`` / ``make
# findings``).
# folders of a results directory that are not studies (and names a study may therefore not take)
NOT_STUDIES = frozenset({"runs", "tables", "figures", "export", "archive", "curves", "factors", "jobs", "samples"})


def study_name(name) -> str | None:
    """A declared study name, checked (``harness.safe.check_name``; not a folder a results directory keeps for
    itself, ``NOT_STUDIES``); ``None`` / empty = no study."""
    if name in (None, ""):
        return None
    check_name(name, "study")
    if name in NOT_STUDIES:
        raise ValueError(f"study name {name!r} is a folder the results directory keeps for itself "
                         f"({', '.join(sorted(NOT_STUDIES))}); choose another")
    return name


def study_of(row_or_config: dict) -> str | None:
    """The study a row (or a resolved config) declares, ``config.study.experiment``; ``None`` for a row of no study
    or a name that is not a safe study name (such a row was never written by this harness into a study folder)."""
    cfg = row_or_config.get("config") if "config" in row_or_config else row_or_config
    st = (cfg or {}).get("study") if isinstance(cfg, dict) else None
    name = st.get("experiment") if isinstance(st, dict) else None
    try:
        return study_name(name)
    except ValueError:
        return None


def study_dir(results_dir: str | Path, study: str | None) -> Path:
    """Where a study keeps its rows (``runs/``), tables, figures, findings and front page: ``<results>/<study>``;
    ``<results>`` itself for rows of no study. The name is checked (``study_name``)."""
    study = study_name(study)
    return Path(results_dir) / study if study else Path(results_dir)


def studies(results_dir: str | Path) -> list[str]:
    """The studies a results directory holds: every folder ``<results>/<name>/runs/`` whose name is a study name,
    sorted."""
    out = []
    for d in sorted(Path(results_dir).glob("*/runs")):
        name = d.parent.name
        try:
            if d.is_dir() and study_name(name):
                out.append(name)
        except ValueError:
            continue
    return out


def read_rows(results_dir: str | Path, study: str | None = None, warn=None) -> list[dict]:
    """Every row of one study (``<results>/<study>/runs/``), or of no study (``study`` None: ``<results>/runs/``);
    anything there that is not a row is skipped with a warning naming it. A row that declares another study than
    the folder it sits in is skipped with one line naming it and where it belongs (it never joins a study it did not
    declare). Rows that declare no study are read as members of the folder's study (rows written before rows recorded
    their study: the folder is their declaration)."""
    warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))
    d = study_dir(results_dir, study)
    out = []
    for f in sorted(Path(d, "runs").glob("*.json")):
        row = read_row_file(f, warn, root=Path(d, "runs"))
        if row is None:
            continue
        declared = study_of(row)
        if declared is not None and declared != study:
            warn(f"warning: skipping {f}: it declares study {declared!r}, not "
                 + (f"{study!r}" if study else "none") + f" (its place: {study_dir(results_dir, declared)}/runs/)")
            continue
        out.append(row)
    return out
