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
``dtype``; every other key must be one of ``HFLM``'s (``max_length``, ``batch_size``, ...). A folder saved by
``harness.api.save`` brings its method back by itself. The model is loaded by ``harness.api.load``, and its forward
goes through ``get_decoder()`` + ``get_output_embeddings()`` as every harness evaluator's does
(``harness.evals.short_context.contract_class``).

Long context: ``max_length`` (the tokens lm-eval keeps of a prompt; HFLM's default is the checkpoint's C, so every
longer prompt was cut from the left and two methods gave the same truncated answers) defaults to the window the
method implies (:func:`implied_window`: its ``scale`` / ``factor`` / ``target`` x C, or its own longest length), said
in one line at start; a method that implies none (LM-Infinite, ABF, ...) needs ``max_length=<tokens>``. Every prompt
lm-eval still cuts is one line naming its length and what was kept.

Checked before lm-eval reads a task (:func:`check_model_args`), one line and exit 2 each: a missing folder, an
unknown method, a setting that is neither the method's nor HFLM's (``scael=2``), a value the method refuses, and
``--use_cache`` with a method (lm-eval's cache is keyed on the requests, not on the model arguments: it would hand
one method's answers to another).
"""
from __future__ import annotations

import dataclasses
import os
import sys

from harness import api
from harness.conf_utils import checkpoint_config
from harness.config import ConfigError
from harness.evals.short_context import contract_class
from harness.methods import METHODS, build_method

MODEL_NAME = "harness"
OWN_KEYS = ("pretrained", "method", "native_ctx", "dtype")


def hflm_keys() -> set[str]:
    """The keyword arguments lm-eval's ``HFLM`` takes."""
    import inspect

    from lm_eval.models.huggingface import HFLM

    return set(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs", "pretrained", "tokenizer"}


def implied_window(method, native_ctx: int) -> int | None:
    """The context window ``method`` extends the model to, in tokens: its ``scale``, ``factor``, ``max_factor`` or
    ``target`` setting x C (PI, YaRN, Llama-3, LongLoRA, NTK, CLEX, PoSE), else its own longest length
    (``max_length``: Self-Extend's (C - W) G + W); None for a method that implies none (the base: C)."""
    if method is None or method.name == "base":
        return int(native_ctx)
    for key in ("scale", "factor", "max_factor", "target"):
        v = getattr(method.args, key, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1:
            return int(round(float(v) * native_ctx))
    try:
        return method.max_length(type("H", (), {"native_ctx": int(native_ctx)})())
    except Exception:  # noqa: BLE001 - a limit that needs the loaded model: none implied
        return None


def parse_model_args(text: str) -> dict:
    """``k=v,k2=v2`` as lm-eval reads it (``lm_eval.utils.simple_parse_args_string``: numbers and booleans typed)."""
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string(text or "")


def check_model_args(args: dict, use_cache: bool = False) -> dict:
    """The checks of the module docstring on ``--model_args`` (parsed), before anything loads; returns them with
    ``max_length`` filled in from the method. Raises ``ConfigError`` (one line)."""
    args = dict(args)
    path = args.get("pretrained")
    if not path:
        raise ConfigError("--model_args: pretrained=<checkpoint folder or cached hub id> is required")
    try:
        cfg = checkpoint_config(str(path))
    except ValueError as e:
        raise ConfigError(f"--model_args: {str(e).splitlines()[0]}") from None
    method = args.get("method")
    if method is not None and method not in METHODS:
        raise ConfigError(f"--model_args: unknown method {method!r} (valid: {', '.join(METHODS.names())})")
    settings, rest = split_args(method, {k: v for k, v in args.items() if k not in OWN_KEYS})
    unknown = sorted(set(rest) - hflm_keys())
    if unknown:
        raise ConfigError(f"--model_args: {', '.join(unknown)} is neither a setting of method={method} nor an HFLM "
                          f"argument (valid settings: {', '.join(sorted(_fields(method))) or 'none'})")
    if method and use_cache:
        raise ConfigError("--use_cache with a method: lm-eval's cache is keyed on the requests, not the model "
                          "arguments, and would hand one method's answers to another (drop --use_cache)")
    c = int(args.get("native_ctx") or cfg.get("max_position_embeddings") or 0)
    m = None
    if method:
        m = build_method({"name": method, **settings})   # a non-numeric setting: one line naming it
        m.check(c)                                        # an out-of-range one: one line naming it
    if "max_length" not in args:
        w = implied_window(m, c)
        if w is None:
            raise ConfigError(f"--model_args: method={method} implies no extended window; give max_length=<tokens> "
                              f"(HFLM would keep only the checkpoint's C = {c} tokens of every prompt)")
        args["max_length"] = w
    return args


def _fields(method: str | None) -> set[str]:
    return ({f.name for f in dataclasses.fields(METHODS.get(method).Args)} - {"name"}) if method else set()


def split_args(method: str | None, kwargs: dict) -> tuple[dict, dict]:
    """``(method settings, HFLM arguments)`` of ``--model_args`` beyond ``OWN_KEYS``: a key of the method's
    ``Args`` is a setting; any other goes to lm-eval's ``HFLM``."""

    fields = _fields(method)
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
            if "max_length" not in rest:   # the method's window, not HFLM's default of the checkpoint's C
                rest["max_length"] = check_model_args({"pretrained": pretrained, "method": method,
                                                       "native_ctx": native_ctx, **kwargs})["max_length"]
            print(f"harness lm-eval: max_length = {rest['max_length']} tokens (method={method or 'base'}; prompts "
                  f"longer than that are cut, each cut said in one line)", file=sys.stderr, flush=True)
            super().__init__(pretrained=model, tokenizer=tok, **rest)

        def tok_batch_encode(self, strings, padding_side="left", left_truncate_len=None, truncation=False):
            if left_truncate_len:
                for s in strings:
                    n = len(self.tok_encode(s))
                    if n > left_truncate_len:
                        cut(n, left_truncate_len, "generate_until")
            return super().tok_batch_encode(strings, padding_side, left_truncate_len, truncation)

        def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
            for req in requests:
                n = len(req[1]) + len(req[2]) - 1
                if n > self.max_length:
                    cut(n, self.max_length, "loglikelihood")
            return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)

    return HarnessLM


def cut(n: int, kept: int, kind: str) -> None:
    """One line for a prompt lm-eval cuts from the left."""
    print(f"harness lm-eval: a {kind} prompt of {n} tokens is cut to its last {kept} (max_length)", file=sys.stderr,
          flush=True)


def _arg(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> None:
    """``python -m harness.lmeval <lm-eval arguments>``: lm-eval's command line with the model registered; with
    ``--model harness``, its ``--model_args`` checked first (one line and exit 2 for a bad one)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if _arg(argv, "--model") == MODEL_NAME:
        try:
            check_model_args(parse_model_args(_arg(argv, "--model_args") or ""),
                             use_cache=_arg(argv, "--use_cache") is not None)
        except ConfigError as e:
            print(f"harness lm-eval: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    register()
    from lm_eval.__main__ import cli_evaluate

    sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
