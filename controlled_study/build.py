"""Table builders: one function per table of the controlled study (and the two other papers' tables).

Each builder takes the ``RowSet``, the ``Paper``, the model name and returns a ``Table`` (or None when no row of
that model has a number for it). Lengths are mapped as multiples of the model's native window C: our length L
lands in the paper's column ``kfmt(L / C x paper_C)`` (tiny_llama, C = 256: 2048 tokens -> the paper's "32k").
"""
from __future__ import annotations

import math
import sys
from datetime import datetime

from controlled_study import estimates as est
from controlled_study import samples
from controlled_study.paper import Paper
from controlled_study.render import DASH, Cell, Table
from controlled_study.rows import (
    Entry,
    RowSet,
    at_factor,
    factors,
    kfmt,
    method_key,
    native_ctx,
    num,
    train_len,
    training_seed,
)
from harness.methods import METHODS

CHECK = "\u2713"


# -- helpers ---------------------------------------------------------------------------------------------------
def is_second(rs: RowSet, model: str) -> bool:
    return model in (rs.spec.get("second_base_models") or [])


def attention(rs: RowSet, e: Entry) -> str:
    """The entry's attention family (``harness.methods.facts``); a row of no method (a factor search) is placed
    with the exact ones."""
    f = e.facts
    return f.family if f else "exact"


def paper_len_label(e: Entry, paper_c: int) -> str:
    """The entry's training length in the paper's units (frozen: the native window)."""
    c = e.native_ctx
    tl = e.train_len
    if not c:
        return "?"
    return kfmt(paper_c * (tl / c if tl else 1))


def length_notes(rs: RowSet, model: str, paper_c: int, paper_name: str) -> list[str]:
    ents = rs.for_model(model)
    cs = sorted({e.native_ctx for e in ents if e.native_ctx})
    c = cs[0] if cs else None
    ex = f"; e.g. the column {kfmt(paper_c * 8)} = 8C = {8 * c} tokens for ours" if c else ""
    return [f"Ours: {model} (native window C = {c} tokens); paper: {paper_name} (C = {kfmt(paper_c)}). Columns "
            f"are lengths as multiples of C{ex}. The numbers are not expected to match, the shape is.",
            "Cell: ours [95% CI] / paper (ours - paper); \u2014 = no number."]


def rows_for(rs: RowSet, paper: Paper, model: str, tid: str):
    """[(paper_row or None, entry or None)] in the paper's row order, then our entries the paper does not have."""
    ents = rs.for_model(model)
    out, used = [], set()
    prows = paper.table(tid)["rows"] if tid else []
    seen = set()
    for pr in prows:
        if pr["key"] in seen:
            continue
        seen.add(pr["key"])
        match = [e for e in ents if paper_match(paper, e, pr["key"])]
        if not match:
            out.append((pr, None))
        for e in match:
            out.append((pr, e))
            used.add(id(e))
    for e in ents:
        if id(e) not in used:
            out.append((None, e))
    return out


def paper_match(paper: Paper, e: Entry, key: str) -> bool:
    """Our entry stands for the paper's row / column ``key``: same method, and frozen when the paper's is (Table 1
    says which; a frozen YaRN is not the paper's fine-tuned YaRN)."""
    if e.method != key:
        return False
    frozen = {r["key"]: r["training"] == "frozen" for r in paper.table("table1")["rows"]}
    frozen["base"] = True
    return key not in frozen or frozen[key] == e.frozen


def series_getter(metric: str, factor: float):
    return lambda m, r: at_factor(m.get(metric), native_ctx(r), factor)


def entry_factors(rs: RowSet, e: Entry, source: str) -> set:
    """Length factors (multiples of C) at which ``e`` has ``source``'s headline metric."""
    metric, fs = est.metric(rs, source), set()
    for r in e.rows:
        for k in rs.entry_keys(r, source):
            fs.update(factors(r["metrics"][k].get(metric), native_ctx(r)))
    return fs


def columns_for(paper_cols: list[str], paper_c: int, extra_factors) -> list[tuple[str, float]]:
    cols = {lab: int(float(lab[:-1]) * 1024) / paper_c for lab in paper_cols}
    for f in extra_factors:
        lab = kfmt(f * paper_c)
        cols.setdefault(lab, f)
    return sorted(cols.items(), key=lambda kv: kv[1])


def ci_for(rs: RowSet, pick, names_extra: list[str], source: str, where: dict, group_by: str | None,
           reported: float | None):
    """The bootstrap interval of ``reported`` from the picked row's per-sample records, read by the fields the
    source's evaluator declares (``records``; ``where`` and ``group_by`` name its keys: ``length``, ``task``)."""
    if pick.row is None or reported is None:
        return None
    rec = est.records(rs, source)
    if not rec:
        return None
    names = [pick.entry_key] + names_extra
    w = {rec[k]: v for k, v in where.items() if rec.get(k)}
    if len(w) != len(where):
        return None
    gb = rec.get(group_by) if group_by else None
    if group_by and not gb:
        return None
    return samples.interval_for(pick.row, names, list(rec["score"]), w, gb, reported)


