"""Every number the tables, figures and findings show, with its sample size and 95% interval, read from the rows.

An ``Est`` is a value, its interval, n and the per-sample scores behind it (so that two methods can be compared
sample by sample). Where the row keeps per-sample scores (rows written since issue 20) they are used; older rows
are read as far as they allow and say what is missing:

- passkey: ``correct[L]`` (0/1 per prompt, prompt order, the same prompts for every method: paired); older rows:
  the count ``accuracy x samples_per_length`` (exact for a proportion; unpaired). Wilson interval.
- NIAH: ``grid[L]`` (one needle per depth, the same needles for every method: paired); Wilson on the summed
  word-overlap scores (``harness.stats.bounded_interval``).
- RULER: ``per_sample[task][L]`` (paired); older rows ran 1 sample per task, so each task's score is that sample.
- PPL: ``per_sample[L]`` = per-window mean NLL (documents in order: paired); bootstrap over windows. Older rows
  keep no per-document NLL: no interval, and the reason is given.
- NLL by position: ``per_doc`` bucket means (paired) and the evaluator's band ``ci_lo`` / ``ci_hi``.

``floor()`` decides whether an evaluator is measurable for a model at all (the evaluator's ``floor``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from controlled_study import samples
from controlled_study.rows import Entry, RowSet, native_ctx, num
from harness import stats
from harness.evals import EVALS


@dataclass
class Est:
    value: float | None
    lo: float | None = None
    hi: float | None = None
    n: int | None = None
    unit: str = ""            # what n counts: prompts, documents, depths, samples
    kind: str = ""            # proportion | bounded (0..top) | ppl | mean
    samples: list | None = None   # per-sample scores (ppl: per-window NLL), sample order when ``paired``
    paired: bool = False      # samples aligned across methods (same prompts / documents in the same order)
    top: float = 1.0          # the scale of a bounded score (RULER: 100)
    note: str = ""            # why there is no interval
    run_id: str | None = None
    keys: tuple = ()          # which lengths the samples come from (pairing needs the same keys)
    over: tuple = ()          # a pooled score: the length factors (multiples of C) it pools, as a part names them

    @property
    def ci(self):
        return (self.lo, self.hi) if self.lo is not None and self.hi is not None else None


def _series(m: dict, key: str, L) -> object:
    s = m.get(key)
    return s.get(str(L)) if isinstance(s, dict) else None


# -- per evaluator, one suite entry's metrics at one length --------------------------------------------------------
def passkey(m: dict, L) -> Est | None:
    acc = num(_series(m, "accuracy", L))
    if acc is None:
        return None
    corr = _series(m, "correct", L)
    if isinstance(corr, list) and corr:
        x, paired = [float(v) for v in corr], True
    else:
        n = m.get("samples_per_length")
        if not isinstance(n, int) or n <= 0:
            return Est(acc, kind="proportion", note="no sample count in the row")
        k = int(round(acc * n))
        x, paired = [1.0] * k + [0.0] * (n - k), False  # the count is exact; the prompt order is not kept
    lo, hi = stats.wilson(sum(x), len(x))
    return Est(acc, lo, hi, len(x), "prompts", "proportion", x, paired)


def niah(m: dict, L) -> Est | None:
    g = _series(m, "grid", L)
    if not isinstance(g, dict) or not g:
        v = num(_series(m, "score", L))
        return Est(v, kind="bounded", note="no per-depth grid in the row") if v is not None else None
    pts = sorted(((float(d), num(v)) for d, v in g.items()), key=lambda t: t[0])
    x = [v for _, v in pts if v is not None]
    if not x:
        return None
    est = stats.bounded_interval(x)
    return Est(est[0], est[1], est[2], len(x), "depths", "bounded", x, True)


def ruler_task(m: dict, task: str, L) -> Est | None:
    series = (m.get("tasks") or {}).get(task)
    v = num(series.get(str(L))) if isinstance(series, dict) else None
    if v is None:
        return None
    ps = ((m.get("per_sample") or {}).get(task) or {}).get(str(L)) if isinstance(m.get("per_sample"), dict) else None
    if isinstance(ps, list) and ps:
        x, paired = [float(s) for s in ps], True
    elif (m.get("samples_per_task") or 0) == 1:
        x, paired = [v], False
    else:
        return Est(v, kind="bounded", top=100.0, note="per-sample scores not in the row")
    est = stats.bounded_interval(x, 100.0)
    return Est(v, est[1], est[2], len(x), "samples", "bounded", x, paired, top=100.0)


def ruler_average(m: dict, L) -> Est | None:
    v = num(_series(m, "average", L))
    if v is None:
        return None
    over = (m.get("average_over") or {}).get(str(L)) or list((m.get("tasks") or {}).keys())
    strata = []
    for t in over:
        e = ruler_task(m, t, L)
        if e is None:
            continue
        if e.samples is None:
            return Est(v, kind="bounded", top=100.0, note=e.note)
        strata.append(e.samples)
    if not strata:
        return Est(v, kind="bounded", top=100.0, note="no task scores in the row")
    est = stats.bounded_interval(strata, 100.0)
    flat = [s for g in strata for s in g]
    paired = isinstance(m.get("per_sample"), dict)
    return Est(v, est[1], est[2], len(flat), "samples" if paired else "tasks (1 sample each)", "bounded",
               flat, paired, top=100.0)


def ppl(m: dict, L) -> Est | None:
    v = num(_series(m, "ppl", L))
    if v is None:
        return None
    x = _series(m, "per_sample", L)
    docs = m.get("documents")
    if not isinstance(x, list) or not x:
        return Est(v, n=docs if isinstance(docs, int) else None, unit="documents", kind="ppl",
                   note="per-document NLL not in the row")
    x = [float(s) for s in x]
    est = stats.ppl_interval(x)
    if est is None:
        return Est(v, n=len(x), unit="windows", kind="ppl", samples=x, paired=True,
                   note=f"fewer than {stats.MIN_DOCS} windows, or PPL not finite")
    scale = v / est[0] if est[0] else 1.0  # longlora protocol: 2.71828 ** mean
    return Est(v, est[1] * scale, est[2] * scale, len(x), "documents" if m.get("protocol") != "longlora" else
               "windows", "ppl", x, True)


def pooled(ests: list[Est | None], over=()) -> Est | None:
    """Mean over lengths of a proportion or bounded score, with the interval of the pooled samples (equal n per
    length: the mean of the per-length means is the pooled mean). ``over``: the length factors of ``ests`` (those
    that have a value are recorded, ``Est.over``, so that a part names the lengths it pooled)."""
    over = tuple(f for f, e in zip(over, ests) if e is not None) if over else ()
    ests = [e for e in ests if e is not None]
    if not ests:
        return None
    v = float(np.mean([e.value for e in ests]))
    if any(e.samples is None for e in ests):
        return Est(v, kind=ests[0].kind, top=ests[0].top, note=next(e.note for e in ests if e.samples is None),
                   over=over)
    top = ests[0].top
    est = stats.bounded_interval([e.samples for e in ests], top)
    flat = [s for e in ests for s in e.samples]
    return Est(v, est[1], est[2], len(flat), ests[0].unit, ests[0].kind, flat, all(e.paired for e in ests), top,
               keys=tuple(k for e in ests for k in e.keys), over=over)


def lengths_text(factors) -> str:
    """Length factors as a part names them: ``C, 2C, 4C``."""
    return ", ".join("C" if f == 1 else f"{f:g}C" for f in factors)


def accuracy_pct(m: dict, L) -> Est | None:
    """LongBench v2: ``accuracy[L]`` in % and ``per_sample[L]`` (0/1, 0.25 when compensated; item order: paired)."""
    v = num(_series(m, "accuracy", L))
    if v is None:
        return None
    x = _series(m, "per_sample", L)
    if not isinstance(x, list) or not x:
        return Est(v, kind="bounded", top=100.0, note="per-item scores not in the row")
    x = [100.0 * float(s) for s in x]
    est = stats.bounded_interval(x, 100.0)
    return Est(v, est[1], est[2], len(x), "items", "bounded", x, True, top=100.0)


# the readers by the shape of an evaluator's output; an evaluator names its own (``reader``, harness.evals): babilong
# and helmet_recall rows have RULER's shape (average / average_over / tasks / per_sample[task][L], 0..100)
SHAPES = {"proportion": passkey, "niah": niah, "ruler": ruler_average, "ppl": ppl, "percent": accuracy_pct}


def evaluator(rs: RowSet, source: str):
    """The evaluator class behind a ``spec.yaml`` source (its ``evaluator``, or ``reads`` for a source matched by
    suite entries only): what it declares is how the tables read it."""
    src = rs.spec["sources"][source]
    return EVALS.get(src.get("evaluator") or src["reads"])


def spec(rs: RowSet, source: str):
    """What the source's evaluator declares (``harness.evals.Spec``)."""
    return evaluator(rs, source).spec


