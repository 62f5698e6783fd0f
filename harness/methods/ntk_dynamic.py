"""ntk_dynamic: dynamic NTK as the controlled study fine-tunes and evaluates it (NTK-32K / NTK-64K rows).

Original (LCEG ``continuous_finetuning/fine-tune.py:157-169``): training uses transformers' ``"dynamic"`` rope type
with ``factor s = ceil(L_train / C / 2)`` ("half the scale"): s = 4 for 32k, 8 for 64k (C = 4k). For a length
``l`` the base is ``b * t ** (d/(d-2))``, ``t = s * l / C - (s - 1)`` (Fu et al. 2024); every training sequence has
``l = L_train`` so NTK-32K trains at t = 4 * 8 - 3 = 29 (Table 7). Evaluation (LCEG
``models/llama_ntk_32k/modeling_llama.py``) clamps ``l`` from below at L_train: t = 29 for every input up to 32k and
dynamic beyond (t = 61 at 64k), which is Table 8's NTK-32K row (29, 29, 29, 29, 61).

NTK-64K, paper vs code: Tables 7 and 8 give t = 57 at every length. 57 = 8 * 32k/4k - 7, i.e. s = 8 at l = 32k,
while the LCEG 64k eval patch clamps at 65536 (t = 121 at 64k with s = 8). We follow the paper: ``ntk_64k`` fixes
l at 8C (``min_len = max_len = 8C``, t = 57 everywhere); ``min_len=16C max_len=0`` reproduces the code (t = 121).

Registered under three names so each is its own results column: ``ntk_dynamic`` (generic), ``ntk_32k``, ``ntk_64k``
(the paper's rows; their YAMLs carry the values). Tiny analogue (C = 256): ``ntk_32k``: s = 4, min_len = 2048 (t = 29 at C..8C, 61 at 16C); ``ntk_64k``: s = 8,
min_len = max_len = 2048 (t = 57). Frequencies are a stateless function of the length (rope type
``ntk_by_length`` + ``rope.LengthDependentRope``, see ntk_frozen), and ``kv_cache`` picks the KV-cache semantics
(``refresh``: cached keys re-rotated when the base changes; ``stale``: transformers' #25104 behaviour).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.config import ConfigError
from harness.methods import METHODS, Method, MethodArgs
from harness.methods.rope import make_length_dependent, ntk_by_length_parameters, set_rope_parameters


@METHODS.register("ntk_64k")
@METHODS.register("ntk_32k")
@METHODS.register("ntk_dynamic")
class NTKDynamic(Method):
    @dataclass
    class Args(MethodArgs):
        name: str = "ntk_dynamic"
        factor: float = 4.0  # s = ceil(L_train / C / 2)
        min_len: int = 0  # clamp the length from below (LCEG eval: L_train); 0 = transformers' dynamic rule
        max_len: int = 0  # cap the length (paper NTK-64K: constant 57); 0 = no cap
        kv_cache: str = "refresh"  # refresh | stale

    def apply(self, handle) -> None:
        a = self.args
        if a.factor < 1 or a.min_len < 0 or a.max_len < 0 or (a.max_len and a.max_len < a.min_len):
            raise ConfigError(f"method={a.name}: need factor >= 1 and 0 <= min_len <= max_len (or max_len 0)")
        set_rope_parameters(handle.model, rope_type="ntk_by_length", factor=float(a.factor),
                            original_max_position_embeddings=int(handle.native_ctx),
                            min_len=int(a.min_len), max_len=int(a.max_len))
        make_length_dependent(handle.model, ntk_by_length_parameters, a.kv_cache)
