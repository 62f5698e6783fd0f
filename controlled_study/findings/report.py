"""`make findings`: every finding on a study's rows, Holm's correction, the seeds compared part by part, the gate's
sensitivity, the report and its files."""
from __future__ import annotations

import json
import re
from pathlib import Path

from controlled_study import estimates as est
from controlled_study import rows_source
from controlled_study.findings.claims import FINDINGS, GATE_BIAS, GATE_QUANTITY
from controlled_study.findings.rule import (
    DASH,
    DEFAULT_MODEL,
    INCONCLUSIVE,
    RULER_STYLE,
    TRAIN_F,
    VERDICTS,
    Evidence,
    Finding,
    Part,
    ppl_part,
    prop_diff,
    verdict,
)
from controlled_study.front import write_front, write_index
from controlled_study.paper import Paper
from controlled_study.rows import RowSet, converged, load_spec, method_key, read_rows_in
from harness import stats
from harness.evals.convergence import GATE_SETS, MIN_GATE_VERSION, gate_version, outdated
from harness.results import atomic_write_text, read_rows, signals_held, study_dir


def evaluate(rs: RowSet, model: str, paper: Paper | None = None,
             all_rows: tuple | None = None) -> tuple[list[Finding], Evidence]:
    """Every finding on the rows of ``rs`` (one training seed), Holm's correction over all their parts. A finding in
    ``all_rows`` (default: ``GATE_QUANTITY``) is read on the same rows with the gate-failed ones put back."""
    paper = paper or Paper()
    all_rows = tuple(GATE_QUANTITY) if all_rows is None else all_rows
    ev = Evidence(rs, model)
    ev_all = Evidence(RowSet(rs.all_rows, rs.spec, rs.seed, gate=False), model) if rs.gate else ev
    fs = []
    for fn in FINDINGS:
        key = fn.__name__.removeprefix("f_")
        f = fn(ev_all if key in all_rows else ev, paper)
        f.all_rows = key in all_rows
        fs.append(f)
    if ev_all is not ev:
        for rid, lab in ev_all.used.items():
            ev.used.setdefault(rid, lab)
    return correct(fs), ev


def correct(fs: list[Finding]) -> list[Finding]:
    """Holm's correction over every part (with an interval) of every finding: a part keeps its side only when Holm's
    step-down rejects "quantity = margin" at family-wise 5%; each finding's ``holm`` verdict follows by the same
    rule. A part without an interval is no test and stays inconclusive."""
    tested = [p for f in fs for p in f.parts if p.at_level is not None and p.ci is not None and not p.why]
    pv = [stats.p_value(p.at_level, p.margin) for p in tested]
    for p, keep in zip(tested, stats.holm([1.0 if v is None else v for v in pv])):
        p.holm = p.verdict() if keep else INCONCLUSIVE
    for f in fs:
        f.holm, f.holm_reason = verdict(f.parts, lambda p: p.holm or INCONCLUSIVE)
    return fs


SEED_RULE = ("a part is reproduced (contradicted) across training seeds when it is reproduced (contradicted) on "
             "every seed, else inconclusive (a part missing on a seed is inconclusive there); the finding's verdict "
             "is the verdict rule applied to these part verdicts; after Holm the same, with each part's Holm verdict "
             "on each seed (Holm's correction runs over each seed's parts). A part's Holm verdict is its raw one or "
             "inconclusive, on every seed, so across seeds too: a finding's Holm verdict is its raw verdict or "
             "inconclusive (or, from mixed, contradicted when only contradicted parts survive), never the reverse "
             "of it")


def seeded(rs: RowSet, model: str, paper: Paper | None = None,
           all_rows: tuple | None = None) -> tuple[list[Finding], Evidence, dict]:
    """``evaluate`` on the rows shown, then on each other training seed, then compared part by part (``SEED_RULE``):
    each part's verdict across seeds, each finding's verdict from those, raw and after Holm by one rule. Returns
    (findings, evidence of the shown seed, {seed: that seed's raw finding verdicts})."""
    fs, ev = evaluate(rs, model, paper, all_rows)
    others = {}
    for s in rs.other_seeds(model):
        other, ev_s = evaluate(rs.reseeded(s), model, paper, all_rows)
        others[s] = other
        for rid, lab in ev_s.used.items():
            ev.used.setdefault(rid, f"{lab}, seed {s}")
    per_seed = {s: [f.result for f in other] for s, other in others.items()}
    shown = _shown_seed(rs, model)
    for i, f in enumerate(fs):
        f.on_shown_seed = f.result
        if not others:
            continue
        f.parts = combine_seeds({shown: f.parts, **{s: other[i].parts for s, other in others.items()}})
        f.result, f.reason = verdict(f.parts, Part.final)
        f.holm, f.holm_reason = verdict(f.parts, Part.final_holm)
    return fs, ev, per_seed