def reader(rs: RowSet, source: str):
    """``fn(metrics, length) -> Est``: the reader the source's evaluator declares (``SHAPES``)."""
    return SHAPES[spec(rs, source).reader]


def metric(rs: RowSet, source: str) -> str:
    """The headline metric the source's evaluator declares (its per-length series in the row)."""
    return spec(rs, source).metric


def records(rs: RowSet, source: str) -> dict | None:
    """The fields of the per-sample records the source's evaluator declares (``records``: ``length``, ``task``,
    ``score``); None when it declares none."""
    return spec(rs, source).records


def at(rs: RowSet, e: Entry, source: str, factor: float, reader_fn=None) -> Est | None:
    """The newest row of ``e`` with a value for ``source`` at length factor x C, as an ``Est``."""
    fn = reader_fn or reader(rs, source)

    def get(m, r):
        c = native_ctx(r)
        if not c:
            return None
        L = int(round(factor * c))
        if abs(L / c - factor) > 1e-9:
            return None
        x = fn(m, L)
        if x is not None:
            x.keys = (L,)
        return x

    p = rs.pick(e, source, get)
    x = p.value
    if x is not None:
        x.run_id = (p.row or {}).get("run_id")
        if x.ci is None and x.value is not None and reader_fn is None:
            _from_records(rs, p, source, x)
    return x


