"""`make export`: every row as one flat table (CSV + Parquet), one line per run x entry x metric x length."""
from __future__ import annotations

import json
import sys

import pandas as pd

from controlled_study.export import COLUMNS, flatten
from harness import results
from tests import forkrun
from tests.conftest import ROOT


def _row(run_id: str, method: str, metrics: dict, status: str = "ok") -> dict:
    cfg = {"model": {"name": "tiny_llama", "native_ctx": 512}, "method": {"name": method}, "train": {"name": "none"},
           "eval": {"suite": {"pk": {"name": "passkey"}, "books": {"name": "ppl"}, "ruler": {"name": "ruler"},
                              "lb": {"name": "longbench"}, "trec": {"name": "manyshot_trec"}}}, "seed": 0}
    row = results.new_row(run_id, cfg, None, "/tmp/none")
    row.update(status=status, metrics=metrics, train="none")
    return row


METRICS = {
    "pk": {"accuracy": {"512": 0.9, "1024": 0.5}, "ci": {"512": [0.6, 0.98], "1024": [0.2, 0.8]},
           "correct": {"512": [1] * 9 + [0], "1024": [1, 0] * 5}, "samples_per_length": 10},
    "books": {"ppl": {"512": 30.5}, "ci": {"512": [28.0, 33.0]}, "scored": {"512": {"tokens": 4088, "windows": 8}}},
    "ruler": {"average": {"512": 15.0}, "tasks": {"niah_single_2": {"512": 15.0}},
              "task_ci": {"niah_single_2": {"512": [5.2, 36.0]}}, "per_sample": {"niah_single_2": {"512": [0.0] * 20}},
              "grid": {"512": {"0": 1.0, "50": 0.0}}},
    "lb": {"tasks": {"qasper": 20.5, "trec": 60.0}, "n": {"qasper": 200, "trec": 200}, "average": 40.25,
           "max_length": 4096},
    "trec": {"accuracy": {"1": 30.0, "10": 50.0}, "n": {"1": 100, "10": 100}, "axis": "shots"},
}


def test_a_row_flattens_to_one_line_per_metric_and_length():
    lines = {(d["entry"], d["metric"], d["x"]): d for d in flatten(_row("r1", "yarn", METRICS))}
    pk = lines[("pk", "accuracy", 1024)]
    assert (pk["value"], pk["ci_low"], pk["ci_high"], pk["n"], pk["length_over_c"]) == (0.5, 0.2, 0.8, 10, 2.0)
    assert lines[("books", "ppl", 512)]["n"] == 8 and lines[("books", "ppl", 512)]["ci_high"] == 33.0
    t = lines[("ruler", "tasks.niah_single_2", 512)]
    assert (t["ci_low"], t["n"]) == (5.2, 20)
    assert lines[("ruler", "average", 512)]["ci_low"] is None  # no interval in the row: none made up
    assert not any(k[1].startswith("grid") for k in lines)  # NIAH-style length -> depth grids are not series
    assert lines[("lb", "tasks.qasper", 4096)]["n"] == 200 and lines[("lb", "average", 4096)]["value"] == 40.25
    shots = lines[("trec", "accuracy", 10)]
    assert (shots["axis"], shots["length"], shots["value"]) == ("shots", None, 50.0)
    assert all(set(d) == set(COLUMNS) for d in lines.values())