def combine_seeds(by_seed: dict) -> list[Part]:
    """One finding's parts on several training seeds ({seed: parts}, the shown seed first) -> its parts across seeds
    (``SEED_RULE``): matched by name (``Part.ident``); each keeps the shown seed's interval (or, for a part only
    another seed has, that seed's: ``seed_only``) and gets ``by_seed`` {seed: (raw, Holm)} and the verdicts across
    seeds, ``seed_verdict`` and ``seed_holm`` (the seeds' common verdict, else inconclusive; a seed without the
    part counts as inconclusive)."""
    seeds = list(by_seed)
    named = {s: {p.ident: p for p in ps} for s, ps in by_seed.items()}
    out = []
    for k in dict.fromkeys(p.ident for ps in by_seed.values() for p in ps):
        by = {}
        for s in seeds:
            q = named[s].get(k)
            by[s] = (q.verdict(), q.holm or INCONCLUSIVE) if q else (INCONCLUSIVE, INCONCLUSIVE)
        p = named[seeds[0]].get(k)
        if p is None:   # an entry whose shown seed has no rows: this part exists on another seed only
            s = next(s for s in seeds if k in named[s])
            p = named[s][k]
            p.seed_only = str(s)
        p.by_seed = by
        raw, hol = {r for r, _ in by.values()}, {h for _, h in by.values()}
        p.seed_verdict = raw.pop() if len(raw) == 1 else INCONCLUSIVE
        p.seed_holm = hol.pop() if len(hol) == 1 else INCONCLUSIVE
        out.append(p)
    return out


def sensitivity(rs: RowSet, model: str, paper: Paper | None = None) -> list[str]:
    """Every finding's verdict (``seeded``) with the rows that failed the convergence gate put back: the gate
    measures the fine-tuned model itself, so a verdict that changes here rests on which rows the gate let in."""
    fs, _, _ = seeded(RowSet(rs.all_rows, rs.spec, gate=False), model, paper)
    return [f.result for f in fs]


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
                p = ppl_part("", x, y, 1)
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


def _gate_documents(rs: RowSet, model: str) -> str:
    """Which books the fine-tuned rows of ``model`` were gated on, by gate version (``convergence.GATE_SETS``)."""
    by: dict = {}
    for r in rs.all_rows:
        if r.get("model") == model and r.get("status") == "ok" and converged(r) is not None:
            by.setdefault(gate_version(r), []).append(r)
    if not by:
        return "No fine-tuned row of this model carries a gate record."
    return "Gate records in the rows: " + "; ".join(
        f"version {v}: {len(rows)} rows, {GATE_SETS.get(v, 'unknown set')}" for v, rows in sorted(by.items())) + "."


REAL_FINDINGS = ("e", "f", "g")   # the findings whose parts read frozen configurations only


