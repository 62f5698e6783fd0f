"""Sharded evaluation (harness/shards.py): the plan, the merge of per-length outputs into one row, and a sharded run
killed midway whose rerun completes only the missing shards."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, random_llama

from harness import shards
from harness.sweeps import compose
from tests import forkrun


def save_small_model(d: Path) -> Path:
    """A 2-layer random Llama with tiny_llama's tokenizer, loadable as ``model=tiny_llama model.path=<d>``."""
    from transformers import AutoTokenizer

    src = ROOT / "harness" / "assets" / "tiny_llama"
    tok = AutoTokenizer.from_pretrained(src)
    m = random_llama(vocab=len(tok), hidden=64, layers=2, heads=4, ctx=256, theta=1000.0)
    m.config.bos_token_id, m.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    m.config.pad_token_id = tok.pad_token_id
    m.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def env_for(tmp: Path) -> dict:
    env = dict(os.environ)
    env.update(HARNESS_RESULTS_DIR=str(tmp / "results"), HARNESS_OUTPUT_DIR=str(tmp / "outputs"),
               HARNESS_CKPT_DIR=str(tmp / "ckpt"), HARNESS_CACHE_DIR=str(tmp / "cache"), HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    return env


def overrides(model_dir: Path) -> list[str]:
    return ["model=tiny_llama", f"model.path={model_dir}", "model.native_ctx=128", "train=none", "eval=quick",
            "eval.lengths=[128,256]", "eval.suite.ppl_books.samples=1", "eval.suite.passkey.samples=2",
            "eval.suite.passkey.depth_bins=2"]


def test_plan_and_merge_rules(results_env):
    from harness.sweeps import compose

    cfg = compose(["model=tiny_llama", "model.native_ctx=64", "train=none", "eval=quick", "+shard=all"])
    names = [s.name for s in shards.plan(cfg)]
    assert names == ["ppl_books@64", "ppl_books@128", "ppl_books@256", "passkey@64", "passkey@128", "passkey@256"]
    cfg2 = compose(["model=tiny_llama", "model.native_ctx=64", "train=tiny", "eval=quick", "+shard=passkey@64"])
    assert [s.name for s in shards.plan(cfg2)][0] == "train"
    # the run id ignores the shard spec, and changes with anything else
    cfg3 = compose(["model=tiny_llama", "model.native_ctx=64", "train=none", "eval=quick", "+shard=passkey@64"])
    cfg4 = compose(["model=tiny_llama", "model.native_ctx=64", "train=none", "eval=quick", "+shard=all", "seed=1"])
    assert shards.run_id(cfg) == shards.run_id(cfg3) != shards.run_id(cfg4)
    with pytest.raises(Exception, match="not in this run's plan"):
        shards.select(cfg, "passkey@999")
    a = {"accuracy": {"64": 1.0}, "accuracy_by_depth": {"64": [1, 1]}, "skipped": {}}
    b = {"accuracy": {"128": 0.5}, "accuracy_by_depth": {"128": [0, 1]}, "skipped": {"256": "too long"}}
    assert shards.deep_merge(a, b) == {"accuracy": {"64": 1.0, "128": 0.5},
                                       "accuracy_by_depth": {"64": [1, 1], "128": [0, 1]},
                                       "skipped": {"256": "too long"}}


def test_merge_rebuilds_row_from_shard_files(results_env):
    from harness.sweeps import compose

    cfg = compose(["model=tiny_llama", "model.native_ctx=64", "train=none", "eval=quick", "+shard=all"])
    rdir = shards.run_dir(cfg)
    plan = shards.plan(cfg)
    for s in plan[:4]:
        shards._record(rdir, s, status="ok", result={"ppl" if s.entry == "ppl_books" else "accuracy":
                                                     {str(s.length): float(s.length)}}, seconds=0.1)
    row = shards.merge(cfg)
    assert row["status"] == "running" and row["run_id"] == shards.run_id(cfg)
    assert row["metrics"]["ppl_books"]["ppl"] == {"64": 64.0, "128": 128.0, "256": 256.0}
    assert row["metrics"]["passkey"]["accuracy"] == {"64": 64.0}
    shards._record(rdir, plan[4], status="failed", error="RuntimeError: boom", seconds=0.1)
    row = shards.merge(cfg)
    assert row["status"] == "failed" and "passkey@128" in row["error"]
    shards._record(rdir, plan[4], status="ok", result={"accuracy": {"128": 1.0}}, seconds=0.1)
    shards._record(rdir, plan[5], status="ok", result={"accuracy": {"256": 0.0}}, seconds=0.1)
    row = shards.merge(cfg)
    assert row["status"] == "ok" and row["error"] is None
    assert list(row["metrics"]["passkey"]["accuracy"]) == ["64", "128", "256"]
    rows = list(Path(cfg.paths.results_dir, "runs").glob("*.json"))
    assert len(rows) == 1


def test_a_shard_evaluates_a_view_of_the_built_suite(results_env):
    """A shard's unit is a view of the run's built suite made by the evaluation plan (no second build): the entry's
    evaluator with its lengths restricted to the shard's, ppl's yarn filter pinned to the entry's largest length; the
    run's suite is left as it was."""
    from harness.evals.suite import Suite, plan

    suite = Suite.of(compose(["model=tiny_llama", "model.native_ctx=64", "train=none", "eval=quick"]))
    units = {u.name: u for u in plan(suite, by_length=True)}
    ev = units["ppl_books@128"].view
    assert type(ev) is type(suite.evaluators[0]) and ev is not suite.evaluators[0]
    assert (ev.args.lengths, ev.args.min_tokens, ev.args.samples) == ([128], 256, suite.evaluators[0].args.samples)
    assert units["ppl_books@128"].node == {**suite.nodes["ppl_books"], "lengths": [128], "min_tokens": 256}
    pk = units["passkey@64"].view
    assert pk.args.lengths == [64] and pk.args.depth_bins == suite.evaluators[1].args.depth_bins
    assert [e.args.lengths for e in suite.evaluators] == [[64, 128, 256]] * 2
    assert suite.evaluators[0].args.min_tokens == 0


def test_a_sharded_job_builds_its_suite_once(results_env, monkeypatch):
    """One job running 3 shards builds each suite entry's evaluator once (a spy around the registry's builder),
    not once for the plan, once for the checks and once per shard."""
    from harness.evals import EVALS
    from harness.sweeps import compose

    built, build = [], EVALS.build

    def spy(node, where, *args, **kwargs):
        built.append(where)
        return build(node, where, *args, **kwargs)

    model_dir = save_small_model(results_env / "model")
    cfg = compose([*overrides(model_dir), "eval.suite.passkey.lengths=[128]", "+shard=all"])
    monkeypatch.setattr(EVALS, "build", spy)
    row = shards.run(cfg, log=lambda m: None)
    assert row["status"] == "ok" and list(row["shards"]) == ["ppl_books@128", "ppl_books@256", "passkey@128"]
    assert built == ["eval.suite.ppl_books", "eval.suite.passkey"]


STAGES = ("setup", "check_cost", "load_and_extend", "finetune", "evaluate")


def _record_stages(monkeypatch) -> list:
    """Wrap the pipeline's stages (and the cost check) so that each call is recorded with the units it evaluates."""
    from harness import pipeline, plan

    calls: list = []
    for mod, name in [(pipeline, n) for n in STAGES if n != "check_cost"] + [(plan, "check_cost")]:
        fn = getattr(mod, name)

        def spy(*args, _fn=fn, _name=name, **kwargs):
            units = args[1] if _name == "check_cost" else None
            calls.append((_name, kwargs.get("names") if _name != "check_cost" else [u.name for u in units]))
            return _fn(*args, **kwargs)

        monkeypatch.setattr(mod, name, spy)
    return calls


def test_a_sharded_job_runs_the_stages_of_a_plain_run(results_env, monkeypatch):
    """A plain run and a sharded job call the same stage functions in the same order (``harness.api.run``'s): the
    sharded job is the run restricted to its units (``names``), recording into its own recorder; the shards have no
    stage loop of their own."""
    from harness import api, lifecycle

    model_dir = save_small_model(results_env / "model")
    args = [*overrides(model_dir), "eval.suite.passkey.lengths=[128]"]
    calls = _record_stages(monkeypatch)
    cfg = compose(args)
    r = lifecycle.start(cfg)
    api.run(cfg, r)
    assert r.finish() is None
    plain, calls[:] = list(calls), []
    row = shards.run(compose([*args, "+shard=all"]), log=lambda m: None)
    assert row["status"] == "ok"
    names = ["ppl_books@128", "ppl_books@256", "passkey@128"]
    assert [c[0] for c in plain] == [c[0] for c in calls] == list(STAGES)
    assert plain[1] == ("check_cost", ["ppl_books", "passkey"]) and plain[-1] == ("evaluate", None)
    assert calls[1] == ("check_cost", names) and calls[-1] == ("evaluate", names)
    assert {k: v for k, v in row["metrics"].items()} == {k: v for k, v in r.row["metrics"].items()}


def test_killed_sharded_run_resumes_only_missing_shards(tmp_path):
    model_dir = save_small_model(tmp_path / "model")
    env = env_for(tmp_path)
    cmd = [sys.executable, str(ROOT / "run.py"), *overrides(model_dir), "+shard=all"]
    from harness.sweeps import compose

    os.environ.update({k: env[k] for k in ("HARNESS_RESULTS_DIR", "HARNESS_OUTPUT_DIR", "HARNESS_CKPT_DIR",
                                           "HARNESS_CACHE_DIR")})
    try:
        cfg = compose([*overrides(model_dir), "+shard=all"])
        rdir = shards.run_dir(cfg)
    finally:
        for k in ("HARNESS_RESULTS_DIR", "HARNESS_OUTPUT_DIR", "HARNESS_CKPT_DIR", "HARNESS_CACHE_DIR"):
            os.environ.pop(k, None)
    names = [s.name for s in shards.plan(cfg)]

    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    deadline = time.time() + 900  # generous: startup alone is slow on a loaded CPU
    while time.time() < deadline and p.poll() is None:
        if len(list((rdir / "shards").glob("*.json"))) >= 1:
            break
        time.sleep(0.02)
    os.killpg(p.pid, signal.SIGKILL)  # midway: after the first shard
    p.wait()
    first = {f.stem: json.loads(f.read_text()) for f in (rdir / "shards").glob("*.json")}
    assert 1 <= len(first) < len(names), f"kill was not midway: {sorted(first)} of {names}"
    assert all(r["status"] == "ok" and r["pid"] == p.pid for r in first.values())
    row_files = list((tmp_path / "results" / "runs").glob("*.json"))
    assert len(row_files) == 1
    row = json.loads(row_files[0].read_text())
    assert row["status"] == "running"

    out = forkrun.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "skipped: " + ", ".join(n for n in names if n in first) in " ".join(out.stdout.split())
    second = {f.stem: json.loads(f.read_text()) for f in (rdir / "shards").glob("*.json")}
    assert sorted(second) == sorted(names)
    for name, rec in second.items():
        if name in first:
            assert rec == first[name]  # finished shards were not recomputed
        else:
            assert rec["pid"] != p.pid and rec["status"] == "ok"
    row_files = list((tmp_path / "results" / "runs").glob("*.json"))
    assert len(row_files) == 1  # still one row
    row = json.loads(row_files[0].read_text())
    assert row["status"] == "ok", row.get("error")
    assert set(row["metrics"]["ppl_books"]["ppl"]) == {"128", "256"}
    assert set(row["metrics"]["passkey"]["accuracy"]) == {"128", "256"}
    assert row["config"]["model"]["path"] == str(model_dir) and "shard" not in row["config"]
    assert (rdir / "run.json").exists() and row["git_sha"] is not None and "+shard=all" in row["command"]

    # the merged shards equal an unsharded run of the same config
    plain = forkrun.run([sys.executable, str(ROOT / "run.py"), *overrides(model_dir)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
    assert plain.returncode == 0, plain.stderr[-2000:]
    rows = [json.loads(f.read_text()) for f in (tmp_path / "results" / "runs").glob("*.json")]
    other = next(r for r in rows if r["run_id"] != row["run_id"])
    assert other["metrics"]["ppl_books"]["ppl"] == row["metrics"]["ppl_books"]["ppl"]
    assert other["metrics"]["passkey"]["accuracy"] == row["metrics"]["passkey"]["accuracy"]
    # every metric, not only the headline ones: the shards ran the pipeline's own evaluation stage
    assert other["metrics"] == row["metrics"]
    assert other["method_params"] == row["method_params"]
    assert other["eval_versions"] == row["eval_versions"] == {"ppl_books": 1, "passkey": 1}
    for k in ("model", "method", "data", "train", "eval", "config", "config_hash", "schema"):
        assert other[k] == row[k], k
    # one run.json writer: the same fields in a plain run's directory and a sharded run's
    plain_run = json.loads(Path(other["run_dir"], "run.json").read_text())
    sharded_run = json.loads((rdir / "run.json").read_text())
    assert set(plain_run) == set(sharded_run) and plain_run["config"] == sharded_run["config"]
