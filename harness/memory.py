"""Memory of one evaluation input, as a formula of the model's shape (ground floor: imports nothing from harness).

``eval_memory(shape, L)`` is what a forward pass of one sequence of ``L`` tokens needs on the accelerator, in bytes:

- ``weights`` = P x itemsize (P: every parameter, embedding and untied LM head included);
- ``kv_cache`` (only when the evaluator decodes, ``generates``) = 2 (K, V) x layers x kv_heads x head_dim x L x
  itemsize: the cache of every layer at the longest sequence, prompt plus generated tokens (every evaluator here
  builds prompt + generated <= L, so ``gen_tokens`` adds no cache beyond ``L``);
- ``prefill``: the transient activations of the prefill besides the cache, the larger of
    - one decoder layer at its peak, ``L x itemsize x max(attention, mlp)`` with
      attention = 3d (the decoder's input embeddings, the layer's input held by the decoder loop, the normed input)
      + 4 h q (queries, their rotated copy, the attention output and its contiguous copy before o_proj)
      + 3 k q (keys, their rotated copy, values; in a decoding run the cache's copy of one layer when it grows)
      + 2 q (the rotary cos/sin tables),
      mlp = 4d (input embeddings, layer input, the new residual, the normed input) + 3f for a gated MLP (the
      activation, up and their product) or + 2f for a two-matrix MLP (Phi-2), + 2 q (cos/sin);
      MEASURED: these two counts equal the peak of live tensor bytes of transformers' Llama decoder (SDPA, fp32,
      inference mode, CPU) to the byte, for attention- and MLP-bound shapes (tests/test_memory.py);
    - the LM head: the final hidden states L d itemsize plus what ``harness.evals.common.token_nll`` holds for one
      chunk of ``LM_HEAD_CHUNK`` positions: logits in the compute dtype, their fp32 copy (none when the compute
      dtype is fp32) and the fp32 log-softmax, ``chunk x V x (itemsize + 4 + 4)`` in bf16 (a decoding run applies the
      head to one position: chunk = 1);
- ``total`` = the three summed; ``decode_read`` = gen_tokens x (weights + kv_cache at L): the bytes decoding reads
  from memory (each new token reads every weight and the whole cache; what the plan's time model uses).

Notation: d hidden, f MLP width, h query heads, k key/value heads, q head dim, V vocab, L tokens.

ASSUMPTIONS (stated, not measured): batch 1 (the PPL evaluator batches short windows up to ``eval_batch_tokens``;
the transients then scale with the tokens of the batch); a fused attention kernel (SDPA's flash / memory-efficient
path or flash-attn): no L x L score matrix and no materialised causal mask (transformers passes ``is_causal`` when the
batch has no padding); methods that run their own blocked attention (Self-Extend, LM-Infinite, Landmark, S2-Attn) hold
one block's scores more, not modelled; no allocator fragmentation and no CUDA context (the caller keeps headroom).
"""
from __future__ import annotations

import math

LM_HEAD_CHUNK = 1024  # positions per LM-head chunk in harness.evals.common.token_nll (its ``chunk`` default)
GIB = 2**30
ASSUMED_USABLE_MEMORY = 0.95  # ASSUMPTION: share of a GPU's free memory left to tensors (context, allocator)


def _get(c, name, default=None):
    return c.get(name, default) if isinstance(c, dict) else getattr(c, name, default)


def shape_of(hf_config) -> dict:
    """The shape of a decoder-only transformer from its HF config (a ``PretrainedConfig`` or the ``config.json``
    dict): layers, hidden, heads, kv_heads, head_dim, vocab, mlp, params (plus ``mlp_mats`` and ``tied``)."""
    c = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    heads = int(_get(c, "num_attention_heads"))
    hidden = int(_get(c, "hidden_size"))
    kv = int(_get(c, "num_key_value_heads") or heads)
    hd = int(_get(c, "head_dim") or hidden // heads)
    mlp = int(_get(c, "intermediate_size") or 4 * hidden)
    layers, vocab = int(_get(c, "num_hidden_layers")), int(_get(c, "vocab_size"))
    gated = _get(c, "model_type") not in ("phi", "gpt2", "gpt_neox", "gptj", "opt", "falcon")  # two-matrix MLPs
    mats = 3 if gated else 2
    tied = bool(_get(c, "tie_word_embeddings", False))
    layer = 2 * hidden * heads * hd + 2 * hidden * kv * hd + mats * hidden * mlp + 2 * hidden  # + the two norms
    params = layers * layer + vocab * hidden * (1 if tied else 2) + hidden
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, head_dim=hd, vocab=vocab, mlp=mlp,
                params=params, mlp_mats=mats, tied=tied)


