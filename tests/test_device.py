"""The model on its device, end to end, without a GPU: the ``device`` setting reaches the loader (a spy on
``harness.models.place``), and every method, the evaluation primitives and the fine-tuning loop keep every tensor
they create on the model's device.

The stand-in accelerator is the virtual node's (``tests/virtual_node.py``): real CPU data on an emulated device that
refuses what a GPU refuses.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.conf_utils import CONF_DIR, group_defaults
from tests.virtual_node import CPU, STANDIN, Accelerator, OnDevice, to_accelerator


# ------------------------------------------------------------------------------------------- the stand-in itself
def test_stand_in_refuses_cpu_tensors_and_keeps_values():
    """The checker can fail: a CPU tensor mixed into an op on the device raises, as on CUDA; values are real."""
    from tests.conftest import random_llama

    ref = random_llama(kv_heads=2)
    ids = torch.randint(3, 250, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    model = to_accelerator(random_llama(kv_heads=2))
    with Accelerator(), torch.no_grad():
        x = torch.arange(4, device=STANDIN)
        assert isinstance(x * 2, OnDevice) and int(x.sum()) == 6 and x.tolist() == [0, 1, 2, 3]
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.arange(4)
        assert isinstance(x + torch.tensor(1), OnDevice)  # a CPU scalar is fine, as on CUDA
        got = model(input_ids=ids.to(STANDIN)).logits
        assert isinstance(got, OnDevice) and torch.allclose(got._data, want, atol=1e-5)
        with pytest.raises(RuntimeError, match="same device"):
            model(input_ids=ids)  # CPU token ids into a model on the device


# ------------------------------------------------------------------------------------------------- the setting
def test_resolve_device_values():
    from harness.device import resolve_device

    assert resolve_device("cpu") == CPU
    assert resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else CPU)
    for bad in ("gpu", "cuda:x", "tpu:0", ""):
        with pytest.raises(ValueError, match=r"^device: .*valid: auto, cpu, cuda, cuda:N"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU is visible"):
            resolve_device("cuda:0")


def test_resolve_device_auto_and_cuda_take_local_rank(monkeypatch):
    from harness.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 3)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="cuda:4 but 4 CUDA GPU"):
        resolve_device("cuda:4")


def test_bad_device_is_one_config_error_before_loading(monkeypatch):
    """pipeline.validate refuses a bad ``device`` with one line naming the key and the valid values, and the
    model is never loaded."""
    from harness import models, pipeline
    from harness.config import ConfigError
    from harness.sweeps import compose

    models.MODELS.names()  # every model module imported first: they bind load_pretrained when imported
    monkeypatch.setattr(models, "load_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    cfg = compose(["train=none", "eval=quick", "device=gpu0"])
    with pytest.raises(ConfigError) as e:
        pipeline.validate(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("device: ") and "auto, cpu, cuda, cuda:N" in msg
    assert compose(["train=none", "eval=quick"]).device == "auto"


# ------------------------------------------------------------------------------------- the config reaches place
@pytest.fixture
def one_fake_gpu(monkeypatch):
    """``cuda:0`` exists (resolve_device accepts it), and the spy on ``harness.models.place`` records every call
    and puts the model on the stand-in accelerator instead of a GPU this machine does not have."""
    from harness import models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    calls = []

    def spy(model, device, device_map=None):
        calls.append((device, device_map))
        return to_accelerator(model)

    monkeypatch.setattr(models, "place", spy)
    return calls


def _on_accelerator(model) -> bool:
    return all(isinstance(t, OnDevice) for t in list(model.parameters()) + list(model.buffers()))


def test_load_and_extend_puts_the_model_on_the_configured_device(one_fake_gpu, results_env):
    """``device=cuda:0`` reaches the loader: the model is placed there before the method is applied and the
    memory check runs (both then on the device: nothing of load_and_extend leaves a CPU tensor behind), and the
    handle records it. On the CPU (``device=auto``), nothing is moved."""
    from harness import pipeline
    from harness.sweeps import compose

    cfg = compose(["method=yarn", "train=none", "eval=quick", "device=cuda:0"])
    method, train = pipeline.validate(cfg)
    with Accelerator():
        handle = pipeline.load_and_extend(cfg, method, train)
        ids = torch.randint(3, 4000, (1, 24), device=STANDIN)
        with torch.no_grad():
            assert isinstance(handle.model(input_ids=ids).logits, OnDevice)
    assert one_fake_gpu == [(torch.device("cuda", 0), None)]
    assert _on_accelerator(handle.model)
    assert handle.info["device"] == "cuda:0" and handle.info["device_map"] is None


def test_auto_on_cpu_places_on_cpu(results_env):
    from harness import pipeline
    from harness.sweeps import compose

    if torch.cuda.is_available():
        pytest.skip("auto is a GPU here")
    cfg = compose(["method=pi", "train=none", "eval=quick"])
    method, train = pipeline.validate(cfg)
    handle = pipeline.load_and_extend(cfg, method, train)
    assert handle.info["device"] == "cpu" and next(handle.model.parameters()).device == CPU


def test_shard_load_puts_the_model_on_the_configured_device(one_fake_gpu, results_env, tmp_path):
    from harness import pipeline, shards
    from harness.sweeps import compose

    cfg = compose(["method=pi", "train=none", "eval=quick", "device=cuda:0", "+shard=all"])
    ecfg = shards.evaluation_config(cfg, tmp_path)  # the config a sharded job's stages load (api.run's)
    s = pipeline.setup(ecfg)
    with Accelerator():
        handle = pipeline.load_and_extend(ecfg, s.method, suite=s.suite, names=["passkey@512"])
    assert one_fake_gpu == [(torch.device("cuda", 0), None)]
    assert _on_accelerator(handle.model) and handle.info["device"] == "cuda:0"


def test_device_map_only_when_one_gpu_is_too_small(monkeypatch):
    """A model-parallel split (g GPUs per replica) is chosen from the memory estimate, only for a GPU device with
    more GPUs visible, and g is the fewest GPUs that hold the input."""
    from harness.models import choose_device_map

    node = group_defaults("model", "tiny_llama")
    gpu = torch.device("cuda", 0)
    assert choose_device_map(node, CPU, 4096, True) is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert choose_device_map(node, gpu, 4096, True) is None  # one GPU: nothing to spread over
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("harness.models.available_memory", lambda d: 80 * 2**30)
    assert choose_device_map(node, gpu, 4096, True) is None  # 5M parameters fit
    monkeypatch.setattr("harness.models.available_memory", lambda d: 2**20)
    assert choose_device_map(node, gpu, 4096, True) == 2  # capped at the visible GPUs
    from transformers import AutoConfig

    from harness.memory import eval_memory, shape_of
    from harness.models import MODELS

    cls, args = MODELS.args(node, "model", name="tiny_llama")
    need = eval_memory(shape_of(AutoConfig.from_pretrained(cls.source(args)[0])), 4096, itemsize=4, generates=True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    free = need["prefill"] + int((need["total"] - need["prefill"]) * 0.6)  # the split part needs two such GPUs
    monkeypatch.setattr("harness.models.available_memory", lambda d: free)
    assert choose_device_map(node, gpu, 4096, True) == 2  # the fewest GPUs that hold it, not all eight
    assert choose_device_map(node, torch.device("cuda", 7), 4096, True) is None  # from the last GPU: none to add


# ----------------------------------------------------------------------------------- methods and primitives
C = 512  # the tiny tokenizer's model: the method files (LongRoPE factors) are for tiny_llama's window
METHODS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    from harness.models.tiny_llama import ASSET_DIR

    return AutoTokenizer.from_pretrained(str(ASSET_DIR))


def small_tiny(tokenizer, layers: int = 1):
    """A random model of ``layers`` layers (one by default) with tiny_llama's tokenizer, window C = 512, RoPE and head
    size (64, so that the shipped LongRoPE factors fit): the methods see tiny_llama's shapes at a fraction of its
    compute."""
    from transformers import LlamaForCausalLM

    from harness.models import ModelHandle, rotary_dim
    from harness.models.tiny_llama import tiny_config

    torch.manual_seed(0)
    cfg = tiny_config(len(tokenizer), 500.0, tokenizer.bos_token_id, tokenizer.eos_token_id,
                      tokenizer.pad_token_id, native_ctx=C, layers=layers, hidden=128, heads=2, intermediate=256)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    return ModelHandle(model, tokenizer, "tiny_llama", C, {"rotary_dim": rotary_dim(cfg)})


def test_every_registered_method_is_covered():
    """METHODS (the YAMLs) builds every registered method class, so the test below runs them all."""
    from harness.methods import METHODS as REGISTRY
    from harness.methods import build_method

    REGISTRY.autoload()
    covered = {type(build_method(group_defaults("method", n))) for n in METHODS}
    assert set(REGISTRY._items.values()) <= covered


@pytest.mark.parametrize("name", METHODS)
def test_method_runs_on_the_device(name, tiny_tokenizer, virtual_node):
    """apply, a forward beyond the native window, the evaluation primitives (token NLL, greedy generation with
    the KV cache and prefix reuse) and the training forward + backward, all with the model on a GPU of the virtual
    node and the attention backend a CUDA node picks (``auto``: flex, compiled, where the method has a fused path;
    every fused call runs a compiled graph)."""
    from harness.evals.common import PrefixCache, token_nll
    from harness.methods import build_method
    from harness.methods.flex import set_backend

    handle = small_tiny(tiny_tokenizer)
    to_accelerator(handle.model)
    n = C + 24
    prompt = torch.randint(5, 4000, (1, n), generator=torch.Generator().manual_seed(1))
    with virtual_node:
        set_backend(handle.model, "auto")
        method = build_method(group_defaults("method", name))
        method.apply(handle)
        ids = prompt.to(STANDIN)
        with torch.no_grad():
            assert isinstance(handle.model(input_ids=ids).logits, OnDevice)
        nll = token_nll(handle.model, ids, chunk=256, dtype="float32")
        assert isinstance(nll, OnDevice) and nll.shape == (1, n - 1) and bool(torch.isfinite(nll).all())
        gen = PrefixCache(handle.model, "float32")
        first = gen.generate(prompt[0].tolist(), 2)
        again = gen.generate(prompt[0].tolist()[:-3] + [7, 8, 9], 2)  # reuses the cached prefix
        assert len(first) == len(again) == 2
        method.train_mode(handle)
        handle.model.train()
        batch = method.train_batch(torch.randint(5, 4000, (1, C), device=STANDIN))  # Landmark: a multiple of C
        loss = handle.model(**batch).loss
        loss.backward()
        assert np.isfinite(float(loss))
        grads = [p.grad for p in handle.model.parameters() if p.grad is not None]
        assert grads and all(isinstance(g, OnDevice) for g in grads)
        method.eval_mode(handle)
    assert virtual_node.kernels.eager_calls == 0


def test_window_nlls_on_the_device(tiny_tokenizer):
    from harness.evals.common import window_nlls

    handle = small_tiny(tiny_tokenizer)
    windows = [list(range(5, 45)), list(range(50, 90)), list(range(7, 27))]
    want = window_nlls(handle.model, windows, chunk=16, dtype="float32", batch_tokens=80)
    to_accelerator(handle.model)
    with Accelerator():
        got = window_nlls(handle.model, windows, chunk=16, dtype="float32", batch_tokens=80)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_finetune_feeds_batches_on_the_model_device(tiny_tokenizer, tmp_path):
    """The single-process loop moves each micro-batch to the model's device (packed data are CPU arrays)."""
    from harness.methods import build_method
    from harness.train import TrainArgs
    from harness.train.loop import finetune

    handle = small_tiny(tiny_tokenizer)
    to_accelerator(handle.model)
    a = TrainArgs(name="t", enabled=True, seq_len=64, micro_batch=1, global_batch=1, tokens=128, lr=1e-3,
                  warmup_steps=1, ema=False, convergence_check=False, autocast="float32", save_every=0)
    chunks = np.random.default_rng(0).integers(5, 4000, size=(4, 64)).astype(np.int64)
    method = build_method(group_defaults("method", "pi"))
    with Accelerator():
        method.apply(handle)
        info = finetune(handle, method, chunks, a, tmp_path / "ckpt", "fp")
    assert info["steps"] == 2 and all(np.isfinite(info["losses"]))
    assert _on_accelerator(handle.model)


