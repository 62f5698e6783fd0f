"""Benchmarks cannot rot (issue 49): every ``benchmarks/bench_*.py`` takes its model, its native window C and each
method's settings from the harness's own builders and configs (never a hand-set C: ``bench_methods`` once built a
C = 256 model while the LongRoPE factors were for the shipped C = 512, and ``make bench`` failed unseen), and every
one of them runs at tiny sizes in the slow tier (``scripts/bench.py --smoke``, 60 s; ``bench_gpu`` has its own
``--smoke`` test, tests/test_bench_gpu.py)."""
from __future__ import annotations

import ast
import json
import time

import pytest

from harness.conf_utils import group_defaults
from tests.conftest import ROOT, load_file_module

BENCH = ROOT / "benchmarks"
# what a benchmark may not set by hand: the window and the sizes a model builder owns
OWNED = {"C", "native_ctx", "ctx", "max_position_embeddings", "seq_len", "SEQ"}


def _hand_set(tree: ast.AST) -> list[str]:
    """Integer literals given to a name in ``OWNED``: an assignment, a keyword argument or a dict key."""
    out = []
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.Assign):
            pairs = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.Call):
            pairs = [(k.arg, k.value) for k in node.keywords if k.arg]
            if getattr(node.func, "id", getattr(node.func, "attr", "")) == "ModelHandle" and len(node.args) > 3:
                pairs.append(("native_ctx", node.args[3]))
        elif isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)]
        out += [f"line {v.lineno}: {k} = {v.value}" for k, v in pairs
                if k in OWNED and isinstance(v, ast.Constant) and isinstance(v.value, int)]
    return out


def test_no_benchmark_sets_the_window_or_the_model_by_hand():
    files = sorted(BENCH.glob("*.py"))
    assert len(files) >= 8
    bad = {f.name: _hand_set(ast.parse(f.read_text())) for f in files}
    assert not {k: v for k, v in bad.items() if v}, bad
    # the check finds what rotted: the old bench_methods' hand-built model
    old = "C = 256\ncfg = LlamaConfig(max_position_embeddings=C)\nh = ModelHandle(m, None, 'bench', 256, {})\n"
    assert len(_hand_set(ast.parse(old))) == 2


def _errors(x, where="") -> list[str]:
    """Every ``error`` key (a failed part a benchmark recorded and went on) inside a benchmark's results."""
    if isinstance(x, dict):
        return [f"{where}.{k}: {v}" for k, v in x.items() if k == "error" and v is not None] + [
            e for k, v in x.items() for e in _errors(v, f"{where}.{k}")]
    if isinstance(x, list):
        return [e for i, v in enumerate(x) for e in _errors(v, f"{where}[{i}]")]
    return []


@pytest.mark.slow  # 60 s (the default tier's 20 minutes)
def test_every_benchmark_runs_in_smoke_mode(tmp_path, capsys):
    bench = load_file_module(ROOT / "scripts" / "bench.py", "bench_script")
    out = tmp_path / "bench.json"
    t0 = time.time()
    status = bench.main(["--smoke", "--out", str(out)])
    took = time.time() - t0
    d = json.loads(out.read_text())
    names = {f.stem.removeprefix("bench_") for f in bench.benchmarks()}
    assert set(d) == names and {"methods", "attention", "training", "evals", "ppl", "prompt", "limit"} <= names
    failed = {k: v.get("error") or _errors(v.get("results")) for k, v in d.items()
              if v["status"] != "ok" or _errors(v.get("results"))}
    assert status == 0 and not failed, failed
    assert all(v["smoke"] for v in d.values())
    r = d["methods"]["results"]
    C = group_defaults("model", "tiny_llama")["native_ctx"]
    assert r["native_ctx"] == C and r["lengths"] == [C // 2]  # C from conf/model/tiny_llama.yaml
    assert {"longrope", "longrope2", "yarn", "pi", "self_extend"} <= set(r["methods"]) and "base" in r["peer"]
    # every benchmark with a target can fail it: its measured function slowed 3x is called "not within"
    for name in ("methods", "ppl", "prompt", "training"):
        res = d[name]["results"]
        assert res["target_can_fail"]["fails"], (name, res["target_can_fail"])
    for name, key in (("ppl", "vs_release_loop"), ("ppl", "vs_lm_eval"), ("prompt", "passkey")):
        (entry,) = d[name]["results"][key].values()
        assert entry["peer"] and entry["rounds"] >= 3 and entry["ci"] and entry["verdict"], (name, key, entry)
    assert d["ppl"]["results"]["vs_release_loop"]["0.5C"]["same_ppl"]  # the two loops score the same windows
    assert not (ROOT / "results" / "bench.json").stat().st_mtime > t0  # smoke never writes results/bench.json
    with capsys.disabled():
        print(f"\nbenchmarks in smoke mode: {took:.1f} s " +
              ", ".join(f"{k} {v['seconds']} s" for k, v in sorted(d.items())))
