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
