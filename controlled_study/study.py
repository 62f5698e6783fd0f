"""`make study` (`harness study`, `python scripts/study.py`): the whole tiny study in one command, resumable: every
sweep point of the experiment runs unless a row with status ``ok`` and the same config hash already exists, then
`make tables` and `make findings`.

    python scripts/study.py                                  # experiment=tiny_study, every point
    python scripts/study.py experiment=tiny_study point=tiny_study/base,tiny_study/pi   # a subset
    python scripts/study.py --dry-run                        # the plan: which points run, which are done
    python scripts/study.py --jobs 2                         # two points at a time, one thread each
    python scripts/study.py --seed 1                         # the fine-tuned points again, training seed 1

Points start longest first (``--order longest``, the default): each point's expected seconds are the wall seconds of
the latest ``ok`` row of the same point (the ``point=`` its command named, any seed; points without one first, as
if longest), and with ``--jobs N`` starting the longest first keeps a long point from being the last one running
(the classic LPT rule; ``--order given`` keeps the sweep's order). The plan prints the study's expected wall time
under both orders, simulated from those seconds: an estimate from recorded runs, not a measurement.

The config hash is ``harness.results.config_hash`` of the resolved config, as ``run.py`` composes it, without the
settings that only place a run (paths, device, ranks, logger: ``NOT_IN_CONFIG_HASH``), so a point is re-run exactly
when something that changes its result changed: the method, the recipe, the suite, the seed; moving the checkpoint
folder (``HARNESS_CKPT_DIR``) re-runs nothing. A row's hash is recomputed from its recorded config when it is read
(``harness.results.row_hash``), never taken from its ``config_hash`` field: rows written under the older rule still
match, a hand-edited hash matches nothing. Two ``make study`` processes on one results folder share the work: each
point is run under a lock (``<results_dir>/locks/<hash>.lock``, ``filelock``) by the first process to take it, and
the other skips it (and re-reads the rows before running a point, which another process may have finished).
Failed or stale rows never count as done, nor does a fine-tuned row whose
convergence gate is older than ``harness.evals.convergence.MIN_GATE_VERSION`` (the gate is no part of the config, so
its hash stays the same when only the gate changes): `make study` re-runs exactly those points; the older rows stay
in ``results/<study>/runs`` until moved to ``results/archive/`` (its README). Only the study's own rows count
(``results/<study>/runs/``, the study its experiment names: ``study.experiment``). Each point runs in its own process
(``python run.py <overrides>``); a failed point is reported and the sweep goes on. A job that does not compose
(a key a point's config lacks, an unknown option) stops the study before anything runs, with ``run.py -m``'s one line
and failed row (``harness.precheck.refuse``). Progress, the elapsed time and an
estimate of the time left are printed after every point, the total wall time at the end.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from controlled_study import tools
from harness import conf_utils, precheck, sweeps
from harness.evals.convergence import outdated
from harness.results import config_hash, read_rows, study_of
from harness.safe import safe_file

ROOT = Path(__file__).resolve().parents[1]  # the checkout (an editable install): run.py, conf/, results/


def hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def plan(argv: list[str], seed: int | None = None) -> tuple[list[dict], str]:
    """[{overrides, hash, done (run id or None), old_gate (the run id of an ok row measured by an older convergence
    gate, or None), label}] for every job of ``run.py -m <argv>``, and the results dir. ``seed``: only the jobs that
    fine-tune (``train.enabled``), each with ``data.seed=<seed> train.seed=<seed>`` (the mixture's sample and order
    and the training RNG; the evaluation prompts stay the same)."""
    from omegaconf import OmegaConf

    try:
        jobs = sweeps.expand(argv)
    except Exception as e:  # noqa: BLE001 - a malformed override: one line, a failed row, exit 2
        precheck.refuse(e, argv)
    results_dir = study = None
    out = []
    for ov in jobs:
        try:
            cfg = conf_utils.compose(ov)
            if seed is not None:
                if not cfg.train.get("enabled"):
                    continue  # a frozen point has no training seed
                ov = ov + [f"data.seed={seed}", f"train.seed={seed}"]
                cfg = conf_utils.compose(ov)
        except Exception as e:  # noqa: BLE001 - as `run.py -m`: one line naming the job, a failed row, exit 2
            precheck.refuse(sweeps.SweepJobError(ov, e), argv)
        results_dir = results_dir or str(cfg.paths.results_dir)
        study = study or study_of(OmegaConf.to_container(cfg, resolve=True))
        h = config_hash(OmegaConf.to_container(cfg, resolve=True))
        label = " ".join(o for o in ov if not o.startswith("experiment=")) or " ".join(ov)
        out.append({"overrides": ov, "hash": h, "label": label, "done": None, "cfg": cfg})
    done, old_gate = {}, {}
    rows = list(read_rows(results_dir or "results", study))  # the study's own rows (results/<study>/runs/)
    for r in rows:
        if r.get("status") == "ok" and r.get("config_hash"):  # recomputed from its config on read (row_hash)
            (old_gate if outdated(r) else done).setdefault(r["config_hash"], r.get("run_id"))
    seconds = seconds_by_point(rows)
    for j in out:
        j["study"] = study
        j["done"] = done.get(j["hash"])
        j["old_gate"] = None if j["done"] else old_gate.get(j["hash"])  # a row whose gate is older: runs again
        j["expected_s"] = seconds.get(point_of(j["overrides"]) or "")
    return out, results_dir or "results"


def claim(results_dir: str, job: dict):
    """``(lock, None)``: this process runs the point (its lock ``<results_dir>/locks/<hash>.lock`` held, and no ``ok``
    row of its hash appeared since the plan), or ``(None, why)``: another ``make study`` holds it or finished it."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(safe_file(Path(results_dir) / "locks", job["hash"], ".lock", "config hash")), timeout=0,
                    mode=0o666)
    Path(results_dir, "locks").mkdir(parents=True, exist_ok=True)
    try:
        lock.acquire()
    except Timeout:
        return None, "another make study is running it (its lock is held)"

    done = [r.get("run_id") for r in read_rows(results_dir, job.get("study"), warn=lambda m: None)
            if r.get("status") == "ok" and r.get("config_hash") == job["hash"] and not outdated(r)]
    if done:
        lock.release()
        return None, f"done since the plan (row {done[0]})"
    return lock, None


