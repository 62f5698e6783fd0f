"""Cost plan of a sweep before a cluster run: per sweep point, memory per rank under ZeRO-3 at the training length,
tokens to train, per evaluator and length the peak memory of one input and the GPUs it needs (model parallel when
more than one), prompt and generated tokens, GPU-hours from a stated throughput (``harness/plan.py`` has the formulas
and every assumption).

    python scripts/plan.py experiment=paper_llama2 hydra/launcher=slurm_a100      # the Table-1 sweep
    python scripts/plan.py experiment=paper_llama2 --gpu H100 --mfu 0.4           # another GPU / throughput
    python scripts/plan.py experiment=entropy_abf --json results/plan_entropy_abf.json

The points are the ones ``python run.py -m <same overrides>`` would launch (Hydra's sweeper, ``harness/sweeps.py``);
each is composed exactly as run.py composes it. Throughput: the MFU measured by ``make bench-gpu``
(``results/bench_gpu.json``) when that file exists, else an assumption that every output labels as such.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from omegaconf import OmegaConf

from harness import plan, sweeps
from harness.config import ConfigError
from harness.evals import longbench, manyshot_trec, ppl
from harness.results import atomic_write_json
from harness.submit import job_ckpt_dir

ROOT = Path(__file__).resolve().parents[2]


def build(overrides: list[str], args: plan.PlanArgs, job_ckpt: bool = False) -> dict:
    """The plan of every sweep point. ``job_ckpt``: with a launcher, where a submitted job's checkpoints would go
    (its setup line evaluated by bash, ``harness.submit.job_ckpt_dir``); else the composed ``paths.ckpt_dir``."""
    jobs = sweeps.expand(overrides)
    rows, launcher, ckpt_dir = [], None, None
    for job in jobs:
        cfg = sweeps.compose(job, with_hydra=True)
        if launcher is None and any(o.startswith("hydra/launcher=") for o in overrides):
            launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
            ckpt_dir = cluster_ckpt_dir(cfg) if job_ckpt else None
        if not args.node_gpus:
            args = dataclasses.replace(args, node_gpus=plan.node_gpus(launcher))
        rows.append({"overrides": [o for o in job if not o.startswith("hydra")], **plan.point_plan(cfg, args)})
    return {"command": "python scripts/plan.py " + " ".join(overrides), "gpu": args.gpu, "points": rows,
            "ckpt_dir": ckpt_dir or str(sweeps.compose(jobs[0]).paths.ckpt_dir),
            "summary": plan.sweep_summary(rows, launcher),
            "assumptions": {"ASSUMED_MFU": plan.ASSUMED_MFU, "ASSUMED_DOC_TOKENS": ppl.ASSUMED_DOC_TOKENS,
                            "ASSUMED_DECODE_EFFICIENCY": plan.ASSUMED_DECODE_EFFICIENCY,
                            "ASSUMED_USABLE_MEMORY": plan.ASSUMED_USABLE_MEMORY,
                            "ASSUMED_LONGBENCH_SAMPLES": longbench.ASSUMED_SAMPLES,
                            "ASSUMED_TREC_ITEMS": manyshot_trec.ASSUMED_ITEMS,
                            "ASSUMED_TOKENS_PER_SHOT": manyshot_trec.ASSUMED_TOKENS_PER_SHOT}}


def cluster_ckpt_dir(cfg) -> str:
    """Where a submitted job's checkpoints go (``harness.submit.job_ckpt_dir``), or the line that refuses it."""

    setup = OmegaConf.to_container(cfg.hydra.launcher, resolve=True).get("setup") or []
    try:
        return str(job_ckpt_dir(cfg, list(setup)))
    except ConfigError as e:
        return f"REFUSED at submission: {e}"


def show_checkpoints(con, p: dict) -> None:
    """Per training point: one save, the saves held at the peak, the final weights, peak and after the run."""
    from rich.table import Table

    trained = [r for r in p["points"] if r["train"]]
    if not trained:
        return
    first = trained[0]["train"]["checkpoints"]
    t = Table(title="checkpoint space per training point (GB = 1e9 bytes; paths.ckpt_dir + the run directory)")
    for col in ("point", "save GB", "saves", "at peak", "final GB", "peak GB", "after run GB"):
        t.add_column(col, justify="left" if col == "point" else "right")
    for r in trained:
        c = r["train"]["checkpoints"]
        t.add_row(r["row"], f"{c['save_gb']:.1f}", str(c["saves"]), str(c["saves_at_peak"]), f"{c['final_gb']:.1f}",
                  f"{c['peak_gb']:.1f}", f"{c['after_gb']:.1f}")
    con.print(t)
    con.print(f"  {first['formula']}; peak = {plan.KEEP_LAST} kept saves + 1 being written (temporary) + the final "
              f"bf16 weights 2 P; P = all parameters, P_t = trained ones")
    s = p["summary"]
    con.print(f"checkpoints: {p['ckpt_dir']}; the sweep's points at once: {s['checkpoint_peak_gb']:,.0f} GB at the "
              f"peak, {s['checkpoint_after_gb']:,.0f} GB left after it (train.keep_checkpoints=true keeps "
              f"{plan.KEEP_LAST} saves per point)")


