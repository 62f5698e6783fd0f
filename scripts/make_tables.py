"""`make tables`: regenerate results/tables/*.md|.tex and results/figures/*.png|.pdf from results/runs/*.json.

    python scripts/make_tables.py [--results results] [--tables DIR] [--figures DIR] [--no-figures]
    python scripts/make_tables.py --runs results/archive/<study> --tables results/archive/<study>/tables \
        --figures results/archive/<study>/figures        # an archived study
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.safe import env_setting

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=env_setting("HARNESS_RESULTS_DIR", str(ROOT / "results")),
                    help="results directory (reads <results>/runs/; default $HARNESS_RESULTS_DIR, where run.py "
                         "writes the rows, else results)")
    ap.add_argument("--tables", default=None, help="output directory for tables (default <results>/tables)")
    ap.add_argument("--figures", default=None, help="output directory for figures (default <results>/figures)")
    ap.add_argument("--no-figures", action="store_true")
    ap.add_argument("--runs", default=None, help="read the rows (*.json) from this directory instead of <results>/runs")
    a = ap.parse_args(argv)
    t0 = time.time()
    from harness.tables import build_all

    try:
        out = build_all(a.results, a.tables, a.figures, figures=not a.no_figures, runs_dir=a.runs)
    except OSError as e:  # a full or read-only disk: every file is written by a rename, so the previous ones stay
        print(f"make tables: cannot write {e.filename or ''}: {e.strerror or e} (the previous version is kept)",
              file=sys.stderr)
        return 1
    print(f"{out['rows']} rows -> {len(out['tables'])} tables, {len(out['figures'])} figure files "
          f"in {time.time() - t0:.1f}s")
    for t in out["tables"]:
        print(f"  {t.id}")
    for p in out["figures"]:
        if p.suffix == ".png":
            print(f"  {p}")
    for m in out["errors"]:
        print(f"NOT BUILT: {m}", file=sys.stderr)
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
