"""Search LongRoPE / LongRoPE2 RoPE rescale factors for a model and a target length; write a factors file and a
results row.

    python scripts/search_rope.py model=tiny_llama search=longrope_tiny target_length=2048
    python scripts/search_rope.py model=tiny_llama search=longrope2_tiny target_length=2048
    python scripts/search_rope.py model=llama2_7b search=longrope target_length=131072 search.dataset=dir:/data/pg19_val

Then ``python run.py method=longrope method.factors=<factors file>`` (or ``method=longrope2``) evaluates / fine-tunes
with them; ``scripts/progressive_rope.py`` chains search -> fine-tune -> search (LongRoPE's progressive extension).
Killed (Ctrl-C, SIGTERM, or the machine) and started again with the same command, a search resumes from its state
file (``<output_dir>/search_state/``); raising ``search.iterations`` or ``search.time_budget_s`` extends a finished
search. Guide: ``docs/longrope_search.md``.

Table of contents: compose the config -> start the row (``harness.lifecycle``, as ``run.py``) -> load the model ->
search (resumable) -> write the factors file -> verify (the harness's ppl evaluator at the target length: searched
factors vs PI / YaRN / NTK, all frozen) -> finish the row (``metrics.search``: fitness curve, progress per iteration,
wall time, PPL at the target).
"""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from harness import conf_utils, lifecycle, precheck, results  # noqa: F401  (conf_utils registers the resolvers)
from harness.config import ConfigError, to_args

ROOT = Path(__file__).resolve().parents[1]


def target_length(cfg) -> int:
    """``target_length``: L' in tokens, an integer >= the model's native window C (C itself: the short-factor search,
    ``search.factors_for=short``); the default ``${ctx:4}`` is 4C on every model."""
    v, c = cfg.target_length, int(cfg.model.native_ctx)
    if isinstance(v, bool) or not isinstance(v, int) or v < c:
        raise ConfigError(f"target_length: {v!r} is not a length in tokens >= the native window C = {c} (valid: an "
                          f"integer, e.g. target_length={4 * c} = 4C)")
    return v


def checked(cfg):
    """The search's arguments (``SearchArgs``), every value checked, and the target length: raises ``ConfigError``
    naming the key (before a single search starts, or before any job of a sweep launches)."""
    from harness.search import SearchArgs

    target_length(cfg)
    a = to_args(SearchArgs, cfg.search, f"search={cfg.search.get('name')}")
    a.validate()
    return a


def default_out(cfg) -> Path:
    seed = f"_s{cfg.seed}" if int(cfg.seed) else ""
    name = f"{cfg.model.name}_{cfg.search.name}_{cfg.target_length}{seed}.json"
    return Path(cfg.paths.results_dir) / "factors" / name


def weights_digest(path: str) -> str:
    """sha256 (first 16 hex digits) of the weights the search ran on: which checkpoint a factors file belongs to."""
    import hashlib

    f = Path(path or "", "model.safetensors")
    if not f.is_file():
        return ""
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def baseline_rope(name: str, factors: dict, a, model) -> dict | None:
    """The frozen baselines of ``verify``: rope parameters (``pi``, ``yarn``, ``ntk``: relative to the original
    frequencies and window C) or, after a progressive stage (``search.init_factors``), factors dicts (``init``: the
    previous stage's factors rescaled to this target, the search's seed; ``secondary_pi``: PI on top of the previous
    stage, ``lambda_prev * s / s_prev``: LongRoPE Table 9's secondary interpolation)."""
    from harness.methods.rope import rope_base
    from harness.models import rotary_dim
    from harness.search import rescale_factors

    if a.factors_for == "short":  # recovery search: the one baseline is the fine-tuned model's own factors file
        if name != "init":
            return None
        from harness.methods.longrope import load_factors

        return {"factors": load_factors(a.init_factors, None)}
    C, L = int(factors["original_max_position_embeddings"]), int(factors["max_position_embeddings"])
    s, d, b = L / C, rotary_dim(model.config), rope_base(model.config)
    if name == "pi":
        return {"rope": dict(rope_type="linear", factor=s)}
    if name == "yarn":
        return {"rope": dict(rope_type="yarn", factor=s, original_max_position_embeddings=C)}
    if name == "ntk":
        return {"rope": dict(rope_type="default", rope_theta=b * s ** (d / (d - 2)))}
    if name in ("init", "secondary_pi") and a.init_factors:
        prev = json.loads(Path(a.init_factors).read_text())
        s_old = float(prev["max_position_embeddings"]) / float(prev["original_max_position_embeddings"])
        lam = (rescale_factors(prev["long_factor"], s_old, s) if name == "init"
               else [float(v) * s / s_old for v in prev["long_factor"]])
        return {"factors": {**factors, "long_factor": [float(v) for v in lam], "n_hat": int(prev.get("n_hat") or 0)}}
    return None


