"""Context-extension methods: one file + one YAML each, registered by a stable short name (``method=pi``).

A method is a small object with hooks (all optional but ``apply``), called in this order by ``run.py``:

- ``apply(handle)``: change the loaded model for the extended context (RoPE parameters, attention function, ...),
  in place. Called once, before fine-tuning and evaluation alike.
- ``train_mode(handle)`` / ``eval_mode(handle)``: switch what differs between fine-tuning and inference
  (LongLoRA: shifted sparse attention + LoRA while training, merged weights and full attention at inference).
- ``check(native_ctx, train=None)``: refuse impossible settings with one line naming the key and the valid range,
  *before* anything loads (``pipeline.validate`` calls it with the model config's ``native_ctx`` and the train
  recipe; ``apply`` calls it again with the loaded model's); ``check_data(native_ctx)`` does the same for files the
  method reads. Length-like settings are in units of the native window
  C (``harness.config.window_tokens``), so the same YAML means the same on every model.
- ``after_finetune(handle, ctx)``: the method's own stage on the fine-tuned model, before the convergence gate and
  the evaluation see it (LongRoPE: its recovery search of the short factors); returns what the row's ``train_info``
  records besides the fine-tune's own entries, or None. ``ctx`` is a ``StageContext``.
- ``max_length(handle)``: the longest evaluation length the method supports (None = unbounded); evaluators report
  longer lengths as skipped.
- ``params()``: the method's parameters; saved beside every checkpoint it produces (``method.json``) and checked
  when a checkpoint is loaded, so a checkpoint is never evaluated under a different method (the one exception,
  ``accepts_checkpoint``: LongRoPE's progressive extension uses a checkpoint with factors searched on it).

A loaded model whose config already carries a RoPE scaling (Llama-3.1's ``llama3``, a released PI checkpoint's
``linear``, ...): a RoPE method replaces it; the blocked-attention methods keep a static one (``default``, ``linear``,
``llama3``) and refuse any other with one line (``rope.require_static_rope``); ``base`` keeps it. Either way ``apply``
records what happened, and ``params()`` then carries ``checkpoint_rope: {rope_parameters, action: replaced |
unchanged}`` (the row's ``method_params``). Likewise a config's sliding window (Mistral-7B-v0.1: 4096), which the
blocked-attention methods do not apply: ``checkpoint_attention: {sliding_window, action: dropped}``. These records
are not parameters: never part of the checkpoint comparison (``method.json``).

Needs: what a method needs of the model it changes is declared on its class (``needs = ROPE``: rotary position
embeddings; ``BLOCKWISE``: RoPE of a static type and a model class that takes a registered attention function;
``Needs.min_window``: a native window of at least ``MIN_WINDOW`` tokens) and checked by ``Method.check_model`` on the
checkpoint's config when the run is composed (``pipeline.setup``), before any weights load: ``method=pi`` on GPT-2
is one line, not an ``ok`` row identical to the base.

Methods receive plain arguments from their ``Args`` dataclass (validated against the YAML), never a DictConfig.

Facts: what the tables, findings, figures, plan and report know about a method is declared in its YAML under
``facts:`` (``label``, ``family``: exact | approximate attention, ``trains``: fine-tuned in the study's protocol,
``beyond_paper``: not a method of the controlled study; ``color`` and ``marker``: how every figure draws it, the same
in every figure, run and study) and read through one function, :func:`facts`. A variant that
is one method under other settings is the YAML or the sweep point that defines it: ``ntk_32k.yaml`` (the class of
``ntk_dynamic``), or a point whose ``method: {facts: {key: ntk_64k_2b, label: NTK-64K-2B}}`` names a table row of its
own (:func:`row_key`). A method registered without facts fails at registration. ``facts`` is not a parameter: it is
taken out of the node before ``Args`` and out of the config hash (``harness.results.NOT_IN_CONFIG_HASH``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.conf_utils import conf_dirs, find_conf, group_defaults
from harness.config import ConfigError
from harness.registry import Registry

FAMILIES = ("exact", "approximate")


@dataclass(frozen=True)
class Facts:
    """A method's facts (module docstring): declared in ``conf/method/<name>.yaml`` under ``facts:``."""

    key: str                    # the table row it is: the method's name, or a sweep point's variant (ntk_64k_2b)
    label: str                  # the tables' label; "{model}" = the model's own name (the base)
    family: str                 # exact | approximate attention (Table 1's groups)
    trains: bool                # fine-tuned in the study's protocol (False: applied to the frozen model)
    beyond_paper: bool = False  # not studied by the paper: never in a finding's parts, a control beside them
    color: str | None = None    # its colour in every figure (a colour-blind-safe palette: Paul Tol's "muted")
    marker: str | None = None   # its matplotlib marker in every figure; (color, marker) is the method's alone


