"""Atomic writes: a file (temp file + rename, the umask's permissions) and whole folders swapped at once
(``replacing_dirs``), with the signals that would interrupt a swap held."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path


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