# -- Table 2 / 5: perplexity by length ---------------------------------------------------------------------------
def ppl_table(rs: RowSet, paper: Paper, model: str) -> Table | None:
    second = is_second(rs, model)
    blocks = [("PG19", "ppl_pg19", None if second else "table2_pg19"),
              ("Proof-file", "ppl_proofpile", "table5" if second else "table2_proofpile")]
    ptid0 = blocks[1][2]
    paper_c = int(paper.table(ptid0).get("native_ctx") or paper.data["controlled_study"]["native_ctx"])
    tid = "table5" if second else "table2"
    # columns: union over blocks
    extra = set()
    for _, src, _ in blocks:
        for e in rs.for_model(model):
            extra |= entry_factors(rs, e, src)
    cols = columns_for(paper.table(ptid0)["columns"], paper_c, extra)
    t = Table(f"{tid}_{model}", f"Table {tid[5:]}: Perplexity by evaluation length ({model})",
              ["Len", "Ex", "Methods"] + [c for c, _ in cols], label_cols=3,
              notes=length_notes(rs, model, paper_c, "Phi-2-base" if second else "LLaMA2-7B"))
    protos = set()
    for name, src, ptid in blocks:
        start = len(t.rows)
        any_ours = False
        for pr, e in rows_for(rs, paper, model, ptid):
            if e is not None and e.protocol:
                protos.add(e.protocol)
            cells = []
            for lab, f in cols:
                c = Cell(decimals=2)
                if pr is not None:
                    c.has_paper, c.paper = paper.value(ptid, pr["key"], lab)
                if e is not None:
                    c.fill(est.at(rs, e, src, f), source="PPL")
                    any_ours |= c.ours is not None
                cells.append(c)
            if e is None and pr is None:
                continue
            if e is not None and all(c.ours is None for c in cells) and not any(c.has_paper for c in cells):
                continue
            if e is not None:
                labels = [paper_len_label(e, paper_c), CHECK if attention(rs, e) == "exact" else "",
                          display_label(rs, pr, e)]
            else:
                labels = [pr.get("len", ""), CHECK if pr.get("exact") else "", pr["label"]]
            t.add(labels, cells, e)
        if len(t.rows) > start:
            t.sections[start] = name + ("" if any_ours else " (no rows of ours)")
    if t.n_ours() == 0:
        return None
    if protos and protos != {"longlora"}:
        t.footnotes.append(f"Our PPL protocol: {', '.join(sorted(protos))} (the paper: sliding window 256, LongLoRA "
                           "protocol); the two protocols' numbers are not comparable in absolute terms.")
    t.legend = rs.legend(t.entries)
    t.footnotes += rs.footnotes(model)
    return t


def display_label(rs: RowSet, pr, e) -> str:
    """Ours: the entry's short label (the base model by its own name); paper-only rows: the paper's label."""
    return e.label if e is not None else pr["label"]


# -- Table 3 / 6: RULER average by length -----------------------------------------------------------------------
# every `ruler` row comes from the project's own offline generator (harness/evals/ruler_data.py), never RULER's
# samples: each table that prints it says so (docs/ruler_check.md: the differential check against lm-eval's RULER)
RULER_STYLE_NOTE = ("Ours: the project's RULER-style tasks (the offline generator harness/evals/ruler_data.py, "
                    "written from RULER 4f6507e), not RULER's own samples: not comparable with RULER's published "
                    "numbers; the paper's numbers beside are RULER's. Differences: docs/ruler_check.md.")


def ruler_table(rs: RowSet, paper: Paper, model: str) -> Table | None:
    second = is_second(rs, model)
    ptid = "table6" if second else "table3"
    paper_c = int(paper.table(ptid).get("native_ctx") or paper.data["controlled_study"]["native_ctx"])
    extra = set()
    for e in rs.for_model(model):
        extra |= entry_factors(rs, e, "ruler")
    cols = columns_for(paper.table(ptid)["columns"], paper_c, extra)
    t = Table(f"{ptid}_{model}", f"Table {ptid[5:]}: RULER average by evaluation length ({model}; ours: the "
              "project's RULER-style tasks)",
              ["Models", "Train Len"] + [c for c, _ in cols], label_cols=2,
              notes=length_notes(rs, model, paper_c, "Phi-2-base" if second else "LLaMA2-7B") + [RULER_STYLE_NOTE])
    order = {"frozen": 0, "fine-tuned": 1}
    fl = est.floor(rs, model, "ruler")
    items = rows_for(rs, paper, model, ptid)
    items.sort(key=lambda pe: order["frozen" if (pe[1].frozen if pe[1] else pe[0].get("training") == "frozen")
                                    else "fine-tuned"])
    last = None
    for pr, e in items:
        cells = []
        for lab, f in cols:
            c = Cell(decimals=2)
            if pr is not None:
                c.has_paper, c.paper = paper.value(ptid, pr["key"], lab)
            if e is not None:
                c.fill(est.at(rs, e, "ruler", f), source="RULER")
                if c.ours is not None and not fl.measurable:
                    c.nm = fl.reason
            cells.append(c)
        if e is not None and all(c.ours is None for c in cells) and pr is None:
            continue
        grp = "Frozen" if (e.frozen if e else pr.get("training") == "frozen") else "Finetuned"
        if grp != last:
            t.sections[len(t.rows)] = grp
            last = grp
        tl = paper_len_label(e, paper_c) if e is not None else pr.get("train_len", "")
        t.add([display_label(rs, pr, e), tl], cells, e)
    if t.n_ours() == 0:
        return None
    t.legend = rs.legend(t.entries)
    t.footnotes += rs.footnotes(model)
    return t


