"""Progress a log can follow (issue 45): ``run.py`` in a pipe (as in a Slurm log or ``| tee``) prints a line when
each stage starts and its first progress line within seconds of it: loading, the convergence gate, the data cache
(with counts), fine-tuning (step 1 with loss and tokens/s), each evaluator (its first prompt)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT

SMALL = ["eval.lengths=[128,256]", "eval.suite.passkey.samples=4", "eval.suite.ppl_books.samples=2",
         "eval.suite.ppl_books.lengths=[128]", "++train.seq_len=512", "++train.tokens=2048", "++train.global_batch=1",
         "++train.save_every=0"]


def _timed_lines(cmd, env) -> list[tuple[float, str]]:
    """Every line of the process's stdout + stderr (one pipe) with the time it arrived."""
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         bufsize=1)
    out: list = []

    def read():
        for ln in p.stdout:
            out.append((time.monotonic(), ln.rstrip("\n")))

    t = threading.Thread(target=read)
    t.start()
    p.wait(timeout=900)
    t.join()
    assert p.returncode == 0, "\n".join(ln for _, ln in out[-40:])
    return out


def _first(lines, pattern: str, after: float = 0.0) -> float:
    hit = [t for t, ln in lines if t >= after and re.search(pattern, ln)]
    assert hit, f"no line matching {pattern!r}:\n" + "\n".join(ln for _, ln in lines)
    return hit[0]


def _check(tmp_path, fresh_cache: bool) -> None:
    env = dict(os.environ, HARNESS_RESULTS_DIR=str(tmp_path / "res"), HARNESS_OUTPUT_DIR=str(tmp_path / "out"),
               HARNESS_CKPT_DIR=str(tmp_path / "ckpt"), HARNESS_PROGRESS_S="2", PYTHONPATH=str(ROOT))
    if fresh_cache:
        env["HARNESS_CACHE_DIR"] = str(tmp_path / "cache")
    lines = _timed_lines([sys.executable, "run.py", "method=yarn", "train=quick", "eval=run", *SMALL], env)
    text = "\n".join(ln for _, ln in lines)
    assert "\x1b[" not in text and "\r" not in text.replace("Loading weights", "")  # no live display in a pipe
    # (a stage's start line, its first progress line): within seconds of each other
    pairs = [(r"\] load: start", r"\] convergence gate, the base at C: start"),
             (r"\] convergence gate, the base at C: start", r"eval gate ppl_books: \d+/\d+ prompts"),
             (r"\] data: start", r"\] (data cache .*: start|data: done)"),
             (r"\] fine-tune: start", r"\] fine-tune: step 1/\d+, loss \d+\.\d+, \d+ tok/s"),
             (r"\] convergence gate, the fine-tuned model at C: start", r"eval gate passkey: 1/50 prompts"),
             (r"\] eval ppl_books: start", r"eval ppl_books: 2/2 prompts at 128 tokens"),
             (r"\] eval passkey: start", r"eval passkey: 1/4 prompts at \d+ tokens")]
    if fresh_cache:   # the data cache is built: its counts as it goes
        pairs.append((r"\] data cache .*: start \(building 2048 tokens", r"\] data local_mix: .*documents tokenised"))
    for start, first in pairs:
        t0 = _first(lines, start)
        t1 = _first(lines, first, t0)
        assert t1 - t0 < 20, (start, first, round(t1 - t0, 1))
    # while the data cache is built and the model trains, never a silence of more than a few cadences
    t_data, t_eval = _first(lines, r"\] data: start"), _first(lines, r"\] fine-tune: done")
    ts = [t for t, _ in lines if t_data <= t <= t_eval]
    assert max((b - a for a, b in zip(ts, ts[1:])), default=0) < 20
    # the times printed include every prompt: no evaluator reports a set of prompts in "0 s"
    assert not re.search(r"prompts[^\n]*, 0 s\b", text)


@pytest.mark.slow  # ~25 s idle: every stage of a fine-tuned run's output, read as it comes
def test_every_stage_says_it_started_and_shows_its_first_progress_within_seconds(tmp_path):
    """The checkout's data cache (built once): loading, the gates, fine-tuning and every evaluator."""
    _check(tmp_path, fresh_cache=False)


@pytest.mark.slow
def test_a_data_cache_build_prints_its_counts_as_it_goes(tmp_path):
    """A fresh data cache: its build (a minute here, ~8 minutes for SmolLM2's) prints counts at the cadence."""
    _check(tmp_path, fresh_cache=True)
