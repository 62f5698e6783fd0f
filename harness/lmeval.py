"""lm-evaluation-harness with a method applied: the harness's model for lm-eval, registered as ``harness``.

    python -m harness.lmeval --model harness \\
        --model_args pretrained=/path/to/model,method=self_extend,window=0.25,group=8 \\
        --tasks my_task --include_path my_tasks/ --batch_size 1

Everything after ``python -m harness.lmeval`` is lm-eval's own command line (``lm-eval run --help``); this module
only registers the model first (lm-eval 0.4 finds models through its registry, filled by imports, and has no plugin
entry point, so a plain ``lm_eval --model harness`` cannot see it without editing lm-eval). From Python,
``import harness.lmeval`` (or :func:`register`) makes ``lm_eval.simple_evaluate(model="harness", ...)`` work too.

``--model_args``: ``pretrained`` (a checkpoint folder, or a hub id in the local cache), ``method`` and the method's
own settings (its YAML's keys, in its units: ``window=0.25`` is C/4), ``native_ctx`` (C, default: the folder's), and
``dtype``; every other key is ``HFLM``'s (``max_length``, ``batch_size``, ...). A folder saved by
``harness.api.save`` brings its method back by itself. The model is loaded by ``harness.api.load``, and its forward
goes through ``get_decoder()`` + ``get_output_embeddings()`` as every harness evaluator's does
(``harness.evals.short_context.contract_class``).
"""
from __future__ import annotations

import dataclasses
import os
import sys

from harness import api
from harness.evals.short_context import contract_class
from harness.methods import METHODS

MODEL_NAME = "harness"
OWN_KEYS = ("pretrained", "method", "native_ctx", "dtype")


def split_args(method: str | None, kwargs: dict) -> tuple[dict, dict]:
    """``(method settings, HFLM arguments)`` of ``--model_args`` beyond ``OWN_KEYS``: a key of the method's
    ``Args`` is a setting; any other goes to lm-eval's ``HFLM``."""

    if not method:
        return {}, dict(kwargs)
    fields = {f.name for f in dataclasses.fields(METHODS.get(method).Args)} - {"name"}
    return ({k: v for k, v in kwargs.items() if k in fields}, {k: v for k, v in kwargs.items() if k not in fields})


def register():
    """Register the model ``harness`` with lm-eval's model registry (once); returns its class."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.api.registry import get_model, model_registry, register_model

    if MODEL_NAME in model_registry:
        return get_model(MODEL_NAME)

    @register_model(MODEL_NAME)
    class HarnessLM(contract_class()):
        """lm-eval's HFLM on a model loaded by ``harness.api.load`` with a method applied."""

        def __init__(self, pretrained: str, method: str | None = None, native_ctx: int | None = None,
                     dtype: str | None = None, **kwargs):

            settings, rest = split_args(method, kwargs)
            import torch

            device = rest.pop("device", None)  # the model is placed here (harness.api.load), not by HFLM; lm-eval's
            if str(device).startswith("cuda") and not torch.cuda.is_available():  # default cuda:0 falls back to
                device = None                                                     # the CPU, as HFLM's does
            model, tok = api.load(str(pretrained), method=method, native_ctx=native_ctx, dtype=dtype,
                                  device=str(device) if device else None, **settings)
            self.harness_method = getattr(model, "harness_method", None)
            super().__init__(pretrained=model, tokenizer=tok, **rest)

    return HarnessLM


def main(argv: list[str] | None = None) -> None:
    """``python -m harness.lmeval <lm-eval arguments>``: lm-eval's command line with the model registered."""
    register()
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
