"""The stages ``run.py`` calls, each a plain function: validate every group (``setup``), load + extend the model,
fine-tune, evaluate. Config objects stop here: every stage converts its group to typed arguments once, and the
evaluation suite is built once per run (``Suite``) and passed from stage to stage. The row the stages record into is
``harness.lifecycle``'s; the pieces the suite is evaluated in are ``harness.evals.suite.plan``'s (its units)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from harness import codeversion, models, results, search  # codeversion, models: read at call time (tests stand in)
from harness import progress as plog
from harness.config import AUTOCAST, ConfigError, to_args
from harness.data import build_data, check_budget
from harness.eval_distributed import evaluate_parallel, resolve_world_size
from harness.evals import (
    EvalContext,
    check_lengths,
    check_suite,
    convergence,
    method_limit,
    replica_gpus,
)
from harness.evals import max_length as eval_max_length
from harness.evals.eval_progress import EvalProgress
from harness.evals.suite import Suite, Unit, merge_outputs
from harness.evals.suite import plan as plan_units
from harness.evals.watch import EvalOutOfMemory, oom_line, watch_lengths
from harness.methods import Method, StageContext, build_method, check_checkpoint_method, save_method
from harness.methods.flex import AttentionArgs, set_backend
from harness.methods.persist import save as save_model
from harness.models import (
    DTYPES,
    build_model,
    check_device,
    check_fits,
    checkpoint_shape,
    gpus_of,
    hf_config,
    reposition,
    visible_gpus,
)
from harness.safe import NonFinite, UnsafeName, check_finite, check_name
from harness.train import TrainArgs, loop  # loop: read at call time (tests stand in a loop that trains nothing)
from harness.train.checkpoint import share
from harness.train.deepspeed_engine import launch
from harness.train.step import check_finite_weights
from harness.train.zero import sequence


def native_ctx(cfg) -> int:
    """The model config's native window C (what every length setting is a multiple of), checked."""
    c = (cfg.get("model") or {}).get("native_ctx")
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise ConfigError(f"model={cfg.model.get('name')}: native_ctx must be a positive integer (the pretrained "
                          f"window C in tokens), got {c!r}")
    return c


@dataclass(frozen=True)
class Setup:
    """What ``setup`` checked and built: the method, the train recipe and the suite."""

    method: Method
    train: TrainArgs
    suite: Suite


def validate(cfg, data: bool = True):
    """``setup``'s checks, for a caller that needs only the method and the recipe: returns ``(method, train)``."""
    s = setup(cfg, data)
    return s.method, s.train


def setup(cfg, data: bool = True, suite: Suite | None = None) -> Setup:
    """Check every group before anything loads: the method against the model's native window C and the train
    recipe, the recipe itself and its token budget against what the data is for (``harness.data.check_budget``), the
    attention backend, the evaluation autocast, and every evaluator (lengths, settings and, with ``data``, that its
    local data and the method's files can be read). Each impossible value is one ConfigError line naming the key and
    the valid range. ``suite``: the config's ``eval.suite`` when the caller already built it (``harness.shards``:
    checked here, not built again)."""
    c = native_ctx(cfg)
    check_names(cfg)
    check_seed(cfg.get("seed", 0), "seed")
    check_model_files(cfg.model)
    method = build_method(cfg.method)
    path = str(cfg.model.get("path") or "")
    if path and os.path.isdir(path):  # a folder tied to a method (fine-tuned, or saved with it): before it loads
        check_checkpoint_method(path, method)
    attention_args(cfg)
    train = to_args(TrainArgs, cfg.train, f"train={cfg.train.get('name')}")
    train.validate()
    if train.enabled and cfg.get("data") is not None:
        check_budget(cfg.data, train.name, train.tokens)  # the data is meant for this recipe's token budget
    method.check(c, train)
    config = hf_config(cfg.model)
    method.check_model(config, c)  # what the method needs of the model, before any weights load
    sequence.check(train, method, config or cfg.model.get("shape"))  # train.sequence_parallel: method, heads
    if data:
        method.check_data(c)
    check_autocast(cfg.get("autocast", "auto"), "autocast")
    check_device(cfg.get("device", "auto"))
    bt = cfg.get("eval_batch_tokens", 8192)
    if isinstance(bt, bool) or not isinstance(bt, int) or bt < 0:
        raise ConfigError(f"eval_batch_tokens: {bt!r} is not a token count (valid: an integer >= 0; 0 = one PPL window "
                          f"at a time)")
    eval_world_size(cfg)
    ckpt = Path(str(cfg.paths.ckpt_dir))
    if ckpt.exists() and not ckpt.is_dir():
        raise ConfigError(f"paths.ckpt_dir: {ckpt} is a file, not a directory (valid: a directory, created if missing)")
    check_lengths(list(cfg.eval.get("lengths") or []), c, "eval.lengths")
    if suite is None:
        nodes = dict(OmegaConf.to_container(cfg.eval.suite, resolve=True) or {})
        suite = Suite(nodes, check_suite(nodes, c, data=data))
    else:
        check_suite(suite.nodes, c, data=data, evaluators=suite.evaluators)
    return Setup(method, train, suite)


