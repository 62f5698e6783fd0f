"""The evolutionary search of LongRoPE (Ding et al. 2024, Alg. 1; ``microsoft/LongRoPE evolution/algorithms/
{genetic_base,dim_mono}.py``) and its LongRoPE2 variant (Shang et al. 2025, Sec. 3.2), written from the paper and
the notes (``../shared/notes/methods.md`` Sec. 8.2 / 9), not copied.

A candidate is a full factor vector ``lam`` (d/2 floats, ``theta'_i = theta_i / lam_i``) plus two integer genes:
``n_hat`` (start tokens kept with the original RoPE; LongRoPE's second non-uniformity) and ``k`` (the first searched
pair; LongRoPE2's critical pair, 0 for LongRoPE). Constraints (``Space``):

- searched pairs ``i >= k`` lie on a grid of step ``step`` (original ``list_step`` 0.01) within ``[lo, hi]`` and
  are monotone non-decreasing in ``i`` (the original ``dim_mono`` constraint ``np.diff >= 0``). LongRoPE:
  ``[1, s]``. LongRoPE2: ``[lo_mult * s, hi_mult * s]`` (its released LLaMA3 factors are all above s beyond the
  critical dimension; the upper bound is our choice, the paper does not print one);
- pairs ``i < k`` are not searched: ``lam_i = lam_k^(i/k)`` (NTK-like, ``critical_dim.ntk_below``).

Operators (original hyper-parameters in ``default_hyper_params/dim_mono.json``): mutation changes each searched
pair with probability ``p`` (0.3) to a grid value between its (already mutated) left neighbour and its right
neighbour, which keeps monotonicity by construction; crossover takes each gene from the second parent with
probability ``crossover_prob`` (0.3 * 0.5) and is retried up to ``max_crossover_tries`` (20) times until the child
is valid; duplicates of any candidate ever evaluated are rejected (``history``). Each iteration evaluates
``mutations`` + ``crossovers`` new children of parents drawn from the top ``parents``, and the population becomes the
best ``population`` of old + new. The whole state (population, history, RNG, fitness curve) serialises to JSON, so
a search can be killed and resumed.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from harness.search.critical_dim import ntk_below


@dataclass
class Space:
    d_half: int  # number of RoPE pairs
    lo: float  # bounds of searched factors
    hi: float
    step: float = 0.01
    k: int = 0  # first searched pair (critical pair); 0 = all pairs searched (LongRoPE)
    k_range: tuple = (0, 0)  # inclusive range of k when k is searched (LongRoPE2 "real critical dimension")
    search_k: bool = False
    n_hat_grid: tuple = (0,)  # candidate start-token counts; (0,) = not searched

    def snap(self, x):
        """Round onto the grid ``lo + j * step`` (and into [lo, hi])."""
        x = np.clip(np.asarray(x, dtype=np.float64), self.lo, self.hi)
        return np.clip(self.lo + np.round((x - self.lo) / self.step) * self.step, self.lo, self.hi)


@dataclass
class Candidate:
    lam: np.ndarray
    n_hat: int = 0
    k: int = 0

    def key(self) -> tuple:
        return (tuple(np.round(self.lam, 6).tolist()), int(self.n_hat), int(self.k))

    def to_json(self) -> dict:
        return {"lam": [float(v) for v in self.lam], "n_hat": int(self.n_hat), "k": int(self.k)}

    @staticmethod
    def from_json(o: dict) -> Candidate:
        return Candidate(np.asarray(o["lam"], dtype=np.float64), int(o.get("n_hat", 0)), int(o.get("k", 0)))


def complete(cand: Candidate, space: Space) -> Candidate:
    """Fill the pairs below the critical pair from the critical pair's factor (LongRoPE2); no-op when k = 0."""
    k = cand.k
    if k > 0:
        cand.lam[:k] = ntk_below(cand.lam[k] if k < space.d_half else space.hi, k)
    return cand


def is_valid(cand: Candidate, space: Space, tol: float = 1e-9) -> bool:
    lam = cand.lam
    if lam.shape != (space.d_half,) or not np.all(np.isfinite(lam)):
        return False
    s = lam[cand.k:]
    if s.size and (s.min() < space.lo - tol or s.max() > space.hi + tol or np.any(np.diff(s) < -tol)):
        return False
    if cand.k > 0 and np.any(np.diff(lam) < -tol):
        return False
    if space.search_k and not (space.k_range[0] <= cand.k <= space.k_range[1]):
        return False
    if not space.search_k and cand.k != space.k:
        return False
    return int(cand.n_hat) in {int(n) for n in space.n_hat_grid}


def project(lam, space: Space, k: int) -> Candidate:
    """A seed vector made valid: searched pairs snapped into [lo, hi] and made monotone (running max)."""
    lam = np.asarray(lam, dtype=np.float64).copy()
    lam[k:] = np.maximum.accumulate(space.snap(lam[k:]))
    return complete(Candidate(lam, 0, k), space)


def _grid_between(a: float, b: float, space: Space, rng: np.random.Generator) -> float:
    ja = math.ceil((a - space.lo) / space.step - 1e-9)
    jb = math.floor((b - space.lo) / space.step + 1e-9)
    if jb <= ja:
        return float(np.clip(a, space.lo, space.hi))
    return float(min(space.lo + int(rng.integers(ja, jb + 1)) * space.step, space.hi))