def real_model_sections(rs: RowSet, main: str, paper: Paper | None, main_fs: list[Finding]) -> list[str]:
    """A section per other model whose configurations are all frozen (the real-model frozen track, e.g. SmolLM2-135M
    in the study ``smollm2_frozen``): the findings that need no fine-tuning, ``REAL_FINDINGS``, on its rows (Holm's
    correction over that section's parts: a family of its own), beside the main model's verdicts."""
    paper = paper or Paper()
    out = []
    for m in rs.models():
        ents = rs.for_model(m)
        if m == main or len(ents) < 2 or not all(e.frozen for e in ents):
            continue
        ev = Evidence(rs, m)
        fs = correct([fn(ev, paper) for fn in FINDINGS if fn.__name__.removeprefix("f_") in REAL_FINDINGS])
        studies = sorted({str(((r.get("config") or {}).get("study") or {}).get("experiment") or "?")
                          for e in ents for r in e.rows})
        c = ents[0].native_ctx
        lengths = sorted({x for e in ents for x in est.lengths_of(rs, e, "passkey")})
        n_parts = sum(1 for f in fs for p in f.parts if p.holm)
        mine = {f.key: f for f in main_fs}
        out += ["", f"## Real model, frozen: {m}", "",
                f"Rows of {m} (native window C = {c} tokens; study {', '.join(studies)}; passkey at "
                f"{', '.join(f'{x:g}C' for x in lengths) or 'no length yet'}): no fine-tuning, so the findings about "
                f"frozen methods only, {', '.join(f'({k})' for k in REAL_FINDINGS)}, each on the evidence it can "
                f"read here and beside the verdict on {main}. Verdicts on {m}: {count_line(fs)}; after Holm's "
                f"correction over its {n_parts} tested parts (a family of its own): {count_line(fs, 'holm')}.", "",
                f"| finding | evidence: paper \u2192 ours | ours on {m} (95% CI) \u2192 part verdict | "
                f"verdict on {m} | verdict on {main} |", "|:--|:--|:--|:--|:--|"]
        for f in fs:
            ours = "<br>".join([_md(p.text()) for p in f.parts] + [_md("beside: " + n) for n in f.notes] +
                               [_md("not in the verdict: " + p.text(tag=False)) for p in f.controls])
            v = f"**{f.result}**" + (f" ({_md(f.reason)})" if f.reason else "") + f"<br>Holm: {f.holm}"
            other = mine.get(f.key)
            out.append(f"| ({f.key}) {_md(f.claim)} | {_md(f.evidence)} | {ours} | {v} | "
                       f"{other.result if other else DASH} |")
        out += ["", f"Rows of {m} and their timings (seconds per evaluator; the row's wall time):", ""]
        for e in ents:
            for r in e.rows:
                t = r.get("timings") or {}
                lens = sorted({L for mm in (r.get("metrics") or {}).values() if isinstance(mm, dict)
                               for L in (mm.get("accuracy") or mm.get("ppl") or {})}, key=lambda x: int(x))
                out.append(f"- `{r.get('run_id')}` ({e.label}, lengths {', '.join(lens) or '?'}): "
                           + (", ".join(f"{k.removeprefix('eval.')} {v:.0f} s" for k, v in t.items()) or "no timings")
                           + f"; wall {_wall(r)}")
    return out


def _wall(row: dict) -> str:
    from datetime import datetime

    try:
        dt = datetime.fromisoformat(row["time_end"]) - datetime.fromisoformat(row["time_start"])
    except (KeyError, TypeError, ValueError):
        return "?"
    return f"{dt.total_seconds() / 3600:.2f} h"


def study_model(rs: RowSet) -> str | None:
    """The model with the most configurations (the study's model)."""
    ms = rs.models()
    return max(ms, key=lambda m: len(rs.for_model(m))) if ms else None


# -- the report ---------------------------------------------------------------------------------------------------
def _md(s: str) -> str:
    return str(s).replace("|", "\\|")


def count_line(fs: list[Finding], attr: str = "result") -> str:
    """'2 reproduced, 1 contradicted, 3 mixed, 7 inconclusive': the verdict counts as the report states them."""
    return ", ".join(f"{sum(getattr(f, attr) == v for f in fs)} {v}" for v in VERDICTS)


def report(rs: RowSet, model: str | None = None, paper: Paper | None = None, source: str = "results/runs/") -> str:
    """The findings report of ``model`` (default: the study's) on the rows of ``rs``, as markdown."""
    return _report(rs, model, paper, source)[0]


def summary(fs: list[Finding], model: str) -> dict:
    """What the results' index shows of a study's findings (``findings.json`` beside ``findings.md``, written from the
    same verdicts): per finding its claim, verdict raw and after Holm, and how many of its parts have an interval."""
    return {"model": model, "findings": [
        {"key": f.key, "claim": f.claim, "result": f.result, "holm": f.holm,
         "parts": len(f.parts), "tested": sum(1 for p in f.parts if p.ci is not None and not p.why),
         **({"tested_at": f.tested_at} if f.tested_at else {})} for f in fs]}


