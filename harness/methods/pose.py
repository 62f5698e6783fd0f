"""pose: PoSE, positional skip-wise training (Zhu et al. 2023/2024; dwzhu-pku/PoSE), fine-tuned.

What the original does (``src/train_pose.py``): the model is loaded with ``config.rope_scaling = {type, factor}``
(``--rope_scaling_type linear | dynamic | vanilla_ntk | yarn``, ``--rope_scaling_factor s``; YaRN with
``original_max_position_embeddings`` = the native window) and ``max_position_embeddings`` = s x C, and is trained
*and* evaluated with that RoPE. Training sequences keep the native length C (``model_max_position_embeddings``,
2048 for LLaMA-7B) but get position ids spanning the target s x C. ``train_preprocess_function_pose``, per document
``ids`` (tokenized, truncated at 5C) with ``len_input = len(ids)``, ``len_chunk = min(len_input, C)``:

    rt1 = randint(1, (len_chunk + 1) // 2)          # chunk 1 = ids[0:rt1], positions 0 .. rt1 - 1
    rt2 = randint(len_chunk, len_input)              # chunk 2 = ids[lt2:rt2], lt2 = rt2 - (len_chunk - rt1)
    rt = randint(0, s*C - len_chunk)                 # skip: chunk 2 positions rt1 + rt .. len_chunk - 1 + rt
    (Python ``random.randint``, both ends inclusive; ``lt = 0``: the 2023-10 revision for uniform coverage)

two chunks (N = 2, the only case the code implements), labels = the chunked ids (the junction token is predicted
too), an all-ones attention mask (one document per sample). Inference: plain position ids, the scaled RoPE.

This implementation:
- ``apply`` sets the composed RoPE for the target length, used in training and inference alike: ``rope: pi``
  (transformers ``linear``, = method ``pi`` with scale = target), ``yarn`` (= method ``yarn`` with scale = target:
  transformers' YaRN, beta 32 / 1, original window C), ``ntk`` (the code's ``vanilla_ntk``: static base
  b * s^(d/(d-2))), ``yarn_revised`` (the code's YaRN: PoSE's ``LlamaYaRNScaledRotaryEmbedding.revised_yarn``
  divides each frequency by ``(1 - mask) s + mask`` instead of blending inverse frequencies, jquesnelle/yarn#24;
  same ramp and the same 0.1 ln s + 1 temperature). The paper names linear / NTK / YaRN; its code uses the revised
  YaRN, here a flag value. The code's ``dynamic`` is not offered: with ``max_position_embeddings`` set to the
  target it leaves RoPE unscaled at every length up to the target.
- ``train_batch`` applies the recipe above to each packed training sequence of ``train.seq_len`` tokens, which
  plays the original's tokenized document: with ``train.seq_len`` = C (the study's points) ``rt2 = C`` and the content
  is contiguous (the original's case of a document of exactly C tokens); ``train.seq_len: ${ctx:5}`` reproduces the
  original's content skip over a 5C document too (reading 5x the tokens per step). The random draws are the
  original's calls, in order, on a ``random.Random`` seeded per sequence from (``seed``, the sequence's tokens), so a
  resumed or multi-rank run draws the same skips (the original uses the global ``random`` inside a 32-process
  ``datasets.map``, not reproducible). The batch carries ``position_ids`` and an all-ones ``attention_mask``, which
  keeps transformers (and ``harness_causal``) from reading the position jump as a document boundary; ``train_mode``
  additionally switches ``harness_causal`` to sdpa while training, since its mask builder drops an all-ones mask.
  ``train.doc_masking`` is refused (the original has one document per sample and no document masking).
- Units: ``target`` and ``train_len`` in units of C (the original's ``rope_scaling_factor`` and its training
  length, the native window: train_len 1).
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

import torch

from harness.config import ConfigError, check_scale, window_tokens
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods import flex as fx
from harness.methods.rope import default_inv_freq, register_rope_type, rope_base, rope_dims, set_rope_parameters

ROPES = ("pi", "yarn", "ntk", "yarn_revised")


# ---------------------------------------------------------------------------------------------------- positions
def pose_sample(len_input: int, len_chunk: int, scaled: int, rng: random.Random) -> tuple[int, int, int, int]:
    """One draw of ``train_preprocess_function_pose`` (the original's three ``randint`` calls, in order):
    (rt1, lt2, rt2, rt): chunk 1 = ids[0:rt1] at positions 0..rt1-1, chunk 2 = ids[lt2:rt2] at positions shifted by
    rt."""
    rt1 = rng.randint(1, (len_chunk + 1) // 2)
    rt2 = rng.randint(len_chunk, len_input)
    lt2 = rt2 - (len_chunk - rt1)
    rt = rng.randint(0, scaled - len_chunk)
    return rt1, lt2, rt2, rt


def pose_example(ids: torch.Tensor, train_len: int, scaled: int, rng: random.Random):
    """(chunked ids [len_chunk], position ids [len_chunk]) for one sequence ``ids`` [len_input]."""
    len_input = int(ids.shape[0])
    len_chunk = min(len_input, train_len)
    rt1, lt2, rt2, rt = pose_sample(len_input, len_chunk, scaled, rng)
    chunked = torch.cat([ids[:rt1], ids[lt2:rt2]])
    pos = torch.arange(len_chunk, dtype=torch.long, device=ids.device)
    pos[rt1:] += rt
    return chunked, pos


def sequence_rng(ids: torch.Tensor, seed: int) -> random.Random:
    """A ``random.Random`` seeded from (seed, the sequence's tokens): the same draws on resume and on any rank."""
    h = hashlib.blake2b(ids.detach().cpu().to(torch.int64).numpy().tobytes(), digest_size=8,
                        key=str(int(seed)).encode())
    return random.Random(int.from_bytes(h.digest(), "little"))


# ---------------------------------------------------------------------------------------------------- revised YaRN
def revised_yarn_parameters(config, device=None, seq_len=None, layer_type=None):
    """Rope type ``pose_yarn_revised``: PoSE's ``revised_yarn`` (my_modeling_llama.py): correction range
    floor/ceil of the YaRN correction dims for (beta_fast, beta_slow), clamped to [0, d - 1]; mask = 1 - ramp;
    inv_freq / ((1 - mask) * s + mask); attention factor 0.1 ln s + 1."""
    rp = config.rope_parameters
    base, dim = rope_dims(config)
    s, c = float(rp["factor"]), int(rp["original_max_position_embeddings"])
    fast, slow = float(rp.get("beta_fast", 32.0)), float(rp.get("beta_slow", 1.0))

    def corr(rot):
        return (dim * math.log(c / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(corr(fast)), 0), min(math.ceil(corr(slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    mask = (1 - ramp).to(device)
    inv = default_inv_freq(base, dim, device)
    return inv / ((1 - mask) * s + mask), (0.1 * math.log(s) + 1.0) if s > 1 else 1.0


register_rope_type("pose_yarn_revised", revised_yarn_parameters,
                   required=("factor", "original_max_position_embeddings"), optional=("beta_fast", "beta_slow"))


# ---------------------------------------------------------------------------------------------------- method
@METHODS.register("pose")
class PoSE(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "pose"
        target: float = 8.0  # x C: target context s x C (original: --rope_scaling_factor s; study: 8 = 32k on LLaMA2)
        rope: str = "yarn"  # pi | yarn | ntk | yarn_revised (original: linear | yarn | vanilla_ntk; code's YaRN)
        train_len: float = 1.0  # x C: training window (original: model_max_position_embeddings = the native C)
        seed: int = 0  # skip sampling (per sequence, with the sequence's tokens)

    def __init__(self, args):
        super().__init__(args)
        self.native_ctx = None
        self._attn_restore = None

    def lengths(self, native_ctx: int) -> tuple[int, int]:
        """(training window, target length) in tokens; checks the settings."""
        a = self.args
        check_scale("pose", a.target, "target")
        if a.rope not in ROPES:
            raise ConfigError(f"method=pose: rope must be one of {', '.join(ROPES)}, got {a.rope!r}")
        tl = window_tokens(a.train_len, native_ctx, "method=pose: train_len", zero_ok=False)
        scaled = int(native_ctx * a.target)
        if tl > scaled:
            raise ConfigError(f"method=pose: train_len = {a.train_len:g} C is above target = {a.target:g} C (the "
                              f"skipped positions must fit in the target; valid: train_len <= target)")
        return tl, scaled

    def check(self, native_ctx: int, train=None) -> None:
        self.lengths(native_ctx)
        if train is not None and getattr(train, "enabled", False) and getattr(train, "doc_masking", False):
            raise ConfigError("method=pose: train.doc_masking must be false (PoSE's position ids jump inside a "
                              "sequence; the original trains one document per sample)")

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        self.native_ctx = int(handle.native_ctx)
        s, c, model = float(a.target), int(handle.native_ctx), handle.model
        if a.rope == "pi":
            set_rope_parameters(model, rope_type="linear", factor=s)
        elif a.rope == "yarn":
            set_rope_parameters(model, rope_type="yarn", factor=s, original_max_position_embeddings=c,
                                beta_fast=32.0, beta_slow=1.0, truncate=True)
        elif a.rope == "yarn_revised":
            set_rope_parameters(model, rope_type="pose_yarn_revised", factor=s, original_max_position_embeddings=c,
                                beta_fast=32.0, beta_slow=1.0)
        else:  # ntk: vanilla NTK, base * s ** (d / (d - 2))
            _, dim = rope_dims(model.config)
            set_rope_parameters(model, rope_type="default", rope_theta=rope_base(model.config) * s ** (dim / (dim - 2)))

    def train_mode(self, handle) -> None:
        model = handle.model
        if getattr(model.config, "_attn_implementation", None) == fx.CAUSAL_NAME:
            self._attn_restore = fx.CAUSAL_NAME
            model.set_attn_implementation("sdpa")

    def eval_mode(self, handle) -> None:
        if self._attn_restore is not None:
            handle.model.set_attn_implementation(self._attn_restore)
            self._attn_restore = None

    def train_batch(self, input_ids):
        if self.native_ctx is None:
            raise ValueError("method=pose: apply() must run before train_batch (it needs the native window)")
        tl, scaled = self.lengths(self.native_ctx)
        rows = [pose_example(row, tl, scaled, sequence_rng(row, self.args.seed)) for row in input_ids]
        ids = torch.stack([r[0] for r in rows])
        pos = torch.stack([r[1] for r in rows])
        return {"input_ids": ids, "labels": ids, "position_ids": pos, "attention_mask": torch.ones_like(ids)}
