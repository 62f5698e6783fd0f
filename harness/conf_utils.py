"""Hydra helpers shared by run.py, scripts and tests: the config directories, custom resolvers, and composing a
group's defaults outside of a Hydra app.

Installed packages: a package registered under the entry-point group ``harness.conf`` (``pyproject.toml``) adds its
``conf/`` folder to the search path after ``conf/``: the controlled study's sweep points and experiments
(``controlled_study/conf/point``, ``controlled_study/conf/experiment``) are found this way, so the library names no
study.

Plugins: ``HARNESS_PLUGINS`` names modules (comma-separated, importable: on ``sys.path`` / ``PYTHONPATH``) that
register components of their own (a method, an evaluator, ...) the way the harness' own files do. Every registry
imports them when it loads (``harness.registry``), and a ``conf/`` folder beside a plugin module (its package folder,
or the folder holding the single file) is searched for the plugins' YAMLs after ``conf/``: by Hydra (the search-path
plugin ``hydra_plugins/harness_plugins``, so ``run.py method=<plugin's>`` composes) and by :func:`find_conf`.
"""
from __future__ import annotations

import functools
from pathlib import Path

from omegaconf import OmegaConf

from harness.safe import NAME_MAX, check_name, env_setting, is_safe_name

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
PLUGINS_ENV = "HARNESS_PLUGINS"
CONF_GROUP = "harness.conf"  # the entry-point group through which an installed package adds its conf/ folder
TOOLS_GROUP = "harness.tools"  # ... and its tools: `harness <tool>` (harness/cli.py), the run app (harness/submit.py)
TABLE_LINES_GROUP = "harness.table_lines"  # ... and the lines of a run's evaluation table (wandb; harness/app.py)


def plugin_modules() -> list[str]:
    """The module names listed in ``HARNESS_PLUGINS`` (empty when unset)."""
    return [m.strip() for m in (env_setting(PLUGINS_ENV) or "").split(",") if m.strip()]


def plugin_conf_dirs() -> list[Path]:
    """The ``conf/`` folders beside the plugin modules (found without importing them). A listed module that cannot
    be found is one line naming it and ``HARNESS_PLUGINS``."""
    import importlib.util

    out = []
    for name in plugin_modules():
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            raise ModuleNotFoundError(f"{PLUGINS_ENV}: no module {name!r} on the Python path (valid: importable "
                                      f"module names, comma-separated)")
        d = Path(spec.origin).parent / "conf"
        if d.is_dir() and d not in out:
            out.append(d)
    return out


def installed_conf_dirs() -> list[Path]:
    """The ``conf/`` folders of the installed packages registered under ``CONF_GROUP`` (each entry's value: a
    package name, found without importing it). Read once per process: scanning the installed distributions'
    metadata takes milliseconds, and the config lookups ask for it a thousand times in one ``make tables``."""
    return list(_installed_conf_dirs())


@functools.cache
def _installed_conf_dirs() -> tuple[Path, ...]:
    import importlib.util
    from importlib.metadata import entry_points

    out = []
    for ep in sorted(entry_points(group=CONF_GROUP), key=lambda e: e.name):
        spec = importlib.util.find_spec(ep.value)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"entry point {ep.name} = {ep.value!r} of {CONF_GROUP}: no such package")
        d = Path(next(iter(spec.submodule_search_locations))) / "conf"
        if d.is_dir() and d not in out:
            out.append(d)
    return tuple(out)


def installed_table_lines():
    """``lines(row) -> [dict]``, the lines of a run's evaluation table, from the one installed package registered
    under ``TABLE_LINES_GROUP`` (the controlled study's export), else None (no table). More than one: the first by
    name, said in one line."""
    import sys
    from importlib.metadata import entry_points

    eps = sorted(entry_points(group=TABLE_LINES_GROUP), key=lambda e: e.name)
    if len(eps) > 1:
        print(f"warning: {len(eps)} packages give {TABLE_LINES_GROUP} ({', '.join(e.name for e in eps)}); using "
              f"{eps[0].name}", file=sys.stderr)
    return eps[0].load() if eps else None


