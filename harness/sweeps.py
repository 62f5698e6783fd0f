"""Sweeps outside of a Hydra app: the job list a multirun would launch, and each job's composed config.

``expand(["experiment=paper_llama2"])`` returns one override list per job, exactly as Hydra's basic sweeper builds
them (the experiment's ``hydra.sweeper.params`` first, then the command line, cartesian product in that order).
Used by ``scripts/render_sbatch.py`` (one array task per job), ``harness.submit`` (one submitit job per job) and
by the tests that compose every sweep point.
"""
from __future__ import annotations

import itertools

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from harness import conf_utils


class SweepJobError(Exception):
    """One job of a sweep that does not compose or validate (``job``: its overrides; ``error``: why)."""

    def __init__(self, job: list[str], error: BaseException):
        super().__init__(str(error))
        self.job, self.error = job, error


def compose(overrides: list[str], with_hydra: bool = False, config_name: str = "config"):
    """The config of one job (``with_hydra``: including the ``hydra`` node: launcher, sweeper, sweep dirs) of an entry
    point whose root config is ``config_name``."""
    return conf_utils.compose(overrides, config_name=config_name, with_hydra=with_hydra)


def first_values(overrides: list[str]) -> list[str]:
    """Each sweep override replaced by its first value (to compose the config that defines the sweep)."""
    parser = OverridesParser.create()
    out = []
    for o in parser.parse_overrides(overrides):
        if o.is_sweep_override():
            out.append(f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}")
        else:
            out.append(o.input_line)
    return out


def sweeper_params(argv: list[str], config_name: str = "config") -> list[str]:
    """``hydra.sweeper.params`` of the composed config, as override strings (resolved, as Hydra's sweeper reads
    them: ``point: ${points:tiny_study}`` is the experiment's every point)."""
    cfg = compose(first_values(argv), with_hydra=True, config_name=config_name)
    node = cfg.hydra.sweeper.get("params")
    params = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return [f"{k}={' '.join(str(v).split())}" for k, v in params.items()]


def expand(argv: list[str], config_name: str = "config") -> list[list[str]]:
    """Every job of ``python run.py -m <argv>`` (or of another entry point's, whose root config is ``config_name``):
    a list of override lists (the basic sweeper's order)."""
    parser = OverridesParser.create()
    return jobs(parser.parse_overrides(sweeper_params(argv, config_name) + list(argv)))


def jobs(overrides) -> list[list[str]]:
    """The jobs of parsed ``overrides`` in the basic sweeper's order (Hydra's ``BasicSweeper.split_arguments``, from
    its public override API): one list of ``key=value`` per key, in the order keys first appear (a later override of
    a key replaces its values in that place), a discrete sweep ``a,b`` giving its values; their cartesian product."""
    per_key: dict[str, list[str]] = {}
    for o in overrides:
        key = o.get_key_element()
        if o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise ValueError(f"{o.input_line}: the basic sweeper takes discrete sweeps (a,b,c) only")
            per_key[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            per_key[key] = [f"{key}={o.get_value_element_as_str()}"]
    return [list(x) for x in itertools.product(*per_key.values())]
