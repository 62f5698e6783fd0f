"""longrope: LongRoPE (Ding et al. 2024, microsoft/LongRoPE ``rope/longrope.py``): per-pair rescale factors
``inv_freq_i = 1 / (lambda_i * b^(2i/d))`` read from a file, cos and sin multiplied by the "su" magnitude scale
``sqrt(1 + ln s / ln C)`` (s = max_position_embeddings / original_max_position_embeddings of the file), and
optionally the first ``n_hat`` positions kept un-interpolated (``MixedLongRoPEScaledRotaryEmbedding``).

Frequencies go through transformers' ``"longrope"`` rope type (``_compute_longrope_parameters``, the Phi-3
implementation): the ``short_factor`` set for sequences of length <= C, ``long_factor`` beyond (strictly > C), one
attention factor for both. ``switch: false`` gives the original LongRoPE class instead (long factors at every
length: transformers' type with short := long). The switch is made stateless and KV-cache consistent by
``rope.make_length_dependent`` (``kv_cache: refresh`` re-rotates cached keys when the set changes; Phi-3's
``prepare_inputs_for_generation`` instead drops the cache and re-prefills, which also recomputes deeper layers).

``n_hat`` (paper: start tokens kept at the original RoPE): a forward hook on the rotary module overwrites the cos/sin
rows of positions < n_hat with plain RoPE values (no magnitude scale), as the original Mixed class overwrites rows
``[:n_hat]`` with its ``original_embeddings`` (that class is broken at the read commit: generator/tuple bugs, and no
script passes ``start_token_idx``; methods.md section 8.1). Those cached keys are never re-rotated.

Factors file (shared with the LongRoPE search helper): JSON ``{"short_factor": [d/2], "long_factor": [d/2],
"original_max_position_embeddings": C, "max_position_embeddings": target, "attention_factor"?: float, "n_hat"?: int,
"provenance": {...}}``. ``factors: ""`` = the shipped default for tiny_llama 512 -> 4096
(``harness/assets/longrope/tiny_llama_512_4096.json``: long factors initialised from the YaRN ramp exactly as the
original search initialises its population, short factors 1; not a searched result, its provenance says so).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.conf_utils import CONF_DIR
from harness.config import ConfigError
from harness.methods import METHODS, ROPE, Method, MethodArgs, StageContext
from harness.methods.rope import (
    KV_CACHE_MODES,
    default_inv_freq,
    make_length_dependent,
    rope_dims,
    rotary_modules,
    set_rope_parameters,
)

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "longrope"
DEFAULT_FILE = ASSETS / "tiny_llama_512_4096.json"
REQUIRED_KEYS = ("short_factor", "long_factor", "original_max_position_embeddings", "max_position_embeddings")


def resolve_factors(path: str | Path) -> Path:
    """The factors file: ``""`` = ``DEFAULT_FILE``; a bare name that is not a file here but is one of the shipped
    files in ``harness/assets/longrope/`` (e.g. the study's searched ``tiny_llama_512_4096_searched.json``) = that
    file, so a config names shipped factors the same way from any working directory."""
    if not path:
        return DEFAULT_FILE
    p = Path(path)
    if not p.is_file() and not p.is_absolute() and len(p.parts) == 1 and (ASSETS / p).is_file():
        return ASSETS / p
    return p


def load_factors(path: str | Path, rotary_half: int | None, native_ctx: int | None = None) -> dict:
    """Read and check a LongRoPE factors file (format in the module docstring). ``rotary_half`` None: the factor
    counts are not checked (before the model is loaded)."""
    p = resolve_factors(path)
    if not p.is_file():
        raise ConfigError(f"LongRoPE factors file not found: {p} "
                          f"(method.factors: a JSON file, \"\" = {DEFAULT_FILE.name})")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"LongRoPE factors file {p} is not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"LongRoPE factors file {p} must hold a JSON object with {', '.join(REQUIRED_KEYS)}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ConfigError(f"LongRoPE factors file {p} lacks {missing}")
    for k in ("short_factor", "long_factor"):
        vals = data[k]
        if not isinstance(vals, list) or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0
                                                 for v in vals):
            raise ConfigError(f"LongRoPE factors file {p}: {k} must be a list of finite numbers > 0")
        if rotary_half is not None and len(vals) != rotary_half:
            raise ConfigError(f"LongRoPE factors file {p}: {k} has {len(data[k])} values, the model's rotary "
                              f"dimension needs d/2 = {rotary_half}")
    if native_ctx and int(data["original_max_position_embeddings"]) != int(native_ctx):
        raise ConfigError(f"LongRoPE factors file {p} is for C={data['original_max_position_embeddings']}, "
                          f"the model's native window is {native_ctx}")
    data["path"] = str(p)
    return data


def factors_digest(path: str | Path) -> str:
    """sha256 of the factors file, saved with the method's parameters so a checkpoint is tied to its factors."""
    import hashlib

    p = resolve_factors(path)
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else ""


def progressive_lineage(saved: dict, now: dict, factors: str, directory) -> bool:
    """True when a checkpoint fine-tuned with this method (``saved`` = its method.json) may be used with the
    factors file ``factors`` although the parameters differ: same method, only the factors differ, and the new
    factors were searched on this very checkpoint (their ``provenance.model_path`` is ``directory``). This is
    LongRoPE's progressive extension (fine-tuned model -> secondary search -> evaluate / fine-tune again); any other
    difference is still refused."""
    diff = {k for k in set(saved) | set(now) if saved.get(k) != now.get(k)}
    if saved.get("name") != now.get("name") or not diff <= {"factors", "factors_sha256"} or not factors:
        return False
    try:
        prov = json.loads(resolve_factors(factors).read_text()).get("provenance") or {}
    except (OSError, ValueError):
        return False
    src = prov.get("model_path") or ""
    return bool(src) and Path(src).resolve() == Path(directory).resolve()


def su_mscale(scale: float, original: int) -> float:
    """The "su" magnitude scale sqrt(1 + ln s / ln C) (1 if s <= 1)."""
    return 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original))