def point_of(overrides) -> str | None:
    """The ``point=`` a run's overrides (a list, or a recorded command string) name, or None."""
    words = overrides.split() if isinstance(overrides, str) else overrides
    return next((w.split("=", 1)[1] for w in reversed(words) if w.startswith("point=")), None)


def recorded_seconds(results_dir: str) -> dict[str, float]:
    """point -> wall seconds of the latest ``ok`` row of that point in ``results_dir`` (``seconds_by_point``)."""

    return seconds_by_point(read_rows(results_dir))


def seconds_by_point(rows) -> dict[str, float]:
    """point -> wall seconds (end - start) of the latest ``ok`` row whose command named that point, any seed."""
    from datetime import datetime

    out: dict[str, tuple[str, float]] = {}
    for r in rows:
        pt = point_of(r.get("command") or "")
        if r.get("status") != "ok" or not pt or not r.get("time_start") or not r.get("time_end"):
            continue
        try:
            dt = (datetime.fromisoformat(r["time_end"]) - datetime.fromisoformat(r["time_start"])).total_seconds()
        except (TypeError, ValueError):
            continue
        if pt not in out or r["time_start"] > out[pt][0]:
            out[pt] = (r["time_start"], dt)
    return {k: v[1] for k, v in out.items()}


def expected_wall(seconds: list[float], lanes: int) -> float:
    """Wall time of running jobs of these durations, in this order, ``lanes`` at a time (each job starts on the
    first lane to come free)."""
    free = [0.0] * max(1, lanes)
    for s in seconds:
        i = free.index(min(free))
        free[i] += s
    return max(free)


def order_jobs(jobs: list[dict], how: str) -> list[dict]:
    """``longest``: by expected seconds, longest first (unknown first); ``given``: the sweep's order."""
    if how == "given":
        return list(jobs)
    return sorted(jobs, key=lambda j: -(j["expected_s"] if j["expected_s"] is not None else float("inf")))


def _wait_any(running: dict):
    """The first of the running processes to end."""
    while True:
        for p in running:
            if p.poll() is not None:
                return p
        time.sleep(1.0)


def print_estimate(jobs: list[dict], todo: list[dict], lanes: int) -> None:
    """Expected wall time of the points to run and of the whole study, longest first and in the sweep's order,
    from the recorded seconds of each point (``~?``: no recorded row; left out of the sums and named)."""
    for what, js in (("to run", todo), ("the whole study", jobs)):
        known = [j["expected_s"] for j in js if j["expected_s"] is not None]
        if not js or not known:
            continue
        unknown = [j["label"] for j in js if j["expected_s"] is None]
        lpt = expected_wall(sorted(known, reverse=True), lanes)
        given = expected_wall(known, lanes)
        print(f"expected wall time, {what} ({len(known)} points with a recorded run, --jobs {lanes}): "
              f"{hms(lpt)} longest first, {hms(given)} in the sweep's order (sum {hms(sum(known))}; the longest point "
              f"{hms(max(known))})" + (f"; no recorded run: {', '.join(unknown)}" if unknown else ""), flush=True)


