"""How far CLEX's learned ODE has moved the RoPE frequencies from its initialisation (NTK-aware scaling with
alpha = 2t - 1), for fine-tuned checkpoints; and the training loss of their rows. Evidence for docs/recipe.md
("CLEX and the recipe's learning rate").

    python scripts/probes/clex_drift.py outputs/<run>/checkpoint [more checkpoints ...]
    python scripts/probes/clex_drift.py --sensitivity   # drift per unit of |W_down| on the shipped model, no checkpoint

For each checkpoint: max and mean over the RoPE pairs of |log theta(t) - log theta_NTK(t)| at t = 2, 4, 8, 16, 32
(the ODE integrated exactly as inference does, ``harness.methods.clex``), the largest |W_down| entry, and the mean
training loss per 16 steps from the row next to the checkpoint (``run.json``). ``--sensitivity`` sets every W_down
entry to +-s (random signs, seed 0) for a few s and prints the same drift: Adam moves each parameter by about the
learning rate per step, so s ~ lr x steps says how many steps of a recipe move the frequencies how far.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

TS = (2, 4, 8, 16, 32)


def module_for(model_dir: str | None):
    from harness.methods import build_method
    from harness.models import load_model

    handle = load_model("tiny_llama")
    if model_dir:
        handle.info["path"] = model_dir
    method = build_method({"name": "clex"})
    method.apply(handle)
    m = handle.model.get_decoder().rotary_emb
    m.exact_ode = True
    return m


def drift(m) -> dict:
    out = {}
    m._grid = None
    for t in TS:
        d = (torch.log(m.theta(t)) - m.ntk(t)[0]).abs()
        out[t] = (round(float(d.max()), 3), round(float(d.mean()), 3))
    return out


def losses(ckpt: Path) -> list[float] | None:
    run = ckpt.parent / "run.json"
    if not run.exists():
        return None
    row = json.loads(run.read_text())
    ls = (row.get("train_info") or {}).get("losses")
    return [round(statistics.mean(ls[i:i + 16]), 2) for i in range(0, len(ls), 16)] if ls else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", nargs="*")
    ap.add_argument("--sensitivity", action="store_true")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    if a.sensitivity:
        m = module_for(None)
        signs = torch.sign(torch.randn(m.ode_down_proj.shape, generator=torch.Generator().manual_seed(0)))
        for s in (0.0, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2):
            with torch.no_grad():
                m.ode_down_proj.copy_(signs * s)
            print(f"|W_down| = {s:g}: max / mean |dlog theta| at t = " +
                  ", ".join(f"{t}: {mx} / {mn}" for t, (mx, mn) in drift(m).items()), flush=True)
    for c in a.checkpoints:
        m = module_for(c)
        if not m.ode_down_proj.any():
            print(f"{c}: no trained CLEX parameters (W_down is zero)")
            continue
        print(f"{c}: max |W_down| {float(m.ode_down_proj.detach().abs().max()):.4g}; max / mean |dlog theta| at t = " +
              ", ".join(f"{t}: {mx} / {mn}" for t, (mx, mn) in drift(m).items()))
        ls = losses(Path(c))
        if ls:
            print(f"  training loss, mean per 16 steps: {ls}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