def _from_records(rs: RowSet, p, source: str, x: Est) -> None:
    """Rows without per-sample scores but with their run directory at hand: the interval from the per-sample
    records (``samples/<entry or evaluator>.jsonl``, ``controlled_study.samples``) read by the fields the evaluator
    declares (``records``; a mean over tasks grouped by its ``task``), when they reproduce the row's number."""

    rec = records(rs, source)
    if not rec or "length" not in rec or not x.keys:
        return
    ci = samples.interval_for(p.row, [p.entry_key, evaluator(rs, source).registered_name], list(rec["score"]),
                              {rec["length"]: x.keys[0]}, rec.get("task"), x.value)
    if ci is not None:
        x.lo, x.hi, x.note = ci[0], ci[1], ""


RULER_THRESHOLD = 85.6  # RULER's effective-length bar: LLaMA2-7B's (chat) RULER score at 4k, in % (NVIDIA/RULER README)


def effective_length(rs: RowSet, e: Entry, source: str, threshold: float) -> dict | None:
    """RULER's effective length of ``e`` on ``source`` (``ruler`` or ``niah``, scores as % of their scale): the
    longest evaluated length up to which every evaluated length scores at least ``threshold`` (RULER's rule on its
    point scores), as a factor of C. ``{"factor": f, "at_least": True}`` when every length passes (the longest
    tested is a floor, not the effective length), ``{"factor": None, ...}`` when even the shortest fails; with the
    scores read and the lengths tested. None without a score."""
    fs = lengths_of(rs, e, source)
    xs = [(f, at(rs, e, source, f)) for f in fs]
    xs = [(f, 100.0 * x.value / (x.top or 1.0)) for f, x in xs if x is not None and x.value is not None]
    if not xs:
        return None
    best = None
    for f, v in xs:
        if v < threshold:
            break
        best = f
    return {"factor": best, "at_least": best is not None and best == xs[-1][0], "threshold": threshold,
            "tested": [f for f, _ in xs], "scores": [round(v, 1) for _, v in xs]}


def effective_text(r: dict | None) -> str:
    """``2C``, ``>= 16C`` (every length passes: the longest tested), ``< C`` (the shortest fails), or a dash."""
    if r is None:
        return "\u2014"
    if r["factor"] is None:
        return f"< {r['tested'][0]:g}C"
    return (">= " if r["at_least"] else "") + f"{r['factor']:g}C"


def same_outcomes(rs: RowSet, entries: list[Entry], source: str) -> list[tuple[list[Entry], int]]:
    """Groups of two or more of ``entries`` whose per-prompt outcomes on ``source`` are identical, prompt by prompt,
    at every length they were evaluated at, and vary between prompts at one length at least (all right or all wrong
    at each length says nothing about identity), each with its number of prompts: their lines in a figure and their
    rows in a table coincide, and a comparison counts them once. Identical outcomes are not identical methods
    (LM-Infinite and StreamingLLM attend to different keys and decode different text on a few prompts of the tiny
    study, yet are right and wrong on the same ones): the readers say which coincide, not why."""
    same: dict = {}
    for e in entries:
        fs = lengths_of(rs, e, source)
        xs = [at(rs, e, source, f) for f in fs]
        if not xs or any(x is None or x.samples is None or not x.paired for x in xs):
            continue
        if all(len(set(x.samples)) < 2 for x in xs):   # the same outcome on every prompt of each length
            continue
        same.setdefault(tuple((f, tuple(x.samples)) for f, x in zip(fs, xs)), []).append(e)
    return [(group, sum(len(x) for _, x in outcomes)) for outcomes, group in same.items() if len(group) > 1]


