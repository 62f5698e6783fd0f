"""One run of the controlled study: model x method x data x train x eval -> one results row.

    python run.py                                   # embedded default: tiny_llama, YaRN, tiny fine-tune, tiny suite
    python run.py method=ntk_dynamic model=llama2_7b --cfg job     # print the composed config
    python run.py -m method=base,pi train=none      # a sweep (Slurm: hydra/launcher=slurm_a100)

A thin front for the installed library's app, ``harness.app`` (``harness run`` runs the same function),
whose docstring is the run's table of contents.
"""
from __future__ import annotations

import sys

if __name__ == "__main__" and sys.stderr.isatty():  # the imports below take seconds: say so from the first second
    print("run.py: loading the harness (torch, transformers), then the config, the cost estimate and the model",
          file=sys.stderr, flush=True)

from harness.app import cli

if __name__ == "__main__":
    sys.exit(cli())
