"""Learning curves of a fine-tuning recipe: one fine-tuning run, its EMA weights evaluated at chosen steps.

    python scripts/recipe_curves.py method=pi train=tiny train.lr=1e-3 curve.at=[16,64,256,512]
    python scripts/recipe_curves.py method=yarn train=tiny train.schedule=cosine curve.at=[512]

One Hydra composition (``conf/curve_config.yaml``: run.py's root config with ``eval=curve`` and a ``curve`` node):
the same groups as ``run.py``, and the suite run at every point is the config's own ``eval`` (default ``curve``: PPL
at C and 8C, passkey at C..8C; ``eval=quick`` for a smoke test), checked and built once by ``pipeline.setup``.
The base model and the extended model at step 0 are evaluated too, then the EMA weights at the steps in
``curve.at`` (an ``on_step`` hook of the single-process loop). With a constant schedule after warm-up, the curve at
step N equals a run of N steps (the data order and the LR at each step do not depend on the total); with a decaying
schedule only the last point is such a run. Fine-tuning runs to ``max(curve.at)`` steps.

Table of contents, as ``run.py``: start the row (``harness.lifecycle``) -> check every group and build the suite
once -> load the model, measure the base, apply the method -> fine-tune, measuring each point as it comes -> finish
the row. Writes ``results/curves/<method>-<tag>.json`` (the points with their per-sample records,
``scripts/recipe_report.py`` reads it) and one results row whose ``method`` column is ``<method>_curve`` (so the
tables never take it for a row of the study's method) with ``metrics.curve`` (the points so far, without the
per-sample records), ``train_info`` and ``timings["curve.<point>"]``. A failure anywhere finishes the row as
``failed`` with a one-line error and exits non-zero; a killed curve's row says which points it reached.

Resumable: the training state is checkpointed every ``gcd(curve.at)`` steps (``paths.ckpt_dir``); the same command
after a kill resumes from the newest checkpoint (in a new row) and keeps the points already in the curve file when
its method, training settings and steps are the same (an earlier, different curve under the same name is
overwritten).

Only methods whose training and inference modes are the same are supported (the RoPE family); a method with a
``train_mode`` (LongLoRA's LoRA, Landmark) is refused.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from harness import lifecycle, pipeline, precheck, results
from harness.config import ConfigError
from harness.data import build_data
from harness.evals import EvalContext
from harness.methods import Method
from harness.train import Terminated
from harness.train.loop import finetune


def _no_modes(method) -> bool:
    t = type(method)
    return t.train_mode is Method.train_mode and t.eval_mode is Method.eval_mode and \
        t.train_batch is Method.train_batch


def curve_steps(value) -> list[int]:
    """``curve.at``: the steps to evaluate, a non-empty list of integers >= 1 (returned sorted, without repeats)."""
    steps = list(value) if isinstance(value, (list, tuple)) else None
    if not steps or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps):
        raise ConfigError(f"curve.at: {value!r} is not a list of steps (valid: integers >= 1, e.g. "
                          f"curve.at=[16,64,256,512])")
    return sorted(set(steps))


def checked_steps(cfg) -> list[int]:
    """``curve.at`` checked (``curve_steps``); with every group checked as ``run.py`` checks them, the check of each
    job of a curve sweep before any job starts (``precheck.precheck_sweep_or_exit``)."""
    at = cfg.curve.at
    return curve_steps(OmegaConf.to_container(at, resolve=True) if OmegaConf.is_config(at) else at)


def _check_job(cfg) -> None:
    checked_steps(cfg)
    pipeline.validate(cfg, data=False)


def row_names(cfg) -> dict:
    """The row's group columns: the config's options, the method's as ``<method>_curve``."""
    return {g: cfg[g].get("name") for g in results.GROUPS} | {"method": f"{cfg.method.name}_curve"}