def test_a_split_model_puts_half_of_its_layers_and_kv_cache_on_each_gpu():
    """A replica split over g GPUs (``harness.models.split_map``): the layers, and so each layer's KV cache, are
    spread evenly, starting at the rank's first GPU; a first-fit map would leave every layer on the first GPU."""
    import warnings

    from harness.models import split_map
    from tests.conftest import random_llama

    model = random_llama(layers=4, hidden=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = split_map(model, {2: 80 * 2**30, 3: 80 * 2**30})  # rank 1 of a 2-GPU-per-replica evaluation
    layers = [m[f"model.layers.{i}"] for i in range(4)]
    assert layers == [2, 2, 3, 3] and set(m.values()) == {2, 3}


def test_auto_world_size_counts_replicas_not_gpus(monkeypatch):
    from harness.eval_distributed import resolve_world_size
    from harness.models import gpus_of

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert resolve_world_size("auto") == 8
    assert resolve_world_size("auto", gpus_per_replica=2) == 4  # NIAH at 128k on LLaMA2-7B: 4 replicas of 2 GPUs
    assert resolve_world_size(3, gpus_per_replica=2) == 3
    one = type("H", (), {"info": {"device_map": None}})()
    two = type("H", (), {"info": {"device_map": {"model.layers.0": "0", "model.layers.1": "1", "lm_head": "1"}}})()
    assert (gpus_of(one), gpus_of(two)) == (1, 2)