# -- Table 1: overview ------------------------------------------------------------------------------------------
def _mean_series(m: dict, metric: str, scale: float):
    s = m.get(metric)
    if not isinstance(s, dict):
        return None
    vals = [num(v) for v in s.values()]
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) * scale if vals else None


def task_mean(m: dict):
    tasks = m.get("tasks")
    if not isinstance(tasks, dict):
        return None
    vals = [num(v) for v in tasks.values()]
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def table1(rs: RowSet, paper: Paper, model: str) -> Table | None:
    spec = rs.spec["table1"]
    cols = paper.table("table1")["columns"]
    t = Table(f"table1_{model}", f"Table 1: Overview of results across different extension types ({model})",
              ["Attention Mechanisms", "Training", "Model"] + cols, label_cols=3,
              notes=length_notes(rs, model, 4096, "LLaMA2-7B") +
              [RULER_STYLE_NOTE,
               "PPL = PG19 perplexity at 8C (paper: 32k); RULER = RULER average at 8C (ours: the project's RULER-style "
               "tasks); Needle = NIAH score averaged "
               "over the evaluated lengths (x100); Mshots = many-shot accuracy averaged over the shot counts; LongB "
               "= LongBench mean over tasks."])
    fls = {k: est.floor(rs, model, k) for k in ("niah", "passkey", "ruler")}
    has_niah = any(est.lengths_of(rs, e, "niah") for e in rs.for_model(model))
    needle_src = "niah" if has_niah and fls["niah"].measurable else "passkey"
    used_passkey = False
    groups = [("exact", "frozen"), ("exact", "fine-tuned"), ("approximate", "frozen"), ("approximate", "fine-tuned")]
    items = rows_for(rs, paper, model, "table1")
    for att, tr in groups:
        for pr, e in items:
            if e is not None:
                if attention(rs, e) != att or ("frozen" if e.frozen else "fine-tuned") != tr:
                    continue
            elif (pr["attention"], pr["training"]) != (att, tr):
                continue
            cells = []
            for j, col in enumerate(cols):
                c = Cell(decimals=paper.decimals("table1", j))
                if pr is not None:
                    c.has_paper, c.paper = paper.value("table1", pr["key"], col)
                if e is not None:
                    cs = spec[col]
                    src = cs["source"]
                    if src in ("ppl_pg19", "ruler") and "at" in cs:
                        c.fill(est.at(rs, e, src, float(cs["at"])), source="PPL" if src != "ruler" else "RULER")
                        if src == "ruler" and c.ours is not None and not fls["ruler"].measurable:
                            c.nm = fls["ruler"].reason
                    elif col == "Needle":  # NIAH; passkey where NIAH is not measurable or was not run
                        for ns in dict.fromkeys([needle_src, "passkey"]):
                            x = est.pooled([est.at(rs, e, ns, f) for f in est.lengths_of(rs, e, ns)])
                            if x is not None:
                                c.fill(x, 100.0, source=ns + " (pooled over lengths)")
                                used_passkey |= ns == "passkey"
                                if not fls[ns].measurable:
                                    c.nm = fls[ns].reason
                                break
                    elif "at" in cs:
                        metric = est.metric(rs, src)
                        p = rs.pick(e, src, series_getter(metric, float(cs["at"])))
                        c.ours = num(p.value)
                    elif cs.get("reduce") == "longbench_average":
                        p = rs.pick(e, src, lambda m, r: task_mean(m))
                        c.ours = num(p.value)
                        if c.ours is not None:
                            c.ci = ci_for(rs, p, ["longbench"], "longbench", {}, "task", c.ours)
                    else:
                        sd, sm = rs.spec["sources"][src], est.metric(rs, src)
                        p = rs.pick(e, src, lambda m, r, sd=sd, sm=sm: _mean_series(m, sm, sd.get("scale", 1)))
                        if p.value is not None:
                            c.ours = num(p.value)
                            c.ci = ci_for(rs, p, [sd.get("evaluator", src)], src, {}, "length", c.ours)
                    if c.ours is not None and c.ci is None and not c.no_ci:
                        c.no_ci = "no per-sample scores for this evaluator"
                cells.append(c)
            if e is not None and pr is None and all(c.ours is None for c in cells):
                continue
            t.add(["Exact Attention" if att == "exact" else "Approxi. Attention",
                   "Frozen" if tr == "frozen" else "Fine-Tuned", display_label(rs, pr, e)], cells, e)
    if t.n_ours() == 0:
        return None
    if used_passkey:
        why = ("NIAH is not measurable at this scale: " + fls["niah"].reason) if needle_src == "passkey" and \
            has_niah else "where NIAH was not run"
        t.footnotes.append(f"Needle: passkey retrieval accuracy (pooled over the evaluated lengths, x100): {why}.")
    t.legend = rs.legend(t.entries)
    t.footnotes += rs.footnotes(model)
    return t


