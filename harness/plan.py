"""Cost plan of a sweep before it goes to a cluster (``scripts/plan.py``): per sweep point, memory per rank under
ZeRO-3 at the training length, tokens to train, prompt tokens per evaluator, and GPU-hours from a stated throughput.

Everything is a formula of the composed config (no model is loaded, no data read unless it is on disk); each figure
says what it assumes. Notation: P = all parameters, P_t = trained ones, W = ranks, b = micro batch, T = training
length, l layers, d hidden, f MLP width, h heads, q head dim, V vocab; bytes are bf16 = 2, fp32 = 4.

Memory per rank (ZeRO-3, bf16 mixed precision, DeepSpeed AdamW, ``harness/train/deepspeed_engine.py``):
- parameters 2P/W (bf16, partitioned); gradients 2P_t/W; optimizer 12P_t/W (fp32 master + Adam m, v: the ZeRO
  paper's K = 12); EMA 4P_t/W (the engine's fp32 shadow of each rank's partitions);
- gathered parameters: two layers in bf16 (the one computing + the one prefetched);
- activations, gradient checkpointing on: the checkpointed layer inputs 2 l b T d, plus one layer recomputed during
  backward (its saved tensors, 8d + 4f values per token for a Llama layer with a fused attention kernel, x2 for their
  gradients in flight), plus the logits and the loss 10 b T V (bf16 logits, the fp32 copy the loss takes, its fp32
  gradient). Without checkpointing: every layer's saved tensors. Fragmentation and the CUDA context are not modelled.
- sequence parallelism (``train.sequence_parallel`` = N, Ulysses): every activation term above at T/N tokens (a
  rank holds its slice; the all-to-all's full-sequence q, k, v hold h/N heads, as many values as the slice's), and
  the loss tiled (DeepSpeed's ``TiledFusedLogitsLoss``): one tile's fp32 logits and their gradient, 2 x
  ``train.logits_tile_mib``, plus the fp32 gradient of the slice's hidden states 4 b (T/N) d, in place of 10 b T V.
  The optimizer terms stay /W: ZeRO partitions over all W ranks.
- MLP tiles (``train.mlp_tiles`` = k, DeepSpeed's ``TiledMLP``): a layer's MLP intermediates 4f per token at T/k
  tokens at once, 8d + 4f/k in place of 8d + 4f (its input is among the 8d); one more MLP forward per step.

Training FLOPs per token F = 4 N + 2 N_t + 12 l h q T_att (N = matmul weights incl. the LM head, N_t the trained
ones: full fine-tuning gives PaLM's 6 N + 12 l h q T; T_att = T, or T x group ratio under LongLoRA's S2-Attn, or
Landmark's 512-token training context).
Evaluation, per evaluator and length L (``eval_point``):
- memory: ``harness.memory.eval_memory`` (weights + the KV cache of L tokens when the evaluator decodes + the
  prefill's transient activations; its docstring has the formula), and the GPUs one input needs
  (``harness.memory.gpus_needed`` with ``ASSUMED_USABLE_MEMORY`` of each GPU: layers split by ``device_map``, model
  parallel when > 1);
- prefill FLOPs per prompt token: 2 N + 4 l h q L (forward only), seconds = FLOPs / (MFU x peak bf16 FLOP/s);
- decoding, memory-bandwidth bound: each generated token reads every weight and the whole KV cache, seconds per
  token = (weights + KV cache at L) / (HBM bandwidth x ``ASSUMED_DECODE_EFFICIENCY``); generated tokens per prompt
  come from the evaluator's settings (``gen_tokens``, ``max_new_tokens``, ``max_gen``, RULER's and LongBench's
  per-task budgets): an upper bound, every prompt decodes its whole budget (a stop token ends some earlier);
- GPU-hours = (prefill + decode seconds) x the GPUs one replica spans; wall-clock: the prompts are spread over the
  node's GPUs, data-parallel (``eval_world_size``), in node GPUs // GPUs-per-replica replicas.
Wall-clock of a point: training spreads over its ``train.world_size`` ranks, evaluation as above, so a point holds its
node for train/W + its evaluation's wall hours. MFU comes from ``results/bench_gpu.json`` (the measured training
step of a random model with the same layer shapes, at the nearest length) when that file exists from a GPU run,
else from ``ASSUMED_MFU``, an assumption labelled as such in every output.

Checkpoint space of a training point (``checkpoint_space``; GB = 1e9 bytes), under ``paths.ckpt_dir``:
- one ZeRO-3 save = 2P (bf16 weights) + 12P_t (fp32 master + Adam m, v) + 4P_t (the fp32 EMA partitions, when
  ``train.ema``);
- at the peak, while a save is written, the ``KEEP_LAST`` published saves plus that temporary copy
  (``harness.train.checkpoint``), plus the final exported weights 2P (bf16, in the run directory);
- left after the run: the final weights, plus ``KEEP_LAST`` saves when ``train.keep_checkpoints`` (else removed).
The sweep's figure is the sum of its points' peaks (the job array runs them at once, up to ``array_parallelism``).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from harness import memory
from harness.conf_utils import checkpoint_config
from harness.config import ConfigError, to_args
from harness.device import fast_bf16_cpu, resolve_device
from harness.evals import method_limit, replica_gpus
from harness.evals.suite import Suite
from harness.evals.suite import plan as plan_units
from harness.methods import build_method
from harness.models import MODELS
from harness.train import TrainArgs
from harness.train.checkpoint import KEEP_LAST

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30

GPU_PEAK_BF16 = {"A100": 312e12, "H100": 989e12, "H200": 989e12}  # dense bf16 tensor-core FLOP/s (data sheets)
GPU_MEMORY_GIB = {"A100": 80, "H100": 80, "H200": 141}
GPU_HBM_BYTES_PER_S = {"A100": 2.0e12, "H100": 3.35e12, "H200": 4.8e12}  # A100 80GB, H100 SXM, H200 (data sheets)
ASSUMED_DECODE_EFFICIENCY = 0.5  # ASSUMPTION (not measured): share of the HBM bandwidth one decoding step achieves
ASSUMED_USABLE_MEMORY = memory.ASSUMED_USABLE_MEMORY  # ASSUMPTION: share of a GPU's memory left to tensors
DEFAULT_NODE_GPUS = 8  # the paper's node (8 x A100) when no launcher names one
ASSUMED_MFU = 0.35  # ASSUMPTION (not measured): model-FLOPs utilisation of a 7B Llama training step / prefill


@dataclass
class Shape:
    layers: int
    hidden: int
    mlp: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    mlp_mats: int = 3
    tied: bool = False

    @property
    def layer_params(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + 2 * self.hidden * self.kv_heads * self.head_dim
        return attn + self.mlp_mats * self.hidden * self.mlp + 2 * self.hidden

    @property
    def embed(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embed * (1 if self.tied else 2) + self.hidden

    @property
    def matmul_params(self) -> int:  # N: every weight a token's forward multiplies (not the embedding lookup)
        return self.layers * (self.layer_params - 2 * self.hidden) + self.embed

    def memory_shape(self) -> dict:
        """The shape as ``harness.memory`` takes it."""
        return dict(layers=self.layers, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
                    head_dim=self.head_dim, vocab=self.vocab, mlp=self.mlp, params=self.params,
                    mlp_mats=self.mlp_mats, tied=self.tied)


def model_shape(cfg) -> Shape:
    """The shape of the checkpoint ``cfg.model`` names: its folder's config.json, else the shape its model YAML
    declares (``shape``: the checkpoint's config.json, for a plan made where the weights are not), else the config of
    a hub id in the local cache."""
    m = cfg.model
    path = Path(str(m.get("path") or ""))
    if not path.is_absolute():
        path = ROOT / path
    c = None
    if (path / "config.json").is_file():
        c = json.loads((path / "config.json").read_text())
    elif not m.get("shape"):
        try:
            c = checkpoint_config(str(m.get("path") or ""))  # a hub id in the local cache
        except ValueError:
            c = None
    if c is not None:  # read as a run reads it (harness.memory.shape_of): the same device map
        sh = memory.shape_of(c)
        return Shape(sh["layers"], sh["hidden"], sh["mlp"], sh["heads"], sh["kv_heads"], sh["head_dim"], sh["vocab"],
                     sh["mlp_mats"], sh["tied"])
    if not m.get("shape"):
        raise ValueError(f"plan: no shape known for model {m.name!r} ({str(m.get('path') or '')!r} is neither a folder "
                         f"with a config.json nor a hub id in the local cache, and conf/model/{m.name}.yaml declares "
                         f"no shape)")
    return Shape(**dict(m.shape))


# ---------------------------------------------------------------------------------------------------- training
def trained_params(cfg, s: Shape) -> tuple[int, int]:
    """(P_t, N_t): trained parameters and trained matmul weights of the method's fine-tuning."""
    meth = OmegaConf.to_container(cfg.method, resolve=True)
    if "lora_r" in meth:  # LongLoRA: LoRA on the targets + parameters whose name holds one of ``trainable``
        r, targets = int(meth["lora_r"]), list(meth.get("lora_targets") or [])
        dims = {"q_proj": (s.hidden, s.heads * s.head_dim), "k_proj": (s.hidden, s.kv_heads * s.head_dim),
                "v_proj": (s.hidden, s.kv_heads * s.head_dim), "o_proj": (s.heads * s.head_dim, s.hidden)}
        lora = s.layers * sum(r * (i + o) for t, (i, o) in dims.items() if t in targets)
        extra = 0
        for t in meth.get("trainable") or []:
            extra += s.embed if t == "embed" else (s.layers * 2 + 1) * s.hidden if t == "norm" else 0
        return lora + extra, lora
    return s.params, s.matmul_params


def train_flops_per_token(s: Shape, n_t: int, t_att: float) -> float:
    return 4 * s.matmul_params + 2 * n_t + 12 * s.layers * s.heads * s.head_dim * t_att


def memory_per_rank(s: Shape, p_t: int, world: int, b: int, T: int, ckpt: bool, ema: bool, offload: bool,
                    sp: int = 1, tile_mib: int = 256, mlp_tiles: int = 1) -> dict:
    T = T // max(1, sp)  # the rank's slice (module docstring, "sequence parallelism")
    per_layer_saved = (8 * s.hidden + 4 * s.mlp / max(1, mlp_tiles)) * 2 * b * T  # bytes
    act = {"checkpoints": 2 * s.layers * b * T * s.hidden, "recomputed_layer": 2 * per_layer_saved} if ckpt else \
        {"all_layers": s.layers * per_layer_saved}
    if sp > 1:
        act["logits_and_loss_tiled"] = 2 * min(tile_mib * 2**20, 4 * b * T * s.vocab) + 4 * b * T * s.hidden
    else:
        act["logits_and_loss"] = 10 * b * T * s.vocab
    out = {"parameters": 2 * s.params / world, "gradients": 2 * p_t / world,
           "optimizer": 0 if offload else 12 * p_t / world, "ema": 4 * p_t / world if ema else 0,
           "gathered_parameters": 2 * 2 * s.layer_params, **{f"activations.{k}": v for k, v in act.items()}}
    if offload:
        out["parameters"] = 0
    gib = {k: round(v / GIB, 2) for k, v in out.items()}
    gib["total"] = round(sum(out.values()) / GIB, 2)
    return gib


def checkpoint_space(s: Shape, p_t: int, steps: int, save_every: int, ema: bool, keep: bool) -> dict:
    """Disk of one training point's checkpoints and final weights (module docstring, "Checkpoint space")."""
    per_param = {"weights_bf16": 2 * s.params, "master_and_adam_fp32": 12 * p_t, "ema_fp32": 4 * p_t if ema else 0}
    save = sum(per_param.values())
    n = steps // save_every if save_every > 0 else 0  # saves the run writes
    at_peak = min(n - 1, KEEP_LAST) + 1 if n else 0  # the published ones plus the one being written
    kept = min(n, KEEP_LAST) if keep else 0
    final = 2 * s.params
    return {"formula": "save = 2 P (bf16 weights) + 12 P_t (fp32 master + Adam m, v)" + (" + 4 P_t (fp32 EMA)"
                                                                                         if ema else ""),
            "save_gb": round(save / 1e9, 1), "parts_gb": {k: round(v / 1e9, 1) for k, v in per_param.items()},
            "saves": n, "saves_at_peak": at_peak, "kept_after": kept, "final_gb": round(final / 1e9, 1),
            "peak_gb": round((at_peak * save + final) / 1e9, 1), "after_gb": round((kept * save + final) / 1e9, 1)}


# ---------------------------------------------------------------------------------------------------- evaluation
def gen_tokens_per_prompt(ev) -> tuple[float, str]:
    """Tokens an evaluator decodes per prompt (its whole budget: an upper bound) and where the number comes from:
    its own ``gen_tokens_per_prompt()`` (harness.evals), else the first budget its ``Args`` set."""
    if not ev.spec.generates:
        return 0, "no decoding"
    if hasattr(ev, "gen_tokens_per_prompt"):
        return ev.gen_tokens_per_prompt()
    for field in ("gen_tokens", "max_new_tokens", "max_gen"):
        n = int(getattr(ev.args, field, 0) or 0)
        if n > 0:
            return n, field
    return 0, "generates, budget unknown: not counted"


def eval_point(s: Shape, L: int, prompts: int, gen: float, generates: bool, gpu: str, mfu: float,
               node_gpus: int, itemsize: int = 2, gpus: int | None = 0) -> dict:
    """Memory, GPUs and time of ``prompts`` inputs of ``L`` tokens (the module docstring's formulas). ``gpus``: the
    GPUs one replica spans (``harness.evals.replica_gpus``, the rule ``run.py`` places the model by; 0 = computed
    here by the same rule; None: no number of GPUs holds it)."""
    m = memory.eval_memory(s.memory_shape(), L, itemsize=itemsize, generates=generates,
                           gen_tokens=math.ceil(gen))
    if gpus == 0:
        gpus = memory.replica_gpus(s.memory_shape(), L, itemsize, generates, GPU_MEMORY_GIB[gpu] * memory.GIB)
    flops = prompts * L * (2 * s.matmul_params + 4 * s.layers * s.heads * s.head_dim * L)
    prefill_s = flops / (mfu * GPU_PEAK_BF16[gpu])
    read = (m["weights"] + memory.kv_cache_bytes(s.memory_shape(), L, itemsize)) if generates else 0
    decode_s = prompts * gen * read / (GPU_HBM_BYTES_PER_S[gpu] * ASSUMED_DECODE_EFFICIENCY)
    g = gpus or 1
    replicas = max(1, node_gpus // g)
    return {"prompts": prompts, "gen_tokens_per_prompt": gen, "generated_tokens": round(prompts * gen),
            "memory_gib": {k: round(v / memory.GIB, 2) for k, v in m.items() if k != "decode_read"},
            "peak_gib": round(m["total"] / memory.GIB, 2), "gpus_needed": gpus,
            "model_parallel": gpus is None or gpus > 1, "replicas": replicas, "flops": flops,
            "prefill_gpu_hours": prefill_s * g / 3600, "decode_gpu_hours": decode_s * g / 3600,
            "gpu_hours": (prefill_s + decode_s) * g / 3600, "wall_hours": (prefill_s + decode_s) / replicas / 3600}


def eval_plan(cfg, s: Shape, limit: int | None, gpu: str = "A100", mfu: float = ASSUMED_MFU,
              node_gpus: int = DEFAULT_NODE_GPUS) -> dict:
    """Per suite entry (a unit of the evaluation plan, ``harness.evals.suite.plan``: the entry whole), its prompts,
    tokens, memory, GPUs per replica and GPU-hours at every length."""
    lengths = [int(L) for L in (OmegaConf.to_container(cfg.eval, resolve=True).get("lengths") or [])]
    itemsize = 4 if str(cfg.model.get("dtype", "bfloat16")) == "float32" else 2
    out = {}
    for unit in plan_units(Suite.of(cfg)):
        key, node, ev = unit.entry, unit.node, unit.view
        name = (node or {}).get("name") or key
        prompts, basis = ev.count_prompts(lengths, limit)  # the evaluator's own cost model (harness.evals)
        gen, gen_basis = gen_tokens_per_prompt(ev)
        generates = ev.spec.generates
        # the GPUs per replica at each length: the rule run.py places the model by (harness.pipeline.placement)
        gpus_at = replica_gpus(ev, lengths, limit, s.memory_shape(), itemsize, GPU_MEMORY_GIB[gpu] * memory.GIB)
        per = {L: eval_point(s, L, n, gen, generates, gpu, mfu, node_gpus, itemsize, gpus_at.get(int(L), 0))
               for L, n in prompts.items()}
        gpus = [p["gpus_needed"] for p in per.values()]
        out[key] = {"evaluator": name, "prompts": sum(prompts.values()),
                    "prompt_tokens": sum(L * n for L, n in prompts.items()),
                    "flops": sum(p["flops"] for p in per.values()), "basis": basis, "generates": generates,
                    "gen_tokens_per_prompt": gen, "gen_basis": gen_basis,
                    "generated_tokens": sum(p["generated_tokens"] for p in per.values()),
                    "prefill_gpu_hours": round(sum(p["prefill_gpu_hours"] for p in per.values()), 2),
                    "decode_gpu_hours": round(sum(p["decode_gpu_hours"] for p in per.values()), 2),
                    "gpu_hours": round(sum(p["gpu_hours"] for p in per.values()), 2),
                    "wall_hours": round(sum(p["wall_hours"] for p in per.values()), 2),
                    "peak_gib": max([p["peak_gib"] for p in per.values()] or [0]),
                    "max_gpus_needed": None if None in gpus else max(gpus or [1]),
                    "lengths": per}
    return out


# ---------------------------------------------------------------------------------------------------- throughput
def measured_mfu(bench: dict | None, method: str, T: int) -> tuple[float, str] | None:
    if not bench or bench.get("mode") != "gpu":
        return None
    rows = [r for r in bench.get("train") or [] if r.get("status") == "ok" and r.get("mfu")]
    # the method's own training step where the bench measured it (LongLoRA's shifted sparse attention), else base's
    rows = [r for r in rows if r["method"] == method] or [r for r in rows if r["method"] == "base"]
    if not rows:
        return None
    r = min(rows, key=lambda r: (abs(math.log(r["tokens"] / T)), r["backend"] != "flex"))
    dev = (bench.get("device") or {}).get("name")
    return float(r["mfu"]), (f"MEASURED: results/bench_gpu.json, {r['method']} ({r['backend']}) training step at "
                             f"{r['tokens']} tokens, {bench['model']['layers']} layers, on {dev}")


def load_bench(path: str | Path | None = None) -> dict | None:
    p = Path(path) if path else ROOT / "results" / "bench_gpu.json"
    return json.loads(p.read_text()) if p.is_file() else None


@dataclass
class PlanArgs:
    gpu: str = "A100"  # GPU whose peak FLOP/s, memory and bandwidth the plan uses
    mfu: float = 0.0  # 0 = measured (results/bench_gpu.json) or ASSUMED_MFU
    bench: str = ""  # path of a bench_gpu.json ("" = results/bench_gpu.json)
    node_gpus: int = 0  # GPUs of the node a point runs on (0 = the launcher's, else DEFAULT_NODE_GPUS)


def point_plan(cfg, args: PlanArgs | None = None) -> dict:
    """The plan of one composed run config (one sweep point)."""
    args = args or PlanArgs()
    s = model_shape(cfg)
    t = to_args(TrainArgs, cfg.train, f"train={cfg.train.get('name')}")
    method = build_method(cfg.method)

    native = int(cfg.model.native_ctx)
    limit = method_limit(method, native)  # as run.py's placement reads it
    peak = GPU_PEAK_BF16[args.gpu]
    row: dict = {"row": OmegaConf.select(cfg, "study.row") or method.name, "method": method.name,
                 "model": cfg.model.name, "params": s.params, "eval_limit": limit}
    bench = load_bench(args.bench or None)
    T = int(t.seq_len) if t.enabled else native
    mm = measured_mfu(bench, method.name, T) if not args.mfu else None
    assumed = (ASSUMED_MFU, f"ASSUMPTION: MFU {ASSUMED_MFU} (no results/bench_gpu.json from a GPU)")
    mfu, mfu_source = mm if mm else ((args.mfu, "given (--mfu)") if args.mfu else assumed)
    row["throughput"] = {"mfu": mfu, "source": mfu_source, "gpu": args.gpu, "peak_bf16_flops": peak}
    if t.enabled:
        p_t, n_t = trained_params(cfg, s)
        steps = t.steps()
        tokens = steps * t.global_batch * t.seq_len
        t_att = method.attention_keys(t.seq_len)
        f = train_flops_per_token(s, n_t, t_att)
        gpu_h = tokens * f / (mfu * peak) / 3600
        mem = memory_per_rank(s, p_t, t.world_size, t.micro_batch, t.seq_len, t.grad_checkpointing, t.ema,
                              t.offload, t.sequence_parallel, t.logits_tile_mib, t.mlp_tiles)
        row["train"] = {"seq_len": t.seq_len, "tokens": tokens, "steps": steps, "global_batch": t.global_batch,
                        "world_size": t.world_size, "sequence_parallel": t.sequence_parallel,
                        "micro_batch": t.micro_batch, "trained_params": p_t,
                        "zero_stage": t.zero_stage, "grad_checkpointing": t.grad_checkpointing,
                        "flops_per_token": f, "gpu_hours": round(gpu_h, 1),
                        "wall_hours": round(gpu_h / max(1, t.world_size), 1),
                        "memory_gib_per_rank": mem, "fits": mem["total"] <= GPU_MEMORY_GIB[args.gpu],
                        "checkpoints": checkpoint_space(s, p_t, steps, t.save_every, t.ema, t.keep_checkpoints)}
    else:
        row["train"] = None
    node = args.node_gpus or DEFAULT_NODE_GPUS
    ev = eval_plan(cfg, s, limit, args.gpu, mfu, node)
    row["throughput"].update(hbm_bytes_per_s=GPU_HBM_BYTES_PER_S[args.gpu],
                             decode_efficiency=ASSUMED_DECODE_EFFICIENCY, node_gpus=node,
                             usable_memory=ASSUMED_USABLE_MEMORY)
    row["eval"] = ev
    row["eval_gpu_hours"] = round(sum(v["gpu_hours"] for v in ev.values()), 1)
    row["eval_decode_gpu_hours"] = round(sum(v["decode_gpu_hours"] for v in ev.values()), 1)
    row["eval_wall_hours"] = round(sum(v["wall_hours"] for v in ev.values()), 1)
    row["gpu_hours"] = round((row["train"] or {}).get("gpu_hours", 0) + row["eval_gpu_hours"], 1)
    row["wall_hours"] = round((row["train"] or {}).get("wall_hours", 0) + row["eval_wall_hours"], 1)
    return row


PAPER_BUDGET = ("Lu et al. 2024 say only that fine-tuning used '8 NVIDIA A100 GPUs' (Sec. 4 and App. 9.2) and that "
                "they were 'limited by computing budget' (Sec. 7); no GPU-hours, wall-clock times or throughput are "
                "reported, so the estimate cannot be checked against the paper, only against the 8-GPU node.")


def node_gpus(launcher: dict | None) -> int:
    """GPUs one job holds: the launcher's ``gpus_per_node`` x ``nodes``, else the paper's 8-GPU node."""
    return int((launcher or {}).get("gpus_per_node") or DEFAULT_NODE_GPUS) * int((launcher or {}).get("nodes") or 1)


def model_parallel(rows: list[dict]) -> list[dict]:
    """Every (evaluator, length) of the sweep whose input needs more than one GPU (or fits on none), once."""
    seen: dict = {}
    for r in rows:
        for key, v in r["eval"].items():
            for L, p in v["lengths"].items():
                if p["model_parallel"] and (key, L) not in seen:
                    seen[(key, L)] = {"evaluator": key, "length": L, "gpus_needed": p["gpus_needed"],
                                      "peak_gib": p["peak_gib"]}
    return sorted(seen.values(), key=lambda x: (x["evaluator"], x["length"]))


def sweep_summary(rows: list[dict], launcher: dict | None) -> dict:
    gpus = node_gpus(launcher)
    train_h = sum((r["train"] or {}).get("gpu_hours", 0) for r in rows)
    eval_h = sum(r["eval_gpu_hours"] for r in rows)
    wall = sum(r["wall_hours"] for r in rows)
    out = {"points": len(rows), "train_gpu_hours": round(train_h, 1), "eval_gpu_hours": round(eval_h, 1),
           "eval_decode_gpu_hours": round(sum(r["eval_decode_gpu_hours"] for r in rows), 1),
           "eval_wall_hours": round(sum(r["eval_wall_hours"] for r in rows), 1),
           "gpu_hours": round(train_h + eval_h, 1), "gpus_per_job": gpus, "wall_hours": round(wall, 1),
           "node_hours_held": round(wall, 1), "gpu_hours_held": round(wall * gpus, 1),
           "days_on_one_node": round(wall / 24, 1), "model_parallel": model_parallel(rows), "paper": PAPER_BUDGET,
           "checkpoint_peak_gb": round(sum(((r["train"] or {}).get("checkpoints") or {}).get("peak_gb", 0)
                                           for r in rows), 1),
           "checkpoint_after_gb": round(sum(((r["train"] or {}).get("checkpoints") or {}).get("after_gb", 0)
                                            for r in rows), 1)}
    if launcher:
        per_attempt = int(launcher.get("timeout_min") or 0) / 60
        attempts = 1 + int(launcher.get("max_num_timeout") or 0)
        out["timeout_hours_per_attempt"] = per_attempt
        out["points_needing_requeues"] = [
            {"row": r["row"], "wall_hours": r["wall_hours"], "attempts": math.ceil(r["wall_hours"] / per_attempt)}
            for r in rows if per_attempt and r["wall_hours"] > per_attempt]
        out["points_over_all_attempts"] = [r["row"] for r in rows
                                           if per_attempt and r["wall_hours"] > per_attempt * attempts]
    return out



# ---------------------------------------------------------------------------------------------------- one run's cost
# A run's cost before it starts (``check_cost``, called by ``harness.api.run`` after the config is checked and
# before the model loads): the prompts each evaluator builds per length (its own ``count_prompts``, the upper bound
# ``plan`` uses) and the tokens it decodes (``gen_tokens_per_prompt``), turned into FLOPs with the formulas above
# (prefill 2N + 4 l h q L per prompt token; a decoded token at the same rate at length L), plus the fine-tune's
# tokens x ``train_flops_per_token``, divided by what THIS device does: a bf16 / fp32 matmul timed once per process
# (``device_flops``) times ``ASSUMED_MODEL_EFFICIENCY``, plus ``ASSUMED_CALL_OVERHEAD_S`` per layer per forward call.
# The limit (``cost.limit_s``) is compared with the evaluation's estimate, the suite's cost; the fine-tune's is printed
# beside it (its recipe, ``train=``, is its budget). Not modelled: the approximate-attention methods' CPU reference
# loops (``attention.backend=reference``), several times slower than SDPA on a small model (Self-Extend, Landmark).
ASSUMED_MODEL_EFFICIENCY = 0.25  # ASSUMPTION: share of the timed matmul rate a model's forward reaches (from the
#   idle throughputs of /work/shared/notes/environment.md on this CPU, 2468 GFLOP/s bf16: SmolLM2's 16k-token forward
#   in 28 s ~0.33, the 5M tiny model at 1024 tokens ~0.18; SmolLM2 on eval=cpu, nice'd, with the machine at load ~13
#   from other jobs, took 0.43x its estimate: PPL 0.30x, passkey 0.45x)
ASSUMED_CALL_OVERHEAD_S = 0.002  # ASSUMPTION: seconds of framework overhead per layer per forward call (CPU)
DEFAULT_COST_LIMIT_S = 14400.0  # cost.limit_s when the config has none
_FLOPS: dict = {}


def device_flops(device, dtype) -> float:
    """FLOP/s of a 2048^3 matmul in ``dtype`` on ``device``: the best of repeated calls over about 0.3 s after a
    warm-up, timed once per process (on a shared machine it reflects the share this process gets now)."""
    import time

    import torch

    key = (str(device), str(dtype))
    if key not in _FLOPS:
        n = 2048
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
        a @ b
        sync()
        best, start = float("inf"), time.perf_counter()
        while time.perf_counter() - start < 0.3 or best == float("inf"):
            t0 = time.perf_counter()
            a @ b
            sync()
            best = min(best, time.perf_counter() - t0)
        _FLOPS[key] = 2 * n ** 3 / max(best, 1e-9)
    return _FLOPS[key]


@functools.cache
def _gguf_config(path: str, gguf: str) -> dict:
    """A GGUF checkpoint's config (transformers reads the whole file's metadata: seconds), once per process."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, gguf_file=gguf).to_dict()


def run_shape(cfg, config=None) -> Shape:
    """The model's shape: ``config`` (a loaded model's config, as a dict), else the checkpoint the model config
    names (its folder, its GGUF file, a hub id in the local cache), else the shape its model YAML declares."""
    if config is None:
        name = cfg.model.get("name")
        try:
            cls, args = MODELS.args(cfg.model, f"model={name}", name=cfg.model.get("builder") or name)
            path, gguf = cls.source(args) if hasattr(cls, "source") else (args.path, args.gguf_file)
        except Exception:  # noqa: BLE001 - an unknown builder: the plan's own lookup below
            path, gguf = "", ""
        if gguf:
            config = _gguf_config(str(path), str(gguf))
        elif path and (Path(path) / "config.json").is_file():
            config = json.loads((Path(path) / "config.json").read_text())
    if config is None:
        return model_shape(cfg)
    c = config
    return Shape(c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["num_attention_heads"],
                 c.get("num_key_value_heads") or c["num_attention_heads"],
                 c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], c["vocab_size"], 3,
                 bool(c.get("tie_word_embeddings")))


def run_cost(cfg, units, method, config=None, device=None) -> dict:
    """The estimated cost of one run (the comment above) that evaluates ``units`` (``harness.evals.suite.plan``'s:
    all of a suite, or a sharded job's): per suite entry and length the prompts, prompt tokens, generated tokens and
    seconds; the fine-tune's tokens and seconds; the device rate it rests on."""
    import torch

    s = run_shape(cfg, config)
    dev = device or resolve_device(str(cfg.get("device", "auto")))
    autocast = str(cfg.get("autocast", "auto"))
    bf16 = autocast == "bfloat16" or (autocast == "auto" and (dev.type == "cuda" or _cpu_bf16()))
    dtype = torch.bfloat16 if bf16 else torch.float32
    rate = device_flops(dev, dtype) * ASSUMED_MODEL_EFFICIENCY
    lengths = [int(L) for L in (OmegaConf.to_container(cfg.eval, resolve=True).get("lengths") or [])]
    c = int(cfg.model.native_ctx)
    try:
        limit = method.max_length(type("H", (), {"native_ctx": c})())
    except Exception:  # noqa: BLE001 - a limit that needs the loaded model: count every length
        limit = None
    per_call = ASSUMED_CALL_OVERHEAD_S * s.layers
    attn = 4 * s.layers * s.heads * s.head_dim
    entries, total = {}, 0.0
    for unit in units:
        prompts, _ = unit.view.count_prompts(lengths, limit)
        gen, _ = gen_tokens_per_prompt(unit.view)
        rows = entries.setdefault(unit.entry, {})
        for L, n in prompts.items():
            L, n = int(L), int(n)
            flops = n * L * (2 * s.matmul_params + attn * L) + n * gen * (2 * s.matmul_params + attn * L)
            sec = flops / rate + n * (1 + gen) * per_call
            rows[L] = {"prompts": n, "prompt_tokens": n * L, "generated_tokens": int(n * gen), "flops": flops,
                       "seconds": sec}
            total += sec
    train = None
    t = to_args(TrainArgs, cfg.train, f"train={cfg.train.get('name')}")
    if t.enabled:
        tokens = t.steps() * t.global_batch * t.seq_len
        _, n_t = trained_params(cfg, s)
        flops = tokens * train_flops_per_token(s, n_t, method.attention_keys(t.seq_len))
        sec = flops / rate + t.steps() * 3 * per_call * max(1, t.global_batch // max(1, t.micro_batch))
        train = {"tokens": tokens, "flops": flops, "seconds": sec}
        total += sec
    return {"entries": entries, "train": train, "seconds": total, "device": str(dev), "dtype": str(dtype)[6:],
            "model_flops_per_s": rate, "native_ctx": c}


def _cpu_bf16() -> bool:
    return bool(fast_bf16_cpu())


def _dur(sec: float) -> str:
    return f"{sec:.0f} s" if sec < 120 else f"{sec / 60:.0f} min" if sec < 7200 else f"{sec / 3600:.1f} h"


def cost_lines(est: dict) -> list[str]:
    """The estimate as a few lines: one per suite entry (lengths in units of C, prompts, tokens, time)."""
    c = est["native_ctx"]
    out = [f"cost estimate on {est['device']} ({est['dtype']}, {est['model_flops_per_s'] / 1e9:.0f} GFLOP/s = a "
           f"matmul timed now x ASSUMED efficiency {ASSUMED_MODEL_EFFICIENCY}): about {_dur(est['seconds'])}"]
    if est["train"]:
        out.append(f"  fine-tune: {est['train']['tokens']:,} tokens, ~{_dur(est['train']['seconds'])}")
    for key, rows in est["entries"].items():
        if not rows:
            continue
        lens = ",".join(f"{L / c:g}" for L in rows)
        n = sum(r["prompts"] for r in rows.values())
        tok = sum(r["prompt_tokens"] for r in rows.values())
        gen = sum(r["generated_tokens"] for r in rows.values())
        sec = sum(r["seconds"] for r in rows.values())
        out.append(f"  {key}: lengths {lens} x C, {n} prompts, {tok:,} tokens to prefill, {gen:,} to generate, "
                   f"~{_dur(sec)}")
    return out


def check_cost(cfg, units, method, config=None, log=None) -> dict:
    """Estimate the cost of a run that evaluates ``units`` (:func:`run_cost`), print it, and refuse (one
    ``ConfigError`` line) a run whose evaluation is estimated beyond ``cost.limit_s`` seconds (0 = no limit), before
    the model loads. Returns the estimate."""
    import sys

    limit = OmegaConf.select(cfg, "cost.limit_s", default=DEFAULT_COST_LIMIT_S)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0:
        raise ConfigError(f"cost.limit_s: {limit!r} is not a number of seconds (valid: >= 0; 0 = no limit)")
    est = run_cost(cfg, units, method, config)
    for line in cost_lines(est):
        (log or (lambda m: print(m, file=sys.stderr, flush=True)))(line)
    ev = est["seconds"] - (est["train"] or {}).get("seconds", 0)
    if limit and ev > limit:
        raise ConfigError(f"cost: this run's evaluation is estimated at {_dur(ev)} on {est['device']}, beyond "
                          f"cost.limit_s={limit:g} ({_dur(limit)}); use a smaller suite (fewer lengths or samples: "
                          f"eval=cpu on a real model) or raise the limit (cost.limit_s=<seconds>, 0 = none)")
    return est
