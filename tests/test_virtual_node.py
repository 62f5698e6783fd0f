"""The paper's node rehearsed with the cluster's own defaults, on the virtual node of ``tests/virtual_node.py`` (two
emulated 80 GB GPUs seen through ``torch.cuda`` and ``harness.device``): what ``device: auto``, ``attention.backend:
auto``, ``choose_device_map`` and ``eval_world_size: auto`` resolve to there; every evaluator of ``eval=paper`` on a
model split over the two GPUs (per-sample records equal to the unsplit model's); every method with the backend CUDA
picks. Tiny sizes throughout (a random 4-layer model with tiny_llama's tokenizer, a few hundred tokens)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from harness.conf_utils import CONF_DIR, group_defaults
from tests.virtual_node import STANDIN, OnDevice, gpu, on_gpus, unwrap

C = 128  # the random model's window: evaluation lengths C and 2C


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from harness.models.tiny_llama import ASSET_DIR

    return AutoTokenizer.from_pretrained(str(ASSET_DIR))


def halves(layers: int = 4) -> dict:
    """An accelerate map of the small model: embedding and the first half of the layers on GPU 0, the rest, the
    final norm and the LM head on GPU 1 (accelerate's balanced split of so small a model puts it all on one GPU: its
    embedding outweighs its layers)."""
    m = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    return {**m, **{f"model.layers.{i}": int(i >= layers // 2) for i in range(layers)}}


def small_handle(tokenizer, layers: int = 4, native_ctx: int = C):
    """A random LLaMA with tiny_llama's tokenizer and ``layers`` layers (enough to split over two GPUs)."""
    from transformers import LlamaForCausalLM

    from harness.models import ModelHandle, rotary_dim
    from harness.models.tiny_llama import tiny_config

    torch.manual_seed(0)
    cfg = tiny_config(len(tokenizer), 500.0, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                      native_ctx=native_ctx, layers=layers, hidden=64, heads=2, intermediate=128)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    return ModelHandle(model, tokenizer, "tiny_llama", native_ctx, {"rotary_dim": rotary_dim(cfg)})


# --------------------------------------------------------------------------------------------- what resolves how
def test_the_virtual_node_resolves_the_cluster_defaults(virtual_node, tokenizer):
    """``device: auto`` is GPU 0; ``attention.backend: auto`` means flex for a tensor on a GPU and switches the
    model's stock attention to ``harness_causal``; ``eval_world_size: auto`` counts the GPUs (and the replicas of a
    split model); the free memory is the capacity minus what lives there."""
    from harness.device import resolve_device
    from harness.eval_distributed import resolve_world_size
    from harness.methods.flex import CAUSAL_NAME, resolve, set_backend
    from harness.models import available_memory, place

    assert resolve_device("auto") == gpu(0) and resolve_device("cuda:1") == gpu(1)
    assert resolve_world_size("auto") == 2 and resolve_world_size("auto", gpus_per_replica=2) == 1
    handle = small_handle(tokenizer)
    set_backend(handle.model, "auto")
    assert handle.model.config._attn_implementation == CAUSAL_NAME
    before = [available_memory(gpu(0)), available_memory(gpu(1))]  # what earlier tests left there stays out
    with virtual_node:
        place(handle.model, gpu(0))
        assert on_gpus(handle.model) == {0}
        module = handle.model.model.layers[0].self_attn
        assert resolve(module, torch.zeros(1, device=gpu(0)).device) == "flex"
        weights = sum(p.numel() * p.element_size() for p in handle.model.parameters())
        assert before[0] - available_memory(gpu(0)) >= weights and available_memory(gpu(1)) == before[1]


