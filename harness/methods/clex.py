"""clex: CLEX, continuous length extrapolation (Chen et al. 2024; DAMO-NLP-SG/CLEX ``CLEX/clex_layer.py``).

The log-frequencies follow a learned ODE in the scale t: ``x(1) = log theta`` and
``dx/dt = W_down act(W_up (x + log theta_NTK(t))) + d log theta_NTK(t)/dt`` with ``theta_NTK(t)`` the NTK-aware
frequencies at alpha = 2t - 1 (``ODELinear``); ``W_up`` (d/2 x p*d) kaiming-uniform, ``W_down`` (p*d x d/2) zero,
so **at initialisation CLEX is NTK scaling with alpha = 2t - 1**. Integration: fixed-step RK4 with step ``time_dt``
(torchdiffeq ``method="rk4"`` is the 3/8-rule variant, reproduced here; no torchdiffeq dependency).

Training (``do_train``): one integer ``t ~ U{1..max_factor}`` per forward, continuous positions
``[0, sorted(sample of seq_len-2 from [0, seq_len*t-2)) + 1) / k, seq_len*t // k - 1]`` with
``k = max(seq_len // C, 1)``, frequencies theta(t) with gradients into the ODE net (t = 1: plain RoPE).
Inference: ``t = ceil(seq_len / C)`` clamped to ``max_factor``, theta(t) for t = 1..max_factor solved once on the
integer grid and cached (recomputed when the weights change), positions as given.

Where it is patched: ``model.model.rotary_emb`` is replaced by :class:`CLEXRotaryEmbedding` (same call signature
and outputs as transformers' rotary module), whose ODE parameters live in the model, so the optimizer trains them
and ``save_pretrained`` stores them (``model.rotary_emb.ode_*``); ``apply`` reloads them from a fine-tuned
checkpoint. The config's rope type ``clex`` (registered) is plain RoPE, so such a checkpoint still loads anywhere.
KV cache: the original caches pre-RoPE keys so all keys use the current t; here ``kv_cache: refresh`` re-rotates the
cached keys when t changes (the same keys as a pre-RoPE cache), ``stale`` keeps transformers' behaviour.
Defaults: paper (controlled study) max factor 32 and SiLU; the CLEX repo defaults to 16 and tanh, param_factor 1,
time_dt 0.01. The factor is relative to C, so it is unchanged for tiny_llama. The original's time embedding always
uses base 10000 (``get_time_embedding`` default); here the model's base (identical at initialisation, where the
time embedding does not depend on the base). ``log_scale`` (query scaling) of the original is not implemented.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from harness.config import ConfigError
from harness.methods import METHODS, ROPE, Method, MethodArgs
from harness.methods.rope import CacheRefresh, default_inv_freq, register_rope_type, rope_dims, set_rope_parameters
from harness.sequence_group import agreed, global_tokens, slice_offset

PREFIX = "model.rotary_emb."


def clex_rope_parameters(config, device=None, seq_len=None, layer_type=None):
    """What a checkpoint config with rope type ``clex`` means outside this module: plain RoPE (t = 1)."""
    base, dim = rope_dims(config)
    return default_inv_freq(base, dim, device), 1.0


register_rope_type("clex", clex_rope_parameters, optional=("max_factor", "param_factor", "act", "time_dt",
                                                           "original_max_position_embeddings"))


class CLEXRotaryEmbedding(nn.Module):
    def __init__(self, config, native_ctx: int, max_factor: int, param_factor: int, act: str, time_dt: float,
                 seed: int = 0):
        super().__init__()
        self.config = config
        base, dim = rope_dims(config)
        self.base, self.dim, self.native_ctx = base, dim, int(native_ctx)
        self.max_t, self.time_dt = int(max_factor), float(time_dt)
        self.attention_scaling = 1.0
        self.register_buffer("inv_freq", default_inv_freq(base, dim), persistent=False)
        self.ode_up_proj = nn.Parameter(torch.empty(dim // 2, param_factor * dim))
        self.ode_down_proj = nn.Parameter(torch.zeros(param_factor * dim, dim // 2))
        # a private generator: the init must not depend on (or disturb) the global RNG
        nn.init.kaiming_uniform_(self.ode_up_proj, a=math.sqrt(5), generator=torch.Generator().manual_seed(seed))
        self.act = {"silu": nn.SiLU(), "tanh": nn.Tanh()}[act]
        self._grid = None  # (weights version, [theta(1), theta(2), ...])
        self.exact_ode = False
        idx = torch.arange(0, dim, 2, dtype=torch.float32)
        self.register_buffer("_log_theta0", -(idx / dim) * math.log(base), persistent=False)
        self.register_buffer("_c", -idx / (dim - 2), persistent=False)

    # -- the ODE ---------------------------------------------------------------------------------------------
    def ntk(self, t: float):
        """(log theta_NTK(t), d/dt log theta_NTK(t)) with alpha = max(1, 2t - 1) (``ODELinear.get_time_embedding``)."""
        t = float(t)
        alpha = max(1.0, 2 * t - 1)
        log_theta = self._log_theta0 + self._c * math.log(alpha)
        dlog = self._c * (0.0 if t < 1 else 2.0 / alpha)
        return log_theta, dlog

    def rhs(self, t: float, x: torch.Tensor) -> torch.Tensor:
        log_theta, dlog = self.ntk(t)
        return self.act((x + log_theta) @ self.ode_up_proj) @ self.ode_down_proj + dlog

    def integrate(self, x: torch.Tensor, t0: int, t1: int) -> torch.Tensor:
        """RK4 (torchdiffeq's 3/8 rule) for x = log theta from integer t0 to t1 with step time_dt."""
        steps = max(int(round(1 / self.time_dt)), 1)
        h = 1.0 / steps
        for j in range((t1 - t0) * steps):
            t = t0 + j * h
            k1 = self.rhs(t, x)
            k2 = self.rhs(t + h / 3, x + h * k1 / 3)
            k3 = self.rhs(t + 2 * h / 3, x + h * (k2 - k1 / 3))
            k4 = self.rhs(t + h, x + h * (k1 - k2 + k3))
            x = x + h * (k1 + 3 * (k2 + k3) + k4) / 8
        return x

    def solve(self, t_end: int) -> torch.Tensor:
        """theta(t_end) from theta(1) = theta (with gradients: training)."""
        x = torch.log(self.inv_freq.float().to(self.ode_up_proj.device))
        return torch.exp(self.integrate(x, 1, int(t_end)))

    def theta(self, t: int) -> torch.Tensor:
        """theta(t) at integer t (inference), from a grid t = 1..max_t solved once per weights version and extended
        lazily to the largest t asked for. While ``W_down`` is all zero (untrained) the ODE's solution is exactly
        theta_NTK(t), used directly unless ``exact_ode`` is set (tests integrate it)."""
        if t <= 1:
            return self.inv_freq.float()
        version = (self.ode_up_proj._version, self.ode_down_proj._version, self.ode_up_proj.data_ptr(),
                   self.ode_down_proj.data_ptr())
        if self._grid is None or self._grid[0] != version:
            self._grid = (version, [self.inv_freq.float().to(self.ode_up_proj.device)])
        grid = self._grid[1]
        with torch.no_grad():
            if not self.exact_ode and not bool(self.ode_down_proj.any()):
                return torch.exp(self.ntk(t)[0])
            while len(grid) < t:
                grid.append(torch.exp(self.integrate(torch.log(grid[-1]), len(grid), len(grid) + 1)))
        return grid[t - 1]

    # -- transformers' rotary interface --------------------------------------------------------------------
    def scale_for(self, seq_len: int) -> int:
        return min(max(math.ceil(int(seq_len) / self.native_ctx), 1), self.max_t)

    def rope_state(self, seq_len: int, device=None):
        return self.theta(self.scale_for(seq_len)).detach().to(device), 1.0

    def train_positions(self, seq_len: int, t: int, device) -> torch.Tensor:
        k = max(seq_len // self.native_ctx, 1)
        sampled = torch.randperm(seq_len * t - 2)[: seq_len - 2].sort().values.float()
        return torch.cat([torch.zeros(1), (sampled + 1) / k, torch.tensor([float(seq_len * t // k - 1)])]).to(device)

    def forward(self, x, position_ids):
        if self.training:
            # under sequence parallelism this rank holds one slice: t and the positions are drawn for the whole
            # sequence, the group's first rank's draw is everyone's, and each rank takes its slice's part
            n = position_ids.shape[-1]
            t = int(agreed(torch.randint(1, self.max_t + 1, (1,)).to(x.device)))
            whole = agreed(self.train_positions(global_tokens(n), t, x.device))
            pos = whole[slice_offset(n): slice_offset(n) + n][None]
            theta = self.inv_freq.float() if t == 1 else self.solve(t)
        else:
            pos = position_ids.float()
            theta = self.theta(self.scale_for(int(position_ids.max()) + 1))
        freqs = pos[..., None] * theta.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def load_clex_weights(module: CLEXRotaryEmbedding, path: str) -> bool:
    """Load ``model.rotary_emb.ode_*`` from a fine-tuned checkpoint directory, if it has them."""
    f = Path(path or "", "model.safetensors")
    if not path or not f.exists():
        return False
    from safetensors import safe_open

    with safe_open(str(f), framework="pt") as sf:
        keys = [k for k in sf.keys() if k.startswith(PREFIX)]
        if not keys:
            return False
        state = {k[len(PREFIX):]: sf.get_tensor(k) for k in keys}
    module.load_state_dict(state, strict=False)
    return True


@METHODS.register("clex")
class CLEX(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "clex"
        max_factor: int = 32  # paper (controlled study); CLEX repo default 16
        param_factor: int = 1  # ODE hidden width = param_factor * d
        act: str = "silu"  # paper: SiLU; CLEX repo default tanh
        time_dt: float = 0.01
        kv_cache: str = "refresh"  # refresh | stale

    def check(self, native_ctx: int, train=None) -> None:
        a = self.args
        if a.act not in ("silu", "tanh") or a.max_factor < 1 or a.param_factor < 1 or not 0 < a.time_dt <= 1:
            raise ConfigError(f"method=clex: need act silu|tanh, max_factor >= 1 (x C), param_factor >= 1, "
                              f"0 < time_dt <= 1; got {a.act!r}, {a.max_factor}, {a.param_factor}, {a.time_dt}")
        if a.kv_cache not in ("refresh", "stale"):
            raise ConfigError(f"method=clex: kv_cache must be refresh|stale, got {a.kv_cache!r}")

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        model = handle.model
        set_rope_parameters(model, rope_type="clex", max_factor=a.max_factor, param_factor=a.param_factor,
                            act=a.act, time_dt=a.time_dt, original_max_position_embeddings=int(handle.native_ctx))
        decoder = model.get_decoder()
        old = decoder.rotary_emb
        module = CLEXRotaryEmbedding(model.config, handle.native_ctx, a.max_factor, a.param_factor, a.act, a.time_dt)
        module.to(old.inv_freq.device)
        module.train(model.training)  # a fresh nn.Module is in training mode; the model may be in eval mode
        decoder.rotary_emb = module
        self.loaded_weights = load_clex_weights(module, handle.info.get("path", ""))
        if a.kv_cache == "refresh":
            CacheRefresh(decoder)
