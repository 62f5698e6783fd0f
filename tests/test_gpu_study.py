"""The window runner (`make gpu-study`, ``controlled_study/window.py``) rehearsed on the CPU at tiny scale
(``experiment=gpu_rehearsal``: the shipped tiny_llama, the frozen base and YaRN fine-tuned for 8 steps with a
checkpoint every 2): killed with SIGKILL in the middle of the fine-tuned cell and started again, it finishes with rows
whose metrics and per-sample values are identical to an uninterrupted run's (run ids, times and durations left out);
the fine-tune resumed from its checkpoint instead of starting over; and a third start finds every cell done and runs
nothing (that third start runs in the test's process). The two runs go side by side, one thread each."""
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


@pytest.mark.integration
def test_the_window_runner_killed_mid_cell_resumes_to_the_uninterrupted_rows(tmp_path, monkeypatch, capsys):
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
        assert ra["metrics"]["passkey"]["correct"] and ra["metrics"]["ppl_books"]["per_sample"]  # per-sample values
        assert _comparable(ra) == _comparable(rb), f"cell {h}: the resumed run's row differs"
    tuned = [r for r in rows_b.values() if r.get("train_info")]
    assert tuned and tuned[0]["train_info"]["resumed_from_step"], "the fine-tune started over (no checkpoint used)"
    assert (a / "results" / "gpu_rehearsal" / "throughput.json").is_file()

    before = {p.name: p.stat().st_mtime_ns for p in (b / "results" / "gpu_rehearsal" / "runs").glob("*.json")}
    from controlled_study import window

    for k, v in _env(b).items():  # a third start, in this process: every cell is done
        if k.startswith("HARNESS_"):
            monkeypatch.setenv(k, v)
    assert window.main(["experiment=gpu_rehearsal", "--budget-s", "900"]) == 0
    out = capsys.readouterr().out
    assert "2 cells, 2 done, 0 to run" in out and "0 cells came in" in out, out
    after = {p.name: p.stat().st_mtime_ns for p in (b / "results" / "gpu_rehearsal" / "runs").glob("*.json")}
    assert before == after, "a done cell ran again"


# -- the planner, unit by unit (no process started) ----------------------------------------------------------------
@pytest.mark.unit
def test_a_finding_names_its_missing_rows_and_the_control():
    from controlled_study.window import missing_keys

    assert missing_keys("no rows: pi, yarn (fine-tuned); no rows: ntk_32k at 16C") == {"pi", "yarn", "ntk_32k"}
    assert missing_keys("no rows: clex, base fine-tuned at C (the same-data control)") == {"clex", "base_ft"}
    assert missing_keys("fragile: no interval") == set()


@pytest.mark.unit
def test_cells_run_most_findings_first_and_only_what_fits():
    from controlled_study.window import Cell, fits, order

    def cell(key, s, trains=False):
        return Cell({"label": key, "done": None, "hash": key}, key, trains, estimate_s=s)

    cs = order([cell("dca", 10), cell("pi", 300, True), cell("yarn", 200, True), cell("base", 50, True)],
               {"pi": 6, "yarn": 6, "base_ft": 2, "base": 9})
    assert [c.key for c in cs] == ["yarn", "pi", "base", "dca"]  # ties: the shorter first; base trained = control
    assert cs[2].unlocks == 2 and cs[3].unlocks == 0
    assert [c.key for c in fits(cs, 260)] == ["yarn", "base", "dca"]  # pi does not fit after yarn; later ones do


@pytest.mark.unit
def test_estimates_come_from_measured_rates_else_are_marked_guesses(monkeypatch):
    from controlled_study import window
    from controlled_study.window import Cell, estimate, record

    monkeypatch.setattr(window, "guessed_peak", lambda kind: 1e12)
    a = Cell({"label": "a", "hash": "a", "done": None}, "pi", True, eval_flops=4e12, train_flops=8e12)
    b = Cell({"label": "b", "hash": "b", "done": None}, "base", False, eval_flops=4e12)
    estimate([a, b], {}, "nvidia-h200")
    assert a.guess and b.guess and a.estimate_s == pytest.approx(4 + 8 + 30)
    tp = record({}, "nvidia-h200", b, {"run_id": "r", "timings": {"eval.passkey": 2.0}}, 5.0, "NVIDIA H200")
    estimate([a, b], tp, "nvidia-h200")
    assert not b.guess and b.estimate_s == pytest.approx(2 + 3)  # 2 TFLOP/s measured, 3 s overhead per cell
    assert a.guess  # evaluation measured, training not yet
    tp = record(tp, "nvidia-h200", a, {"run_id": "s", "timings": {"eval.passkey": 2.0},
                                       "train_info": {"train_seconds": 4.0}}, 9.0, "NVIDIA H200")
    estimate([a], tp, "nvidia-h200")
    assert not a.guess and a.estimate_s == pytest.approx(2 + 4 + 3)  # 8 TFLOP over 4 s; (3 + 3) / 2 overhead
    assert [e["run_id"] for e in tp["nvidia-h200"]["log"]] == ["r", "s"]
    assert estimate([a], {}, "cpu") is None and a.guess  # another kind: nothing measured there


@pytest.mark.unit
def test_the_plan_prints_every_cell_its_estimate_and_the_total(capsys, tmp_path, monkeypatch):
    from controlled_study import window

    monkeypatch.setenv("HARNESS_RESULTS_DIR", str(tmp_path))
    assert window.main(["experiment=gpu_rehearsal", "--plan", "--kind", "nvidia-h200", "--budget-s", "100"]) == 0
    out = capsys.readouterr().out
    assert "gpu-study plan on nvidia-h200: 2 cells, 0 done, 2 to run; budget 100 s" in out
    assert all(f"point=gpu_rehearsal/{p}" in out for p in ("base", "yarn")), out
    assert out.count("(guess)") == 2 and "study total to run: ~" in out and "2 of them on a guessed rate" in out
    assert not (tmp_path / "gpu_rehearsal").exists()  # a plan writes nothing
