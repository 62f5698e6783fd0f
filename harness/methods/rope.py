"""Shared RoPE plumbing for the exact-attention methods: rewrite ``config.rope_parameters`` and rebuild the rotary
module(s) through transformers' own ``XRotaryEmbedding(config)``, so inv_freq, attention scaling and the dynamic
update decorator are transformers' code, not ours. Not a method itself (no registration)."""
from __future__ import annotations

import torch

from harness.config import ConfigError
from harness.methods import STATIC_ROPE
from harness.sequence_group import global_length


def rope_base(config) -> float:
    rp = getattr(config, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def set_rope_parameters(model, **params) -> dict:
    """Replace the model's RoPE parameters (keeping rope_theta / partial_rotary_factor unless given) and rebuild
    every rotary-embedding module from the new config. Returns the new parameters."""
    config = model.config
    old = dict(getattr(config, "rope_parameters", None) or {})
    new = {"rope_theta": old.get("rope_theta", rope_base(config))}
    if "partial_rotary_factor" in old:
        new["partial_rotary_factor"] = old["partial_rotary_factor"]
    new.update(params)
    config.rope_parameters = new  # (v5: rope_scaling is an alias of rope_parameters; never set it to None)
    rebuild_rotary(model)
    return new


# Rope types whose frequencies are static with attention factor 1: what the blocked-attention methods (Self-Extend,
# LM-Infinite, DCA, StreamingLLM, STRING, Landmark) can keep when a checkpoint's config already carries one of them,
# since they read the model's inverse frequencies once (``_blockwise.attach_rope``) and no attention factor.
STATIC_ROPE_TYPES = STATIC_ROPE  # declared beside ``Needs`` (harness.methods), checked there before loading


def scaled_rope(config) -> dict | None:
    """The RoPE scaling a loaded config carries (Llama-3.1's ``llama3``, a released PI checkpoint's ``linear``,
    Qwen's ``yarn``, ...): its ``rope_parameters`` as a plain dict, or None for plain RoPE (rope type ``default``)."""
    rp = dict(getattr(config, "rope_parameters", None) or {})
    kind = rp.pop("type", None)  # the transformers 4.x spelling of rope_type, kept beside it when loaded
    rp["rope_type"] = rp.get("rope_type") or kind or "default"
    if rp["rope_type"] == "default":
        return None
    return json_safe(rp)


def json_safe(d: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


def require_static_rope(model, where: str) -> None:
    """Refuse (one ConfigError line) a model whose rotary frequencies change with the length or carry an attention
    factor: a blocked-attention method reads the inverse frequencies once and would silently drop either."""

    rp = dict(getattr(model.config, "rope_parameters", None) or {})
    kind = rp.get("rope_type", "default")
    att = [float(getattr(m, "attention_scaling", 1.0)) for m in rotary_modules(model)]
    if kind not in STATIC_ROPE_TYPES or any(a != 1.0 for a in att):
        raise ConfigError(f"{where}: the model's config carries rope type {kind!r}, which this method cannot keep (it "
                          f"reads the rotary frequencies once, without length dependence or attention factor); valid: "
                          f"a model whose rope type is one of {', '.join(STATIC_ROPE_TYPES)}")


def rebuild_rotary(model) -> None:
    for _, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding") and hasattr(child, "inv_freq"):
                device = child.inv_freq.device
                new = type(child)(config=model.config).to(device)
                check_inv_freq(new.inv_freq, f"rope type {model.config.rope_parameters.get('rope_type')!r}")
                setattr(parent, child_name, new)


def check_inv_freq(inv, where: str) -> None:
    """A rotary table must be real, finite and positive. Never let a complex or NaN table through: copying a
    complex tensor into the float ``inv_freq`` buffer silently keeps its real part (a warning, then meaningless
    logits), which is how an NTK clamp below the native window once produced t = -3 on LLaMA2."""

    if not isinstance(inv, torch.Tensor):
        inv = torch.as_tensor(inv)
    if inv.is_complex() or not inv.is_floating_point():
        raise ConfigError(f"{where}: the rotary frequencies are {inv.dtype}, not real (valid: finite, > 0)")
    if not bool(torch.isfinite(inv).all()) or not bool((inv > 0).all()):
        bad = inv[~(torch.isfinite(inv) & (inv > 0))]
        raise ConfigError(f"{where}: {bad.numel()} of {inv.numel()} rotary frequencies are not finite and > 0 "
                          f"(e.g. {float(bad.flatten()[0]):g}; valid: finite, > 0)")


def rotary_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding") and hasattr(m, "inv_freq")]


@torch.no_grad()
def inv_freq_of(model) -> torch.Tensor:
    return rotary_modules(model)[0].inv_freq.detach().clone()


# ------------------------------------------------------------------------------------------------------------------
# Additions for the RoPE family (issue 3): registering rope types, length-dependent frequencies, KV-cache refresh.
# ------------------------------------------------------------------------------------------------------------------

# the rope types this harness adds to transformers' registry: plain transformers (without ``harness`` imported) does not
# know them, so a model using one is not saved as a standard config (``harness.methods.persist``)
HARNESS_ROPE_TYPES: set[str] = set()


def register_rope_type(name: str, fn, required=("rope_type",), optional=()) -> None:
    """Register ``fn(config, device=None, seq_len=None, layer_type=None) -> (inv_freq, attention_factor)`` as
    transformers rope type ``name`` (``ROPE_INIT_FUNCTIONS``), plus a key validator on the config mixin so
    ``validate_rope`` checks our keys like it checks its own. Idempotent."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin

    ROPE_INIT_FUNCTIONS[name] = fn
    HARNESS_ROPE_TYPES.add(name)
    req, opt = set(required) | {"rope_type"}, set(optional) | {"rope_theta", "partial_rotary_factor"}

    def _validate(self, rope_parameters, ignore_keys=None):
        self._check_received_keys(name, set(rope_parameters), set(req), set(opt), ignore_keys=ignore_keys)

    setattr(RotaryEmbeddingConfigMixin, f"_validate_{name}_rope_parameters", _validate)


def rope_dims(config) -> tuple[float, int]:
    """(base, rotary dim d) of a config, partial rotary included."""
    rp = config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return float(rp["rope_theta"]), int(head_dim * rp.get("partial_rotary_factor", 1.0))


def default_inv_freq(base: float, dim: int, device=None) -> torch.Tensor:
    """theta_i = base^(-2i/d), built exactly as transformers builds it (int64 arange -> float)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))


