"""Cost plan of a sweep before a cluster run: per sweep point, memory per rank under ZeRO-3 at the training length,
tokens to train, prompt tokens per evaluator, GPU-hours from a stated throughput (``harness/plan.py`` has the
formulas and every assumption).

    python scripts/plan.py experiment=paper_llama2 hydra/launcher=slurm_a100      # the Table-1 sweep
    python scripts/plan.py experiment=paper_llama2 --gpu H100 --mfu 0.4           # another GPU / throughput
    python scripts/plan.py experiment=entropy_abf --json results/plan_entropy_abf.json

The points are the ones ``python run.py -m <same overrides>`` would launch (Hydra's sweeper, ``harness/sweeps.py``);
each is composed exactly as run.py composes it. Throughput: the MFU measured by ``make bench-gpu``
(``results/bench_gpu.json``) when that file exists, else an assumption that every output labels as such.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

from harness import plan, sweeps
from harness.results import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]


def build(overrides: list[str], args: plan.PlanArgs) -> dict:
    jobs = sweeps.expand(overrides)
    rows, launcher = [], None
    for job in jobs:
        cfg = sweeps.compose(job, with_hydra=True)
        if launcher is None and any(o.startswith("hydra/launcher=") for o in overrides):
            launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
        rows.append({"overrides": [o for o in job if not o.startswith("hydra")], **plan.point_plan(cfg, args)})
    return {"command": "python scripts/plan.py " + " ".join(overrides), "gpu": args.gpu, "points": rows,
            "summary": plan.sweep_summary(rows, launcher),
            "assumptions": {"ASSUMED_MFU": plan.ASSUMED_MFU, "ASSUMED_DOC_TOKENS": plan.ASSUMED_DOC_TOKENS,
                            "ASSUMED_LONGBENCH_SAMPLES": plan.ASSUMED_LONGBENCH_SAMPLES,
                            "ASSUMED_TREC_ITEMS": plan.ASSUMED_TREC_ITEMS,
                            "ASSUMED_TOKENS_PER_SHOT": plan.ASSUMED_TOKENS_PER_SHOT}}


def show(p: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    t = Table(title=f"{p['command']}  (GPU: {p['gpu']})")
    for col in ("point", "train T", "tokens", "steps", "mem/rank GiB (state / activations)", "fits",
                "train GPU-h", "eval prompt tokens", "eval GPU-h", "GPU-h", "wall h"):
        t.add_column(col, justify="left" if col == "point" else "right")
    for r in p["points"]:
        tr = r["train"]
        if tr:
            m = tr["memory_gib_per_rank"]
            state = sum(m[k] for k in ("parameters", "gradients", "optimizer", "ema", "gathered_parameters"))
            act = sum(v for k, v in m.items() if k.startswith("activations."))
            cells = [str(tr["seq_len"]), f"{tr['tokens'] / 1e9:.2f}B", str(tr["steps"]),
                     f"{m['total']:.1f} ({state:.1f} / {act:.1f})", "yes" if tr["fits"] else "NO",
                     f"{tr['gpu_hours']:.0f}"]
        else:
            cells = ["frozen", "-", "-", "-", "-", "0"]
        ev_tokens = sum(v["prompt_tokens"] for v in r["eval"].values())
        t.add_row(r["row"], *cells, f"{ev_tokens / 1e6:.0f}M", f"{r['eval_gpu_hours']:.0f}", f"{r['gpu_hours']:.0f}",
                  f"{r['wall_hours']:.0f}")
    con.print(t)
    first = p["points"][0]
    con.print(f"throughput: {first['throughput']['source']}; peak {first['throughput']['peak_bf16_flops']:.3g} "
              f"FLOP/s ({p['gpu']} bf16 dense)")
    con.print("eval prompt tokens of the first point, per evaluator:")
    for k, v in first["eval"].items():
        con.print(f"  {k}: {v['prompts']:,} prompts, {v['prompt_tokens'] / 1e6:,.1f}M tokens, "
                  f"{v['gpu_hours']:.0f} GPU-h ({v['basis']})")
    tr = next((r["train"] for r in p["points"] if r["train"]), None)
    if tr:
        con.print(f"memory per rank of a {tr['seq_len']}-token point: "
                  + ", ".join(f"{k} {v}" for k, v in tr["memory_gib_per_rank"].items()))
    s = p["summary"]
    con.print(f"sweep: {s['points']} points, {s['gpu_hours']:,.0f} GPU-hours of compute (training "
              f"{s['train_gpu_hours']:,.0f}, evaluation {s['eval_gpu_hours']:,.0f}); wall {s['wall_hours']:,.0f} h = "
              f"{s['days_on_one_node']} days of one {s['gpus_per_job']}-GPU node ({s['gpu_hours_held']:,.0f} GPU-hours "
              f"held): evaluation runs on one GPU of the node unless sharded (+shard=, docs/sweeps.md)")
    if s.get("points_needing_requeues"):
        con.print(f"  wall over one {s['timeout_hours_per_attempt']:.0f} h attempt (requeued, resumes): "
                  + ", ".join(f"{x['row']} ({x['wall_hours']} h, {x['attempts']} attempts)"
                              for x in s["points_needing_requeues"]))
    if s.get("points_over_all_attempts"):
        con.print(f"  [bold red]beyond every allowed attempt[/]: {', '.join(s['points_over_all_attempts'])}")
    con.print(f"paper: {s['paper']}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for run.py -m")
    ap.add_argument("--gpu", default="A100", choices=sorted(plan.GPU_PEAK_BF16))
    ap.add_argument("--mfu", type=float, default=0.0, help="use this MFU instead of measured / assumed")
    ap.add_argument("--bench", default="", help="a bench_gpu.json (default results/bench_gpu.json if present)")
    ap.add_argument("--json", default="", help="also write the plan as JSON here")
    a = ap.parse_args(argv)
    p = build(a.overrides, plan.PlanArgs(gpu=a.gpu, mfu=a.mfu, bench=a.bench))
    show(p)
    if a.json:
        atomic_write_json(a.json, p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