def _report(rs: RowSet, model: str | None, paper: Paper | None, source: str) -> tuple[str, dict]:
    """The report's markdown and its ``summary``."""
    model = model or study_model(rs) or DEFAULT_MODEL   # no rows: every finding "inconclusive (no rows: ...)"
    fs, ev, per_seed = seeded(rs, model, paper)
    gate_off = sensitivity(rs, model, paper)
    gate_on = [f.result for f in seeded(rs, model, paper, all_rows=())[0]]   # every finding on gated rows
    n_gated = sum(1 for r in rs.unconverged if r.get("model") == model)
    c = None
    for e in ev.entries:
        c = c or e.native_ctx
    n_parts = sum(1 for f in fs for p in f.parts if p.holm and not p.seed_only)
    out = _header(fs, ev, model, source, n_parts, n_gated, c)
    out += _caveats(rs, ev, model)
    out += _findings_table(rs, model, fs, gate_off)
    out += _gate_section(rs, model, fs, gate_off, gate_on)
    out += _duplicates(ev)
    out += _seed_section(rs, model, fs, per_seed)
    out += _not_testable(rs, model, ev, fs)
    out += real_model_sections(rs, model, paper, fs)
    out += ["", "## Rows used", ""]
    out += [f"- `{rid}` ({lab})" for rid, lab in sorted(ev.used.items())] or ["- none"]
    notes = rs.footnotes(model)
    if notes:
        out += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n", summary(fs, model)


def _documents(ev: Evidence) -> str:
    """The documents per PPL cell of this study's rows (``documents`` of its PPL entries): "4 documents", "8
    documents", "4 or 8 documents"."""
    ns = sorted({int(m["documents"]) for e in ev.entries for r in e.rows
                 for src in ("ppl_pg19", "ppl_proofpile") if src in ev.rs.spec["sources"]
                 for k in ev.rs.entry_keys(r, src)
                 if isinstance(m := r["metrics"][k], dict) and isinstance(m.get("documents"), int)})
    return (" or ".join(map(str, ns)) + " documents") if ns else "the documents of each cell"


def _header(fs: list[Finding], ev: Evidence, model: str, source: str, n_parts: int, n_gated: int, c) -> list[str]:
    """The report's title, model, verdict counts and its rules (verdict, seeds, evidence, gate)."""
    out = ["# Findings of the controlled study, tested on our rows",
           "",
           f"Generated by `make findings` (`controlled_study/findings/`) from the rows in `{source}` only; "
           "do not edit.",
           "",
           f"Model: **{model}** (" + (f"native window C = {c} tokens" if c else "no rows yet") +
           "; the paper's 4k = C, 32k = 8C, 64k = 16C). "
           f"Verdicts: {count_line(fs)}. After Holm's correction over all {n_parts} tested parts: "
           f"{count_line(fs, 'holm')}.",
           "",
           "**Verdict rule** (code: `Part.verdict`, `verdict`): each finding is one or more quantities (parts) with a "
           "95% interval; a part is *reproduced* when its interval lies entirely on the paper's side of the stated "
           "margin (0 for a difference), *contradicted* when entirely on the other side, *inconclusive* when it "
           "contains the margin or has no interval. A finding is *reproduced* if every part is, *mixed* if some "
           "parts are reproduced and others contradicted, *contradicted* if some are contradicted and none "
           "reproduced, *inconclusive* otherwise. A group comparison lists every member pair as a part of its own. "
           "*Holm*: the same rule after Holm's step-down correction over every tested part of every finding "
           "(family-wise 5%; each part's p-value inverts its own interval). A Needle score pooled over lengths is "
           "pooled, in a difference or a group comparison, over the lengths every side was evaluated at, and each "
           "such part names them (*pooled over ...*). "
           "Differences are paired (same prompts / documents) where the rows keep per-sample scores: Newcombe's "
           "interval for accuracies; for perplexity "
           f"and NLL over {_documents(ev)}, the Student t interval of the mean per-document difference "
           "(exponentiated for a PPL ratio), chosen by the coverage simulation in `tests/test_stats.py` at these "
           "sample sizes (the percentile bootstrap undercovers at n = 4 and n = 8). *fragile*: a second reasonable "
           "interval falls on another side of the margin "
           "(the BCa bootstrap beside a t interval over documents; the paired bootstrap beside Newcombe's over "
           "prompts). *limited by a ceiling / floor*: an inconclusive difference whose two sides are both at the top "
           "(or both at 0) at half its lengths or more: held there by the scale, not by noise.",
           "",
           f"**Seed rule** (code: `seeded`): {SEED_RULE}.",
           "",
           "**Evidence**: each finding is read on the evaluator its claim comes from in the paper (the *evidence* "
           "column: the paper's source \u2192 ours); where the rows have no measurable scores of that evaluator, the "
           "part falls back to the one named there. RULER here is always " + RULER_STYLE + " (the project's own "
           "offline generator, `harness/evals/ruler_data.py`; its differences from RULER's samples: "
           "`docs/ruler_check.md`): its numbers are not comparable with RULER's published ones.",
           "",
           "**Gate**: the convergence gate admits a fine-tuned row when, inside C, its PPL on held-out books is within "
           "10% of the base's and its passkey accuracy is >= 0.9. Findings that test one of those quantities ("
           + ", ".join(f"({k}): {v}" for k, v in GATE_QUANTITY.items()) + ") are read on all rows, gate-failed "
           f"included; the others on gated rows, with the verdict on all rows beside them ({n_gated} gate-failed "
           "rows; *with gate-failed rows*, a sensitivity line). How the gate could bias each finding: the section "
           "*Convergence gate* below.",
           ""]
    return out


