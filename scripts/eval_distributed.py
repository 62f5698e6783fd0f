"""torchrun entry point of data-parallel evaluation (``harness.eval_distributed``): one process per rank.

    torchrun --standalone --nproc_per_node=8 scripts/eval_distributed.py <run_dir>/eval_job/spec.json

``run.py ... eval_world_size=N`` (N > 1, or ``auto`` on a node with several GPUs) writes the spec (resolved config
with the weights to load, the suite, the run directory) and starts this itself; rank 0 writes every suite entry's
output to ``<spec dir>/out/<i>.json`` and the per-sample records under the run directory.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    from harness.eval_distributed import eval_rank

    eval_rank(argv[0])
    # Done and written (rank 0 wrote its outputs before the final barrier). Leave without the interpreter's teardown,
    # as scripts/train_distributed.py does: a collective library's thread destroyed there can abort a rank.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
