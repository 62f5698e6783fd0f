"""The stages ``run.py`` calls, each a plain function: start a row, load + extend the model, fine-tune, evaluate,
finish the row. Config objects stop here: every stage converts its group to typed arguments once."""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from harness import results
from harness.config import ConfigError, to_args
from harness.data import build_data
from harness.evals import EvalContext, build_evaluators
from harness.methods import build_method, check_checkpoint_method, save_method
from harness.models import build_model
from harness.train import TrainArgs

GROUPS = ("model", "method", "data", "train", "eval")


def start(cfg, run_dir: str | Path | None = None) -> dict:
    plain = OmegaConf.to_container(cfg, resolve=True)
    # a job requeued by Slurm (preemption, timeout) restarts in its run directory: keep its run_id, so its row is
    # rewritten rather than duplicated (training resumes from the checkpoint keyed by the config fingerprint)
    previous = Path(run_dir, "run.json") if run_dir else None
    run_id = json.loads(previous.read_text())["run_id"] if previous and previous.is_file() else results.new_run_id()
    run_dir = Path(run_dir or Path(cfg.paths.output_dir) / "runs" / run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    names = {g: (plain.get(g) or {}).get("name") for g in GROUPS}
    row = results.new_row(run_id, plain, names, run_dir)
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "command": row["command"],
                                                  "git_sha": row["git_sha"], "config": plain}, indent=1))
    results.write_row(cfg.paths.results_dir, row)
    return row


def validate(cfg):
    """Check every group before anything expensive happens: method, train recipe and eval suite arguments."""
    method = build_method(cfg.method)
    train = to_args(TrainArgs, cfg.train, f"train={cfg.train.get('name')}")
    train.validate()
    build_evaluators(OmegaConf.to_container(cfg.eval.suite, resolve=True))
    return method, train


def load_and_extend(cfg, method, train: TrainArgs | None = None, before_extend=None):
    """Model + method: load the base (or a fine-tuned checkpoint) and apply the extension method. Before a
    fine-tuning run the base model is measured inside its window first (``harness.evals.convergence``), so that the
    fine-tuned row can be compared with it on the same documents and prompts. ``before_extend(handle)`` lets a
    caller measure the base model too (learning curves)."""
    handle = build_model(cfg.model)
    path = handle.info.get("path", "")
    if os.path.isdir(path):
        check_checkpoint_method(path, method)
    if train is not None and train.enabled and train.convergence_check:
        from harness.evals import convergence

        handle.info["baseline_at_C"] = convergence.measure(handle, seed=int(cfg.seed),
                                                           autocast=str(cfg.get("autocast", "auto")))
    if before_extend is not None:
        before_extend(handle)
    method.apply(handle)
    return handle


def finetune(cfg, handle, method, a: TrainArgs, row: dict, progress=None) -> dict | None:
    if not a.enabled:
        return None
    fingerprint = results.config_hash({g: OmegaConf.to_container(cfg[g], resolve=True)
                                       for g in ("model", "method", "data", "train")})
    ckpt_dir = Path(cfg.paths.ckpt_dir) / fingerprint
    chunks = build_data(cfg.data, handle.tokenizer, a.seq_len, a.tokens)
    if a.engine == "deepspeed":
        from harness.train.deepspeed_engine import launch

        info = launch(cfg, handle, method, a, ckpt_dir, fingerprint, Path(row["run_dir"]))
    else:
        from harness.train.loop import finetune as single

        info = single(handle, method, chunks, a, ckpt_dir, fingerprint, progress)
    if "baseline_at_C" in handle.info:  # the convergence gate: adapted to the method, or an unfinished recipe?
        from harness.evals import convergence

        tuned = convergence.measure(handle, method, seed=int(cfg.seed), autocast=str(cfg.get("autocast", "auto")))
        info["convergence"] = convergence.verdict(handle.info["baseline_at_C"], tuned)
    out = Path(row["run_dir"]) / "checkpoint"
    handle.model.save_pretrained(out)
    handle.tokenizer.save_pretrained(out)
    save_method(out, method)
    info["checkpoint"] = str(out)
    return info


def evaluate(cfg, handle, method, row: dict, on_result=None) -> None:
    ctx = EvalContext(run_dir=Path(row["run_dir"]), seed=int(cfg.seed), autocast=str(cfg.get("autocast", "auto")),
                      batch_tokens=int(cfg.get("eval_batch_tokens", 8192)))
    suite = OmegaConf.to_container(cfg.eval.suite, resolve=True)
    evaluators = build_evaluators(suite)
    for key, ev in zip(suite, evaluators):
        t0 = time.time()
        row["metrics"][key] = ev.run(handle, method, ctx)
        row["timings"][f"eval.{key}"] = round(time.time() - t0, 2)
        results.write_row(cfg.paths.results_dir, row)  # partial progress is never lost
        if on_result:
            on_result(key, row["metrics"][key])


def finish(cfg, row: dict, error: BaseException | None = None) -> dict:
    row["time_end"] = results.now_iso()
    if error is None:
        row["status"] = "ok"
    else:
        row["status"] = "failed"
        row["error"] = one_line(error)
        Path(row["run_dir"], "error.log").write_text("".join(traceback.format_exception(error)))
    results.write_row(cfg.paths.results_dir, row)
    return row


def one_line(e: BaseException) -> str:
    if isinstance(e, ConfigError):
        return str(e).splitlines()[0]
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".strip()


def fail_before_compose(results_dir: str, message: str) -> None:
    """A run whose configuration cannot even be composed still leaves a failed row (and a one-line error)."""
    run_id = results.new_run_id()
    row = {k: None for k in results.ROW_FIELDS}
    row.update(schema=results.SCHEMA_VERSION, run_id=run_id, status="failed", error=message,
               time_start=results.now_iso(), time_end=results.now_iso(), command=" ".join(sys.argv),
               git_sha=results.git_sha(), metrics={}, timings={})
    results.write_row(results_dir, row)
