"""Reading a results folder safely: bounded JSON files (``read_json_file``), what makes a parsed file a row
(``check_row``), and the one reader of row files (``read_row_file``, ``read_rows_in``)."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from harness.results.schema import GROUPS, row_hash
from harness.safe import is_safe_name, nonfinite

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
