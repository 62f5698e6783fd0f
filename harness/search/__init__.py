"""LongRoPE / LongRoPE2 rescale-factor search (``scripts/search_rope.py``; user guide ``docs/longrope_search.md``).

- ``critical_dim``: the critical-dimension formula, closed-form seed factors (PI / NTK / YaRN), mscale policies.
- ``evolution``: candidates, constraints, mutation / crossover, the population loop (resumable state).
- ``fitness``: candidate evaluation through the ``longrope`` method (PPL at the target length, or needle-driven
  PPL) and the fitness documents.

``run_search`` ties them together and returns the factors-file dict: ``short_factor``, ``long_factor`` (d/2 floats
each), ``original_max_position_embeddings``, ``max_position_embeddings``, ``attention_factor``, ``n_hat``,
``provenance``. The file format is shared with the ``longrope`` / ``longrope2`` methods; keep it.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from harness import conf_utils
from harness.config import ConfigError, to_args
from harness.methods.longrope import load_factors, su_mscale
from harness.methods.rope import rope_base
from harness.models import rotary_dim
from harness.results import atomic_write_json, config_hash
from harness.search import critical_dim as cd
from harness.search.evolution import Candidate, Evolution, Space, complete, project
from harness.search.fitness import Fitness, long_documents, needle_documents


@dataclass
class SearchArgs:
    """``conf/search/<name>.yaml``. Defaults = LongRoPE's search (paper Sec. 4.1, ``dim_mono.json``)."""

    name: str = "longrope"
    algorithm: str = "longrope"  # longrope | longrope2
    population: int = 64
    mutations: int = 16
    crossovers: int = 16
    parents: int = 32
    mutation_prob: float = 0.3
    crossover_prob: float = 0.15  # 0.3 * 0.5 in the original
    max_crossover_tries: int = 20
    iterations: int = 40
    step: float = 0.01  # factor grid (original list_step)
    seeds: list = field(default_factory=lambda: ["pi", "ntk", "yarn"])  # + yarn_freq | ramp | random
    init_factors: str = ""  # progressive extension: a previous factors file, rescaled to this target, as a seed
    # start tokens kept un-interpolated (LongRoPE's n_hat); [0] = not searched. Paper grid: 0,1,2,4,...,256
    n_hat_grid: list = field(default_factory=lambda: [0])
    # fitness
    fitness: str = "ppl"  # ppl (LongRoPE) | needle (LongRoPE2 needle-driven PPL)
    dataset: str = "shakespeare"  # text source or dir:<path> (PG19 on a cluster)
    split: str = "test"
    samples: int = 5  # documents (LongRoPE: 5 PG19 validation samples)
    # fitness windows start at token offset_windows * (L - 1) of each document (needle documents: their haystack).
    # 0 = the document start (LongRoPE's --truncate on PG19 *validation*); the tiny configs search on the test
    # split the ppl evaluator scores from token 0, so they use 2: disjoint from the evaluator's and verify's windows
    offset_windows: int = 0
    needles: int = 1  # needles per needle document
    batch: int = 4  # (candidate, document) rows per forward
    chunk: int = 1024
    # factor ranges
    lo_mult: float = 0.0  # searched-factor bounds as multiples of s; 0 = the algorithm's default
    hi_mult: float = 0.0  # (longrope: [1, s]; longrope2: [s, 2s])
    critical_dim: str = "none"  # none | theoretical | search | <int dim>  (longrope2: which pairs are searched)
    critical_window: int = 4  # pairs either side of the theoretical critical pair when critical_dim=search
    mscale: str = "su"  # su | yarn | <number>: attention factor on cos/sin at the target length
    time_budget_s: float = 0.0  # skip iterations that would end past this many seconds (0 = all); stays resumable
    # long | short. short = LongRoPE's recovery search (paper Sec. 3.3, "recovering the short context window"):
    # on the fine-tuned model, search the *short* factors (used at length <= C) at target_length <= C, with the long
    # factors, target, attention factor and n_hat fixed from ``init_factors`` (the factors it was fine-tuned with).
    # Range [1, hi_mult * s] (s of init_factors; the paper lowers the maximum, by an amount it does not give),
    # monotone; seeds: all ones (the original RoPE: what the method uses without
    # this search), the long factors, and 1 + t (long - 1) for t = 1/4, 1/2, 3/4.
    factors_for: str = "long"

    def validate(self) -> None:
        if self.algorithm not in ("longrope", "longrope2"):
            raise ConfigError(f"search={self.name}: algorithm must be longrope | longrope2, got {self.algorithm!r}")
        if self.factors_for not in ("long", "short"):
            raise ConfigError(f"search={self.name}: factors_for must be long | short, got {self.factors_for!r}")
        if self.factors_for == "short" and not self.init_factors:
            raise ConfigError(f"search={self.name}: factors_for=short needs init_factors (the factors file the model "
                              "was fine-tuned with: its long factors stay, its short factors are searched)")
        if self.fitness not in ("ppl", "needle"):
            raise ConfigError(f"search={self.name}: fitness must be ppl | needle, got {self.fitness!r}")
        if self.parents < 1 or self.population < self.parents:
            raise ConfigError(f"search={self.name}: need 1 <= parents <= population")
        for key in ("iterations", "samples", "batch"):
            v, low = getattr(self, key), 0 if key == "iterations" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"search.{key}: {v!r} is not an integer >= {low}")
        if not self.time_budget_s >= 0:
            raise ConfigError(f"search.time_budget_s: {self.time_budget_s!r} is not >= 0 (0 = no budget)")
        for sd in self.seeds:
            if sd not in ("pi", "ntk", "yarn", "yarn_freq", "ramp", "random"):
                raise ConfigError(f"search={self.name}: unknown seed {sd!r} "
                                  "(pi | ntk | yarn | yarn_freq | ramp | random)")
        cd.mscale_of(self.mscale, 2.0, 256)  # raises on an unknown policy