def check_names(cfg) -> None:
    """The names that become file names or table columns (each group's ``name``, each suite entry) are safe names
    (``harness.safe.check_name``): a name from a setting never becomes a path."""
    try:
        for g in results.GROUPS:
            node = cfg.get(g)
            if node is not None and node.get("name") is not None:
                check_name(node.get("name"), f"{g}.name")
        for key in (cfg.eval.get("suite") or {}):
            check_name(str(key), "eval.suite entry")
    except UnsafeName as e:
        raise ConfigError(str(e)) from None


def check_seed(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: {value!r} is not a seed (valid: an integer, e.g. {key}=0)")


# the files one of which a tokenizer folder must hold (fast tokenizer, SentencePiece, BPE / WordPiece vocabularies)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def check_model_files(cfg_model) -> None:
    """Before the model loads: ``model.dtype`` is a weights dtype, and a local ``model.path`` folder holds a
    tokenizer (else transformers' message, cut to one line, ends mid-list)."""
    dtype = cfg_model.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype: unknown weights dtype {dtype!r} (valid: {', '.join(DTYPES)})")
    path = str(cfg_model.get("path") or "")
    if path and os.path.isdir(path) and not cfg_model.get("gguf_file"):
        if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
            raise ConfigError(f"model.path: {path} has no tokenizer files (valid: a folder with one of "
                              f"{', '.join(TOKENIZER_FILES)}, beside config.json and the weights)")


def attention_args(cfg) -> AttentionArgs:
    a = to_args(AttentionArgs, cfg.get("attention"), "attention")
    a.validate()
    return a


def check_autocast(value, key: str) -> None:
    if value not in AUTOCAST:
        raise ConfigError(f"{key}: unknown compute dtype {value!r} (valid: {', '.join(AUTOCAST)})")


def load_and_extend(cfg, method, train: TrainArgs | None = None, before_extend=None, suite: Suite | None = None,
                    names=None):
    """Model + method: load the base (or a fine-tuned checkpoint) placed for the first unit of the suite's evaluation
    plan (:func:`eval_units`: per evaluator and length, the rule ``make plan`` uses; ``evaluate`` re-places per unit;
    ``names``: the units a sharded job runs), then :func:`prepare` it (memory check, checkpoint check, convergence
    baseline, the method applied)."""
    t0 = plog.stage("load", f"model={cfg.model.get('name')} method={cfg.method.get('name')}")
    device = check_device(cfg.get("device", "auto"))
    if suite is None:
        suite = Suite.of(cfg)
    units = eval_units(cfg, suite, method, device, names)
    first = units[0].devices if units else 1  # placed for the first unit; evaluate re-places per unit
    handle = build_model(cfg.model, device=device, device_map=first if first > 1 else None)
    handle.info["eval_units"] = (id(suite), _names_key(names), units)  # the plan they are for
    handle = prepare(cfg, handle, method, train, before_extend, suite, names=names)
    plog.done("load", t0, f"{handle.info.get('name') or cfg.model.get('name')} on {device}")
    return handle


def prepare(cfg, handle, method, train: TrainArgs | None = None, before_extend=None, suite: Suite | None = None,
            applied: bool = False, names=None):
    """A loaded model (``load_and_extend``'s, or one a caller of ``harness.api`` passes in) made ready: check that
    the longest evaluation input fits in memory (on the placement each unit will run on, when ``load_and_extend``
    placed it), that a checkpoint folder was saved under this method, measure the
    base inside its window before a fine-tuning run (``harness.evals.convergence``), so that the fine-tuned row can
    be compared with it on the same documents and prompts, and :func:`extend` it with the method (``applied``: the
    caller already did). ``before_extend(handle)`` lets a caller measure the base model too (learning curves)."""
    if suite is None:
        suite = Suite.of(cfg)
    units = placed_units(handle, suite, names)
    if units is not None:
        first = units[0].devices if units else 1
        for unit in units:  # the units on the first placement now; evaluate checks the others when it re-places
            if unit.devices == first:
                check_unit(handle, unit)
    else:
        for unit in selected(suite, names):
            check_unit(handle, unit)
    path = handle.info.get("path", "")
    if os.path.isdir(path):
        check_checkpoint_method(path, method)
    if train is not None and train.enabled and train.convergence_check:
        # the gate's own held-out prompts and books, derived from the run seed (never the suite's)
        tg = plog.stage("convergence gate, the base at C")
        handle.info["baseline_at_C"] = convergence.measure(handle, run_seed=int(cfg.seed),
                                                           autocast=str(cfg.get("autocast", "auto")),
                                                           progress=EvalProgress(terminal=False))
        plog.done("convergence gate, the base at C", tg)
    if before_extend is not None:
        before_extend(handle)
    if not applied:
        extend(handle, method, attention_args(cfg).backend)
    return handle


def extend(handle, method, backend: str = "auto", log=None) -> None:
    """The one way a method goes onto a loaded model: the attention backend chosen (``attention.backend``), the
    method applied, and every setting of the model's config the method does not apply (a sliding window under the
    blocked-attention methods) printed in one line, not only recorded in the row (``checkpoint_attention``)."""
    import sys

    set_backend(handle.model, backend)
    method.apply(handle)
    for line in dropped_settings(method):
        (log or (lambda m: print(m, file=sys.stderr, flush=True)))(line)


def dropped_settings(method) -> list[str]:
    """One line per setting of the model's config the applied ``method`` does not apply."""
    rec = getattr(method, "checkpoint_attention", None) or {}
    return [f"method={method.name}: the model's {key} = {value} is not applied (the method attends as its original "
            f"does; recorded in the row's method_params.checkpoint_attention)"
            for key, value in rec.items() if key != "action" and rec.get("action") == "dropped"]


def placement(cfg, suite: Suite, method, device) -> dict:
    """``{entry: {L: GPUs one replica spans}}`` for every evaluator and length of ``suite``: the rule of
    ``harness.evals.replica_gpus`` -- the one ``make plan`` uses -- with the checkpoint's shape and ``device``'s free
    memory, capped at the GPUs visible from ``device``; ``{}`` off a GPU or with one visible."""

    visible = visible_gpus(device)
    free = models.available_memory(device) if visible > 1 else None
    if not free:
        return {}
    shape, itemsize = checkpoint_shape(cfg.model)
    limit = method_limit(method, native_ctx(cfg))
    lengths = list(cfg.eval.get("lengths") or [])
    out = {}
    for key, ev in zip(suite.nodes, suite.evaluators):
        at = replica_gpus(ev, lengths, limit, shape, itemsize, free)
        out[key] = {L: visible if g is None else min(g, visible) for L, g in at.items()}
    return out


def selected(suite: Suite, names=None, place: dict | None = None) -> list[Unit]:
    """The units of ``suite`` a run evaluates (``harness.evals.suite.plan`` on the placement ``place``): all of them
    (``names`` None), or a sharded job's, one unit per length, those named in ``names`` (``harness.shards``)."""
    units = plan_units(suite, place, by_length=names is not None)
    return units if names is None else [u for u in units if u.name in set(names)]


def eval_units(cfg, suite: Suite, method, device, names=None) -> list[Unit]:
    """:func:`selected` on this node's :func:`placement` (GPUs per replica at every length)."""
    return selected(suite, names, placement(cfg, suite, method, device))


def _names_key(names) -> tuple | None:
    return None if names is None else tuple(names)


def placed_units(handle, suite: Suite, names=None) -> list[Unit] | None:
    """The units ``load_and_extend`` placed ``handle`` for, when it placed it for this suite and these names."""
    rec = handle.info.get("eval_units")
    if rec is not None and rec[0] == id(suite) and rec[1] == _names_key(names):
        return rec[2]
    return None


def check_unit(handle, unit: Unit) -> None:
    """``check_fits`` of the unit's longest input on the model as it is placed."""
    check_fits(handle, eval_max_length(unit.view), generates=unit.view.spec.generates, key=f"eval.suite.{unit.entry}")


def finetune(cfg, handle, method, a: TrainArgs, run_dir: str | Path, progress=None) -> dict | None:
    """Fine-tune (``train.enabled``), run the method's own stage after it (``Method.after_finetune``, e.g. LongRoPE's
    recovery search), measure the convergence gate and save the checkpoint under ``<run_dir>/checkpoint``. Returns
    the row's ``train_info`` (None for a frozen run)."""
    if not a.enabled:
        return None
    fingerprint = resume_key(cfg)
    ckpt_dir = Path(cfg.paths.ckpt_dir) / fingerprint
    t0 = plog.stage("data", f"data={cfg.data.get('name')}: {a.tokens} tokens in sequences of {a.seq_len}")
    chunks = build_data(cfg.data, handle.tokenizer, a.seq_len, a.tokens)
    plog.done("data", t0, f"{len(chunks)} sequences")
    t0 = plog.stage("fine-tune", f"{a.steps()} steps of {a.global_batch} x {a.seq_len} tokens, engine {a.engine}")
    if a.engine == "deepspeed":
        info = launch(cfg, handle, method, a, ckpt_dir, fingerprint, Path(run_dir))
    else:
        info = loop.finetune(handle, method, chunks, a, ckpt_dir, fingerprint, progress)
    check_finite_weights(handle.model, f"fine-tuning ({info.get('steps', '?')} steps)")  # the last update's NaN
    plog.done("fine-tune", t0)
    # the method's own stage on the tuned model, before the gate sees it (LongRoPE: its short factors' search)
    info.update(method.after_finetune(handle, StageContext(Path(run_dir), int(cfg.seed),
                                                           str(cfg.get("autocast", "auto")), search)) or {})
    if "baseline_at_C" in handle.info:  # the convergence gate: adapted to the method, or an unfinished recipe?

        tg = plog.stage("convergence gate, the fine-tuned model at C")
        tuned = convergence.measure(handle, method, run_seed=int(cfg.seed),
                                    autocast=str(cfg.get("autocast", "auto")), progress=EvalProgress(terminal=False))
        info["convergence"] = convergence.verdict(handle.info["baseline_at_C"], tuned)
        plog.done("convergence gate, the fine-tuned model at C", tg,
                  "passed" if info["convergence"].get("converged") else "NOT passed")
    check_finite(info, "train_info")  # the gate's PPL of a diverged model: a failure, named
    out = Path(run_dir) / "checkpoint"
    tg = plog.stage("checkpoint", str(out))
    save_model(handle.model, out, handle.tokenizer)  # the method kept: a standard config, or recorded and refused
    save_method(out, method)  # by plain transformers (harness.methods.persist)

    share(out)  # safetensors writes the weights 0600: teammates read them as they read rows (the umask's mode)
    plog.done("checkpoint", tg)
    info["checkpoint"] = str(out)
    return info


# bookkeeping keys that do not change the weights (a resumed run may change them)
NOT_IN_RESUME_KEY = {"data": ("cache_dir", "max_tokens", "scale", "larger"),
                     "train": ("save_every", "save_every_s", "log_every", "keep_checkpoints", "convergence_check")}


def resume_key(cfg) -> str:
    """The key of a fine-tune's resumable checkpoints: the groups that change the weights (model, method, data,
    train; bookkeeping keys left out) and the training code's version (``harness.codeversion``)."""
    groups = {}
    for g in ("model", "method", "data", "train"):
        node = OmegaConf.to_container(cfg[g], resolve=True)
        groups[g] = {k: v for k, v in node.items() if k not in NOT_IN_RESUME_KEY.get(g, ())}

    return results.config_hash({**groups, "code": codeversion.train_code_version()})


def evaluations(cfg, handle, method, run_dir: str | Path, suite: Suite | None = None, progress=None):
    """Every entry of ``suite`` (default: the config's whole ``eval.suite``) evaluated, its units merged: yields
    ``(entry, output, seconds, version)`` in suite order (``version``: the evaluator's, :func:`eval_version`),
    per-sample records under ``run_dir``. :func:`evaluate` is the stage that records into a row."""
    if suite is None:
        suite = Suite.of(cfg)
    units = placed_units(handle, suite) or eval_units(cfg, suite, method, check_device(cfg.get("device", "auto")))
    done: dict = {}
    left = {k: sum(u.entry == k for u in units) for k in suite.nodes}
    for unit, out, seconds, version in evaluate_units(cfg, handle, method, units, lambda u: Path(run_dir), progress):
        prev = done.get(unit.entry)
        done[unit.entry] = (merge_outputs(prev[0], out), round(prev[1] + seconds, 2)) if prev else (out, seconds)
        left[unit.entry] -= 1
        if not left[unit.entry]:
            yield unit.entry, *done[unit.entry], version


def evaluate_units(cfg, handle, method, units: list[Unit], samples_dir, progress=None, seen: dict | None = None,
                   on_failure=None):
    """Evaluate ``units`` (``harness.evals.suite.plan``'s) with one shared context; yields ``(unit, output, seconds,
    version)`` in order. Consecutive units on the same placement run together: with ``eval_world_size`` > 1 in one
    torchrun launch of that many data-parallel ranks (``harness.eval_distributed``, one model load per rank), else
    here, the model re-placed per unit. ``samples_dir(unit)``: where a unit's per-sample records go. A unit that
    fails goes to ``on_failure(unit, error)``, which says whether the next units still run (else it raises); an
    out-of-memory error is first made :class:`EvalOutOfMemory`'s one line (``seen``: the decoder's last lengths)."""
    ctx = EvalContext(run_dir=Path("."), seed=int(cfg.seed), autocast=str(cfg.get("autocast", "auto")),
                      batch_tokens=int(cfg.get("eval_batch_tokens", 8192)), progress=progress)
    launches: list = []
    for unit in units:
        if launches and launches[-1][-1].devices == unit.devices:
            launches[-1].append(unit)
        else:
            launches.append([unit])
    for batch in launches:
        world = eval_world_size(cfg, handle, gpus=batch[0].devices)
        parallel = evaluate_parallel(cfg, handle, method, batch, world, samples_dir, gpus=batch[0].devices) \
            if world > 1 else None
        for i, unit in enumerate(batch):
            try:
                out, seconds = next(parallel) if parallel is not None else \
                    _evaluate_here(cfg, handle, method, unit, ctx, samples_dir(unit))
                check_finite(out, f"eval.suite.{unit.entry}")  # a non-finite metric fails the unit, naming the value
            except Exception as raised:  # the unit's failure: recorded by the caller, or raised
                e = EvalOutOfMemory(oom_line(f"eval.suite.{unit.entry}", raised, seen, handle)) \
                    if seen is not None and _is_oom(raised) else raised
                if on_failure is None or not on_failure(unit, e):
                    if e is raised:
                        raise
                    raise e from raised
                if parallel is None:
                    continue
                for other in batch[i + 1:]:  # a failed launch ends its other units too
                    on_failure(other, e)
                break
            yield unit, out, seconds, eval_version(unit.view)


def _is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError)  # torch.cuda.OutOfMemoryError is the same class


