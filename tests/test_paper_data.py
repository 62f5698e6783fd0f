"""The paper's data at the paper's scale: the CPU miniature's mixture under a cluster recipe is one ConfigError line
in validation (``harness.data.check_budget``, from the data YAML's ``max_tokens``), and every reader the cluster data
reaches is a declared dependency (``zstandard`` for SlimPajama's ``*.jsonl.zst`` shards). What the paper experiments
compose is checked with their sweep points in tests/test_sweeps.py."""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from harness import conf_utils, pipeline
from harness.config import ConfigError


@pytest.mark.parametrize("train", ["paper", "paper_64k_2b"])
def test_cpu_mixture_under_the_paper_recipe_is_one_line(train):
    cfg = conf_utils.compose(["model=llama2_7b", "method=yarn", f"train={train}"])  # data: the default, local_mix
    assert cfg.data.name == "local_mix"
    with pytest.raises(ConfigError) as e:
        pipeline.validate(cfg, data=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("data=local_mix is the CPU miniature's mixture")
    assert "use data=slimpajama_upsampled" in msg and f"train={train} asks for" in msg


def test_the_budget_rule_is_the_data_yaml_s():
    """The refusal comes from what the data config says it is for, not from the names involved: the cluster data,
    the miniature's own recipe and a local_mix whose ``max_tokens`` is lifted all validate."""
    ok = [["model=llama2_7b", "method=yarn", "train=paper", "data=slimpajama_upsampled"],
          ["method=yarn", "train=tiny"],
          ["model=llama2_7b", "method=yarn", "train=paper", "data.max_tokens=0"]]
    for over in ok:
        pipeline.validate(conf_utils.compose(over), data=False)
    cfg = conf_utils.compose(["method=yarn", "train=tiny", "data.max_tokens=1000"])
    with pytest.raises(ConfigError, match=r"data=local_mix .* for train.tokens <= 1,000 \(data.max_tokens\)"):
        pipeline.validate(cfg, data=False)


def test_run_py_refuses_before_anything_loads(tmp_path):
    """The README's one-point command without a data choice: run.py ends with that one line (and a failed row), in
    seconds, before any model or data is loaded (LLaMA2-7B is not on this machine)."""
    env = dict(os.environ, HARNESS_RESULTS_DIR=str(tmp_path / "results"), HARNESS_OUTPUT_DIR=str(tmp_path / "out"),
               HARNESS_CKPT_DIR=str(tmp_path / "ckpt"), HARNESS_CACHE_DIR=str(tmp_path / "cache"),
               HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "model=llama2_7b", "method=yarn", "train=paper"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    errors = [ln for ln in (out.stdout + out.stderr).splitlines() if "data=local_mix" in ln]
    assert len(errors) == 1 and "use data=slimpajama_upsampled" in errors[0], out.stdout[-2000:] + out.stderr[-2000:]
    rows = [json.loads(f.read_text()) for f in (tmp_path / "results" / "runs").glob("*.json")]
    assert len(rows) == 1 and rows[0]["status"] == "failed" and rows[0]["error"].startswith("data=local_mix")
    assert not (tmp_path / "cache").exists()  # no data was built


def test_zstandard_is_declared_and_reads_the_cluster_shards(tmp_path):
    """scripts/prepare_cluster_data.py fetches SlimPajama's ``*.jsonl.zst`` shards; data=slimpajama_upsampled reads
    them with ``zstandard``, which must be a pinned dependency that is installed at its pin."""
    deps = (ROOT / "pyproject.toml").read_text().split("dependencies = [", 1)[1].split("]", 1)[0]  # [project]'s
    pin = re.findall(r'^\s*"zstandard==([^"]+)"', deps, flags=re.M)
    assert len(pin) == 1, deps
    assert importlib.metadata.version("zstandard") == pin[0]

    import zstandard

    from harness.data.slimpajama_upsampled import iter_records

    records = [{"text": f"document {i} " * (i + 1), "meta": {"redpajama_set_name": src}}
               for i, src in enumerate(["RedPajamaC4", "RedPajamaBook", "RedPajamaArXiv"])]
    raw = "".join(json.dumps(r) + "\n" for r in records).encode()
    (tmp_path / "example_train_0.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    got = sorted(iter_records(tmp_path, seed=0), key=lambda st: st[1])
    assert got == sorted(((r["meta"]["redpajama_set_name"], r["text"]) for r in records), key=lambda st: st[1])
