"""A run's row from start to finish: besides ``harness.results`` (the schema and the atomic writer) the only module
that writes ``<results_dir>/runs/<run_id>.json`` (a study's run: ``<results_dir>/<study>/runs/``, ``results_dir``).
Every entry point records through it: ``run.py`` (``start`` ->
``Run.record`` / ``Run.record_eval`` per stage -> ``Run.finish`` or ``Run.fail``), the factor search
(``scripts/search_rope.py``, with ``Run.stage`` timing its phases), the sharded evaluation (``merge``: a row that
several jobs share, rebuilt under a lock) and the failures before a run exists (``fail_before_compose``,
``run_guarded``).

The rules, in one place:

- a row is ``running`` from ``start`` on, with its host, pid and a heartbeat rewritten every ``heartbeat_every_s``
  (``harness.results.start_heartbeat``), and written again after every stage that records something, so partial
  progress is never lost;
- it ends ``ok``, or ``failed`` with a one-line error (``one_line``) and the traceback in ``<run_dir>/error.log``;
- a results directory that refuses the finished row does not lose it: the row is kept in ``<run_dir>/row.json`` and
  the failure line says what could not be written (``Run.finish`` never raises for that);
- a job requeued in its run directory keeps its run id (read back from ``<run_dir>/run.json``), so its row is
  rewritten, not duplicated.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from omegaconf import OmegaConf

from harness import results
from harness.conf_utils import compose
from harness.config import ConfigError
from harness.evals.suite import merge_outputs
from harness.safe import env_setting, is_safe_name
from harness.train import Terminated

LOCK_STALE_S = 300.0  # a row lock older than this is a holder that died mid-merge (merges take milliseconds)


# the row's fields that name files: made relative to the checkout when a run of it finishes (``Run.finish``), so a
# committed row carries no machine path (its config's ``paths`` are not hashed and stay as the run resolved them)
PATH_FIELDS = ("run_dir", "command", "model_info", "train_info")


class Run:
    """A started run: its row (a plain dict with the keys of ``results.Row``) and the results directory it goes to.
    Stages record into it; nothing else writes the row."""

    def __init__(self, results_dir: str | Path, row: dict):
        self.results_dir = str(results_dir)
        self.row = row

    @property
    def path(self) -> Path:
        """The row's file, ``<results_dir>/runs/<run_id>.json``."""
        return results.row_path(self.results_dir, self.row["run_id"])

    def write(self) -> None:
        """Write the row as it is now (``OSError`` when the results directory refuses it)."""
        results.write_row(self.results_dir, self.row)

    def record(self, **fields) -> None:
        """A stage's result (``model_info``, ``train_info``, ``method_params``, ``metrics``...): set and written."""
        self.row.update(fields)
        self.write()

    def record_eval(self, key: str, output: dict, seconds: float, version: int) -> None:
        """One evaluator's result: ``metrics[key]``, its version and wall seconds (``timings["eval.<key>"]``)."""
        self.row["metrics"][key] = output
        self.row.setdefault("eval_versions", {})[key] = version
        self.row["timings"][f"eval.{key}"] = seconds
        self.write()

    def record_unit(self, unit, output: dict, seconds: float, version: int) -> None:
        """One unit of the evaluation plan (``harness.evals.suite.Unit``): its entry's result, merged with the
        entry's units already recorded (an entry cut by a multi-GPU placement; ``merge_outputs``), their seconds
        summed."""
        key = unit.entry
        prev = self.row["metrics"].get(key) if unit.lengths is not None else None
        if prev is not None:
            output = merge_outputs(prev, output)
            seconds = round(self.row["timings"].get(f"eval.{key}", 0) + seconds, 2)
        self.record_eval(key, output, seconds, version)

    def unit_failed(self, unit, error: BaseException) -> bool:
        """A unit failed: the run stops there (``finish`` records why). A sharded job's recorder keeps going."""
        return False

    def samples_dir(self, unit) -> Path:
        """Where a unit's per-sample records go: the run directory (``samples/<entry>.jsonl``)."""
        return Path(self.row["run_dir"])

    @contextmanager
    def stage(self, name: str):
        """Time a stage: when it returns, its wall seconds go to ``timings[name]`` and the row is written (a stage
        that raises records nothing: ``fail`` then records why)."""
        t0 = time.time()
        yield
        self.row["timings"][name] = round(time.time() - t0, 2)
        self.write()

    def finish(self, error: BaseException | None = None) -> str | None:
        """Finish the row as ``ok`` (``error`` None) or ``failed`` with the error's one line, and stop its heartbeat.
        Never raises for a failure to write: returns what could not be written (``None`` when everything was), after
        trying to keep the row in the run directory (``<run_dir>/row.json``) when the results directory refuses it."""
        row = self.row
        row["time_end"] = results.now_iso()
        if Path.cwd().resolve() == results.REPO:  # the checkout's own runs, the ones committed: no machine paths
            row.update({k: results.portable(row.get(k)) for k in PATH_FIELDS if row.get(k) is not None})
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
            self.write()
        except OSError as e:
            problems.append(f"row {self.path} not updated ({_short_os_error(e)})")
            try:
                results.atomic_write_json(Path(row["run_dir"], "row.json"), row)
                problems.append(f"row kept in {Path(row['run_dir'], 'row.json')}")
            except OSError:
                pass
        finally:
            results.stop_heartbeat(self.results_dir, row)
        return "; ".join(problems) or None

    def fail(self, error: BaseException) -> str:
        """Finish the row as failed and return the one line to print (with what could not be written, if any)."""
        problem = self.finish(error)
        return self.row["error"] + (f" [{problem}]" if problem else "")