# -- Tables with methods as columns: LongBench (11) and RULER subtasks (12-16) ------------------------------------
def method_columns(rs: RowSet, paper: Paper, model: str, ptid: str, source: str):
    """[(header, paper_method_key or None, entry or None)] in the paper's column order, then our extra methods
    (only entries that ran ``source``; a paper column without such an entry is kept, paper numbers only)."""
    t = paper.table(ptid)
    ents = [e for e in rs.for_model(model) if any(rs.entry_keys(r, source) for r in e.rows)]
    out, used = [], set()
    for lab, key in zip(t["columns"], t["column_keys"]):
        match = [e for e in ents if paper_match(paper, e, key)]
        if not match:
            out.append((lab, key, None))
        for e in match:
            out.append((lab + e.suffix, key, e))
            used.add(id(e))
    for e in ents:
        if id(e) not in used:
            out.append((e.label, None, e))
    return out


def _task_value(tasks, aliases):
    if not isinstance(tasks, dict):
        return None
    for a in aliases:
        if a in tasks:
            return tasks[a]
    return None


def longbench_table(rs: RowSet, paper: Paper, model: str) -> Table | None:
    ptid = "table11"
    cols = method_columns(rs, paper, model, ptid, "longbench")
    t = Table(f"table11_{model}", f"Table 11 (Table 4): LongBench results ({model})",
              ["Task", "Avglen"] + [h for h, _, _ in cols], label_cols=2,
              notes=[f"Ours: {model}; paper: LLaMA2-7B, prompts truncated from the middle to 32k.",
                     "Cell: ours [bootstrap 95% CI] / paper (ours - paper); \u2014 = no number. Average = mean of "
                     "the tasks (as the paper's Average: the mean of its 16 tasks)."],
              legend=rs.legend([e for _, _, e in cols]))
    aliases = rs.spec.get("longbench_tasks") or {}
    for pr in paper.table(ptid)["rows"]:
        cells = []
        for _h, key, e in cols:
            c = Cell(decimals=2)
            if key is not None:
                c.has_paper, c.paper = paper.column_value(ptid, pr["key"], key)
            if e is not None:
                if pr["key"] == "average":
                    p = rs.pick(e, "longbench", lambda m, r: task_mean(m))
                    c.ours = num(p.value)
                    if c.ours is not None:
                        c.ci = ci_for(rs, p, ["longbench"], "longbench", {}, "task", c.ours)
                else:
                    al = aliases.get(pr["key"], [pr["key"]])
                    p = rs.pick(e, "longbench", lambda m, r, al=al: num(_task_value(m.get("tasks"), al)))
                    c.ours = num(p.value)
                    if c.ours is not None and p.row is not None:
                        task = next((a for a in al if a in (p.row["metrics"][p.entry_key].get("tasks") or {})), None)
                        c.ci = ci_for(rs, p, ["longbench"], "longbench", {"task": task}, None, c.ours)
            cells.append(c)
        avglen = f"{pr['avglen']:,}" if pr.get("avglen") else ""
        t.add([pr["label"], avglen], cells)
    if t.n_ours() == 0:
        return None
    t.footnotes += rs.footnotes(model)
    return t


def ruler_subtask_tables(rs: RowSet, paper: Paper, model: str) -> list[Table]:
    out = []
    aliases = rs.spec.get("ruler_tasks") or {}
    floors: dict = {}
    for ptid in ("table12", "table13", "table14", "table15", "table16"):
        pt = paper.table(ptid)
        f = int(pt["length"][:-1]) * 1024 / 4096
        cols = method_columns(rs, paper, model, ptid, "ruler")
        t = Table(f"{ptid}_{model}", f"Table {ptid[5:]}: RULER results on {pt['length']} context length ({model}; "
                  "ours: the project's RULER-style tasks)",
                  ["Task"] + [h for h, _, _ in cols], label_cols=1,
                  notes=[f"Ours: {model} at {f:g}C (the paper's {pt['length']} = {f:g} x 4k).", RULER_STYLE_NOTE,
                         "Cell: ours [95% CI] / paper (ours - paper); \u2014 = no number."],
                  legend=rs.legend([e for _, _, e in cols]))
        for pr in pt["rows"]:
            cells = []
            al = aliases.get(pr["key"], [pr["key"]])
            if pr["key"] == "average":
                fl = floors.setdefault("average", est.floor(rs, model, "ruler"))
            else:
                task = next((a for a in al if any(est.task_factors(rs, e, a) for e in rs.for_model(model))), al[0])
                fl = floors.setdefault(task, est.floor(rs, model, "ruler", task=task))
            for _h, key, e in cols:
                c = Cell(decimals=2)
                if key is not None:
                    c.has_paper, c.paper = paper.column_value(ptid, pr["key"], key)
                if e is not None and e.native_ctx:
                    if pr["key"] == "average":
                        c.fill(est.at(rs, e, "ruler", f), source="RULER")
                    else:
                        c.fill(est.at(rs, e, "ruler", f, lambda m, L, t=task: est.ruler_task(m, t, L)),
                               source="RULER")
                    if c.ours is not None and not fl.measurable:
                        c.nm = fl.reason
                cells.append(c)
            t.add([pr["label"]], cells)
        if t.n_ours():
            skipped = set()
            for _h, _k, e in cols:
                for r in (e.rows if e else []):
                    for ek in rs.entry_keys(r, "ruler"):
                        skipped |= set((r["metrics"][ek].get("skipped_tasks") or {}).keys())
            if skipped:
                t.footnotes.append(f"Tasks not run by us (skipped_tasks): {', '.join(sorted(skipped))}; our Avg. is "
                                   "the mean over the tasks run.")
            t.footnotes += rs.footnotes(model)
            out.append(t)
    return out