def verify(handle, factors: dict, a, cfg, run_dir: Path, log) -> dict:
    """PPL at the target length with the harness's ppl evaluator (``harness.evals.ppl``, YaRN protocol: the first
    ``verify.samples`` documents, window ``[BOS] + doc[:L-1]``, exactly what ``run.py eval=... ppl_books`` measures at
    that length) for the searched factors (the ``longrope`` method's ``apply_factors``) and the frozen baselines. The
    fitness windows are disjoint when ``search.offset_windows >= 1``. LongRoPE2 also gets needle-driven PPL on held-out
    needle documents (another seed, the haystack window after the ppl window)."""
    import math

    from harness.device import resolve_dtype
    from harness.evals import EvalContext
    from harness.evals.ppl import Perplexity
    from harness.methods.longrope import apply_factors
    from harness.methods.rope import rebuild_rotary, set_rope_parameters
    from harness.search.fitness import needle_documents, ppl_with_current_rope

    model, tok = handle.model, handle.tokenizer
    v = cfg.verify
    L = target_length(cfg) if a.factors_for == "short" else int(factors["max_position_embeddings"])
    dtype = resolve_dtype(str(cfg.autocast))
    ds, split = (v.dataset or a.dataset), (v.split or a.split)
    ev = Perplexity(Perplexity.Args(dataset=ds, split=split, samples=int(v.samples), lengths=[L], chunk=a.chunk))
    docs = ev.documents(tok, L)
    ev.documents = lambda *_: docs  # tokenised once for every RoPE variant
    needle = None
    if a.fitness == "needle":
        needle = needle_documents(tok, ds, split, int(v.samples), L, seed=int(cfg.seed) + 1, needles=a.needles,
                                  offset_windows=1)
    original = dict(model.config.rope_parameters or {})
    out: dict = {"ppl": {}, "needle_ppl": {}} if needle is not None else {"ppl": {}}
    for name in ["searched"] + list(v.baselines):
        spec = {"factors": factors} if name == "searched" else baseline_rope(name, factors, a, model)
        if spec is None:
            continue
        if "factors" in spec:  # the longrope method's own path (what run.py method=longrope evaluates)
            apply_factors(model, spec["factors"], kv_cache="stale")
        else:
            set_rope_parameters(model, **spec["rope"])
        t0 = time.time()
        ctx = EvalContext(run_dir=run_dir / "verify" / name, seed=int(cfg.seed), autocast=str(cfg.autocast))
        res = ev.run(handle, None, ctx)
        val = res["ppl"][str(L)]
        out["ppl"][name] = round(val, 4) if val is not None and math.isfinite(val) else None
        msg = f"verify {name:>12s}: ppl@{L} {val:.4f}"
        if needle is not None:
            nv = ppl_with_current_rope(model, needle[0], needle[1], a.chunk, dtype, batch=1)
            out["needle_ppl"][name] = round(nv, 4) if math.isfinite(nv) else None
            msg += f", needle ppl {nv:.4f}"
        log(f"{msg} ({time.time() - t0:.0f}s)")
    model.config.rope_parameters = original
    rebuild_rotary(model)
    out["documents"] = res["documents"]
    out["scored"] = res["scored"][str(L)]
    return out