STARTED: list[Run] = []  # runs started by this process (a failure outside ``run.py``'s try finishes them)


def start(cfg, run_dir: str | Path | None = None, names: dict | None = None) -> Run:
    """Create the run directory and the row (``running``, with this process's host, pid and a heartbeat) and
    ``<run_dir>/run.json``. ``names``: the row's group columns when they are not the config's groups' names (the
    factor search). Raises ``OSError`` when either cannot be written (a run that cannot record its result should
    not start); when the row was written its failure is recorded in it and the error carries ``row_problem``
    (``start_failed`` reads it)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    # a job requeued by Slurm (preemption, timeout) restarts in its run directory: keep its run_id, so its row is
    # rewritten rather than duplicated (training resumes from the checkpoint keyed by the config fingerprint)
    previous = Path(run_dir, "run.json") if run_dir else None
    run_id = _previous_run_id(previous) or results.new_run_id()
    rows_at = results_dir(cfg)  # the study's folder (a row of no study: the results directory itself)
    run_dir = Path(run_dir or Path(cfg.paths.output_dir) / "runs" / run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    run = Run(rows_at, results.new_row(run_id, plain, names, run_dir))
    # registered before its row is written: a SIGTERM landing right after the write finishes this row (``run_guarded``)
    # instead of leaving it ``running`` beside a second, failed row
    STARTED.append(run)
    try:
        results.start_heartbeat(run.results_dir, run.row)  # writes the row; its heartbeat then beats until finish
    except OSError:
        STARTED.remove(run)  # no row was written: ``start_failed`` records the failure
        raise
    try:
        write_run_file(run_dir, run.row)
    except OSError as e:  # the row exists: it ends failed
        e.row_problem = run.finish(e)
        raise
    return run


def results_dir(cfg) -> Path:
    """Where ``cfg``'s row goes: ``<paths.results_dir>/<study>/`` for a run of a study (the config's
    ``study.experiment``, ``harness.results.study_dir``), ``<paths.results_dir>`` for a run of no study. A study
    name that cannot be a folder is one ``ConfigError`` line."""
    name = OmegaConf.select(cfg, "study.experiment", default=None)
    try:
        return results.study_dir(cfg.paths.results_dir, name)
    except ValueError as e:
        raise ConfigError(f"study.experiment: {e}") from None


def start_or_exit(cfg, run_dir: str | Path | None, names: dict | None, what: str) -> Run:
    """``start`` for an entry point other than ``run.py`` (the factor search, the learning curves): when the row or
    the run directory cannot be written, print ``<what> failed: <line>`` and end the job (``exit_failed``: no run
    without a record)."""
    try:
        return start(cfg, run_dir, names)
    except OSError as e:
        line = start_failed(cfg, e)
        print(f"{what} failed: {line}", file=sys.stderr)
        exit_failed(line)


def exit_failed(message: str, stop_sweep: bool = False) -> None:
    """End a job whose row is already finished as failed (its line printed): exit 1; inside a Hydra multirun, raise
    ``RunFailed`` instead, so the launcher records this job as failed and the sweep's other jobs still run (a
    SystemExit would stop the basic and joblib launchers' whole sweep), unless ``stop_sweep`` (a kill, Ctrl-C)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not stop_sweep and HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise RunFailed(message)
    sys.exit(1)