def _evaluate_here(cfg, handle, method, unit: Unit, ctx, run_dir: Path) -> tuple[dict, float]:
    """One unit in this process, the model placed for it: ``(output, seconds)``; its progress lines from its start
    (its times include its first prompt)."""
    if "eval_units" in handle.info:  # placed by load_and_extend: the unit's placement
        reposition(handle, check_device(cfg.get("device", "auto")), unit.devices)
        check_unit(handle, unit)
    ctx.entry, ctx.run_dir = unit.entry, Path(run_dir)
    ev = unit.view
    lengths = getattr(getattr(ev, "args", None), "lengths", None)
    t0 = plog.stage(f"eval {unit.entry}", f"{getattr(ev, 'registered_name', type(ev).__name__)}"
                    + (f", lengths {list(lengths)}" if lengths else ""))
    if ctx.progress is not None and hasattr(ctx.progress, "begin"):
        ctx.progress.begin(unit.entry)   # the entry's clock starts now: its times include its first prompt
    try:
        out = ev.run(handle, method, ctx)
    except OverflowError as e:  # a derived number (exp of a mean NLL) out of range: the entry names where
        raise NonFinite(f"eval.suite.{unit.entry}: a derived number overflowed ({e}; a diverged model?)") from None
    seconds = round(time.time() - t0, 2)
    plog.done(f"eval {unit.entry}", t0)
    return out, seconds