def _caveats(rs: RowSet, ev: Evidence, model: str) -> list[str]:
    """Rows admitted by an older gate, and where the Needle evidence comes from."""
    out: list[str] = []
    superseded = {id(r) for r in rs.superseded}  # re-run under the current gate: those rows decide nothing
    old_gate = sorted(r.get("run_id", "?") for r in rs.all_rows
                      if r.get("model") == model and outdated(r) and id(r) not in superseded)
    if old_gate:
        out += [f"**Gate caveat**: {len(old_gate)} fine-tuned rows were admitted or left out by an older convergence "
                f"gate (before version {MIN_GATE_VERSION}), which measured on the suite's own passkey prompts and "
                "books, "
                "so which rows enter the comparisons was decided on the evaluation's data. `make study` re-runs "
                "the fine-tuned points of the study with the held-out gate (another seed: `--seed N`); "
                "until then read the *with gate-failed rows* line beside each verdict.", ""]
    if ev.needle_note:
        out += [f"Needle: {ev.needle_note}.", ""]
    return out


def _findings_table(rs: RowSet, model: str, fs: list[Finding], gate_off: list[str]) -> list[str]:
    """One line per finding: its claim, evidence, metric, parts and verdicts."""
    out = ["| finding | evidence: paper \u2192 ours | metric, lengths, references | ours (95% CI) \u2192 part verdict "
            "| paper | verdict |",
            "|:--|:--|:--|:--|:--|:--|"]
    for f, off in zip(fs, gate_off):
        ours = "<br>".join([_md(p.text()) for p in f.parts] + [_md("beside: " + n) for n in f.notes] +
                           [_md("not in the verdict: " + p.text(tag=False)) for p in f.controls])
        v = f"**{f.result}**" + (f" ({_md(f.reason + _gated(rs, model, f.reason))})" if f.reason else "")
        v += f"<br>Holm: {f.holm}"
        v += f"<br>tested: {_md(f.tested_at)}" if f.tested_at else ""
        v += ("<br>read on all rows, gate-failed included" if f.all_rows else f"<br>with gate-failed rows: {off}")
        metric = f.metric + (f". References: {f.reference}" if f.reference else "")
        out.append(f"| ({f.key}) {_md(f.claim)} | {_md(f.evidence)} | {_md(metric)} | {ours} | {_md(f.paper)} | "
                   f"{v} |")
    return out


def _gate_section(rs: RowSet, model: str, fs: list[Finding], gate_off: list[str], gate_on: list[str]) -> list[str]:
    """What the convergence gate measures and how it could bias each finding."""
    out = ["", "## Convergence gate", "",
            "What the gate measures (`harness/evals/convergence.py`): a fine-tuned row's PPL on held-out books at C "
            "over the base's (<= 1.10) and its passkey accuracy at C (>= 0.9) on the gate's own template and seed. "
            + _gate_documents(rs, model), "",
            "| finding | read on | how the gate could bias it | verdict on gated rows | on all rows |",
            "|:--|:--|:--|:--|:--|"]
    for f, off, on in zip(fs, gate_off, gate_on):
        out.append(f"| ({f.key}) | {'all rows (the gate measures what it tests)' if f.all_rows else 'gated rows'} | "
                   f"{_md(GATE_BIAS[f.key])} | {on} | {off} |")
    return out