def test_make_export_writes_csv_and_parquet_and_skips_stray_files(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for rid, m, st in (("r1", "yarn", "ok"), ("r2", "pi", "failed")):
        (runs / f"{rid}.json").write_text(json.dumps(_row(rid, m, METRICS, st)))
    (runs / "stray.json").write_text("[1, 2]")
    p = forkrun.run([sys.executable, "scripts/export_rows.py", "--results", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "stray.json" in p.stderr
    csv = pd.read_csv(tmp_path / "export" / "results.csv")
    pq = pd.read_parquet(tmp_path / "export" / "results.parquet")
    assert list(csv.columns) == list(COLUMNS) and len(csv) == len(pq) == 2 * len(flatten(_row("r", "m", METRICS)))
    assert set(pq["status"]) == {"ok", "failed"} and set(pq["method"]) == {"yarn", "pi"}


def test_the_data_dictionary_documents_every_column_in_order():
    """docs/export.md's table names exactly the export's columns, in order, each with a type and a meaning."""
    import re

    doc = (ROOT / "docs" / "export.md").read_text().split("## Columns", 1)[1]
    rows = [ln.split("|")[1:-1] for ln in doc.splitlines() if ln.startswith("| `")]
    assert [re.fullmatch(r"\s*`([a-z_]+)`\s*", r[0]).group(1) for r in rows] == list(COLUMNS)
    assert all(len(r) == 3 and r[1].strip() and len(r[2].strip()) > 10 for r in rows)


def test_columns_for_the_study_the_suite_and_the_method_parameters(tmp_path):
    """A study's rows (its folder; a row that records its study) and the rows of no study are all exported, each line
    saying its study, its suite and the method's parameters (JSON)."""
    from controlled_study.export import frame

    study_row = _row("s1", "yarn", METRICS)
    study_row["config"]["study"] = {"experiment": "my_study"}
    study_row.update(eval="tiny", method_params={"name": "yarn", "factor": 16.0})
    legacy = _row("s2", "pi", METRICS)   # no study recorded: its folder is its study
    loose = _row("l1", "base", METRICS)
    loose["eval"] = "quick"
    for folder, rows in ((tmp_path / "my_study" / "runs", (study_row, legacy)), (tmp_path / "runs", (loose,))):
        folder.mkdir(parents=True)
        for r in rows:
            (folder / f"{r['run_id']}.json").write_text(json.dumps(r))
    df = frame(tmp_path)
    by = df.groupby("run_id").first()
    assert by.loc["s1", "study"] == "my_study" and by.loc["s2", "study"] == "my_study"
    assert by.loc["l1", "study"] is None or pd.isna(by.loc["l1", "study"])
    assert (by.loc["s1", "suite"], by.loc["l1", "suite"]) == ("tiny", "quick")
    assert json.loads(by.loc["s1", "method_params"]) == {"factor": 16.0, "name": "yarn"}
    assert list(df.columns) == list(COLUMNS)


def test_the_parquet_columns_have_the_types_the_data_dictionary_states(tmp_path):
    """Each column of ``results.parquet`` has the Arrow type its row of docs/export.md names (integer columns with a
    missing value stayed integers: pandas made ``x``, ``length`` and ``n`` floats), and a RULER row carries RULER's
    effective length."""
    import re

    import pyarrow.parquet as pq

    from controlled_study import export

    doc = (ROOT / "docs" / "export.md").read_text().split("## Columns", 1)[1]
    stated = {re.fullmatch(r"\s*`([a-z_]+)`\s*", r[0]).group(1): r[1].strip() for r in
              (ln.split("|")[1:-1] for ln in doc.splitlines() if ln.startswith("| `"))}
    row = _row("r", "m", {**METRICS, "ruler": {"average": {"256": 90.0, "512": 87.0, "1024": 40.0}}})
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r.json").write_text(json.dumps(row))
    (path,) = [p for p in export.write(tmp_path) if p.suffix == ".parquet"]
    schema = pq.read_schema(path)
    arrow = {"integer": "int64", "float": "double", "bool": "bool", "string": "string"}
    for col, typ in stated.items():
        want = next(v for k, v in arrow.items() if typ.startswith(k) or typ.startswith(k.replace("ing", "")))
        assert str(schema.field(col).type) in (want, "large_string" if want == "string" else want), (col, typ)
    import pandas as pd

    df = pd.read_parquet(path)
    eff = df[df["metric"] == "effective_length@85.6"]
    assert list(eff["value"]) == [512] and list(eff["x"]) == [512] and list(eff["entry"]) == ["ruler"]
