"""One evaluation plan: the one place a suite is cut into the pieces that run (:func:`plan`).

A run's suite (:class:`Suite`: its entries and their built evaluators) is evaluated in **units**: an entry whole, or
an entry restricted to some of its lengths. Every consumer takes its units from :func:`plan` and none cuts a suite
itself:

- in-process evaluation (``harness.pipeline.evaluate``): ``plan(suite, placement)``, an entry split only where its
  lengths need different numbers of GPUs per replica (a multi-GPU node, ``harness.pipeline.placement``);
- data-parallel evaluation (``harness.eval_distributed``): the ranks build each unit's evaluator from its ``node``;
- sharded evaluation (``harness.shards``): ``plan(suite, placement, by_length=True)``, one unit per length, named
  ``<entry>@<L>`` whatever the node's GPUs (a shard's name does not depend on where it runs);
- the cost estimate (``harness.plan.run_cost``, ``make plan``): each unit's ``count_prompts``.

A unit that restricts an entry's lengths evaluates a *view* of the entry made through the evaluator's declaration
(``Spec.view``: its ``pins``, what a part keeps of the whole entry, e.g. PPL's yarn document filter of the entry's
largest length), so an evaluator's pins hold by construction and a number never depends on how the suite was cut.
Only an evaluator that declares its lengths independent (``Spec.by_length``) is ever cut; a unit that covers all of an
entry's lengths is the entry itself. Lengths a placement leaves out (beyond the method's longest: they are reported
as skipped) go with the entry's first unit, so a cut entry reports them as the whole one does.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from harness.evals import build_evaluators


@dataclass(frozen=True)
class Suite:
    """An evaluation suite built once: its entries (``{key: resolved node}``, in order) and their evaluators. The
    stages share it: ``pipeline.setup`` checks it, ``pipeline.load_and_extend`` places the model by its units,
    ``pipeline.evaluate`` runs them."""

    nodes: dict
    evaluators: list

    @classmethod
    def build(cls, nodes: dict | None) -> Suite:
        nodes = dict(nodes or {})
        return cls(nodes, build_evaluators(nodes))

    @classmethod
    def of(cls, cfg) -> Suite:
        """The config's ``eval.suite``."""
        from omegaconf import OmegaConf

        return cls.build(OmegaConf.to_container(cfg.eval.suite, resolve=True))

    def only(self, entry: str, **changes) -> Suite:
        """A one-entry view of this suite: ``entry``'s node and evaluator with the settings ``changes``, without
        building again. An evaluator keeps its settings in ``args`` (the registry builds ``cls(args)``), so the
        view's evaluator is a shallow copy of the built one with ``args`` replaced; the suite's own evaluator is left
        as it was. Only :func:`plan` makes views with other lengths (through ``Spec.view``)."""
        i = list(self.nodes).index(entry)
        ev = copy.copy(self.evaluators[i])
        ev.args = dataclasses.replace(ev.args, **changes)
        return Suite({entry: {**self.nodes[entry], **changes}}, [ev])


@dataclass(frozen=True)
class Unit:
    """Part of a suite that runs as one piece: entry ``entry`` at ``lengths`` (None: the whole entry) on a replica
    spanning ``devices`` GPUs, evaluated by ``view`` (the suite's own evaluator for a whole entry), which a rank
    builds again from ``node``."""

    entry: str
    lengths: tuple | None
    devices: int
    view: Any
    node: dict

    @property
    def name(self) -> str:
        """``<entry>`` (whole), ``<entry>@<L>`` (one length: a shard's name) or ``<entry>@<L1>+<L2>``."""
        return self.entry if self.lengths is None else f"{self.entry}@{'+'.join(str(L) for L in self.lengths)}"


def plan(suite: Suite, placement: dict | None = None, by_length: bool = False) -> list[Unit]:
    """The units of ``suite``, in suite order (module docstring). ``placement``: ``{entry: {L: GPUs per replica}}``
    (``harness.pipeline.placement``; empty off a multi-GPU node); ``by_length``: one unit per length of every entry
    that may be cut (the shards)."""
    out = []
    for key, ev in zip(suite.nodes, suite.evaluators):
        at = (placement or {}).get(key) or {}
        lengths = [int(L) for L in (getattr(ev.args, "lengths", None) or [])]
        groups = _groups(lengths, at, by_length) if lengths and ev.spec.splits(ev.args) else [lengths]
        for g in groups:
            if g == lengths:  # the whole entry (a shard of an entry of one length: named by it)
                out.append(Unit(key, tuple(g) if by_length and g else None, max(at.values(), default=1), ev,
                                suite.nodes[key]))
            else:
                view = suite.only(key, **ev.spec.view(ev.args, g))
                out.append(Unit(key, tuple(g), max([at[L] for L in g if L in at] or [1]), view.evaluators[0],
                                view.nodes[key]))
    return out


def _groups(lengths: list[int], at: dict, by_length: bool) -> list[list[int]]:
    """An entry's lengths cut into groups: one per length (``by_length``), else one per number of GPUs per replica
    (fewest first), the lengths not placed joining the first group; all of them in one group otherwise."""
    if by_length:
        return [[L] for L in lengths]
    placed = sorted({at[L] for L in lengths if L in at})
    if len(placed) < 2:
        return [lengths]
    groups = [[L for L in lengths if at.get(L) == g] for g in placed]
    groups[0] = [L for L in lengths if L not in at or at[L] == placed[0]]
    return groups


# the work accounting an evaluator sums over its lengths (prompt tokens a PrefixCache did not encode again, those it
# encoded, decoding time): the units' values add up
ADDITIVE = ("tokens_reused", "tokens_encoded", "generation_seconds")


def merge_outputs(a, b, key: str | None = None):
    """The outputs of one entry's units (disjoint lengths) as one: dicts merged key by key, the ``ADDITIVE`` counts
    summed, anything else from ``b``."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge_outputs(out[k], v, k) if k in out else copy.deepcopy(v)
        return out
    if key in ADDITIVE and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
        return round(a + b, 2) if isinstance(a + b, float) else a + b
    return copy.deepcopy(b)