def rescale_factors(lam, s_old: float, s_new: float) -> np.ndarray:
    """LongRoPE's ``--auto-rescale-init-factors``: ``1 + (lam - 1)(s_new - 1)/(s_old - 1)``."""
    lam = np.asarray(lam, dtype=np.float64)
    if s_old <= 1:
        return np.full_like(lam, s_new)
    return 1 + (lam - 1) * (s_new - 1) / (s_old - 1)


def build_space(a: SearchArgs, d: int, base: float, C: int, s: float) -> Space:
    if a.algorithm == "longrope":
        lo, hi = (a.lo_mult or 1.0 / s) * s, (a.hi_mult or 1.0) * s
    else:
        lo, hi = (a.lo_mult or 1.0) * s, (a.hi_mult or 2.0) * s
    lo = max(lo, 1.0)
    if hi < lo:
        raise ConfigError(f"search={a.name}: empty factor range [{lo}, {hi}]")
    k_tcd = cd.critical_pair(d, base, C)
    mode = str(a.critical_dim).strip().lower()
    if a.algorithm == "longrope" and mode in ("", "none"):
        k, search_k, k_range = 0, False, (0, 0)
    elif mode in ("none", "", "theoretical"):
        k, search_k, k_range = k_tcd, False, (k_tcd, k_tcd)
    elif mode == "search":
        k_range = (max(1, k_tcd - a.critical_window), min(d // 2 - 1, k_tcd + a.critical_window))
        k, search_k = k_tcd, True
    else:
        try:
            k = int(mode) // 2
        except ValueError:
            raise ConfigError(f"search={a.name}: critical_dim must be none | theoretical | search | <int>") from None
        search_k, k_range = False, (k, k)
    k = min(max(k, k_range[0]), d // 2 - 1) if search_k else min(k, d // 2 - 1)
    return Space(d_half=d // 2, lo=lo, hi=hi, step=a.step, k=k, k_range=k_range, search_k=search_k,
                 n_hat_grid=tuple(int(n) for n in (a.n_hat_grid or [0])))


def seed_candidates(a: SearchArgs, space: Space, d: int, base: float, C: int, s: float,
                    seed: int = 0) -> list[Candidate]:
    """PI / NTK / YaRN factors (LongRoPE's seeds), optional ramps and random monotone vectors (useful for LongRoPE2,
    where PI / NTK / YaRN all project to the flat vector ``s`` above the critical pair), and ``init_factors``."""
    vecs = {"pi": cd.pi_factors(d, s), "ntk": cd.ntk_factors(d, s), "yarn": cd.yarn_factors(d, s, base, C),
            "yarn_freq": cd.yarn_frequency_factors(d, s, base, C)}
    out = [project(vecs[n], space, space.k) for n in a.seeds if n in vecs]
    n_searched = space.d_half - space.k
    if "ramp" in a.seeds:  # geometric ramps from lo to several tops over the searched pairs
        for top in np.linspace(space.lo, space.hi, 5)[1:]:
            j = np.arange(n_searched) / max(n_searched - 1, 1)
            lam = np.ones(space.d_half)
            lam[space.k:] = space.lo * (top / space.lo) ** j
            out.append(project(lam, space, space.k))
    if "random" in a.seeds:  # sorted uniform draws in [lo, hi]
        rng = np.random.default_rng(seed + 1)
        for _ in range(max(1, a.population // 4)):
            lam = np.ones(space.d_half)
            lam[space.k:] = np.sort(rng.uniform(space.lo, space.hi, n_searched))
            out.append(project(lam, space, space.k))
    if a.init_factors:
        prev = json.loads(Path(a.init_factors).read_text())
        s_old = float(prev["max_position_embeddings"]) / float(prev["original_max_position_embeddings"])
        lam = rescale_factors(prev["long_factor"], s_old, s)
        k = space.k
        if a.algorithm == "longrope2":
            k = int((prev.get("provenance") or {}).get("critical_pair", space.k))
            k = min(max(k, space.k_range[0]), space.k_range[1]) if space.search_k else space.k
        c = project(lam, space, k)
        c.n_hat = int(prev.get("n_hat") or 0) if int(prev.get("n_hat") or 0) in space.n_hat_grid else 0
        out.insert(0, c)
    if space.k > 0:  # LongRoPE2: the searched pairs start at least at the critical factor
        for c in out:
            complete(c, space)
    return out


def short_space(a: SearchArgs, prev: dict) -> Space:
    """The space of a short-factor search: every pair searched in [1, hi_mult * s] (s of the long factors' file;
    hi_mult 0 = 1), n_hat fixed at the file's. The paper "decreases the maximum allowable scale factors" of this
    search "to encourage less interpolation" at short lengths without saying by how much: ``search.hi_mult`` < 1."""
    s = float(prev["max_position_embeddings"]) / float(prev["original_max_position_embeddings"])
    hi = (a.hi_mult or 1.0) * s
    return Space(d_half=len(prev["long_factor"]), lo=1.0, hi=max(hi, 1.0 + a.step), step=a.step,
                 n_hat_grid=(int(prev.get("n_hat") or 0),))


def short_seeds(space: Space, prev: dict) -> list[Candidate]:
    """All ones (the original RoPE at length <= C: the longrope method without a recovery search), the long factors
    (what fine-tuning saw), and the blends ``1 + t (long - 1)``, t = 1/4, 1/2, 3/4 (monotone, as both ends are)."""
    long = np.asarray(prev["long_factor"], dtype=np.float64)
    out = [project(1 + t * (long - 1), space, 0) for t in (0.0, 1.0, 0.25, 0.5, 0.75)]
    for c in out:
        c.n_hat = space.n_hat_grid[0]
    return out


def factors_file(a: SearchArgs, best: Candidate, fitness: float, C: int, target: int, scale: float,
                 provenance: dict, prev: dict | None = None) -> dict:
    if a.factors_for == "short":  # the searched short factors beside the fine-tuned model's own long factors
        return {"short_factor": [round(float(v), 6) for v in best.lam], "long_factor": list(prev["long_factor"]),
                "original_max_position_embeddings": int(C), "max_position_embeddings":
                int(prev["max_position_embeddings"]), "attention_factor": float(scale),
                "n_hat": int(prev.get("n_hat") or 0),
                "provenance": {**provenance, "algorithm": a.algorithm, "best_fitness": fitness,
                               "factors_for": "short", "short_target": int(target),
                               "long_factors_from": str(a.init_factors), "critical_pair": 0, "critical_dim": 0}}
    return {"short_factor": [1.0] * len(best.lam), "long_factor": [round(float(v), 6) for v in best.lam],
            "original_max_position_embeddings": int(C), "max_position_embeddings": int(target),
            "attention_factor": float(scale), "n_hat": int(best.n_hat),
            "provenance": {**provenance, "algorithm": a.algorithm, "best_fitness": fitness,
                           "critical_pair": int(best.k), "critical_dim": 2 * int(best.k)}}


def run_search(model, tok, a: SearchArgs, C: int, target: int, state_path: str | Path, seed: int = 0,
               model_name: str = "", resume: bool = True, log=print, dtype: str = "auto",
               weights: str = "") -> tuple[dict, dict]:
    """Run (or resume) a search; returns (factors dict, info dict with the fitness curve and timings).

    A state file is resumed only when it belongs to the same search: same arguments (except ``iterations`` and
    ``time_budget_s``, which may grow), target, seed, model and ``weights`` (a digest of the weights, so a state
    scored on replaced weights or on another checkpoint is never mixed in)."""

    a.validate()
    d, base = rotary_dim(model.config), rope_base(model.config)
    short = a.factors_for == "short"
    prev = None
    if short:
        prev = load_factors(a.init_factors, d // 2, C)
        if target > C:
            raise ConfigError(f"factors_for=short: target_length {target} must be <= the native window {C} (the "
                              "short factors are used only there)")
        space = short_space(a, prev)
        s = float(prev["max_position_embeddings"]) / C
        scale = float(prev.get("attention_factor") or su_mscale(s, C))
    else:
        s = target / C
        if s <= 1:
            raise ConfigError(f"target_length {target} must exceed the native window {C}")
        space = build_space(a, d, base, C, s)
        scale = cd.mscale_of(a.mscale, s, C)
    if a.fitness == "ppl":
        ids, mask = long_documents(tok, a.dataset, a.split, a.samples, target, a.offset_windows), None
    else:
        ids, mask = needle_documents(tok, a.dataset, a.split, a.samples, target, seed, a.needles,
                                     offset_windows=a.offset_windows)
    fit = Fitness(model, ids, mask, lambda c: scale, a.batch, a.chunk, dtype, native_ctx=C, fixed_long=prev)
    evo = Evolution(space, a.population, a.mutations, a.crossovers, a.parents, a.mutation_prob, a.crossover_prob,
                    a.max_crossover_tries, seed)
    resumable = {k: v for k, v in asdict(a).items() if k not in ("iterations", "time_budget_s")}  # may grow
    fingerprint = config_hash({"args": resumable, "C": C, "target": target, "seed": seed, "model": model_name,
                               "d": d, "base": base, **({"weights": weights} if weights else {})})
    state_path = Path(state_path)
    t0, elapsed0 = time.time(), 0.0
    # one entry per generation (0 = the initial population): best fitness, evaluations, cumulative wall time
    progress: list[dict] = []
    resumes = 0
    if resume and state_path.exists():
        st = json.loads(state_path.read_text())
        if st.get("fingerprint") == fingerprint:
            evo.load_state(st["evolution"])
            elapsed0 = float(st.get("elapsed_s", 0.0))
            progress = list(st.get("progress", []))
            resumes = int(st.get("resumes", 0)) + 1
            log(f"resumed {state_path} at iteration {evo.iteration} ({evo.evaluations} evaluations, "
                f"{elapsed0:.0f}s so far)")
        else:
            log(f"state {state_path} belongs to another search (fingerprint differs); starting over")

    def save():
        elapsed = elapsed0 + time.time() - t0
        progress.append({"iteration": evo.iteration, "best": evo.best()[0], "evaluations": evo.evaluations,
                         "elapsed_s": round(elapsed, 1)})
        atomic_write_json(state_path, {"fingerprint": fingerprint, "elapsed_s": elapsed, "progress": progress,
                                       "resumes": resumes, "evolution": evo.state()})

    last_iter = [0.0]

    def over_budget():
        """Stop before an iteration that would end past the budget. Its duration is estimated from the previous
        iteration, or before the first one from the measured cost of a fitness row."""
        if a.time_budget_s <= 0:
            return False
        est = last_iter[0]
        if not est and fit.rows:
            est = fit.seconds / fit.rows * (a.mutations + a.crossovers) * int(ids.shape[0])
        return elapsed0 + time.time() - t0 + est > a.time_budget_s

    if not evo.scored:
        seeds = short_seeds(space, prev) if short else seed_candidates(a, space, d, base, C, s, seed)
        evo.initialize(seeds, fit)
        save()
        log(f"init: {len(evo.scored)} candidates, best fitness {evo.best()[0]:.4f} "
            f"({time.time() - t0:.0f}s)")
    stopped = "completed"
    while evo.iteration < a.iterations:
        if over_budget():
            stopped = f"time budget {a.time_budget_s:.0f}s reached at iteration {evo.iteration}"
            break
        t_it = time.time()
        evo.step(fit)
        last_iter[0] = time.time() - t_it
        save()
        log(f"iter {evo.iteration}/{a.iterations}: best {evo.best()[0]:.4f} "
            f"(evaluations {evo.evaluations}, {elapsed0 + time.time() - t0:.0f}s)")
    best_fit, best = evo.best()
    elapsed = elapsed0 + time.time() - t0
    k_tcd = cd.critical_pair(d, base, C)
    provenance = {"model": model_name, "target": target, "native_ctx": C, "scale": s, "seed": seed,
                  "search_config": asdict(a), "fitness_history": evo.curve, "evaluations": evo.evaluations,
                  "iterations": evo.iteration, "progress": progress, "rotary_dim": d, "rope_theta": base,
                  "theoretical_critical_dim": 2 * k_tcd, "mscale_policy": a.mscale, "elapsed_s": round(elapsed, 1),
                  "stopped": stopped, "fitness_metric": "needle_ppl" if a.fitness == "needle" else "ppl"}
    factors = factors_file(a, best, best_fit, C, target, scale, provenance, prev)
    info = {"fitness_curve": evo.curve, "best_fitness": best_fit, "evaluations": evo.evaluations,
            "iterations": evo.iteration, "elapsed_s": round(elapsed, 1), "stopped": stopped,
            "progress": progress, "resumes": resumes,
            "this_session": {"seconds": round(time.time() - t0, 1), "fitness_rows": fit.rows,
                             "fitness_seconds": round(fit.seconds, 1),
                             "seconds_per_row": round(fit.seconds / fit.rows, 2) if fit.rows else None,
                             "tokens_per_row": int(ids.shape[1])},
            "critical_dim": {"theoretical": 2 * k_tcd, "used": 2 * int(best.k),
                             "searched": bool(space.search_k)} if a.algorithm == "longrope2" else None,
            "n_hat": int(best.n_hat), "fitness_tokens": int(mask[:, 1:].sum()) if mask is not None
            else int(ids.shape[0] * (ids.shape[1] - 1))}
    if not math.isfinite(best_fit):
        log("warning: every candidate had a non-finite fitness")
    return factors, info


def recover_short_factors(handle, search: str, factors_file: str | Path, run_dir: str | Path, seed: int = 0,
                          log=print, autocast: str = "auto") -> tuple[Path, dict]:
    """LongRoPE's recovery stage (paper Sec. 3.3) inside a run: the short-factor search ``conf/search/<search>.yaml``
    (``factors_for: short``) on the fine-tuned ``handle.model`` at length C, the long factors fixed from
    ``factors_file`` (the ones it was fine-tuned with). Writes ``<run_dir>/recovered_factors.json`` (its
    ``provenance.model_path`` = the run's checkpoint) and returns (that path, what the row records)."""

    node = conf_utils.compose([f"search={search}"], config_name="search_config").search
    a = to_args(SearchArgs, node, f"search={search}")
    if a.factors_for != "short":
        raise ConfigError(f"method.recovery={search}: that search config has factors_for={a.factors_for!r}; the "
                          "recovery stage needs a short-factor search (factors_for: short)")
    a.init_factors = str(factors_file)
    run_dir = Path(run_dir)
    C = int(handle.native_ctx)
    t0 = time.time()
    factors, info = run_search(handle.model, handle.tokenizer, a, C, C, run_dir / "recovery_state.json", seed=seed,
                               model_name=handle.name, resume=False, log=log, dtype=autocast)
    factors["provenance"]["model_path"] = str(run_dir / "checkpoint")
    out = run_dir / "recovered_factors.json"
    atomic_write_json(out, factors)
    return out, {"stage": "longrope_recovery", "search": search, "factors_file": str(out),
                 "long_factors_from": str(factors_file), "best_fitness": info["best_fitness"],
                 "fitness_curve": info["fitness_curve"], "evaluations": info["evaluations"],
                 "seconds": round(time.time() - t0, 1), "short_factor": factors["short_factor"]}

