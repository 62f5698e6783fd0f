"""ntk_frozen: NTK-aware base scaling applied to a frozen model with the controlled study's length schedule.

Original: the controlled study's "NTK-Frozen" row (LCEG ``eval_perplexity/eval_ntk.py``) evaluates LLaMA2 without
training under transformers' ``"dynamic"`` rope type with factor ``s = 2``, i.e. for an input of length ``L`` the
base becomes ``b * t ** (d / (d - 2))`` with ``t = s * L / C - (s - 1)`` (Fu et al. 2024, bloc97/emozilla): Table 8
lists t = 1, 3, 7, 15, 31 at 4k, 8k, 16k, 32k, 64k (C = 4k); the same multipliers hold at C, 2C, 4C, 8C, 16C here.

Implementation: rope type ``ntk_by_length`` (``harness.methods.rope.ntk_by_length_parameters``, transformers'
dynamic-NTK formula) made *stateless* by a pre-forward hook on the rotary module
(``rope.LengthDependentRope``): the frequencies are a function of the current length ``max(position_ids) + 1``
only. transformers' own ``"dynamic"`` is stateful (after a long input the larger base sticks for any later input
of length >= C), which would make results depend on evaluation order; Table 8 implies per-length values.
KV cache (``kv_cache``): ``refresh`` (default) re-rotates cached keys whenever the base changes (every cached key
carries the current base, as with CLEX's pre-RoPE key cache; see ``rope.CacheRefresh``); ``stale`` reproduces
transformers' stale-key behaviour (issue #25104).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.config import ConfigError
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.rope import (
    KV_CACHE_MODES,
    make_length_dependent,
    ntk_by_length_parameters,
    ntk_multiplier,
    set_rope_parameters,
)


@METHODS.register("ntk_frozen")
class NTKFrozen(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "ntk_frozen"
        factor: float = 2.0  # s: t = s*L/C - (s-1) (paper / LCEG eval_ntk.py: 2)
        kv_cache: str = "refresh"  # refresh | stale (transformers' behaviour)

    def scale_factor(self, length: int, native_ctx: int) -> float:
        """The NTK multiplier t for an input of ``length`` tokens (Table 8: 1, 3, 7, 15, 31 at C..16C)."""
        return ntk_multiplier(self.args.factor, length, native_ctx)

    def check(self, native_ctx: int, train=None) -> None:
        if not math.isfinite(self.args.factor) or self.args.factor < 1:
            raise ConfigError(f"method=ntk_frozen: factor (s) must be >= 1, got {self.args.factor}")
        if self.args.kv_cache not in KV_CACHE_MODES:
            raise ConfigError(f"method=ntk_frozen: kv_cache must be one of {', '.join(KV_CACHE_MODES)}, "
                              f"got {self.args.kv_cache!r}")

    def apply(self, handle) -> None:
        self.check(handle.native_ctx)
        set_rope_parameters(handle.model, rope_type="ntk_by_length", factor=float(self.args.factor),
                            original_max_position_embeddings=int(handle.native_ctx))
        make_length_dependent(handle.model, ntk_by_length_parameters, self.args.kv_cache)
