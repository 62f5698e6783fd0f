"""`make tables`: each study's tables and figures from its own rows (results/<study>/runs/*.json -> results/<study>/
tables/*.md|.tex, figures/*.png|.pdf, README.md), the rows of no study (results/runs/ -> results/tables, figures),
and the index of studies, results/README.md.

    python scripts/make_tables.py [--results results] [--study NAME] [--no-figures]
    python scripts/make_tables.py --study NAME --tables DIR --figures DIR     # one study, elsewhere
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
    ap.add_argument("--study", default=None, help="build only this study (results/<study>/runs/); default: every "
                    "study, then the rows of no study")
    a = ap.parse_args(argv)
    t0 = time.time()
    from controlled_study import build_all, build_studies

    try:
        if a.runs or a.tables or a.figures:  # one set of rows into the folders named
            outs = [{"study": a.study, **build_all(a.results, a.tables, a.figures, figures=not a.no_figures,
                                                   runs_dir=a.runs, study=a.study)}]
        else:
            outs = build_studies(a.results, figures=not a.no_figures, only=a.study)
    except (OSError, ValueError) as e:  # a full or read-only disk (every file is written by a rename, so the previous
        # ones stay), or a study name that cannot be a folder
        what = f"cannot write {e.filename or ''}: {e.strerror or e}" if isinstance(e, OSError) else str(e)
        print(f"make tables: {what} (the previous version is kept)", file=sys.stderr)
        return 1
    errors = []
    for out in outs:
        where = f"study {out['study']}" if out["study"] else "rows of no study (results/runs/)"
        print(f"{where}: {out['rows']} rows -> {len(out['tables'])} tables, {len(out['figures'])} figure files")
        for t in out["tables"]:
            print(f"  {t.id}")
        for p in out["figures"]:
            if p.suffix == ".png":
                print(f"  {p}")
        errors += out["errors"]
    for m in errors:
        print(f"NOT BUILT: {m}", file=sys.stderr)
    print(f"make tables: {len(outs)} set(s) of rows in {time.time() - t0:.1f}s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
