"""The controlled study's thirteen findings, each tested on the rows with a coded verdict rule.

Every finding is one or more **parts**; a part is a 95% interval for a quantity whose sign (or position against a
stated margin) the paper asserts, e.g. "passkey accuracy of NTK-32K minus that of YaRN (FT), same prompts, > 0".
A finding about a group (fine-tuned exact methods vs approximate ones) has the group mean as one part and every
member pair as a part of its own, so a mean cannot hide a member that goes the other way. The rule
(``Part.verdict``, ``verdict``):

- a part is ``reproduced`` when its interval lies entirely on the paper's side of the margin (0 for a difference),
  ``contradicted`` when it lies entirely on the other side, ``inconclusive`` when it contains the margin, or when
  there is no interval (missing rows, a metric not measurable at this scale, rows without per-sample scores);
- a finding is ``reproduced`` when every part is, ``mixed`` when some parts are reproduced and others contradicted,
  ``contradicted`` when some are contradicted and none reproduced, else ``inconclusive`` (with the reason: "no rows:
  ...", "not measurable at this scale: ...", "interval includes 0");
- the same rule after Holm's correction over every part of every finding (``correct``): a part keeps its side only
  when Holm's step-down rejects "the quantity equals the margin" at family-wise 5% (p-values by inverting each
  part's own interval, ``stats.p_value``), and is inconclusive otherwise;
- where fine-tuned configurations have rows of several training seeds, every finding is decided once per seed
  (``RowSet.reseeded``: the other seed's rows wherever an entry has them) and keeps its verdict only when every seed
  gives the same one; otherwise it is ``inconclusive`` ("depends on the training seed"), ``seeded``. Holm's
  correction runs over each seed's own parts: a verdict can only be lost across seeds, never gained, so the reported
  Holm verdicts keep the shown seed's family-wise 5% (a wrong call in the report is a wrong call in that family);
- every finding is decided a second time with the rows that failed the convergence gate put back
  (``sensitivity``): a line beside the verdict, never the verdict.

Intervals: paired where the two numbers come from the same prompts / documents (Newcombe's paired interval for
accuracies over hundreds of prompts; for perplexity and NLL, the Student t interval of the mean per-document
difference over the 8 documents, exponentiated for a PPL ratio: ``stats.SMALL_N``, chosen by the coverage simulation
in ``tests/test_stats.py``, where the percentile bootstrap undercovers), unpaired otherwise (Newcombe's hybrid score
interval). A part is called **fragile** when a second reasonable interval sits on another side of the margin: over
few documents the BCa bootstrap interval (the other candidate at small n) beside the t interval; over prompts the
bootstrap (paired on the same prompts) beside Newcombe's interval. "Needle" is the NIAH score averaged over the
evaluated lengths (the paper's Table 1), or passkey accuracy where NIAH is not measurable for the model
(``estimates.floor``); PPL is the PG19 analogue (``ppl_books``).

References follow the paper's protocol: a long-context gain is measured against an in-window reference (the paper
scores LLaMA2 in 4k chunks; here LM-Infinite, whose attention window is C), a short-context cost against the
same-data control (the base fine-tuned inside C with the same recipe on the same mixture: the study's mixture is the
evaluation's own domain, so fine-tuning alone lowers the NLL inside C); each finding states its references
(``Finding.reference``). Configurations whose per-prompt Needle outcomes are identical at every length give the same
evidence (``Evidence.duplicates``) and are counted once.
Nothing here is hard-coded but the paper's claims (direction, lengths, methods) and its numbers for comparison.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controlled_study import estimates as est
from controlled_study.paper import Paper
from controlled_study.rows import Entry, RowSet, native_ctx
from harness import stats
from harness.methods import METHODS

REPRODUCED, CONTRADICTED, MIXED, INCONCLUSIVE = "reproduced", "contradicted", "mixed", "inconclusive"


DASH = "\u2014"


RULER_STYLE = "the project's RULER-style tasks"   # our generator's samples, not RULER's own (docs/ruler_check.md)


VERDICTS = (REPRODUCED, CONTRADICTED, MIXED, INCONCLUSIVE)


DEFAULT_MODEL = "tiny_llama"  # the study's model when there are no rows at all


WINDOW_REF = "lm_infinite"   # the in-window reference: attention window C, the paper's own C-window method


TRAIN_F = 8.0     # the paper's 32k = 8C


LONG_F = 16.0     # its 64k = 16C: beyond the training length


def exact_ft(paper: Paper) -> list[str]:
    """The paper's fine-tuned exact-attention methods: its Table 1 rows (in its order) whose method is of the exact
    family and trains (``harness.methods.facts``)."""
    return [k for k in _table1_keys(paper) if _fam(k) == "exact" and METHODS.facts(k).trains]


def approx(paper: Paper) -> list[str]:
    """The paper's approximate-attention methods: its Table 1 rows whose method is of the approximate family."""
    return [k for k in _table1_keys(paper) if _fam(k) == "approximate"]