def _facts_of(key: str, node, where: str) -> Facts:
    """``Facts`` from a YAML's ``facts`` node; one line naming ``where`` when it is missing or incomplete."""
    if not isinstance(node, dict):
        raise ConfigError(f"{where}: no facts (add facts: {{label: ..., family: exact | approximate, trains: "
                          f"true | false}}; the tables, findings and plan read them)")
    known = {f.name for f in dataclasses.fields(Facts)} - {"key"}
    bad = sorted(set(node) - known - {"key"})
    missing = sorted({"label", "family", "trains"} - set(node))
    if bad or missing:
        raise ConfigError(f"{where}.facts: " + (f"unknown keys {bad}" if bad else f"missing {missing}") +
                          f" (valid: {', '.join(sorted(known))})")
    if node["family"] not in FAMILIES or not isinstance(node["trains"], bool):
        raise ConfigError(f"{where}.facts: family must be one of {FAMILIES} and trains true or false, got "
                          f"{node['family']!r}, {node['trains']!r}")
    return Facts(key=str(node.get("key") or key), **{k: v for k, v in node.items() if k != "key"})


@functools.cache
def _declared(name: str, where) -> Facts | None:
    """The facts of ``conf/method/<name>.yaml`` (a plugin's included: ``where`` is the file), None without a YAML."""
    if where is None:
        return None
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(where)).get("facts")
    return _facts_of(name, node, f"conf/method/{name}.yaml")


def declared(name: str) -> Facts | None:
    """The facts ``conf/method/<name>.yaml`` declares (None when there is no such YAML: not a method)."""

    return _declared(name, find_conf("method", name))


def _check_facts(name: str, obj) -> None:
    """Registration check of ``METHODS``: a method's YAML declares its facts."""
    if declared(name) is None:
        raise ConfigError(f"method {name!r} ({getattr(obj, '__module__', '?')}) has no conf/method/{name}.yaml with "
                          f"its facts (label, family, trains)")


class Methods(Registry):
    """The method registry; a method's facts by its name, a variant's key or a results row (:meth:`facts`)."""

    def facts(self, name_or_row) -> Facts | None:
        """What the tables, findings, figures, plan and report know about a method (:func:`facts`)."""
        return facts(name_or_row)


METHODS: Methods = Methods("method", "harness.methods", check=_check_facts)


@functools.cache
def _variants(dirs: tuple) -> dict:
    """``{study.row: (method, point facts)}`` of every sweep point (``<conf>/point/*/*.yaml``) that declares a
    variant with ``method: {facts: {key: ...}}``: rows recorded before their facts were, matched by ``study.row``."""
    from omegaconf import OmegaConf

    out = {}
    for d in dirs:
        for p in sorted(d.glob("point/*/*.yaml")):
            node = OmegaConf.to_container(OmegaConf.load(p))
            pf = ((node.get("method") or {}).get("facts") or {})
            row = (node.get("study") or {}).get("row")
            if pf.get("key") and row:
                method = next((next(iter(x.values())) for x in node.get("defaults") or []
                               if isinstance(x, dict) and next(iter(x)) == "override /method"), None)
                out[str(row)] = (method, pf)
    return out


def variants() -> dict:
    return _variants(tuple(conf_dirs()))


def row_key(row: dict) -> str:
    """The table row a results row belongs to: the variant key its config records (``method.facts.key``) or its
    sweep point declares (matched by ``study.row``), else its method's name."""
    cfg = row.get("config") or {}
    recorded = ((cfg.get("method") or {}).get("facts") or {}).get("key")
    if recorded:
        return str(recorded)
    study_row = str((cfg.get("study") or {}).get("row") or "")
    if study_row in variants():
        return str(variants()[study_row][1]["key"])
    return str(row.get("method") or "?")


