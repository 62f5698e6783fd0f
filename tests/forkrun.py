"""``run(cmd, ...)``: ``subprocess.run`` for the tests' ``python run.py ...`` / ``python -m harness...`` commands,
without paying the interpreter's imports (~5 s of torch, transformers, hydra) for each one.

A fork server (``multiprocessing``'s ``forkserver``, started once per test session with a snapshot of the
session's environment) imports ``harness.app`` and nothing else; each command is a fresh process forked from it: its
own pid, exit status, environment (set exactly to ``env``), working directory, ``sys.argv`` and file descriptors 1
and 2 (files read back as ``stdout`` / ``stderr``), running the script as ``__main__`` (``runpy``) as the
interpreter would. Nothing runs in the server, so no thread pool exists when it forks.

What a preloaded library reads from the environment when it is imported cannot change per command: a command whose
environment differs from the snapshot in anything but ``HARNESS_*`` variables and ``CALL_TIME``'s (an ``HF_HOME``,
a ``PYTHONHASHSEED``, a ``PYTHONPATH``), one with ``-c`` / ``-X`` options or other ``subprocess`` arguments, one
that is not a Python script or module, or one run in another checkout (its own ``harness``) runs through
``subprocess.run`` unchanged. Tests that signal, kill or time a process keep using ``subprocess`` directly.
"""
from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = dict(os.environ)  # the session's environment, before any test changes it
# set in the test process by what its tests run, and read when used, not when imported: torch's inductor sets its
# cache folder once it compiles; pytest names the running test; Hydra reads HYDRA_FULL_ERROR when a job fails
# (lifecycle.run_guarded sets it in-process); torch reads PYTORCH_NVML_BASED_CUDA_CHECK when asked whether CUDA is
# there (importing deepspeed sets it in-process: every later command fell back to subprocess); sklearn / joblib set
# KMP_* on import (Intel OpenMP's; torch here runs GNU OpenMP), torch's inductor KMP_DUPLICATE_LIB_OK, the engine's
# op prebuild TORCH_EXTENSIONS_DIR (read when an op builds), huggingface_hub HF_XET_HIGH_PERFORMANCE (downloads only)
CALL_TIME = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "TOKENIZERS_PARALLELISM", "HYDRA_FULL_ERROR",
             "PYTORCH_NVML_BASED_CUDA_CHECK", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "TORCH_EXTENSIONS_DIR",
             "HF_XET_HIGH_PERFORMANCE"}
PRELOAD = ["harness.app"]
_CTX: list = []


def _context():
    if not _CTX:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        now = dict(os.environ)
        os.environ.clear()
        os.environ.update(SNAPSHOT)
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(now)
        _CTX.append(ctx)
    return _CTX[0]


def _same_libraries_env(env: dict) -> bool:
    """Whether ``env`` differs from the snapshot only in ``HARNESS_*`` variables."""
    keys = {k for k in set(env) | set(SNAPSHOT) if not k.startswith("HARNESS_") and k not in CALL_TIME}
    return all(env.get(k) == SNAPSHOT.get(k) for k in keys)


def _target(cmd: list[str]) -> tuple[str, str] | None:
    """("path", script) or ("module", name) for ``python script.py ...`` / ``python -m module ...``; else None."""
    if len(cmd) < 2 or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable):
        return None
    if cmd[1] == "-m" and len(cmd) >= 3:
        return "module", cmd[2]
    if cmd[1].endswith(".py") and not cmd[1].startswith("-"):
        return "path", cmd[1]
    return None


def _same_tree(kind: str, name: str, cwd: str) -> bool:
    """Whether the command would import the preloaded ``harness``: no other checkout's ``harness`` folder in its
    working directory or beside its script (a copy of the repository runs its own code)."""
    places = [Path(cwd)]
    if kind == "path":
        script = (Path(cwd) / name).resolve()
        places += [script.parent, script.parent.parent]
    return all(not (p / "harness").is_dir() or (p / "harness").resolve() == ROOT / "harness" for p in places)


def _child(kind: str, name: str, argv: list[str], env: dict, cwd: str, out: str, err: str) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.argv = argv
    try:
        if kind == "path":
            sys.path[0] = str(Path(name).resolve().parent)
            runpy.run_path(name, run_name="__main__")
        else:
            runpy.run_module(name, run_name="__main__", alter_sys=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run(cmd, env: dict | None = None, cwd=None, timeout: float | None = None, capture_output: bool = False,
        text: bool = False, **kw) -> subprocess.CompletedProcess:
    cmd = [str(c) for c in cmd]
    env = dict(os.environ if env is None else env)
    target = _target(cmd)
    if target is None or kw or not capture_output or not text or not _same_libraries_env(env):
        if os.environ.get("FORKRUN_DEBUG") or os.environ.get("FORKRUN_LOG"):
            diff = sorted(k for k in set(env) | set(SNAPSHOT) if env.get(k) != SNAPSHOT.get(k))
            line = f"forkrun: subprocess for {cmd[:3]} (target {target}, kw {sorted(kw)}, env {diff})"
            if os.environ.get("FORKRUN_LOG"):  # a file: one line per fallback, to see what a whole run falls back on
                with open(os.environ["FORKRUN_LOG"], "a") as f:
                    print(os.environ.get("PYTEST_CURRENT_TEST", ""), line, file=f)
            else:
                print(line, file=sys.__stderr__)
        return subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, capture_output=capture_output, text=text, **kw)
    kind, name = target
    cwd = str(cwd or os.getcwd())
    if not _same_tree(kind, name, cwd):
        return subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, capture_output=capture_output, text=text)
    argv = cmd[1:] if kind == "path" else [name, *cmd[3:]]
    with tempfile.TemporaryDirectory() as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        p = _context().Process(target=_child, args=(kind, name, argv, env, cwd, out, err))
        p.start()
        p.join(timeout)
        if p.exitcode is None:
            p.kill()
            p.join()
            raise subprocess.TimeoutExpired(cmd, timeout)
        read = [Path(x).read_text(encoding="utf-8", errors="replace") if os.path.exists(x) else "" for x in (out, err)]
    return subprocess.CompletedProcess(cmd, p.exitcode, read[0], read[1])
