"""Shared fixtures. Fast tests use small random models built in memory (seeded); tests that need the shipped
``tiny_llama`` use the ``tiny`` fixture; SmolLM2 tests are marked ``slow``."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_file_module(path, name: str | None = None):
    """The module in the file at ``path`` (a script or benchmark, which are not packages), loaded by its path."""
    import importlib.util

    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, os.cpu_count() or 1))


def random_llama(vocab=256, hidden=64, layers=2, heads=4, kv_heads=None, ctx=64, theta=10000.0, head_dim=None,
                 seed=0, **rope):
    """A small random LlamaForCausalLM (float32, eval mode, sdpa) for unit tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads or heads, max_position_embeddings=ctx,
                      rope_parameters={"rope_type": "default", "rope_theta": theta, **rope},
                      head_dim=head_dim or hidden // heads, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def small_llama():
    return random_llama()


@pytest.fixture(scope="session")
def tiny():
    """The shipped tiny_llama (ModelHandle), loaded once per session."""
    from harness.models import load_model

    return load_model("tiny_llama")


@pytest.fixture
def results_env(tmp_path, monkeypatch):
    """Point rows, run directories, checkpoints and caches at a temporary directory."""
    for k, sub in (("HARNESS_RESULTS_DIR", "results"), ("HARNESS_OUTPUT_DIR", "outputs"),
                   ("HARNESS_CKPT_DIR", "ckpt"), ("HARNESS_CACHE_DIR", "cache")):
        monkeypatch.setenv(k, str(tmp_path / sub))
    return tmp_path
