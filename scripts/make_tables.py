"""`make tables`: each study's tables and figures from its own rows (results/<study>/runs/*.json -> results/<study>/
tables/*.md|.tex, figures/*.png|.pdf, README.md), the rows of no study (results/runs/ -> results/tables, figures),
and the index of studies, results/README.md.

    python scripts/make_tables.py [--results results] [--study NAME] [--no-figures]
    python scripts/make_tables.py --study NAME --tables DIR --figures DIR     # one study, elsewhere
    python scripts/make_tables.py --runs results/archive/<study> --tables results/archive/<study>/tables \
        --figures results/archive/<study>/figures        # an archived study
"""
from __future__ import annotations

import sys

from controlled_study.tools import tables as main

if __name__ == "__main__":
    sys.exit(main())