def facts(name_or_row) -> Facts | None:
    """The one reader of a method's facts: a name (``pi``, a variant key such as ``ntk_64k_2b``) or a results row
    (its :func:`row_key`). None for a name that is no method (a factor search's row, ``longrope_search``)."""
    if isinstance(name_or_row, dict):
        key = row_key(name_or_row)
        recorded = ((name_or_row.get("config") or {}).get("method") or {}).get("facts")
        if isinstance(recorded, dict) and recorded.get("key") == key:  # what the row recorded comes first
            base = declared(str(name_or_row.get("method") or ""))
            try:
                return _facts_of(key, {**(dataclasses.asdict(base) if base else {}), **recorded},
                                 f"row method.facts of {key}")
            except ConfigError:  # facts recorded under an older Facts: the declaration below reads the row
                pass
    else:
        key = str(name_or_row)
    own = declared(key)
    if own is not None:
        return own
    for method, pf in variants().values():  # rows recorded before their facts were: the sweep point's declaration
        if pf.get("key") == key and declared(method or "") is not None:
            return _facts_of(key, {**dataclasses.asdict(declared(method)), **pf}, f"the point of {key}")
    return None


# the shortest native window C (tokens) a run accepts: below it a method length in units of C rounds to a handful of
# tokens and no evaluator's prompt (a passkey template alone is ~30 tokens) fits one window
MIN_WINDOW = 16
STATIC_ROPE = ("default", "linear", "llama3")  # rope types a blocked-attention method keeps (rope.require_static_rope)


@dataclass(frozen=True)
class Needs:
    """What a method needs of the model it changes, declared on its class (``needs = Needs(rope=True)``) and checked
    when the run is composed, before any weights load (``Method.check_model``, called by ``pipeline.setup`` with the
    checkpoint's config): one line naming the method and what the model lacks."""

    rope: bool = False                 # rotary position embeddings (a RoPE method changes their frequencies)
    rope_types: tuple = ()             # the model's rope types it can work with (empty: any; it replaces them)
    attention_interface: bool = False  # installs its attention through transformers' AttentionInterface
    min_window: int = MIN_WINDOW       # the smallest native window C (tokens) it is defined for


ROPE = Needs(rope=True)
BLOCKWISE = Needs(rope=True, rope_types=STATIC_ROPE, attention_interface=True)  # ``_blockwise.install``'s methods


def model_facts(config) -> dict:
    """What ``Needs`` asks of a transformers config (None: not readable here, only the window is checked):
    ``model_type``, ``rope_type`` (None without RoPE) and whether its model class takes a registered attention
    function (``_supports_attention_backend``; None when the class is unknown)."""
    rp = getattr(config, "rope_parameters", None)
    rope = (dict(rp).get("rope_type") or dict(rp).get("type") or "default") if rp else None
    try:
        from transformers import AutoModelForCausalLM

        cls = AutoModelForCausalLM._model_mapping[type(config)]
        interface = bool(getattr(cls, "_supports_attention_backend", False))
    except Exception:  # noqa: BLE001 - a config transformers has no causal LM class for: not checked
        interface = None
    return {"model_type": getattr(config, "model_type", "?"), "rope_type": rope, "attention_interface": interface}


@dataclass
class MethodArgs:
    name: str = ""


@dataclass
class StageContext:
    """What the pipeline hands a method's stage hook (``after_finetune``): the run directory to write in, the run's
    seed and compute dtype, and the factor search package ``harness.search``, which sits on a floor above the
    methods (it scores candidates through the ``longrope`` method), so it is passed in and never imported here."""

    run_dir: Path
    seed: int = 0
    autocast: str = "auto"
    search: Any = None


