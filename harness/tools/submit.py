"""Submit a sweep and exit: every point of ``python run.py -m <overrides>`` as one submitit job (a Slurm job array),
with the resources and setup lines of ``conf/hydra/launcher/slurm_a100.yaml`` (+ ``conf/local/slurm.yaml``); the job
ids are printed and written to ``<results_dir>/jobs/<sweep>.json``, which ``make status`` reads.

    python scripts/submit.py experiment=paper_llama2              # = run.py -m ... hydra/launcher=slurm_a100
    python scripts/submit.py experiment=entropy_abf hydra.launcher.timeout_min=600
    python scripts/submit.py --cluster local method=base,pi train=none eval=quick   # submitit's local executor

Refused in one line before anything is submitted: a point that does not validate, more than one node, a
``train.world_size`` other than the node's GPUs, checkpoints inside the checkout (``harness/submit.py``).
"""
from __future__ import annotations

import argparse
import sys

from harness import precheck, submit


def main(argv: list[str] | None = None) -> int:
    """submit a sweep to Slurm and exit (job ids -> results/jobs/)."""

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="+", help="run.py -m overrides, e.g. experiment=paper_llama2")
    ap.add_argument("--cluster", default="slurm", choices=("slurm", "local"),
                    help="slurm (default) or submitit's local executor (tests, rehearsals on one machine)")
    a = ap.parse_args(argv)
    overrides = list(a.overrides)
    if not any(o.startswith("hydra/launcher=") for o in overrides):
        overrides.append("hydra/launcher=slurm_a100")
    try:
        submit.submit(overrides, cluster=a.cluster)
    except Exception as e:  # noqa: BLE001 - every refusal: one line
        print(precheck.explain(e, [o for o in overrides if not o.startswith("hydra")]), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
