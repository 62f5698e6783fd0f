"""The command-line precheck of ``run.py``: a bad command line is one line naming the problem plus a failed row. A
sweep is composed and validated job by job before Hydra launches it; a single run is composed once, by Hydra, and
its composition errors come back here (``refuse``). It sits above the pipeline, the sweeps and
the registries it names in its messages; ``harness.conf_utils`` (below everything) only composes."""
from __future__ import annotations

from harness import pipeline, submit, sweeps
from harness.conf_utils import CONF_DIR, compose
from harness.config import ConfigError
from harness.lifecycle import fail_before_compose
from harness.methods import METHODS
from harness.models import MODELS
from harness.safe import env_setting
from harness.sweeps import SweepJobError, first_values
from harness.train import TrainArgs

HELP_FLAGS = ("--help", "-h", "--hydra-help", "--info", "--resolve", "--version", "--shell-completion", "-sc")


def precheck_or_exit(argv: list[str]) -> None:
    """Before Hydra: a sweep (``-m``) composes and validates every job (``harness.sweeps.expand``, the basic
    sweeper's job list), so that an unknown group option, an unknown key, a malformed override or an impossible value
    in any job prints one clear line naming it (with the valid alternatives) and leaves a failed row before anything is
    launched; a sweep with the Slurm launcher is submitted by ``harness.submit`` and ``run.py`` exits at once
    (``_submit_to_slurm``). A single run is not composed here: Hydra composes it once, and a command line that does
    not compose or resolve reaches ``refuse`` through ``harness.lifecycle.run_guarded`` (the same line, row and exit
    code), and so does a Slurm step whose nodes are not the run's ``train.nodes`` (``harness.app``,
    ``harness.train.zero.nodes.role``). Nothing is checked for help / ``--cfg`` / other ``--`` flags,
    or with ``hydra.searchpath`` (extra config directories this check cannot see); other ``hydra...`` overrides
    (launcher, sweep dirs) are left to Hydra and do not affect the jobs' configs."""
    multirun, flags = _multirun(argv), _flags(argv)
    if multirun and not flags and _submit_to_slurm(argv):
        return
    if flags or any(a.startswith("hydra.searchpath") for a in argv):
        return
    overrides = plain_overrides(argv)
    try:
        if multirun:
            _precheck_sweep(overrides, "config", _validate_run)
    except Exception as e:  # noqa: BLE001 - every failure: one line + a failed row
        refuse(e, overrides)


def _multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in argv)


def _flags(argv: list[str]) -> bool:
    """Help, ``--cfg`` and other ``--`` flags (``HELP_FLAGS`` and the rest): nothing is checked, Hydra answers."""
    return any(a in HELP_FLAGS or a.startswith("-") and a not in ("-m", "--multirun") for a in argv)


def plain_overrides(argv: list[str]) -> list[str]:
    """The config overrides of a command line: no flags, no ``hydra...`` settings."""
    return [a for a in argv if not a.startswith("-") and not a.startswith("hydra")]


