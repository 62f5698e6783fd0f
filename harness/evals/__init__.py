"""Evaluators: one file + one YAML (``conf/evaluator/<name>.yaml``) each, registered by a stable short name.

An evaluator class has an ``Args`` dataclass (validated against its YAML) and ``run(handle, method, ctx)``
returning a JSON-able dict of metrics: ``{"metric": {length: value}, ...}`` plus whatever the tables need. Lengths
the method cannot serve are reported under ``"skipped"`` with a reason, never silently dropped. Per-sample records
go to ``ctx.samples_path(name)`` (JSONL beside the row). Its ``spec.version`` is recorded per suite entry in the row
(``eval_versions``): bump it when a change alters the evaluator's numbers.

Before anything loads, ``check_suite`` refuses impossible settings with one line naming the key and the valid
range: evaluation lengths that are not positive integers or exceed :data:`MAX_EVAL_WINDOWS` x the native window C,
and whatever an evaluator's own ``check(native_ctx, where)`` / ``check_data(where)`` hooks refuse (e.g. a PPL data
directory that is missing, empty or not text). ``max_length()`` (the longest input an evaluator builds) feeds the
memory check made once the model is loaded (``harness.models.check_fits``).

What the rest of the harness knows about an evaluator is declared once on its class, never in a table keyed by its
name: ``spec = Spec(...)`` (:class:`Spec`, a frozen dataclass: its headline ``metric``, the tables' ``reader``,
``records``, ``floor`` and ``extended`` column, whether it splits ``by_length``, ``generates``, runs ``data_parallel``,
its ``version``) and its cost model, the method ``count_prompts(lengths, limit) -> ({length: prompts}, basis)``
(optionally ``gen_tokens_per_prompt() -> (tokens, basis)``). Consumers read them through the registry
(``EVALS.spec(name)``) or an instance (``ev.spec``), never with a default of their own; the registry refuses a class
without them when it registers.

Data-parallel evaluation (``eval_world_size`` > 1, ``harness.eval_distributed``): every rank runs the same evaluator
on its own replica with an ``EvalContext`` that knows its ``rank`` and ``world_size``. ``ctx.map(fn, items)`` (or
``ctx.map_blocks`` for batched work) gives each rank one contiguous block of ``items`` and returns the full ordered
list of results on every rank, so everything after it (scores, intervals, records) is computed from the same list as
in a single process. Only the main rank writes (``ctx.is_main``; :func:`write_jsonl` writes nothing in the other
ranks). An evaluator whose prompt loop goes through ``ctx.map`` says so (``Spec(data_parallel=True)``); one without it
runs whole on every rank (correct, no faster).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from harness.config import ConfigError
from harness.memory import replica_gpus as gpus
from harness.registry import Registry
from harness.safe import safe_file


@dataclass(frozen=True)
class Spec:
    """What an evaluator declares about itself (``spec = Spec(...)`` on its class), the one place the report, the
    plan, the shards, the pipeline and the tables read it from."""

    metric: str                   # the headline metric of its output ({metric: {length: value}}), the one its ci is of
    reader: str | None = None     # how the tables read one length's number with its interval, by the output's shape
    #                               (controlled_study.estimates.SHAPES: proportion | niah | ruler | ppl | percent)
    records: dict | None = None   # the fields of its per-sample records the tables read for an interval when a row
    #                               keeps no per-sample scores (controlled_study.samples): length (the field giving the
    #                               length or shot count), task (where its number is a mean over tasks), score (a
    #                               tuple of field names: the first one a record has)
    floor: dict | None = None     # when the tables call it "not measurable at this scale" (controlled_study.estimates
    #                               .floor), in its own units: the frozen base below threshold at C, every method at
    #                               most chance everywhere, or at least ceiling everywhere
    extended: str | None = None   # its column in the 2024-benchmarks table (controlled_study.build.extended_table)
    extended_note: str | None = None  # what that column's number is, for the table's notes
    by_length: bool | Callable[[Any], bool] = False  # its lengths are computed independently (seeds per length): the
    #                               shards may split it into one shard per length and merge the outputs exactly
    #                               (harness.shards); or a function of its Args saying so (``splits``)
    generates: bool = False       # decodes with the KV cache of the whole prompt (the memory checks and the plan)
    data_parallel: bool = False   # its prompt loop goes through ctx.map / ctx.map_blocks (harness.eval_distributed)
    pins: Callable[[Any], dict] | None = None  # the settings a part of the entry (some of its lengths) keeps from the
    #                               whole entry, a function of its Args (PPL's yarn protocol: the document filter of the
    #                               entry's largest length); every such part is made by ``view``
    version: int = 1              # recorded per suite entry (eval_versions): bump it when a change alters its numbers

    def splits(self, args) -> bool:
        """Whether an evaluator with settings ``args`` may run as one shard per length (``by_length``)."""
        return bool(self.by_length(args) if callable(self.by_length) else self.by_length)

    def view(self, args, lengths) -> dict:
        """The settings of the part of an evaluator with settings ``args`` that runs at ``lengths`` only (``pins``:
        what it keeps of the whole entry); ``harness.evals.suite.plan``, the one place a suite is cut, makes every
        view with it."""
        return {**(self.pins(args) if self.pins is not None else {}), "lengths": [int(L) for L in lengths]}


def _check_declarations(name: str, cls) -> None:
    """Registration check of ``EVALS``: the declarations every evaluator makes (module docstring)."""
    missing = [a for a in ("spec", "count_prompts") if not hasattr(cls, a)]
    if missing:
        raise ConfigError(f"evaluator {name!r} ({getattr(cls, '__module__', '?')}) does not declare {missing} "
                          f"(harness.evals: spec = Spec(metric=...), what it is, and the plan's cost model)")
    if not isinstance(cls.spec, Spec):
        raise ConfigError(f"evaluator {name!r} ({getattr(cls, '__module__', '?')}): spec is a "
                          f"{type(cls.spec).__name__}, not a harness.evals.Spec")


class Evaluators(Registry):
    """The evaluator registry: a registered class's declarations by its name (``spec``)."""

    def spec(self, name: str) -> Spec:
        """What evaluator ``name`` declares (:class:`Spec`)."""
        return self.get(name).spec


