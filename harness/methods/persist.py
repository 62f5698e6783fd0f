"""Save and load that keep the method (not a method: it registers nothing; ``harness.api`` and the pipeline use it).

A model extended by a method (``Method.apply`` records ``model.harness_method``, ``model.harness_native_ctx`` and
the model as it was before, ``model.harness_before``) is saved in one of two ways, chosen by what the model now is,
not by a table of method names:

- **a standard config** when plain transformers reproduces the method from ``config.json`` alone: a rope type of
  transformers' own (``linear``, ``yarn``, ``llama3``, ``longrope``, ``default`` with another base...), a stock
  attention implementation, and no hook, replaced module or replaced ``forward`` added by the method. Plain
  ``AutoModelForCausalLM.from_pretrained(folder)`` then gives the same logits (PI, YaRN, NTK-by-parts, ABF, Llama-3,
  LongLoRA at inference, PoSE's linear / YaRN / ABF variants);
- **the model as loaded, plus the method** otherwise (attention methods, the harness's own rope types, methods with
  length-dependent hooks): ``config.json`` keeps the rope parameters it had before the method and names the method
  in ``attn_implementation`` (an implementation no registry has), so a plain ``from_pretrained`` refuses in one line
  (transformers' own ``Specified attn_implementation="self_extend is a harness method; ..." is not supported``)
  instead of silently giving another model; the harness's loader (``harness.api.load``, ``model=hub``) loads it
  with a stock attention and applies the method again with its settings.

Either way ``config.json`` records the method under ``harness_method`` (``name``, ``params``, ``native_ctx``,
``applied_by``: ``config`` | ``harness``, and ``why`` for the second kind). The second kind also writes
``method.json`` (``save_method``), so the pipeline refuses that folder under another method
(``check_checkpoint_method``).
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from harness.methods import SAVED_RECORD, checkpoint_params, save_method
from harness.methods.rope import HARNESS_ROPE_TYPES

RECORD = SAVED_RECORD  # the config.json key
MARKER = "{name} is a harness method; load this folder with harness.api.load (plain transformers would not apply it)"
STOCK_ATTENTION = ("eager", "sdpa", "flex_attention", "harness_causal")  # harness_causal: plain causal, fused


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _types(model) -> list[str]:
    return [type(m).__name__ for m in model.modules()]


def _forwards(model) -> int:
    return sum("forward" in vars(m) for m in model.modules())


def snapshot(model) -> dict:
    """The model as loaded, before any method: its rope parameters and attention implementation (what a save
    restores when the method cannot be a standard config), and its hooks, module types and instance ``forward``s
    (what tells a method that adds its own)."""
    rp = getattr(model.config, "rope_parameters", None)
    return {"rope_parameters": copy.deepcopy(dict(rp)) if rp else None,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "hooks": _hooks(model), "types": _types(model), "forwards": _forwards(model)}


def not_expressible(model) -> str | None:
    """Why plain transformers would not reproduce the method applied to ``model`` from its config alone (None: it
    would, the save is a standard config)."""

    rp = dict(getattr(model.config, "rope_parameters", None) or {})
    kind = rp.get("rope_type") or rp.get("type") or "default"
    if kind in HARNESS_ROPE_TYPES:
        return f"rope type {kind!r} is the harness's own"
    attn = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if attn not in STOCK_ATTENTION and not attn.startswith("flash_attention"):
        return f"attention {attn!r} is the harness's own"
    before = getattr(model, "harness_before", None)
    if before is not None:
        if _hooks(model) != before["hooks"]:
            return "it adds forward hooks (length-dependent frequencies, KV-cache refresh or start tokens)"
        if _types(model) != before["types"]:
            return "it replaces modules"
        if _forwards(model) != before["forwards"]:
            return "it replaces a module's forward"
    return None


def record(folder: str | Path) -> dict | None:
    """The method a saved folder records (``config.json``'s ``harness_method``), None when there is none."""
    p = Path(folder) / "config.json"
    if not p.is_file():
        return None
    rec = json.loads(p.read_text()).get(RECORD)
    return rec if isinstance(rec, dict) and rec.get("name") else None


def save(model, folder: str | Path, tokenizer=None) -> dict:
    """``model.save_pretrained(folder)`` (and the tokenizer's), keeping the method applied to ``model`` as the module
    docstring says. Returns the record written (``{}`` for a model no method was applied to)."""

    folder = Path(folder)
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    method = getattr(model, "harness_method", None)
    if method is None:
        return {}
    why = not_expressible(model)
    rec = {"name": method.name, "params": json.loads(json.dumps(checkpoint_params(method.params()), default=str)),
           "native_ctx": int(model.harness_native_ctx), "applied_by": "harness" if why else "config"}
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    if why:
        rec["why"] = why
        before = getattr(model, "harness_before", None) or {}
        if before.get("rope_parameters") is not None:
            cfg["rope_parameters"] = json.loads(json.dumps(before["rope_parameters"]))
        cfg["attn_implementation"] = MARKER.format(name=method.name)
        save_method(folder, method)
    cfg[RECORD] = rec
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, p)
    return rec
