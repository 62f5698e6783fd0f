"""The controlled study's own tools, run by ``harness <tool>`` (registered in ``pyproject.toml`` under the entry-point
group ``harness.tools``, which ``harness/cli.py`` reads: the library's command never imports the study) and by the
checkout's ``scripts/make_tables.py``, ``make_findings.py`` and ``export_rows.py``, which call these functions.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from controlled_study import build_all, build_studies
from controlled_study.export import frame
from controlled_study.export import write as write_export
from controlled_study.findings import VERDICTS
from controlled_study.findings import write as write_findings
from harness.results import studies
from harness.safe import env_setting

ROOT = Path(__file__).resolve().parents[1]  # the checkout (an editable install): its results/


def tables(argv=None) -> int:
    r"""per study: the paper's tables and figures from results/<study>/runs (`make tables`).

    Each study's tables and figures from its own rows (results/<study>/runs/*.json ->
    results/<study>/tables/*.md|.tex, figures/*.png|.pdf, README.md), the rows of no study (results/runs/ ->
    results/tables, figures), and the index of studies, results/README.md.

        python scripts/make_tables.py [--results results] [--study NAME] [--no-figures]
        python scripts/make_tables.py --study NAME --tables DIR --figures DIR     # one study, elsewhere
        python scripts/make_tables.py --runs results/archive/<study> --tables results/archive/<study>/tables \
            --figures results/archive/<study>/figures        # an archived study
    """
    ap = argparse.ArgumentParser(description=tables.__doc__.splitlines()[0])
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


def findings(argv=None) -> int:
    """per study: the paper's findings tested on its rows (`make findings`).

    Each study's findings.md from its own rows, results/<study>/runs/*.json -> results/<study>/
    findings.md (the paper's thirteen findings, coded verdicts), and results/findings.md from the rows of no study.

        python scripts/make_findings.py [--results results] [--study NAME] [--out FILE] [--model tiny_llama]
        python scripts/make_findings.py --runs results/archive/<study> --out results/archive/<study>/findings.md
    """
    ap = argparse.ArgumentParser(description=findings.__doc__.splitlines()[0])
    ap.add_argument("--results", default=env_setting("HARNESS_RESULTS_DIR", str(ROOT / "results")),
                    help="results directory (reads <results>/runs/; default $HARNESS_RESULTS_DIR, where run.py "
                         "writes, else results/)")
    ap.add_argument("--out", default=None, help="output file (default <results>/findings.md)")
    ap.add_argument("--model", default=None, help="model to test (default: the one with the most configurations)")
    ap.add_argument("--runs", default=None, help="read the rows (*.json) from this directory instead of <results>/runs")
    ap.add_argument("--study", default=None, help="only this study (results/<study>/runs/); default: every study, "
                    "then the rows of no study (results/runs/) when there are any")
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.runs or a.out or a.study:
        which = [a.study]
    else:
        which = studies(a.results) + ([None] if any(Path(a.results, "runs").glob("*.json")) else [])
    try:
        paths = [write_findings(a.results, a.out, a.model, a.runs, study=s) for s in which]
    except (OSError, ValueError) as e:  # a full or read-only disk (findings.md is written by a rename, so the previous
        # one stays), or a study name that cannot be a folder
        what = f"cannot write {e.filename or ''}: {e.strerror or e}" if isinstance(e, OSError) else str(e)
        print(f"make findings: {what} (the previous version is kept)", file=sys.stderr)
        return 1
    for p in paths:
        text = p.read_text()
        verdicts = [line.rsplit("| **", 1)[-1].split("**")[0] for line in text.splitlines()
                    if line.startswith("| (") and "| **" in line]  # the findings table (not the per-seed one)
        print(f"{p}: {len(verdicts)} findings "
              f"({', '.join(f'{v} {verdicts.count(v)}' for v in VERDICTS if v in verdicts)})")
    print(f"make findings: {len(paths)} set(s) of rows in {time.time() - t0:.1f}s")
    return 0


def export(argv=None) -> int:
    """every row as one flat table, CSV and Parquet (`make export`).

    Every row of results/runs/ as one flat table (CSV + Parquet), controlled_study/export.py.

        python scripts/export_rows.py [--results results] [--out results/export]
    """
    ap = argparse.ArgumentParser(description=export.__doc__.splitlines()[0])
    ap.add_argument("--results", default=env_setting("HARNESS_RESULTS_DIR", str(ROOT / "results")),
                    help="results directory (reads <results>/runs/; default $HARNESS_RESULTS_DIR, where run.py "
                         "writes, else results/)")
    ap.add_argument("--out", default=None, help="output directory (default <results>/export)")
    a = ap.parse_args(argv)

    try:
        paths = write_export(a.results, a.out)
    except OSError as e:  # written by a rename: the previous export stays
        print(f"make export: cannot write {e.filename or ''}: {e.strerror or e} (the previous export is kept)",
              file=sys.stderr)
        return 1
    df = frame(a.results)
    print(f"{paths[0]} and {paths[1].name}: {len(df)} lines from {df['run_id'].nunique()} rows")
    return 0
