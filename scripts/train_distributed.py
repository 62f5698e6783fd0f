"""torchrun entry point of the DeepSpeed engine: one process per rank.

    torchrun --standalone --nproc_per_node=2 scripts/train_distributed.py <run_dir>/train_job/spec.json
    torchrun --nnodes=2 --node_rank=1 ... scripts/train_distributed.py --join   # a follower node: spec from rank 0

``run.py ... train.engine=deepspeed`` writes the spec (resolved config, fingerprint, checkpoint directory) and
starts this itself (on several nodes, ``train.nodes``: node 0 with the spec, every other node's ``run.py`` with
``--join``, ``harness.train.zero.nodes``); run it by hand to resume a job.
Rank 0 writes ``<spec dir>/final/model.safetensors`` (gathered, EMA-averaged weights) and ``final/info.json``.
On SIGUSR2 / SIGTERM the ranks save a checkpoint at the next step boundary and exit with ``PREEMPTED_EXIT`` (85);
rank 0 writes ``<spec dir>/preempted.json`` (see ``harness.train.deepspeed_engine``, "Preemption").
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

T0 = time.time()

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    from harness.train.deepspeed_engine import PREEMPTED_EXIT, train_rank
    from harness.train.zero.launch import JOIN

    info = train_rank(None if argv[0] == JOIN else argv[0], started=T0)
    code = PREEMPTED_EXIT if info and info.get("preempted_at_step") else 0  # stopped on SIGUSR2 / SIGTERM, saved
    # The work is done and written (rank 0 saved the weights before the final barrier). Leave without the interpreter's
    # teardown: a collective library's C++ thread destroyed there occasionally aborts a rank ("terminate called without
    # an active exception", seen once in a test run), which torchrun would report as a failed job.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
