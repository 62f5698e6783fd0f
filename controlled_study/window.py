"""`make gpu-study` (``scripts/gpu_study.py``): a study advanced in short GPU windows, one command, nothing
downloaded. Default: ``experiment=smollm2_study`` (the real-model study, ``controlled_study/conf/experiment``).

    python scripts/gpu_study.py                       # run what fits in the window's budget
    python scripts/gpu_study.py --plan                # every cell, its estimated GPU seconds, the study's total
    python scripts/gpu_study.py --budget-s 600        # the budget (default: HARNESS_WINDOW_S, else 780 s, minus 90 s)
    python scripts/gpu_study.py experiment=tiny_study point=tiny_study/base,tiny_study/pi train.tokens=...

What it does, in order:

1. **Which cells are done**: the study's sweep points (``controlled_study.study.plan``: a point with an ``ok`` row of
   the same config hash in ``results/<study>/runs/`` is done, one whose convergence gate is outdated is not).
2. **Which cells matter most**: the study's findings (``controlled_study.findings.evaluate``) are read on the rows
   there are, and each cell counts the findings that name its row among their missing ones ("no rows: pi, ..."); the
   frozen base counts every finding with a part against the base. Cells run most findings unlocked first, then
   shortest first (more cells per window).
3. **What each cell costs**: its FLOPs (``harness.plan.run_cost``: every evaluator's prompts and decoded tokens, the
   fine-tune's tokens; the formulas ``make plan`` uses) over the rates measured on this device kind in earlier
   windows (``results/<study>/throughput.json``: per kind, evaluation and training FLOP/s as total FLOPs over total
   seconds of the cells measured, and the seconds per cell outside both), plus that overhead. A kind with no
   measured cell has a guess instead: ``harness.plan.ASSUMED_MFU`` of its dense bf16 peak (``GPU_PEAK_BF16``), or of
   this machine's timed matmul rate (``device_flops``) on a CPU, and the plan says "guess" beside every such number.
4. **What fits**: cells in that order whose estimate fits the budget left (a cell that does not fit is passed over,
   a later shorter one may still run).
5. **One worker process**: this one. Each model is loaded once (``harness.models.build_model``); every cell gets a
   fresh copy (``copy.deepcopy``) and runs the stages of ``run.py`` on it (``harness.api.run``: the method applied,
   fine-tuned when its recipe says so, evaluated, one row written as it finishes, under the same lock ``make study``
   takes). The flex kernels compile once per process for every method (``harness.methods.flex``: a fallback to the
   unfused kernel is an error). Training checkpoints every ``train.save_every`` steps and at least every
   ``train.save_every_s`` seconds (60 in ``train=smollm2``); a cell's run directory is
   ``<paths.output_dir>/gpu_study/<config hash>``, so a cell cut off mid-way and started again keeps its run id
   (its row is rewritten, not duplicated) and resumes its fine-tune from the last checkpoint.
6. **What was measured**: after each cell its rates go into ``throughput.json``; at the end the runner prints the
   cells that came in, their seconds against the estimate, and the ``git add`` line of what to commit.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import OmegaConf

from controlled_study import study as st
from controlled_study.findings import evaluate
from controlled_study.rows import RowSet, load_spec
from harness import api, lifecycle, pipeline, plan
from harness.device import resolve_device
from harness.models import build_model
from harness.results import atomic_write_text, read_rows, study_dir

DEFAULT_EXPERIMENT = "smollm2_study"
DEFAULT_WINDOW_S = 780.0  # a lent GPU's 15 minutes less about 2 minutes of machine start (HARNESS_WINDOW_S: the real)
MARGIN_S = 90.0  # left unspent: the rows' write-out, the throughput file, the commit line, a cell's last minute
CONTROL = "base fine-tuned at C"  # how the findings name the same-data control (controlled_study.findings.CONTROL)


@dataclass
class Cell:
    """One sweep point of the study, as the runner plans it."""
    job: dict  # controlled_study.study.plan's: overrides, hash, label, done, old_gate, study
    key: str  # the table row it is (the method's facts key)
    trains: bool
    eval_flops: float = 0.0
    train_flops: float = 0.0
    estimate_s: float = 0.0
    guess: bool = True  # the estimate rests on an assumed rate, not on a measured one
    unlocks: int = 0


# ---------------------------------------------------------------------------------------------------- rates
def device_kind(device=None) -> str:
    """``nvidia-h200``, ``cpu``, ...: the throughput file's key for the machine this process runs on."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return dev.type
    name = torch.cuda.get_device_name(dev).lower().replace("nvidia", "").strip()
    return "nvidia-" + (re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu")


def throughput_path(results_dir, study: str) -> Path:
    return Path(study_dir(results_dir, study)) / "throughput.json"


def read_throughput(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def guessed_peak(kind: str) -> float:
    """An assumed rate for a kind with no measured cell: ``ASSUMED_MFU`` of its dense bf16 peak (a GPU of
    ``GPU_PEAK_BF16``) or of this machine's timed bf16 / fp32 matmul (the CPU)."""
    for name, peak in sorted(plan.GPU_PEAK_BF16.items(), key=lambda x: -len(x[0])):
        if name.lower() in kind:
            return peak * plan.ASSUMED_MFU

    return plan.device_flops("cpu", torch.float32) * plan.ASSUMED_MODEL_EFFICIENCY


def rates(tp: dict, kind: str) -> tuple[float, float, float, bool, bool]:
    """(evaluation FLOP/s, training FLOP/s, seconds per cell outside both, evaluation measured?, training
    measured?) on ``kind``: measured where a cell of that kind was, else ``guessed_peak``."""
    k = tp.get(kind) or {}
    ev_s, tr_s = k.get("eval_seconds", 0.0), k.get("train_seconds", 0.0)
    g = guessed_peak(kind) if not (ev_s > 0 and tr_s > 0) else 0.0
    ev = k.get("eval_flops", 0.0) / ev_s if ev_s > 0 else g
    tr = k.get("train_flops", 0.0) / tr_s if tr_s > 0 else g
    cells = k.get("cells", 0)
    over = k.get("overhead_seconds", 0.0) / cells if cells else 30.0  # 30 s: a guess at loading + compiling a cell
    return ev, tr, over, ev_s > 0, tr_s > 0


def record(tp: dict, kind: str, cell: Cell, row: dict, wall: float, device_name: str) -> dict:
    """``tp`` with this cell's measured seconds added on ``kind`` (evaluation: the row's ``timings``; training: its
    ``train_info.train_seconds``; the rest of the cell's wall time: overhead)."""
    k = tp.setdefault(kind, {"device": device_name, "cells": 0, "eval_flops": 0.0, "eval_seconds": 0.0,
                             "train_flops": 0.0, "train_seconds": 0.0, "overhead_seconds": 0.0})
    ev_s = sum(float(v) for key, v in (row.get("timings") or {}).items() if key.startswith("eval."))
    tr_s = float((row.get("train_info") or {}).get("train_seconds") or 0.0)
    k["cells"] += 1
    k["eval_flops"] += cell.eval_flops
    k["eval_seconds"] += ev_s
    if tr_s > 0:
        k["train_flops"] += cell.train_flops
        k["train_seconds"] += tr_s
    k["overhead_seconds"] += max(0.0, wall - ev_s - tr_s)
    k["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    k.setdefault("log", []).append({"cell": cell.job["label"], "hash": cell.job["hash"], "run_id": row.get("run_id"),
                                    "estimate_s": round(cell.estimate_s, 1), "guess": cell.guess,
                                    "wall_s": round(wall, 1), "eval_s": round(ev_s, 1), "train_s": round(tr_s, 1)})
    return tp


def write_throughput(path: Path, tp: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(tp, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------------- the cells
def cells(argv: list[str]) -> tuple[list[Cell], str, str]:
    """Every point of ``run.py -m <argv>`` as a ``Cell`` with its FLOPs; the results dir and the study."""

    jobs, results_dir = st.plan(argv)
    out = []
    for j in jobs:
        cfg = j["cfg"]
        s = pipeline.setup(cfg, data=False)
        cost = plan.run_cost(cfg, pipeline.selected(s.suite), s.method)
        ev = sum(r["flops"] for rows in cost["entries"].values() for r in rows.values())
        tr = (cost["train"] or {}).get("flops", 0.0)
        facts = OmegaConf.to_container(cfg.method, resolve=True).get("facts") or {}
        out.append(Cell(j, str(facts.get("key") or cfg.method.name), bool(s.train.enabled), ev, tr))
    return out, results_dir, (jobs[0]["study"] if jobs else "") or ""


def missing_keys(text: str) -> set[str]:
    """The row keys a finding's "no rows: a, b (fine-tuned); no rows: c at 16C" names."""
    keys = set()
    for part in re.findall(r"no rows: ([^;]*)", text or ""):
        for item in part.split(","):
            item = item.strip()
            if item.startswith(CONTROL):
                keys.add("base_ft")
            elif item:
                keys.add(item.split()[0])
    return keys


def unlocks(results_dir: str, study: str, model: str) -> dict[str, int]:
    """Per row key, how many findings name it among their missing rows on the study's rows now (``base``: the
    findings with a part against the frozen base)."""
    fs, _ = evaluate(RowSet(list(read_rows(results_dir, study, warn=lambda m: None)), load_spec()), model)
    count: dict[str, int] = {}
    for f in fs:
        named = missing_keys(f.reason)
        for p in f.parts:
            named |= missing_keys(p.why)
        if any(re.search(r"\bbase\b(?! \(FT\))", p.what) for p in f.parts):
            named.add("base")
        for k in named:
            count[k] = count.get(k, 0) + 1
    return count


def estimate(cs: list[Cell], tp: dict, kind: str) -> None:
    ev, tr, over, ev_ok, tr_ok = rates(tp, kind)
    for c in cs:
        c.estimate_s = c.eval_flops / ev + (c.train_flops / tr if c.trains else 0.0) + over
        c.guess = not ev_ok or (c.trains and not tr_ok)


def order(cs: list[Cell], counts: dict[str, int]) -> list[Cell]:
    for c in cs:
        c.unlocks = counts.get("base_ft" if (c.key == "base" and c.trains) else c.key, 0)
    return sorted(cs, key=lambda c: (-c.unlocks, c.estimate_s))


def fits(todo: list[Cell], budget_s: float) -> list[Cell]:
    """The cells of ``todo`` (in order) that fit ``budget_s``, each taking its estimate."""
    left, out = budget_s, []
    for c in todo:
        if c.estimate_s <= left:
            out.append(c)
            left -= c.estimate_s
    return out


def print_plan(cs: list[Cell], kind: str, budget_s: float) -> None:
    todo = [c for c in cs if not c.job["done"]]
    chosen = {id(c) for c in fits(todo, budget_s)}
    print(f"gpu-study plan on {kind}: {len(cs)} cells, {len(cs) - len(todo)} done, {len(todo)} to run; budget "
          f"{budget_s:.0f} s", flush=True)
    for c in cs:
        state = "done " + c.job["done"] if c.job["done"] else ("this window" if id(c) in chosen else "later")
        print(f"  {c.job['label']:34s} unlocks {c.unlocks:2d}  ~{c.estimate_s:8.1f} s{' (guess)' if c.guess else ''}"
              f"  eval {c.eval_flops / 1e12:9.1f} TFLOP  train {c.train_flops / 1e12:9.1f} TFLOP  {state}",
              flush=True)
    total = sum(c.estimate_s for c in todo)
    guessed = sum(c.guess for c in todo)
    print(f"study total to run: ~{total:.0f} s ({total / 3600:.2f} h) of {kind}, {len(todo)} cells"
          + (f", {guessed} of them on a guessed rate (no measured cell of that kind yet)" if guessed else ""),
          flush=True)


# ---------------------------------------------------------------------------------------------------- the worker
def run_cell(cell: Cell, results_dir: str, models: dict, device) -> tuple[dict | None, str]:
    """One cell in this process on a fresh copy of its model: ``(row, "")``, or ``(None, why it did not run)``."""

    lock, why = st.claim(results_dir, cell.job)
    if lock is None:
        return None, why
    try:
        cfg = cell.job["cfg"]  # composed once, by the plan
        mkey = json.dumps(OmegaConf.to_container(cfg.model, resolve=True), sort_keys=True)
        if mkey not in models:
            models.clear()  # one model in memory at a time
            models[mkey] = build_model(cfg.model, device=device)
        run = lifecycle.start(cfg, run_dir=Path(cfg.paths.output_dir) / "gpu_study" / cell.job["hash"])
        try:
            api.run(cfg, run, handle=copy.deepcopy(models[mkey]))
            problem = run.finish()
            if problem:
                raise OSError(f"the finished row could not be written: {problem}")
        except Exception as e:  # noqa: BLE001 - a failed cell: its row failed, the window goes on
            return None, "failed: " + run.fail(e)
        except BaseException as e:  # a kill (SIGTERM) or Ctrl-C: the row failed, the window ends
            run.fail(e)
            raise
        return run.row, ""
    finally:
        lock.release()


def budget(a) -> float:
    window = a.budget_s if a.budget_s is not None else float(os.environ.get("HARNESS_WINDOW_S", DEFAULT_WINDOW_S))
    return max(0.0, window - (a.margin_s if a.budget_s is None else 0.0))


def work(cs: list[Cell], results_dir: str, study: str, kind: str, budget_s: float, tp_path: Path) -> list[dict]:
    """Run the cells that fit, re-planning the budget after each; every cell's measurement recorded as it ends."""
    device = resolve_device("auto")
    name = device_kind_name(device)
    t0, models, done = time.time(), {}, []
    todo = [c for c in cs if not c.job["done"]]
    while todo:
        nxt = fits(todo, budget_s - (time.time() - t0))
        if not nxt:
            break
        c = nxt[0]
        todo.remove(c)
        print(f"\n== gpu-study: {c.job['label']} (estimate {c.estimate_s:.0f} s{', a guess' if c.guess else ''}; "
              f"{budget_s - (time.time() - t0):.0f} s of budget left)", flush=True)
        t = time.time()
        row, why = run_cell(c, results_dir, models, device)
        wall = time.time() - t
        if row is None:
            print(f"== gpu-study: {c.job['label']}: {why}", flush=True)
            continue
        tp = record(read_throughput(tp_path), kind, c, row, wall, name)
        write_throughput(tp_path, tp)
        estimate(todo, tp, kind)  # the cells left, on the rates measured so far
        done.append({"cell": c.job["label"], "run_id": row["run_id"], "wall_s": wall, "estimate_s": c.estimate_s,
                     "guess": c.guess})
        print(f"== gpu-study: {c.job['label']}: ok in {wall:.0f} s (estimate {c.estimate_s:.0f} s), row "
              f"{row['run_id']}", flush=True)
    return done


def device_kind_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def report(done: list[dict], results_dir: str, study: str, tp_path: Path) -> None:
    print(f"\ngpu-study: {len(done)} cells came in", flush=True)
    for d in done:
        print(f"  {d['cell']:34s} {d['wall_s']:7.0f} s against an estimate of {d['estimate_s']:.0f} s"
              f"{' (a guess)' if d['guess'] else ''}  row {d['run_id']}", flush=True)
    if done:

        print(f"to commit: git add {study_dir(results_dir, study)}/runs {tp_path} && git commit -m "
              f"\"{study}: {len(done)} cells from a GPU window\"", flush=True)


def main(argv=None) -> int:
    """a study advanced in one GPU window: what fits the budget, most findings first."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help=f"Hydra overrides (default: experiment={DEFAULT_EXPERIMENT})")
    ap.add_argument("--plan", action="store_true", help="print every cell with its estimated seconds and stop")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds this window may spend (default: "
                    f"HARNESS_WINDOW_S or {DEFAULT_WINDOW_S:.0f}, minus --margin-s)")
    ap.add_argument("--margin-s", type=float, default=MARGIN_S, help="left unspent of the default budget")
    ap.add_argument("--kind", default=None, help="plan for this device kind (default: this machine's), e.g. "
                    "nvidia-h200")
    a = ap.parse_args(argv)
    argv = list(a.overrides)
    if not any(x.startswith("experiment=") for x in argv):
        argv = [f"experiment={DEFAULT_EXPERIMENT}"] + argv
    cs, results_dir, study = cells(argv)
    kind = a.kind or device_kind()
    tp_path = throughput_path(results_dir, study)
    tp = read_throughput(tp_path)
    estimate(cs, tp, kind)

    model = OmegaConf.select(cs[0].job["cfg"], "model.name") if cs else None
    cs = order(cs, unlocks(results_dir, study, model or ""))
    b = budget(a)
    print_plan(cs, kind, b)
    if a.plan:
        return 0
    if a.kind and a.kind != device_kind():
        print(f"gpu-study: --kind {a.kind} is not this machine ({device_kind()}): plan only", file=sys.stderr)
        return 2

    lifecycle.raise_on_sigterm()  # a window cut off by SIGTERM: the running cell's row ends failed, not running
    done = work(cs, results_dir, study, kind, b, tp_path)
    report(done, results_dir, study, tp_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
