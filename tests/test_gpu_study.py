"""The window runner (`make gpu-study`, ``controlled_study/window.py``) rehearsed on the CPU at tiny scale
(``experiment=gpu_rehearsal``: the shipped tiny_llama, the frozen base and YaRN fine-tuned for 8 steps with a
checkpoint every 2): killed with SIGKILL in the middle of the fine-tuned cell and started again, it finishes with rows
whose metrics and per-sample values are identical to an uninterrupted run's (run ids, times and durations left out);
the fine-tune resumed from its checkpoint instead of starting over; and a third start finds every cell done and runs
nothing. The two runs go side by side, one thread each."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration

# what differs between two runs of the same cell by design: identity, clocks, durations, where it ran
VOLATILE = {"run_id", "time_start", "time_end", "heartbeat", "heartbeat_every_s", "pid", "host", "timings", "run_dir",
            "hardware", "git_sha", "command", "error"}
TRAIN_VOLATILE = {"train_seconds", "tokens_per_second", "resumed_from_step", "checkpoint"}


def _env(base: Path) -> dict:
    env = os.environ.copy()
    env.update(HARNESS_RESULTS_DIR=str(base / "results"), HARNESS_OUTPUT_DIR=str(base / "outputs"),
               HARNESS_CKPT_DIR=str(base / "ckpt"), OMP_NUM_THREADS="1")
    return env


def _start(base: Path, log: str) -> subprocess.Popen:
    out = open(base / log, "w")
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "gpu_study.py"), "experiment=gpu_rehearsal",
                             "--budget-s", "900"], cwd=ROOT, env=_env(base), stdout=out, stderr=subprocess.STDOUT)


def _rows(base: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((base / "results" / "gpu_rehearsal" / "runs").glob("*.json"))]


def _comparable(row: dict) -> dict:
    out = {k: v for k, v in row.items() if k not in VOLATILE}
    if isinstance(out.get("train_info"), dict):
        out["train_info"] = {k: v for k, v in out["train_info"].items() if k not in TRAIN_VOLATILE}
    out.pop("config", None)  # its paths differ; the config hash below stands for the rest
    return out


def _wait(p: subprocess.Popen, base: Path, log: str, timeout: float = 300) -> None:
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    assert p.returncode == 0, (base / log).read_text()[-3000:]


def test_the_window_runner_killed_mid_cell_resumes_to_the_uninterrupted_rows(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    pa, pb = _start(a, "a.log"), _start(b, "b1.log")
    deadline = time.time() + 300
    while not any(d.is_dir() for d in (b / "ckpt").glob("*/step_*")):  # a published checkpoint (not a .tmp-)
        assert pb.poll() is None, "the runner ended before its fine-tune wrote a checkpoint: " + \
            (b / "b1.log").read_text()[-3000:]
        assert time.time() < deadline, "no training checkpoint within 300 s"
        time.sleep(0.05)
    os.kill(pb.pid, signal.SIGKILL)  # mid-cell: the fine-tune has a checkpoint and is still running
    pb.wait()
    assert not [r for r in _rows(b) if r["status"] == "ok" and r.get("train_info")], "killed after the cell ended"
    pb = _start(b, "b2.log")
    _wait(pa, a, "a.log")
    _wait(pb, b, "b2.log")

    rows_a = {r["config_hash"]: r for r in _rows(a)}
    rows_b = {r["config_hash"]: r for r in _rows(b)}
    assert len(rows_a) == 2 and set(rows_a) == set(rows_b), (sorted(rows_a), sorted(rows_b))
    assert len(_rows(b)) == 2, "the restarted cell wrote a second row instead of rewriting its own"
    for h, ra in rows_a.items():
        rb = rows_b[h]
        assert ra["status"] == rb["status"] == "ok", (ra.get("error"), rb.get("error"))
        assert _comparable(ra) == _comparable(rb), f"cell {h}: the resumed run's row differs"
    tuned = [r for r in rows_b.values() if r.get("train_info")]
    assert tuned and tuned[0]["train_info"]["resumed_from_step"], "the fine-tune started over (no checkpoint used)"
    assert (a / "results" / "gpu_rehearsal" / "throughput.json").is_file()

    before = {p.name: p.stat().st_mtime_ns for p in (b / "results" / "gpu_rehearsal" / "runs").glob("*.json")}
    p3 = _start(b, "b3.log")
    _wait(p3, b, "b3.log")
    assert "0 cells came in" in (b / "b3.log").read_text(), (b / "b3.log").read_text()[-2000:]
    after = {p.name: p.stat().st_mtime_ns for p in (b / "results" / "gpu_rehearsal" / "runs").glob("*.json")}
    assert before == after, "a done cell ran again"