# -- Table 9: NTK scale factor sweep ------------------------------------------------------------------------------
SCALE_KEYS = ("scale", "factor", "alpha", "s", "ntk_factor", "scaling_factor")


def _scale(e: Entry):
    mp = e.method_params
    for k in SCALE_KEYS:
        if isinstance(mp.get(k), (int, float)) and not isinstance(mp.get(k), bool):
            return float(mp[k])
    return None


def table9(rs: RowSet, paper: Paper, model: str) -> Table | None:
    ents = [e for e in rs.for_model(model) if e.method.startswith("ntk") and _scale(e) is not None]
    by: dict = {}
    for e in ents:
        by.setdefault(e.method, []).append(e)
    sweeps = {k: v for k, v in by.items() if len({_scale(e) for e in v}) >= 2}
    if not sweeps:
        return None
    pt = paper.table("table9")
    extra = set()
    for v in sweeps.values():
        for e in v:
            extra |= entry_factors(rs, e, "ppl_pg19")
    cols = columns_for(pt["columns"], 4096, extra)
    t = Table(f"table9_{model}", f"Table 9: Scale factor vs perplexity on PG19 ({model})",
              ["Models", "Scale Factor"] + [c for c, _ in cols], label_cols=2,
              notes=length_notes(rs, model, 4096, "LLaMA2-7B") +
              ["Paper rows are shown for their own scale factors; ours for ours (a cell pairs them only when the "
               "scale factors are equal)."])
    first = ("ntk_frozen", "ntk_32k", "ntk_64k")
    for key in first + tuple(k for k in sweeps if k not in first):
        lines = []
        for pr in paper.rows("table9", key):
            lines.append((float(pr["scale"]), pr, None))
        for e in sweeps.get(key, []):
            s = _scale(e)
            hit = [i for i, (sc, pr, ee) in enumerate(lines) if sc == s and ee is None and pr is not None]
            if hit:
                lines[hit[0]] = (s, lines[hit[0]][1], e)
            else:
                lines.append((s, None, e))
        if key not in sweeps:
            continue
        for s, pr, e in sorted(lines, key=lambda x: x[0]):
            cells = []
            for lab, f in cols:
                c = Cell(decimals=2)
                if pr is not None:
                    c.has_paper, c.paper = paper.value("table9", key, lab, scale=pr["scale"])
                if e is not None:
                    c.fill(est.at(rs, e, "ppl_pg19", f), source="PPL")
                cells.append(c)
            label = pr["label"] if pr is not None else (METHODS.facts(key).label if METHODS.facts(key) else key)
            t.add([label + ("" if e is not None else " (paper)"), f"{s:g}"], cells, e)
    if t.n_ours() == 0:
        return None
    t.legend = rs.legend(t.entries)
    t.footnotes += rs.footnotes(model)
    return t


# -- Entropy-ABF LongBench-12 and LongRoPE short-context tables ---------------------------------------------------
def _rows_table(rs: RowSet, paper: Paper, model: str, ptid: str, source: str, alias_key: str, tid: str, title: str,
                mean_col: str | None, notes: list[str]) -> Table | None:
    pt = paper.table(ptid)
    aliases = rs.spec.get(alias_key) or {}
    keys = pt["column_keys"]
    t = Table(f"{tid}_{model}", title, ["Model"] + pt["columns"], label_cols=1, notes=notes)
    items = [(pr, e) for pr, e in rows_for(rs, paper, model, ptid)
             if e is None or any(rs.entry_keys(r, source) for r in e.rows)]
    for pr, e in items:
        cells = []
        for j, (col, key) in enumerate(zip(pt["columns"], keys)):
            c = Cell(decimals=paper.decimals(ptid, j))
            if pr is not None:
                c.has_paper, c.paper = paper.value(ptid, pr["key"], col)
                if isinstance(c.paper, str):
                    c.text, c.has_paper = (c.paper if e is None else None), False
                    c.paper = None
            if e is not None:
                if key == "window":
                    c.text = f"{e.train_len or e.native_ctx} tok"
                elif key == mean_col:
                    ks = [k for k in keys if k not in (mean_col, "window")]
                    p = rs.pick(e, source, lambda m, r, ks=ks: _mean_present(m.get("tasks"), ks, aliases))
                    c.ours = num(p.value)
                else:
                    al = aliases.get(key, [key])
                    p = rs.pick(e, source, lambda m, r, al=al: num(_task_value(m.get("tasks"), al)))
                    c.ours = num(p.value)
            cells.append(c)
        if e is not None and pr is None and all(c.ours is None for c in cells):
            continue
        t.add([display_label(rs, pr, e)], cells, e)
    if t.n_ours() == 0:
        return None
    t.legend = rs.legend(t.entries)
    t.footnotes += rs.footnotes(model)
    return t


