"""`make export`: every row of results/runs/ as one flat table (CSV + Parquet), controlled_study/export.py.

    python scripts/export_rows.py [--results results] [--out results/export]
"""
from __future__ import annotations

import sys

from controlled_study.tools import export as main

if __name__ == "__main__":
    sys.exit(main())
