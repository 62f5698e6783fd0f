"""The stages ``run.py`` calls, each a plain function: start a row, load + extend the model, fine-tune, evaluate,
finish the row. Config objects stop here: every stage converts its group to typed arguments once."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from harness import results
from harness.config import AUTOCAST, ConfigError, to_args
from harness.data import build_data, check_budget
from harness.evals import EvalContext, build_evaluators, check_lengths, check_suite
from harness.evals import max_length as eval_max_length
from harness.evals._watch import EvalOutOfMemory, oom_line, watch_lengths
from harness.methods import build_method, check_checkpoint_method, save_method
from harness.methods._flex import AttentionArgs, set_backend
from harness.models import build_model, check_device, check_fits, choose_device_map
from harness.train import Terminated, TrainArgs

GROUPS = results.GROUPS


def start(cfg, run_dir: str | Path | None = None) -> dict:
    """Create the run directory and the row (``running``, with this process's host, pid and a heartbeat). Raises
    ``OSError`` when either cannot be written: a run that cannot record its result should not start."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    # a job requeued by Slurm (preemption, timeout) restarts in its run directory: keep its run_id, so its row is
    # rewritten rather than duplicated (training resumes from the checkpoint keyed by the config fingerprint)
    previous = Path(run_dir, "run.json") if run_dir else None
    run_id = _previous_run_id(previous) or results.new_run_id()
    run_dir = Path(run_dir or Path(cfg.paths.output_dir) / "runs" / run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    row = results.new_row(run_id, plain, None, run_dir)
    results.start_heartbeat(cfg.paths.results_dir, row)  # writes the row; its heartbeat then beats until finish
    STARTED.append((cfg.paths.results_dir, row))
    try:
        write_run_file(run_dir, row)
    except OSError as e:  # the row exists: it ends failed
        e.row_problem = finish_row(cfg.paths.results_dir, row, e)
        raise
    return row


STARTED: list[tuple[str, dict]] = []  # rows started by this process (a failure outside ``run.py``'s try finishes them)


def write_run_file(run_dir: str | Path, row: dict) -> None:
    """``<run_dir>/run.json``: the run id, command, commit and resolved config (a requeued job finds its id there)."""
    results.atomic_write_json(Path(run_dir) / "run.json", {"run_id": row["run_id"], "command": row["command"],
                                                           "git_sha": row["git_sha"], "config": row["config"]})


def start_failed(cfg, error: OSError) -> str:
    """``start`` could not write the row or the run directory: finish the row as failed if it was written, else
    try a failed row in the results directory; returns the one line to print."""
    line = one_line(error)
    if hasattr(error, "row_problem"):  # the row was written and already finished as failed
        problem = error.row_problem
    else:
        problem = fail_before_compose(cfg.paths.results_dir, line)
    return line + (f" [{problem}]" if problem else "")


def _previous_run_id(path: Path | None) -> str | None:
    if path is None or not path.is_file():
        return None
    try:
        return str(json.loads(path.read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"warning: {path} is unreadable ({type(e).__name__}); this run gets a new run id", file=sys.stderr)
        return None


def native_ctx(cfg) -> int:
    """The model config's native window C (what every length setting is a multiple of), checked."""
    c = (cfg.get("model") or {}).get("native_ctx")
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise ConfigError(f"model={cfg.model.get('name')}: native_ctx must be a positive integer (the pretrained "
                          f"window C in tokens), got {c!r}")
    return c


def validate(cfg, data: bool = True):
    """Check every group before anything loads: the method against the model's native window C and the train
    recipe, the recipe itself and its token budget against what the data is for (``harness.data.check_budget``), the
    attention backend, the evaluation autocast, and every evaluator (lengths, settings and, with ``data``, that its
    local data and the method's files can be read). Each impossible value is one ConfigError line naming the key and
    the valid range."""
    c = native_ctx(cfg)
    check_seed(cfg.get("seed", 0), "seed")
    check_model_files(cfg.model)
    method = build_method(cfg.method)
    attention_args(cfg)
    train = to_args(TrainArgs, cfg.train, f"train={cfg.train.get('name')}")
    train.validate()
    if train.enabled and cfg.get("data") is not None:
        check_budget(cfg.data, train.name, train.tokens)  # the data is meant for this recipe's token budget
    method.check(c, train)
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
    check_suite(OmegaConf.to_container(cfg.eval.suite, resolve=True), c, data=data)
    return method, train


def check_seed(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: {value!r} is not a seed (valid: an integer, e.g. {key}=0)")


# the files one of which a tokenizer folder must hold (fast tokenizer, SentencePiece, BPE / WordPiece vocabularies)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def check_model_files(cfg_model) -> None:
    """Before the model loads: ``model.dtype`` is a weights dtype, and a local ``model.path`` folder holds a
    tokenizer (else transformers' message, cut to one line, ends mid-list)."""
    from harness.models import DTYPES

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


def load_and_extend(cfg, method, train: TrainArgs | None = None, before_extend=None):
    """Model + method: load the base (or a fine-tuned checkpoint), check that the longest evaluation input fits in
    memory, choose the attention backend and apply the extension method. Before a fine-tuning run the base model is
    measured inside its window first (``harness.evals.convergence``), so that the fine-tuned row can be compared with
    it on the same documents and prompts. ``before_extend(handle)`` lets a caller measure the base model too
    (learning curves)."""
    device = check_device(cfg.get("device", "auto"))
    suite = OmegaConf.to_container(cfg.eval.suite, resolve=True)
    evaluators = build_evaluators(suite)
    longest = max((eval_max_length(ev) for ev in evaluators), default=0)
    device_map = choose_device_map(cfg.model, device, longest, any(getattr(ev, "generates", False)
                                                                   for ev in evaluators))
    handle = build_model(cfg.model, device=device, device_map=device_map)
    for key, ev in zip(suite, evaluators):
        check_fits(handle, eval_max_length(ev), generates=getattr(ev, "generates", False),
                   key=f"eval.suite.{key}")
    path = handle.info.get("path", "")
    if os.path.isdir(path):
        check_checkpoint_method(path, method)
    if train is not None and train.enabled and train.convergence_check:
        from harness.evals import convergence

        # the gate's own held-out prompts and books, derived from the run seed (never the suite's)
        handle.info["baseline_at_C"] = convergence.measure(handle, run_seed=int(cfg.seed),
                                                           autocast=str(cfg.get("autocast", "auto")))
    if before_extend is not None:
        before_extend(handle)
    set_backend(handle.model, attention_args(cfg).backend)
    method.apply(handle)
    return handle


def finetune(cfg, handle, method, a: TrainArgs, row: dict, progress=None) -> dict | None:
    if not a.enabled:
        return None
    fingerprint = resume_key(cfg)
    ckpt_dir = Path(cfg.paths.ckpt_dir) / fingerprint
    chunks = build_data(cfg.data, handle.tokenizer, a.seq_len, a.tokens)
    if a.engine == "deepspeed":
        from harness.train.deepspeed_engine import launch

        info = launch(cfg, handle, method, a, ckpt_dir, fingerprint, Path(row["run_dir"]))
    else:
        from harness.train.loop import finetune as single

        info = single(handle, method, chunks, a, ckpt_dir, fingerprint, progress)
    recovered = recover(cfg, handle, method, Path(row["run_dir"]))  # LongRoPE: short factors, on the tuned model
    if recovered is not None:
        info["recovery"] = recovered
    if "baseline_at_C" in handle.info:  # the convergence gate: adapted to the method, or an unfinished recipe?
        from harness.evals import convergence

        tuned = convergence.measure(handle, method, run_seed=int(cfg.seed),
                                    autocast=str(cfg.get("autocast", "auto")))
        info["convergence"] = convergence.verdict(handle.info["baseline_at_C"], tuned)
    out = Path(row["run_dir"]) / "checkpoint"
    handle.model.save_pretrained(out)
    handle.tokenizer.save_pretrained(out)
    save_method(out, method)
    from harness.train.checkpoint import share

    share(out)  # safetensors writes the weights 0600: teammates read them as they read rows (the umask's mode)
    info["checkpoint"] = str(out)
    return info


def recover(cfg, handle, method, run_dir: Path) -> dict | None:
    """LongRoPE's recovery stage (paper Sec. 3.3), after fine-tuning and before the convergence gate, for a method
    whose ``recovery`` names a short-factor search config (``method.recovery=longrope_short_tiny``): search the
    factors it uses at length <= C on the fine-tuned model (``harness.search.recover_short_factors``) and use them
    from then on. Returns what the row records under ``train_info.recovery``; None without such a stage."""
    name = getattr(method.args, "recovery", "")
    if not name:
        return None
    from harness.search import recover_short_factors

    path, info = recover_short_factors(handle, name, method.resolved["factors_file"], run_dir, int(cfg.seed),
                                       autocast=str(cfg.get("autocast", "auto")))
    method.use_factors(handle, path)
    return info


# bookkeeping keys that do not change the weights (a resumed run may change them)
NOT_IN_RESUME_KEY = {"data": ("cache_dir", "max_tokens", "scale", "larger"),
                     "train": ("save_every", "log_every", "keep_checkpoints", "convergence_check")}


def resume_key(cfg) -> str:
    """The key of a fine-tune's resumable checkpoints: the groups that change the weights (model, method, data,
    train; bookkeeping keys left out) and the training code's version (``harness.codeversion``)."""
    from harness.codeversion import train_code_version

    groups = {}
    for g in ("model", "method", "data", "train"):
        node = OmegaConf.to_container(cfg[g], resolve=True)
        groups[g] = {k: v for k, v in node.items() if k not in NOT_IN_RESUME_KEY.get(g, ())}
    return results.config_hash({**groups, "code": train_code_version()})


def evaluations(cfg, handle, method, run_dir: str | Path, suite: dict | None = None, progress=None):
    """Run the evaluators of ``suite`` (default: the config's whole ``eval.suite``; ``harness.shards`` passes one
    entry restricted to one length) with one shared context; yields ``(entry, output, seconds, version)`` in suite
    order (``version``: the evaluator's, :func:`eval_version`). With ``eval_world_size`` > 1 the evaluators run in
    that many data-parallel ranks (``harness.eval_distributed``) and the same tuples come back from rank 0."""
    if suite is None:
        suite = OmegaConf.to_container(cfg.eval.suite, resolve=True)
    world = eval_world_size(cfg, handle)
    if world > 1:
        from harness.eval_distributed import evaluate_parallel

        versions = [eval_version(ev) for ev in build_evaluators(suite)]
        for (key, out, seconds), version in zip(evaluate_parallel(cfg, handle, method, run_dir, suite, world),
                                                versions):
            yield key, out, seconds, version
        return
    ctx = EvalContext(run_dir=Path(run_dir), seed=int(cfg.seed), autocast=str(cfg.get("autocast", "auto")),
                      batch_tokens=int(cfg.get("eval_batch_tokens", 8192)), progress=progress)
    for key, ev in zip(suite, build_evaluators(suite)):
        ctx.entry = key
        t0 = time.time()
        out = ev.run(handle, method, ctx)
        yield key, out, round(time.time() - t0, 2), eval_version(ev)


def eval_world_size(cfg, handle=None) -> int:
    """``eval_world_size``: ``auto`` (the replicas the visible CUDA GPUs hold: one per GPU, or one per g GPUs when the
    loaded model is split over g of them; 1 on CPU) or an integer >= 1, resolved; one line naming the key
    otherwise."""
    from harness.eval_distributed import resolve_world_size
    from harness.models import gpus_of

    return resolve_world_size(cfg.get("eval_world_size", "auto"),
                              gpus_per_replica=gpus_of(handle) if handle is not None else 1)


def eval_version(ev) -> int:
    """An evaluator's ``version`` class attribute (1 when it has none: files written before versions existed)."""
    return int(getattr(ev, "version", 1))


def evaluate(cfg, handle, method, row: dict, on_result=None, progress=None) -> None:
    """Run the suite, writing the row after each evaluator (partial progress is never lost). An out-of-memory error
    inside an evaluator becomes :class:`EvalOutOfMemory` ("eval.suite.<key>: out of memory at <L> tokens on <device>
    (...)"); the length is the decoder's last input plus its cached tokens, recorded by a forward pre-hook on
    ``handle.model.get_decoder()`` for the duration of the loop. ``progress`` (``harness.report.EvalProgress``) is
    told of every finished prompt."""
    import torch

    keys = list(OmegaConf.to_container(cfg.eval.suite, resolve=True) or {})
    seen: dict = {}
    hook = watch_lengths(handle, seen)
    if progress is not None:
        progress.tokens = seen  # progress lines say at which length the model is
    done = 0
    try:
        for key, out, seconds, version in evaluations(cfg, handle, method, row["run_dir"], progress=progress):
            done += 1
            row["metrics"][key] = out
            row.setdefault("eval_versions", {})[key] = version
            row["timings"][f"eval.{key}"] = seconds
            results.write_row(cfg.paths.results_dir, row)  # partial progress is never lost
            if on_result:
                on_result(key, row["metrics"][key])
    except torch.OutOfMemoryError as e:  # torch.cuda.OutOfMemoryError is the same class
        key = keys[done] if done < len(keys) else "?"
        raise EvalOutOfMemory(oom_line(f"eval.suite.{key}", e, seen, handle)) from e
    finally:
        if hook is not None:
            hook.remove()


def finish(cfg, row: dict, error: BaseException | None = None) -> str | None:
    """Finish the row as ``ok`` (``error`` None) or ``failed`` with the error's one line, and stop its heartbeat.
    Never raises for a failure to write: returns what could not be written (``None`` when everything was), after
    trying to keep the row in the run directory (``<run_dir>/row.json``) when the results directory refuses it."""
    return finish_row(cfg.paths.results_dir, row, error)


def finish_row(results_dir: str, row: dict, error: BaseException | None = None) -> str | None:
    row["time_end"] = results.now_iso()
    problems = []
    if error is None:
        row["status"] = "ok"
    else:
        row["status"] = "failed"
        row["error"] = one_line(error)
        try:
            Path(row["run_dir"], "error.log").write_text("".join(traceback.format_exception(error)))
        except OSError as e:
            problems.append(f"error.log not written ({_short_os_error(e)})")
    try:
        results.write_row(results_dir, row)
    except OSError as e:
        where = results.row_path(results_dir, row["run_id"])
        problems.append(f"row {where} not updated ({_short_os_error(e)})")
        try:
            results.atomic_write_json(Path(row["run_dir"], "row.json"), row)
            problems.append(f"row kept in {Path(row['run_dir'], 'row.json')}")
        except OSError:
            pass
    finally:
        results.stop_heartbeat(results_dir, row)
    return "; ".join(problems) or None


def fail(cfg, row: dict, error: BaseException) -> str:
    """Finish ``row`` as failed and return the one line to print (with what could not be written, if anything)."""
    problem = finish(cfg, row, error)
    return row["error"] + (f" [{problem}]" if problem else "")


def raise_on_sigterm() -> None:
    """SIGTERM raises ``Terminated`` in the main thread (the row ends ``failed``). While the distributed engine's
    torchrun runs, ``deepspeed_engine.launch`` holds SIGTERM / SIGUSR2 itself: it asks the ranks to save and stop,
    waits for them, then raises ``Preempted`` (a ``Terminated``) naming the checkpoint's step."""

    def handler(signum, frame):
        raise Terminated(f"terminated by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)


class RunFailed(RuntimeError):
    """A run that already finished its row as failed and printed its line (inside a multirun, the launcher
    records it as a failed job and the sweep goes on; the sweep then ends with this exception)."""


def run_guarded(main, argv: list[str]) -> None:
    """Call Hydra's ``main`` so that failures outside a run's own try (Hydra creating or writing the output
    directory, a results directory that refuses the row, a failed multirun job) print one line, leave a failed
    row where one can be written, and exit non-zero, instead of a stack trace."""
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # Hydra re-raises instead of printing a trimmed stack trace
    try:
        main()
    except RunFailed as e:
        print(f"sweep failed: {e} (every job's row says how it ended)", file=sys.stderr)
        sys.exit(1)
    except (Exception, KeyboardInterrupt, Terminated) as e:  # noqa: BLE001
        line = one_line(e, lines=2)
        running = [(d, r) for d, r in STARTED if r.get("status") == "running"]
        if running:  # a row this process started and did not finish
            problem = finish_row(*running[-1], e)
        elif not STARTED and _before_any_job(e, argv):  # Hydra failed before the run began
            problem = fail_before_compose(_results_dir(argv), line)
        else:  # the run's row is finished (e.g. stdout closed while printing the summary), or a launcher's jobs
            problem = None  # ran elsewhere and wrote their own rows (submitit collecting results): no extra row
        print(f"run failed: {line}" + (f" [{problem}]" if problem else ""), file=sys.stderr)
        sys.exit(1)


def _before_any_job(e: BaseException, argv: list[str]) -> bool:
    """Whether ``e`` escaped Hydra before any job ran: always for a single run; for a sweep, a filesystem, Hydra or
    config error (not a launcher's complaint about jobs it ran elsewhere)."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return True
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(e, (OSError, HydraException, OmegaConfBaseException))


def _results_dir(argv: list[str]) -> str:
    """The results directory the command line would use (its own overrides, else the environment's)."""
    try:
        from harness.conf_utils import compose

        return str(compose([a for a in argv if not a.startswith("-") and not a.startswith("hydra")]).paths.results_dir)
    except Exception:  # noqa: BLE001 - e.g. a sweep's comma lists: the default location
        return os.environ.get("HARNESS_RESULTS_DIR", "results")


def _short_os_error(e: OSError) -> str:
    return f"{e.strerror or type(e).__name__}" + (f": {e.filename}" if e.filename else "")


def one_line(e: BaseException, lines: int = 1) -> str:
    """``Type: message`` on one line (the message's first ``lines`` non-empty lines joined)."""
    if isinstance(e, ConfigError):
        return str(e).splitlines()[0]
    msg = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()][:lines]
    return f"{type(e).__name__}: {' '.join(msg)}".strip()


def fail_before_compose(results_dir: str, message: str, names: dict | None = None) -> str | None:
    """A run whose configuration cannot even be composed still leaves a failed row (and a one-line error), its group
    columns the options the command line named (``names``, e.g. ``{"model": "hub"}``). Returns what could not be
    written (``None`` when the row was)."""
    run_id = results.new_run_id()
    row = {k: None for k in results.ROW_FIELDS}
    row.update({g: v for g, v in (names or {}).items() if g in results.GROUPS})
    row.update(schema=results.SCHEMA_VERSION, run_id=run_id, status="failed", error=message,
               time_start=results.now_iso(), time_end=results.now_iso(), command=" ".join(sys.argv),
               git_sha=results.git_sha(), metrics={}, timings={})
    try:
        results.write_row(results_dir, row)
    except OSError as e:
        return f"no row written: {_short_os_error(e)}"
    return None