def kv_cache_bytes(shape: dict, length: int, itemsize: int = 2) -> int:
    return 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * int(length) * itemsize


def prefill_bytes(shape: dict, length: int, itemsize: int = 2, generates: bool = False) -> int:
    """The transient activations of one prefill of ``length`` tokens (the module docstring's formula)."""
    d, f, q = shape["hidden"], shape["mlp"], shape["head_dim"]
    attention = 3 * d + 4 * shape["heads"] * q + 3 * shape["kv_heads"] * q + 2 * q
    mlp = 4 * d + shape.get("mlp_mats", 3) * f + 2 * q
    layer = int(length) * itemsize * max(attention, mlp)
    positions = 1 if generates else min(int(length), LM_HEAD_CHUNK)
    head = int(length) * d * itemsize + positions * shape["vocab"] * (itemsize + 4 + (4 if itemsize < 4 else 0))
    return max(layer, head)


def eval_memory(shape: dict, length: int, *, itemsize: int = 2, generates: bool = False, gen_tokens: int = 0) -> dict:
    """Bytes one evaluation input of ``length`` tokens needs: ``weights``, ``kv_cache`` (0 unless ``generates``),
    ``prefill`` (transient activations), ``total``, and ``decode_read`` (bytes read by ``gen_tokens`` decoding
    steps)."""
    if int(length) < 0 or int(gen_tokens) < 0:
        raise ValueError(f"eval_memory: length {length} and gen_tokens {gen_tokens} must be >= 0")
    weights = int(shape["params"]) * itemsize
    kv = kv_cache_bytes(shape, length, itemsize) if generates else 0
    pre = prefill_bytes(shape, length, itemsize, generates)
    return {"weights": weights, "kv_cache": kv, "prefill": pre, "total": weights + kv + pre,
            "decode_read": int(gen_tokens) * (weights + kv_cache_bytes(shape, length, itemsize)) if generates else 0}


def gpus_needed(total_bytes: int | float, gpu_bytes: int | float, transient: int | float = 0) -> int:
    """GPUs whose memory together holds ``total_bytes`` when the layers are split across them (``device_map``): at
    least 1. ``transient`` (bytes of ``total_bytes`` that exist on one GPU at a time: the prefill activations of the
    layer computing) is not split: ``ceil((total - transient) / (gpu_bytes - transient))``. Raises ``ValueError`` when
    the transient alone does not fit one GPU (no number of GPUs holds the input)."""
    if gpu_bytes <= 0:
        raise ValueError(f"gpus_needed: gpu_bytes must be > 0, got {gpu_bytes}")
    if total_bytes <= gpu_bytes:
        return 1
    if transient >= gpu_bytes:
        raise ValueError(f"gpus_needed: {gib(transient):.1f} GiB of one layer's activations exceed one GPU's "
                         f"{gib(gpu_bytes):.1f} GiB")
    return max(1, math.ceil((total_bytes - transient) / (gpu_bytes - transient)))


def gib(n: int | float) -> float:
    return n / GIB


def replica_gpus(shape: dict, length: int, itemsize: int, generates: bool, gpu_bytes: int | float) -> int | None:
    """The GPUs one model replica spans for an evaluation input of ``length`` tokens on GPUs of ``gpu_bytes`` (free)
    memory each: 1 when the weights and the input fit ``ASSUMED_USABLE_MEMORY`` of one, else the fewest that hold
    them with the layers split (:func:`gpus_needed`); None when no number of GPUs holds the input. The one rule of the
    plan (``harness.plan``, per GPU model) and of a run (``harness.pipeline``, per free memory), through
    ``harness.evals.replica_gpus``."""
    m = eval_memory(shape, length, itemsize=itemsize, generates=generates)
    try:
        return gpus_needed(m["total"], ASSUMED_USABLE_MEMORY * gpu_bytes, transient=m["prefill"])
    except ValueError:
        return None