def _mean_present(tasks, keys, aliases):
    vals = [num(_task_value(tasks, aliases.get(k, [k]))) for k in keys]
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def entropy_abf_table(rs: RowSet, paper: Paper, model: str) -> Table | None:
    return _rows_table(rs, paper, model, "entropy_abf_longbench12", "longbench12", "longbench_tasks",
                       "longbench12", f"Entropy-ABF Table 2: LongBench-12 ({model})", "macro",
                       [f"Ours: {model}; paper: LLaMA-2-7B-Chat fine-tuned on 3.5k ShareGPT conversations (Zhang et "
                        "al. 2024). Macro = mean of the 12 tasks (of the tasks we ran).",
                        "Cell: ours / paper (ours - paper); \u2014 = no number."])


def longrope_short_table(rs: RowSet, paper: Paper, model: str) -> Table | None:
    ptid = "longrope_short_mistral" if "mistral" in model else "longrope_short_llama2"
    return _rows_table(rs, paper, model, ptid, "short_context", "short_context_tasks", "short_context",
                       f"LongRoPE Table 8: short-context benchmarks within the original window ({model})", None,
                       [f"Ours: {model}; paper: {'Mistral-7B' if 'mistral' in ptid else 'LLaMA2-7B'} extensions "
                        "(Ding et al. 2024), ARC-c 25-shot, HellaSwag 10-shot, MMLU 5-shot, TruthfulQA 0-shot.",
                        "Cell: ours / paper (ours - paper); \u2014 = no number. Context Window of ours: the training "
                        "length (frozen: native window) in tokens."])


# -- the README's "Measured here": PPL and passkey by length, every configuration, with intervals --------------------
def _summary_order(rs: RowSet, paper: Paper, e: Entry):
    """Frozen before fine-tuned, exact before approximate attention; within a group the base model, then the
    paper's methods in its Table 1 order, then the others (those the paper did not study last), by label."""
    keys = ["base"] + [r["key"] for r in paper.table("table1")["rows"]]
    f = e.facts
    return (not e.frozen, attention(rs, e) != "exact", bool(f and f.beyond_paper),
            keys.index(e.method) if e.method in keys else len(keys), e.label)


def summary_table(rs: RowSet, paper: Paper, model: str, source: str = "passkey") -> Table | None:
    """One row per configuration, one column per length (multiples of C): ours with its interval, no paper numbers
    (the paper's lengths are 16x longer). ``source``: passkey | ppl_pg19."""
    ents = sorted(rs.for_model(model), key=lambda e: _summary_order(rs, paper, e))
    scale, dec = (1.0, 2) if source == "passkey" else (1.0, 1)
    fs = sorted({f for e in ents for f in est.lengths_of(rs, e, source)})
    if not fs:
        return None
    name = "passkey accuracy" if source == "passkey" else "perplexity on held-out books (PG19 analogue)"
    fl = est.floor(rs, model, "passkey") if source == "passkey" else est.Floor()
    t = Table(f"summary_{'passkey' if source == 'passkey' else 'ppl'}_{model}", f"Measured here: {name} ({model})",
              ["Method", "Training"] + [f"{f:g}C" for f in fs], label_cols=2,
              notes=[f"C = {ents[0].native_ctx} tokens; ours only, each cell with its 95% interval."])
    for e in ents:
        cells = [Cell(decimals=dec).fill(est.at(rs, e, source, f), scale, "passkey" if source == "passkey" else "PPL")
                 for f in fs]
        if all(c.ours is None for c in cells):
            continue
        if not fl.measurable:
            for c in cells:
                c.nm = fl.reason if c.ours is not None else None
        tr = _training(e)
        t.add([e.label, tr], cells, e)
    if not t.rows:
        return None
    t.legend = rs.legend(t.entries)
    t.footnotes += rs.footnotes(model)
    if source == "passkey":
        t.footnotes += est.same_outcome_notes(rs, t.entries, "passkey", "passkey")
    return t


def summary_tables(rs: RowSet, paper: Paper, model: str) -> list[Table]:
    return [t for t in (summary_table(rs, paper, model, "passkey"), summary_table(rs, paper, model, "ppl_pg19")) if t]


