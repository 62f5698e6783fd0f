"""Hydra helpers shared by run.py, scripts and tests: the config directory, custom resolvers, and composing a
group's defaults outside of a Hydra app."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def _ctx_x(*multiples, _root_):
    """``${ctx_x:1,2,4}`` -> lengths as multiples of the model's native window (C, 2C, 4C)."""
    c = int(_root_.model.native_ctx)
    return [int(c * float(m)) for m in multiples]


def _ctx(multiple, _root_):
    """``${ctx:8}`` -> 8 x the model's native window C in tokens (a length setting that is a multiple of C)."""
    return int(round(int(_root_.model.native_ctx) * float(multiple)))


def _mul(a, b):
    """``${mul:a,b}`` -> a x b (an int when the product is whole)."""
    x = float(a) * float(b)
    return int(x) if x == int(x) else x


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("ctx_x"):
        OmegaConf.register_new_resolver("ctx_x", _ctx_x)
    if not OmegaConf.has_resolver("ctx"):
        OmegaConf.register_new_resolver("ctx", _ctx)
    if not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", _mul)


register_resolvers()


def compose(overrides: list[str] | None = None, config_name: str = "config", with_hydra: bool = False):
    """Compose the run config exactly as ``run.py`` would (for scripts and tests); the one compose helper
    (``harness.sweeps.compose`` is this). ``with_hydra``: include the ``hydra`` node (launcher, sweeper, dirs)."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hcompose(config_name=config_name, overrides=list(overrides or []), return_hydra_config=with_hydra)


def group_defaults(group: str, name: str) -> dict:
    node = OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
    node.pop("defaults", None)
    return OmegaConf.to_container(node, resolve=False)
