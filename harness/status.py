"""``python -m harness.status [results_dir] [--all]`` (``make status``): every row with its state (rows of no study,
``runs/``, then each study's ``<study>/runs/``), where a
``running`` row whose process died or whose heartbeat stopped shows as ``stale`` (``harness.results.liveness``).
Without ``--all``: unfinished and failed rows only.

Then the submitted sweeps (``<results_dir>/jobs/*.json``, written by ``harness.submit``): each point's job id, the
job's state (Slurm: one ``sacct`` call, or "slurm not available" where there is none; submitit's local executor:
the job's process, then its result file) beside the state of the row its run directory wrote. Without ``--all``:
sweeps with a point whose row is missing or not ok."""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from harness.results import age_s, liveness, pid_alive, read_json_file, read_rows_in, studies, study_dir
from harness.safe import env_setting, safe_file


def _folders(results_dir: str) -> list[Path]:
    """The row folders of a results directory: ``runs/`` (rows of no study), then each study's ``<study>/runs/``."""
    return [Path(results_dir, "runs")] + [study_dir(results_dir, s) / "runs" for s in studies(results_dir)]


def _row_states(results_dir: str, folder: Path | None = None) -> list[tuple[dict, str]]:
    """Every row (of every folder, or of ``folder``) with its state; a file that is not a row is skipped with a
    warning (``results.read_rows_in``)."""
    return [(row, liveness(row, mtime=mtime)) for d in ([folder] if folder else _folders(results_dir))
            for row, mtime in read_rows_in(d, with_mtime=True)]


def _fmt_age(iso) -> str:
    a = age_s(iso)
    if a is None:
        return "-"
    return f"{a:.0f}s" if a < 120 else (f"{a / 60:.0f}m" if a < 7200 else f"{a / 3600:.1f}h")


def jobs_path(results_dir: str, sweep: str) -> Path:
    """Where ``harness.submit`` records a submitted sweep's job ids."""
    return safe_file(Path(results_dir) / "jobs", sweep, ".json", "the sweep's name")


def read_submissions(results_dir: str) -> list[dict]:
    """Every submission record under ``<results_dir>/jobs/``, oldest first (a file that is not one is skipped)."""
    out = []
    jobs = Path(results_dir, "jobs")
    for f in sorted(jobs.glob("*.json"), key=_mtime):
        rec, why = read_json_file(f, root=jobs)
        why = why or _submission_problem(rec)
        if why:
            print(f"warning: skipping {f}: {why}", file=sys.stderr, flush=True)
            continue
        out.append(rec)
    return out


def _mtime(p: Path) -> float:
    try:
        return p.lstat().st_mtime
    except OSError:
        return 0.0


def _submission_problem(rec) -> str | None:
    """Why a parsed ``jobs/*.json`` is not a submission record ``show_jobs`` can print (None when it is)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("points"), list):
        return "not a submission record (a JSON object with a points list)"
    if not all(isinstance(p, dict) for p in rec["points"]):
        return "points holds something other than objects"
    for k in ("sweep", "cluster", "submitit_folder", "submitted"):
        if k in rec and not isinstance(rec[k], (str, type(None))):
            return f"{k} is a {type(rec[k]).__name__}, not a string"
    if not rec.get("sweep"):
        return "no sweep (a submission record names the sweep it submitted)"
    if rec.get("cluster") == "local" and not rec.get("submitit_folder"):
        return "no submitit_folder (a local submission's job states are read there)"
    for p in rec["points"]:
        for k in ("job_id", "run_dir", "row"):
            if not isinstance(p.get(k), (str, int, type(None))) or isinstance(p.get(k), bool):
                return f"a point's {k} is a {type(p.get(k)).__name__}"
        if not isinstance(p.get("overrides") or [], list):
            return "a point's overrides is not a list"
    return None


def slurm_states(job_ids: list[str], sacct: str | None = None) -> dict[str, str] | None:
    """{array task id: Slurm state} from one ``sacct`` call; None where Slurm is not available here."""
    sacct = sacct or shutil.which("sacct")
    if not sacct or not job_ids:
        return None
    jobs = sorted({j.split("_")[0] for j in job_ids})
    try:
        out = subprocess.run([sacct, "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(jobs)],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and parts[0] and parts[1]:
            states[parts[0]] = parts[1].split()[0]  # "CANCELLED by 123" -> CANCELLED
    return states


def local_state(submitit_folder: str, job_id: str) -> str:
    """A local-executor job: RUNNING while its process lives, else FINISHED when submitit wrote its result."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(submitit_folder.replace("%j", job_id), job_id=job_id, task_id=0)
    if paths.result_pickle.exists():
        return "FINISHED"
    return "RUNNING" if job_id.isdigit() and pid_alive(int(job_id)) else "ENDED (no result)"


def show_jobs(results_dir: str, rows: list[tuple[dict, str]], show_all: bool) -> None:
    """The submitted sweeps' jobs beside their rows (module docstring)."""
    by_dir = {str(r.get("run_dir")): s for r, s in rows}
    for rec in read_submissions(results_dir):
        points = rec["points"]
        row_of = [by_dir.get(p.get("run_dir"), "no row") for p in points]
        if not show_all and all(s == "ok" for s in row_of):
            continue
        ids = [str(p.get("job_id")) for p in points]
        note = ""
        if rec.get("cluster") == "local":
            states = [local_state(rec["submitit_folder"], j) for j in ids]
        else:
            found = slurm_states(ids)
            note = "" if found is not None else "; slurm not available (no sacct here): job states unknown"
            states = [(found or {}).get(j, "?") for j in ids]
        print(f"jobs of {rec['sweep']} ({rec.get('cluster')}, submitted {_fmt_age(rec.get('submitted'))} ago, "
              f"{len(points)} points{note})")
        print(f"  {'job':14s} {'job state':18s} {'row':9s} {'point':24s} run_dir")
        for p, j, js, rs in zip(points, ids, states, row_of):
            point = str(p.get("row") or " ".join(p.get("overrides") or []))
            print(f"  {j:14s} {js[:18]:18s} {rs:9s} {point[:24]:24s} {p.get('run_dir')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.status", description=__doc__.split("\n\n")[0])
    p.add_argument("results_dir", nargs="?", default=env_setting("HARNESS_RESULTS_DIR", "results"))
    p.add_argument("--all", action="store_true", help="list ok rows too")
    a = p.parse_args(argv)
    rows = []
    for folder in _folders(a.results_dir):
        here = _row_states(a.results_dir, folder)
        rows += here
        counts: dict[str, int] = {}
        for _, state in here:
            counts[state] = counts.get(state, 0) + 1
        print(f"{folder}: {len(here)} rows" + (": " if here else "") +
              ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    shown = [(r, s) for r, s in rows if a.all or s != "ok"]
    if shown:
        print(f"{'run_id':24s} {'state':8s} {'model/method/train':34s} {'host:pid':24s} {'heartbeat':>9s}  error")
    for r, s in shown:
        what = f"{r.get('model')}/{r.get('method')}/{r.get('train')}"
        who = f"{r.get('host') or '?'}:{r.get('pid') or '?'}"
        beat = _fmt_age(r.get("heartbeat")) if s in ("running", "stale") else "-"
        print(f"{str(r.get('run_id')):24s} {s:8s} {what[:34]:34s} {who[:24]:24s} {beat:>9s}  {r.get('error') or ''}")
    show_jobs(a.results_dir, rows, a.all)
    return 0


if __name__ == "__main__":
    sys.exit(main())
