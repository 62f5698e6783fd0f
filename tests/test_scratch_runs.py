"""The README's two commands in either order, and any sweep a user runs, change no committed number (issue 45).

On a copy of the committed results, rows of no study are written (``make run``'s two commands, read from the
Makefile, and a quick three-method sweep), then ``make tables`` and ``make findings`` run; the committed study's
tables, findings, front page, the index and the README's verdict sentence must be byte-identical afterwards.

- default tier (integration, tens of seconds): the rows are made in this process by the stages ``run.py`` calls
  (``lifecycle`` + ``pipeline``), at the harness's own small sizes (two lengths, 2 passkey prompts, 1 book, a
  few fine-tuning tokens); tables without figures.
- slow tier: the real commands as processes (``run.py`` from the Makefile's ``run`` recipe and ``run.py -m ...
  eval=quick``), then the real ``scripts/make_tables.py`` (figures included) and ``scripts/make_findings.py``.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests import forkrun
from tests.conftest import ROOT

STUDY = "tiny_study"
SMALL = ["eval.lengths=[128,256]", "eval.suite.passkey.samples=2", "eval.suite.ppl_books.samples=1",
         "eval.suite.ppl_books.lengths=[128]", "++train.seq_len=512", "++train.tokens=1024", "++train.global_batch=1",
         "++train.save_every=0", "++train.convergence_check=false"]
SWEEP = ["-m", "method=base,pi,yarn", "train=none", "eval=quick"]


def make_run_commands() -> list[list[str]]:
    """The overrides of each ``run.py`` line of the Makefile's ``run`` recipe (what ``make run`` runs)."""
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    cmds = [shlex.split(ln.split("run.py", 1)[1]) for ln in recipe.splitlines()[1:] if "run.py" in ln]
    assert len(cmds) == 2, recipe
    return cmds


def _copy_results(tmp: Path) -> Path:
    res = tmp / "results"
    shutil.copytree(ROOT / "results", res, ignore=shutil.ignore_patterns("archive", "runs", "tables", "figures",
                                                                         "findings.md", "export"))
    from harness.results import studies

    for name in studies(ROOT / "results"):  # every committed study (the index lists them all)
        shutil.copytree(ROOT / "results" / name, res / name, dirs_exist_ok=True)
    return res


def _snapshot(res: Path) -> dict:
    """The committed study's generated files and the index, by path."""
    files = [p for p in (res / STUDY).rglob("*") if p.is_file() and "runs" not in p.relative_to(res / STUDY).parts]
    return {p.relative_to(res): p.read_bytes() for p in files + [res / "README.md"]}


def _readme_sentence_holds(res: Path) -> None:
    md = (res / STUDY / "findings.md").read_text()
    raw, holm = re.search(r"Verdicts: ([^.]+)\. After Holm's correction over all \d+ tested parts: ([^.]+)\.",
                          md).groups()
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"(on the committed rows: {raw}; after Holm's correction over all parts: {holm})" in readme


def _in_process(overrides: list[str], tmp: Path) -> Path:
    """One run as ``run.py`` makes it (start the row, check, load + extend, fine-tune, evaluate, finish)."""
    from harness import lifecycle, pipeline
    from harness.conf_utils import compose

    cfg = compose(overrides)
    run = lifecycle.start(cfg, run_dir=tmp / "out" / f"run{len(list((tmp / 'out').glob('run*')))}")
    s = pipeline.setup(cfg)
    handle = pipeline.load_and_extend(cfg, s.method, s.train, suite=s.suite)
    run.record(model_info=handle.facts())
    info = pipeline.finetune(cfg, handle, s.method, s.train, run.row["run_dir"])
    run.record(train_info=info, method_params=s.method.params())
    pipeline.evaluate(cfg, handle, s.method, run, s.suite)
    assert run.finish() is None and run.row["status"] == "ok"
    return run.path


@pytest.mark.slow  # 35 s (the default tier's 20 minutes)
def test_make_run_and_a_quick_sweep_change_no_committed_number(tmp_path, monkeypatch):
    from controlled_study import build_studies
    from controlled_study.findings import write as write_findings
    from harness import sweeps

    res = _copy_results(tmp_path)
    (tmp_path / "out").mkdir()
    monkeypatch.setenv("HARNESS_RESULTS_DIR", str(res))
    monkeypatch.setenv("HARNESS_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("HARNESS_CKPT_DIR", str(tmp_path / "ckpt"))
    build_studies(res, figures=False)
    write_findings(res, study=STUDY)
    before = _snapshot(res)
    committed = {p: (ROOT / "results" / p).read_bytes() for p in before
                 if p.suffix == ".md" and p.name not in ("index.md",)}   # index.md lists figures (not drawn here)
    assert {p: before[p] for p in committed} == committed   # the copy rebuilt = the committed files
    written = [_in_process(ov + SMALL, tmp_path) for ov in make_run_commands()]
    written += [_in_process(ov + SMALL, tmp_path) for ov in sweeps.expand(SWEEP[1:])]
    assert len(written) == 5 and all(p.parent == res / "runs" for p in written)   # rows of no study
    build_studies(res, figures=False)
    write_findings(res, study=STUDY)
    write_findings(res, study=None)
    assert _snapshot(res) == before
    _readme_sentence_holds(res)
    assert (res / "tables" / "summary_passkey_tiny_llama.md").is_file()   # the rows' own view, apart


@pytest.mark.slow
def test_make_run_then_a_sweep_as_commands_change_no_committed_file(tmp_path):
    res = _copy_results(tmp_path)
    env = dict(os.environ, HARNESS_RESULTS_DIR=str(res), HARNESS_OUTPUT_DIR=str(tmp_path / "out"),
               HARNESS_CKPT_DIR=str(tmp_path / "ckpt"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")

    def py(*args, timeout=1800):
        r = forkrun.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]

    for ov in make_run_commands():   # make run, as the Makefile runs it
        py("run.py", *ov)
    py("run.py", *SWEEP)  # a researcher's quick look, as typed
    py("scripts/make_tables.py")
    py("scripts/make_findings.py")
    for p in _snapshot(res):
        assert (res / p).read_bytes() == (ROOT / "results" / p).read_bytes(), p
    _readme_sentence_holds(res)
    assert len(list((res / "runs").glob("*.json"))) == 5
