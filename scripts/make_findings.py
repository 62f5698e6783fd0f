"""`make findings`: each study's findings.md from its own rows, results/<study>/runs/*.json -> results/<study>/
findings.md (the paper's thirteen findings, coded verdicts), and results/findings.md from the rows of no study.

    python scripts/make_findings.py [--results results] [--study NAME] [--out FILE] [--model tiny_llama]
    python scripts/make_findings.py --runs results/archive/<study> --out results/archive/<study>/findings.md
"""
from __future__ import annotations

import sys

from controlled_study.tools import findings as main

if __name__ == "__main__":
    sys.exit(main())
