"""`make export`: every row of a results directory (every study's, ``<results>/<study>/runs/``, and the rows of no
study, ``<results>/runs/``) as one flat table, one line per run x suite entry x metric x length, for pandas / R /
spreadsheets (the shape of HELMET's ``collect_results.py`` output and RULER's ``summary.csv``). Written to
``<results>/export/results.csv`` and ``results.parquet`` (atomic, like every output).

Columns (``COLUMNS``; each one's type and meaning: the data dictionary, ``docs/export.md``, checked against
``COLUMNS`` by ``tests/test_export.py``): the run (``run_id``, ``status``, ``converged``), where it belongs
(``study``: the study it declares or whose folder it sits in, empty for a row of no study; ``suite``: the
evaluation suite, the row's ``eval``), its configuration (``model``, ``method``, ``row``, ``method_params`` as
JSON, ``data``, ``train``, ``seed``, ``eval_seed``, ``native_ctx``), the measurement (``entry``, ``evaluator``,
``metric``, ``axis``, ``x``, ``length``, ``length_over_c``, ``value``, ``ci_low``, ``ci_high``, ``n``) and
provenance (``config_hash``, ``git_sha``, ``time_end``).

What becomes a line: every metric of an entry whose value maps evaluation lengths to numbers (``{"512": 0.98}``),
and one level deeper for per-task metrics (RULER's ``tasks``, as ``tasks.<task>``); an entry scored once over a
token budget (LongBench: ``tasks`` = {task: score} with ``n`` per task, and its ``average``) gives one line per task
and the average at ``length`` = the entry's ``max_length``. The series' axis is the evaluation length unless the
entry names another (``"axis": "shots"``, many-shot TREC: ``x`` = shots, ``length`` empty).

The interval of a line is the entry's ``ci`` for its first such metric (the one the evaluator reports the interval
of) and ``task_ci`` for per-task metrics; ``n`` is the number of per-sample scores the row keeps for that length
(``per_sample`` / ``correct``) or the scored windows of a PPL entry. A metric without an interval in the row has
empty ``ci_*`` columns, never a made-up one. Rows that are not ``ok`` are exported too (filter on ``status``): what
a failed run measured before it failed is still a measurement.
"""
from __future__ import annotations

import json
from pathlib import Path

from controlled_study.estimates import RULER_THRESHOLD
from controlled_study.rows import converged, method_key, native_ctx, training_seed
from harness.results import atomic_write, read_rows, studies, study_of

COLUMNS = ("run_id", "status", "converged", "study", "suite", "model", "method", "row", "method_params", "data",
           "train", "seed", "eval_seed", "native_ctx", "entry", "evaluator", "metric", "axis", "x", "length",
           "length_over_c", "value", "ci_low", "ci_high", "n", "config_hash", "git_sha", "time_end")


def _by_length(v) -> bool:
    return isinstance(v, dict) and bool(v) and all(str(k).isdigit() for k in v) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values())


def _n(entry: dict, length: str, task: str | None = None):
    per = entry.get("per_sample")
    if isinstance(per, dict) and task is not None:
        per = per.get(task)
    for src in (per, entry.get("correct")):
        if isinstance(src, dict) and isinstance(src.get(length), list):
            return len(src[length])
    scored = (entry.get("scored") or {}).get(length) if isinstance(entry.get("scored"), dict) else None
    return scored.get("windows") if isinstance(scored, dict) else None


def _ci(table, length: str):
    ci = table.get(length) if isinstance(table, dict) else None
    return (ci[0], ci[1]) if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)