def is_config_error(e: BaseException) -> bool:
    """Whether ``e`` says the command line does not compose or resolve (Hydra, OmegaConf, or the harness's own
    ``ConfigError`` from a resolver), as opposed to a failure of the machine (a directory that cannot be made)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(e, (HydraException, OmegaConfBaseException, ConfigError))


def config_refusal(argv: list[str], config_name: str = "config"):
    """``run_guarded``'s handler for a single run: ``refuse`` a config error of this command line; anything else
    (returns) is left to the guard. ``config_name``: the entry point's root config (the learning curves:
    ``curve_config``), whose keys the line lists."""
    def handler(e: BaseException) -> None:
        if is_config_error(e):
            refuse(e, plain_overrides(argv), config_name)
    return handler


def refuse(e: BaseException, overrides: list[str], config_name: str = "config") -> None:
    """A command line that does not compose, resolve or validate: print one line naming the problem (``explain``),
    leave a failed row in the results directory it names, exit 2."""
    import sys

    line = explain(e, overrides, config_name)
    problem = fail_before_compose(_results_dir_of(overrides), line, names=_names_of(overrides))
    print(line + (f" [{problem}]" if problem else ""), file=sys.stderr)
    sys.exit(2)


def refuse_in_job(e: BaseException, config_name: str = "config") -> None:
    """``refuse`` from inside a Hydra job (a value checked before the row starts: ``model=hub``'s checkpoint, the
    search's target), with the job's own overrides; refused there, not in ``run_guarded``, because an exception
    leaving a Hydra job first prints Hydra's own "Error executing job" line."""
    from hydra.core.hydra_config import HydraConfig

    refuse(e, list(HydraConfig.get().overrides.task), config_name)


def _submit_to_slurm(argv: list[str]) -> bool:
    """A sweep whose launcher is hydra-submitit's Slurm launcher goes to ``harness.submit`` instead, which submits
    every point and exits (the plugin waits for every job: days on the login node). Exits 0 after submitting, 2 with
    one line (and a failed row) when a point or the launch is refused; False for any other launcher."""
    import sys

    overrides = [a for a in argv if not a.startswith("-")]
    try:
        launcher = compose(sweeps.first_values(overrides), with_hydra=True).hydra.launcher
        slurm = str(launcher.get("_target_") or "").endswith("submitit_launcher.SlurmLauncher")
    except Exception:  # noqa: BLE001 - the checks below report a command line that does not compose
        return False
    if not slurm:
        return False

    try:
        submit.submit(overrides, cluster="slurm")
    except Exception as e:  # noqa: BLE001 - every refusal: one line + a failed row
        refuse(e, [o for o in overrides if not o.startswith("hydra")])
    sys.exit(0)


def resolve_model(cfg) -> None:
    """Resolve the ``model`` node now, before the row starts: ``model=hub`` reads its window, dtype and name from
    the checkpoint's ``config.json`` (``harness.conf_utils``), so a missing or wrong ``model.path`` is one line
    (``refuse``) rather than a run that fails later."""
    from omegaconf import OmegaConf

    OmegaConf.to_container(cfg.model, resolve=True, throw_on_missing=True)


def _names_of(overrides: list[str]) -> dict:
    """The group options a command line names (``model=hub`` -> {"model": "hub"}), for the row of a command line
    that does not compose: its model and method columns then say what was asked for."""
    out = {}
    for o in overrides:
        key, sep, value = o.lstrip("+~").partition("=")
        if sep and key in ("model", "method", "data", "train", "eval") and value:
            out[key] = value
    return out


def _results_dir_of(overrides: list[str]) -> str:
    """Where the failed row of a command line that does not compose goes: its own ``paths.results_dir=`` override
    (the last one; a sweep's comma list takes its first value) or, as the config does, ``$HARNESS_RESULTS_DIR`` or
    ``results``."""

    for o in reversed(overrides):
        key, sep, value = o.lstrip("+~").partition("=")
        if sep and key == "paths.results_dir" and value and "${" not in value:
            return value.split(",")[0]
    return env_setting("HARNESS_RESULTS_DIR", "results")


def precheck_sweep_or_exit(argv: list[str], config_name: str, validate) -> None:
    """``precheck_or_exit`` for another entry point (the factor search, the learning curves), whose root config is
    ``config_name``: before Hydra launches a sweep (``-m``), every job is composed and ``validate(cfg)`` (raises on a
    bad value); the first bad job is one line naming it, a failed row, exit 2, and nothing runs. A single run is left
    to Hydra and ``run_guarded`` (``config_refusal``)."""
    if not _multirun(argv) or _flags(argv) or any(a.startswith("hydra.searchpath") for a in argv):
        return
    overrides = plain_overrides(argv)
    try:
        _precheck_sweep(overrides, config_name, validate)
    except Exception as e:  # noqa: BLE001 - every failure: one line + a failed row
        refuse(e, overrides, config_name)


def _validate_run(cfg) -> None:
    pipeline.validate(cfg, data=False)  # data: the jobs check it where they run


def _precheck_sweep(overrides: list[str], config_name: str, validate) -> None:
    for job in sweeps.expand(overrides, config_name):
        try:
            validate(compose(job, config_name=config_name))
        except Exception as e:  # noqa: BLE001
            raise SweepJobError(job, e) from None


def explain(e: BaseException, overrides: list[str], config_name: str = "config") -> str:
    """One line for a composition or validation error, naming the override / key / file and the valid choices."""

    if isinstance(e, SweepJobError):
        why = explain(e.error, e.job, config_name).removeprefix("config error: ")
        return f"config error in sweep job [{' '.join(e.job)}]: {why}"

    if isinstance(e, ConfigError):
        return f"config error: {str(e).splitlines()[0]}"
    name = type(e).__name__
    msg = " ".join(str(e).split("\n")[:1]).strip() or name
    hint = ""
    if "Missing mandatory value: " in msg:  # a ??? in a YAML (model=hub's path)
        key = msg.split("Missing mandatory value: ", 1)[1].split()[0]
        return f"config error: {key} is required" + (" (model=hub: a checkpoint folder, or a hub id in the local "
                                                     "cache)" if key == "model.path" else "")
    if "raised while resolving interpolation: " in msg:  # a resolver's own message (harness.conf_utils)
        return "config error: " + msg.split("raised while resolving interpolation: ", 1)[1].split(" full_key:")[0]
    if "Could not find" in msg or "Could not load" in msg:
        quoted = [q for q in msg.split("'")[1::2] if "/" in q]
        group = quoted[0].rsplit("/", 1)[0] if quoted else ""
        gdir = CONF_DIR / group
        opts = sorted(p.stem for p in gdir.glob("*.yaml")) if group and gdir.is_dir() else []
        hint = f" (available: {', '.join(opts)})" if opts else ""
    elif "Could not override" in msg or "not in struct" in msg:
        key = next((q for q in msg.split("'")[1::2] if q), "")
        parent, _, leaf = key.rpartition(".")
        valid, extra = _valid_keys(parent, [o for o in overrides if not o.lstrip("+~").startswith(key + "=")],
                                   config_name)
        hint = f" (valid keys of {parent or 'the config'}: {', '.join(valid)}" if valid else ""
        if valid and extra:
            hint += f"; not in its YAML, set with +{parent}.<key>=...: {', '.join(extra)}"
        hint += ")" if valid else ""
    elif name == "OverrideParseException":
        bad = [o for o in overrides if _unparsable(o)]
        msg = f"cannot parse override {bad[0]!r}: {msg}" if bad else msg
        hint = " (syntax: https://hydra.cc/docs/advanced/override_grammar/basic)"
    return f"config error: {msg}{hint}"


def _valid_keys(parent: str, overrides: list[str], config_name: str = "config") -> tuple[list[str], list[str]]:
    """(keys of the composed node ``parent``, keys of its typed schema that its YAML leaves out)."""
    import dataclasses

    try:
        node = compose(first_values([o for o in overrides if not _unparsable(o)]), config_name=config_name)
        for part in [p for p in parent.split(".") if p]:
            node = node[part]
        keys = sorted(str(k) for k in node.keys())
    except Exception:  # noqa: BLE001 - a hint only
        return [], []
    schema = None
    try:
        if parent == "train":
            schema = TrainArgs
        elif parent == "method":
            schema = METHODS.get(str(node.get("name"))).Args
        elif parent == "model":
            schema = MODELS.get(str(node.get("builder") or node.get("name"))).Args
    except Exception:  # noqa: BLE001
        schema = None
    extra = sorted(f.name for f in dataclasses.fields(schema) if f.name not in keys) if schema else []
    return keys, extra


def _unparsable(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        OverridesParser.create().parse_overrides([override])
        return False
    except Exception:  # noqa: BLE001
        return True
