"""longlora: LongLoRA (Chen et al. 2023; dvlab-research/LongLoRA): shifted sparse attention (S2-Attn) + LoRA while
fine-tuning, merged weights and full attention at inference, Position Interpolation throughout.

What the original does:
- ``fine-tune.py``: PI (``rope_scaling = {"type": "linear", "factor": ceil(L_train / L_orig)}``: 8 for 4k -> 32k;
  tiny 256 -> 2048 is also 8); ``LoraConfig(r=8, lora_alpha=16, lora_dropout=0, bias="none",
  target_modules=[q_proj, k_proj, v_proj, o_proj])``; plus every parameter whose name contains "embed" or "norm"
  is trainable (``--trainable_params embed,norm``: embed_tokens and all RMSNorms; not lm_head). After training the
  LoRA weights are merged into the base model (``merge_lora_weights_and_save_hf_model.py``) and evaluated with full
  attention. Here: peft's ``inject_adapter_in_model`` (in place, so the training loop's model object is unchanged),
  merged and unloaded in ``eval_mode`` so the evaluated model has the base architecture.
- ``llama_attn_replace.py``: S2-Attn with group size G = N * group_size_ratio (1/4), ``N % G == 0`` required. Half
  of the heads attend causally within groups [0,G), [G,2G), ...; the other half (heads H//2: ) within groups
  shifted by G/2. RoPE is applied before the shift, so true positions are kept.
  * ``forward_flashattn`` (the training path of the paper): the shifted half uses varlen boundaries
    [0, G//2, G//2+G, ..., N], so the first and last G/2 tokens are separate segments: no leakage. This is
    ``s2_impl: flash`` (default).
  * ``forward_noflashattn``: ``roll(-G//2)`` (Python: -ceil(G/2)) of q,k,v on the shifted heads, causal attention
    within groups, ``roll(G//2)`` back. The last group wraps around: the first G/2 tokens see the last ones
    (future-token leakage, issues #15/#90) and for odd G the roll back is off by one. ``s2_impl: roll`` reproduces
    it bug for bug (for regression tests / ablations).
  Padding: the flash code's cu_seqlens are wrong with padding (issue #148) and the non-flash code applies the first
  group's mask to every group; here the key-padding mask is applied inside every group (a fix, not a reproduction).
  GQA: keys/values are expanded per group as the original does (``repeat_kv``); odd head counts work (the shifted
  half is heads H//2: as in the non-flash code).

Outside training (``model.training`` false, or decoding with a cache), the S2 function falls back to full causal
attention; ``eval_mode`` also switches the model back to its original attention implementation (sdpa).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from harness.config import ConfigError, check_scale
from harness.methods import METHODS, Method, MethodArgs, Needs
from harness.methods import _blockwise as bw
from harness.methods import flex as fx
from harness.methods.rope import set_rope_parameters

ATTN_NAME = "harness_longlora_s2"


def _expand(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    b, h, L, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, L, d).reshape(b, h * n_rep, L, d)


def _grouped_causal(q, k, v, valid, group: int, scale: float) -> torch.Tensor:
    """Causal attention inside consecutive groups of ``group`` tokens. q,k,v [B, h, N, D] (N % group == 0),
    valid [B, N] bool (key padding). Every query may always see itself (keeps fully padded rows finite)."""
    b, h, n, d = q.shape
    ng = n // group

    def split(x):
        return x.view(b, h, ng, group, d).transpose(1, 2).reshape(b * ng, h, group, d)

    causal = torch.ones(group, group, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(group, dtype=torch.bool, device=q.device)
    mask = (causal[None] & valid.view(b * ng, 1, group)) | eye[None]  # [B*ng, G, G]
    out = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=mask[:, None], scale=scale)
    return out.view(b, ng, h, group, d).transpose(1, 2).reshape(b, h, n, d)


def s2_attention_heads(q, k, v, valid, group: int, shift: bool, impl: str, scale: float) -> torch.Tensor:
    """S2-Attn on expanded heads: [B, H, N, D] -> [B, H, N, D]."""
    b, h, n, d = q.shape
    h0 = h // 2 if shift else h
    outs = []
    if h0 > 0:
        outs.append(_grouped_causal(q[:, :h0], k[:, :h0], v[:, :h0], valid, group, scale))
    if h0 < h:
        qs, ks, vs = q[:, h0:], k[:, h0:], v[:, h0:]
        if impl == "roll":  # forward_noflashattn: roll(-G//2) ... roll(G//2), wrap-around leakage included
            r = -group // 2
            o = _grouped_causal(qs.roll(r, 2), ks.roll(r, 2), vs.roll(r, 2), valid.roll(r, 1), group, scale)
            outs.append(o.roll(group // 2, 2))
        else:  # forward_flashattn: segments [0, G//2), [G//2, G//2 + G), ..., [N - G + G//2, N); no wrap-around
            front, back = group - group // 2, group // 2

            def pad(x):
                return torch.cat([x.new_zeros(b, h - h0, front, d), x, x.new_zeros(b, h - h0, back, d)], dim=2)

            vpad = torch.cat([valid.new_zeros(b, front), valid, valid.new_zeros(b, back)], dim=1)
            o = _grouped_causal(pad(qs), pad(ks), pad(vs), vpad, group, scale)
            outs.append(o[:, :, front:front + n])
    return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]


def s2_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    ratio, shift, impl = module.harness_longlora
    b, h, n, d = query.shape
    kv = key.shape[2]
    scale = bw.default_scaling(module, scaling)
    valid = bw.key_valid(attention_mask, b, kv, query.device)
    k = _expand(key, h // key.shape[1])
    v = _expand(value, h // key.shape[1])
    if not module.training or kv != n:  # inference / cached decoding: full causal attention
        causal = torch.ones(n, kv, dtype=torch.bool, device=query.device).tril(kv - n)
        mask = causal[None] & valid[:, None]
        mask = mask | (~mask.any(-1, keepdim=True))  # fully padded rows: keep finite
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask[:, None], scale=scale)
        return out.transpose(1, 2).contiguous(), None
    group = int(n * ratio)
    if group < 1 or n % group:
        raise ValueError(f"longlora: sequence length {n} is not divisible by the S2-Attn group size {group}")
    if fx.use_fused(module, query):  # attention.backend: flex (one call, head-dependent block mask)
        return fx.s2(query, key, value, attention_mask, scale, group, shift, impl)
    out = s2_attention_heads(query, k, v, valid, group, shift, impl, scale)
    return out.transpose(1, 2).contiguous(), None


bw.register_attention(ATTN_NAME, s2_attention)


def inject_lora(model, r: int, alpha: int, dropout: float, targets: list[str]):
    from peft import LoraConfig, inject_adapter_in_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", target_modules=list(targets))
    return inject_adapter_in_model(cfg, model)


def merge_lora(model) -> int:
    """Merge every LoRA layer into its base Linear and put the plain Linear back. Returns how many were merged."""
    from peft.tuners.lora import LoraLayer

    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoraLayer):
                child.merge()
                setattr(parent, name, child.get_base_layer())
                n += 1
    return n


@METHODS.register("longlora")
class LongLoRA(Method):
    needs = Needs(rope=True, attention_interface=True)
    sequence_parallel = ("trains with S2-Attn, which shifts half of the heads by half a group: a rank of a sequence-"
                         "parallel group attends with its own subset of the heads, so which heads shift would "
                         "depend on the rank")

    @dataclass
    class Args(MethodArgs):
        name: str = "longlora"
        scale: float = 8.0  # PI factor, ceil(L_train / C): 4k -> 32k = 8; tiny 256 -> 2048 = 8
        group_size_ratio: float = 0.25  # S2-Attn group = N / 4
        shift: bool = True  # shift half of the heads by G/2 (False: plain block-diagonal attention)
        s2_impl: str = "flash"  # flash (no wrap-around) | roll (forward_noflashattn, with its leakage)
        lora_r: int = 8
        lora_alpha: int = 16
        lora_dropout: float = 0.0
        lora_targets: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
        trainable: list = field(default_factory=lambda: ["embed", "norm"])  # substrings of extra trainable params

    def __init__(self, args):
        super().__init__(args)
        self._attn_before = None

    def attention_keys(self, seq_len: int) -> float:
        return seq_len * float(self.args.group_size_ratio)  # S2-Attn: each token attends within its group

    def check(self, native_ctx: int, train=None) -> None:
        a = self.args
        check_scale(a.name, a.scale)
        if not 0 < a.group_size_ratio <= 1:
            raise ConfigError(f"method=longlora: group_size_ratio must be in (0, 1], got {a.group_size_ratio}")
        if a.s2_impl not in ("flash", "roll"):
            raise ConfigError(f"method=longlora: s2_impl must be flash or roll, got {a.s2_impl!r}")
        if train is not None and train.enabled and train.seq_len > 0:
            n = train.seq_len
            group = int(n * a.group_size_ratio)
            if group < 1 or n % group:
                raise ConfigError(f"method=longlora: train.seq_len {n} is not a multiple of the S2-Attn group size "
                                  f"{group} = int(seq_len x group_size_ratio {a.group_size_ratio:g}) "
                                  f"(valid: group_size_ratio = 1/k with k dividing seq_len)")

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        if a.scale > 1:
            set_rope_parameters(handle.model, rope_type="linear", factor=float(a.scale))
        for m in bw.attention_modules(handle.model):
            m.harness_longlora = (a.group_size_ratio, a.shift, a.s2_impl)

    def train_mode(self, handle) -> None:
        a = self.args
        model = handle.model
        inject_lora(model, a.lora_r, a.lora_alpha, a.lora_dropout, a.lora_targets)
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n or any(t in n for t in a.trainable))
        self._attn_before = model.config._attn_implementation
        model.set_attn_implementation(ATTN_NAME)

    def eval_mode(self, handle) -> None:
        model = handle.model
        merge_lora(model)
        for p in model.parameters():
            p.requires_grad_(False)
        if self._attn_before is not None:
            model.set_attn_implementation(self._attn_before)

    @staticmethod
    def trainable_names(model) -> list[str]:
        return [n for n, p in model.named_parameters() if p.requires_grad]