def ft_32k(paper: Paper) -> list[str]:
    """Those of :func:`exact_ft` the paper fine-tuned at 32k = 8C (its Table 2 "Len" column)."""
    at_32k = {r["key"] for r in paper.table("table2_pg19")["rows"] if r.get("len") == "32k"}
    return [k for k in exact_ft(paper) if k in at_32k]


def _table1_keys(paper: Paper) -> list[str]:
    return [r["key"] for r in paper.table("table1")["rows"]]


def _fam(key: str) -> str | None:
    f = METHODS.facts(key)
    return f.family if f else None


def _side(ci, direction: int, margin: float) -> str:
    s = stats.excludes(ci, margin)
    return REPRODUCED if s == direction else CONTRADICTED if s == -direction else INCONCLUSIVE


@dataclass
class Part:
    what: str                         # the quantity, e.g. "NTK-32K - YaRN (FT), Needle"
    ci: tuple | None = None           # (value, lo, hi)
    direction: int = 1                # +1: the paper says the quantity is above `margin`; -1: below
    margin: float = 0.0
    why: str = ""                     # why there is no interval: "no rows: ...", "not measurable ...", ...
    decimals: int = 2
    at_level: Callable | None = None  # level -> (value, lo, hi): the same interval at another level (Holm's p-value)
    alt: tuple | None = None          # the other reasonable interval ("fragile" when it disagrees about the margin):
    alt_name: str = "BCa"             # BCa beside a t interval over few documents, the paired bootstrap beside
                                      # Newcombe's interval over prompts
    holm: str = ""                    # the part's verdict after Holm's correction (``correct``)
    key: str = ""                     # what identifies the part across training seeds (default: ``what``)
    limit: str = ""                   # an inconclusive part held there by a ceiling or a floor ("ceiling: ...")
    by_seed: dict = field(default_factory=dict)   # training seed -> (raw verdict, Holm verdict) (``seeded``)
    seed_verdict: str = ""            # the part across seeds: the seeds' common verdict, else inconclusive
    seed_holm: str = ""               # the same after each seed's Holm correction
    seed_only: str = ""               # the part exists on this other training seed only (``seeded``)
    over: str = ""                    # a pooled score's lengths ("C, 2C"): every pooled part names what it pooled

    def verdict(self) -> str:
        if self.ci is None or self.why:
            return INCONCLUSIVE
        return _side(self.ci, self.direction, self.margin)

    @property
    def ident(self) -> str:
        return self.key or self.what

    def final(self) -> str:
        """The part's verdict in the report: across training seeds where there are several (``seeded``)."""
        return self.seed_verdict or self.verdict()

    def final_holm(self) -> str:
        return self.seed_holm or self.holm or INCONCLUSIVE

    @property
    def fragile(self) -> bool:
        """The two reasonable intervals (``ci``, ``alt``) disagree about the margin."""
        return self.alt is not None and self.ci is not None and \
            _side(self.alt, self.direction, self.margin) != self.verdict()

    def text(self, tag: bool = True) -> str:
        what = self.what + (f" (pooled over {self.over})" if self.over else "")
        if self.ci is None:
            return f"{what}: \u2014 ({self.why})" + (f" [seed {self.seed_only} only]" if self.seed_only else "")
        d = self.decimals
        sign = "+" if self.margin == 0 else ""
        side = (">" if self.direction > 0 else "<") + f" {self.margin:g}"
        only = f" [seed {self.seed_only} only]" if self.seed_only else ""
        out = f"{what}{only}: {_fmt3(self.ci, d, sign)} (paper: {side})"
        if tag:
            v = self.verdict()
            out += f" \u2192 {v}" + (f" (limited by a {self.limit})" if self.limit and v == INCONCLUSIVE else "")
            if self.holm and self.holm != v:
                out += f" (Holm: {self.holm})"
            if self.by_seed and len({r for r, _ in self.by_seed.values()}) > 1:
                out += ("; seeds: " + ", ".join(f"{s} {r}" for s, (r, _) in self.by_seed.items())
                        + f" \u2192 across seeds: {self.final()}")
            elif self.seed_holm and self.seed_holm != (self.holm or v):
                out += f" (Holm across seeds: {self.seed_holm})"
            if self.fragile:
                out += f"; fragile: {self.alt_name} [{self.alt[1]:{sign}.{d}f}, {self.alt[2]:{sign}.{d}f}]"
        return out


