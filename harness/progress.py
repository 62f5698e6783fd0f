"""Progress a log can follow: plain lines on stderr, flushed, the same in a terminal, a pipe and a Slurm log.

Every stage of a run prints one line when it starts (``stage``) and, while it runs, one line at a steady cadence
(``Ticker``: every ``every_s`` seconds, env ``HARNESS_PROGRESS_S``, default 60; the first call always prints, so a
stage's first unit of work shows at once). Lines start with the wall-clock time, so a log says when each stage began
and how long it ran. The rich bars of ``harness.report`` / ``harness.evals.eval_progress`` are drawn only on a terminal,
on top of these lines, never in a pipe.
"""
from __future__ import annotations

import os
import sys
import time
from datetime import datetime


def every_s() -> float:
    """The cadence of progress lines in seconds (``HARNESS_PROGRESS_S``, default 60)."""
    try:
        return max(0.0, float(os.environ.get("HARNESS_PROGRESS_S", "60")))
    except ValueError:
        return 60.0


def line(message: str) -> None:
    """One progress line on stderr, time-stamped and flushed."""
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def stage(name: str, what: str = "") -> float:
    """The line that says a stage starts; returns its start time (``time.time()``) for ``done``."""
    line(f"{name}: start" + (f" ({what})" if what else ""))
    return time.time()


def done(name: str, t0: float, what: str = "") -> None:
    """The line that says a stage ended and how long it took (wall seconds since ``t0``)."""
    line(f"{name}: done in {time.time() - t0:.1f} s" + (f" ({what})" if what else ""))


class Ticker:
    """``tick(message)`` prints ``message`` (a string, or a function that makes it, called only when printing) on
    the first call and then at most once every ``every_s`` seconds; ``force=True`` prints regardless."""

    def __init__(self, every: float | None = None):
        self.every = every_s() if every is None else every
        self.last: float | None = None

    def tick(self, message, force: bool = False) -> bool:
        now = time.time()
        if force or self.last is None or now - self.last >= self.every:
            self.last = now
            line(message() if callable(message) else message)
            return True
        return False
