"""`harness build-data`: build a run's tokenised data cache before its GPU job (``harness/tools/build_data.py``: the
code and its usage; this is its front)."""
from __future__ import annotations

import sys

from harness.tools.build_data import main

if __name__ == "__main__":
    sys.exit(main())