def _fmt3(ci, d: int, sign: str) -> str:
    v, lo, hi = ci
    return f"{v:{sign}.{d}f} [{lo:{sign}.{d}f}, {hi:{sign}.{d}f}]"


def verdict(parts: list[Part], of: Callable = Part.verdict) -> tuple[str, str]:
    """(verdict, reason) of a finding from its parts (the rule in the module docstring); ``of``: a part's verdict
    (``Part.verdict``, or its Holm-corrected one)."""
    if not parts:
        return INCONCLUSIVE, "no parts"
    vs = [of(p) for p in parts]
    good = [p.what for p, v in zip(parts, vs) if v == REPRODUCED]
    bad = [p.what for p, v in zip(parts, vs) if v == CONTRADICTED]
    if good and bad:
        return MIXED, "reproduced: " + "; ".join(good) + "; contradicted: " + "; ".join(bad)
    if bad:
        return CONTRADICTED, "interval on the other side: " + "; ".join(bad)
    if all(v == REPRODUCED for v in vs):
        return REPRODUCED, ""
    seeds = [p.what + " (" + ", ".join(f"seed {s}: {r}" for s, (r, _) in p.by_seed.items()) + ")"
             for p, v in zip(parts, vs) if v == INCONCLUSIVE and len({r for r, _ in p.by_seed.values()}) > 1]
    if seeds:
        return INCONCLUSIVE, "depends on the training seed: " + "; ".join(seeds)
    missing = [p.why for p in parts if p.why]
    nomeas = [w for w in missing if w.startswith("not measurable")]
    norows = [w for w in missing if w.startswith("no rows")]
    if norows:
        return INCONCLUSIVE, "; ".join(dict.fromkeys(norows))
    if nomeas:
        return INCONCLUSIVE, "; ".join(dict.fromkeys(nomeas))
    if missing:
        return INCONCLUSIVE, "; ".join(dict.fromkeys(missing))
    limited = [f"{p.what}: {p.limit}" for p, v in zip(parts, vs) if v == INCONCLUSIVE and p.limit]
    if limited and all(p.limit for p, v in zip(parts, vs) if v == INCONCLUSIVE):
        return INCONCLUSIVE, "limited by a ceiling or floor, not by noise: " + "; ".join(limited)
    return INCONCLUSIVE, "interval includes " + ", ".join(
        dict.fromkeys(f"{p.margin:g}" for p, v in zip(parts, vs) if v == INCONCLUSIVE))


