"""Training over several nodes (``train.nodes``, ``harness.train.zero.nodes``): two launchers on localhost (node
ranks 0 and 1, one rank each, the rendezvous from ``MASTER_ADDR`` / ``MASTER_PORT`` / ``NODE_RANK``) train to the
weights of one launcher with the same world size; node 1 is a real ``run.py`` that joins and writes no row; what
cannot run is refused in one line, at submission and inside the job."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest
from conftest import ROOT, random_llama
from omegaconf import OmegaConf

from harness import submit, sweeps
from harness.config import ConfigError
from harness.train import TrainArgs
from harness.train.zero import nodes


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.unit
def test_each_node_finds_its_place_from_the_standard_environment():
    env = {"MASTER_ADDR": "node0", "MASTER_PORT": "29501", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2"}
    n = nodes.node(16, 2, env)
    assert (n.rank, n.count, n.per_node, n.follower) == (1, 2, 8, True)
    assert n.torchrun_args()[:5] == ["--nnodes=2", "--node_rank=1", "--nproc_per_node=8", "--master_addr=node0",
                                     "--master_port=29501"]
    assert nodes.node(16, 2, {**env, "NODE_RANK": "0"}).rank == 0  # NODE_RANK wins over Slurm's
    assert nodes.node(8, 1, {}).torchrun_args() == ["--standalone", "--nproc_per_node=8"]
    for bad, msg in (({"SLURM_STEP_NUM_NODES": "2"}, r"spans 2 nodes but train.nodes=1: set train.nodes=2"),
                     ({"NODE_RANK": "0"}, r"needs MASTER_ADDR, MASTER_PORT"),
                     ({**env, "NODE_RANK": "2"}, r"node rank 2 is outside 0..1"),
                     ({**env, "MASTER_PORT": "x"}, r"MASTER_PORT='x' is not an integer")):
        with pytest.raises(ConfigError, match=msg) as e:
            nodes.node(16, 2 if "NODE_RANK" in bad or "MASTER_ADDR" in bad else 1, bad)
        assert "\n" not in str(e.value)
    frozen = OmegaConf.create({"train": {"enabled": False}})
    assert nodes.role(frozen, {}) is None
    with pytest.raises(ConfigError, match="trains nothing on them"):
        nodes.role(frozen, {"SLURM_STEP_NUM_NODES": "2"})


@pytest.mark.unit
def test_train_nodes_is_checked_with_the_recipe():
    base = {"name": "t", "enabled": True, "engine": "deepspeed", "world_size": 16, "nodes": 2, "seq_len": 131072,
            "tokens": 10**9, "global_batch": 16}
    TrainArgs(**base).validate()
    TrainArgs(**{**base, "sequence_parallel": 8}).validate()  # a sequence's 8 ranks inside a node
    for kw, msg in (({"nodes": 3}, "train.nodes=3 does not divide train.world_size=16"),
                    ({"nodes": 0}, "is not a node count"),
                    ({"engine": "single", "world_size": 1}, "needs train.engine=deepspeed"),
                    ({"sequence_parallel": 16}, "a sequence's all-to-all would cross nodes")):
        with pytest.raises(ConfigError, match=msg):
            TrainArgs(**{**base, **kw}).validate()


@pytest.mark.unit
def test_submission_and_the_rendered_script_give_every_node_a_run_py(tmp_path):
    """A fine-tuned point on 2 nodes x 8 GPUs submits and renders ``--nodes=2`` with one task per node; a job whose
    nodes are not the point's ``train.nodes``, or a frozen point on 2 nodes, is refused in one line."""
    pi = ["experiment=paper_llama2", "point=paper_llama2/pi", "hydra/launcher=slurm_a100"]
    two = [*pi, "hydra.launcher.nodes=2", "train.nodes=2", "train.world_size=16", "train.global_batch=32"]
    cfg = sweeps.compose(two, with_hydra=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    submit.nodes_rule(launcher, [cfg])
    for over, msg in (([*pi, "hydra.launcher.nodes=2", "train.world_size=16"],
                       r"hydra.launcher.nodes=2 but train.nodes=1 .*use hydra.launcher.nodes=1"),
                      ([*pi, "hydra.launcher.nodes=2", "train.nodes=2"],
                       r"train.world_size=8 but a job has 2 node\(s\) of 8 GPUs"),
                      (["experiment=paper_llama2", "point=paper_llama2/base", "hydra/launcher=slurm_a100",
                        "hydra.launcher.nodes=2"], "a point that trains nothing runs on one node")):
        c = sweeps.compose(over, with_hydra=True)
        with pytest.raises(ConfigError, match=msg) as e:
            submit.nodes_rule(OmegaConf.to_container(c.hydra.launcher, resolve=True), [c])
        assert "\n" not in str(e.value)
    from conftest import load_file_module

    render = load_file_module(ROOT / "scripts" / "render_sbatch.py")
    text = render.render(two)
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --ntasks-per-node=1\n" in text
    assert "srun --ntasks=2 --ntasks-per-node=1 " in text
    assert "export MASTER_ADDR=" in text and "export MASTER_PORT=" in text  # the rendezvous every node reads


def _model_dir(tmp):
    from transformers import AutoTokenizer

    d = tmp / "model"
    tok = AutoTokenizer.from_pretrained(ROOT / "harness" / "assets" / "tiny_llama")
    m = random_llama(vocab=len(tok), hidden=32, layers=2, heads=2, ctx=64, seed=5)
    m.config.bos_token_id, m.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    m.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.mark.slow
def test_two_launchers_on_localhost_train_the_weights_of_one(tmp_path, monkeypatch):
    """ZeRO-3, fp32, 2 ranks, 4 steps with EMA and a checkpoint: node 0 (``launch`` in this process, node rank 0)
    and node 1 (``python run.py`` with ``NODE_RANK=1``: it joins through ``harness.app``, its ranks get the spec
    from rank 0, it writes no row) give bit-identical gathered weights and the same losses as one launcher of 2
    ranks."""
    from safetensors.torch import load_file

    from harness.config import to_args
    from harness.data import build_data
    from harness.methods import build_method
    from harness.models import build_model
    from harness.train import deepspeed_engine as de

    train = {"name": "t", "enabled": True, "engine": "deepspeed", "world_size": 2, "seq_len": 128,
             "tokens": 128 * 4 * 4, "global_batch": 4, "micro_batch": 1, "lr": 5e-3, "warmup_steps": 1, "ema": True,
             "ema_decay": 0.5, "save_every": 2, "autocast": "float32", "log_every": 1, "seed": 0}
    cfg = OmegaConf.create({
        "model": {"name": "tiny_llama", "path": str(_model_dir(tmp_path)), "native_ctx": 64},
        "method": {"name": "pi", "scale": 2.0},
        "data": {"name": "local_mix", "shares": {"synthetic": 1.0}, "synthetic_docs": 40, "doc_tokens": 256,
                 "cache_dir": str(tmp_path / "cache"), "seed": 0},
        "train": train, "seed": 0})

    def fresh():
        method = build_method(cfg.method)
        handle = build_model(cfg.model)
        method.apply(handle)
        return handle, method

    a = to_args(TrainArgs, cfg.train, "train")
    h1, m1 = fresh()
    build_data(cfg.data, h1.tokenizer, a.seq_len, a.tokens)  # node 0's parent builds the cache, every rank reads it
    one = de.launch(cfg, h1, m1, a, tmp_path / "ckpt1", "fp", tmp_path / "one")

    two = OmegaConf.merge(cfg, {"train": {"nodes": 2}})
    a2 = to_args(TrainArgs, two.train, "train")
    a2.validate()
    port, run_dir = _port(), tmp_path / "two"
    rdv = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "HARNESS_JOIN_TIMEOUT_S": "180"}
    for k in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_ID"):
        monkeypatch.delenv(k, raising=False)
    env = {**os.environ, **rdv, "NODE_RANK": "1", "HARNESS_RESULTS_DIR": str(tmp_path / "results")}
    cmd = [sys.executable, str(ROOT / "run.py"), "model=tiny_llama", "method=pi", "train=tiny_zero3", "train.nodes=2",
           f"hydra.run.dir={run_dir}"]
    out = {}

    def node1():
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        out.update(rc=p.returncode, log=p.stdout + p.stderr)

    follower = threading.Thread(target=node1)
    follower.start()
    for k, v in {**rdv, "NODE_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    h2, m2 = fresh()
    try:
        info = de.launch(two, h2, m2, a2, tmp_path / "ckpt2", "fp", run_dir)
    finally:
        follower.join(timeout=600)
    assert out.get("rc") == 0, out.get("log", "")[-3000:]
    assert "node 1 of 2: joining node 0's training" in out["log"]
    assert not list((tmp_path / "results").glob("**/*.json")), "node 1 wrote a row"
    assert info["losses"] == one["losses"] and info["world_size"] == 2
    w1, w2 = (load_file(d / "train_job" / "final" / "model.safetensors") for d in (tmp_path / "one", run_dir))
    assert w1.keys() == w2.keys() and all(__import__("torch").equal(w1[k], w2[k]) for k in w1)