def flatten(row: dict, study: str | None = None) -> list[dict]:
    """The lines of one row (see the module docstring). ``study``: the study whose folder the row was read from
    (a row that records its study says it itself)."""
    cfg = row.get("config") or {}
    suite = (cfg.get("eval") or {}).get("suite") or {}
    c = native_ctx(row)
    params = row.get("method_params")
    base = {"run_id": row.get("run_id"), "status": row.get("status"), "converged": converged(row),
            "study": study_of(row) or study, "suite": row.get("eval"),
            "model": row.get("model"), "method": row.get("method"), "row": method_key(row),
            "method_params": json.dumps(params, sort_keys=True, default=str) if isinstance(params, dict) else None,
            "data": row.get("data"),
            "train": row.get("train"), "seed": training_seed(row), "eval_seed": cfg.get("seed"), "native_ctx": c,
            "config_hash": row.get("config_hash"), "git_sha": row.get("git_sha"), "time_end": row.get("time_end")}
    out = []
    for key, entry in (row.get("metrics") or {}).items():
        if not isinstance(entry, dict):
            continue
        evaluator = (suite.get(key) or {}).get("name") or key
        axis = str(entry.get("axis") or "length")
        first = True
        for metric, v in entry.items():
            series = []
            if _by_length(v):
                series = [(metric, None, v, entry.get("ci") if first else None)]
                first = False
            elif isinstance(v, dict) and v and not any(str(k).isdigit() for k in v) and all(
                    _by_length(x) for x in v.values()):  # per task (not NIAH's length -> depth grid)
                series = [(f"{metric}.{t}", t, s, (entry.get("task_ci") or {}).get(t)) for t, s in v.items()]
            for name, task, s, ci in series:
                for x, value in s.items():
                    lo, hi = _ci(ci, x)
                    out.append(_line(base, key, evaluator, name, axis, int(x), value, lo, hi, _n(entry, x, task), c))
        if first and isinstance(entry.get("tasks"), dict) and isinstance(entry.get("n"), dict):  # one budget
            budget = entry.get("max_length")
            budget = int(budget) if isinstance(budget, int) else None
            scores = {f"tasks.{t}": (v, entry["n"].get(t)) for t, v in entry["tasks"].items() if _num(v)}
            if _num(entry.get("average")):
                scores["average"] = (entry["average"], None)
            for name, (value, n) in scores.items():
                out.append(_line(base, key, evaluator, name, "length", budget, value, None, None, n, c))
        if evaluator in EFFECTIVE and c:
            out += _effective(base, key, evaluator, entry, c)
    return out


# the evaluators whose rows get RULER's effective length (``controlled_study.estimates.effective_length``), and the
# 0..100 scale their headline metric is read on
EFFECTIVE = {"ruler": ("average", 1.0), "niah": ("score", 100.0)}


def _effective(base: dict, key: str, evaluator: str, entry: dict, c: int) -> list[dict]:
    """RULER's effective length of this row's entry at RULER's bar (85.6; ``estimates.RULER_THRESHOLD``): the
    longest length up to which every evaluated length scores at least the bar: one line, metric
    ``effective_length@85.6`` (``effective_length_at_least@85.6`` when every length passes: the longest tested is a
    floor), ``x`` = ``length`` = ``value`` = that length in tokens (empty when even the shortest fails)."""
    metric, scale = EFFECTIVE[evaluator]
    s = entry.get(metric)
    if not _by_length(s):
        return []
    best, passed_all = None, True
    for L in sorted(s, key=int):
        if scale * float(s[L]) < RULER_THRESHOLD:
            passed_all = False
            break
        best = int(L)
    name = ("effective_length_at_least" if passed_all else "effective_length") + f"@{RULER_THRESHOLD:g}"
    return [_line(base, key, evaluator, name, "length", best, best, None, None, None, c)]


# the data dictionary's types (docs/export.md), as pandas' nullable dtypes: an integer column with a missing value
# stays an integer column (pandas would make it float)
TYPES = {**{k: "string" for k in ("run_id", "status", "study", "suite", "model", "method", "row", "method_params",
                                  "data", "train", "seed", "entry", "evaluator", "metric", "axis", "config_hash",
                                  "git_sha", "time_end")},
         **{k: "Int64" for k in ("eval_seed", "native_ctx", "x", "length", "n")},
         **{k: "Float64" for k in ("length_over_c", "value", "ci_low", "ci_high")},
         "converged": "boolean"}


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _line(base, key, evaluator, metric, axis, x, value, lo, hi, n, c) -> dict:
    length = x if axis == "length" else None
    return {**base, "entry": key, "evaluator": evaluator, "metric": metric, "axis": axis, "x": x, "length": length,
            "length_over_c": round(length / c, 4) if c and length else None, "value": value, "ci_low": lo,
            "ci_high": hi, "n": n}


def frame(results_dir: str | Path):
    """Every line of every row: the rows of no study, then each study's (``harness.results.studies``)."""
    import pandas as pd

    lines = [line for study in [None, *studies(results_dir)] for row in read_rows(results_dir, study)
             for line in flatten(row, study)]
    return pd.DataFrame(lines, columns=list(COLUMNS)).astype(TYPES)


def write(results_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """``results.csv`` and ``results.parquet`` under ``out_dir`` (default ``<results_dir>/export``)."""
    df = frame(results_dir)
    out = Path(out_dir) if out_dir else Path(results_dir) / "export"
    csv, parquet = out / "results.csv", out / "results.parquet"
    atomic_write(csv, lambda f: f.write(df.to_csv(index=False).encode("utf-8")))
    atomic_write(parquet, lambda f: df.to_parquet(f, index=False))
    return [csv, parquet]
