"""`make findings`: the controlled study's thirteen findings, each tested on the rows with a coded verdict rule.

Every finding is one or more **parts**; a part is a 95% interval for a quantity whose sign (or position against a
stated margin) the paper asserts, e.g. "passkey accuracy of NTK-32K minus that of YaRN (FT), same prompts, > 0".
The rule (``Part.verdict``, ``verdict``):

- a part is ``reproduced`` when its interval lies entirely on the paper's side of the margin (0 for a difference),
  ``not reproduced`` when it lies entirely on the other side, ``inconclusive`` when it contains the margin, or when
  there is no interval (missing rows, a metric not measurable at this scale, rows without per-sample scores);
- a finding is ``not reproduced`` when any part is, ``reproduced`` when every part is, else ``inconclusive``
  (with the reason: "no rows: ...", "not measurable at this scale: ...", "interval includes 0");
- where fine-tuned configurations have rows of several training seeds, every finding is decided once per seed
  (``RowSet.reseeded``: the other seed's rows wherever an entry has them) and keeps its verdict only when every seed
  gives the same one; otherwise it is ``inconclusive`` ("depends on the training seed"), ``seeded``.

Intervals: paired where the two numbers come from the same prompts / documents (Newcombe's paired interval for
accuracies, a paired bootstrap over documents for perplexity), unpaired otherwise (Newcombe's hybrid score
interval; a bootstrap). No correction for multiple comparisons: "best among k" needs every pairwise interval to
exclude 0. "Needle" is the NIAH score averaged over the evaluated lengths (the paper's Table 1), or passkey accuracy
where NIAH is not measurable for the model (``estimates.floor``); PPL is the PG19 analogue (``ppl_books``).
Nothing here is hard-coded but the paper's claims (direction, lengths, methods) and its numbers for comparison.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness import stats
from harness.tables import estimates as est
from harness.tables.paper import Paper
from harness.tables.rows import Entry, RowSet, converged, method_key, native_ctx

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
DEFAULT_MODEL = "tiny_llama"  # the study's model when there are no rows at all

# the paper's method sets (Table 1)
EXACT_FT = ("pi", "yarn", "clex", "ntk_32k", "ntk_64k")
APPROX = ("lm_infinite", "self_extend", "longlora", "landmark")
FT_32K = ("pi", "yarn", "clex", "ntk_32k")   # exact, fine-tuned at 32k (8C)
TRAIN_F = 8.0     # the paper's 32k = 8C
LONG_F = 16.0     # its 64k = 16C: beyond the training length
PPL_FLAT = 1.25   # (f) "keeps PPL flat": PPL at 8C within 25% of its PPL at C
PPL_CLOSE = 1.10  # (k) "close to the base": PPL at C within 10% of the base's (the paper: PI +3.5%, CLEX +5%)
RETRIEVE_MARGIN = -0.25  # (i) "retrieves within its window": at C no more than 0.25 below the base


@dataclass
class Part:
    what: str                         # the quantity, e.g. "NTK-32K - YaRN (FT), Needle"
    ci: tuple | None = None           # (value, lo, hi)
    direction: int = 1                # +1: the paper says the quantity is above `margin`; -1: below
    margin: float = 0.0
    why: str = ""                     # why there is no interval: "no rows: ...", "not measurable ...", ...
    decimals: int = 2
    runs: list = field(default_factory=list)

    def verdict(self) -> str:
        if self.ci is None or self.why:
            return INCONCLUSIVE
        s = stats.excludes(self.ci, self.margin)
        if s == self.direction:
            return REPRODUCED
        if s == -self.direction:
            return NOT_REPRODUCED
        return INCONCLUSIVE

    def text(self) -> str:
        if self.ci is None:
            return f"{self.what}: \u2014 ({self.why})"
        v, lo, hi = self.ci
        d = self.decimals
        sign = "+" if self.margin == 0 else ""
        side = (">" if self.direction > 0 else "<") + f" {self.margin:g}"
        return f"{self.what}: {v:{sign}.{d}f} [{lo:{sign}.{d}f}, {hi:{sign}.{d}f}] (paper: {side})"


def verdict(parts: list[Part]) -> tuple[str, str]:
    """(verdict, reason) of a finding from its parts (the rule in the module docstring)."""
    vs = [p.verdict() for p in parts]
    if not parts:
        return INCONCLUSIVE, "no parts"
    if NOT_REPRODUCED in vs:
        bad = [p.what for p, v in zip(parts, vs) if v == NOT_REPRODUCED]
        return NOT_REPRODUCED, "interval on the other side: " + "; ".join(bad)
    if all(v == REPRODUCED for v in vs):
        return REPRODUCED, ""
    missing = [p.why for p in parts if p.why]
    nomeas = [w for w in missing if w.startswith("not measurable")]
    norows = [w for w in missing if w.startswith("no rows")]
    if norows:
        return INCONCLUSIVE, "; ".join(dict.fromkeys(norows))
    if nomeas:
        return INCONCLUSIVE, "; ".join(dict.fromkeys(nomeas))
    if missing:
        return INCONCLUSIVE, "; ".join(dict.fromkeys(missing))
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
    not_testable: str = ""           # why this finding (or a part) cannot be tested at this scale
    # reported beside the parts but never in the verdict: the same quantity against a control row that the paper
    # does not have (the base model fine-tuned on the same mixture inside C, to tell the method's effect from what
    # fine-tuning on the study's data does by itself), or for a method the paper did not study (spec.yaml
    # ``beyond_paper``: a finding about the paper's methods keeps its scope)
    controls: list = field(default_factory=list)
    on_shown_seed: str = ""          # the verdict on the rows shown, before ``seeded`` compared training seeds

    def decide(self):
        self.result, self.reason = verdict(self.parts)
        return self


# -- access to the rows -------------------------------------------------------------------------------------------
class Evidence:
    """The rows of one model, read for the findings: entries by paper key, per-sample estimates, comparisons."""

    def __init__(self, rs: RowSet, model: str):
        self.rs, self.model = rs, model
        self.entries = rs.for_model(model)
        self.used: dict = {}
        self.needle_source, self.needle_note = self._needle_source()

    def _needle_source(self):
        fl = est.floor(self.rs, self.model, "niah")
        has_niah = any(est.lengths_of(self.rs, e, "niah", "score") for e in self.entries)
        if has_niah and fl.measurable:
            return "niah", ""
        fp = est.floor(self.rs, self.model, "passkey")
        why = ("NIAH " + ("not measurable at this scale (" + fl.reason + ")" if has_niah else "not run")
               + "; Needle = passkey accuracy")
        if not fp.measurable:
            return None, f"not measurable at this scale: {fp.reason}"
        return "passkey", why

    def beyond_paper(self, e: Entry) -> bool:
        """A method the paper did not study (``beyond_paper: true`` in ``spec.yaml``): never in a finding's parts,
        reported beside the findings that range over "every other configuration" as a control."""
        return bool((self.rs.spec.get("methods") or {}).get(e.method, {}).get("beyond_paper"))

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

    def needle(self, e: Entry):
        """Needle pooled over the lengths e was evaluated at (Table 1's averaging)."""
        if self.needle_source is None:
            return None
        metric = "score" if self.needle_source == "niah" else "accuracy"
        return est.pooled([self.at(e, self.needle_source, f)
                           for f in est.lengths_of(self.rs, e, self.needle_source, metric)])

    def nll(self, e: Entry):
        p = self.rs.pick(e, "nll", lambda m, r: m if isinstance(m.get("per_doc"), list) and m["per_doc"] else None)
        if p.value is None:
            q = self.rs.pick(e, "nll", lambda m, r: m if m.get("nll") else None)
            return (None, None), ("per-document NLL by position not in the row" if q.value is not None
                                  else "no NLL-by-position row")
        self.used.setdefault(p.row.get("run_id"), e.label)
        return (p.value, native_ctx(p.row)), ""


def _label(e: Entry | None, key: str) -> str:
    return e.label if e is not None else key


def prop_diff(a, b) -> tuple | None:
    """(mean a - mean b, lo, hi) for two Est of the same kind: Newcombe (paired when both are) for 0/1 scores,
    a bootstrap otherwise."""
    if a is None or b is None or a.samples is None or b.samples is None:
        return None
    paired = a.paired and b.paired and len(a.samples) == len(b.samples) and a.keys == b.keys
    if stats.is_binary(a.samples) and stats.is_binary(b.samples):
        return stats.newcombe_diff(a.samples, b.samples, paired)
    return stats.bootstrap_diff(a.samples, b.samples, paired)


def _why_est(x, what: str) -> str:
    if x is None:
        return f"no rows: {what}"
    if x.samples is None or x.ci is None:
        return f"no interval: {what}: {x.note or 'no per-sample scores'}"
    return ""


def _part_prop(what: str, a, b, na: str, nb: str, direction: int = 1) -> Part:
    why = _why_est(a, na) or _why_est(b, nb)
    d = None if why else prop_diff(a, b)
    return Part(what, d, direction, 0.0, why if d is None and why else ("" if d else "no interval"))


def _group(xs: list, names: list[str]):
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
    return pooled, ""


def _ppl_part(what: str, a, b, direction: int, ratio: bool = False, margin: float | None = None,
              missing: str = "") -> Part:
    """PPL of a minus (``ratio``: over) PPL of b, the same documents resampled jointly."""
    m = margin if margin is not None else (1.0 if ratio else 0.0)
    dec = 3 if ratio else 2
    if missing or a is None or b is None:
        return Part(what, None, direction, m, missing or f"no rows: {what}", dec)
    if a.samples is None or b.samples is None:
        n = a.n or b.n
        return Part(what, None, direction, m, "no interval: per-document NLL not in the rows"
                    + (f" (n = {n} documents)" if n else ""), dec)
    if len(a.samples) != len(b.samples):
        return Part(what, None, direction, m, "no interval: the two rows scored different documents", dec)
    ci = stats.ppl_ratio(a.samples, b.samples) if ratio else stats.ppl_diff(a.samples, b.samples)
    return Part(what, ci, direction, m, "" if ci else f"no interval: fewer than {stats.MIN_DOCS} documents", dec)


def _missing(**entries) -> str:
    gone = [k for k, v in entries.items() if v is None]
    return "no rows: " + ", ".join(gone) if gone else ""


# -- the thirteen findings ----------------------------------------------------------------------------------------
def _needle_missing(ev: Evidence) -> str:
    return "" if ev.needle_source else ev.needle_note


def f_a(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("a", "Fine-tuned exact attention beats approximate attention (Table 1)",
                "Needle (pooled over C..16C): mean of the fine-tuned exact methods (PI, YaRN, CLEX, NTK-32K, NTK-64K) "
                "minus mean of the approximate ones (LM-Infinite, Self-Extend, LongLoRA, Landmark)",
                _paper_groups(paper, "Needle"))
    if _needle_missing(ev):
        f.parts = [Part("exact FT - approximate, Needle", why=_needle_missing(ev))]
        return f.decide()
    ex = [(ev.entry(k, False), k) for k in EXACT_FT]
    ap = [(ev.entry(k), k) for k in APPROX]
    a, wa = _group([ev.needle(e) if e else None for e, _ in ex], [k for e, k in ex])
    b, wb = _group([ev.needle(e) if e else None for e, _ in ap], [k for e, k in ap])
    missing = [k for e, k in ex + ap if e is None]
    p = _part_prop("exact FT - approximate, Needle", a, b, "exact FT", "approximate")
    if wa or wb:
        p.ci, p.why = None, wa or wb
    f.parts = [p]
    f.decide()
    if missing and not f.reason.startswith("no rows"):
        f.reason = (f.reason + "; " if f.reason else "") + \
            ("no rows: " if f.result == INCONCLUSIVE else "groups without ") + ", ".join(missing)
    return f


def _paper_groups(paper: Paper, col: str) -> str:
    t = paper.table("table1")
    j = t["columns"].index(col)
    ex = [r["values"][j] for r in t["rows"] if r["key"] in EXACT_FT and r["training"] == "fine-tuned"]
    ap = [r["values"][j] for r in t["rows"] if r["key"] in APPROX]
    return f"Table 1 {col}: exact FT mean {np.mean(ex):.1f} vs approximate {np.mean(ap):.1f}"


def f_b(ev: Evidence, paper: Paper) -> Finding:
    t1 = {r["key"]: r["values"] for r in paper.table("table1")["rows"]}
    f = Finding("b", "Dynamic NTK (NTK-32K) is the best exact method and extrapolates beyond its training length",
                "Needle pooled over C..16C: NTK-32K minus each of PI, YaRN, CLEX (fine-tuned at 8C); passkey at 16C "
                "(beyond training): NTK-32K minus the base",
                f"Table 1 Needle: NTK-32K {t1['ntk_32k'][1]} vs PI {t1['pi'][1]}, YaRN {t1['yarn'][1]}, CLEX "
                f"{t1['clex'][1]}; RULER 64k: NTK-32K 46.26, PI/YaRN 0.00 (Table 3)")
    n32 = ev.entry("ntk_32k", False)
    if _needle_missing(ev):
        f.parts = [Part("NTK-32K - others, Needle", why=_needle_missing(ev))]
        return f.decide()
    for k in ("pi", "yarn", "clex"):
        o = ev.entry(k, False)
        f.parts.append(_part_prop(f"NTK-32K - {_label(o, k)}, Needle", ev.needle(n32) if n32 else None,
                                  ev.needle(o) if o else None, "ntk_32k (fine-tuned)", f"{k} (fine-tuned)"))
    base = ev.entry("base", True)
    src = ev.needle_source
    f.parts.append(_part_prop(f"NTK-32K - {_label(base, 'base')} at 16C, {src}",
                              ev.at(n32, src, LONG_F) if n32 else None, ev.at(base, src, LONG_F) if base else None,
                              "ntk_32k at 16C", "base at 16C"))
    return f.decide()


def f_c(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("c", "PI and YaRN degrade beyond their training length",
                "PPL (books) at 16C minus PPL at 8C, same documents, for PI and YaRN fine-tuned at 8C",
                "Table 2 PG19: PI 5.95 at 32k, '-' at 64k; YaRN 5.93 at 32k, '-' at 64k (Proof-pile 2.59 -> 106.38)")
    for k in ("pi", "yarn"):
        e = ev.entry(k, False)
        f.parts.append(_ppl_part(f"{_label(e, k)}: PPL 16C - PPL 8C", ev.at(e, "ppl_pg19", LONG_F) if e else None,
                                 ev.at(e, "ppl_pg19", TRAIN_F) if e else None, +1,
                                 missing=_missing(**{f"{k} (fine-tuned)": e})))
    return f.decide()


def f_d(ev: Evidence, paper: Paper) -> Finding:
    t1 = paper.table("table1")
    ex = [r["values"] for r in t1["rows"] if r["attention"] == "exact"]
    rho_p = stats.spearman([v[0] for v in ex], [v[1] for v in ex])
    f = Finding("d", "Perplexity correlates with downstream scores for exact-attention methods (Fig. 4)",
                "Spearman rank correlation, over exact-attention configurations, of PPL (books) at 8C and Needle "
                "(pooled over C..16C); bootstrap over configurations",
                f"Fig. 4: a general correlation; Table 1 exact methods: Spearman(PPL, Needle) = {rho_p:.2f} (n = "
                f"{len(ex)})")
    if _needle_missing(ev):
        f.parts = [Part("rank correlation", why=_needle_missing(ev))]
        return f.decide()
    pairs = []
    for e in ev.entries:
        if (ev.rs.spec.get("methods") or {}).get(e.method, {}).get("attention", "exact") != "exact":
            continue
        if (e.method == "base" and not e.frozen) or ev.beyond_paper(e):   # controls, not the paper's methods
            continue
        p = est.at(ev.rs, e, "ppl_pg19", TRAIN_F)
        n = ev.needle(e)
        if p is None or n is None or p.value is None or n.value is None or not math.isfinite(p.value):
            continue
        ev._use(e, p)
        pairs.append((e.label, p.value, n.value))
    pairs.sort()  # the bootstrap resamples by index: a fixed order keeps the interval from moving with unrelated rows
    xs, ys = [x for _, x, _ in pairs], [y for _, _, y in pairs]
    ci = stats.spearman_interval(xs, ys) if len(xs) >= 5 else None
    why = "" if ci else (f"no rows: {len(xs)} exact-attention configurations with PPL at 8C and Needle (need 5)"
                         if len(xs) < 5 else "no interval: constant ranks")
    f.parts = [Part(f"Spearman(PPL 8C, Needle), n = {len(xs)}", ci, -1, 0.0, why)]
    return f.decide()


def f_e(ev: Evidence, paper: Paper) -> Finding:
    t1 = {r["key"]: r["values"] for r in paper.table("table1")["rows"]}
    f = Finding("e", "Among frozen methods Self-Extend is best",
                "Needle pooled over C..16C: Self-Extend minus each other frozen configuration (same prompts)",
                f"Table 1 frozen: Self-Extend Needle {t1['self_extend'][1]}, LM-Infinite {t1['lm_infinite'][1]}, "
                f"NTK-F {t1['ntk_frozen'][1]}; RULER 29.50 / 12.34 / 0.72")
    se = ev.entry("self_extend", True)
    if _needle_missing(ev):
        f.parts = [Part("Self-Extend - others", why=_needle_missing(ev))]
        return f.decide()
    others = [e for e in ev.entries if e.frozen and e is not se]
    if se is None:
        f.parts = [Part("Self-Extend - others, Needle", why="no rows: self_extend (frozen)")]
        return f.decide()
    for o in others:
        a, b = ev.needle(se), ev.needle(o)
        if b is None:
            continue
        part = _part_prop(f"Self-Extend - {o.label}", a, b, "self_extend", o.label)
        (f.controls if ev.beyond_paper(o) else f.parts).append(part)
    if not f.parts:
        f.parts = [Part("Self-Extend - others", why="no rows: no other frozen configuration with a Needle score")]
    return f.decide()


def f_f(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("f", "LM-Infinite keeps PPL flat but fails retrieval outside its local window",
                f"PPL (books) at 8C / PPL at C, same documents (flat: < {PPL_FLAT}); passkey accuracy at C minus at "
                "2C..16C pooled (the needle mostly outside the local window)",
                "Table 2 PG19: 6.30 at 4k, 6.71 at 32k (x1.07); Fig. 1 / Sec. 6: fails to retrieve beyond 4k")
    e = ev.entry("lm_infinite", True)
    if e is None:
        f.parts = [Part("LM-Infinite", why="no rows: lm_infinite (frozen)")]
        return f.decide()
    f.parts.append(_ppl_part("LM-Infinite: PPL 8C / PPL C", ev.at(e, "ppl_pg19", TRAIN_F), ev.at(e, "ppl_pg19", 1.0),
                             -1, ratio=True, margin=PPL_FLAT))
    src = ev.needle_source
    if src is None:
        f.parts.append(Part("retrieval C - beyond", why=ev.needle_note))
        return f.decide()
    inside = ev.at(e, src, 1.0)
    metric = "score" if src == "niah" else "accuracy"
    outside = est.pooled([ev.at(e, src, x) for x in est.lengths_of(ev.rs, e, src, metric) if x >= 2])
    if outside is not None:
        outside.paired = False
    f.parts.append(_part_prop(f"{src} at C - at 2C..16C", inside, outside, "lm_infinite at C",
                              "lm_infinite beyond C"))
    return f.decide()


def f_g(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("g", "NTK-frozen generalises only to about 2x its window",
                "Needle at 2C: NTK-F minus the base (generalises to 2C); NTK-F at 2C minus NTK-F at 4C..16C pooled "
                "(fails beyond)",
                "Sec. 6: NTK-F generalises up to 8k (2x) but fails to extend further; Table 3: 44.45 at 8k, 14.79 at "
                "16k, 0.72 at 32k")
    src = ev.needle_source
    if src is None:
        f.parts = [Part("NTK-F", why=ev.needle_note)]
        return f.decide()
    e, base = ev.entry("ntk_frozen", True), ev.entry("base", True)
    metric = "score" if src == "niah" else "accuracy"
    f.parts.append(_part_prop(f"NTK-F - {_label(base, 'base')} at 2C, {src}", ev.at(e, src, 2.0) if e else None,
                              ev.at(base, src, 2.0) if base else None, "ntk_frozen at 2C", "base at 2C"))
    far = est.pooled([ev.at(e, src, x) for x in est.lengths_of(ev.rs, e, src, metric) if x >= 4]) if e else None
    if far is not None:
        far.paired = False
    f.parts.append(_part_prop(f"NTK-F at 2C - at 4C..16C, {src}", ev.at(e, src, 2.0) if e else None, far,
                              "ntk_frozen at 2C", "ntk_frozen at 4C..16C"))
    return f.decide()


def f_h(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("h", "LongLoRA trails exact fine-tuning",
                "PPL (books) at 8C: LongLoRA minus each of PI, YaRN, CLEX, NTK-32K (fine-tuned at 8C), same documents",
                "Table 2 PG19 at 32k: LongLoRA 9.89 vs PI 5.95, YaRN 5.93, CLEX 5.82, NTK-32K 5.79")
    ll = ev.entry("longlora")
    for k in FT_32K:
        o = ev.entry(k, False)
        f.parts.append(_ppl_part(f"LongLoRA - {_label(o, k)}, PPL 8C", ev.at(ll, "ppl_pg19", TRAIN_F) if ll else None,
                                 ev.at(o, "ppl_pg19", TRAIN_F) if o else None, +1,
                                 missing=_missing(longlora=ll, **{k: o})))
    return f.decide()


def f_i(ev: Evidence, paper: Paper) -> Finding:
    t1 = {r["key"]: r["values"] for r in paper.table("table1")["rows"]}
    f = Finding("i", "Landmark retrieves within its local window but trails exact methods",
                f"Needle at C: Landmark minus the base (retrieves: > {RETRIEVE_MARGIN}); Needle pooled over C..16C: "
                "fine-tuned exact methods minus Landmark",
                f"Sec. 5.2: Landmark excels only within the local window; Table 1 Needle: Landmark {t1['landmark'][1]}"
                f" vs exact FT mean {np.mean([t1[k][1] for k in EXACT_FT]):.1f}")
    src = ev.needle_source
    if src is None:
        f.parts = [Part("Landmark", why=ev.needle_note)]
        return f.decide()
    lm, base = ev.entry("landmark"), ev.entry("base", True)
    p = _part_prop(f"Landmark - {_label(base, 'base')} at C, {src}", ev.at(lm, src, 1.0) if lm else None,
                   ev.at(base, src, 1.0) if base else None, "landmark at C", "base at C")
    p.margin = RETRIEVE_MARGIN
    f.parts.append(p)
    ex = [(ev.entry(k, False), k) for k in EXACT_FT]
    g, w = _group([ev.needle(e) if e else None for e, _ in ex], [k for e, k in ex])
    q = _part_prop("exact FT - Landmark, Needle", g, ev.needle(lm) if lm else None, "exact FT", "landmark")
    if w:
        q.ci, q.why = None, w
    f.parts.append(q)
    return f.decide()


def f_j(ev: Evidence, paper: Paper) -> Finding:
    t1 = {r["key"]: r["values"] for r in paper.table("table1")["rows"]}
    f = Finding("j", "NTK-64K with 1B tokens trails NTK-32K and needs 2B tokens",
                "Needle pooled over C..16C: NTK-32K minus NTK-64K; NTK-64K-2B (2x the tokens) minus NTK-64K",
                f"Table 1 Needle: NTK-32K {t1['ntk_32k'][1]} vs NTK-64K {t1['ntk_64k'][1]}; Sec. 5.2 / App. 9.4: "
                "with 2B tokens NTK-64K improves significantly")
    src = ev.needle_source
    if src is None:
        f.parts = [Part("NTK-64K", why=ev.needle_note)]
        return f.decide()
    n32, n64, n64b = ev.entry("ntk_32k", False), ev.entry("ntk_64k", False), ev.entry("ntk_64k_2b", False)
    f.parts.append(_part_prop("NTK-32K - NTK-64K, Needle", ev.needle(n32) if n32 else None,
                              ev.needle(n64) if n64 else None, "ntk_32k", "ntk_64k"))
    f.parts.append(_part_prop("NTK-64K-2B - NTK-64K, Needle", ev.needle(n64b) if n64b else None,
                              ev.needle(n64) if n64 else None, "ntk_64k_2b", "ntk_64k"))
    return f.decide()


def f_k(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("k", "Exact methods fine-tuned at 32k stay close to the base inside the window",
                f"PPL (books) at C of each of PI, YaRN, CLEX, NTK-32K (fine-tuned at 8C) / the base's, same documents "
                f"(close: < {PPL_CLOSE})",
                "Table 2 PG19 at 4k: base 6.30; PI 6.52 (x1.035), NTK-32K 6.32, YaRN 6.39, CLEX 6.62 (x1.05)")
    base = ev.entry("base", True)
    for k in FT_32K:
        e = ev.entry(k, False)
        f.parts.append(_ppl_part(f"{_label(e, k)} / {_label(base, 'base')}, PPL at C",
                                 ev.at(e, "ppl_pg19", 1.0) if e else None,
                                 ev.at(base, "ppl_pg19", 1.0) if base else None, -1, ratio=True, margin=PPL_CLOSE,
                                 missing=_missing(**{k: e}, base=base)))
    return f.decide()


def f_l(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("l", "Extension hurts very short contexts and helps long ones (NLL by position, Fig. 3)",
                "Mean NLL per token, same documents, YaRN (FT) and NTK-32K minus the base: over positions 1..C "
                "(hurts: > 0) and over positions C..16C (helps: < 0)",
                "Fig. 3 / Sec. 6: up to 4k LLaMA2 has the best NLL; beyond, YaRN and NTK use the long context "
                "(NTK stays strong at the longest positions)")
    base = ev.entry("base", True)
    for k in ("yarn", "ntk_32k"):
        e = ev.entry(k, False)
        if e is None or base is None:
            why = "no rows: " + ", ".join(x for x, y in ((k, e), ("base", base)) if y is None)
            f.parts += [Part(f"{k} - base, NLL 1..C", why=why), Part(f"{k} - base, NLL C..16C", why=why)]
            continue
        f.parts += [_nll_part(ev, e, base, 0, 1, +1, "1..C"), _nll_part(ev, e, base, 1, 1e9, -1, "C..16C")]
    # control: the base fine-tuned with the same recipe on the same mixture inside its window (``tiny_study/
    # base_ft``). Here, unlike the paper, the fine-tuning mixture is the evaluation's own domain, so fine-tuning
    # lowers the NLL inside C by itself; against this row, "hurts very short contexts" is the extension's own cost.
    ctrl = ev.entry("base", False)
    if ctrl is not None:
        for k in ("yarn", "ntk_32k"):
            e = ev.entry(k, False)
            if e is not None:
                f.controls.append(_nll_part(ev, e, ctrl, 0, 1, +1, "1..C"))
    return f.decide()


def f_m(ev: Evidence, paper: Paper) -> Finding:
    f = Finding("m", "Full attention fine-tuned at 32k uses the long context better than LM-Infinite's window",
                "PPL at 8C of each of PI, YaRN, CLEX, NTK-32K (fine-tuned at 8C) / LM-Infinite's (frozen, attention "
                "window C), same documents (better: < 1), on books (PG19) and on code (Proof-pile)",
                "Table 2 at 32k, PG19: PI 5.95, YaRN 5.93, CLEX 5.82, NTK-32K 5.79 vs LM-Infinite 6.71; Proof-pile: "
                "2.58, 2.59, 2.55, 2.54 vs 3.11 (\"both gave nearly consistent conclusions\")")
    lmi = ev.entry("lm_infinite", True)
    for src, corpus in (("ppl_pg19", "books"), ("ppl_proofpile", "code")):
        for k in FT_32K:
            e = ev.entry(k, False)
            f.parts.append(_ppl_part(f"{_label(e, k)} / {_label(lmi, 'lm_infinite')}, PPL 8C ({corpus})",
                                     ev.at(e, src, TRAIN_F) if e else None,
                                     ev.at(lmi, src, TRAIN_F) if lmi else None, -1, ratio=True,
                                     missing=_missing(**{k: e}, lm_infinite=lmi)))
    return f.decide()


def _nll_part(ev: Evidence, e: Entry, ref: Entry, lo_f: float, hi_f: float, d: int, tag: str) -> Part:
    """Paired per-document difference of mean NLL over positions (lo_f C, hi_f C], ``e`` minus ``ref``."""
    what = f"{e.label} - {ref.label}, NLL {tag}"
    (en, ec), ewhy = ev.nll(e)
    (rn, rc), rwhy = ev.nll(ref)
    if rwhy or ewhy:
        return Part(what, None, d, 0.0, "no interval: " + (rwhy or ewhy))
    a, b = _nll_range(en, ec, lo_f, hi_f), _nll_range(rn, rc, lo_f, hi_f)
    if a is None or b is None or len(a) != len(b) or len(a) < 3:
        return Part(what, None, d, 0.0, "no interval: documents differ or fewer than 3")
    return Part(what, stats.bootstrap_diff(a, b, paired=True), d, 0.0, decimals=3)


def _nll_range(m: dict, c: int, lo_f: float, hi_f: float):
    """Per-document mean NLL over the position buckets whose start lies in (lo_f * C, hi_f * C]."""
    pos, docs = m.get("positions") or [], m.get("per_doc") or []
    if not c or not pos or not docs:
        return None
    sel = [i for i, p in enumerate(pos) if lo_f * c < p <= hi_f * c] if lo_f > 0 else \
        [i for i, p in enumerate(pos) if p <= hi_f * c]
    if not sel:
        return None
    return [float(np.mean([d[i] for i in sel])) for d in docs]


FINDINGS = (f_a, f_b, f_c, f_d, f_e, f_f, f_g, f_h, f_i, f_j, f_k, f_l, f_m)


def evaluate(rs: RowSet, model: str, paper: Paper | None = None) -> tuple[list[Finding], Evidence]:
    paper = paper or Paper()
    ev = Evidence(rs, model)
    return [fn(ev, paper) for fn in FINDINGS], ev


def seeded(rs: RowSet, model: str, paper: Paper | None = None) -> tuple[list[Finding], Evidence, dict]:
    """``evaluate`` on the rows shown, then on each other training seed; a finding whose verdict differs between
    seeds becomes inconclusive. Returns (findings, evidence of the shown seed, {seed: that seed's verdicts})."""
    fs, ev = evaluate(rs, model, paper)
    per_seed = {}
    for s in rs.other_seeds(model):
        other, ev_s = evaluate(rs.reseeded(s), model, paper)
        per_seed[s] = [f.result for f in other]
        for rid, lab in ev_s.used.items():
            ev.used.setdefault(rid, f"{lab}, seed {s}")
    for i, f in enumerate(fs):
        f.on_shown_seed = f.result
        got = {s: v[i] for s, v in per_seed.items()}
        if any(v != f.result for v in got.values()):
            shown = _shown_seed(rs, model)
            f.reason = ("depends on the training seed: " + "; ".join(
                [f"seed {shown}: {f.result}"] + [f"seed {s}: {v}" for s, v in got.items()]))
            f.result = INCONCLUSIVE
    return fs, ev, per_seed


def _shown_seed(rs: RowSet, model: str) -> str:
    shown = sorted({str(e.seed) for e in rs.for_model(model) if len(e.by_seed) > 1})
    return "/".join(shown) or "?"


def seed_differences(rs: RowSet, model: str) -> list[str]:
    """Markdown rows: for each configuration with several training seeds, another seed minus the shown one on the same
    prompts / documents (passkey at C and 8C: Newcombe's paired interval; books PPL ratio at C and 8C: paired
    bootstrap), so that a reader sees how much of a between-method difference one training seed can make."""
    out = []
    for e in rs.for_model(model):
        if len(e.by_seed) < 2:
            continue
        a = e.with_seed(e.seed)
        for s in e.seeds:
            if s == e.seed:
                continue
            b = e.with_seed(s)
            cells = []
            for f in (1.0, TRAIN_F):
                x, y = est.at(rs, b, "passkey", f), est.at(rs, a, "passkey", f)
                d = prop_diff(x, y)
                cells.append("—" if d is None else f"{y.value:.2f} → {x.value:.2f} ({d[0]:+.2f} "
                             f"[{d[1]:+.2f}, {d[2]:+.2f}], n={len(x.samples)})")
            for f in (1.0, TRAIN_F):
                x, y = est.at(rs, b, "ppl_pg19", f), est.at(rs, a, "ppl_pg19", f)
                p = _ppl_part("", x, y, 1, ratio=True)
                cells.append("—" if p.ci is None else f"x{p.ci[0]:.3f} [{p.ci[1]:.3f}, {p.ci[2]:.3f}] "
                             f"(n={len(x.samples)} docs)")
            runs = ", ".join(f"`{r.get('run_id')}`" for r in (a.rows[:1] + b.rows[:1]))
            out.append(f"| {_md(e.label)} | {e.seed} → {s} | " + " | ".join(cells) + f" | {runs} |")
    return out


def _gated(rs: RowSet, model: str, reason: str) -> str:
    """For a reason that says "no rows: ...": which of those methods do have fine-tuned rows, left out because they
    failed the convergence gate (so a reader does not take them for points never run)."""
    if "no rows" not in reason:
        return ""
    named = set(re.findall(r"[a-z0-9_]+", reason))
    gated = sorted({method_key(r) for r in rs.unconverged + rs.failed
                    if r.get("model") == model and converged(r) is False} & named)
    return f"; rows of {', '.join(gated)} exist but failed the convergence gate (Notes)" if gated else ""


def study_model(rs: RowSet) -> str | None:
    """The model with the most configurations (the study's model)."""
    ms = rs.models()
    return max(ms, key=lambda m: len(rs.for_model(m))) if ms else None


# -- the report ---------------------------------------------------------------------------------------------------
def _md(s: str) -> str:
    return str(s).replace("|", "\\|")


def report(rs: RowSet, model: str | None = None, paper: Paper | None = None, source: str = "results/runs/") -> str:
    model = model or study_model(rs) or DEFAULT_MODEL   # no rows: every finding "inconclusive (no rows: ...)"
    fs, ev, per_seed = seeded(rs, model, paper)
    counts = {v: sum(f.result == v for f in fs) for v in (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)}
    c = None
    for e in ev.entries:
        c = c or e.native_ctx
    out = ["# Findings of the controlled study, tested on our rows",
           "",
           f"Generated by `make findings` (`harness/tables/findings.py`) from the rows in `{source}` only; "
           "do not edit.",
           "",
           f"Model: **{model}** (" + (f"native window C = {c} tokens" if c else "no rows yet") +
           "; the paper's 4k = C, 32k = 8C, 64k = 16C). "
           f"{counts[REPRODUCED]} reproduced, {counts[NOT_REPRODUCED]} not reproduced, {counts[INCONCLUSIVE]} "
           "inconclusive.",
           "",
           "**Verdict rule** (code: `Part.verdict`, `verdict`): each finding is one or more quantities with a 95% "
           "interval; a quantity is *reproduced* when its interval lies entirely on the paper's side of the stated "
           "margin (0 for a difference), *not reproduced* when entirely on the other side, *inconclusive* when it "
           "contains the margin or has no interval. A finding is not reproduced if any part is, reproduced if every "
           "part is, inconclusive otherwise. Differences are paired (same prompts / documents) where the rows keep "
           "per-sample scores: Newcombe's interval for accuracies, a bootstrap over documents for perplexity. No "
           "multiple-comparison correction.",
           ""]
    if ev.needle_note:
        out += [f"Needle: {ev.needle_note}.", ""]
    out += ["| finding | metric and lengths | ours (95% CI) | paper | verdict |", "|:--|:--|:--|:--|:--|"]
    for f in fs:
        ours = "<br>".join([_md(p.text()) for p in f.parts] +
                           [_md("not in the verdict: " + p.text()) for p in f.controls])
        v = f"**{f.result}**" + (f" ({_md(f.reason + _gated(rs, model, f.reason))})" if f.reason else "")
        out.append(f"| ({f.key}) {_md(f.claim)} | {_md(f.metric)} | {ours} | {_md(f.paper)} | {v} |")
    if per_seed:
        out += ["", "## Training seeds", "",
                "Fine-tuned configurations with rows of several training seeds (`data.seed` and `train.seed`: the "
                "mixture's sample and order and the training RNG; the evaluation prompts are the same). Each finding "
                "was decided on every seed; a verdict that differs between seeds is reported as inconclusive above.",
                "", "| finding | " + " | ".join([f"seed {_shown_seed(rs, model)} (shown)"]
                                                   + [f"seed {s}" for s in per_seed]) + " |",
                "|:--|" + ":--|" * (1 + len(per_seed))]
        for i, f in enumerate(fs):
            out.append(f"| ({f.key}) | {f.on_shown_seed} | " + " | ".join(v[i] for v in per_seed.values()) + " |")
        out += ["", "Seed to seed, same configuration, same prompts / documents (other seed minus shown; a "
                "difference only where the interval excludes 0 — passkey — or 1 — PPL ratio):", "",
                "| configuration | seeds | passkey at C | passkey at 8C | PPL ratio at C | PPL ratio at 8C | runs |",
                "|:--|:--|:--|:--|:--|:--|:--|"] + seed_differences(rs, model)
    out += ["", "## Not testable at this scale", ""]
    nt = []
    for src, name in (("niah", "NIAH"), ("ruler", "RULER"), ("passkey", "passkey")):
        fl = est.floor(rs, model, src)
        if not fl.measurable:
            nt.append(f"- {name}: not measurable at this scale: {fl.reason} (threshold in `harness/tables/spec.yaml`"
                      ", `measurable`). Findings that the paper shows on it are tested on "
                      + ("passkey instead (Needle)." if src == "niah" and ev.needle_source == "passkey" else
                         "other metrics or not at all."))
    have = {k for e in ev.entries for r in e.rows for k in (r.get("metrics") or {})}
    for src, name, what in (("longbench", "LongBench", "Table 1 LongB, Table 4"),
                            ("manyshot_trec", "many-shot TREC", "Table 1 Mshots, Fig. 2")):
        if src not in have:
            nt.append(f"- {name} ({what}): no rows of {model} ran it (the tiny suite does not include it: a "
                      "model of a few million parameters cannot answer LongBench / TREC prompts); the paper's "
                      "statements on it are not tested here.")
    for f in fs:
        if f.result == INCONCLUSIVE and ("no rows" in f.reason or "not measurable" in f.reason):
            nt.append(f"- ({f.key}) {f.claim}: {f.reason}.")
    out += nt or ["- nothing: every finding has the rows it needs."]
    out += ["", "## Rows used", ""]
    out += [f"- `{rid}` ({lab})" for rid, lab in sorted(ev.used.items())] or ["- none"]
    notes = rs.footnotes(model)
    if notes:
        out += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def write(results_dir: str | Path, out: str | Path | None = None, model: str | None = None,
          runs_dir: str | Path | None = None) -> Path:
    from harness.results import atomic_write_text, read_rows
    from harness.tables.rows import load_spec, read_rows_in

    rs = RowSet(read_rows(results_dir) if runs_dir is None else read_rows_in(runs_dir), load_spec())
    path = Path(out or Path(results_dir) / "findings.md")
    atomic_write_text(path, report(rs, model, source=str(runs_dir) if runs_dir is not None else "results/runs/"))
    return path