# ------------------------------------------------------------------------------- the paper's evaluators, split
def paper_evaluators() -> list[str]:
    """The evaluator names of ``eval=paper``'s suite (its defaults list)."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(CONF_DIR / "eval" / "paper.yaml")
    return sorted({next(iter(d.values())) for d in OmegaConf.to_container(node.defaults) if isinstance(d, dict)})


TINY = {  # tiny settings of each of eval=paper's evaluators (the classes are the paper's; the data ship offline)
    "ppl": {"samples": 2, "lengths": [C, 2 * C], "max_windows": 1},
    "nll_by_position": {"samples": 2, "length": 2 * C, "buckets": 4, "lengths": [2 * C]},
    "passkey": {"samples": 2, "gen_tokens": 3, "lengths": [C]},
    "niah": {"context_lengths": [C, C, 1], "depth_intervals": 2, "gen_tokens": 3, "buffer": -1, "lengths": [C]},
    "ruler": {"samples": 1, "tasks": ["niah_single_2"], "lengths": [2 * C],
              "tokens_to_generate": {"niah": 3, "variable_tracking": 3}, "small_threshold": 1000000,
              "essay_increment": 25, "vt_icl_length": 40, "vt_increment": 2},
}


def test_every_paper_evaluator_has_tiny_settings():
    assert set(paper_evaluators()) == set(TINY)


def _evaluate(handle, method, name: str, run_dir) -> tuple[dict, list]:
    from harness.evals import EvalContext, build_evaluators

    node = {**group_defaults("evaluator", name), **TINY[name]}
    ev = build_evaluators({name: node})[0]
    ctx = EvalContext(run_dir=run_dir, seed=0, autocast="float32", batch_tokens=0)
    out = ev.run(handle, method, ctx)
    path = run_dir / "samples" / f"{name}.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    return out, records


def _close(a, b, where: str = "") -> None:
    """Equal JSON, floats to 1e-4 relative (the split model computes the same ops on the same values)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            if "seconds" not in k:  # wall time is not a result
                _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), (where, a, b)
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("name", sorted(TINY))
def test_paper_evaluator_on_a_model_split_over_two_gpus(name, virtual_node, tokenizer, tmp_path):
    """Each evaluator of ``eval=paper`` on the model split over the node's two GPUs by ``harness.models.place``
    (accelerate's hooks, the layers half on each GPU, the logits on the second): the same per-sample records and
    outputs as on one device. Before the labels followed the logits, ``token_nll`` raised "Expected all tensors to
    be on the same device" here (PPL, NLL by position)."""
    from harness.methods import build_method
    from harness.methods.flex import set_backend
    from harness.models import place

    method = build_method(group_defaults("method", "base"))
    ref = small_handle(tokenizer)
    method.apply(ref)
    want = _evaluate(ref, method, name, tmp_path / "one")
    handle = small_handle(tokenizer)
    set_backend(handle.model, "auto")  # what a CUDA node picks: harness_causal (flex for packed documents)
    method.apply(handle)
    with virtual_node:
        place(handle.model, gpu(0), halves())
        assert on_gpus(handle.model) == {0, 1}
        assert handle.model.lm_head.weight.device == gpu(1)
        got = _evaluate(handle, method, name, tmp_path / "split")
    assert virtual_node.kernels.eager_calls == 0  # every fused call ran a compiled graph
    assert want[0] and (want[1] or name == "ppl"), "nothing to compare"  # PPL keeps its per-document NLL in the output
    _close(list(want), list(got), name)


def test_token_nll_of_a_split_model_equals_the_unsplit_one(virtual_node, tokenizer):
    from harness.evals.common import token_nll
    from harness.models import place

    ref = small_handle(tokenizer)
    ids = torch.randint(5, 4000, (2, 40), generator=torch.Generator().manual_seed(0))
    want = token_nll(ref.model, ids, chunk=16, dtype="float32")
    handle = small_handle(tokenizer)
    with virtual_node:
        place(handle.model, gpu(0), halves())
        got = token_nll(handle.model, ids, chunk=16, dtype="float32")
    assert isinstance(got, OnDevice) and got.device == gpu(1)
    torch.testing.assert_close(unwrap(got), want)
    assert STANDIN == gpu(0)


# ------------------------------------------------------------------------------ the device map: plan == run.py
LLAMA2_7B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}  # its config.json


