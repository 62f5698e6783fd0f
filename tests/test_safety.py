"""Data is not code (issue 46): names from rows and settings never become paths, generated scripts quote
everything, non-finite numbers are failures, reading a results folder is bounded, and the config hash is what decides
the result."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import safe
from harness.results import read_rows, read_rows_in
from tests.conftest import ROOT


def _row(run_id: str, method: str = "base", model: str = "tiny_llama", **extra) -> dict:
    """A finished tiny_llama row with one passkey accuracy (enough for the tables)."""
    row = {"schema": 1, "run_id": run_id, "status": "ok", "error": None, "time_start": "2026-01-01T00:00:00",
           "time_end": "2026-01-01T00:01:00", "model": model, "method": method, "data": "local_mix",
           "train": "none" if method == "base" else "tiny", "eval": "tiny", "method_params": {},
           "train_info": None if method == "base" else {"tokens_seen": 1000},
           "metrics": {"passkey": {"accuracy": {"1024": 0.5, "2048": 0.25}, "n": {"1024": 8, "2048": 8}}},
           "timings": {}, "config": {"model": {"name": model, "native_ctx": 512},
                                     "train": {"enabled": method != "base", "seq_len": 2048}},
           "config_hash": run_id, "git_sha": None, "command": "", "versions": {}, "hardware": {}, "run_dir": ""}
    row.update(extra)
    return row


def _write_rows(d: Path, rows: dict) -> Path:
    runs = d / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for name, row in rows.items():
        (runs / name).write_text(row if isinstance(row, str) else json.dumps(row))
    return runs


def _files(d: Path) -> set:
    return {p for p in d.rglob("*")}


# ------------------------------------------------------------------------------------------ 1. names are not paths
@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "-rf", "x" * 200, "a\nb", "/abs", "..", None, 3])
def test_unsafe_names_are_refused(name):
    with pytest.raises(safe.UnsafeName, match="not a safe name"):
        safe.check_name(name, "model.name")


@pytest.mark.parametrize("name", ["tiny_llama", "ntk_64k_2b", "org--Model-7B", "smollm2_135m", "table1_tiny_llama",
                                  "v1.5", "a+b"])
def test_safe_names_pass(name):
    assert safe.check_name(name, "x") == name


def test_inside_refuses_a_path_that_leaves_its_root(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    assert safe.inside(tmp_path / "root", "a.md") == tmp_path / "root" / "a.md"
    for part in ("../a.md", "/etc/passwd", "link/a.md"):
        with pytest.raises(safe.UnsafeName, match="outside"):
            safe.inside(tmp_path / "root", part)


def test_a_row_whose_model_is_a_path_writes_nothing_outside_the_results_dir(tmp_path, capsys):
    """The security case of issue 46: ``"model": "../../../../<tmp>/EVILMODEL"`` made make tables write EVILMODEL.md
    and .tex outside the results folder (file names built from the row's model name)."""
    from harness.tables import build_all

    res = tmp_path / "a" / "b" / "c" / "results"
    evil = "../" * 4 + "EVILMODEL"
    _write_rows(res, {"r0.json": _row("r0"), "r1.json": _row("r1", "pi"),
                      "evil.json": _row("r2", "pi", model=evil), "evil2.json": _row("r3", "base", model=evil)})
    before = _files(tmp_path) - _files(res)
    build_all(res, figures=False)
    after = _files(tmp_path) - _files(res)
    assert after == before, sorted(map(str, after - before))
    assert not list(tmp_path.rglob("*EVILMODEL*"))
    err = capsys.readouterr().err
    assert f"{res / 'runs' / 'evil.json'}" in err and "not a safe name" in err
    assert any(p.name.startswith("summary_passkey_tiny_llama") for p in (res / "tables").iterdir())


def test_table_and_figure_writers_refuse_a_name_that_leaves_their_folder(tmp_path):
    from harness.tables.render import Table, write

    with pytest.raises(safe.UnsafeName):
        write(Table(id="../escaped", title="t", header=["a"]), tmp_path / "tables")
    assert not (tmp_path / "escaped.md").exists()


@pytest.mark.integration
def test_hydra_run_dir_is_refused_before_it_is_created(tmp_path):
    """``model.name=../../<elsewhere>/ESCAPED`` was refused by the run, but Hydra had created its run directory
    outside the outputs folder first; the run directory's resolver refuses the name before Hydra makes it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_OUTPUT_DIR": str(tmp_path / "out" / "deep"),
           "HARNESS_RESULTS_DIR": str(tmp_path / "res")}
    p = subprocess.run([sys.executable, str(ROOT / "run.py"), "method=base", "train=none", "eval=quick",
                        "model.name=../../../ESCAPED"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2, p.stderr
    assert "model.name" in p.stderr.strip().splitlines()[-1] and "not a safe name" in p.stderr
    assert not list(tmp_path.rglob("*ESCAPED*"))
    assert [r["status"] for r in read_rows(tmp_path / "res")] == ["failed"]


def test_an_empty_environment_setting_counts_as_unset(monkeypatch):
    from harness.conf_utils import compose

    monkeypatch.setenv("HARNESS_RESULTS_DIR", "")
    monkeypatch.setenv("HARNESS_OUTPUT_DIR", "")
    cfg = compose([])
    assert cfg.paths.results_dir == "results" and cfg.paths.output_dir == "outputs"
    assert safe.env_setting("HARNESS_RESULTS_DIR", "results") == "results"