def points_table(p: dict):
    """One line per sweep point: training length, tokens, steps, memory per rank, GPU-hours and wall hours."""
    from rich.table import Table

    t = Table(title=f"{p['command']}  (GPU: {p['gpu']})")
    for col in ("point", "train T", "tokens", "steps", "mem/rank GiB (state / activations)", "fits",
                "train GPU-h", "eval prompt tokens", "eval GPU-h (decode)", "eval wall h", "GPU-h", "wall h"):
        t.add_column(col, justify="left" if col == "point" else "right")
    for r in p["points"]:
        tr = r["train"]
        if tr:
            m = tr["memory_gib_per_rank"]
            state = sum(m[k] for k in ("parameters", "gradients", "optimizer", "ema", "gathered_parameters"))
            act = sum(v for k, v in m.items() if k.startswith("activations."))
            sp = tr.get("sequence_parallel", 1)
            cells = [f"{tr['seq_len']}" + (f" (SP {sp})" if sp > 1 else ""), f"{tr['tokens'] / 1e9:.2f}B",
                     str(tr["steps"]),
                     f"{m['total']:.1f} ({state:.1f} / {act:.1f})", "yes" if tr["fits"] else "NO",
                     f"{tr['gpu_hours']:.0f}"]
        else:
            cells = ["frozen", "-", "-", "-", "-", "0"]
        ev_tokens = sum(v["prompt_tokens"] for v in r["eval"].values())
        t.add_row(r["row"], *cells, f"{ev_tokens / 1e6:.0f}M",
                  f"{r['eval_gpu_hours']:.0f} ({r['eval_decode_gpu_hours']:.0f})", f"{r['eval_wall_hours']:.0f}",
                  f"{r['gpu_hours']:.0f}", f"{r['wall_hours']:.0f}")
    return t


def show(p: dict) -> None:
    from rich.console import Console

    con = Console(width=160)
    con.print(points_table(p))
    first = p["points"][0]
    tp = first["throughput"]
    con.print(f"throughput: {tp['source']}; peak {tp['peak_bf16_flops']:.3g} FLOP/s ({p['gpu']} bf16 dense); decoding "
              f"memory-bound at {tp['hbm_bytes_per_s'] / 1e12:.2f} TB/s HBM x ASSUMPTION efficiency "
              f"{tp['decode_efficiency']}; evaluation spread over the node's {tp['node_gpus']} GPUs (data-parallel "
              f"replicas of the GPUs one input needs)")
    show_memory(con, p)
    show_checkpoints(con, p)
    con.print("evaluation of the first point, per evaluator (generated tokens: every prompt's whole budget, an upper "
              "bound):")
    for k, v in first["eval"].items():
        con.print(f"  {k}: {v['prompts']:,} prompts, {v['prompt_tokens'] / 1e6:,.1f}M prompt tokens "
                  f"({v['basis']}); {v['generated_tokens']:,} generated ({v['gen_tokens_per_prompt']:.4g} per prompt, "
                  f"{v['gen_basis']}); {v['gpu_hours']:.0f} GPU-h (decode {v['decode_gpu_hours']:.0f}), "
                  f"wall {v['wall_hours']:.1f} h")
    tr = next((r["train"] for r in p["points"] if r["train"]), None)
    if tr:
        con.print(f"memory per rank of a {tr['seq_len']}-token point: "
                  + ", ".join(f"{k} {v}" for k, v in tr["memory_gib_per_rank"].items()))
    s = p["summary"]
    con.print(f"sweep: {s['points']} points, {s['gpu_hours']:,.0f} GPU-hours of compute (training "
              f"{s['train_gpu_hours']:,.0f}, evaluation {s['eval_gpu_hours']:,.0f} of which decoding "
              f"{s['eval_decode_gpu_hours']:,.0f}); wall {s['wall_hours']:,.0f} h (evaluation "
              f"{s['eval_wall_hours']:,.0f}) = {s['days_on_one_node']} days of one {s['gpus_per_job']}-GPU node "
              f"({s['gpu_hours_held']:,.0f} GPU-hours held)")
    if s["model_parallel"]:
        con.print("  model parallel (one input spans several GPUs, device_map): " + ", ".join(
            f"{x['evaluator']} at {x['length']} ({x['gpus_needed'] or 'no number of'} GPUs, {x['peak_gib']} GiB)"
            for x in s["model_parallel"]))
    if s.get("points_needing_requeues"):
        con.print(f"  wall over one {s['timeout_hours_per_attempt']:.0f} h attempt (requeued, resumes): "
                  + ", ".join(f"{x['row']} ({x['wall_hours']} h, {x['attempts']} attempts)"
                              for x in s["points_needing_requeues"]))
    if s.get("points_over_all_attempts"):
        con.print(f"  [bold red]beyond every allowed attempt[/]: {', '.join(s['points_over_all_attempts'])}")
    con.print(f"paper: {s['paper']}")


