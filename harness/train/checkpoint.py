"""Resumable training checkpoints that concurrent runs, kills, full disks and corrupt files cannot turn into wrong
weights.

Layout: ``<paths.ckpt_dir>/<key>/step_N/`` where ``key`` is the run's resume key (``harness.pipeline.resume_key``:
the config of the groups that change the weights plus ``harness.codeversion.train_code_version``, so a re-run after
a code fix never resumes old weights); ``meta.json`` of every checkpoint repeats the key, and a checkpoint of
another key is never loaded.

- Writing: each save goes to its own temporary directory (``.tmp-step_N-<random>``, with the writer's host and pid
  in ``writer.json``), so concurrent runs of one config never share or delete each other's partial checkpoints;
  it is published by a rename to ``step_N`` under an exclusive lock (``filelock``, ``<key>/.lock``) that also
  guards pruning and loading: the ``keep_last`` newest steps stay (the previous one is the fallback of a corrupt
  newest), temporary directories of dead writers on this host are removed. A save that fails (full disk) removes
  its temporary directory before raising, which frees the space the failed row needs.
- Reading: newest first; a checkpoint that fails to load (a file missing, truncated or changed -- ``meta.json``
  records every file's size and SHA-256 -- or unreadable) costs a warning naming the file, and the previous one is
  tried. The digests catch what sizes cannot: bytes flipped inside a tensor (a bad disk block, a partial copy over an
  old file) load without complaint and silently change the weights. Cost: one streaming read of every file at
  publish and again before a resume, files hashed in parallel threads (``DIGEST_THREADS``); SHA-256 runs at ~700 MB/s
  per core on this project's CPU box (2 cores, SHA-NI; measured on a 256 MiB file, 3 reads), so a 110 GB ZeRO-3
  checkpoint of LLaMA2-7B with its optimizer costs about 160 s per save on one core, ~20 s over 8 threads where the
  filesystem delivers the bandwidth. A checkpoint whose ``meta.json`` lacks the digest of a file it lists (written
  before digests existed, or edited) is refused like a damaged one: a warning naming it, then the previous step or
  step 0 (issue 46: one without digests resumed from flipped bytes with no warning).
- Files are created with the umask's permissions, like rows (``share``): safetensors writes 0600, which would hide
  the weights from teammates sharing the directory.
- No pickles: optimizer, scheduler, EMA and RNG states are tensors (safetensors) plus a JSON skeleton
  (``save_state`` / ``load_state``); DeepSpeed's own files are read with ``torch.load(weights_only=True)``
  (``safe_torch_load``).
- A finished run removes its key's checkpoints (``train.keep_checkpoints=true`` keeps them); the key's directory
  and its lock file stay (removing a lock file another run waits on would let two runs hold it).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock
from safetensors.torch import load_file, save_file

from harness.results import FILE_MODE, pid_alive

LOCK_TIMEOUT_S = 3600.0
DIGEST_THREADS = min(8, os.cpu_count() or 1)
KEEP_LAST = 2  # published checkpoints kept per key while training: the newest and its fallback


class CheckpointError(RuntimeError):
    """One file of a checkpoint is missing, truncated or unreadable (``path`` names it)."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)


class OtherKey(CheckpointError):
    """A complete checkpoint of another resume key (never loaded, no warning)."""


def save_error(e: BaseException, root: Path, step: int) -> BaseException:
    """What a failed save raises: an ``OSError`` naming the checkpoint directory and the cause (a full disk's
    safetensors error names no file); interrupts (SIGTERM, Ctrl-C) pass unchanged."""
    if not isinstance(e, Exception):
        return e
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return OSError(f"cannot save checkpoint step_{step} in {root}: {type(e).__name__}: {msg}")


