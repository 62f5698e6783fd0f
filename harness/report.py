"""Console output: a rich progress bar for fine-tuning and a short summary table of the row."""
from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)


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


def _fmt(v, ci=None):
    if isinstance(v, float):
        if not (isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci)):
            return f"{v:.3g}" if abs(v) >= 100 else f"{v:.3f}"
        f = (lambda x: f"{x:.1f}") if abs(v) >= 10 else (lambda x: f"{x:.2f}")  # noqa: E731
        return f"{f(v)} [{f(ci[0])},{f(ci[1])}]"
    return "—" if v is None else str(v)


PRIMARY = ("accuracy", "ppl", "score", "average")  # the metric an evaluator's ``ci`` belongs to


def summary(row: dict) -> Table:
    """The row's per-length metrics, each with its 95% interval where the evaluator stored one (``ci``)."""
    t = Table(title=f"run {row['run_id']}  {row.get('model')} / {row.get('method')} / train={row.get('train')}  "
                    f"[{row['status']}]", caption="[95% interval]: Wilson (accuracies, scores), bootstrap over "
                                              "documents (PPL); n per cell in the row")
    lengths: list[str] = []
    series = []
    for key, m in (row.get("metrics") or {}).items():
        if not isinstance(m, dict):
            continue
        for metric, val in m.items():
            if metric in ("ci", "per_sample", "correct", "depth", "task_ci"):
                continue
            if isinstance(val, dict) and val and all(str(k).isdigit() for k in val) and \
                    not isinstance(next(iter(val.values())), (dict, list)):
                ci = m.get("ci") if metric in PRIMARY and isinstance(m.get("ci"), dict) else {}
                series.append((f"{key}.{metric}", val, ci))
                lengths += [k for k in val if k not in lengths]
    lengths.sort(key=int)
    t.add_column("metric", no_wrap=True)
    for L in lengths:
        t.add_column(L, justify="right")
    for name, val, ci in series:
        t.add_row(name, *[_fmt(val.get(L), ci.get(L)) for L in lengths])
    return t
