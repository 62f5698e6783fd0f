"""`harness submit`: submit a sweep to Slurm and exit (``harness/tools/submit.py``: the code and its usage; this is its
front)."""
from __future__ import annotations

import sys

from harness.tools.submit import main

if __name__ == "__main__":
    sys.exit(main())