EVALS: Evaluators = Evaluators("evaluator", "harness.evals", check=_check_declarations)
MAX_EVAL_WINDOWS = 1024  # the longest evaluation length: this many native windows (LLaMA2: 4M tokens; tiny: 262k)


@dataclass
class EvalArgs:
    name: str = ""
    lengths: list = field(default_factory=list)  # evaluation lengths in tokens


@dataclass
class EvalContext:
    """What an evaluator may use besides the model: where to write per-sample records, the seed, autocast, how many
    tokens to batch, and a cache of window NLLs valid for this one evaluation of one (fixed) model."""

    run_dir: Path
    seed: int = 0
    autocast: str = "auto"  # compute dtype: auto (bf16 where the hardware has it) | bfloat16 | float32
    batch_tokens: int = 8192  # windows of one length scored together up to this many tokens (0 = one at a time)
    nll_cache: dict | None = field(default_factory=dict)  # window NLLs shared by one run's evaluators; None = off
    rank: int = 0  # this process's rank in a data-parallel evaluation (harness.eval_distributed)
    world_size: int = 1  # ranks evaluating together; 1 = one process (map is a plain loop)
    group: Any = None  # the torch.distributed process group (None = the default group)
    computed: int = 0  # items of map / map_blocks this process computed itself (what its rank contributed)
    entry: str = ""  # the suite entry being evaluated (progress lines name it)
    progress: Any = None  # progress(entry, done, total) after each prompt of map (harness.report.EvalProgress)

    @property
    def is_main(self) -> bool:
        """Whether this process writes (samples JSONL, outputs): rank 0."""
        return self.rank == 0

    def samples_path(self, evaluator: str) -> Path:
        p = safe_file(Path(self.run_dir) / "samples", evaluator, ".jsonl", "suite entry")
        if self.is_main:
            p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def map(self, fn, items) -> list:
        """``[fn(x) for x in items]``; with several ranks each computes one contiguous block (order preserved, so a
        prefix-reuse order stays one within a block) and every rank gets the whole ordered list back."""
        items = list(items)
        if self.world_size == 1:
            self.computed += len(items)
            return self._each(fn, items)
        return self.map_blocks(lambda block: self._each(fn, block), items)

    def _each(self, fn, items: list) -> list:
        """``[fn(x) for x in items]``, reporting each finished item to ``progress`` (the main rank's own block in a
        data-parallel run)."""
        if self.progress is None or not self.is_main:
            return [fn(x) for x in items]
        out = []
        for x in items:
            out.append(fn(x))
            self.progress(self.entry or "eval", len(out), len(items))
        return out

    def map_blocks(self, fn, items, align: int = 1) -> list:
        """``fn(items)`` (a list of results, one per item, in order) computed block-wise: each rank calls ``fn`` once
        on its contiguous block (block edges at multiples of ``align``, e.g. a batch size, so batches are the ones
        one process would form), and the blocks' results are all-gathered in rank order. One rank: ``fn(items)``."""
        items = list(items)
        if self.world_size == 1:
            self.computed += len(items)
            out = list(fn(items))
            if self.progress is not None and items:
                self.progress(self.entry or "eval", len(items), len(items))
            return out
        lo, hi = block_bounds(len(items), self.rank, self.world_size, align)
        self.computed += hi - lo
        mine = list(fn(items[lo:hi])) if hi > lo else []
        if len(mine) != hi - lo:
            raise RuntimeError(f"map_blocks: fn returned {len(mine)} results for {hi - lo} items")
        import torch.distributed as dist

        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, mine, group=self.group)
        return [r for part in parts for r in part]