STATELESS_LONGROPE = "longrope_by_length"  # a longrope rotary module whose switch only LengthDependentRope makes


def seq_len_of(position_ids) -> int:
    """The sequence length a length-dependent RoPE reads, ``max(position_ids) + 1``: of the whole sequence under
    sequence parallelism (``harness.sequence_group.global_length``), where a rank holds only a slice of it."""
    return global_length(position_ids)


class LengthDependentRope:
    """Frequencies as a pure function of the current sequence length ``max(position_ids) + 1`` ("stateless").

    transformers' ``dynamic_rope_update`` is stateful for ``*dynamic*`` types (the base only grows, and resets only
    below ``max_position_embeddings``), so results would depend on the order in which lengths are evaluated. This
    pre-forward hook on the rotary module instead recomputes ``inv_freq``/``attention_scaling`` from the registered
    init function with ``seq_len`` for every call (memoised on the last length). Registered rope types used with it
    must not contain "dynamic" in their name (so the decorator stays inert)."""

    def __init__(self, module, fn):
        self.module, self.fn, self.last = module, fn, None
        self.handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def state(self, seq_len: int, device=None):
        inv, att = self.fn(self.module.config, device, seq_len=int(seq_len))
        check_inv_freq(inv, f"rope type {self.module.config.rope_parameters.get('rope_type')!r} at length {seq_len}")
        return inv, float(att)

    def _hook(self, module, args, kwargs):
        position_ids = args[1] if len(args) > 1 else kwargs.get("position_ids")
        if position_ids is None:
            return
        n = seq_len_of(position_ids)
        if n == self.last:
            return
        inv, att = self.state(n, module.inv_freq.device)
        if any(module.inv_freq is getattr(module, a, None) for a in ("original_inv_freq", "long_inv_freq")):
            # transformers 5.17's longrope update registers its stored short / long frequencies as the buffer
            # itself: writing into it would overwrite them (5.23 copies into a buffer of its own)
            module.inv_freq = module.inv_freq.clone()
        module.inv_freq.copy_(inv.to(module.inv_freq.dtype))
        module.attention_scaling = att
        self.last = n