class StartTokens:
    """Forward hook on a rotary module: cos/sin rows at positions < n_hat become plain RoPE (original freqs)."""

    def __init__(self, module, n_hat: int, base: float, dim: int):
        self.n_hat = n_hat
        self.inv = default_inv_freq(base, dim)
        self.handle = module.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        position_ids = args[1] if len(args) > 1 else kwargs.get("position_ids")
        if position_ids is None or int(position_ids.min()) >= self.n_hat:
            return output
        cos, sin = output
        freqs = position_ids[..., None].float() * self.inv.to(cos.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        keep = (position_ids < self.n_hat)[..., None]
        cos = torch.where(keep, emb.cos().to(cos.dtype), cos)
        sin = torch.where(keep, emb.sin().to(sin.dtype), sin)
        return cos, sin


def apply_factors(model, f: dict, *, switch: bool = True, n_hat: int = -1, attention_factor: float = 0.0,
                  kv_cache: str = "refresh") -> dict:
    """Put the factors ``f`` (a factors file's dict) on ``model``: the one way LongRoPE factors reach a model, used
    by this method, by the factor search's fitness (``harness.search.fitness``) and by its ``verify`` step. The
    keyword arguments are the method's (``n_hat`` -1 / ``attention_factor`` 0: the file's value). Returns the
    resolved ``n_hat``, attention factor and window sizes. Applying again replaces the previous factors (the rotary
    modules are rebuilt, their hooks with them); ``kv_cache: refresh`` also hooks the decoder, so repeated
    application without a KV cache should use ``stale``."""
    base, dim = rope_dims(model.config)
    orig, target = int(f["original_max_position_embeddings"]), int(f["max_position_embeddings"])
    att = attention_factor or f.get("attention_factor") or su_mscale(target / orig, orig)
    short = list(map(float, f["short_factor"] if switch else f["long_factor"]))
    set_rope_parameters(model, rope_type="longrope", short_factor=short, long_factor=list(map(float, f["long_factor"])),
                        original_max_position_embeddings=orig, factor=target / orig, attention_factor=float(att))
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    refresh = make_length_dependent(model, ROPE_INIT_FUNCTIONS["longrope"], kv_cache)
    n_hat = int(f.get("n_hat", 0) if n_hat < 0 else n_hat)
    if n_hat > 0:
        for m in rotary_modules(model):
            StartTokens(m, n_hat, base, dim)
        if refresh is not None:
            refresh.keep_first = n_hat
    return {"n_hat": n_hat, "attention_factor": float(att), "original_max_position_embeddings": orig,
            "max_position_embeddings": target}


@METHODS.register("longrope")
class LongRoPE(Method):
    needs = ROPE

    @dataclass
    class Args(MethodArgs):
        name: str = "longrope"
        factors: str = ""  # a factors file (a bare name: one shipped in harness/assets/longrope/); "" = DEFAULT_FILE
        switch: bool = True  # short factors for length <= C, long beyond (Phi-3 / transformers); false = long always
        n_hat: int = -1  # start tokens kept un-interpolated; -1 = the file's value (0 if absent)
        attention_factor: float = 0.0  # 0 = the file's value, else su: sqrt(1 + ln s / ln C)
        kv_cache: str = "refresh"  # refresh | stale
        # "" = none; else a short-factor search config (conf/search/<name>.yaml, factors_for: short) run after
        # fine-tuning, before the convergence gate: LongRoPE's recovery of the short window (paper Sec. 3.3)
        recovery: str = ""

    def check_data(self, native_ctx: int) -> None:
        load_factors(self.args.factors, None, native_ctx)

    def check(self, native_ctx: int, train=None) -> None:
        a = self.args
        if a.kv_cache not in KV_CACHE_MODES or a.attention_factor < 0 or a.n_hat < -1:
            raise ConfigError(f"method=longrope: need kv_cache in {KV_CACHE_MODES}, attention_factor >= 0 (0 = the "
                              f"file's), n_hat >= -1 (-1 = the file's); got {a.kv_cache!r}, {a.attention_factor}, "
                              f"{a.n_hat}")
        if a.recovery:
            if not (CONF_DIR / "search" / f"{a.recovery}.yaml").is_file():
                raise ConfigError(f"method.recovery={a.recovery!r}: no conf/search/{a.recovery}.yaml")
            if train is not None and not getattr(train, "enabled", True):
                raise ConfigError("method.recovery searches the short factors of a fine-tuned model; with train=none "
                                  "there is nothing to recover (method.recovery=\"\")")

    def apply(self, handle) -> None:
        a = self.args
        self.check(handle.native_ctx)
        _, dim = rope_dims(handle.model.config)
        f = load_factors(a.factors, dim // 2, handle.native_ctx)
        got = apply_factors(handle.model, f, switch=a.switch, n_hat=a.n_hat, attention_factor=a.attention_factor,
                            kv_cache=a.kv_cache)
        self.resolved = {"factors_file": f["path"], **got, "provenance": f.get("provenance", {})}

    def after_finetune(self, handle, ctx: StageContext) -> dict | None:
        """LongRoPE's recovery stage (paper Sec. 3.3), with ``recovery`` naming a short-factor search config
        (``method.recovery=longrope_short_tiny``): search the factors used at length <= C on the fine-tuned model
        (``harness.search.recover_short_factors``, writing ``<run_dir>/recovered_factors.json``) and use them from
        then on (``use_factors``). The row records the search under ``train_info.recovery``."""
        if not self.args.recovery:
            return None
        path, info = ctx.search.recover_short_factors(handle, self.args.recovery, self.resolved["factors_file"],
                                                      ctx.run_dir, ctx.seed, autocast=ctx.autocast)
        self.use_factors(handle, path)
        return {"recovery": info}

    def use_factors(self, handle, path: str | Path) -> None:
        """Put another factors file on the model from now on (LongRoPE's recovery stage, ``after_finetune``: the
        short factors searched on the fine-tuned model); the gate and every evaluator see it, and the saved
        checkpoint's config carries its rope parameters. ``params()`` stays the configured method (rows of several
        seeds are one configuration); the row names the recovered file under ``train_info.recovery``, and evaluating
        the checkpoint later takes ``method.factors=<that file>`` (accepted: it was searched on that checkpoint).
        The decoder's cache hook from ``apply`` stays (it finds the rebuilt rotary module), hence ``stale`` here."""
        a = self.args
        _, dim = rope_dims(handle.model.config)
        f = load_factors(path, dim // 2, handle.native_ctx)
        got = apply_factors(handle.model, f, switch=a.switch, n_hat=a.n_hat, attention_factor=a.attention_factor,
                            kv_cache="stale")
        self.resolved = {"factors_file": f["path"], **got, "provenance": f.get("provenance", {})}

    def params(self) -> dict:
        return {**super().params(), "factors_sha256": factors_digest(self.args.factors)}

    def accepts_checkpoint(self, saved: dict, directory) -> bool:
        return progressive_lineage(saved, json.loads(json.dumps(self.params(), sort_keys=True)), self.args.factors,
                                   directory)