# ------------------------------------------------------------------------------------------ tensors + JSON
def encode(obj, tensors: dict, key: str = "s"):
    """A JSON-able skeleton of ``obj`` whose tensors / arrays are moved into ``tensors`` (name -> tensor)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        if any(t.data_ptr() == u.data_ptr() and t.numel() and u.numel() for u in tensors.values()):
            t = t.clone()  # safetensors refuses tensors sharing memory
        tensors[key] = t
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        dtype = np.int64 if obj.dtype.kind in "iu" else obj.dtype
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).astype(dtype))
        return {"__ndarray__": key, "dtype": str(obj.dtype)}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, tensors, f"{key}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, tensors, f"{key}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode(v, tensors, f"{key}.{k}") for k, v in obj.items()}
        return {"__items__": [[encode(k, tensors, f"{key}.k{i}"), encode(v, tensors, f"{key}.{i}")]
                              for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint without pickle ({key})")


def decode(skel, tensors: dict):
    if isinstance(skel, list):
        return [decode(v, tensors) for v in skel]
    if isinstance(skel, dict):
        if "__tensor__" in skel:
            return tensors[skel["__tensor__"]]
        if "__ndarray__" in skel:
            return tensors[skel["__ndarray__"]].numpy().astype(skel["dtype"])
        if "__tuple__" in skel:
            return tuple(decode(v, tensors) for v in skel["__tuple__"])
        if "__items__" in skel:
            return {decode(k, tensors): decode(v, tensors) for k, v in skel["__items__"]}
        return {k: decode(v, tensors) for k, v in skel.items()}
    return skel


def save_state(directory: Path, name: str, obj) -> None:
    """``obj`` (nested dicts / lists / tuples of tensors, arrays and plain values) as ``<name>.safetensors`` +
    ``<name>.json``."""
    tensors: dict = {}
    skel = encode(obj, tensors)
    save_file(tensors, str(Path(directory) / f"{name}.safetensors"))
    (Path(directory) / f"{name}.json").write_text(json.dumps(skel))


def load_state(directory: Path, name: str):
    st, js = Path(directory) / f"{name}.safetensors", Path(directory) / f"{name}.json"
    tensors = read_file(st, load_file)
    skel = read_file(js, lambda p: json.loads(Path(p).read_text()))
    try:
        return decode(skel, tensors)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(js, f"does not match {st.name} ({type(e).__name__}: {e})") from None


def read_file(path: Path, reader):
    """``reader(path)``, with any failure turned into a ``CheckpointError`` naming ``path``."""
    try:
        return reader(str(path))
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors, json, torch and OS errors alike
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(path, f"{type(e).__name__}: {first}") from None


def safe_torch_load(path, map_location=None, allowed: list | tuple = ()):
    """``torch.load`` without arbitrary unpickling (``weights_only=True``); ``allowed``: the few plain classes a
    library's checkpoint holds besides tensors (DeepSpeed's, see ``deepspeed_engine``), allow-listed by name."""
    with torch.serialization.safe_globals(list(allowed)):
        return read_file(path, lambda p: torch.load(p, map_location=map_location, weights_only=True))


# ------------------------------------------------------------------------------------------ digests, permissions
def sha256_file(path: str | Path, block: int = 1 << 20) -> str:
    """The SHA-256 of a file, read in ``block``-byte pieces (never the whole file in memory); a read error is a
    ``CheckpointError`` naming the file."""
    def digest(p):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(block):
                h.update(chunk)
        return h.hexdigest()

    return read_file(Path(path), digest)


def digest_files(files: list) -> list[str]:
    """``sha256_file`` of each file, in order, over ``DIGEST_THREADS`` threads (hashlib releases the GIL)."""
    if len(files) <= 1 or DIGEST_THREADS <= 1:
        return [sha256_file(f) for f in files]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(DIGEST_THREADS, len(files))) as ex:
        return list(ex.map(sha256_file, files))


def share(directory: str | Path) -> None:
    """Give every file under ``directory`` the umask's permissions (``harness.results.FILE_MODE``, 0644 under 022)
    and every directory the listable ones (0755): what ``open()`` / ``mkdir`` would give, where safetensors (and
    ``tempfile``) give 0600 / 0700. A file another user owns (a shared filesystem) is left as it is."""

    root = Path(directory)
    for p in [root, *root.rglob("*")]:
        try:
            if p.is_symlink():
                continue
            os.chmod(p, _dir_mode() if p.is_dir() else FILE_MODE)
        except OSError:
            pass


# ------------------------------------------------------------------------------------------ the store
def _dir_mode() -> int:
    return FILE_MODE | ((FILE_MODE & 0o444) >> 2)  # r -> rx: directories teammates can list (0755 under 022)


class Store:
    """The checkpoints of one resume key (see the module docstring)."""

    def __init__(self, root: str | Path, key: str, keep_last: int = KEEP_LAST):
        self.root = Path(root)  # the key's directory
        self.key = key
        self.keep_last = max(1, int(keep_last))

    def lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".lock"), timeout=LOCK_TIMEOUT_S, mode=0o666)

    # -- writing
    def new_tmp(self, step: int) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-step_{step}-", dir=self.root))
        os.chmod(tmp, _dir_mode())  # mkdtemp's 0700 would hide the published checkpoint from teammates
        (tmp / "writer.json").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
        return tmp

    def publish(self, tmp: Path, step: int, meta: dict) -> Path:
        """Record ``meta`` (plus every file's size and SHA-256) in ``tmp`` and rename it to ``step_<step>`` under
        the lock."""
        files = [f for f in sorted(tmp.rglob("*")) if f.is_file() and f.name != "writer.json"]
        sizes = {str(f.relative_to(tmp)): f.stat().st_size for f in files}
        digests = dict(zip(sizes, digest_files(files)))
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step, "key": self.key, "files": sizes,
                                                   "sha256": digests}))
        share(tmp)
        final = self.root / f"step_{step}"
        with self.lock():
            if final.exists():  # a concurrent run of the same config published this step first
                shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)  # atomic: a step directory is complete or absent
            self._prune()
        return final

    def discard(self, tmp: Path | None) -> None:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    def _prune(self) -> None:
        steps = self.steps()
        for d in steps[self.keep_last:]:
            shutil.rmtree(d, ignore_errors=True)
        for t in self.root.glob(".tmp-step_*"):
            if _writer_dead(t):
                shutil.rmtree(t, ignore_errors=True)

    # -- reading
    def steps(self) -> list[Path]:
        """Published checkpoints of this key, newest first (by the step in the directory name)."""
        out = []
        for d in self.root.glob("step_*"):
            try:
                out.append((int(d.name.split("_", 1)[1]), d))
            except ValueError:
                continue
        return [d for _, d in sorted(out, reverse=True)]

    def verify(self, d: Path, digests: bool = True) -> dict:
        """``meta.json`` of ``d`` after checking that every recorded file exists with its recorded size and, with
        ``digests``, its recorded SHA-256, which every listed file must have (the
        DeepSpeed engine hashes on rank 0 only and shares the verdict: one read of the checkpoint, not one per
        rank)."""
        meta = read_file(d / "meta.json", lambda p: json.loads(Path(p).read_text()))
        if not isinstance(meta, dict):
            raise CheckpointError(d / "meta.json", f"not a JSON object ({type(meta).__name__})")
        if meta.get("key") != self.key:
            raise OtherKey(d / "meta.json", f"belongs to key {meta.get('key')!r}, not {self.key!r}")
        for rel, size in (meta.get("files") or {}).items():
            f = d / rel
            if not f.is_file():
                raise CheckpointError(f, "missing")
            if f.stat().st_size != size:
                raise CheckpointError(f, f"{f.stat().st_size} bytes, {size} when written (truncated or damaged)")
        recorded = (meta.get("sha256") or {}) if digests else {}
        if digests:
            files = meta.get("files")
            missing = sorted(set(files or {}) - set(recorded)) if isinstance(files, dict) else ["(no file list)"]
            if missing or not isinstance(recorded, dict):
                # sizes alone do not catch bytes flipped inside a tensor: a checkpoint that cannot prove its bytes
                # is not resumed (written before digests existed, or its meta.json edited)
                raise CheckpointError(d / "meta.json", f"no SHA-256 digest of {', '.join(missing[:3])} (written "
                                                       f"before digests or edited): not resumed without one")
        rels = list(recorded)
        for rel, got in zip(rels, digest_files([d / r for r in rels])):
            if got != recorded[rel]:
                raise CheckpointError(d / rel, f"SHA-256 {got[:12]}..., {str(recorded[rel])[:12]}... when written "
                                               f"(its bytes changed after it was written)")
        return meta

    def load_newest(self, loader, warn=None):
        """``(step dir, meta, loader(dir, meta))`` of the newest checkpoint that loads, or ``(None, None, None)``.
        Each one that does not costs a warning naming the bad file. Runs under the lock, so no concurrent run
        prunes a checkpoint while it is read."""
        warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))
        if not self.root.is_dir():
            return None, None, None
        with self.lock():
            steps = self.steps()
            for i, d in enumerate(steps):
                try:
                    meta = self.verify(d)
                    return d, meta, loader(d, meta)
                except OtherKey:
                    continue
                except CheckpointError as e:
                    nxt = f"falling back to {steps[i + 1]}" if i + 1 < len(steps) else "starting from step 0"
                    warn(f"warning: checkpoint file {e.path} is unusable ({str(e).split(': ', 1)[-1]}); {nxt}")
        return None, None, None

    # -- the end
    def cleanup(self) -> None:
        """Remove this key's checkpoints (a finished run; its weights are in the run directory)."""
        if not self.root.is_dir():
            return
        with self.lock():
            for d in self.steps():
                shutil.rmtree(d, ignore_errors=True)
            for t in self.root.glob(".tmp-step_*"):
                if _writer_dead(t) or _writer_is_me(t):
                    shutil.rmtree(t, ignore_errors=True)
        # the directory and its lock file stay: removing a lock file another run may be waiting on would let two
        # runs hold "the" lock at once


def _writer(t: Path) -> dict:
    try:
        return json.loads((t / "writer.json").read_text())
    except (OSError, ValueError):
        return {}


def _writer_is_me(t: Path) -> bool:
    w = _writer(t)
    return w.get("host") == socket.gethostname() and w.get("pid") == os.getpid()


def _writer_dead(t: Path) -> bool:
    """A temporary directory whose writer (on this host) no longer runs, or one without a writer record that is
    older than a day."""

    w = _writer(t)
    if not w:
        try:
            import time

            return time.time() - t.stat().st_mtime > 86400
        except OSError:
            return False
    return w.get("host") == socket.gethostname() and not pid_alive(w.get("pid", 0))