def conf_dirs() -> list[Path]:
    """Where configs are looked up, in order: ``conf/``, the installed packages' ``conf/`` folders (the controlled
    study's), then the plugins'."""
    return [CONF_DIR, *installed_conf_dirs(), *plugin_conf_dirs()]


def find_conf(group: str, name: str) -> Path | None:
    """The YAML of option ``name`` of ``group`` (``conf/<group>/<name>.yaml`` or a plugin's), or None."""
    for d in conf_dirs():
        p = d / group / f"{name}.yaml"
        if p.is_file():
            return p
    return None


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


def checkpoint_config(path: str) -> dict:
    """The ``config.json`` of a checkpoint: a local folder, or a hub id already in the local cache (never
    downloaded). Raises ``ValueError`` naming ``model.path`` when there is none."""
    import json

    path = str(path)
    p = Path(path).expanduser()
    if p.is_dir():
        f = p / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(repo_id=path, filename="config.json")
        except Exception:  # noqa: BLE001 - an id the hub library refuses (a path that does not exist, ...)
            hit = None
        f = Path(hit) if isinstance(hit, str) else None
    if f is None or not f.is_file():
        raise ValueError(f"model.path: {path!r} is neither a folder with a config.json nor a hub id in the local cache "
                         f"(valid: a Hugging Face checkpoint folder, or an id fetched beforehand on a login node)")
    try:
        out = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"model.path: {f} is not readable JSON ({type(e).__name__})") from None
    if not isinstance(out, dict):
        raise ValueError(f"model.path: {f} is not a JSON object")
    if "max_position_embeddings" not in out and isinstance(out.get("text_config"), dict):
        out = {**out, **out["text_config"]}  # multimodal wrappers keep the language model's fields there
    return out


# other spellings of a field in configs that predate the common name (GPT-2's n_positions is its window)
ALIASES = {"max_position_embeddings": ("n_positions", "n_ctx", "max_sequence_length", "seq_length")}


def _hf_config(path, key, default=None):
    """``${hf_config:${model.path},max_position_embeddings}``: a field of the checkpoint's ``config.json``."""
    cfg = checkpoint_config(path)
    for k in (key, *ALIASES.get(key, ())):
        if k in cfg:
            return cfg[k]
    if default is not None:
        return default
    raise ValueError(f"model.path: {path}'s config.json has no {key!r}; set it on the command line")


def hf_dtype(path):
    """``${hf_dtype:${model.path}}``: the checkpoint's weight dtype (``torch_dtype`` / ``dtype``; float32 when the
    config names none)."""
    cfg = checkpoint_config(path)
    d = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32").replace("torch.", "")
    return d if d in ("float32", "bfloat16", "float16") else "float32"


def hub_name(path):
    """``${hub_name:${model.path}}``: a row name from a folder or hub id (``/ckpt/my-model/`` -> ``my-model``,
    ``org/Model-7B`` -> ``org--Model-7B``)."""
    import re

    p = str(path).rstrip("/")
    name = Path(p).name if Path(p).expanduser().is_dir() else p.replace("/", "--")
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "_", name).lstrip(".-")[-NAME_MAX:]
    return name if is_safe_name(name) else "hub"


EVERY_METHOD = "every_method"  # study.every_method: {trains: <train recipe>, frozen: <train recipe>} in an experiment


