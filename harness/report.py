"""Console output: a rich progress bar for fine-tuning (stderr, with warnings and errors) and a short summary table
of the row with the row's path (stdout: what a script captures)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from harness import progress as plog
from harness.evals import EVALS
from harness.evals.eval_progress import EvalProgress  # noqa: F401 - run.py's evaluation progress, beside the training bar
from harness.results import read_rows_in
from harness.stats import ppl_ratio, wilson

console = Console(stderr=True)  # progress, warnings, errors
out = Console()  # results: the summary table and the row path


class TrainProgress:
    """Fine-tuning progress (``progress(step, total, loss, tokens_per_s, lr)``): a plain line (``harness.progress``)
    at the first step, then every ``HARNESS_PROGRESS_S`` seconds and at the last, with loss, tokens/s, the elapsed
    time and an estimate of what is left, in a terminal and in a pipe alike; on a terminal a rich bar as well.
    ``on_step`` also gets every step (``tracking``: loss, learning rate and tokens/s to wandb)."""

    def __init__(self, on_step=None, terminal: bool | None = None, every_s: float | None = None):
        self.on_step = on_step
        self.terminal = console.is_terminal if terminal is None else terminal
        self.ticker = plog.Ticker(every_s)
        self.t0 = None
        self.p = Progress(TextColumn("fine-tune"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                          TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:.0f} tok/s"),
                          TimeRemainingColumn(), console=console, transient=False,
                          refresh_per_second=2) if self.terminal else None  # no live display in a pipe
        self.task = None

    def __call__(self, step, total, loss, tps, lr=None):
        import time

        if self.on_step is not None:
            self.on_step(step, total, loss, tps, lr)
        now = time.time()
        if self.t0 is None:
            self.t0 = now
        elapsed = now - self.t0
        left = elapsed / max(1, step - 1) * (total - step) if step > 1 else None
        self.ticker.tick(lambda: f"fine-tune: step {step}/{total}, loss {loss:.3f}, {tps:.0f} tok/s"
                         + (f", lr {lr:.2e}" if lr is not None else "") + f", {elapsed:.0f} s"
                         + (f", ~{left:.0f} s left" if left is not None and step < total else ""),
                         force=step >= total)
        if self.p is None:
            return
        if self.task is None:
            self.p.start()
            self.task = self.p.add_task("train", total=total, loss=loss, tps=tps)
        self.p.update(self.task, completed=step, loss=loss, tps=tps)
        if step >= total:
            self.p.stop()


def _fmt(v, ci=None):
    if isinstance(v, float):
        if not (isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci)):
            return f"{v:.3g}" if abs(v) >= 100 else f"{v:.3f}"
        f = (lambda x: f"{x:.1f}") if abs(v) >= 10 else (lambda x: f"{x:.2f}")
        return f"{f(v)} [{f(ci[0])},{f(ci[1])}]"
    return "—" if v is None else str(v)


def headline(row: dict, entry: str) -> str | None:
    """The metric the evaluator of suite entry ``entry`` declares as its headline (``metric``, harness.evals): the
    one its ``ci`` belongs to. None for an evaluator this harness no longer has."""
    node = ((((row.get("config") or {}).get("eval") or {}).get("suite") or {}).get(entry) or {})
    name = node.get("name") if isinstance(node, dict) else None
    return EVALS.spec(name or entry).metric if (name or entry) in EVALS else None


def summary(row: dict) -> Table:
    """The row's per-length metrics; each evaluator's headline metric with its 95% interval where the evaluator
    stored one (``ci``)."""
    t = Table(title=f"run {row['run_id']}  {row.get('model')} / {row.get('method')} / train={row.get('train')}  "
                    f"[{row['status']}]", caption="[95% interval]: Wilson (accuracies, scores), Student t over "
                                              "documents (PPL); n per cell in the row")
    lengths: list[str] = []
    series = []
    for key, m in (row.get("metrics") or {}).items():
        if not isinstance(m, dict):
            continue
        main = headline(row, key)
        for metric, val in m.items():
            if metric in ("ci", "per_sample", "correct", "depth", "task_ci"):
                continue
            if isinstance(val, dict) and val and all(str(k).isdigit() for k in val) and \
                    not isinstance(next(iter(val.values())), (dict, list)):
                ci = m.get("ci") if metric == main and isinstance(m.get("ci"), dict) else {}
                series.append((f"{key}.{metric}", val, ci))
                lengths += [k for k in val if k not in lengths]
    lengths.sort(key=int)
    t.add_column("metric", no_wrap=True)
    for L in lengths:
        t.add_column(L, justify="right")
    for name, val, ci in series:
        t.add_row(name, *[_fmt(val.get(L), ci.get(L)) for L in lengths])
    return t


def versus_base(row: dict, results_dir) -> str | None:
    """One line: what the run changed against the frozen base model evaluated with the same suite and seed (the
    newest such row in ``results_dir``), per length, with 95% intervals: passkey accuracy (Wilson) and books
    perplexity (the ratio to the base, paired Student t over the same windows). ``None`` when there is no such base
    row (``make run`` writes one first)."""
    if row.get("method") == "base" and not row.get("train_info"):
        return None
    cfg = row.get("config") or {}
    best = None
    # the rows beside this one (its study's folder, or the rows of no study): the one bounded reader; warnings are
    # make status's job
    for r in read_rows_in(Path(results_dir, "runs"), warn=lambda m: None):
        rc = r.get("config") or {}
        if (r.get("status") == "ok" and r.get("method") == "base" and not r.get("train_info")
                and r.get("model") == row.get("model") and rc.get("eval") == cfg.get("eval")
                and rc.get("seed") == cfg.get("seed") and rc.get("model") == cfg.get("model")):
            best = r
    if best is None:
        return None
    parts = []
    pk, pk0 = (row["metrics"].get("passkey") or {}), (best["metrics"].get("passkey") or {})
    n = int(pk.get("samples_per_length") or 0)
    for L, v in (pk.get("accuracy") or {}).items():
        v0 = (pk0.get("accuracy") or {}).get(L)
        if v0 is None:
            continue
        lo, hi = wilson(round(v * n), n) if n else (float("nan"), float("nan"))
        parts.append(f"passkey@{L} {v0:.2f} -> {v:.2f} [{lo:.2f}, {hi:.2f}]")
    books, books0 = row["metrics"].get("ppl_books") or {}, best["metrics"].get("ppl_books") or {}
    pp, pp0 = books.get("ppl") or {}, books0.get("ppl") or {}
    for L, v in pp.items():
        if pp0.get(L):
            # paired Student t over the same windows (per-window mean NLL, in window order) when both rows have them
            r = ppl_ratio((books.get("per_sample") or {}).get(L) or [], (books0.get("per_sample") or {}).get(L) or [])
            ci = f" [{r[1]:.2f}, {r[2]:.2f}]" if r else ""
            parts.append(f"books PPL@{L} {pp0[L]:.1f} -> {v:.1f} (x{v / pp0[L]:.2f}{ci})")
    return f"vs base (row {best['run_id']}, n = {n} passkey prompts per length): " + "; ".join(parts)


def convergence_line(row: dict) -> str | None:
    """One line: the fine-tuned row's convergence gate (``harness.evals.convergence``) with its intervals."""
    c = (row.get("train_info") or {}).get("convergence")
    if not c:
        return None
    r, pk = c.get("ppl_ratio_vs_base") or {}, c["passkey"]
    ratio = f"{r['value']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] ({r['documents']} docs)" if r else "n/a"
    return (f"convergence gate {'PASSED' if c['converged'] else 'NOT passed (kept out of comparisons)'}: "
            f"PPL(C) / base {ratio}, passkey(C) {pk['value']:.2f} [{pk['ci'][0]:.2f}, {pk['ci'][1]:.2f}] "
            f"(n={pk['n']}); rule: {c['rule']}")


def print_summary(row: dict) -> None:
    """The summary table on stdout (also after a failure, when something was measured)."""
    if row.get("status") == "ok" or row.get("metrics"):
        out.print(summary(row))