def same_outcome_notes(rs: RowSet, entries: list[Entry], source: str, what: str) -> list[str]:
    """One line per group of :func:`same_outcomes` for a table's footnotes or a figure's caption."""
    return [f"{' and '.join(e.label for e in group)}: the same {what} outcome on every one of the {n} prompts (right "
            f"or wrong, prompt by prompt, at every length), so their lines coincide and one hides the other; "
            f"the same outcomes, not the same method" for group, n in same_outcomes(rs, entries, source)]


def lengths_of(rs: RowSet, e: Entry, source: str) -> list[float]:
    """Length factors (multiples of C) at which ``e`` has ``source``'s headline metric (its evaluator's ``metric``)."""
    series = metric(rs, source)
    fs = set()
    for r in e.rows:
        c = native_ctx(r)
        for k in rs.entry_keys(r, source):
            s = (r["metrics"][k] or {}).get(series)
            if isinstance(s, dict) and c:
                for L in s:
                    try:
                        fs.add(int(L) / c)
                    except (TypeError, ValueError):
                        pass
    return sorted(fs)


# -- floors and ceilings ------------------------------------------------------------------------------------------
@dataclass
class Floor:
    measurable: bool = True
    reason: str = ""
    base: Est | None = None
    threshold: float | None = None
    values: list = field(default_factory=list)


def floor(rs: RowSet, model: str, source: str, task: str | None = None) -> Floor:
    """Is ``source`` (passkey | niah | ruler | ...; ``task``: one RULER task) measurable for ``model``? The rule is
    the source's evaluator's ``floor`` (the base at C below the threshold, or every method at chance / at the
    ceiling); always measurable when it declares none."""
    rule = spec(rs, source).floor
    if not rule:
        return Floor()
    thr, chance, ceil = rule.get("threshold"), rule.get("chance"), rule.get("ceiling")
    read = (lambda m, L: ruler_task(m, task, L)) if task else reader(rs, source)
    ents = rs.for_model(model)
    unit = f" {task}" if task else ""
    values = []
    for e in ents:
        for f in (lengths_of(rs, e, source) if not task else task_factors(rs, e, task)):
            x = at(rs, e, source, f, read)
            if x is not None and x.value is not None and math.isfinite(x.value):
                values.append((e, f, x))
    out = Floor(threshold=thr, values=values)
    base = [e for e in ents if e.method == "base" and e.frozen]
    if base and thr is not None:
        bv = sorted([(f, x) for e, f, x in values if e is base[0]], key=lambda t: t[0])
        at_c = [t for t in bv if abs(t[0] - 1) < 1e-9] or [t for t in bv if t[0] >= 1] or bv
        if at_c:
            f, x = at_c[0]
            out.base = x
            where = "C" if abs(f - 1) < 1e-9 else f"{f:g}C (its shortest length: the task does not fit in C)"
            if x.value < thr:
                out.measurable = False
                out.reason = (f"{source}{unit}: the base model ({base[0].label}) scores {_fmt(x)} at {where}, below "
                              f"the threshold {thr:g}")
                return out
    if values and chance is not None and all(x.value <= chance for _, _, x in values):
        out.measurable = False
        out.reason = f"{source}{unit}: every method scores {chance:g} at every length"
    elif values and ceil is not None and all(x.value >= ceil - 1e-9 for _, _, x in values):
        out.measurable = False
        out.reason = f"{source}{unit}: every method is at the ceiling ({ceil:g}) at every length"
    return out


def task_factors(rs: RowSet, e: Entry, task: str) -> list[float]:
    fs = set()
    for r in e.rows:
        c = native_ctx(r)
        for k in rs.entry_keys(r, "ruler"):
            s = ((r["metrics"][k] or {}).get("tasks") or {}).get(task)
            if isinstance(s, dict) and c:
                fs |= {int(L) / c for L in s if str(L).isdigit()}
    return sorted(fs)


def _fmt(x: Est) -> str:
    d = 2 if x.top == 1.0 else 1
    s = f"{x.value:.{d}f}"
    if x.ci:
        s += f" [{x.lo:.{d}f}, {x.hi:.{d}f}]"
    if x.n:
        s += f" (n = {x.n} {x.unit})".replace(" )", ")")
    return s


fmt = _fmt
