"""Data is not code (issue 46): names from rows and settings never become paths, generated scripts quote
everything, non-finite numbers are failures, reading a results folder is bounded, and the config hash is what decides
the result."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import safe
from harness.evals import Spec
from harness.results import read_rows, read_rows_in
from tests import forkrun
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
           "config_hash": None, "git_sha": None, "command": "", "versions": {}, "hardware": {}, "run_dir": ""}
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
    from controlled_study import build_all

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
    from controlled_study.render import Table, write

    with pytest.raises(safe.UnsafeName):
        write(Table(id="../escaped", title="t", header=["a"]), tmp_path / "tables")
    assert not (tmp_path / "escaped.md").exists()


@pytest.mark.integration
def test_hydra_run_dir_is_refused_before_it_is_created(tmp_path):
    """``model.name=../../<elsewhere>/ESCAPED`` was refused by the run, but Hydra had created its run directory
    outside the outputs folder first; the run directory's resolver refuses the name before Hydra makes it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_OUTPUT_DIR": str(tmp_path / "out" / "deep"),
           "HARNESS_RESULTS_DIR": str(tmp_path / "res")}
    p = forkrun.run([sys.executable, str(ROOT / "run.py"), "method=base", "train=none", "eval=quick",
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


# ------------------------------------------------------------------------------------------ 2. shell text quoted
FAKE_SRUN = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["SRUN_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


@pytest.mark.integration
def test_rendered_sbatch_runs_no_shell_text_from_a_setting(tmp_path):
    """The security case of issue 46: ``paths.output_dir='/x/sb out $(touch /x/PWNED)'`` rendered a script that ran
    the ``touch`` (``RUN_DIR=`` unquoted), and ``python run.py $OVERRIDES`` split an override with spaces. Rendered
    and run under a fake ``srun`` that records its argv: nothing runs, each override is one argument."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from tests.conftest import load_file_module

    render_sbatch = load_file_module(ROOT / "scripts" / "render_sbatch.py", "render_sbatch_safety")
    x = tmp_path / "x"
    x.mkdir()
    out_dir = f"{x}/sb out $(touch {x}/PWNED1) `touch {x}/PWNED2` \"q\" it's"
    overrides = ["experiment=tiny_study", "point=tiny_study/base",
                 "paths.output_dir='" + out_dir.replace("'", "\\'") + "'",
                 f"+model.note='my model dir; touch {x}/PWNED3'"]
    text = render_sbatch.render(overrides)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", "#!/bin/sh\necho node0\n")):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "srun.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SRUN_LOG": str(log),
           "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "7", "SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "node0",
           "SLURM_CPUS_PER_TASK": "4", "HARNESS_CKPT_DIR": str(tmp_path / "ck")}
    p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert not list(x.glob("PWNED*")) and not list(tmp_path.glob("PWNED*")), "a setting ran as shell text"
    argv = json.loads(log.read_text().splitlines()[0])
    run_args = argv[argv.index("run.py") + 1:]
    assert sorted(run_args[:-1]) == sorted(overrides), run_args  # each override one argument, unchanged
    parsed = OverridesParser.create().parse_overrides(run_args)
    assert parsed[-1].key_or_group == "hydra.run.dir" and parsed[-1].value() == f"{out_dir}/slurm/tiny_study/7_0"
    assert next(o.value() for o in parsed if o.key_or_group == "paths.output_dir") == out_dir
    # the #SBATCH line holds the value as one double-quoted word of Slurm's parser
    line = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --output="))
    assert line.startswith('#SBATCH --output="') and line.endswith('/%A_%a.out"')


def test_a_value_no_script_line_can_carry_is_refused_at_render_time(tmp_path, capsys):
    from tests.conftest import load_file_module

    render_sbatch = load_file_module(ROOT / "scripts" / "render_sbatch.py", "render_sbatch_safety2")
    with pytest.raises(SystemExit) as e:
        render_sbatch.main(["experiment=tiny_study", "point=tiny_study/base", "paths.output_dir='/x/a\nb'",
                            "--out", str(tmp_path / "x.sbatch")])
    assert "\n" not in str(e.value) and "override" in str(e.value) and "'\\n'" in str(e.value)
    assert not (tmp_path / "x.sbatch").exists()
    with pytest.raises(safe.UnsafeName):
        safe.sbatch_value("a\nb")
    assert safe.sbatch_value('a "b" \\c') == '"a \\"b\\" \\\\c"'


# ------------------------------------------------------------------------------------------ 3. non-finite = failure
@dataclasses.dataclass
class _NoSettings:
    """A stub evaluator's typed settings: none."""


class _Stub:
    """An evaluator that returns (or raises) what it is given."""

    version = 1
    args = _NoSettings()
    spec = Spec(metric="accuracy")

    def __init__(self, out):
        self.out = out

    def run(self, handle, method, ctx):
        if isinstance(self.out, BaseException):
            raise self.out
        return self.out


@pytest.mark.parametrize("out, words", [({"ppl": {"256": float("nan")}, "documents": 1}, "ppl.256 = nan"),
                                        ({"accuracy": {"256": float("inf")}}, "accuracy.256 = inf"),
                                        (OverflowError("math range error"), "overflowed (math range error")])
def test_a_non_finite_metric_or_an_overflow_fails_the_entry_by_name(tmp_path, out, words):
    from omegaconf import OmegaConf

    from harness.models import ModelHandle
    from harness.pipeline import Suite, evaluations

    cfg = OmegaConf.create({"seed": 0, "eval_world_size": 1, "autocast": "float32", "eval_batch_tokens": 0})
    handle = ModelHandle(None, None, "x", 32)
    suite = Suite({"ok": {}, "bad": {}}, [_Stub({"accuracy": {"256": 0.5}}), _Stub(out)])
    got = []
    with pytest.raises(safe.NonFinite, match=r"eval\.suite\.bad: .*" + words.replace("(", r"\(").replace(".", r"\.")):
        for key, *_ in evaluations(cfg, handle, None, tmp_path, suite):
            got.append(key)
    assert got == ["ok"]  # what came before is still yielded (recorded)


@pytest.mark.integration
def test_the_last_update_of_a_diverging_run_is_caught_in_the_weights(tmp_path):
    """The last update of a diverging run: its loss is finite (read before the update) but its gradient is not
    (lr=1e9 on run.py's tiny_llama: 2 steps with losses 8.3 and finite, NaN weights after, and an ``ok`` row with a
    NaN perplexity). Here a hook makes the one step's gradient NaN; ``pipeline.finetune`` checks the weights."""
    import numpy as np

    from harness.methods import build_method
    from harness.models import ModelHandle
    from harness.train import TrainArgs
    from harness.train.loop import finetune
    from harness.train.step import check_finite_weights
    from tests.conftest import random_llama

    model = random_llama(vocab=64, hidden=32, layers=1, heads=2, ctx=32)
    model.lm_head.weight.register_hook(lambda g: g * float("nan"))
    chunks = np.random.default_rng(0).integers(0, 64, size=(4, 16))
    a = TrainArgs(name="t", enabled=True, seq_len=16, tokens=16 * 2, global_batch=2, autocast="float32", ema=False)
    finetune(ModelHandle(model, None, "x", 32), build_method({"name": "base"}), chunks, a, tmp_path, "fp")
    with pytest.raises(safe.NonFinite, match=r"fine-tuning: non-finite weights in \w"):
        check_finite_weights(model, "fine-tuning")


def test_an_old_rows_non_finite_metric_is_read_as_missing_with_a_warning(tmp_path, capsys):
    """A NaN row silently replaced the base's values in 10 tables; now its non-finite numbers are missing."""
    from controlled_study import build_all

    nan_row = _row("r9", "base", time_end="2027-01-01T00:00:00")
    nan_row["metrics"]["passkey"]["accuracy"]["1024"] = float("nan")
    _write_rows(tmp_path, {"r0.json": _row("r0"), "r1.json": _row("r1", "pi"), "nan.json": nan_row})
    rows = read_rows_in(tmp_path / "runs")
    err = capsys.readouterr().err
    assert "nan.json: non-finite metrics.passkey.accuracy.1024 = nan read as missing" in err
    assert [r["metrics"]["passkey"]["accuracy"]["1024"] for r in rows if r["run_id"] == "r9"] == [None]
    build_all(tmp_path, figures=False)
    assert not any("NaN" in p.read_text() for p in (tmp_path / "tables").glob("*.md"))


def test_a_ppl_that_overflows_is_no_interval():
    from harness import stats

    assert stats.ppl_interval([1000.0, 1001.0, 1002.0]) is None
    assert stats.ppl_ratio([1000.0, 1001.0, 1002.0], [0.0, 0.0, 0.0]) is None
    assert stats.ppl_interval([1.0, 1.1, 1.2])[0] == pytest.approx(3.004, rel=1e-3)


# ------------------------------------------------------------------------------------------ 4. methods' needs
def _gpt2_folder(tmp_path) -> Path:
    """A GPT-2 checkpoint folder without weights: its config and a tokenizer file (the check must come first)."""
    from transformers import GPT2Config

    d = tmp_path / "gpt2"
    GPT2Config(n_positions=256, n_embd=32, n_layer=1, n_head=2, vocab_size=64, bos_token_id=0,
               eos_token_id=0).save_pretrained(d)
    (d / "tokenizer.json").write_text("{}")
    return d


@pytest.mark.parametrize("method", ["pi", "yarn", "self_extend", "longlora"])
def test_a_rope_method_refuses_a_model_without_rope_before_loading(tmp_path, method):
    """``model=hub`` on a GPT-2 folder with ``method=pi`` gave an ``ok`` row identical to the base (yarn with
    training: an IndexError); the folder here has no weights, so only a check before loading can answer."""
    from harness import pipeline
    from harness.conf_utils import compose
    from harness.config import ConfigError

    d = _gpt2_folder(tmp_path)
    cfg = compose(["model=hub", f"model.path={d}", f"method={method}", "train=none", "eval=quick",
                   "eval.lengths=[256]"])
    assert cfg.model.native_ctx == 256
    with pytest.raises(ConfigError, match=rf"method={method}: the model \(gpt2\) has no rotary position embeddings"):
        pipeline.setup(cfg, data=False)
    pipeline.setup(compose(["model=hub", f"model.path={d}", "method=base", "train=none", "eval=quick",
                            "eval.lengths=[256]"]), data=False)  # the base runs any model


def test_a_blockwise_method_refuses_a_rope_type_it_cannot_keep(tmp_path):
    from transformers import LlamaConfig

    from harness.config import ConfigError
    from harness.methods import build_method

    cfg = LlamaConfig(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                       "original_max_position_embeddings": 64})
    with pytest.raises(ConfigError, match="method=self_extend: the model's rope type is 'yarn'"):
        build_method({"name": "self_extend"}).check_model(cfg, 512)
    build_method({"name": "pi"}).check_model(cfg, 512)  # a RoPE method replaces it


def test_a_one_token_window_is_refused():
    from harness import pipeline
    from harness.conf_utils import compose
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match=r"native window C = 1 tokens is below the 16"):
        pipeline.setup(compose(["method=base", "train=none", "eval=quick", "model.native_ctx=1"]), data=False)


# ------------------------------------------------------------------------------------------ 5. study points locked
def test_two_studies_share_the_points_through_a_lock_per_point(tmp_path):
    """Two ``make study`` at once ran the same point twice; now the first to claim a point holds its lock, the other
    skips it, and a point finished since the plan is not run again."""

    from controlled_study import study
    job = {"hash": "00aa11bb22cc33dd", "label": "point=x"}
    first, why = study.claim(str(tmp_path), job)
    assert first is not None and why is None
    second, why = study.claim(str(tmp_path), job)  # another process's claim (its own lock file handle)
    assert second is None and "another make study" in why
    first.release()
    cfg = {"model": {"name": "tiny_llama"}, "seed": 7}
    from harness.results import config_hash

    job = {"hash": config_hash(cfg), "label": "point=y"}
    _write_rows(tmp_path, {"r.json": _row("r", config=cfg, config_hash="hand-edited")})
    again, why = study.claim(str(tmp_path), job)
    assert again is None and why == "done since the plan (row r)"


# ------------------------------------------------------------------------------------------ 6. bounded reading
def _fifo(p: Path) -> None:
    os.mkfifo(p)


@pytest.mark.parametrize("name, make, why", [
    ("fifo.json", _fifo, "a FIFO, not a regular file"),
    ("zero.json", lambda p: p.symlink_to("/dev/zero"), "a symlink to /dev/zero, outside"),
    ("dir.json", lambda p: p.mkdir(), "a directory, not a regular file"),
    ("deep.json", lambda p: p.write_text("[" * 100000 + "]" * 100000), "nested deeper than 64 levels"),
    ("deep2.json", lambda p: p.write_text(json.dumps({**_row("d"), "metrics": json.loads("[" * 70 + "]" * 70)})),
     "nested deeper than 64 levels"),
    ("types.json", lambda p: p.write_text(json.dumps({**_row("t"), "metrics": [1, 2]})), "metrics is a list"),
    ("unhashable.json", lambda p: p.write_text(json.dumps({**_row("u"), "method": ["pi"]})), "method is a list"),
    ("status.json", lambda p: p.write_text(json.dumps({**_row("s"), "status": "weird"})), "status 'weird'"),
    ("big.json", lambda p: p.write_bytes(b" " * (64 << 20) + b"{}"), "over the 67108864-byte limit"),
])
def test_a_results_folder_is_read_within_bounds(tmp_path, capsys, name, make, why):
    """A FIFO hung make status / tables / export; a /dev/zero symlink took the memory; deep nesting was a
    RecursionError in every report; wrong types crashed the tables. Each is skipped with one warning naming it."""
    from controlled_study.export import flatten

    runs = _write_rows(tmp_path, {"r0.json": _row("r0")})
    make(runs / name)
    rows = read_rows(tmp_path)
    assert [r["run_id"] for r in rows] == ["r0"]
    err = capsys.readouterr().err
    assert f"warning: skipping {runs / name}: " in err and why in err, err
    assert [line for r in rows for line in flatten(r)]  # the export reads the same rows


def test_status_skips_a_malformed_job_record_with_a_warning(tmp_path, capsys):
    from harness import status

    _write_rows(tmp_path, {"r0.json": _row("r0")})
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "bad.json").write_text(json.dumps({"points": [{"job_id": ["x"]}], "sweep": "s"}))
    (jobs / "list.json").write_text("[1, 2]")
    os.mkfifo(jobs / "fifo.json")
    assert status.main([str(tmp_path), "--all"]) == 0
    err = capsys.readouterr().err
    for n in ("bad.json", "list.json", "fifo.json"):
        assert f"warning: skipping {jobs / n}" in err


