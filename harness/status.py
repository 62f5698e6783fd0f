"""``python -m harness.status [results_dir] [--all]`` (``make status``): every row with its state, where a
``running`` row whose process died or whose heartbeat stopped shows as ``stale`` (``harness.results.liveness``).
Without ``--all``: unfinished and failed rows only."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.results import age_s, liveness, read_rows_in


def _row_states(results_dir: str) -> list[tuple[dict, str]]:
    """Every row with its state; a file that is not a row is skipped with a warning (``results.read_rows_in``)."""
    return [(row, liveness(row, mtime=mtime)) for row, mtime in read_rows_in(Path(results_dir, "runs"),
                                                                              with_mtime=True)]


def _fmt_age(iso) -> str:
    a = age_s(iso)
    if a is None:
        return "-"
    return f"{a:.0f}s" if a < 120 else (f"{a / 60:.0f}m" if a < 7200 else f"{a / 3600:.1f}h")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.status", description=__doc__.split("\n\n")[0])
    p.add_argument("results_dir", nargs="?", default=os.environ.get("HARNESS_RESULTS_DIR", "results"))
    p.add_argument("--all", action="store_true", help="list ok rows too")
    a = p.parse_args(argv)
    rows = _row_states(a.results_dir)
    counts: dict[str, int] = {}
    for _, state in rows:
        counts[state] = counts.get(state, 0) + 1
    shown = [(r, s) for r, s in rows if a.all or s != "ok"]
    print(f"{a.results_dir}/runs: {len(rows)} rows: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if shown:
        print(f"{'run_id':24s} {'state':8s} {'model/method/train':34s} {'host:pid':24s} {'heartbeat':>9s}  error")
    for r, s in shown:
        what = f"{r.get('model')}/{r.get('method')}/{r.get('train')}"
        who = f"{r.get('host') or '?'}:{r.get('pid') or '?'}"
        beat = _fmt_age(r.get("heartbeat")) if s in ("running", "stale") else "-"
        print(f"{str(r.get('run_id')):24s} {s:8s} {what[:34]:34s} {who[:24]:24s} {beat:>9s}  {r.get('error') or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
