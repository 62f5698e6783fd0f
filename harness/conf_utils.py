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


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("ctx_x"):
        OmegaConf.register_new_resolver("ctx_x", _ctx_x)
    if not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", lambda a, b: int(float(a) * float(b)) if float(a) * float(b) == int(float(a) * float(b)) else float(a) * float(b))


register_resolvers()


def compose(overrides: list[str] | None = None, config_name: str = "config"):
    """Compose the run config exactly as ``run.py`` would (for scripts and tests)."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hcompose(config_name=config_name, overrides=overrides or [], return_hydra_config=False)


def group_defaults(group: str, name: str) -> dict:
    node = OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
    node.pop("defaults", None)
    return OmegaConf.to_container(node, resolve=False)


def precheck_or_exit(argv: list[str]) -> None:
    """Compose a single run's overrides before Hydra does, so that an unknown group option, an unknown key or a
    malformed override prints one clear line and leaves a failed row (Hydra's own messages span many lines)."""
    import os
    import sys

    if any(a in ("-m", "--multirun", "--help", "-h", "--hydra-help", "--info") or a.startswith("--cfg")
           or a.startswith("hydra") or a.startswith("--") for a in argv):
        return
    try:
        cfg = compose([a for a in argv if not a.startswith("-")])
        results_dir = cfg.paths.results_dir
    except Exception as e:  # noqa: BLE001
        from harness.pipeline import fail_before_compose

        msg = " ".join(str(e).split("\n")[:1]).strip() or type(e).__name__
        hint = ""
        if "Could not find" in msg or "Could not load" in msg:
            group = msg.split("'")[1].split("/")[0] if "'" in msg else ""
            opts = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")) if group and (CONF_DIR / group).is_dir() else []
            hint = f" (available: {', '.join(opts)})" if opts else ""
        line = f"config error: {msg}{hint}"
        fail_before_compose(os.environ.get("HARNESS_RESULTS_DIR", "results"), line)
        print(line, file=sys.stderr)
        sys.exit(2)