def effective_length_table(rs: RowSet, paper: Paper, model: str) -> Table | None:
    """RULER's headline: each configuration's effective length on the RULER-style tasks and on NIAH
    (``estimates.effective_length``): at RULER's bar (85.6, LLaMA2-7B's score at 4k) and, since a small model rarely
    reaches it, at the frozen base's own score at C (the longest length at or above what the base does inside its
    window)."""
    ents = sorted(rs.for_model(model), key=lambda e: _summary_order(rs, paper, e))
    ran = [s for s in ("ruler", "niah") if s in rs.spec["sources"] and any(est.lengths_of(rs, e, s) for e in ents)]
    floors = {s: est.floor(rs, model, s) for s in ran}
    sources = [s for s in ran if floors[s].measurable]   # a score at its floor has no length to speak of
    if not sources:
        return None
    base = next((e for e in ents if e.method == "base" and e.frozen), None)
    refs = {}
    for s in sources:
        x = est.at(rs, base, s, 1.0) if base is not None else None
        refs[s] = 100.0 * x.value / (x.top or 1.0) if x is not None and x.value else None  # the base at C
    names = {"ruler": "RULER-style", "niah": "NIAH"}
    cols = ["Method", "Training"]
    for s in sources:
        cols += [f"{names[s]} >= {est.RULER_THRESHOLD:g}"] + ([f"{names[s]} >= base at C "
                                                              f"({refs[s]:.1f})"] if refs[s] is not None else [])
    t = Table(f"effective_length_{model}", f"Effective context length ({model}): RULER's rule", cols, label_cols=2,
              notes=[f"C = {ents[0].native_ctx} tokens. Effective length: the longest evaluated length up to which "
                     f"every evaluated length scores at least the bar, on the point scores (RULER's rule); "
                     f"'>= L': every length tested passes (L, the longest tested, is a floor); '< L': even the "
                     f"shortest fails. Bars: RULER's {est.RULER_THRESHOLD:g} (LLaMA2-7B at 4k), and the frozen "
                     f"base's own score at C (a small model rarely reaches RULER's). Scores in % of each "
                     f"evaluator's scale; sample sizes: the RULER and NIAH tables."]
              + [f"{names[s]}: not measurable at this scale ({floors[s].reason}): no effective length."
                 for s in ran if s not in sources])
    for e in ents:
        cells = []
        for s in sources:
            for bar in ([est.RULER_THRESHOLD] + ([refs[s]] if refs[s] is not None else [])):
                cells.append(Cell(text=est.effective_text(est.effective_length(rs, e, s, bar))))
        if all(c.text == "\u2014" for c in cells):
            continue
        t.add([e.label, _training(e)], cells, e)
    if not t.rows:
        return None
    t.legend = rs.legend(t.entries)
    return t


def extended_sources(rs: RowSet) -> list[tuple[str, str]]:
    """``(source, column title)`` of every source whose evaluator declares a column of the 2024-benchmarks table
    (``extended``), in ``spec.yaml`` order."""
    return [(src, est.spec(rs, src).extended) for src in rs.spec["sources"] if est.spec(rs, src).extended]


def extended_table(rs: RowSet, paper: Paper, model: str) -> Table | None:
    """The 2024 benchmarks (``eval=extended``): one row per configuration, one column per benchmark and length
    (multiples of C), ours with its 95% interval (0..100); no paper numbers (the controlled study has none)."""
    ents = sorted(rs.for_model(model), key=lambda e: _summary_order(rs, paper, e))
    extended = extended_sources(rs)
    cols = [(src, lab, f) for src, lab in extended
            for f in sorted({f for e in ents for f in est.lengths_of(rs, e, src)})]
    if not cols:
        return None
    floors = {src: est.floor(rs, model, src) for src, _ in extended}
    shown = [(src, lab) for src, lab in extended if any(c[0] == src for c in cols)]
    what = "; ".join(f"{lab}: {est.spec(rs, src).extended_note}" for src, lab in shown
                     if est.spec(rs, src).extended_note)
    t = Table(f"extended_{model}", f"Measured here: {', '.join(lab for _, lab in shown)} ({model})",
              ["Method", "Training"] + [f"{lab} {f:g}C" for _, lab, f in cols], label_cols=2,
              notes=[f"C = {ents[0].native_ctx} tokens; ours only, each cell with its 95% interval. {what}. Every "
                     "score 0..100."])
    for e in ents:
        cells = []
        for src, _, f in cols:
            c = Cell(decimals=1).fill(est.at(rs, e, src, f), 1.0, src)
            if not floors[src].measurable and c.ours is not None:
                c.nm = floors[src].reason
            cells.append(c)
        if all(c.ours is None for c in cells):
            continue
        tr = _training(e)
        t.add([e.label, tr], cells, e)
    if not t.rows:
        return None
    t.legend = rs.legend(t.entries)
    t.footnotes += rs.footnotes(model)
    return t