class Method:
    """No-op hooks; a method overrides what it needs. One level only: no method inherits from another method."""

    Args = MethodArgs
    needs: Needs = Needs()  # what it needs of the model (``Needs``); a RoPE method: ``ROPE``
    checkpoint_rope: dict | None = None  # set by apply() when the loaded config already carried a rope scaling
    checkpoint_attention: dict | None = None  # set by apply() when the method does not apply the config's window
    # train.sequence_parallel > 1: why this method cannot train with its sequence split over ranks ("" = it can),
    # and whether its batches restart positions per document (harness.train.zero.sequence)
    sequence_parallel: str = ""
    restarts_positions: bool = False

    def __init__(self, args):
        self.args = args

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "apply" in cls.__dict__:
            cls.apply = _records_checkpoint_rope(cls.__dict__["apply"])

    @property
    def name(self) -> str:
        return self.args.name

    def check(self, native_ctx: int, train=None) -> None:
        """Raise ConfigError for settings that cannot work with a model of native window ``native_ctx`` (and the
        fine-tuning recipe ``train``, a TrainArgs, when given)."""

    def check_model(self, config, native_ctx: int) -> None:
        """Refuse (one ConfigError line) a model this method cannot change: its ``needs`` against the checkpoint's
        transformers ``config`` (None: only the window is checked) and native window ``native_ctx``. Called before
        any weights load."""
        n, where = self.needs, f"method={self.name}"
        if native_ctx < n.min_window:
            raise ConfigError(f"{where}: the model's native window C = {native_ctx} tokens is below the "
                              f"{n.min_window} tokens a run needs (model.native_ctx; valid: >= {n.min_window})")
        if config is None:
            return
        f = model_facts(config)
        if n.rope and f["rope_type"] is None:
            raise ConfigError(f"{where}: the model ({f['model_type']}) has no rotary position embeddings (RoPE) "
                              f"for this method to change (valid: a RoPE model such as Llama, Mistral, Qwen2, Phi; "
                              f"method=base runs any model)")
        if n.rope_types and f["rope_type"] not in n.rope_types:
            raise ConfigError(f"{where}: the model's rope type is {f['rope_type']!r}, which this method cannot keep "
                              f"(valid: a model whose rope type is one of {', '.join(n.rope_types)})")
        if n.attention_interface and f["attention_interface"] is False:
            raise ConfigError(f"{where}: the model class of {f['model_type']} takes no registered attention function "
                              f"(transformers' AttentionInterface), which this method installs (valid: a model whose "
                              f"class supports attention backends, e.g. Llama, Mistral, Qwen2, Phi)")

    def check_data(self, native_ctx: int) -> None:
        """Raise ConfigError for files the method reads that are missing or do not fit the model (LongRoPE's
        factors file); ``pipeline.validate(data=True)`` calls it before anything loads."""

    def apply(self, handle) -> None:
        pass

    def train_mode(self, handle) -> None:
        pass

    def eval_mode(self, handle) -> None:
        pass

    def after_finetune(self, handle, ctx: StageContext) -> dict | None:
        """The method's own stage after fine-tuning, on the tuned ``handle``: what it adds to the row's
        ``train_info``, or None (nothing to do, the default)."""
        return None

    def max_length(self, handle) -> int | None:
        return None

    def attention_keys(self, seq_len: int) -> float:
        """Keys a training token attends to in a ``seq_len``-token sequence (the cost plan's attention FLOPs)."""
        return seq_len

    def train_batch(self, input_ids):
        """Model inputs for one training micro-batch of packed token ids (Landmark inserts its tokens here)."""
        return {"input_ids": input_ids, "labels": input_ids}

    def params(self) -> dict:
        out = dataclasses.asdict(self.args)
        for key in RECORDS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def accepts_checkpoint(self, saved: dict, directory: str | Path) -> bool:
        """May a checkpoint trained with parameters ``saved`` (different from ``params()``) be used anyway? No, by
        default. LongRoPE / LongRoPE2 accept their own checkpoints under factors searched *on that checkpoint*
        (progressive extension: search -> fine-tune -> search again)."""
        return False


RECORDS = ("checkpoint_rope", "checkpoint_attention")  # records in params(), not parameters: never compared


def _records_checkpoint_rope(apply):
    """Wrap a method's ``apply``: when the model's config carried a rope scaling before the method ran (the first
    time a method sees this model), record it and whether the method replaced it; record a config sliding window
    the method does not apply (``_blockwise.install``). The model keeps what a save needs (``persist``): its state
    before the first method (``harness_before``), the method applied and the window C (``harness_method``,
    ``harness_native_ctx``)."""

    @functools.wraps(apply)
    def wrapped(self, handle, *args, **kwargs):
        from harness.methods.rope import scaled_rope  # deferred: rope's module level imports this package's names

        model = getattr(handle, "model", None)
        if getattr(model, "config", None) is None:  # not a transformers model (a stand-in in a unit test)
            return apply(self, handle, *args, **kwargs)
        if not hasattr(model, "harness_checkpoint_rope"):
            from harness.methods.persist import snapshot  # deferred: persist imports this package (save_method)

            model.harness_checkpoint_rope = scaled_rope(model.config)
            model.harness_before = snapshot(model)  # the model as loaded: what a save restores for a method
        self.checkpoint_rope = self.checkpoint_attention = None  # this model's records only
        out = apply(self, handle, *args, **kwargs)
        model.harness_method, model.harness_native_ctx = self, int(handle.native_ctx)  # what save() records
        before = model.harness_checkpoint_rope
        if before is not None:
            after = scaled_rope(model.config)
            self.checkpoint_rope = {"rope_parameters": before,
                                    "action": "unchanged" if after == before else "replaced"}
        dropped = getattr(model, "harness_sliding_window_dropped", None)
        if dropped:
            self.checkpoint_attention = {"sliding_window": int(dropped), "action": "dropped"}
        return out

    return wrapped