def write_run_file(run_dir: str | Path, row: dict) -> None:
    """``<run_dir>/run.json``: the run id, command, commit and resolved config (a requeued job finds its id there)."""
    results.atomic_write_json(Path(run_dir) / "run.json", {"run_id": row["run_id"], "command": row["command"],
                                                           "git_sha": row["git_sha"], "config": row["config"]})


def start_failed(cfg, error: OSError) -> str:
    """``start`` could not write the row or the run directory: the row was finished as failed if it was written,
    else a failed row is tried in the results directory; returns the one line to print."""
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
        run_id = json.loads(path.read_text())["run_id"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"warning: {path} is unreadable ({type(e).__name__}); this run gets a new run id", file=sys.stderr)
        return None
    if not is_safe_name(run_id):  # the row's file name: a name from a file never becomes a path
        print(f"warning: {path}: run_id {str(run_id)[:80]!r} is not a safe name; this run gets a new run id",
              file=sys.stderr)
        return None
    return run_id


def fail_before_compose(results_dir: str, message: str, names: dict | None = None) -> str | None:
    """A run whose configuration cannot even be composed still leaves a failed row (and a one-line error), its group
    columns the options the command line named (``names``, e.g. ``{"model": "hub"}``). Returns what could not be
    written (``None`` when the row was)."""
    row = {k: None for k in results.ROW_FIELDS}
    row.update({g: v for g, v in (names or {}).items() if g in results.GROUPS and is_safe_name(v)})
    row.update(schema=results.SCHEMA_VERSION, run_id=results.new_run_id(), status="failed", error=message,
               time_start=results.now_iso(), time_end=results.now_iso(), command=" ".join(sys.argv),
               git_sha=results.git_sha(), metrics={}, timings={})
    try:
        results.write_row(results_dir, row)
    except OSError as e:
        return f"no row written: {_short_os_error(e)}"
    return None


# ------------------------------------------------------------------------------------------------------ shared rows
def merge(results_dir: str | Path, run_id: str, fresh, rebuild) -> dict:
    """Update a row that several jobs share (a sharded run: ``harness.shards``) and return it. Under the row's lock
    (``file_lock``), the row is read (``fresh()`` when none exists yet), ``rebuild(row)`` fills it from its parts'
    files and returns ``({part: ok | failed | missing}, [each failed part's one line])``, and the status is settled
    by one rule: ``failed`` (the first part's line) when a part failed, ``ok`` when every part is, ``running``
    otherwise; the row is written atomically."""
    path = results.row_path(results_dir, run_id)
    with file_lock(path.with_suffix(".lock")):
        row = _read_json(path) or fresh()
        parts, errors = rebuild(row)
        if errors:
            row["status"], row["error"], row["time_end"] = "failed", errors[0], results.now_iso()
        elif all(v == "ok" for v in parts.values()):
            row["status"], row["error"], row["time_end"] = "ok", None, results.now_iso()
        else:
            row["status"], row["error"], row["time_end"] = "running", None, None
        results.write_row(results_dir, row)
    return row


def _read_json(p: Path) -> dict | None:
    obj, _ = results.read_json_file(p)  # bounded: a regular file of bounded size and nesting
    return obj if isinstance(obj, dict) else None


