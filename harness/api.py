"""The library API: the front of the package, for a model in your own Python code.

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from harness import api

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    api.extend(model, "self_extend", tokenizer=tok, window=0.25, group=8)   # in place; C from model.config
    row = api.evaluate(model, tok, evaluator="passkey", lengths=[1, 2], samples=5)   # lengths in units of C
    api.save(model, "my-model-se", tok)             # reload: api.load("my-model-se")

- :func:`extend`: apply any registered method to a loaded transformers model, in place. Its settings are the keys
  of ``conf/method/<name>.yaml`` in the same units (a length-like setting is a multiple of the native window C,
  read from ``config.max_position_embeddings`` unless ``native_ctx`` is given).
- :func:`evaluate`: run a suite (``conf/eval/<name>.yaml``) or one evaluator on a model object or a checkpoint
  folder and return the results row (``harness.results.Row``), also written to ``<results_dir>/runs/``.
- :func:`save` / :func:`load`: a folder that keeps the method (``harness.methods.persist``): a standard config
  when transformers can express the method, else the method recorded and plain ``from_pretrained`` refused.
- :func:`methods` / :func:`evaluators`: what is registered, with its facts and default settings.

``run.py`` is built from the same calls: :func:`run` holds its stages (and :func:`evaluate`'s), and a loaded model
gets its method through ``pipeline.extend``, as :func:`extend` does.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    lifecycle,
    models,  # models.build_model read at call time: the tests stand in a loader that loads nothing
    pipeline,
    plan,
)
from harness.conf_utils import checkpoint_config, compose, conf_dirs, find_conf, group_defaults, hf_dtype, hub_name
from harness.config import ConfigError
from harness.evals import EVALS
from harness.methods import METHODS, RECORDS, build_method, yaml_defaults
from harness.methods.persist import record
from harness.methods.persist import save as _save
from harness.models import ModelHandle, rotary_dim

__all__ = ["MethodInfo", "EvaluatorInfo", "methods", "evaluators", "extend", "save", "load", "evaluate", "run",
           "native_ctx_of", "TINY_LLAMA"]

TINY_LLAMA = str(Path(__file__).resolve().parent / "assets" / "tiny_llama")  # the shipped 5M Llama (C = 512)


@dataclass(frozen=True)
class MethodInfo:
    """A registered method: its name, facts (``harness.methods.Facts``: label, family, trains, ...), default
    settings (its YAML, in units of C where length-like) and the first line of its documentation."""

    name: str
    facts: Any
    settings: dict
    doc: str


@dataclass(frozen=True)
class EvaluatorInfo:
    """A registered evaluator: its name, headline metric, default settings (its YAML) and the first line of its
    documentation."""

    name: str
    metric: str
    settings: dict
    doc: str


def _first_line(obj) -> str:
    import inspect

    doc = inspect.getdoc(inspect.getmodule(obj)) or inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def methods() -> dict[str, MethodInfo]:
    """Every registered method by name (``conf/method/<name>.yaml`` present), in name order."""
    out = {}
    for name, cls in METHODS.items():
        f = METHODS.facts(name)
        if f is not None:
            out[name] = MethodInfo(name, f, yaml_defaults(name), _first_line(cls))
    return out


def evaluators() -> dict[str, EvaluatorInfo]:
    """Every registered evaluator by name, in name order."""
    return {name: EvaluatorInfo(name, cls.spec.metric,
                                group_defaults("evaluator", name) if find_conf("evaluator", name) else {},
                                _first_line(cls))
            for name, cls in EVALS.items()}


def native_ctx_of(model) -> int:
    """The native window C of a transformers model: what a method recorded on it, else
    ``config.max_position_embeddings``."""
    c = getattr(model, "harness_native_ctx", None) or getattr(model.config, "max_position_embeddings", None)
    if not isinstance(c, int) or c < 1:
        raise ConfigError(f"the model's config has no max_position_embeddings ({c!r}); pass native_ctx=<C tokens>")
    return int(c)


def _method_node(name: str, settings: dict) -> dict:
    """A method's config node: its YAML's settings overlaid by ``settings`` (unknown keys: one line from
    ``build_method``)."""
    return {"name": name, **settings}


def _handle(model, tokenizer, native_ctx: int | None, path: str = ""):
    name = Path(str(getattr(model.config, "_name_or_path", "") or "model")).name or "model"
    return ModelHandle(model, tokenizer, name, int(native_ctx or native_ctx_of(model)),
                       {"path": path or str(getattr(model.config, "_name_or_path", "") or ""),
                        "rotary_dim": rotary_dim(model.config)})


def extend(model, method: str, *, tokenizer=None, native_ctx: int | None = None, backend: str = "auto",
           **settings):
    """Apply the registered method ``method`` to the transformers causal LM ``model``, in place, and return it.

    ``settings``: the method's YAML keys, in its units (``window=0.25`` is C/4 on every model). ``native_ctx``: the
    window C the settings are multiples of (default: ``model.config.max_position_embeddings``). ``tokenizer``: for a
    method that adds a token (``landmark``). ``backend``: ``attention.backend`` of ``conf/config.yaml``. A setting
    of the model's config the method does not apply (a sliding window) is printed. Raises ``ConfigError`` (one line)
    for an unknown method or setting, an impossible value, or a model already extended."""

    check_model(model, "extend")
    if getattr(getattr(model, "harness_method", None), "name", "base") != "base":  # base changes nothing
        raise ConfigError(f"extend: the model is already extended with method {model.harness_method.name!r}; extend a "
                          f"freshly loaded model (methods do not compose)")
    m = build_method(_method_node(method, settings))
    h = _handle(model, tokenizer, native_ctx)
    m.check(h.native_ctx)
    m.check_data(h.native_ctx)
    pipeline.extend(h, m, backend)
    return model


def check_model(model, where: str) -> None:
    """A loaded transformers model (a ``torch.nn.Module`` with a ``config``), else one ``ConfigError`` line saying
    what was given (a path: load it first)."""
    import torch

    if not (isinstance(model, torch.nn.Module) and hasattr(model, "config")):
        hint = " (a folder or hub id: api.load(path) first, or evaluate(path, ...))" if _is_folder(model) else ""
        raise ConfigError(f"{where}: model must be a loaded transformers model, got {type(model).__name__} "
                          f"{str(model)[:80]!r}{hint}")


def check_tokenizer(tokenizer, where: str) -> None:
    """A tokenizer (it encodes and decodes), else one ``ConfigError`` line."""
    if not (callable(tokenizer) and hasattr(tokenizer, "decode") and not hasattr(tokenizer, "parameters")):
        raise ConfigError(f"{where}: tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__} "
                          f"(evaluate(model, tokenizer, ...))")


def save(model, folder: str | Path, tokenizer=None) -> dict:
    """Save ``model`` (and ``tokenizer``) to ``folder`` keeping its method (``harness.methods.persist``); returns
    the method record written into ``config.json`` (``{}`` for a model without one). A ``folder`` that is a file is
    one ``ConfigError`` line (transformers only logs it and saves nothing)."""
    check_model(model, "save")
    if Path(folder).exists() and not Path(folder).is_dir():
        raise ConfigError(f"save: {folder} is a file, not a folder (valid: a folder, created if missing)")
    return _save(model, folder, tokenizer)


def _folder_cfg(path: str) -> dict:
    try:
        return checkpoint_config(path)
    except ConfigError:
        raise
    except ValueError as e:  # no such folder or cached hub id: one line naming it
        raise ConfigError(str(e).splitlines()[0]) from None


def load(path: str | Path, *, method: str | None = None, native_ctx: int | None = None, dtype: str | None = None,
         device: str | None = None, attn_implementation: str = "sdpa", **settings):
    """Load a checkpoint folder (or a hub id in the local cache) with its method: a folder saved by :func:`save`
    gets its recorded method back (applied again with its settings when transformers cannot express it); otherwise
    ``method`` (with ``settings``) is applied when given. Returns ``(model, tokenizer)``.

    ``dtype``: float32 | bfloat16 | float16 (default: the checkpoint's); ``device``: ``auto``, ``cpu``, ``cuda:N``
    (default: the CPU)."""

    path = str(path)
    rec = record(path) if os.path.isdir(path) else None
    if rec and method is not None and (method != rec["name"] or settings):
        raise ConfigError(f"load: {path} was saved with method {rec['name']!r} ({rec['params']}); it is loaded with "
                          f"that method (valid: method=None or {rec['name']!r} without settings)")
    c = int(native_ctx or (rec or {}).get("native_ctx") or _folder_cfg(path).get("max_position_embeddings") or 0)
    if c < 1:
        raise ConfigError(f"load: {path} has no max_position_embeddings in config.json; pass native_ctx=<C tokens>")

    handle = models.build_model({"name": hub_name(path), "builder": "hub", "path": path, "native_ctx": c,
                          "dtype": dtype or hf_dtype(path), "attn_implementation": attn_implementation},
                         device=device)
    if rec:
        if rec["name"] not in METHODS or not isinstance(rec.get("params"), dict):
            raise ConfigError(f"load: {path}/config.json records method {rec['name']!r}, which is no registered method "
                              f"with settings (valid: {', '.join(METHODS.names())})")
        fields = {f.name for f in dataclasses.fields(METHODS.get(rec["name"]).Args)}
        m = build_method({**{k: v for k, v in rec["params"].items() if k in fields}, "name": rec["name"]})
        m.check(c)  # the recorded settings are checked as a command line's are (an edited record: one line)
        m.check_data(c)
        if rec.get("applied_by") == "harness":
            pipeline.extend(handle, m)
        else:  # the config carries it: nothing to apply, but the model knows its method (evaluate, save again)
            handle.model.harness_method, handle.model.harness_native_ctx = m, c
    elif method is not None:
        m = build_method(_method_node(method, settings))
        m.check(c)
        m.check_data(c)
        pipeline.extend(handle, m)
    return handle.model, handle.tokenizer


def _is_folder(model) -> bool:
    return isinstance(model, (str, Path))


def evaluate(model, tokenizer=None, *, suite: str | None = None, evaluator: str | None = None,
             lengths: list[float] | None = None, native_ctx: int | None = None, results_dir: str | Path | None = None,
             seed: int = 0, overrides: list[str] | tuple = (), **settings) -> dict:
    """Evaluate ``model`` (a transformers model, extended or not, with its ``tokenizer``; or a checkpoint folder)
    on the suite ``suite`` (``conf/eval/<suite>.yaml``) or on the one evaluator ``evaluator`` (its YAML's settings
    overlaid by ``settings``), and return the finished results row (a dict, ``harness.results.Row``; also written to
    ``<results_dir>/runs/<run_id>.json``, default ``$HARNESS_RESULTS_DIR`` or ``./results``).

    ``lengths``: evaluation lengths in units of the native window C (``[1, 2]`` = C and 2C; one evaluator without
    lengths: ``[1]``; a suite without: its own). The method is the one
    the model carries (:func:`extend`, or a folder saved by :func:`save`), else none (``base``). ``overrides``: any
    further ``run.py`` override (``autocast=float32``, ``cost.limit_s=600``). A failure raises after the row is
    finished as ``failed``."""
    from omegaconf import OmegaConf, open_dict

    if (suite is None) == (evaluator is None):
        raise ConfigError("evaluate: give exactly one of suite=<conf/eval name> or evaluator=<registered name>")
    if suite is not None and settings:
        raise ConfigError(f"evaluate: settings {sorted(settings)} are an evaluator's; with a suite use "
                          f"overrides=['eval.suite.<entry>.<key>=<value>']")
    if suite is not None and find_conf("eval", str(suite)) is None:
        raise ConfigError(f"evaluate: unknown suite {suite!r} (valid: the names of conf/eval/*.yaml: "
                          f"{', '.join(sorted(p.stem for d in conf_dirs() for p in (d / 'eval').glob('*.yaml')))})")
    if evaluator is not None and evaluator not in EVALS:
        raise ConfigError(f"evaluate: unknown evaluator {evaluator!r} (valid: {', '.join(EVALS.names())})")
    given = None if _is_folder(model) else model
    if given is not None:
        check_model(given, "evaluate")
        if tokenizer is None:
            raise ConfigError("evaluate: a model object needs its tokenizer (evaluate(model, tokenizer, ...))")
        check_tokenizer(tokenizer, "evaluate")
    else:
        _folder_cfg(str(model))  # a folder (or cached hub id) that exists: else one line naming it
    method_obj = getattr(given, "harness_method", None) if given is not None else None
    rec = record(str(model)) if given is None and os.path.isdir(str(model)) else None
    mname = method_obj.name if method_obj is not None else (rec or {}).get("name", "base")
    ov = ["train=none", f"method={mname}", f"seed={int(seed)}"]
    if suite is not None:
        ov.append(f"eval={suite}")
    if given is None:
        ov += ["model=hub", f"model.path={model}"]
        if native_ctx or rec:
            ov.append(f"model.native_ctx={int(native_ctx or rec['native_ctx'])}")
    if results_dir is not None:
        ov.append(f"paths.results_dir={results_dir}")
    cfg = compose(ov + list(overrides))
    with open_dict(cfg):
        if given is not None:
            c = int(native_ctx or native_ctx_of(given))
            h = _handle(given, tokenizer, c)
            cfg.model = {"name": h.name, "builder": "hub", "path": "", "native_ctx": c,  # loaded: model_info.path
                         "dtype": str(next(given.parameters()).dtype).removeprefix("torch."),
                         "attn_implementation": "sdpa"}
        c = int(cfg.model.native_ctx)
        params = (dict(method_obj.params()) if method_obj is not None else (rec or {}).get("params")) or {}

        for k, v in params.items():
            if k not in RECORDS and k in cfg.method:
                cfg.method[k] = v
        if evaluator is not None:
            node = {**group_defaults("evaluator", evaluator), **settings, "name": evaluator}
            node.pop("defaults", None)
            cfg.eval = OmegaConf.create({"name": evaluator, "lengths": [], "suite": {evaluator: node}})
        if lengths is None and evaluator is not None:
            lengths = [1]  # one evaluator without lengths: at the native window C
        if lengths is not None:
            toks = [int(round(float(x) * c)) for x in lengths]
            cfg.eval.lengths = toks
            if evaluator is not None:
                cfg.eval.suite[evaluator].lengths = toks
    r = lifecycle.start(cfg)
    handle = None
    if given is not None:
        handle = _handle(given, tokenizer, int(cfg.model.native_ctx))
    try:
        run(cfg, r, handle=handle)
    except BaseException as e:
        r.fail(e)
        raise
    problem = r.finish()
    if problem:
        raise OSError(f"the finished row could not be written: {problem}")
    return r.row


def run(cfg, r, *, handle=None, names=None, suite=None, on_result=None, train_progress=None,
        eval_progress=None) -> None:
    """The stages of one run, recorded into ``r`` (a ``harness.lifecycle.Run``, or a sharded job's recorder):
    ``run.py``'s, :func:`evaluate`'s and every sharded job's (``harness.shards``: a run restricted to the units
    ``names`` of the evaluation plan, ``harness.evals.suite.plan``; ``()``: none, the fine-tune alone). ``handle``:
    a model already loaded (a ``ModelHandle``; its method applied or not), else the config's model is loaded.
    ``suite``: the config's ``eval.suite`` when the caller already built it (a sharded job: once for all its
    shards)."""

    s = pipeline.setup(cfg, suite=suite)                                          # 0. every group, fail fast
    method = getattr(handle.model, "harness_method", None) if handle is not None else None
    plan.check_cost(cfg, pipeline.selected(s.suite, names), method or s.method,  #    its cost, before loading
                    config=handle.model.config.to_dict() if handle is not None else None)
    if handle is None:                                                            # 1. model + method
        handle = pipeline.load_and_extend(cfg, s.method, s.train, suite=s.suite, names=names)
    else:
        handle = pipeline.prepare(cfg, handle, method or s.method, s.train, suite=s.suite,
                                  applied=method is not None, names=names)
    method = method or s.method
    r.record(model_info=handle.facts())                                           #    (what ran, where)
    info = pipeline.finetune(cfg, handle, method, s.train, r.row["run_dir"],      # 2. fine-tune (or frozen)
                             progress=train_progress)
    r.record(train_info=info, method_params=method.params())                     #    (the method as tuned)
    pipeline.evaluate(cfg, handle, method, r, s.suite,                            # 3. every evaluator
                      on_result=on_result, progress=eval_progress, names=names)