@dataclass
class Finding:
    key: str
    claim: str
    metric: str
    paper: str
    parts: list = field(default_factory=list)
    result: str = ""
    reason: str = ""
    # why these references (the paper's protocol), printed with the metric
    reference: str = ""
    # reported beside the parts but never in the verdict: the same quantity against a reference the paper's protocol
    # does not use (the frozen base where the same-data control decides), or for a method the paper did not study
    # (its facts' ``beyond_paper``: a finding about the paper's methods keeps its scope)
    controls: list = field(default_factory=list)
    notes: list = field(default_factory=list)   # statements from the rows beside the parts ((g): where it collapses)
    on_shown_seed: str = ""          # the verdict on the rows shown, before ``seeded`` compared training seeds
    holm: str = ""                   # the verdict after Holm's correction over every part (``correct``)
    holm_reason: str = ""
    evidence: str = ""               # the paper's source of the claim -> the evaluator its parts read here
    all_rows: bool = False           # read on every row, gate-failed included (``GATE_QUANTITY``)
    tested_at: str = ""              # where the rows stop short of the claim's length: what was tested instead and
    #                                  what was not measured ("PPL at 2C; 8C not measured"), said with the verdict

    def decide(self):
        self.result, self.reason = verdict(self.parts)
        return self


# -- access to the rows -------------------------------------------------------------------------------------------
class Evidence:
    """The rows of one model, read for the findings: entries by paper key, per-sample estimates, comparisons."""

    def __init__(self, rs: RowSet, model: str):
        self.rs, self.model = rs, model
        # one evaluation suite: the study's (the suite most of the model's configurations ran); rows of another suite
        # (a quick look with eval=quick inside the study) are never compared with the study's
        self.suite = rs.main_suite(model)
        self.entries = [e for e in rs.for_model(model) if e.suite == self.suite]
        self.other_suites = sorted({e.suite for e in rs.for_model(model) if rs.sources(e)} - {self.suite})
        self.used: dict = {}
        self.needle_source, self.needle_note = self._needle_source()
        self.duplicates = self._duplicates()

    def _needle_source(self):
        fl = est.floor(self.rs, self.model, "niah")
        has_niah = any(est.lengths_of(self.rs, e, "niah") for e in self.entries)
        if has_niah and fl.measurable:
            return "niah", ""
        fp = est.floor(self.rs, self.model, "passkey")
        why = ("NIAH " + ("not measurable at this scale (" + fl.reason + ")" if has_niah else "not run")
               + "; Needle = passkey accuracy")
        if not fp.measurable:
            return None, f"not measurable at this scale: {fp.reason}"
        return "passkey", why

    def _duplicates(self) -> dict:
        """{label: (label of the configuration it duplicates, n prompts)} for entries whose per-prompt Needle outcomes
        are identical (``estimates.same_outcomes``): the same evidence, whatever the method names (LM-Infinite and
        StreamingLLM with a local window of C), counted once. The one kept: a method the paper studied, then the
        first run."""
        src = self.needle_source
        if src is None:
            return {}
        out = {}
        for group, n in est.same_outcomes(self.rs, self.entries, src):
            keep = min(group, key=lambda e: (self.beyond_paper(e), str(e.rows[-1].get("time_start") or "")))
            out.update({e.label: (keep.label, n) for e in group if e is not keep})
        return out

    def counted(self, e: Entry) -> bool:
        """False for a duplicate configuration (``duplicates``): it is counted once, as the one it duplicates."""
        return e.label not in self.duplicates

    def beyond_paper(self, e: Entry) -> bool:
        """A method the paper did not study (its facts say ``beyond_paper``): never in a finding's parts, reported
        beside the findings that range over "every other configuration" as a control."""
        f = e.facts
        return bool(f and f.beyond_paper)

    def family(self, e: Entry) -> str:
        """The entry's attention family (``harness.methods.facts``; a row of no method counts as exact)."""
        return _fam(e.method) or "exact"

    def entry(self, key: str, frozen: bool | None = None) -> Entry | None:
        """The entry of paper key ``key`` (frozen / fine-tuned if given); several: the one whose row's method name is
        the key itself (e.g. ntk_frozen over a frozen ntk_dynamic), then the newest."""
        c = [e for e in self.entries if e.method == key and (frozen is None or e.frozen == frozen)]
        pool = [e for e in c if e.newest.get("method") == key] or c
        return max(pool, key=lambda e: str(e.newest.get("time_end") or "")) if pool else None

    def _use(self, e: Entry, x):
        if x is not None and getattr(x, "run_id", None):
            self.used.setdefault(x.run_id, e.label)
        return x

    def at(self, e: Entry, source: str, f: float):
        return self._use(e, est.at(self.rs, e, source, f))

    def ruler_source(self) -> tuple[bool, str]:
        """(whether the rows of this model have RULER and it is measurable, the line naming it): the project's
        RULER-style tasks (``harness.evals.ruler_data``), never RULER's own samples (docs/ruler_check.md)."""
        have = any(est.lengths_of(self.rs, e, "ruler") for e in self.entries)
        if not have:
            return False, "RULER not run for this model"
        fl = est.floor(self.rs, self.model, "ruler")
        if not fl.measurable:
            return False, f"RULER not measurable at this scale ({fl.reason})"
        tasks = sorted({t for e in self.entries for r in e.rows for k in self.rs.entry_keys(r, "ruler")
                        for t in ((r["metrics"][k] or {}).get("tasks") or {})})
        n = fl.base.n if fl.base is not None else None
        return True, (f"{RULER_STYLE} ({', '.join(tasks)}" + (f"; the base at C: n = {n} samples" if n else "")
                      + ")")

    def ruler(self, e: Entry | None, f: float):
        """RULER-style average at f x C as a 0..1 score (0/1 per sample where every task is a single match), so that
        a difference is Newcombe's paired interval like passkey's."""
        if e is None:
            return None
        x = self.at(e, "ruler", f)
        if x is None or x.value is None:
            return x
        sc = 1.0 / (x.top or 100.0)
        xs = None if x.samples is None else [v * sc for v in x.samples]
        binary = xs is not None and stats.is_binary(xs)
        return est.Est(x.value * sc, None if x.lo is None else x.lo * sc, None if x.hi is None else x.hi * sc, x.n,
                       x.unit, "proportion" if binary else "bounded", xs, x.paired, 1.0, x.note, x.run_id, x.keys)

    def ruler_pooled(self, e: Entry | None):
        if e is None:
            return None
        fs = est.lengths_of(self.rs, e, "ruler")
        return est.pooled([self.ruler(e, f) for f in fs], fs)

    def windows(self, e: Entry | None, f: float):
        """(per-window mean NLLs, their documents) at f x C from a row of ``e`` that scored every window of the books
        (``ppl`` with ``all_windows``), the newest; None without one."""
        for r in (e.rows if e is not None else []):
            c = native_ctx(r)
            for m in (r.get("metrics") or {}).values():
                if not (isinstance(m, dict) and m.get("all_windows") and c):
                    continue
                L = str(int(round(f * c)))
                xs, ds = (m.get("per_sample") or {}).get(L), (m.get("window_doc") or {}).get(L)
                if isinstance(xs, list) and isinstance(ds, list) and len(xs) == len(ds) and xs:
                    self.used.setdefault(r.get("run_id"), e.label)
                    return xs, ds
        return None

    def needle_name(self) -> str:
        return {"niah": "NIAH", "passkey": "passkey (NIAH not measurable at this scale)"}.get(
            self.needle_source or "", self.needle_note)

    def needle(self, e: Entry, *others: Entry | None):
        """Needle pooled over the lengths e was evaluated at (Table 1's averaging). With ``others`` (what it is
        compared with), over the lengths every one of them was evaluated at too, so that a difference compares the
        same lengths and prompts (a study with some cells not yet run, e.g. 4C only on a GPU)."""
        if self.needle_source is None:
            return None
        lengths = est.lengths_of(self.rs, e, self.needle_source)
        for o in others:
            if o is not None:
                theirs = set(est.lengths_of(self.rs, o, self.needle_source))
                lengths = [f for f in lengths if f in theirs]
        return est.pooled([self.at(e, self.needle_source, f) for f in lengths], lengths)

    def nll(self, e: Entry):
        # a row whose NLLs were not finite (read as missing: None) has no result here: the newest row that has one
        p = self.rs.pick(e, "nll", lambda m, r: m if numbers(m.get("per_doc")) and numbers(m.get("positions"))
                         else None)
        if p.value is None:
            q = self.rs.pick(e, "nll", lambda m, r: m if m.get("nll") else None)
            return (None, None), ("per-document NLL by position not in the row" if q.value is not None
                                  else "no NLL-by-position row")
        self.used.setdefault(p.row.get("run_id"), e.label)
        return (p.value, native_ctx(p.row)), ""


