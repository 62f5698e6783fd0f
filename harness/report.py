"""Console output: a rich progress bar for fine-tuning (stderr, with warnings and errors) and a short summary table
of the row with the row's path (stdout: what a script captures)."""
from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)  # progress, warnings, errors
out = Console()  # results: the summary table and the row path


class TrainProgress:
    def __init__(self):
        self.p = Progress(TextColumn("fine-tune"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                          TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:.0f} tok/s"),
                          TimeRemainingColumn(), console=console, transient=False,
                          refresh_per_second=2)  # its render thread: ~0.8% of a core at rich's default 10 Hz
        self.task = None

    def __call__(self, step, total, loss, tps):
        if self.task is None:
            self.p.start()
            self.task = self.p.add_task("train", total=total, loss=loss, tps=tps)
        self.p.update(self.task, completed=step, loss=loss, tps=tps)
        if step >= total:
            self.p.stop()


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) >= 100 else f"{v:.3f}"
    return "—" if v is None else str(v)


def summary(row: dict) -> Table:
    t = Table(title=f"run {row['run_id']}  {row.get('model')} / {row.get('method')} / train={row.get('train')}  "
                    f"[{row['status']}]")
    lengths: list[str] = []
    series = []
    for key, m in (row.get("metrics") or {}).items():
        for metric, val in m.items():
            if isinstance(val, dict) and val and all(k.isdigit() for k in val) and not isinstance(next(iter(val.values())), (dict, list)):
                series.append((f"{key}.{metric}", val))
                lengths += [k for k in val if k not in lengths]
    lengths.sort(key=int)
    t.add_column("metric")
    for L in lengths:
        t.add_column(L, justify="right")
    for name, val in series:
        t.add_row(name, *[_fmt(val.get(L)) for L in lengths])
    return t


def print_summary(row: dict) -> None:
    """The summary table on stdout (also after a failure, when something was measured)."""
    if row.get("status") == "ok" or row.get("metrics"):
        out.print(summary(row))