def mutate(parent: Candidate, space: Space, rng: np.random.Generator, p: float = 0.3) -> Candidate:
    lam = parent.lam.copy()
    k, n_hat = parent.k, parent.n_hat
    if space.search_k and rng.random() < p:
        k = int(np.clip(k + rng.choice([-1, 1]), space.k_range[0], space.k_range[1]))
        if k < parent.k:  # newly searched pairs start equal to the old critical factor (keeps monotonicity)
            lam[k:parent.k] = lam[parent.k] if parent.k < space.d_half else space.hi
    if len(space.n_hat_grid) > 1 and rng.random() < p:
        n_hat = int(rng.choice(space.n_hat_grid))
    last = space.d_half - 1
    for i in range(k, space.d_half):
        if rng.random() < p:
            left = lam[i - 1] if i > k else space.lo
            right = lam[i + 1] if i < last else space.hi
            lam[i] = _grid_between(max(left, space.lo), min(right, space.hi), space, rng)
    return complete(Candidate(lam, n_hat, k), space)


def crossover(a: Candidate, b: Candidate, space: Space, rng: np.random.Generator, prob: float = 0.15,
              tries: int = 20) -> Candidate | None:
    """Uniform crossover: each searched gene from ``b`` with probability ``prob``, else from ``a``; retried until the
    child is valid (monotone). None if every try fails."""
    for _ in range(tries):
        take = rng.random(space.d_half) < prob
        lam = np.where(take, b.lam, a.lam)
        k = b.k if (space.search_k and rng.random() < prob) else a.k
        n_hat = b.n_hat if rng.random() < prob else a.n_hat
        child = complete(Candidate(lam.astype(np.float64), n_hat, k), space)
        if is_valid(child, space):
            return child
    return None


@dataclass
class Evolution:
    """Population bookkeeping; the caller provides ``evaluate(list[Candidate]) -> list[float]`` (lower = better)."""

    space: Space
    population: int = 64
    mutations: int = 16
    crossovers: int = 16
    parents: int = 32
    mutation_prob: float = 0.3
    crossover_prob: float = 0.15
    max_crossover_tries: int = 20
    seed: int = 0
    scored: list = field(default_factory=list)  # [(fitness, Candidate)] current population, sorted
    history: dict = field(default_factory=dict)  # key -> fitness of every candidate ever evaluated
    curve: list = field(default_factory=list)  # best fitness after the initial population and each iteration
    iteration: int = 0
    evaluations: int = 0

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)

    # -- state -------------------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"iteration": self.iteration, "evaluations": self.evaluations, "curve": self.curve,
                "population": [{"fitness": f, **c.to_json()} for f, c in self.scored],
                "history": [[list(k[0]), k[1], k[2], v] for k, v in self.history.items()],
                "rng": json.loads(json.dumps(self.rng.bit_generator.state))}

    def load_state(self, st: dict) -> None:
        self.iteration, self.evaluations, self.curve = st["iteration"], st["evaluations"], list(st["curve"])
        self.scored = [(float(o["fitness"]), Candidate.from_json(o)) for o in st["population"]]
        self.history = {(tuple(h[0]), int(h[1]), int(h[2])): float(h[3]) for h in st["history"]}
        self.rng.bit_generator.state = st["rng"]

    # -- search ------------------------------------------------------------------------------------------------
    def _new(self, cands, out):
        for c in cands:
            if c is not None and is_valid(c, self.space) and c.key() not in self.history \
                    and all(c.key() != o.key() for o in out):
                out.append(c)

    def _score(self, cands, evaluate):
        fits = evaluate(cands) if cands else []
        for c, f in zip(cands, fits):
            f = float(f) if f is not None and math.isfinite(f) else float("inf")
            self.history[c.key()] = f
            self.scored.append((f, c))
        self.evaluations += len(cands)
        self.scored.sort(key=lambda t: t[0])
        self.scored = self.scored[: self.population]

    def initialize(self, seeds: list[Candidate], evaluate) -> None:
        """Evaluate the seeds, then fill the population with mutations of them (the original seeds its population
        with the initial factors and mutates them until ``population`` distinct candidates exist)."""
        init: list[Candidate] = []
        self._new(seeds, init)
        tries = 0
        while len(init) < self.population and tries < 50 * self.population:
            tries += 1
            base = init[int(self.rng.integers(len(init)))] if init else seeds[0]
            self._new([mutate(base, self.space, self.rng, self.mutation_prob)], init)
        self._score(init[: self.population], evaluate)
        self.curve.append(self.best()[0])

    def step(self, evaluate) -> None:
        top = [c for _, c in self.scored[: self.parents]]
        new: list[Candidate] = []
        tries = 0
        while len(new) < self.mutations and tries < 20 * max(self.mutations, 1):
            tries += 1
            self._new([mutate(top[int(self.rng.integers(len(top)))], self.space, self.rng, self.mutation_prob)], new)
        n_mut, tries = len(new), 0
        while len(new) < n_mut + self.crossovers and len(top) > 1 and tries < 20 * max(self.crossovers, 1):
            tries += 1
            i, j = self.rng.choice(len(top), 2, replace=False)
            self._new([crossover(top[i], top[j], self.space, self.rng, self.crossover_prob,
                                 self.max_crossover_tries)], new)
        self._score(new, evaluate)
        self.iteration += 1
        self.curve.append(self.best()[0])

    def best(self) -> tuple[float, Candidate]:
        return self.scored[0]
