"""`harness prepare-eval`: write every evaluation file the paper suites read (``harness/tools/prepare_eval_data.py``:
the code and its usage; this is its front)."""
from __future__ import annotations

import sys

from harness.tools.prepare_eval_data import main

if __name__ == "__main__":
    sys.exit(main())