def test_plan_and_run_place_every_paper_evaluator_and_length_alike(tmp_path, monkeypatch):
    """``make plan`` (A100-80GB, an 8-GPU node) and ``run.py`` on an 8 x 80 GB node (its placement, from the
    checkpoint's config and the GPUs' free memory) give every evaluator of ``experiment=paper_llama2``'s suite the
    same GPUs per replica at every length: one rule (``harness.evals.replica_gpus``). Before, run.py split the
    model for the whole suite by its longest input (NIAH at 128k: 2 GPUs for PPL too) while the plan gave PPL,
    RULER, ... one GPU each. Only NIAH at its longest lengths spans two GPUs."""
    from harness import pipeline, plan
    from harness.evals import method_limit
    from harness.methods import build_method
    from harness.sweeps import compose
    from tests.virtual_node import VirtualNode

    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B))
    cfg = compose(["model=hub", f"model.path={tmp_path}", "model.native_ctx=4096", "model.name=llama2_geometry",
                   "model.dtype=bfloat16", "method=base", "train=none", "eval=paper"])
    VirtualNode(gpus=8, capacity=80 * 2**30).install(monkeypatch)
    method = build_method(cfg.method)
    suite = pipeline.Suite.of(cfg)
    run = pipeline.placement(cfg, suite, method, gpu(0))
    planned = plan.eval_plan(cfg, plan.model_shape(cfg), method_limit(method, 4096), gpu="A100", node_gpus=8)
    assert set(run) == set(planned) == set(suite.nodes)
    for key, per in planned.items():
        want = {int(L): min(p["gpus_needed"] or 8, 8) for L, p in per["lengths"].items()}
        assert run[key] == want, key
    split = {(k, L) for k, at in run.items() for L, g in at.items() if g > 1}
    assert split and {k for k, _ in split} == {"niah"}
    units = pipeline.selected(suite, place=run)
    assert [u.devices for u in units if u.entry != "niah"] == [1] * (len(units) - 1)


def test_run_places_the_model_per_evaluator_and_length(tmp_path, monkeypatch, results_env):
    """On 2 emulated GPUs of 50 MiB, tiny_llama's PPL at C fits one GPU and its passkey at 4C needs two
    (``harness.memory.replica_gpus``): ``load_and_extend`` places the model for the first evaluator (one GPU), and
    ``evaluations`` spreads it over both GPUs for the passkey only. Before, one map for the whole suite (from its
    longest input) split the model for every evaluator."""
    from harness import pipeline
    from harness.models import gpus_of
    from harness.sweeps import compose
    from tests.virtual_node import VirtualNode

    node = VirtualNode(gpus=2, capacity=50 * 2**20).install(monkeypatch)
    cfg = compose(["method=base", "train=none", "eval=quick", "device=auto", "autocast=float32",
                   "eval_world_size=1"])
    suite = pipeline.Suite.build({
        "ppl": {**group_defaults("evaluator", "ppl"), "samples": 1, "lengths": [512], "max_windows": 1},
        "passkey": {**group_defaults("evaluator", "passkey"), "samples": 1, "gen_tokens": 2, "lengths": [2048]}})
    method, _ = pipeline.validate(cfg)
    with node:
        handle = pipeline.load_and_extend(cfg, method, suite=suite)
        assert [(u.entry, u.devices) for u in pipeline.placed_units(handle, suite)] == [("ppl", 1), ("passkey", 2)]
        assert on_gpus(handle.model) == {0}
        placed = []
        for key, out, _, _ in pipeline.evaluations(cfg, handle, method, tmp_path, suite):
            placed.append((key, gpus_of(handle), sorted(on_gpus(handle.model))))
            assert out
    assert placed == [("ppl", 1, [0]), ("passkey", 2, [0, 1])]


def test_a_model_loaded_on_the_node_is_the_model_loaded_on_the_cpu(virtual_node, tmp_path):
    """transformers builds a model on the ``meta`` device before loading its weights and materialises its
    non-persistent buffers (the rotary ``inv_freq``) on the CPU afterwards. The emulated GPUs are ``meta:N``: taken for
    one of them, the real meta device left ``inv_freq`` uninitialised (garbage, a NaN training loss depending on the
    order the tests ran in). Loaded inside the node or outside, every parameter and buffer is the same."""
    from harness.models import load_pretrained
    from tests.test_train import _model_dir

    d = str(_model_dir(tmp_path))
    cpu, _ = load_pretrained(d, "float32", "sdpa")
    with virtual_node:
        node, _ = load_pretrained(d, "float32", "sdpa")
    want = dict(list(cpu.named_parameters()) + list(cpu.named_buffers()))
    got = dict(list(node.named_parameters()) + list(node.named_buffers()))
    assert got.keys() == want.keys() and any(k.endswith("inv_freq") for k in got)
    for k, v in want.items():
        assert torch.equal(unwrap(got[k]).detach(), v.detach()), k