@hydra.main(config_path=str(ROOT / "conf"), config_name="search_config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    import torch

    from harness.models import build_model
    from harness.search import run_search

    try:
        a = checked(cfg)
    except Exception as e:  # noqa: BLE001 - one line, a failed row, exit 2 (as run.py)
        precheck.refuse_in_job(e, "search_config")
    if int(cfg.threads) > 0:
        torch.set_num_threads(int(cfg.threads))
    signal.signal(signal.SIGTERM, _interrupt)  # `kill <pid>` ends the row as interrupted; the state file stays
    run_dir = Path(hydra.core.hydra_config.HydraConfig.get().runtime.output_dir)
    names = {"model": cfg.model.name, "method": f"{a.algorithm}_search", "data": a.dataset, "train": None,
             "eval": "search"}
    run = lifecycle.start_or_exit(cfg, run_dir, names, "search")  # no search without a record
    row, run_id = run.row, run.row["run_id"]
    out = Path(cfg.out) if cfg.out else default_out(cfg)
    state = Path(cfg.paths.output_dir) / "search_state" / (out.stem + ".state.json")
    log = lambda m: print(f"[search] {m}", flush=True)  # noqa: E731
    try:
        a.validate()
        with run.stage("load"):
            handle = build_model(cfg.model)
        log(f"model {handle.name}: C={handle.native_ctx}, target {cfg.target_length}, search {a.name} "
            f"({a.algorithm}, fitness {a.fitness}); state {state}")
        digest = weights_digest(handle.info.get("path", ""))
        load = {"search_start": _load_average()}  # label timings taken on a loaded machine
        with run.stage("search"):
            factors, info = run_search(handle.model, handle.tokenizer, a, int(handle.native_ctx),
                                       target_length(cfg), state, seed=int(cfg.seed), model_name=handle.name,
                                       resume=bool(cfg.resume), log=log, dtype=str(cfg.autocast), weights=digest)
        load["search_end"] = _load_average()
        factors["provenance"]["run_id"] = run_id
        factors["provenance"]["model_path"] = handle.info.get("path", "")
        factors["provenance"]["weights_sha256"] = digest
        results.atomic_write_json(out, factors)
        log(f"factors -> {out}")
        row["method_params"] = {k: v for k, v in factors.items() if k != "provenance"} | {"factors_file": str(out)}
        metrics = {"fitness_curve": info["fitness_curve"], "fitness_metric": factors["provenance"]["fitness_metric"],
                   "best_fitness": info["best_fitness"], "evaluations": info["evaluations"],
                   "iterations": info["iterations"], "stopped": info["stopped"],
                   "wall_time_s": info["elapsed_s"], "progress": info["progress"], "resumes": info["resumes"],
                   "this_session": info["this_session"], "threads": torch.get_num_threads(),
                   "load_average": load, "n_hat": info["n_hat"], "critical_dim": info["critical_dim"],
                   "factors_file": str(out), "target_length": target_length(cfg),
                   "weights_sha256": factors["provenance"]["weights_sha256"], "ppl_at_target": None}
        run.record(metrics={"search": metrics})
        if cfg.verify.enabled:
            with run.stage("verify"):
                ver = verify(handle, factors, a, cfg, run_dir, log)
            metrics["ppl_at_target"] = ver["ppl"]["searched"]
            metrics["verify"] = ver
            metrics["verify_protocol"] = ("harness ppl evaluator (yarn protocol, [BOS]+doc[:L-1] of the first "
                                          f"{cfg.verify.samples} documents); all frozen; fitness windows start at "
                                          f"doc[{a.offset_windows}*(L-1)]")
            load["verify_end"] = _load_average()
        run.finish()
        log(f"row: {run.path}")
    except KeyboardInterrupt as e:  # a killed search resumes: the same command continues from the state file
        run.finish(RuntimeError(f"interrupted; run the same command again to resume from {state}"))
        print(f"search interrupted: resumable from {state}", file=sys.stderr)
        raise SystemExit(130) from e
    except Exception as e:  # noqa: BLE001 - every failure becomes a failed row + one line
        run.finish(e)
        print(f"search failed: {row['error']}", file=sys.stderr)
        lifecycle.exit_failed(row["error"])  # a sweep's other searches still run


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _load_average() -> list | None:
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


if __name__ == "__main__":
    precheck.precheck_sweep_or_exit(sys.argv[1:], "search_config", checked)  # a sweep: every job checked first
    lifecycle.run_guarded(main, sys.argv[1:],  # failures outside the search's try: one line + a failed row
                          on_config_error=precheck.config_refusal(sys.argv[1:], "search_config"))  # as run.py
