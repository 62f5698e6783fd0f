"""Learning curves of a fine-tuning recipe: one fine-tuning run, its EMA weights evaluated at chosen steps.

    python scripts/recipe_curves.py method=pi train=tiny train.lr=1e-3 +curve.at=[16,64,256,512]
    python scripts/recipe_curves.py method=yarn train=tiny train.schedule=cosine +curve.at=[512]

Same config groups as ``run.py`` (Hydra); the run's own stages do the work (``pipeline.validate``,
``load_and_extend``, the fine-tuning data and the single-process loop), with an ``on_step`` hook that evaluates the
EMA weights with the ``curve.eval`` suite (default ``eval=curve``: PPL at C and 8C, passkey at C..8C) at the steps
in ``curve.at``. With a constant schedule after warm-up, the curve at step N equals a run of N steps (the data order
and the LR at each step do not depend on the total); with a decaying schedule only the last point is such a run.
Fine-tuning runs to ``max(curve.at)`` steps. Writes ``results/curves/<method>-<tag>.json``.

Resumable: the training state is checkpointed every ``gcd(curve.at)`` steps (``paths.ckpt_dir``); the same command
after a kill resumes from the newest checkpoint and keeps the points already in the curve file when its method,
training settings and steps are the same (an earlier, different curve under the same name is overwritten).

Only methods whose training and inference modes are the same are supported (the RoPE family); a method with a
``train_mode`` (LongLoRA's LoRA, Landmark) is refused.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from harness import conf_utils, pipeline, results
from harness.config import ConfigError
from harness.data import build_data
from harness.evals import EvalContext
from harness.methods import Method
from harness.train.loop import finetune


def _no_modes(method) -> bool:
    t = type(method)
    return t.train_mode is Method.train_mode and t.eval_mode is Method.eval_mode and \
        t.train_batch is Method.train_batch


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    curve = OmegaConf.to_container(cfg.get("curve") or {}, resolve=True)
    at = sorted(int(s) for s in curve.get("at", [16, 64, 256, 512]))
    suite_name = curve.get("eval", "curve")
    tag = curve.get("tag") or f"lr{cfg.train.lr:g}-{cfg.train.schedule}-b{cfg.train.global_batch}-s{cfg.seed}"
    out = Path(cfg.paths.results_dir) / "curves" / f"{cfg.method.name}-{tag}.json"
    suite_cfg = conf_utils.compose([f"eval={suite_name}", f"model={cfg.model.name}"]).eval.suite
    curve_suite = pipeline.Suite.build(OmegaConf.to_container(suite_cfg, resolve=True))  # built once, for every point
    suite, evaluators = curve_suite.nodes, curve_suite.evaluators

    method, train = pipeline.validate(cfg)
    if not _no_modes(method):
        raise ConfigError(f"recipe_curves: method {method.name} trains differently than it evaluates; not supported")
    train.max_steps = max(at)
    train.tokens = max(train.tokens, max(at) * train.global_batch * train.seq_len)
    train.save_every = math.gcd(*at)  # a checkpoint at every curve point (after its evaluation), for resuming
    train.convergence_check = False  # the curve measures the base itself, with its own suite
    run_dir = Path(cfg.paths.output_dir) / "curves" / out.stem
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = EvalContext(run_dir=run_dir, seed=int(cfg.seed), autocast=str(cfg.get("autocast", "auto")))
    record = {"method": method.params(), "train": OmegaConf.to_container(cfg.train, resolve=True),
              "model": cfg.model.name, "eval": suite_name, "suite": suite, "at": at, "points": {},
              "git_sha": results.git_sha(), "started": results.now_iso()}
    earlier = json.loads(out.read_text()) if out.exists() else None
    if earlier and not earlier.get("finished") and all(earlier.get(k) == record[k] for k in ("method", "train", "at")):
        record["points"] = {k: v for k, v in earlier["points"].items() if k not in ("base", "0")}
        record["started"] = earlier["started"]

    def evaluate(label, handle, with_method=True):
        t0 = time.time()
        handle.model.eval()
        ctx.nll_cache = {}  # one point = one state of the weights: windows scored at another point are not reused
        shutil.rmtree(run_dir / label, ignore_errors=True)  # a resumed curve re-scores this point: no stale samples
        point = {}
        for k, ev in zip(suite, evaluators):
            ctx.run_dir = run_dir / label  # per-sample records of this point only (paired comparisons)
            point[k] = ev.run(handle, method if with_method else None, ctx)
        point["records"] = _records(run_dir / label, suite)
        point["eval_seconds"] = round(time.time() - t0, 1)
        record["points"][label] = point
        record["points"] = dict(sorted(record["points"].items(), key=lambda kv: -1 if kv[0] == "base" else int(kv[0])))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1))
        print(f"[{label}] " + " ".join(f"{k}={_short(v)}" for k, v in point.items() if isinstance(v, dict)), flush=True)

    handle = pipeline.load_and_extend(cfg, method, train, before_extend=lambda h: evaluate("base", h, False),
                                      suite=curve_suite)  # the model must fit the suite the curve runs
    chunks = build_data(cfg.data, handle.tokenizer, train.seq_len, train.tokens)
    evaluate("0", handle)

    def on_step(step, model, ema):
        if step not in at:
            return
        saved = {n: p.detach().clone() for n, p in model.named_parameters()}
        if ema is not None:
            ema.copy_to(model)
        with torch.no_grad():
            evaluate(str(step), handle)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
        model.train()

    t0 = time.time()
    info = finetune(handle, method, chunks, train, Path(cfg.paths.ckpt_dir) / "curves" / out.stem,
                    results.config_hash(record["train"]) + "-curve", None, on_step)
    losses = info["losses"]
    record.update(losses=losses, train_seconds=round(time.time() - t0, 1), finished=results.now_iso(),
                  resumed_from_step=info["resumed_from_step"],
                  tokens_per_second=info["tokens_per_second"])
    out.write_text(json.dumps(record, indent=1))
    print(f"curve: {out}")


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
    main()
