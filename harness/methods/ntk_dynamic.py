"""ntk_dynamic: dynamic NTK as the controlled study fine-tunes and evaluates it (NTK-32K / NTK-64K rows).

Original (LCEG ``continuous_finetuning/fine-tune.py:157-169``): training uses transformers' ``"dynamic"`` rope type
with ``factor s = ceil(L_train / C / 2)`` ("half the scale"): s = 4 for 32k, 8 for 64k (C = 4k). For a length
``l`` the base is ``b * t ** (d/(d-2))``, ``t = s * l / C - (s - 1)`` (Fu et al. 2024); every training sequence has
``l = L_train`` so NTK-32K trains at t = 4 * 8 - 3 = 29 (Table 7). Evaluation (LCEG
``models/llama_ntk_32k/modeling_llama.py``) clamps ``l`` from below at L_train: t = 29 for every input up to 32k and
dynamic beyond (t = 61 at 64k), which is Table 8's NTK-32K row (29, 29, 29, 29, 61).

NTK-64K, paper vs code: Tables 7 and 8 give t = 57 at every length. 57 = 8 * 32k/4k - 7, i.e. s = 8 at l = 32k,
while the LCEG 64k eval patch clamps at 65536 (t = 121 at 64k with s = 8). We follow the paper: ``ntk_64k`` fixes
l at 8C (``min_len = max_len = 8``, t = 57 everywhere); ``min_len=16 max_len=0`` reproduces the code (t = 121).

Lengths are in units of the model's native window C (``min_len: 8`` = 8C: 32768 tokens on LLaMA2-7B, 2048 on
tiny_llama), resolved from the model in ``apply`` (and checked from the config's ``model.native_ctx`` before
anything loads), so ``method=ntk_32k`` gives Table 8's t = 29, 29, 29, 29, 61 at C..16C on every model.
Refused with one line: s < 1, min_len below C (the clamp would do nothing), max_len below C (t would drop below 1
and the rotary frequencies become complex; ``rope.ntk_by_length_parameters`` refuses that too) or below min_len.

Registered under three names so each is its own results column: ``ntk_dynamic`` (generic), ``ntk_32k``, ``ntk_64k``
(the paper's rows; their YAMLs carry the values, and ``build_method`` layers the YAML under any call from code).
Frequencies are a stateless function of the length (rope type ``ntk_by_length`` + ``rope.LengthDependentRope``, see
ntk_frozen), and ``kv_cache`` picks the KV-cache semantics (``refresh``: cached keys re-rotated when the base
changes; ``stale``: transformers' #25104 behaviour).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.config import MAX_WINDOWS, ConfigError, window_tokens
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.rope import (
    KV_CACHE_MODES,
    make_length_dependent,
    ntk_by_length_parameters,
    ntk_multiplier,
    set_rope_parameters,
)


@METHODS.register("ntk_64k")
@METHODS.register("ntk_32k")
@METHODS.register("ntk_dynamic")
class NTKDynamic(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "ntk_dynamic"
        factor: float = 4.0  # s = ceil(L_train / C / 2)
        min_len: float = 8.0  # x C: clamp the length from below (LCEG eval: L_train = 8C); 0 = transformers' rule
        max_len: float = 0.0  # x C: cap the length (paper NTK-64K: 8C, constant t = 57); 0 = no cap
        kv_cache: str = "refresh"  # refresh | stale

    def lengths(self, native_ctx: int) -> tuple[int, int]:
        """(min_len, max_len) in tokens for a model of native window C = native_ctx (0 = off); checks the values."""
        a = self.args
        if not math.isfinite(a.factor) or a.factor < 1:
            raise ConfigError(f"method={a.name}: factor (s) must be >= 1, got {a.factor}")
        lo = window_tokens(a.min_len, native_ctx, f"method={a.name}: min_len", min_windows=1)
        hi = window_tokens(a.max_len, native_ctx, f"method={a.name}: max_len", min_windows=1)
        if hi and hi < lo:
            raise ConfigError(f"method={a.name}: max_len = {a.max_len:g} C is below min_len = {a.min_len:g} C "
                              f"(valid: 0 = no cap, or min_len..{MAX_WINDOWS})")
        return lo, hi

    def scale_factor(self, length: int, native_ctx: int) -> float:
        """The NTK multiplier t this method uses for an input of ``length`` tokens (Table 8)."""
        lo, hi = self.lengths(native_ctx)
        return ntk_multiplier(self.args.factor, length, native_ctx, lo, hi)

    def check(self, native_ctx: int, train=None) -> None:
        self.lengths(native_ctx)
        if self.args.kv_cache not in KV_CACHE_MODES:
            raise ConfigError(f"method={self.args.name}: kv_cache must be one of {', '.join(KV_CACHE_MODES)}, "
                              f"got {self.args.kv_cache!r}")

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        lo, hi = self.lengths(handle.native_ctx)
        set_rope_parameters(handle.model, rope_type="ntk_by_length", factor=float(a.factor),
                            original_max_position_embeddings=int(handle.native_ctx), min_len=lo, max_len=hi)
        make_length_dependent(handle.model, ntk_by_length_parameters, a.kv_cache)
