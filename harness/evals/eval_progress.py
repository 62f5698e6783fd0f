"""Evaluation progress (``harness.report`` re-exports it for ``run.py``; the data-parallel ranks use it too)."""
from __future__ import annotations

import os
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from harness import progress as plog

console = Console(stderr=True)


def _secs(s: float) -> str:
    """Seconds as a log line says them: tenths below 10 s (a fast prompt set is not "0 s")."""
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


class EvalProgress:
    """Evaluation progress, one call per finished prompt (``harness.evals.EvalContext.map``:
    ``progress(entry, done, total)``). On a terminal: a rich bar per suite entry and prompt set, with the input length
    the model last saw and an ETA. Elsewhere (Slurm logs, pipes): one plain line every ``every_s`` seconds
    (``HARNESS_PROGRESS_S``, default 60) and one when a prompt set is done, so a long evaluation is never silent.
    ``tokens`` (a dict the pipeline's length watcher fills: ``tokens`` = the decoder's latest input + cache) adds the
    length to each line."""

    def __init__(self, every_s: float | None = None, terminal: bool | None = None, write=None):
        self.every_s = float(os.environ.get("HARNESS_PROGRESS_S") or "60") if every_s is None else every_s
        self.terminal = console.is_terminal if terminal is None else terminal
        self.write = write or plog.line
        self.tokens: dict = {}
        self.p, self.task, self.key, self.t0, self.last = None, None, None, 0.0, 0.0
        self.mark: float | None = None   # when the next prompt set's clock starts (``begin``, or the last set's end)

    def begin(self, entry: str) -> None:
        """The suite entry ``entry`` starts now (``pipeline.evaluations``): its first prompt set's time counts from
        here, so printed times include every prompt, the first one too."""
        self._close()
        self.key, self.mark = None, time.time()

    def __call__(self, entry: str, done: int, total: int) -> None:
        now = time.time()
        key = (entry, total)
        first = key != self.key or done == 1
        if first:  # a new prompt set (the next length, the next entry)
            self._close()
            start = self.mark if self.mark is not None else now - 1e-9
            self.key, self.t0, self.last = key, start, now
            if self.terminal:
                self.p = Progress(TextColumn("eval {task.fields[entry]}"), BarColumn(),
                                  TextColumn("{task.completed}/{task.total} prompts"), TextColumn("{task.fields[at]}"),
                                  TimeRemainingColumn(), console=console, transient=False, refresh_per_second=2)
                self.p.start()
                self.task = self.p.add_task("eval", total=total, entry=entry, at="")
        at = f"at {self.tokens['tokens']} tokens" if self.tokens.get("tokens") else ""
        if self.p is not None:
            self.p.update(self.task, completed=done, at=at)
        elif first or done >= total or now - self.last >= self.every_s:   # the first prompt of a set at once
            rate = (now - self.t0) / max(1, done)
            eta = f", ETA {_secs(rate * (total - done))}" if done < total else ""
            self.write(f"eval {entry}: {done}/{total} prompts{' ' + at if at else ''}, {_secs(now - self.t0)}{eta}")
            self.last = now
        if done >= total:
            self._close()
            self.key, self.mark = None, now   # the next set's clock starts where this one ended

    def _close(self) -> None:
        if self.p is not None:
            self.p.stop()
        self.p, self.task = None, None
