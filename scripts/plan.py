"""`harness plan`: the cost plan of a sweep before a cluster run (``harness/tools/plan.py``: the code and its usage;
this is its front)."""
from __future__ import annotations

import sys

from harness.tools.plan import main

if __name__ == "__main__":
    sys.exit(main())