def _yaml(path: Path) -> dict:
    import yaml

    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def generated_points() -> dict:
    """``{experiment: {method: node}}``: the sweep points an experiment takes from the method registry. An experiment
    whose YAML declares ``study.every_method: {trains: <recipe>, frozen: <recipe>}`` has, for every method YAML
    (``conf/method/*.yaml``, a plugin's included) with no ``point/<experiment>/<method>.yaml`` in a config folder,
    the point ``<experiment>/<method>``: the method, the train recipe its ``facts.trains`` chooses and ``study.row``
    = its ``facts.label``. A point file stays only for a true variant (other settings, another row name, a label
    that names the model). Composed exactly as the file it replaces would be (the same config, so the same hash)."""
    out: dict = {}
    methods = {p.stem: p for d in reversed(conf_dirs()) for p in (d / "method").glob("*.yaml")}
    for d in conf_dirs():
        for exp in (d / "experiment").glob("*.yaml"):
            rule = (_yaml(exp).get("study") or {}).get(EVERY_METHOD)
            if not isinstance(rule, dict):
                continue
            files = {p.stem for dd in conf_dirs() for p in (dd / "point" / exp.stem).glob("*.yaml")}
            for name, path in sorted(methods.items()):
                facts = _yaml(path).get("facts") or {}
                label = str(facts.get("label") or "")
                if name in files or not label or "{" in label:
                    continue
                recipe = rule["trains" if facts.get("trains") else "frozen"]
                out.setdefault(exp.stem, {})[name] = {
                    "defaults": [{"override /method": name}, {"override /train": str(recipe)}],
                    "study": {"row": label}}
    return out


def register_generated_points() -> None:
    """Store :func:`generated_points` in Hydra's ConfigStore (group ``point/<experiment>``, package ``_global_``),
    where ``point=<experiment>/<method>`` finds them as it finds a file."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for exp, nodes in generated_points().items():
        for name, node in nodes.items():
            cs.store(group=f"point/{exp}", name=name, node=node, package="_global_")


def _points(experiment):
    """``${points:tiny_study}`` -> every sweep point of an experiment, ``point/<experiment>/*.yaml`` of every config
    folder (:func:`conf_dirs`: an installed study's, a plugin's) and the points it takes from the method registry
    (:func:`generated_points`), as Hydra's choice list ``tiny_study/abf, tiny_study/base, ...`` (sorted): an
    experiment's sweep finds its points, so adding one is adding its file, or, in an experiment with
    ``study.every_method``, adding the method."""
    found = [p for d in conf_dirs() for p in (d / "point" / str(experiment)).glob("*.yaml")]
    names = sorted({f"{experiment}/{p.stem}" for p in found}
                   | {f"{experiment}/{m}" for m in generated_points().get(str(experiment), {})})
    if not names:
        raise ValueError(f"points: no sweep point in point/{experiment}/ of {', '.join(map(str, conf_dirs()))} "
                         f"(valid: a folder of point/)")
    return ", ".join(names)


def _safe_name(value, what="name"):
    """``${safe_name:${model.name},model.name}``: the value when it is a safe file name (``harness.safe.check_name``),
    else a resolver error naming the key: the run directory is refused before Hydra creates it."""
    return check_name(value, str(what))


def _env_or(name, default=""):
    """``${env_or:HARNESS_RESULTS_DIR,results}``: the variable, or ``default`` when it is unset or empty
    (``oc.env`` returns an empty string for ``VAR=``)."""
    return env_setting(str(name), default)


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("ctx_x"):
        OmegaConf.register_new_resolver("ctx_x", _ctx_x)
    if not OmegaConf.has_resolver("ctx"):
        OmegaConf.register_new_resolver("ctx", _ctx)
    if not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", _mul)
    for name, fn in (("hf_config", _hf_config), ("hf_dtype", hf_dtype), ("hub_name", hub_name), ("points", _points),
                     ("safe_name", _safe_name), ("env_or", _env_or)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()
register_generated_points()


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
    """The keys of option ``name`` of ``group`` (its YAML, plugins' included; ``defaults`` dropped, unresolved)."""
    node = OmegaConf.load(find_conf(group, name) or CONF_DIR / group / f"{name}.yaml")
    node.pop("defaults", None)
    return OmegaConf.to_container(node, resolve=False)
