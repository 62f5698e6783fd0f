"""`make gpu-study`: the real-model study advanced in one GPU window (``controlled_study/window.py``, which says how).

    python scripts/gpu_study.py            # run what fits the window's budget, most findings unlocked first
    python scripts/gpu_study.py --plan     # every cell with its estimated GPU seconds and the study's total
"""
from __future__ import annotations

import sys

from controlled_study.window import main

if __name__ == "__main__":
    sys.exit(main())