def numbers(x) -> bool:
    """A non-empty (nested) list of numbers only: no missing value (a non-finite number read as None)."""
    if not isinstance(x, list) or not x:
        return False
    return all(numbers(v) if isinstance(v, list) else isinstance(v, (int, float)) and not isinstance(v, bool)
               for v in x)


def label_of(e: Entry | None, key: str) -> str:
    """The entry's label, or for a missing entry its method's label (so that a part is named the same on every
    training seed, whether the entry has rows there or not: ``seeded`` matches parts by name)."""
    if e is not None:
        return e.label
    f = METHODS.facts(key)
    return f.label if f and f.label and "{" not in f.label else key


def prop_diff(a, b, level: float = stats.LEVEL) -> tuple | None:
    """(mean a - mean b, lo, hi) for two Est of the same kind: Newcombe (paired when both are) for 0/1 scores,
    a bootstrap otherwise."""
    if a is None or b is None or a.samples is None or b.samples is None:
        return None
    paired = a.paired and b.paired and len(a.samples) == len(b.samples) and a.keys == b.keys
    if stats.is_binary(a.samples) and stats.is_binary(b.samples):
        return stats.newcombe_diff(a.samples, b.samples, paired, stats.z_for(level))
    return stats.bootstrap_diff(a.samples, b.samples, paired, level=level)