def block_bounds(n: int, rank: int, world: int, align: int = 1) -> tuple[int, int]:
    """``[lo, hi)`` of rank ``rank``'s contiguous block of ``n`` items split over ``world`` ranks: units of ``align``
    items, as even as possible, the first ranks taking one unit more."""
    align = max(1, int(align))
    units = -(-n // align)
    base, extra = divmod(units, world)
    start = rank * base + min(rank, extra)
    end = start + base + (1 if rank < extra else 0)
    return min(n, start * align), min(n, end * align)


_WRITER = [True]  # False in the non-main ranks of a data-parallel evaluation


def set_writer(main: bool) -> None:
    """Make :func:`write_jsonl` write (the main rank, a single process) or not (the other ranks)."""
    _WRITER[0] = bool(main)


@runtime_checkable
class Evaluator(Protocol):
    """The contract of a registered evaluator: an ``Args`` dataclass (``EvalArgs`` or a subclass), built as
    ``cls(args)`` (``Registry.build``), ``run(handle, method, ctx) -> dict`` of JSON-able metrics, and its
    declarations (module docstring: ``spec``, ``count_prompts``; optional ``gen_tokens_per_prompt()``). Optional
    hooks, called when present: ``check(native_ctx, where)``, ``check_data(where)``, ``max_length()``."""

    Args: ClassVar[type]
    args: Any
    spec: ClassVar[Spec]

    def count_prompts(self, lengths: list, limit: int | None) -> tuple[dict, str]: ...

    def run(self, handle: Any, method: Any, ctx: EvalContext) -> dict: ...


def lengths_within(own, lengths, limit: int | None) -> list[int]:
    """An evaluator's lengths (its own, else the eval's default ``lengths``) up to ``limit`` (None = all): what it
    evaluates under a method that supports at most ``limit`` tokens (``count_prompts``)."""
    return [int(L) for L in (own or lengths or []) if limit is None or int(L) <= limit]


def tasks_x_samples(a, lengths, limit: int | None) -> tuple[dict, str]:
    """``count_prompts`` of an evaluator that runs ``a.samples`` prompts of each of ``a.tasks`` at every length
    (RULER, BABILong, HELMET recall): {length: tasks x samples} and its basis."""
    n = len(a.tasks) * a.samples
    return ({L: n for L in lengths_within(a.lengths, lengths, limit)},
            f"{len(a.tasks)} tasks x {a.samples} samples x lengths")


def build_evaluators(suite_cfg) -> list:
    """The one builder for the eval suite: ``{name: node}`` -> evaluator instances, in order."""
    return [EVALS.build(node, f"eval.suite.{key}", name=(node or {}).get("name") or key)
            for key, node in (suite_cfg or {}).items()]


def check_lengths(lengths, native_ctx: int, key: str) -> list[int]:
    """Evaluation lengths: positive integers up to MAX_EVAL_WINDOWS x C. Returns them as ints."""
    cap = MAX_EVAL_WINDOWS * int(native_ctx)
    out = []
    for L in lengths or []:
        if isinstance(L, bool) or not isinstance(L, (int, float)) or not math.isfinite(L) or L != int(L) or \
                not 1 <= L <= cap:
            raise ConfigError(f"{key}: {L!r} is not a possible evaluation length (valid: integers 1..{cap} tokens "
                              f"= {MAX_EVAL_WINDOWS} x the native window C = {native_ctx})")
        out.append(int(L))
    return out


def method_limit(method, native_ctx: int) -> int | None:
    """The longest evaluation length ``method`` serves, from its settings and the native window alone (None: no
    limit, or one that needs the loaded model)."""
    handle = type("Handle", (), {"native_ctx": int(native_ctx)})()
    try:
        return method.max_length(handle)
    except Exception:  # noqa: BLE001 - a limit that needs the loaded model: none assumed
        return None


def replica_gpus(ev, lengths: list, limit: int | None, shape: dict, itemsize: int, gpu_bytes) -> dict:
    """``{L: GPUs one model replica spans}`` for every length ``ev`` runs (its ``count_prompts(lengths, limit)``:
    ``lengths`` the suite's default lengths, ``limit`` the method's longest length) on GPUs of ``gpu_bytes`` each
    (``harness.memory.replica_gpus``; None: no number of GPUs holds it). The one device-map rule: ``make plan``
    (``harness.plan``) and ``run.py`` (``harness.pipeline.placement``) both call it, per evaluator and length."""

    counts, _ = ev.count_prompts(list(lengths or []), limit)
    return {int(L): gpus(shape, int(L), itemsize, ev.spec.generates, gpu_bytes) for L in counts}


def max_length(ev) -> int:
    """The longest input (tokens) an evaluator builds: its own ``max_length()`` or the largest of its lengths."""
    if hasattr(ev, "max_length"):
        return int(ev.max_length())
    return max([int(x) for x in ev.args.lengths] or [0])


def check_suite(suite_cfg, native_ctx: int, data: bool = True, evaluators: list | None = None) -> list:
    """Build the suite (unless ``evaluators``, already built from ``suite_cfg``, are given) and check every evaluator
    against the model's native window (and, with ``data``, that its local data can be read) before anything loads.
    Returns the evaluators."""
    suite = dict(suite_cfg or {})
    evaluators = build_evaluators(suite) if evaluators is None else evaluators
    for key, ev in zip(suite, evaluators):
        where = f"eval.suite.{key}"
        check_counts(ev.args, where)
        check_lengths(ev.args.lengths, native_ctx, f"{where}.lengths")
        if hasattr(ev, "check"):
            ev.check(native_ctx, where)
        L = max_length(ev)
        if L < 1:
            raise ConfigError(f"{where}: no length to evaluate (its lengths and eval.lengths are empty: the row would "
                              f"measure nothing; valid: a list of lengths, e.g. eval.lengths=[{native_ctx}])")
        if L > MAX_EVAL_WINDOWS * native_ctx:
            raise ConfigError(f"{where}: builds inputs of {L} tokens (valid: up to {MAX_EVAL_WINDOWS * native_ctx} "
                              f"= {MAX_EVAL_WINDOWS} x the native window C = {native_ctx})")
        if data and hasattr(ev, "check_data"):
            ev.check_data(where)
    return evaluators


# upper bounds of an evaluator's count settings, checked before anything loads (``check_counts``; docs/bad_inputs.md):
# far above any study's (the paper's suites: 1000 passkey prompts, 200 RULER samples per task, 128 generated tokens),
# far below what would run for days or fill the memory (samples=1e9 ran for 15 minutes before anything was measured)
MAX_SAMPLES = 100_000
MAX_GEN_TOKENS = 4_096
COUNT_BOUNDS = {"samples": MAX_SAMPLES, "limit": MAX_SAMPLES, "max_windows": MAX_SAMPLES, "buckets": MAX_SAMPLES,
                "shots": MAX_SAMPLES, "depth_intervals": 1_000, "depth_bins": 1_000, "gen_tokens": MAX_GEN_TOKENS,
                "max_new_tokens": MAX_GEN_TOKENS, "max_gen": MAX_GEN_TOKENS, "max_gen_cap": MAX_GEN_TOKENS}


def check_counts(args, where: str) -> None:
    """Each count setting of an evaluator's ``args`` (``COUNT_BOUNDS``: samples, generated tokens, ...) at most its
    bound: one line naming the key, the value and the bound."""
    for k, bound in COUNT_BOUNDS.items():
        v = getattr(args, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > bound:
            raise ConfigError(f"{where}.{k} = {v} is above the bound of {bound} (valid: 1..{bound}; the bounds: "
                              f"harness/evals/__init__.py COUNT_BOUNDS)")


def check_nonneg(where: str, **values) -> None:
    """Integer settings that must be >= 0 (0 usually meaning "default"); one line naming the first bad key."""
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{where}.{k} must be an integer >= 0, got {v!r}")


def check_positive(where: str, **values) -> None:
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}.{k} must be an integer >= 1, got {v!r}")


def split_lengths(lengths, handle, method) -> tuple[list[int], dict]:
    """Lengths the method supports, and {length: reason} for the ones it does not."""
    lim = method.max_length(handle) if method is not None else None
    ok, skipped = [], {}
    for L in lengths:
        L = int(L)
        if L <= 0:
            raise ConfigError(f"evaluation length must be positive, got {L}")
        if lim is not None and L > lim:
            skipped[str(L)] = f"method {method.name} supports at most {lim} tokens"
        else:
            ok.append(L)
    return ok, skipped


def write_jsonl(path: Path, records) -> None:
    if not _WRITER[0]:  # a non-main rank of a data-parallel evaluation: rank 0 writes the records
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    except OSError as e:  # a full disk's write() error names no file: name it
        if e.filename is None and e.errno is not None:
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise
