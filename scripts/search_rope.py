"""Search LongRoPE / LongRoPE2 RoPE rescale factors for a model and a target length; write a factors file and a
results row.

    python scripts/search_rope.py model=tiny_llama search=longrope_tiny target_length=2048
    python scripts/search_rope.py model=tiny_llama search=longrope2_tiny target_length=2048
    python scripts/search_rope.py model=llama2_7b search=longrope target_length=131072 search.dataset=dir:/data/pg19_val

Then ``python run.py method=longrope method.factors=<factors file>`` evaluates / fine-tunes with them. Killed and
started again with the same command, a search resumes from its state file (``<output_dir>/search_state/``);
raising ``search.iterations`` extends a finished search. Guide: ``docs/longrope_search.md``.

Table of contents: compose the config -> start the row -> load the model -> search (resumable) -> write the factors
file -> verify (PPL at the target length on held-out windows: searched factors vs PI / YaRN / NTK, all frozen) ->
finish the row (``metrics.search``: fitness curve, PPL at the target, baselines).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from harness import conf_utils, pipeline, results  # noqa: E402,F401  (conf_utils registers the resolvers)
from harness.config import to_args  # noqa: E402


def default_out(cfg) -> Path:
    seed = f"_s{cfg.seed}" if int(cfg.seed) else ""
    return Path(cfg.paths.results_dir) / "factors" / f"{cfg.model.name}_{cfg.search.name}_{cfg.target_length}{seed}.json"


def verify(handle, factors: dict, a, cfg, log) -> dict:
    """PPL at the target length on windows disjoint from the fitness windows (and on the fitness windows), for the
    searched factors through transformers' "longrope" path and for PI / YaRN / NTK frozen baselines."""
    import math

    import torch

    from harness.evals.common import resolve_dtype
    from harness.methods.rope import rope_base, set_rope_parameters
    from harness.models import rotary_dim
    from harness.search.fitness import (apply_factors, long_documents, needle_documents, ppl_with_current_rope,
                                        remove_start_tokens)

    model, tok = handle.model, handle.tokenizer
    v = cfg.verify
    C, L = int(factors["original_max_position_embeddings"]), int(factors["max_position_embeddings"])
    s, d, b = L / C, rotary_dim(model.config), rope_base(model.config)
    dtype = resolve_dtype(str(cfg.autocast))
    ds, split = (v.dataset or a.dataset), (v.split or a.split)
    sets = {"heldout": (long_documents(tok, ds, split, int(v.samples), L, offset_windows=1), None),
            "fitness_docs": (long_documents(tok, a.dataset, a.split, a.samples, L), None)}
    if a.fitness == "needle":
        sets["needle_heldout"] = needle_documents(tok, ds, split, int(v.samples), L, seed=int(cfg.seed) + 1,
                                                  needles=a.needles)
    original = dict(model.config.rope_parameters or {})
    configs = {"searched": None, "pi": dict(rope_type="linear", factor=s),
               "yarn": dict(rope_type="yarn", factor=s, original_max_position_embeddings=C),
               "ntk": dict(rope_type="default", rope_theta=b * s ** (d / (d - 2)))}
    out: dict = {}
    for name in ["searched"] + [n for n in v.baselines if n in configs]:
        if name == "searched":
            apply_factors(model, factors)
        else:
            set_rope_parameters(model, **configs[name])
        for key, (ids, mask) in sets.items():
            t0 = time.time()
            val = ppl_with_current_rope(model, ids, mask, a.chunk, dtype, batch=max(1, a.batch))
            out.setdefault(key, {})[name] = round(val, 4) if math.isfinite(val) else None
            log(f"verify {key:>15s} {name:>8s}: {val:.4f} ({time.time() - t0:.0f}s)")
        if name == "searched":
            remove_start_tokens(model)
    model.config.rope_parameters = original
    from harness.methods.rope import rebuild_rotary

    rebuild_rotary(model)
    del torch
    return out


@hydra.main(config_path=str(ROOT / "conf"), config_name="search_config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    import torch

    from harness.models import build_model
    from harness.search import SearchArgs, run_search

    if int(cfg.threads) > 0:
        torch.set_num_threads(int(cfg.threads))
    plain = OmegaConf.to_container(cfg, resolve=True)
    run_dir = Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir)
    run_id = results.new_run_id()
    a = to_args(SearchArgs, cfg.search, f"search={cfg.search.get('name')}")
    names = {"model": cfg.model.name, "method": f"{a.algorithm}_search", "data": a.dataset, "train": None,
             "eval": "search"}
    row = results.new_row(run_id, plain, names, run_dir)
    results.write_row(cfg.paths.results_dir, row)
    out = Path(cfg.out) if cfg.out else default_out(cfg)
    state = Path(cfg.paths.output_dir) / "search_state" / (out.stem + ".state.json")
    log = lambda m: print(f"[search] {m}", flush=True)  # noqa: E731
    try:
        a.validate()
        t0 = time.time()
        handle = build_model(cfg.model)
        row["timings"]["load"] = round(time.time() - t0, 2)
        log(f"model {handle.name}: C={handle.native_ctx}, target {cfg.target_length}, search {a.name} "
            f"({a.algorithm}, fitness {a.fitness}); state {state}")
        t0 = time.time()
        factors, info = run_search(handle.model, handle.tokenizer, a, int(handle.native_ctx), int(cfg.target_length),
                                   state, seed=int(cfg.seed), model_name=handle.name, resume=bool(cfg.resume),
                                   log=log, dtype=str(cfg.autocast))
        row["timings"]["search"] = round(time.time() - t0, 2)
        factors["provenance"]["run_id"] = run_id
        factors["provenance"]["model_path"] = handle.info.get("path", "")
        results.atomic_write_json(out, factors)
        log(f"factors -> {out}")
        row["method_params"] = {k: v for k, v in factors.items() if k != "provenance"} | {"factors_file": str(out)}
        metrics = {"fitness_curve": info["fitness_curve"], "fitness_metric": factors["provenance"]["fitness_metric"],
                   "best_fitness": info["best_fitness"], "evaluations": info["evaluations"],
                   "iterations": info["iterations"], "stopped": info["stopped"], "n_hat": info["n_hat"],
                   "critical_dim": info["critical_dim"], "factors_file": str(out), "target_length":
                   int(cfg.target_length), "ppl_at_target": None}
        row["metrics"]["search"] = metrics
        results.write_row(cfg.paths.results_dir, row)
        if cfg.verify.enabled:
            t0 = time.time()
            ver = verify(handle, factors, a, cfg, log)
            row["timings"]["verify"] = round(time.time() - t0, 2)
            metrics["ppl_at_target"] = ver["heldout"]["searched"]
            metrics["verify"] = ver
            metrics["verify_protocol"] = ("yarn-truncate windows [BOS]+doc[L-1:2L-2] (held out from the fitness "
                                          "windows); all methods frozen")
        pipeline.finish(cfg, row)
        log(f"row: {results.row_path(cfg.paths.results_dir, run_id)}")
    except Exception as e:  # noqa: BLE001 - every failure becomes a failed row + one line
        pipeline.finish(cfg, row, error=e)
        print(f"search failed: {row['error']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