def _why_est(x, what: str) -> str:
    if x is None:
        return f"no rows: {what}"
    if x.samples is None or x.ci is None:
        return f"no interval: {what}: {x.note or 'no per-sample scores'}"
    return ""


def _limit(a, b) -> str:
    """"ceiling: both within one prompt of 1.00 at 3 of 5 lengths" when at half the lengths or more (matched by
    length where both sides pool the same ones, else as a whole) both sides of a difference of 0..1 scores are at the
    top on every sample but at most one (or both at 0 but at most one: a floor): there the two sides can differ by
    one prompt at most, so an inconclusive part says that it is held by the scale, not by noise."""
    if a is None or b is None or a.samples is None or b.samples is None:
        return ""

    def blocks(x):
        k = len(x.keys) if x.keys else 1
        n = len(x.samples) // k if k and len(x.samples) % k == 0 else 0
        return [x.samples[i * n:(i + 1) * n] for i in range(k)] if n else [x.samples]

    ba, bb = blocks(a), blocks(b)
    if not (a.keys and a.keys == b.keys and len(ba) == len(bb)):
        ba, bb = [a.samples], [b.samples]
    top = [sum(v < 1.0 for v in x) <= 1 and sum(v < 1.0 for v in y) <= 1 for x, y in zip(ba, bb)]
    bottom = [sum(v > 0.0 for v in x) <= 1 and sum(v > 0.0 for v in y) <= 1 for x, y in zip(ba, bb)]
    for name, hit, val in (("ceiling", top, "1.00"), ("floor", bottom, "0.00")):
        if sum(hit) and 2 * sum(hit) >= len(hit):
            return f"{name}: both within one prompt of {val}" + (f" at {sum(hit)} of {len(hit)} lengths"
                                                                   if len(hit) > 1 else "")
    return ""