def length_groups(lengths: dict) -> list[tuple[list[int], list[dict]]]:
    """Consecutive lengths needing the same number of GPUs, grouped (NIAH's 40-length grid stays readable)."""
    groups: list[tuple[list[int], list[dict]]] = []
    for L in sorted(lengths, key=int):
        p = lengths[L]
        if groups and groups[-1][1][-1]["gpus_needed"] == p["gpus_needed"] and len(lengths) > 8:
            groups[-1][0].append(int(L))
            groups[-1][1].append(p)
        else:
            groups.append(([int(L)], [p]))
    return groups


def show_memory(con, p: dict) -> None:
    """Per evaluator and length: peak memory of one input (weights / KV cache / prefill) and the GPUs it needs, for
    the point that evaluates the most lengths (the memory depends on the model and the length, not the method)."""
    from rich.table import Table

    widest = max(p["points"], key=lambda r: sum(len(v["lengths"]) for v in r["eval"].values()))
    t = Table(title=f"memory of one evaluation input ({p['gpu']}: {plan.GPU_MEMORY_GIB[p['gpu']]} GiB, ASSUMPTION "
                    f"{plan.ASSUMED_USABLE_MEMORY:.0%} usable; point {widest['row']})")
    for col in ("evaluator", "length", "peak GiB", "weights / KV cache / prefill GiB", "GPUs", "model parallel",
                "gen tokens / prompt", "GPU-h", "wall h"):
        t.add_column(col, justify="left" if col == "evaluator" else "right")
    for key, v in widest["eval"].items():
        for Ls, ps in length_groups(v["lengths"]):
            hi = ps[-1]["memory_gib"]
            span = str(Ls[0]) if len(Ls) == 1 else f"{Ls[0]}..{Ls[-1]} ({len(Ls)})"
            peak = f"{ps[-1]['peak_gib']:.1f}" if len(ps) == 1 else f"{ps[0]['peak_gib']:.1f}..{ps[-1]['peak_gib']:.1f}"
            g = ps[-1]["gpus_needed"]
            t.add_row(key, span, peak, f"{hi['weights']:.1f} / {hi['kv_cache']:.1f} / {hi['prefill']:.1f}",
                      str(g) if g else "none", "YES" if ps[-1]["model_parallel"] else "no",
                      f"{ps[-1]['gen_tokens_per_prompt']:.4g}", f"{sum(x['gpu_hours'] for x in ps):.1f}",
                      f"{sum(x['wall_hours'] for x in ps):.1f}")
    con.print(t)


def main(argv: list[str] | None = None) -> int:
    """cost plan of a sweep: memory per rank, tokens, GPU-hours, checkpoint space."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for run.py -m")
    ap.add_argument("--gpu", default="A100", choices=sorted(plan.GPU_PEAK_BF16))
    ap.add_argument("--mfu", type=float, default=0.0, help="use this MFU instead of measured / assumed")
    ap.add_argument("--bench", default="", help="a bench_gpu.json (default results/bench_gpu.json if present)")
    ap.add_argument("--node-gpus", type=int, default=0, help="GPUs per job (default: the launcher's, else 8)")
    ap.add_argument("--json", default="", help="also write the plan as JSON here")
    a = ap.parse_args(argv)
    p = build(a.overrides, plan.PlanArgs(gpu=a.gpu, mfu=a.mfu, bench=a.bench, node_gpus=a.node_gpus), job_ckpt=True)
    show(p)
    if a.json:
        atomic_write_json(a.json, p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