def eval_world_size(cfg, handle=None, gpus: int | None = None) -> int:
    """``eval_world_size``: ``auto`` (the replicas the visible CUDA GPUs hold: one per GPU, or one per g GPUs when a
    replica spans g of them: ``gpus``, else the loaded model's; 1 on CPU) or an integer >= 1, resolved; one line
    naming the key otherwise."""

    if gpus is None:
        gpus = gpus_of(handle) if handle is not None else 1
    return resolve_world_size(cfg.get("eval_world_size", "auto"), gpus_per_replica=gpus)


def eval_version(ev) -> int:
    """The version an evaluator declares (``spec.version``)."""
    return int(ev.spec.version)


def evaluate(cfg, handle, method, run, suite: Suite | None = None, on_result=None, progress=None,
             names=None) -> None:
    """Run the suite's units (default: the config's ``eval.suite``, all of it; ``names``: a sharded job's units),
    recording each unit's result in ``run`` as it comes (``run.record_unit``: a ``harness.lifecycle.Run`` merges an
    entry's units into its row; a sharded job's recorder writes the shard's file), so partial progress is never
    lost; ``on_result(entry, output)`` when an entry is complete. A unit that fails goes to ``run.unit_failed``,
    which says whether the others still run (a sharded job: yes); the first failure is raised at the end. An
    out-of-memory error inside an evaluator becomes :class:`EvalOutOfMemory` ("eval.suite.<key>: out of memory at
    <L> tokens on <device> (...)"); the length is the decoder's last input plus its cached tokens, recorded by a
    forward pre-hook on ``handle.model.get_decoder()`` for the duration of the loop. ``progress``
    (``harness.report.EvalProgress``) is told of every finished prompt."""
    if suite is None:
        suite = Suite.of(cfg)
    units = placed_units(handle, suite, names)
    if units is None:
        units = eval_units(cfg, suite, method, check_device(cfg.get("device", "auto")), names)
    seen: dict = {}
    hook = watch_lengths(handle, seen)
    if progress is not None:
        progress.tokens = seen  # progress lines say at which length the model is
    left = {u.entry: sum(v.entry == u.entry for v in units) for u in units}
    failures: list = []

    def failed(unit, e) -> bool:
        failures.append(e)
        return bool(run.unit_failed(unit, e))

    try:
        for unit, out, seconds, version in evaluate_units(cfg, handle, method, units, run.samples_dir, progress,
                                                          seen, on_failure=failed):
            run.record_unit(unit, out, seconds, version)
            left[unit.entry] -= 1
            if on_result and not left[unit.entry]:
                on_result(unit.entry, run.row["metrics"][unit.entry])
    finally:
        if hook is not None:
            hook.remove()
    if failures:
        raise failures[0]