# -- what the study cost: wall seconds each run recorded, by stage -------------------------------------------------
def _seconds(row: dict) -> float | None:
    try:
        return (datetime.fromisoformat(str(row["time_end"])) - datetime.fromisoformat(str(row["time_start"]))
                ).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def cost_table(rs: RowSet, paper: Paper, model: str) -> Table | None:
    """One row per configuration shown in the tables: the wall seconds its run recorded for fine-tuning (with steps
    and tokens/s) and for each evaluator, and the run's whole wall time, so a reader sees what the study cost and what
    dominates. Measured by each run under its own conditions (threads, other processes on the machine): a record,
    not a controlled benchmark (``make bench``, ``suite_cost``, is that)."""
    ents = sorted(rs.for_model(model), key=lambda e: _summary_order(rs, paper, e))
    rows = [(e.label, _training(e), r) for e in ents for seed in e.seeds for r in e.by_seed[seed]]
    rows += [(f"{method_key(r)} (gate failed)", _training_text(False, train_len(r), native_ctx(r)), r)
             for r in rs.unconverged if r.get("model") == model]
    rows = [x for x in rows if isinstance(x[2].get("timings"), dict) and x[2]["timings"]]
    if not rows:
        return None
    evs = list(dict.fromkeys(k for _, _, r in rows for k in r["timings"]))
    t = Table(f"cost_{model}", f"What the study cost: wall seconds per run and stage ({model})",
              ["Method", "Training", "suite", "seed", "threads", "steps", "train s", "train tok/s"]
              + [k.removeprefix("eval.") + " s" for k in evs] + ["eval s", "run s", "code"], label_cols=2,
              notes=["Wall seconds each run recorded (``train_info``, ``timings``, its start and end), under its own "
                     "conditions: torch threads as shown, and whatever else shared the machine's cores (other study "
                     "processes), so equal work can differ by 2-3x between rows; and with its own code (``code``: "
                     "the commit), so a method or evaluator made faster later still shows its old cost. Not a "
                     "benchmark: `make bench` (`suite_cost`) measures the suite on an otherwise idle machine."])
    tot_train = tot_eval = tot_run = 0.0
    for label, tr, r in rows:
        ti = r.get("train_info") if isinstance(r.get("train_info"), dict) else {}
        tm = r["timings"]
        ev_s = sum(float(v) for v in tm.values() if isinstance(v, (int, float)))
        run_s = _seconds(r)
        tr_s = ti.get("train_seconds")
        tot_train += float(tr_s or 0)
        tot_eval += ev_s
        tot_run += float(run_s or 0)
        txt = [str(r.get("eval") or DASH), str(training_seed(r) or DASH),
               str((r.get("hardware") or {}).get("torch_threads", DASH)), str(ti.get("steps", DASH)),
               f"{tr_s:.0f}" if isinstance(tr_s, (int, float)) else DASH,
               f"{ti['tokens_per_second']:.0f}" if isinstance(ti.get("tokens_per_second"), (int, float)) else DASH]
        txt += [f"{tm[k]:.0f}" if isinstance(tm.get(k), (int, float)) else DASH for k in evs]
        txt += [f"{ev_s:.0f}", f"{run_s:.0f}" if run_s is not None else DASH, str(r.get("git_sha") or DASH)[:7]]
        t.add([label, tr], [Cell(text=x) for x in txt])
    t.footnotes.append(f"Sum over the {len(rows)} runs shown: fine-tuning {tot_train / 3600:.2f} h, evaluation "
                       f"{tot_eval / 3600:.2f} h, whole runs {tot_run / 3600:.2f} h of process wall time (runs that "
                       "overlapped count in full: the study's own wall time is what `make study` prints).")
    t.legend = rs.legend(ents)
    return t


def _training_text(frozen: bool, tl: int | None, c: int | None) -> str:
    """The "Training" column: frozen, or the fine-tuning length in units of C."""
    return "frozen" if frozen else (f"fine-tuned at {tl / c:g}C" if tl and c else "fine-tuned")


def _training(e: Entry) -> str:
    if str(e.newest.get("method") or "").endswith("_search"):
        return "factor search"
    return _training_text(e.frozen, e.train_len, e.native_ctx)


BUILDERS = (table1, ppl_table, ruler_table, longbench_table, table9, entropy_abf_table, longrope_short_table)


def build_tables(rs: RowSet, paper: Paper, errors: list | None = None) -> list[Table]:
    """Every table the rows support. A builder that raises on unexpected row contents is reported (stderr and
    ``errors``) and skipped, so one malformed row never blocks the other tables."""
    out = []
    for model in rs.models():
        for b in BUILDERS + (ruler_subtask_tables, summary_tables, effective_length_table, extended_table, cost_table):
            try:
                t = b(rs, paper, model)
            except Exception as ex:  # noqa: BLE001 - reported, not hidden
                msg = f"{b.__name__}({model}) failed: {type(ex).__name__}: {ex}"
                print(f"warning: {msg}", file=sys.stderr)
                if errors is not None:
                    errors.append(msg)
                continue
            if isinstance(t, list):
                out += t
            elif t is not None:
                out.append(t)
    return out
