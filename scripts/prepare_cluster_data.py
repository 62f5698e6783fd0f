"""`harness prepare-cluster`: prepare everything a cluster run needs, offline-first
(``harness/tools/prepare_cluster_data.py``: the code and its usage; this is its front)."""
from __future__ import annotations

import sys

from harness.tools.prepare_cluster_data import main

if __name__ == "__main__":
    sys.exit(main())
