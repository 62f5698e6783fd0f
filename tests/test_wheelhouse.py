"""The offline GPU check's install path, on this CPU (slow: it needs package access and builds a venv): the folder
``scripts/wheelhouse.py`` builds (no torch, no CUDA library, under its size budget) installs with ``--no-index
--no-deps`` into a fresh venv that holds only the project's torch and a GPU node's usual ML packages, and
``scripts/gpu_check.py --smoke`` runs from there."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

# a GPU node's usual ML environment (scripts/wheelhouse.py: assumed present), at the tested versions
NODE_ENV = ["transformers", "accelerate", "peft", "numpy", "scipy", "pandas", "pyarrow", "matplotlib", "pyyaml",
            "rich", "filelock", "psutil"]


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
    return r


@pytest.mark.slow
def test_wheelhouse_installs_offline_beside_the_node_torch_and_gpu_check_runs(tmp_path):
    t0 = time.time()
    wh = tmp_path / "wheelhouse"
    r = _run([sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "--out", str(wh)])
    names = [p.name.lower() for p in wh.glob("*.whl")]
    assert names and not [n for n in names if n.startswith(("torch-", "triton-", "nvidia"))]
    assert sum(p.stat().st_size for p in wh.glob("*.whl")) < 60 * 2**20, r.stdout
    venv = tmp_path / "node"
    _run([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "-q", "torch==2.13.0"])  # the node's own torch (here: the project's CPU one)
    _run([py, "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"), *NODE_ENV])
    torch_before = _run([py, "-c", "import torch; print(torch.__version__)"]).stdout.strip()
    _run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links", str(wh),
          *[str(p) for p in wh.glob("*.whl")]])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(ROOT), PIP_NO_INDEX="1", HF_HUB_OFFLINE="1")
    out = _run([py, str(ROOT / "scripts" / "gpu_check.py"), "--smoke", "--work", str(tmp_path / "work"),
                "--skip", "bench_gpu"], cwd=ROOT, env=env, timeout=3000)
    assert "all passed" in out.stdout, out.stdout[-3000:]
    assert _run([py, "-c", "import torch; print(torch.__version__)"]).stdout.strip() == torch_before
    print(f"wheelhouse + venv + gpu_check --smoke: {time.time() - t0:.0f} s")
