"""Config plumbing: typed schemas next to the code that consumes them, checked at the one builder per component.

Each component file declares a dataclass; ``to_args(Schema, node, where)`` merges the composed Hydra node into it
(OmegaConf struct mode), so an unknown or mistyped key fails with one clear line that names the group, and the
builder receives plain Python values. Library code never sees a DictConfig.
"""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


AUTOCAST = ("auto", "bfloat16", "float32")  # compute dtypes a run may ask for (``autocast``, ``train.autocast``)


class ConfigError(ValueError):
    """A user-facing configuration error (printed as one line, never a traceback)."""


def to_args(schema: type[T], node: Any, where: str) -> T:
    """Validate ``node`` against dataclass ``schema`` and return an instance with plain values."""
    if node is None:
        node = {}
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    node = {k: v for k, v in dict(node).items() if k != "_name_"}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        for k, v in node.items():  # a dict value given in YAML replaces the default dict; merging would keep
            if isinstance(v, dict) and k in merged and isinstance(merged[k], DictConfig):  # stale default keys
                merged[k] = v
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        fields = ", ".join(f.name for f in dataclasses.fields(schema))  # type: ignore[arg-type]
        raise ConfigError(f"{where}: {msg} (valid keys: {fields})") from None


# ------------------------------------------------------------------------------------------------------------------
# Length settings in units of the model's native window C.
# ------------------------------------------------------------------------------------------------------------------
MAX_WINDOWS = 64  # the largest multiple of C a method's length setting may take (the study's largest: 16 C = 64k)


def window_tokens(value: float, native_ctx: int, key: str, *, zero_ok: bool = True, min_windows: float = 0.0) -> int:
    """A length setting given in units of the model's native window C -> tokens (``round(value * C)``).

    ``min_len: 8`` means 8C: 32768 tokens on LLaMA2-7B (C = 4096), 16384 on Phi-2 (C = 2048). A value above
    :data:`MAX_WINDOWS` is refused: it is almost certainly a token count written in the old absolute units (e.g.
    ``min_len: 32768`` would mean 32768 C = 134M tokens; any power of two from 128 tokens up is caught).
    ``zero_ok``: 0 is allowed (it means "off" or "the default" for the key); ``min_windows``: the smallest nonzero
    value that makes sense (e.g. 1 for an NTK clamp, which does nothing below C)."""
    import math

    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number (in units of the native window C), got {value!r}") from None
    lo = f"{min_windows:g}" if min_windows else "0"
    valid = f"{'0 or ' if zero_ok else ''}{lo}..{MAX_WINDOWS} (x C)"
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise ConfigError(f"{key} = {value!r} is invalid; it is in units of the native window C = {native_ctx} "
                          f"(valid: {valid})")
    if v > MAX_WINDOWS:
        raise ConfigError(f"{key} = {value:g} is in units of the native window C = {native_ctx}: that would be "
                          f"{v * native_ctx:.0f} tokens (valid: {valid}; {value:g} tokens = "
                          f"{v / max(native_ctx, 1):g} C)")
    if v and v < min_windows:
        raise ConfigError(f"{key} = {value:g} C is below {min_windows:g} C = {min_windows * native_ctx:.0f} tokens, "
                          f"where it has no effect (valid: {valid})")
    return int(round(v * native_ctx))


def check_base(method: str, rope_theta: float, ratio: float) -> None:
    """ABF-style base settings: an absolute ``rope_theta`` > 0, or (when it is 0) a ``ratio`` > 0 of the model's
    base."""
    import math

    if not (math.isfinite(rope_theta) and rope_theta >= 0):
        raise ConfigError(f"method={method}: rope_theta must be 0 (= use ratio) or a finite base > 0, got {rope_theta}")
    if rope_theta == 0 and not (math.isfinite(ratio) and ratio > 0):
        raise ConfigError(f"method={method}: with rope_theta 0, ratio (x the model's base) must be > 0, got {ratio}")


def check_scale(method: str, scale: float, key: str = "scale") -> None:
    """A RoPE scale factor s = L'/C (dimensionless, relative to the native window): finite and >= 1."""
    import math

    try:
        ok = math.isfinite(float(scale)) and float(scale) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"method={method}: {key} must be a finite number >= 1 (s = L'/C), got {scale!r}")