@contextmanager
def file_lock(path: Path, timeout: float = 600.0, stale: float = LOCK_STALE_S):
    """Exclusive lock by atomic creation of ``path`` (``O_CREAT|O_EXCL``: works across processes and hosts on a
    shared filesystem, NFS and Lustre included); a lock older than ``stale`` seconds, or whose holder on this host
    is gone, is broken."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.write(fd, f"{socket.gethostname()} {os.getpid()} {time.time()}\n".encode())
            os.close(fd)
            break
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime > stale or _holder_dead(path):
                    os.unlink(path)  # a holder that died mid-merge
                    continue
            except FileNotFoundError:
                continue
            if time.time() - t0 > timeout:
                raise TimeoutError(f"could not lock {path} within {timeout:.0f} s") from None
            time.sleep(0.02)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _holder_dead(path: Path) -> bool:
    """True when the lock was taken by a process of this host that no longer exists (killed while merging)."""
    try:
        host, pid, _ = Path(path).read_text().split()
        if host != socket.gethostname():
            return False
        os.kill(int(pid), 0)
        return False
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False


# ------------------------------------------------------------------------------------------------------ failures
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


def run_guarded(main, argv: list[str], on_config_error=None) -> None:
    """Call Hydra's ``main`` so that failures outside a run's own try (Hydra composing the command line or creating
    the output directory, a results directory that refuses the row, a failed multirun job) print one line, leave a
    failed row where one can be written, and exit non-zero, instead of a stack trace. A single run's command line that
    does not compose or resolve goes to ``on_config_error(e)`` (``harness.precheck.refuse``: the line names the
    override and its valid choices) when given."""
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # Hydra re-raises instead of printing a trimmed stack trace
    before = len(STARTED)  # runs this call starts (a library caller may have started others in this process)
    try:
        main()
    except RunFailed as e:
        print(f"sweep failed: {e} (every job's row says how it ended)", file=sys.stderr)
        sys.exit(1)
    except (Exception, KeyboardInterrupt, Terminated) as e:  # noqa: BLE001
        line = one_line(e, lines=2)
        mine = STARTED[before:]
        running = [r for r in mine if r.row.get("status") == "running"]
        if running:  # a row this call started and did not finish
            problem = running[-1].finish(e)
        elif not mine and _before_any_job(e, argv):  # Hydra failed before the run began
            if on_config_error is not None and not _multirun(argv) and isinstance(e, Exception):
                on_config_error(e)  # exits when it is a config error
            problem = fail_before_compose(_results_dir(argv), line)
        else:  # the run's row is finished (e.g. stdout closed while printing the summary), or a launcher's jobs
            problem = None  # ran elsewhere and wrote their own rows (submitit collecting results): no extra row
        print(f"run failed: {line}" + (f" [{problem}]" if problem else ""), file=sys.stderr)
        sys.exit(1)


def _multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in argv)


def _before_any_job(e: BaseException, argv: list[str]) -> bool:
    """Whether ``e`` escaped Hydra before any job ran: always for a single run; for a sweep, a filesystem, Hydra or
    config error (not a launcher's complaint about jobs it ran elsewhere)."""
    if not _multirun(argv):
        return True
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(e, (OSError, HydraException, OmegaConfBaseException))


def _results_dir(argv: list[str]) -> str:
    """The results directory the command line would use (its own overrides, else the environment's)."""
    try:
        return str(compose([a for a in argv if not a.startswith("-") and not a.startswith("hydra")]).paths.results_dir)
    except Exception:  # noqa: BLE001 - e.g. a sweep's comma lists: the default location
        return env_setting("HARNESS_RESULTS_DIR", "results")


def _short_os_error(e: OSError) -> str:
    return f"{e.strerror or type(e).__name__}" + (f": {e.filename}" if e.filename else "")


def one_line(e: BaseException, lines: int = 1) -> str:
    """``Type: message`` on one line (the message's first ``lines`` non-empty lines joined)."""
    if isinstance(e, ConfigError):
        return str(e).splitlines()[0]
    msg = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()][:lines]
    return f"{type(e).__name__}: {' '.join(msg)}".strip()
