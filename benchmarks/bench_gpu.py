"""`make bench-gpu`: the cluster path measured on one CUDA GPU -> ``results/bench_gpu.json``.

    python benchmarks/bench_gpu.py                    # on a CUDA GPU: results/bench_gpu.json
    python benchmarks/bench_gpu.py --smoke            # any machine, tiny sizes, written to a temp file (default tier)
    python benchmarks/bench_gpu.py --only prefill,agreement --layers 2 --out /tmp/x.json

Model: random weights with LLaMA2-7B's layer shapes (hidden 4096, MLP 11008, 32 heads x 128, vocab 32000, RoPE base
1e4, native window C = 4096) and ``--layers`` decoder layers (default 4 of the real 32): per-layer figures
(latency, activation memory) scale with the layer count, the weights and the LM head do not. Every figure in the
JSON carries the size it was measured at (tokens, batch, layers, dtype). The methods take the controlled study's
settings (``controlled_study/conf/point/paper_llama2/<row>.yaml``: Self-Extend W = 1024, G = 64; LM-Infinite 10
global + 4096 local; Landmark block 64, top-5; LongLoRA S2 groups of N/4).

Sections (``--only``):
- ``prefill``: one decoder forward (no LM head) at 8k / 32k / 64k tokens per method, fused backend
  (``attention.backend=flex``) vs the reference tile loops vs plain SDPA (method ``base``): latency (median of
  ``--reps`` after a warm-up, whose time, incl. flex's compilation, is reported as ``first_call_s``) and peak memory
  above the weights (``torch.cuda.max_memory_allocated``). Landmark has no fused path (reference only, 8k by default:
  its 128-token retrieval chunks run in Python).
- ``train``: one bf16-autocast training step (forward + backward + AdamW, fp32 master weights, gradient
  checkpointing on, the harness's own ``micro_step``) at 8k / 32k: tokens/s and MFU. ``MFU = tokens/s x F / peak``
  with F the model FLOPs per token (``flops_per_token``): ``4 N + 2 N_t + 12 l h q T``, N = the matmul weights
  (decoder layers and LM head, not the embedding), N_t = those of them being trained (N for full fine-tuning, which
  gives PaLM's 6 N + 12 l h q T, Chowdhery et al. 2022, App. B; ~0 for LongLoRA's frozen base, whose weight gradients
  are never computed), l layers, h heads, q head dim, T tokens; causal masking and the checkpointing recomputation
  are not credited. peak = the GPU's dense bf16 tensor-core FLOP/s (``PEAK_BF16``, data sheets, by device name;
  unknown device: MFU null). Rows: base (plain causal), LongLoRA's S2-Attn (LoRA r=8, reference vs flex), packed
  documents (restarting positions: transformers' dense sdpa mask vs the flex block mask).
- ``generate``: greedy decoding with the KV cache (batch 1, the evaluators' pre-allocated ``GrowingCache``,
  harness/evals/common.py: no copy of the cache per token)
  after 4k-32k prompts (RULER's lengths), after one warm-up generation: prefill seconds and decode tokens/s.
- ``agreement``: fused vs reference on the GPU, fp32 and bf16 weights: max |difference| of the final hidden states
  (and relative to max |reference|), and of the gradients for the training paths (S2-Attn, documents).

No CUDA GPU and no ``--smoke``: nothing is measured and no file is written (never CPU numbers in bench_gpu.json).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from harness.methods import flex as fx

ROOT = Path(__file__).resolve().parents[1]

# dense bf16 tensor-core peak FLOP/s (vendor data sheets), matched by substring of torch.cuda.get_device_name()
PEAK_BF16 = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12), ("A800", 312e12),
             ("L40S", 362e12), ("A10G", 70e12), ("RTX 4090", 165e12)]

FULL_MODEL, SMOKE_MODEL = "llama2_7b", "tiny_llama"  # conf/model/<name>.yaml: shapes, C and RoPE base from there

FULL = dict(layers=4, prefill=[8192, 32768, 65536], landmark_max=8192, train=[8192, 32768], generate=[4096, 8192,
            16384, 32768], new_tokens=64, agreement=8192, agreement_train=4096, reps=3, dtype="bfloat16")
SMOKE = dict(layers=2, prefill=[512], landmark_max=512, train=[256], generate=[256], new_tokens=2,
             agreement=512, agreement_train=256, reps=1, dtype="float32")

FUSED = ("self_extend", "lm_infinite")  # prefill / generate rows with both backends


# ---------------------------------------------------------------------------------------------------- setup
def model_shape(name: str) -> dict:
    """The layer shapes, native window C and RoPE base of the checkpoint ``conf/model/<name>.yaml`` names, as the
    harness reads them (``harness.plan.run_shape``: its config.json where it is at hand, else the plan's table; the
    base from its config, transformers' Llama default 1e4 where the config is not here)."""
    from harness.conf_utils import compose
    from harness.models import hf_config
    from harness.plan import run_shape

    cfg = compose([f"model={name}", "train=none"])
    s = run_shape(cfg)
    rp = getattr(hf_config(cfg.model), "rope_parameters", None) or {}
    return dict(vocab=s.vocab, hidden=s.hidden, mlp=s.mlp, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim,
                ctx=int(cfg.model.native_ctx), theta=float(rp.get("rope_theta") or 10000.0))


def make_model(shape: dict, layers: int, device, dtype, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["mlp"],
                      num_hidden_layers=layers, num_attention_heads=shape["heads"],
                      num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                      max_position_embeddings=shape["ctx"],
                      rope_parameters={"rope_type": "default", "rope_theta": shape["theta"]},
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


class Tok:
    """Stands in for a tokenizer that has ``<landmark>`` (Landmark asks for its id)."""

    def get_vocab(self):
        return {"<landmark>": 3}

    def convert_tokens_to_ids(self, t):
        return 3


def method_config(name: str, smoke: bool) -> dict:
    """The method's settings: the paper point's (LLaMA2-7B) or, in smoke mode, the YAML defaults (lengths in units of
    the smoke model's C)."""
    from harness.conf_utils import group_defaults

    if smoke or name == "base":
        return group_defaults("method", name)
    if name == "entropy_abf":  # the original's base 500,000 (the YAML holds the tiny analogue)
        return {**group_defaults("method", name), "rope_theta": 500000.0}
    from omegaconf import OmegaConf

    from harness.sweeps import compose

    cfg = compose(["experiment=paper_llama2", f"point=paper_llama2/{name}"])
    return OmegaConf.to_container(cfg.method, resolve=True)


def prepared(name: str, shape: dict, layers: int, device, dtype, smoke: bool, backend: str = "auto"):
    """A random model with ``method`` applied (as the pipeline does: backend first, then the method)."""
    from harness.methods import build_method
    from harness.models import ModelHandle

    model = make_model(shape, layers, device, dtype)
    handle = ModelHandle(model, Tok(), "random", shape["ctx"], {})
    fx.set_backend(model, backend)
    method = build_method(method_config(name, smoke))
    method.apply(handle)
    return model, handle, method


def set_module_backend(model, backend: str) -> None:
    for m in fx.bw.attention_modules(model):
        m.harness_attn_backend = backend


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def peak_memory(device, out: dict):
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    yield
    if device.type == "cuda":
        sync(device)
        out["peak_mem_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)
    else:
        out["peak_mem_gib"] = None  # CPU smoke: not measured


def timed(fn, device, reps: int) -> tuple[float, float]:
    """(first call seconds, median of ``reps`` further calls; a first call over 60 s is not repeated)."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - t
    if first > 60 or reps <= 0:
        return first, first
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t)
    return first, statistics.median(ts)


def guarded(row: dict, fn) -> dict:
    try:
        fn(row)
        row.setdefault("status", "ok")
    except torch.OutOfMemoryError:
        row["status"] = "oom"
    except Exception as e:  # noqa: BLE001 - a failed figure is recorded, the others still run
        row["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        traceback.print_exc()
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
    return row


def random_ids(n: int, vocab: int, device, b: int = 1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (b, n), generator=g).to(device)


# ---------------------------------------------------------------------------------------------------- sections
def prefill(p: dict, shape, device, dtype, smoke) -> list[dict]:
    rows = []
    plan = [("base", ["sdpa"])] + [(m, ["reference", "flex"]) for m in FUSED] + [("landmark", ["reference"])]
    for name, backends in plan:
        model, _, _ = prepared(name, shape, p["layers"], device, dtype, smoke,
                               backend="reference" if name == "base" else "auto")
        dec = model.get_decoder()
        for backend in backends:
            if backend != "sdpa":
                set_module_backend(model, backend)
            for n in p["prefill"]:
                if name == "landmark" and n > p["landmark_max"]:
                    continue
                row = {"method": name, "backend": backend, "tokens": n, "batch": 1, "layers": p["layers"],
                       "dtype": str(dtype).removeprefix("torch.")}
                ids = random_ids(n, shape["vocab"], device)

                def run(r, dec=dec, ids=ids):
                    with torch.inference_mode(), peak_memory(device, r):
                        first, med = timed(lambda: dec(input_ids=ids, use_cache=False), device, p["reps"])
                    r.update(first_call_s=round(first, 4), latency_s=round(med, 4))

                rows.append(guarded(row, run))
        del model, dec
    return rows


def flops_per_token(model, seq: int) -> float:
    """4 N + 2 N_t + 12 l h q T (see the module docstring)."""
    c = model.config
    mats = [(p.numel(), p.requires_grad) for n_, p in model.named_parameters()
            if "embed_tokens" not in n_ and p.dim() == 2]
    n, n_t = sum(k for k, _ in mats), sum(k for k, t in mats if t)
    return 4 * n + 2 * n_t + 12 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * seq


def peak_flops(device) -> tuple[float | None, str]:
    if device.type != "cuda":
        return None, "CPU smoke run: no MFU"
    name = torch.cuda.get_device_name()
    for key, v in PEAK_BF16:
        if key in name:
            return v, f"dense bf16 peak of {key} (data sheet)"
    return None, f"unknown peak for {name!r}: MFU not computed"


def train(p: dict, shape, device, dtype, smoke) -> list[dict]:
    from harness.train.step import micro_step

    rows = []
    peak, _ = peak_flops(device)
    # (method, label, backend): plain causal = stock sdpa; documents: transformers' dense sdpa mask vs flex
    plan = [("base", "sdpa", "reference", False), ("longlora", "reference", "reference", False),
            ("longlora", "flex", "flex", False), ("base", "reference", "reference", True),
            ("base", "flex", "flex", True)]
    for name, label, backend, docs in plan:
        for n in p["train"]:
            row = {"method": name + ("+documents" if docs else ""), "backend": label, "tokens": n,
                   "micro_batch": 1, "layers": p["layers"], "grad_checkpointing": True,
                   "autocast": "bfloat16" if device.type == "cuda" else "float32"}

            def run(r, name=name, backend=backend, docs=docs, n=n):
                model, handle, method = prepared(name, shape, p["layers"], device, torch.float32, smoke,
                                                 backend=backend)
                method.train_mode(handle)
                model.gradient_checkpointing_enable()
                model.train()
                params = [q for q in model.parameters() if q.requires_grad]
                opt = torch.optim.AdamW(params, lr=1e-5, fused=device.type == "cuda")
                ids = random_ids(n, shape["vocab"], device)
                batch = {"input_ids": ids, "labels": ids}
                if docs:  # eight packed documents: positions restart (train.doc_masking, LongRoPE2's mixed windows)
                    batch.update(position_ids=(torch.arange(n, device=device) % max(1, n // 8))[None],
                                 use_cache=False)

                def step():
                    micro_step(model, batch, 1, "bfloat16" if device.type == "cuda" else "float32")
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                with peak_memory(device, r):
                    first, med = timed(step, device, p["reps"])
                f = flops_per_token(model, n)
                r.update(first_call_s=round(first, 3), step_s=round(med, 4), tokens_per_s=round(n / med, 1),
                         trainable_params=sum(q.numel() for q in params), flops_per_token=f,
                         mfu=round(n / med * f / peak, 4) if peak else None)

            rows.append(guarded(row, run))
    return rows


def greedy(model, ids, new_tokens: int, device) -> tuple[float, float]:
    """Greedy decoding with the KV cache (batch 1): (prefill seconds, decode seconds for ``new_tokens`` tokens)."""
    from harness.evals.common import GrowingCache

    with torch.inference_mode():
        sync(device)
        t0 = time.perf_counter()
        cache = GrowingCache(capacity=ids.shape[1] + new_tokens)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1:].argmax(-1)
        sync(device)
        t1 = time.perf_counter()
        for _ in range(new_tokens):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
        sync(device)
        return t1 - t0, time.perf_counter() - t1


def generate(p: dict, shape, device, dtype, smoke) -> list[dict]:
    rows = []
    plan = [("base", ["sdpa"])] + [(m, ["reference", "flex"]) for m in FUSED]
    for name, backends in plan:
        model, _, _ = prepared(name, shape, p["layers"], device, dtype, smoke,
                               backend="reference" if name == "base" else "auto")
        for backend in backends:
            if backend != "sdpa":
                set_module_backend(model, backend)
            for n in p["generate"]:
                row = {"method": name, "backend": backend, "prompt_tokens": n, "new_tokens": p["new_tokens"],
                       "batch": 1, "layers": p["layers"], "dtype": str(dtype).removeprefix("torch.")}

                def run(r, model=model, n=n):
                    ids = random_ids(n, shape["vocab"], device)
                    greedy(model, ids, 2, device)  # warm-up (flex compiles its prefill and decoding shapes)
                    with peak_memory(device, r):
                        t_pre, t_dec = greedy(model, ids, p["new_tokens"], device)
                    r.update(prefill_s=round(t_pre, 4), decode_s=round(t_dec, 4),
                             decode_tokens_per_s=round(p["new_tokens"] / t_dec, 2))

                rows.append(guarded(row, run))
        del model
    return rows


def agreement(p: dict, shape, device, dtype, smoke) -> list[dict]:
    rows = []
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (no TF32 matmuls in the reference)
    try:
        for dt in (torch.float32, torch.bfloat16):
            for name in FUSED + ("entropy_abf",):
                n = p["agreement"]
                row = {"method": name, "backend": "flex", "dtype": str(dt).removeprefix("torch."), "tokens": n,
                       "layers": p["layers"], "compared": "final hidden states"}

                def run(r, name=name, dt=dt, n=n):
                    ref, _, _ = prepared(name, shape, p["layers"], device, dt, smoke, backend="reference")
                    fus, _, _ = prepared(name, shape, p["layers"], device, dt, smoke, backend="flex")
                    ids = random_ids(n, shape["vocab"], device, seed=1)
                    kw = {}
                    if name == "entropy_abf":  # packed documents too: the flex document mask
                        kw = {"position_ids": (torch.arange(n, device=device) % max(1, n // 4))[None]}
                    with torch.inference_mode():
                        a = ref.get_decoder()(input_ids=ids, use_cache=False, **kw).last_hidden_state.float()
                        b = fus.get_decoder()(input_ids=ids, use_cache=False, **kw).last_hidden_state.float()
                    d = (a - b).abs().max().item()
                    r.update(max_abs_diff=d, rel_diff=d / max(a.abs().max().item(), 1e-30))

                rows.append(guarded(row, run))
            for name, docs in (("longlora", False), ("base", True)):
                n = p["agreement_train"]
                row = {"method": name + ("+documents" if docs else " (S2-Attn, training)"), "backend": "flex",
                       "dtype": str(dt).removeprefix("torch."), "tokens": n, "layers": p["layers"],
                       "compared": "logits and gradients of the trainable parameters"}

                def run(r, name=name, docs=docs, dt=dt, n=n):
                    ids = random_ids(n, shape["vocab"], device, seed=2)
                    out = []
                    for backend in ("reference", "flex"):
                        model, handle, method = prepared(name, shape, p["layers"], device, dt, smoke,
                                                         backend=backend)
                        method.train_mode(handle)
                        for q_name, q in model.named_parameters():
                            if "lora_B" in q_name:
                                torch.nn.init.normal_(q, std=0.02)
                        if docs:
                            for q in model.parameters():
                                q.requires_grad_(True)
                        model.train()
                        kw = {"position_ids": (torch.arange(n, device=device) % max(1, n // 4))[None],
                              "use_cache": False} if docs else {}
                        o = model(input_ids=ids, labels=ids, **kw)
                        o.loss.backward()
                        grads = {k: q.grad.float() for k, q in model.named_parameters() if q.grad is not None}
                        out.append((o.logits.detach().float(), grads))
                        del model
                    (la, ga), (lb, gb) = out
                    d = (la - lb).abs().max().item()
                    g = max((ga[k] - gb[k]).abs().max().item() for k in ga)
                    gs = max(ga[k].abs().max().item() for k in ga)
                    r.update(max_abs_diff=d, rel_diff=d / max(la.abs().max().item(), 1e-30), grad_max_abs_diff=g,
                             grad_rel_diff=g / max(gs, 1e-30), grad_tensors=len(ga))

                rows.append(guarded(row, run))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return rows


SECTIONS = {"prefill": prefill, "train": train, "generate": generate, "agreement": agreement}


# ---------------------------------------------------------------------------------------------------- main
def environment(device) -> dict:
    import transformers

    from harness.results import git_sha, hardware

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
           "git_sha": git_sha(ROOT), "hardware": hardware()}
    if device.type == "cuda":
        prop = torch.cuda.get_device_properties(device)
        env["device"] = {"name": prop.name, "capability": f"{prop.major}.{prop.minor}",
                         "memory_gib": round(prop.total_memory / 2**30, 1), "count": torch.cuda.device_count()}
    else:
        env["device"] = {"name": "cpu (smoke run: not GPU numbers)"}
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on any device; written to a temp file")
    ap.add_argument("--out", default=None, help="output JSON (default: results/bench_gpu.json; smoke: a temp file)")
    ap.add_argument("--only", default="prefill,train,generate,agreement")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not args.smoke and not cuda:
        print("bench_gpu: no CUDA GPU here; nothing measured, results/bench_gpu.json not written "
              "(--smoke runs the tiny CPU check)", file=sys.stderr)
        return 2
    p = dict(SMOKE if args.smoke else FULL)
    if args.layers:
        p["layers"] = args.layers
    if args.reps is not None:
        p["reps"] = args.reps
    shape = model_shape(SMOKE_MODEL if args.smoke else FULL_MODEL)
    device = torch.device("cuda" if cuda else "cpu")
    dtype = getattr(torch, p["dtype"]) if cuda or args.smoke else torch.float32
    if args.smoke and not cuda:
        dtype = torch.float32
    out = Path(args.out) if args.out else (
        Path(tempfile.mkdtemp(prefix="bench_gpu_smoke_")) / "bench_gpu.json" if args.smoke
        else ROOT / "results" / "bench_gpu.json")
    from harness.results import atomic_write_json, now_iso

    model_info = {"shape": f"{SMOKE_MODEL} layer shapes (smoke)" if args.smoke else "LLaMA2-7B layer shapes, random "
                  "weights",
                  **shape, "layers": p["layers"], "layers_of_real_model": None if args.smoke else 32,
                  "dtype": str(dtype).removeprefix("torch.")}
    pk, pk_source = peak_flops(device)
    data = {"schema": 1, "mode": "smoke" if args.smoke else "gpu", "time": now_iso(), **environment(device),
            "model": model_info, "sizes": p, "flex": "torch.compile(flex_attention) + create_block_mask(_compile=True)"
            if cuda else "flex_attention eager (CPU)",
            "mfu_formula": "MFU = tokens/s * (6 N + 12 l h q T) / peak_bf16_flops; N = 2-D weights of the decoder "
                           "layers and the LM head (not the embedding), l layers, h heads, q head dim, T tokens "
                           "(PaLM App. B; no credit for causal masking or checkpoint recomputation)",
            "peak_bf16_flops": pk, "peak_source": pk_source}
    status = 0
    for name in [s for s in args.only.split(",") if s]:
        t = time.time()
        try:
            data[name] = SECTIONS[name](p, shape, device, dtype, args.smoke)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            data[name] = {"status": f"error: {type(e).__name__}: {e}"}
            status = 1
        data.setdefault("seconds", {})[name] = round(time.time() - t, 1)
        atomic_write_json(out, data)  # partial progress is never lost
    bad = [r for s in SECTIONS if isinstance(data.get(s), list) for r in data[s] if r.get("status") != "ok"]
    print(f"bench_gpu: {out} ({len(bad)} figures not ok)")
    return status or (1 if bad else 0)


if __name__ == "__main__":
    sys.exit(main())
