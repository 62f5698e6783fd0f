"""`make export`: every row of results/runs/ as one flat table (CSV + Parquet), controlled_study/export.py.

    python scripts/export_rows.py [--results results] [--out results/export]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.safe import env_setting

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=env_setting("HARNESS_RESULTS_DIR", str(ROOT / "results")),
                    help="results directory (reads <results>/runs/; default $HARNESS_RESULTS_DIR, where run.py "
                         "writes, else results/)")
    ap.add_argument("--out", default=None, help="output directory (default <results>/export)")
    a = ap.parse_args(argv)
    from controlled_study.export import frame, write

    try:
        paths = write(a.results, a.out)
    except OSError as e:  # written by a rename: the previous export stays
        print(f"make export: cannot write {e.filename or ''}: {e.strerror or e} (the previous export is kept)",
              file=sys.stderr)
        return 1
    df = frame(a.results)
    print(f"{paths[0]} and {paths[1].name}: {len(df)} lines from {df['run_id'].nunique()} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