Method.apply = _records_checkpoint_rope(Method.apply)


def build_method(cfg) -> Method:
    """The one builder. A node Hydra composed (a ``DictConfig``: ``method=ntk_64k`` on the command line) already
    holds its YAML's settings and is built as it is; under a plain dict from code (``build_method({"name":
    "ntk_64k"})``) the method's YAML (``conf/method/<name>.yaml``) is layered, so both get the same defaults
    (several names share one class and differ only in their YAML: ntk_dynamic / ntk_32k / ntk_64k)."""
    name = cfg.get("name") if hasattr(cfg, "get") else None
    if not name:
        raise ConfigError("method config has no name")
    from omegaconf import DictConfig, OmegaConf

    composed = isinstance(cfg, DictConfig)
    node = OmegaConf.to_container(cfg, resolve=True) if composed else dict(cfg)
    node.pop("facts", None)  # what the tables know about the method, not a parameter
    return METHODS.build(node, f"method={name}", defaults=None if composed else yaml_defaults(name))


def yaml_defaults(name: str) -> dict:
    """The parameters of ``conf/method/<name>.yaml`` (its ``facts`` left out; {} when the method has no YAML)."""

    if find_conf("method", name) is None:
        return {}
    out = group_defaults("method", name)
    out.pop("facts", None)
    return out


METHOD_FILE = "method.json"


def checkpoint_params(params: dict) -> dict:
    """The parameters a checkpoint is tied to: ``params()`` without the records (``RECORDS``)."""
    return {k: v for k, v in params.items() if k not in RECORDS}


def save_method(directory: str | Path, method: Method) -> None:
    Path(directory, METHOD_FILE).write_text(json.dumps(checkpoint_params(method.params()), indent=2, sort_keys=True))


SAVED_RECORD = "harness_method"  # the config.json key of a folder saved with its method (harness.methods.persist)


def saved_method(directory: str | Path) -> dict | None:
    """The method a checkpoint folder is tied to: its ``method.json`` (a fine-tune's, or a folder whose method
    transformers cannot express), else the method its ``config.json`` records (``harness.methods.persist.save``:
    a method transformers expresses, its RoPE already in the config); None for a plain pretrained folder."""
    f = Path(directory, METHOD_FILE)
    if f.is_file():
        return checkpoint_params(json.loads(f.read_text()))
    c = Path(directory, "config.json")
    try:
        rec = json.loads(c.read_text()).get(SAVED_RECORD) if c.is_file() else None
    except (OSError, ValueError):
        return None
    if isinstance(rec, dict) and isinstance(rec.get("params"), dict):
        return checkpoint_params({"name": rec.get("name"), **rec["params"]})
    return None


def check_checkpoint_method(directory: str | Path, method: Method) -> None:
    """Refuse to use a checkpoint folder under a method other than the one it is tied to (:func:`saved_method`: the
    one it was fine-tuned with, or saved with by ``harness.api.save``), in one line naming the folder and the
    method to ask for; a plain pretrained folder takes any method."""
    saved = saved_method(directory)
    if saved is None:
        return
    now = json.loads(json.dumps(checkpoint_params(method.params()), sort_keys=True))
    saved = json.loads(json.dumps(saved, sort_keys=True))
    if saved != now and not method.accepts_checkpoint(saved, directory):
        diff = {k: (saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)}
        raise ConfigError(f"checkpoint {directory} was trained or saved with method {saved.get('name')!r}; it does "
                          f"not match method {now.get('name')!r}: {diff} (valid: method={saved.get('name')} with "
                          f"the folder's settings, or the base checkpoint)")
