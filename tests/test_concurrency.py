"""Concurrent runs on one results directory: rows are never lost, duplicated or torn; shard merges into one row from
many processes at once keep every shard."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

from harness import results, shards

N = 8
WRITES = 25


def _one_run(i: int, env: dict, barrier) -> None:
    os.environ.update(env)
    from harness import lifecycle
    from harness.sweeps import compose

    cfg = compose(["model=tiny_llama", "train=none", "eval=quick", f"seed={i}"])
    barrier.wait()  # every run starts writing at the same moment
    run = lifecycle.start(cfg, run_dir=Path(env["HARNESS_OUTPUT_DIR"]) / f"run{i}")
    for k in range(WRITES):  # an evaluator result after another, each rewriting the row (as pipeline.evaluate does)
        run.record_eval(f"entry{k}", {"value": {"256": i * 1000 + k}, "pad": "x" * 4000}, 0.0, 1)
    run.finish()


def _reader(results_dir: str, stop, bad) -> None:
    """Reads every row file continuously while the runs write: a reader must never see a torn file."""
    while not stop.is_set():
        for f in Path(results_dir, "runs").glob("*.json"):
            try:
                json.loads(f.read_text())
            except FileNotFoundError:
                pass
            except json.JSONDecodeError:
                bad.value += 1


def test_eight_concurrent_runs_write_eight_intact_rows(tmp_path):
    env = {"HARNESS_RESULTS_DIR": str(tmp_path / "results"), "HARNESS_OUTPUT_DIR": str(tmp_path / "outputs"),
           "HARNESS_CKPT_DIR": str(tmp_path / "ckpt"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(N)
    stop, bad = ctx.Event(), ctx.Value("i", 0)
    reader = ctx.Process(target=_reader, args=(env["HARNESS_RESULTS_DIR"], stop, bad))
    (tmp_path / "results" / "runs").mkdir(parents=True)
    reader.start()
    procs = [ctx.Process(target=_one_run, args=(i, env, barrier)) for i in range(N)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    stop.set()
    reader.join(10)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    files = sorted(Path(env["HARNESS_RESULTS_DIR"], "runs").iterdir())
    assert [f.suffix for f in files] == [".json"] * N, files  # no temp files left behind, no extra rows
    rows = results.read_rows(env["HARNESS_RESULTS_DIR"])
    assert len(rows) == N and len({r["run_id"] for r in rows}) == N
    seeds = sorted(r["config"]["seed"] for r in rows)
    assert seeds == list(range(N))
    for r in rows:
        i = r["config"]["seed"]
        assert r["status"] == "ok" and len(r["metrics"]) == WRITES
        assert [m["value"]["256"] for m in r["metrics"].values()] == [i * 1000 + k for k in range(WRITES)]
        run_json = json.loads(Path(r["run_dir"], "run.json").read_text())  # the run dir keeps config, sha, command
        assert run_json["run_id"] == r["run_id"] and run_json["config"]["seed"] == i and "command" in run_json
    assert bad.value == 0


def _merge_shards(lengths: list[int], env: dict, barrier) -> None:
    os.environ.update(env)
    from harness.sweeps import compose

    cfg = compose(["model=tiny_llama", "train=none", "eval=quick", f"eval.lengths={lengths_all(env)}",
                   "+shard=all"])
    rdir = shards.run_dir(cfg)
    barrier.wait()
    for L in lengths:
        for entry, metric in (("ppl_books", "ppl"), ("passkey", "accuracy")):
            s = shards.Shard(f"{entry}@{L}", entry, L)
            shards._record(rdir, s, status="ok", result={metric: {str(L): L / 10}}, seconds=0.0)
            shards.merge(cfg, rdir)


def lengths_all(env) -> str:
    return "[" + ",".join(str(64 * (i + 1)) for i in range(N)) + "]"


def test_concurrent_shard_merges_keep_every_shard(tmp_path):
    env = {"HARNESS_RESULTS_DIR": str(tmp_path / "results"), "HARNESS_OUTPUT_DIR": str(tmp_path / "outputs"),
           "HARNESS_CKPT_DIR": str(tmp_path / "ckpt"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(N)
    procs = [ctx.Process(target=_merge_shards, args=([64 * (i + 1)], env, barrier)) for i in range(N)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    rows = results.read_rows(env["HARNESS_RESULTS_DIR"])
    assert len(rows) == 1
    row = rows[0]
    want = {str(64 * (i + 1)): 6.4 * (i + 1) for i in range(N)}
    assert {k: round(v, 6) for k, v in row["metrics"]["ppl_books"]["ppl"].items()} == \
        {k: round(v, 6) for k, v in want.items()}
    assert set(row["metrics"]["passkey"]["accuracy"]) == set(want)
    assert row["status"] == "ok" and all(v == "ok" for v in row["shards"].values())
    assert not list(Path(env["HARNESS_RESULTS_DIR"], "runs").glob("*.lock"))
