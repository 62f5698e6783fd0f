"""A tiny registry: stable short names -> builders. Each component package keeps one instance.

A model, method, dataset or evaluator is one file that registers itself with a decorator::

    @METHODS.register("pi")
    class PI(Method): ...

The short name is what Hydra selects (``method=pi``) and what the results row and the tables use as a column, so it
never changes with a refactor. Packages import all their modules on first lookup (``autoload``) so that
registering is the only step needed to add one; so are the modules named in ``HARNESS_PLUGINS`` (components kept
outside this package: ``harness.conf_utils``), and a registry's ``check`` (e.g. a method's facts) runs on every
name it registers, so a component missing what the tables need fails when it registers, not in a table.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from harness.conf_utils import plugin_modules
from harness.config import ConfigError, to_args

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, package: str, check: Callable[[str, Any], None] | None = None):
        """``check(name, obj)``: raises when ``obj`` may not be registered as ``name`` (one line saying why)."""
        self.kind, self.package, self.check = kind, package, check
        self._items: dict[str, T] = {}
        self._loaded = False
        self._plugins: set[str] = set()  # plugin modules imported by this registry

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            if self.check is not None:
                self.check(name, obj)
            self._items[name] = obj
            try:
                obj.registered_name = name  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            return obj

        return deco

    def autoload(self) -> None:
        """Import the package's modules (once) and any plugin module not imported yet (``HARNESS_PLUGINS`` is read
        on every lookup, so a plugin listed after the first lookup is still found)."""

        if not self._loaded:
            pkg = importlib.import_module(self.package)
            for mod in pkgutil.iter_modules(pkg.__path__):
                if not mod.name.startswith("_"):
                    importlib.import_module(f"{self.package}.{mod.name}")
            self._loaded = True
        for name in plugin_modules():
            if name not in self._plugins:
                importlib.import_module(name)
                self._plugins.add(name)

    def args(self, node, where: str, name: str | None = None, defaults: dict | None = None) -> tuple[Any, Any]:
        """``(cls, args)``: the class registered as ``name`` (default: the node's ``name``) and its ``Args``
        dataclass filled from ``defaults`` (e.g. the component's YAML) overlaid by ``node``, checked by
        ``harness.config.to_args`` (a wrong key or type is one ConfigError line naming ``where``). ``Args.name`` is
        the node's ``name`` or else the name the class was looked up by, so a component file needs no ``name``
        default in its Args (files that set one keep working). An unknown name is a ConfigError too."""
        import dataclasses

        from omegaconf import DictConfig, OmegaConf

        node = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
        name = name or node.get("name")
        if not name:
            raise ConfigError(f"{where}: the {self.kind} config has no name")
        try:
            cls = self.get(name)
        except KeyError as e:
            raise ConfigError(f"{where}: {e.args[0]}") from None
        merged = {**(defaults or {}), **node}
        if not merged.get("name") and any(f.name == "name" for f in dataclasses.fields(cls.Args)):
            merged["name"] = name
        return cls, to_args(cls.Args, merged, where)

    def build(self, node, where: str, name: str | None = None, defaults: dict | None = None):
        """The one builder of a component instance: ``cls(args)`` from :meth:`args`."""
        cls, args = self.args(node, where, name, defaults)
        return cls(args)

    def get(self, name: str) -> T:
        self.autoload()
        if name not in self._items:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._items))}")
        return self._items[name]

    def names(self) -> list[str]:
        self.autoload()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        self.autoload()
        return name in self._items

    def items(self) -> list[tuple[str, Any]]:
        self.autoload()
        return sorted(self._items.items())