def _duplicates(ev: Evidence) -> list[str]:
    """Configurations counted once: identical per-prompt Needle outcomes at every length."""
    out: list[str] = []
    if ev.duplicates:
        out += ["", "## Duplicate configurations", "",
                "Configurations with identical per-prompt Needle outcomes at every length give the same evidence "
                "(whatever their names; the same outcomes, not necessarily the same method) and are counted once, "
                "as the first:", ""]
        out += [f"- {keep} = {dup} (n = {n} prompts, every outcome the same)"
                for dup, (keep, n) in sorted(ev.duplicates.items())]
    return out


def _seed_section(rs: RowSet, model: str, fs: list[Finding], per_seed: dict) -> list[str]:
    """Each finding on each training seed alone, and the seed-to-seed differences."""
    out: list[str] = []
    if per_seed:
        out += ["", "## Training seeds", "",
                "Fine-tuned configurations with rows of several training seeds (`data.seed` and `train.seed`: the "
                "mixture's sample and order and the training RNG; the evaluation prompts are the same). Each finding's "
                "verdict on each seed alone (the report's verdict comes from the parts compared across seeds: the "
                "seed rule in the header).",
                "", "| finding | " + " | ".join([f"seed {_shown_seed(rs, model)} (shown)"]
                                                   + [f"seed {s}" for s in per_seed]) + " |",
                "|:--|" + ":--|" * (1 + len(per_seed))]
        for i, f in enumerate(fs):
            out.append(f"| ({f.key}) | {f.on_shown_seed} | " + " | ".join(v[i] for v in per_seed.values()) + " |")
        out += ["", "Seed to seed, same configuration, same prompts / documents (other seed minus shown; a "
                "difference only where the interval excludes 0 — passkey — or 1 — PPL ratio):", "",
                "| configuration | seeds | passkey at C | passkey at 8C | PPL ratio at C | PPL ratio at 8C | runs |",
                "|:--|:--|:--|:--|:--|:--|:--|"] + seed_differences(rs, model)
    return out


def _not_testable(rs: RowSet, model: str, ev: Evidence, fs: list[Finding]) -> list[str]:
    """What this scale cannot test: evaluators at their floor, evaluators not run, findings without rows."""
    out = ["", "## Not testable at this scale", ""]
    nt = []
    for src, name in (("niah", "NIAH"), ("ruler", "RULER"), ("passkey", "passkey")):
        fl = est.floor(rs, model, src)
        if not fl.measurable:
            nt.append(f"- {name}: not measurable at this scale: {fl.reason} (threshold: the evaluator's `floor`, "
                      "`harness/evals/<name>.py`). Findings that the paper shows on it are tested on "
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
    if ev.other_suites:
        nt.append(f"- rows of other evaluation suites than the study's (eval={ev.suite}) are not compared with it: "
                  + ", ".join(f"eval={x}" for x in ev.other_suites) + ".")
    out += nt or ["- nothing: every finding has the rows it needs."]
    return out


def write(results_dir: str | Path, out: str | Path | None = None, model: str | None = None,
          runs_dir: str | Path | None = None, study: str | None = None) -> Path:
    """``results/<study>/findings.md`` from the study's own rows (``study`` None: the rows of no study,
    ``results/runs/`` -> ``results/findings.md``); ``runs_dir``: the rows of an archived study instead. Beside it,
    ``findings.json`` (``summary``): the verdicts the results' index shows across studies."""

    rs = RowSet(read_rows(results_dir, study) if runs_dir is None else read_rows_in(runs_dir), load_spec())
    here = study_dir(results_dir, study)
    path = Path(out or here / "findings.md")
    text, brief = _report(rs, model, None, str(runs_dir) if runs_dir is not None else rows_source(study))
    with signals_held():  # findings.md, the front page's and the index's verdict counts change together
        atomic_write_text(path, text)
        atomic_write_text(path.with_suffix(".json"), json.dumps(brief, indent=1) + "\n")
        if runs_dir is None and out is None:  # the study's front page and the index carry the verdict counts

            write_front(here, findings_path=path, study=study)
            write_index(results_dir)
    return path