def run_points(todo: list[dict], results_dir: str, jobs_n: int, t0: float) -> tuple[list[str], list[str]]:
    """Run the points of ``todo``, ``jobs_n`` at once, each as ``python run.py <overrides>`` under its lock; the labels
    of the points that failed and of those another ``make study`` took."""
    failed, times, taken = [], [], []
    locks: dict = {}  # Popen -> the point's lock, held while it runs
    env = os.environ.copy()
    if jobs_n > 1 or "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs_n))
    running: dict = {}  # Popen -> (k, job, start)
    queue = list(enumerate(todo, 1))
    while queue or running:
        while queue and len(running) < jobs_n:
            k, j = queue.pop(0)
            lock, why = claim(results_dir, j)
            if lock is None:  # another make study runs it, or finished it since the plan
                print(f"== [{k}/{len(todo)}] {j['label']}: skipped, {why}", flush=True)
                taken.append(j["label"])
                continue
            t = time.time()
            print(f"\n== [{k}/{len(todo)}] {j['label']} (elapsed {hms(t - t0)})", flush=True)
            try:
                p = subprocess.Popen([sys.executable, str(ROOT / "run.py")] + j["overrides"], cwd=ROOT, env=env)
            except BaseException:
                lock.release()
                raise
            running[p], locks[p] = (k, j, t), lock
        if not running:
            break
        p = _wait_any(running)
        k, j, t = running.pop(p)
        locks.pop(p).release()
        dt = time.time() - t
        times.append(dt)
        left = (len(queue) + len(running)) * (sum(times) / len(times)) / jobs_n
        status = "ok" if p.returncode == 0 else f"FAILED (exit {p.returncode})"
        if p.returncode:
            failed.append(j["label"])
        print(f"== [{k}/{len(todo)}] {j['label']}: {status} in {hms(dt)}; elapsed {hms(time.time() - t0)}, "
              f"about {hms(left)} left", flush=True)
    return failed, taken


def main(argv=None) -> int:
    """the whole tiny study, resumable, then tables and findings."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (default: experiment=tiny_study)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    ap.add_argument("--no-report", action="store_true", help="skip make tables / make findings at the end")
    ap.add_argument("--no-figures", action="store_true", help="make tables without the figures")
    ap.add_argument("--jobs", type=int, default=1, help="points run at once, each with cores / jobs threads "
                    "(OMP_NUM_THREADS); on a 2-core CPU 2 x 1 thread finished more points per hour than 1 x 2")
    ap.add_argument("--seed", type=int, default=None, help="run only the fine-tuned points, with data.seed and "
                    "train.seed set to this (a second training seed of the study)")
    ap.add_argument("--order", choices=["longest", "given"], default="longest",
                    help="start the points with the longest recorded run first (default) or in the sweep's order")
    a = ap.parse_args(argv)
    argv = list(a.overrides)
    if not any(x.startswith("experiment=") for x in argv):
        argv = ["experiment=tiny_study"] + argv
    t0 = time.time()
    jobs, results_dir = plan(argv, a.seed)
    todo = [j for j in jobs if not j["done"]]
    print(f"study {' '.join(argv)}: {len(jobs)} points, {len(jobs) - len(todo)} already done (a row with the same "
          f"config hash in the study's rows), {len(todo)} to run", flush=True)
    for i, j in enumerate(jobs, 1):
        exp = f"  ~{hms(j['expected_s'])}" if j["expected_s"] is not None else "  ~?"
        state = ("done: " + j["done"] if j["done"] else
                 f"to run (row {j['old_gate']}: older convergence gate)" if j["old_gate"] else "to run")
        print(f"  [{i:2d}/{len(jobs)}] {j['label']:40s} {state}"
              f"  (config {j['hash']}){exp}", flush=True)
    jobs_n = max(1, a.jobs)
    print_estimate(jobs, todo, jobs_n)
    todo = order_jobs(todo, a.order)
    if a.dry_run:
        return 0
    failed, taken = run_points(todo, results_dir, jobs_n, t0)
    if not a.no_report:
        findings, tables = tools.findings, tools.tables
        print("\n== make tables", flush=True)
        tables(["--results", results_dir] + (["--no-figures"] if a.no_figures else []))
        print("== make findings", flush=True)
        findings(["--results", results_dir])
    print(f"\nstudy: {len(todo) - len(failed) - len(taken)} points run, {len(jobs) - len(todo)} skipped (done), "
          f"{len(failed)} failed{': ' + ', '.join(failed) if failed else ''}"
          f"{f'; {len(taken)} left to another make study' if taken else ''}; wall time {hms(time.time() - t0)}",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