def test_sample_counts_have_an_upper_bound_checked_before_work_starts():
    from harness import pipeline
    from harness.conf_utils import compose
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match=r"eval\.suite\.passkey\.samples = 1000000000 is above the bound of 100000"):
        pipeline.setup(compose(["method=base", "train=none", "eval=quick", "eval.suite.passkey.samples=1000000000"]),
                       data=False)


def _snapshot(d: Path) -> dict:
    """File name -> bytes (a PDF's: its name only, matplotlib writes its creation time into it)."""
    return {p.name: b"" if p.suffix == ".pdf" else p.read_bytes() for p in sorted(d.iterdir())} if d.is_dir() else {}


@pytest.mark.slow  # ~14 s idle: a tool's atomic writes under SIGTERM (make tables), not a run's path
def test_sigterm_during_make_tables_leaves_the_old_files_or_the_new_ones(tmp_path):
    """SIGTERM during make tables left hidden .tmp files and a tables folder mixing old and new files."""
    import signal
    import time

    res = tmp_path / "res"
    _write_rows(res, {f"r{i}.json": _row(f"r{i}", m) for i, m in enumerate(("base", "pi"))})
    cmd = [sys.executable, str(ROOT / "scripts" / "make_tables.py"), "--results", str(res)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    forkrun.run(cmd + ["--no-figures"], env=env, check=True, capture_output=True, timeout=300)
    old = (_snapshot(res / "tables"), _snapshot(res / "figures"), (res / "README.md").read_bytes())
    _write_rows(res, {f"r{i}.json": _row(f"r{i}", m) for i, m in enumerate(("yarn", "ntk_dynamic", "clex"), 2)})
    seen = set()
    for delay in (0.5, 2.0, 4.0, 8.0):
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=300)
        now = (_snapshot(res / "tables"), _snapshot(res / "figures"), (res / "README.md").read_bytes())
        hidden = [q.name for q in res.iterdir() if q.name.startswith(".")]
        hidden += [q.name for d in ("tables", "figures") if (res / d).is_dir() for q in (res / d).iterdir()
                   if q.name.startswith(".")]
        assert not hidden, hidden
        if now == old:
            seen.add("old")
            continue
        forkrun.run(cmd, env=env, check=True, capture_output=True, timeout=300)
        new = (_snapshot(res / "tables"), _snapshot(res / "figures"), (res / "README.md").read_bytes())
        assert now == new, "a mix of old and new files"
        seen.add("new")
        break
    assert "old" in seen  # at least one SIGTERM landed mid-build


def test_a_run_id_from_a_file_never_becomes_a_path(tmp_path, capsys):
    """A requeued job reads its run id back from ``<run_dir>/run.json``: a tampered one must not name the row file."""
    from harness import lifecycle
    from harness.results import row_path

    (tmp_path / "run.json").write_text(json.dumps({"run_id": "../../../escaped"}))
    assert lifecycle._previous_run_id(tmp_path / "run.json") is None
    assert "is not a safe name; this run gets a new run id" in capsys.readouterr().err
    with pytest.raises(safe.UnsafeName):
        row_path(tmp_path, "../x")
