"""`make findings`: each study's findings.md from its own rows, results/<study>/runs/*.json -> results/<study>/
findings.md (the paper's thirteen findings, coded verdicts), and results/findings.md from the rows of no study.

    python scripts/make_findings.py [--results results] [--study NAME] [--out FILE] [--model tiny_llama]
    python scripts/make_findings.py --runs results/archive/<study> --out results/archive/<study>/findings.md
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
                         "writes, else results/)")
    ap.add_argument("--out", default=None, help="output file (default <results>/findings.md)")
    ap.add_argument("--model", default=None, help="model to test (default: the one with the most configurations)")
    ap.add_argument("--runs", default=None, help="read the rows (*.json) from this directory instead of <results>/runs")
    ap.add_argument("--study", default=None, help="only this study (results/<study>/runs/); default: every study, "
                    "then the rows of no study (results/runs/) when there are any")
    a = ap.parse_args(argv)
    t0 = time.time()
    from controlled_study.findings import VERDICTS, write
    from harness.results import studies

    if a.runs or a.out or a.study:
        which = [a.study]
    else:
        which = studies(a.results) + ([None] if any(Path(a.results, "runs").glob("*.json")) else [])
    try:
        paths = [write(a.results, a.out, a.model, a.runs, study=s) for s in which]
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


if __name__ == "__main__":
    sys.exit(main())
