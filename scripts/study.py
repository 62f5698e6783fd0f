"""`make study`: the whole tiny study in one command, resumable (``controlled_study/study.py``, which says how).

    python scripts/study.py                                  # experiment=tiny_study, every point
    python scripts/study.py experiment=tiny_study point=tiny_study/base,tiny_study/pi   # a subset
    python scripts/study.py --dry-run                        # the plan: which points run, which are done
    python scripts/study.py --jobs 2                         # two points at a time, one thread each
    python scripts/study.py --seed 1                         # the fine-tuned points again, training seed 1
"""
from __future__ import annotations

import sys

from controlled_study.study import main

if __name__ == "__main__":
    sys.exit(main())