def part_prop(what: str, a, b, na: str, nb: str, direction: int = 1) -> Part:
    """A difference of two accuracies: Newcombe's interval (``prop_diff``), the bootstrap beside it (paired when
    the prompts are the same) as the second reasonable interval of the fragile check."""
    over = [x.over for x in (a, b) if x is not None and len(x.over) > 1]  # both sides pool the same ones
    why = _why_est(a, na) or _why_est(b, nb)
    d = None if why else prop_diff(a, b)
    alt = None
    if d and stats.is_binary(a.samples) and stats.is_binary(b.samples):
        paired = a.paired and b.paired and len(a.samples) == len(b.samples) and a.keys == b.keys
        alt = stats.bootstrap_diff(a.samples, b.samples, paired)
    return Part(what, d, direction, 0.0, why if d is None and why else ("" if d else "no interval"),
                at_level=(lambda lv: prop_diff(a, b, lv)) if d else None, alt=alt,
                alt_name="paired bootstrap" if alt and paired else "bootstrap", limit=_limit(a, b) if d else "",
                over=est.lengths_text(over[0]) if over else "")


def members(ev: Evidence, left: list, right: list) -> list[Part]:
    """Needle of every member of ``left`` minus every member of ``right`` (entries with rows), same prompts: the
    member pairs behind a group mean, so that the mean cannot hide a member that goes the other way."""
    return [part_prop(f"{a.label} - {b.label}, Needle", ev.needle(a, b), ev.needle(b, a), a.label, b.label)
            for a in left if a is not None for b in right if b is not None]


def grouped(xs: list, names: list[str]):
    """Pool the samples of several methods (equal n per method: the mean of their means); ``names[i]`` is the
    method of ``xs[i]``."""
    xs2 = [x for x in xs if x is not None]
    if not xs2:
        return None, "no rows: " + ", ".join(names)
    bad = [n for x, n in zip(xs, names) if x is not None and x.samples is None]
    if bad:
        return None, "no interval: per-sample scores missing for " + ", ".join(bad)
    pooled = est.pooled(xs2)
    pooled.paired = False
    overs = {x.over for x in xs2}
    pooled.over = overs.pop() if len(overs) == 1 else ()   # the members' lengths, when they pool the same ones
    return pooled, ""


def ppl_part(what: str, a, b, direction: int, margin: float = 1.0, missing: str = "") -> Part:
    """PPL of a over PPL of b, the same documents: the t interval of the mean per-document NLL difference,
    exponentiated, with the BCa interval beside it."""
    if missing or a is None or b is None:
        return Part(what, None, direction, margin, missing or f"no rows: {what}", 3)
    if a.samples is None or b.samples is None:
        n = a.n or b.n
        return Part(what, None, direction, margin, "no interval: per-document NLL not in the rows"
                    + (f" (n = {n} documents)" if n else ""), 3)
    if len(a.samples) != len(b.samples):
        return Part(what, None, direction, margin, "no interval: the two rows scored different documents", 3)
    ci = stats.ppl_ratio(a.samples, b.samples)
    if ci is None:
        return Part(what, None, direction, margin, f"no interval: fewer than {stats.MIN_DOCS} documents", 3)
    return Part(what, ci, direction, margin, "", 3, lambda lv: stats.ppl_ratio(a.samples, b.samples, level=lv),
                stats.ppl_ratio(a.samples, b.samples, "bca"))


def missing_rows(**entries) -> str:
    gone = [k for k, v in entries.items() if v is None]
    return "no rows: " + ", ".join(gone) if gone else ""


# -- the thirteen findings ----------------------------------------------------------------------------------------
def needle_missing(ev: Evidence) -> str:
    return "" if ev.needle_source else ev.needle_note


SAME_DATA = ("short-context cost against the same-data control: the base fine-tuned inside C with the same recipe "
             "on the same mixture. The paper's fine-tuning data is not its evaluation's domain; here the mixture "
             "is, so fine-tuning alone lowers the NLL inside C, and against the frozen base (shown beside, not in "
             "the verdict) that gain would be credited to the extension")


CONTROL = "base fine-tuned at C (the same-data control)"