def install_length_dependent(model, fn) -> list:
    """Install :class:`LengthDependentRope` on every rotary module; sets ``module.rope_state(seq_len, device)``.

    A ``longrope`` module's own switch (transformers' ``dynamic_rope_update``, inside its forward) reads
    ``max(position_ids) + 1`` of the positions it is given: under sequence parallelism a rank's slice, so rank 0 of
    2 at 2C would pick the short factors. The module's ``rope_type`` is renamed (``STATELESS_LONGROPE``, the same
    init function) so that switch stays inert and this hook, which asks the group for the length, decides alone
    (the same choice on one rank: ``seq_len > original_max_position_embeddings``)."""
    hooks = []
    for m in rotary_modules(model):
        if getattr(m, "rope_type", None) == "longrope":
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            ROPE_INIT_FUNCTIONS.setdefault(STATELESS_LONGROPE, ROPE_INIT_FUNCTIONS["longrope"])
            m.rope_type = STATELESS_LONGROPE
        h = LengthDependentRope(m, fn)
        m.rope_state = h.state
        hooks.append(h)
    return hooks


@torch.no_grad()
def rerotate_keys(keys: torch.Tensor, old_inv, old_att: float, new_inv, new_att: float, start: int = 0) -> None:
    """In place: keys rotated (rotate_half layout, first ``2*len(inv)`` dims) at positions start..start+N-1 with
    (old_inv, old_att) become keys rotated with (new_inv, new_att). Exact because RoPE rotations compose:
    R(p*new) = R(p*(new-old)) R(p*old), pair by pair."""
    d = 2 * old_inv.shape[-1]
    n = keys.shape[-2]
    pos = torch.arange(start, start + n, device=keys.device, dtype=torch.float32)
    delta = pos[:, None] * (new_inv.float().to(keys.device) - old_inv.float().to(keys.device))[None]
    emb = torch.cat((delta, delta), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    k = keys[..., :d].float()
    k1, k2 = k[..., : d // 2], k[..., d // 2:]
    rot = torch.cat((-k2, k1), dim=-1)
    out = (k * cos + rot * sin) * (new_att / old_att)
    keys[..., :d] = out.to(keys.dtype)


class CacheRefresh:
    """KV-cache consistency for length-dependent RoPE (dynamic NTK, CLEX, LongRoPE short/long switch).

    transformers caches keys *after* RoPE, so when the frequencies change with the length during decoding, the
    cached keys keep stale rotations (transformers issue #25104). This pair of hooks on the decoder (``model.model``)
    records on the cache object the (inv_freq, attention_scaling) its keys were rotated with; when a later call
    needs different frequencies, every cached key is re-rotated in place (:func:`rerotate_keys`) before the layers
    run. Result: every cached key carries the current frequencies, which is exactly what CLEX's original obtains by
    caching pre-RoPE keys. For a one-layer model this equals a full recompute of the prefix at the new length
    (tested); in deeper layers the cached keys/values of earlier tokens were computed from hidden states produced
    under the older frequencies, which only a re-prefill would change (Phi-3 drops its cache for that).
    Assumes cached keys sit at positions 0..N-1 (one sequence per row, no left padding), which is how the harness
    evaluators decode. Cost: O(layers x N x d) only on calls whose frequencies differ from the cache's."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.keep_first = 0  # keys at positions < keep_first are never re-rotated (LongRoPE's n_hat start tokens)
        self.pending = None
        self.rotary  # noqa: B018 - fail now if there is no length-dependent rotary module
        self.handles = [decoder.register_forward_pre_hook(self._pre, with_kwargs=True),
                        decoder.register_forward_hook(self._post, with_kwargs=True)]

    @property
    def rotary(self):
        rot = getattr(self.decoder, "rotary_emb", None)
        if rot is None or not hasattr(rot, "rope_state"):
            rots = [m for m in rotary_modules(self.decoder) if hasattr(m, "rope_state")]
            if len(rots) != 1:
                raise ValueError(f"CacheRefresh needs one length-dependent rotary module, found {len(rots)}")
            rot = rots[0]
        return rot

    def remove(self):
        for h in self.handles:
            h.remove()

    def _call_len(self, args, kwargs) -> int | None:
        pos = kwargs.get("position_ids")
        cache = kwargs.get("past_key_values")
        if pos is not None:
            return seq_len_of(pos)
        x = kwargs.get("input_ids")
        if x is None:
            x = args[0] if args else kwargs.get("inputs_embeds")
        if x is None:
            return None
        past = cache.get_seq_length() if cache is not None else 0
        return past + x.shape[1]

    def _pre(self, module, args, kwargs):
        if module.training:
            return
        n = self._call_len(args, kwargs)
        if n is None:
            return
        rotary = self.rotary
        inv, att = rotary.rope_state(n, rotary.inv_freq.device)
        self.pending = (inv.detach().clone(), att)
        cache = kwargs.get("past_key_values")
        old = getattr(cache, "_harness_rope", None) if cache is not None else None
        if old is None or cache.get_seq_length() == 0:
            return
        if torch.equal(old[0], inv) and old[1] == att:
            return
        for layer in cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                k = self.keep_first
                if k:
                    rerotate_keys(layer.keys[..., k:, :], old[0], old[1], inv, att, start=k)
                else:
                    rerotate_keys(layer.keys, old[0], old[1], inv, att)
        cache._harness_rope = self.pending

    def _post(self, module, args, kwargs, output):
        cache = getattr(output, "past_key_values", None)
        if cache is not None and self.pending is not None:
            cache._harness_rope = self.pending
        self.pending = None
        return output


def ntk_by_length_parameters(config, device=None, seq_len=None, layer_type=None):
    """Rope type ``ntk_by_length``: Fu et al. / LCEG dynamic-NTK rule as a pure function of the length.

    ``b' = b * (s * l / C - (s - 1)) ** (d / (d - 2))`` with ``l = clip(max(seq_len, C), min_len, max_len)``.
    With min_len = max_len = 0 this is transformers' ``_compute_dynamic_ntk_parameters`` (with C =
    ``original_max_position_embeddings`` instead of ``config.max_position_embeddings``). ``min_len`` is LCEG's
    evaluation clamp (``models/llama_ntk_32k``: the base is frozen at the training-length value for shorter inputs,
    dynamic beyond); ``max_len`` caps the multiplier (the paper's constant 57 for NTK-64K). Both are in tokens here
    (the methods convert their multiples of C). A multiplier t < 1 (a cap below C, or s < 1) is refused: t ** (d/(d-2))
    of a negative t is complex, and the frequencies would be meaningless."""
    rp = config.rope_parameters
    base, dim = rope_dims(config)
    s, c = float(rp["factor"]), int(rp["original_max_position_embeddings"])
    n = seq_len if seq_len is not None else c
    t = ntk_multiplier(s, int(n), c, int(rp.get("min_len") or 0), int(rp.get("max_len") or 0))
    if not t >= 1:  # also catches NaN

        raise ConfigError(f"ntk_by_length: multiplier t = s*l/C - (s-1) = {t:g} < 1 (s = {s:g}, C = {c}, "
                          f"min_len = {rp.get('min_len')}, max_len = {rp.get('max_len')} tokens; valid: s >= 1 and "
                          f"min_len, max_len 0 or >= C)")
    return default_inv_freq(base * t ** (dim / (dim - 2)), dim, device), 1.0


def ntk_multiplier(s: float, length: int, c: int, min_len: int = 0, max_len: int = 0) -> float:
    """The NTK multiplier t = s*l/C - (s-1) used by :func:`ntk_by_length_parameters` (for tables and tests)."""
    n = max(length, c)
    n = max(n, min_len) if min_len else n
    n = min(n, max_len) if max_len else n
    return s * n / c - (s - 1)


register_rope_type("ntk_by_length", ntk_by_length_parameters, required=("factor", "original_max_position_embeddings"),
                   optional=("min_len", "max_len"))


KV_CACHE_MODES = ("refresh", "stale")


def make_length_dependent(model, fn, kv_cache: str = "refresh"):
    """Stateless length-dependent frequencies (:class:`LengthDependentRope`) on every rotary module, plus the KV
    cache semantics: ``refresh`` re-rotates cached keys when the frequencies change (see :class:`CacheRefresh`),
    ``stale`` keeps transformers' behaviour (keys keep the rotation they were cached with, #25104).
    Returns the CacheRefresh (or None)."""
    if kv_cache not in KV_CACHE_MODES:
        raise ConfigError(f"kv_cache must be one of {KV_CACHE_MODES}, got {kv_cache!r}")
    install_length_dependent(model, fn)
    return CacheRefresh(model.get_decoder()) if kv_cache == "refresh" else None