@hydra.main(config_path="../conf", config_name="curve_config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    lifecycle.raise_on_sigterm()  # kill / Slurm -> a failed row
    run = lifecycle.start_or_exit(cfg, hydra.core.hydra_config.HydraConfig.get().runtime.output_dir, row_names(cfg),
                                  "curve")
    try:
        out = curve(cfg, run)
        problem = run.finish()
        if problem:
            raise OSError(f"the finished row could not be written: {problem}")
    except (Exception, KeyboardInterrupt, Terminated) as e:  # noqa: BLE001 - every failure: a failed row
        line = run.fail(e)
        print(f"curve failed: {line}", file=sys.stderr)
        lifecycle.exit_failed(line, stop_sweep=not isinstance(e, Exception))  # a sweep's other curves still run
    print(f"curve: {out}\nrow: {run.path}")


def curve(cfg, run: lifecycle.Run) -> Path:
    """Measure the curve, recording every point in the curve file and the row as it comes; returns the file."""
    at = checked_steps(cfg)
    tag = cfg.curve.tag or f"lr{cfg.train.lr:g}-{cfg.train.schedule}-b{cfg.train.global_batch}-s{cfg.seed}"
    out = Path(cfg.paths.results_dir) / "curves" / f"{cfg.method.name}-{tag}.json"
    s = pipeline.setup(cfg)  # every group checked, the suite built once for every point
    method, train, suite = s.method, s.train, s.suite
    if not _no_modes(method):
        raise ConfigError(f"recipe_curves: method {method.name} trains differently than it evaluates; not supported")
    train.max_steps = max(at)
    train.tokens = max(train.tokens, max(at) * train.global_batch * train.seq_len)
    train.save_every = math.gcd(*at)  # a checkpoint at every curve point (after its evaluation), for resuming
    train.convergence_check = False  # the curve measures the base itself, with its own suite
    run_dir = Path(run.row["run_dir"])
    ctx = EvalContext(run_dir=run_dir, seed=int(cfg.seed), autocast=str(cfg.get("autocast", "auto")))
    record = {"method": method.params(), "train": OmegaConf.to_container(cfg.train, resolve=True),
              "model": cfg.model.name, "eval": cfg.eval.name, "suite": suite.nodes, "at": at, "points": {},
              "git_sha": results.git_sha(), "started": results.now_iso(), "run_id": run.row["run_id"]}
    earlier = json.loads(out.read_text()) if out.exists() else None
    if earlier and not earlier.get("finished") and all(earlier.get(k) == record[k] for k in ("method", "train", "at")):
        record["points"] = {k: v for k, v in earlier["points"].items() if k not in ("base", "0")}
        record["started"] = earlier["started"]
    run.record(method_params=method.params(),
               eval_versions={k: pipeline.eval_version(ev) for k, ev in zip(suite.nodes, suite.evaluators)})

    def evaluate(label, handle, with_method=True):
        t0 = time.time()
        handle.model.eval()
        ctx.nll_cache = {}  # one point = one state of the weights: windows scored at another point are not reused
        ctx.run_dir = run_dir / label  # per-sample records of this point only (paired comparisons)
        shutil.rmtree(ctx.run_dir, ignore_errors=True)  # a resumed curve re-scores this point: no stale samples
        point = {}
        for k, ev in zip(suite.nodes, suite.evaluators):
            point[k] = ev.run(handle, method if with_method else None, ctx)
        point["records"] = _records(ctx.run_dir, suite.nodes)
        point["eval_seconds"] = round(time.time() - t0, 1)
        record["points"][label] = point
        record["points"] = dict(sorted(record["points"].items(), key=lambda kv: -1 if kv[0] == "base" else int(kv[0])))
        results.atomic_write_json(out, record)
        run.row["timings"][f"curve.{label}"] = point["eval_seconds"]
        run.record(metrics={"curve": _row_curve(record, out)})
        print(f"[{label}] " + " ".join(f"{k}={_short(point[k])}" for k in suite.nodes), flush=True)

    handle = pipeline.load_and_extend(cfg, method, train, before_extend=lambda h: evaluate("base", h, False),
                                      suite=suite)  # the model must fit the suite the curve runs
    run.record(model_info=handle.facts())
    chunks = build_data(cfg.data, handle.tokenizer, train.seq_len, train.tokens)
    evaluate("0", handle)

    def on_step(step, model, ema):
        if step not in at:
            return
        saved = {n: p.detach().clone() for n, p in model.named_parameters()}
        if ema is not None:
            ema.copy_to()
        with torch.no_grad():
            evaluate(str(step), handle)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
        model.train()

    t0 = time.time()
    info = finetune(handle, method, chunks, train, Path(cfg.paths.ckpt_dir) / "curves" / out.stem,
                    results.config_hash(record["train"]) + "-curve", None, on_step)
    record.update(losses=info["losses"], train_seconds=round(time.time() - t0, 1), finished=results.now_iso(),
                  resumed_from_step=info["resumed_from_step"], tokens_per_second=info["tokens_per_second"])
    results.atomic_write_json(out, record)
    run.record(train_info=info)
    return out


def _row_curve(record: dict, out: Path) -> dict:
    """The row's ``metrics.curve``: the curve file, its steps and every point so far without its per-sample
    records (those stay in the file)."""
    return {"file": str(out), "at": record["at"],
            "points": {k: {e: v for e, v in p.items() if e != "records"} for k, p in record["points"].items()}}


def _records(d: Path, suite: dict) -> dict:
    """Per-document NLLs (per PPL entry and length) and per-prompt passkey outcomes of one curve point, kept in the
    curve file so that every comparison with the base can be paired (``scripts/recipe_report.py``)."""
    out: dict = {}
    for key, node in suite.items():
        name = node.get("name", key)
        if name == "ppl":
            f = d / "samples" / f"ppl_{node.get('protocol', 'yarn')}.jsonl"
            recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []
            recs = [r for r in recs if r.get("dataset") == node.get("dataset", "shakespeare")]
            lengths = sorted({r["length"] for r in recs})
            out[key] = {str(L): [r["nll"] for r in recs if r["length"] == L] for L in lengths}
        elif name == "passkey":
            f = d / "samples" / "passkey.jsonl"
            recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []
            out[key] = {str(L): [int(r["correct"]) for r in recs if r["length"] == L]
                        for L in sorted({r["length"] for r in recs})}
    return out


def _short(metrics: dict) -> str:
    for key in ("ppl", "accuracy"):
        if key in metrics:
            return "/".join(f"{v:.3g}" for v in metrics[key].values())
    return "?"


if __name__ == "__main__":
    precheck.precheck_sweep_or_exit(sys.argv[1:], "curve_config", _check_job)  # a sweep: every job checked first
    lifecycle.run_guarded(main, sys.argv[1:],  # failures outside the run's try: one line + a failed row
                          on_config_error=precheck.config_refusal(sys.argv[1:], "curve_config"))  # as run.py
