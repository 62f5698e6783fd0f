"""A live row's file: the writer (``write_row``) and the heartbeat that keeps a ``running`` row's time fresh while its
process lives, and how a reader tells a killed run (``liveness``)."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from harness.results.atomic import atomic_write_text
from harness.results.schema import now_iso, row_path

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
