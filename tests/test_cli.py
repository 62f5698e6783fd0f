"""The ``harness`` console command (harness/cli.py, ``[project.scripts]``): every tool it names exists, and it runs
them as their own ``__main__`` with their own exit codes."""
from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from harness import cli
from tests import forkrun

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_is_declared_and_every_tool_exists():
    """The installed distribution's entry point (make setup reinstalls when pyproject.toml changes)."""
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "harness"]
    assert ep.value == "harness.cli:main" and ep.load() is cli.main
    for tool, (target, what) in cli.TOOLS.items():   # every one a module of the package, none a checkout script
        assert what and target.startswith("-m harness."), tool
        assert (ROOT / (target[3:].replace(".", "/") + ".py")).is_file(), tool


def test_unknown_tool_is_one_line_and_exit_2(capsys):
    assert cli.main(["nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown tool 'nosuch'" in err[0] and "tables" in err[0]
    assert cli.main([]) == 2 and "usage: harness" in capsys.readouterr().out


def test_a_tool_runs_as_its_own_main(tmp_path, capsys):
    """`harness status <dir>` is `python -m harness.status <dir>`: an empty results dir lists nothing, exit 0."""
    (tmp_path / "runs").mkdir()
    assert cli.main(["status", str(tmp_path)]) == 0
    assert cli.main(["status", "--no-such-flag"]) == 2  # argparse's own exit code comes back


def test_the_study_tools_are_the_installed_packages_code(tmp_path, capsys):
    """`harness tables | findings | export` are controlled_study's functions, registered under the entry-point group
    ``harness.tools`` (the library's command imports nothing of the study): every one loads, its script in the
    checkout is a thin front for the same function, and the command returns the function's exit code."""
    import controlled_study.tools as study_tools

    installed = cli.installed_tools()
    study = {"study", "tables", "findings", "export"}
    library = {"run", "plan", "submit", "build-data", "gguf-to-hf", "prepare-eval", "prepare-cluster"}
    assert set(installed) == study | library   # every tool but the -m modules
    for name, ep in installed.items():
        assert ep.value.startswith("controlled_study." if name in study else "harness.app:" if name == "run"
                                   else "harness.tools."), name
        assert callable(ep.load()) and ep.load().__doc__, name   # its first docstring line is the usage line
    for name in library - {"run"}:   # the checkout's script is a thin front for the same function
        module = installed[name].value.split(":")[0]
        script = ROOT / "scripts" / (module.rsplit(".", 1)[1] + ".py")
        assert f"from {module} import main" in script.read_text(), name
    for name, script in (("tables", "make_tables.py"), ("findings", "make_findings.py"), ("export", "export_rows.py")):
        assert installed[name].load() is getattr(study_tools, name)
        assert f"from controlled_study.tools import {name} as main" in (ROOT / "scripts" / script).read_text()
    assert "from controlled_study.study import main" in (ROOT / "scripts" / "study.py").read_text()
    assert "from harness.app import cli" in (ROOT / "run.py").read_text()   # run.py: the library app's front
    assert installed["run"].load() is __import__("harness.app", fromlist=["cli"]).cli
    assert "tables" in cli.usage() and "findings" in cli.usage()
    (tmp_path / "runs").mkdir()
    assert cli.main(["findings", "--results", str(tmp_path)]) == 0   # no rows: no study, exit 0
    assert "make findings: 0 set(s) of rows" in capsys.readouterr().out
    assert cli.main(["findings", "--no-such-flag"]) == 2   # argparse's own exit code comes back


@pytest.mark.integration
def test_harness_run_is_the_installed_app(tmp_path):
    """`harness run` calls the installed library's app (``harness.app:cli``, no checkout script run by path):
    it composes the same config as ``python run.py`` (the study's points on the search path through the
    ``harness.conf`` entry point) and names the job ``run``."""
    import sys

    args = ["experiment=tiny_study", "point=tiny_study/ntk_64k_2b", "--cfg", "all"]
    via_cli = forkrun.run([sys.executable, "-m", "harness.cli", "run", *args], capture_output=True, text=True,
                             cwd=tmp_path, timeout=300)
    via_script = forkrun.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True,
                                cwd=tmp_path, timeout=300)
    assert via_cli.returncode == 0 and via_script.returncode == 0, via_cli.stderr[-2000:] + via_script.stderr[-2000:]
    def strip(out):   # all but the lines of this process's time and place
        return [ln for ln in out.splitlines() if "${now:" not in ln and "cwd:" not in ln and "output_dir:" not in ln]

    assert strip(via_cli.stdout) == strip(via_script.stdout)
    assert "\n    name: run\n" in via_cli.stdout                   # the job's name (run.log), as run.py names it
    assert "\n      point: tiny_study/ntk_64k_2b\n" in via_cli.stdout  # the study's point (the 2B-token variant)
    assert "\nmethod:\n  name: ntk_64k\n" in via_cli.stdout


# what an environment with only the library installed sees: the study's package cannot be imported, and no entry
# point of it exists (put on PYTHONPATH as sitecustomize, it runs before anything imports)
LIBRARY_ONLY = """
import importlib.metadata as md
import sys


class _NoStudy:
    def find_spec(self, name, path=None, target=None):
        if name == "controlled_study" or name.startswith("controlled_study."):
            raise ModuleNotFoundError(f"No module named {name!r} (only the library is installed)")
        return None


sys.meta_path.insert(0, _NoStudy())
_all = md.entry_points


def entry_points(**kw):
    return md.EntryPoints(e for e in _all(**kw) if not e.value.startswith("controlled_study"))


md.entry_points = entry_points
"""


@pytest.mark.integration
def test_the_run_app_and_a_slurm_job_need_only_the_library(tmp_path):
    """With the study uninstalled (its package unimportable, its entry points gone), `harness run` runs a frozen
    tiny_llama through its suite and writes an ok row, and a Slurm job's app (``submit.run_app``) is the library's
    ``harness.app.cli``: the run app lives in the library; the study only adds configs and wandb's table lines."""
    import os
    import subprocess
    import sys

    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(LIBRARY_ONLY)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shim"), "HARNESS_RESULTS_DIR": str(tmp_path / "results"),
           "HARNESS_OUTPUT_DIR": str(tmp_path / "out"), "HF_HUB_OFFLINE": "1"}
    probe = subprocess.run([sys.executable, "-c", "import harness.submit as s, harness.conf_utils as c; "
                            "print(s.run_app().__module__, c.installed_table_lines(), len(c.installed_conf_dirs()))"
                            "; import controlled_study"], capture_output=True, text=True, env=env, timeout=120)
    assert probe.stdout.split() == ["harness.app", "None", "0"], probe.stdout + probe.stderr[-2000:]
    assert "only the library is installed" in probe.stderr  # the shim hides the study
    run = forkrun.run([sys.executable, "-m", "harness.cli", "run", "method=base", "train=none", "eval=quick",
                          "eval.lengths=[512]", "eval.suite.ppl_books.samples=1", "eval.suite.passkey.samples=1"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = [json.loads(p.read_text()) for p in (tmp_path / "results" / "runs").glob("*.json")]
    assert row["status"] == "ok" and set(row["metrics"]) == {"ppl_books", "passkey"}


def test_a_submitted_point_runs_the_installed_app(tmp_path, monkeypatch):
    """A Slurm job (``harness.submit.Point``) calls the same installed app as ``harness run``: the entry point's
    function, with the point's overrides and its run directory; a non-zero exit code ends the job with it."""
    from harness import app, submit

    assert submit.run_app() is app.cli
    calls = []
    monkeypatch.setattr(app, "cli", lambda argv: calls.append(argv) or 3)   # what the job hands the app
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        submit.Point(["experiment=paper_llama2", "point=paper_llama2/pi"], tmp_path / "0_pi", tmp_path)()
    assert e.value.code == 3
    assert calls == [["experiment=paper_llama2", "point=paper_llama2/pi", f"hydra.run.dir={tmp_path / '0_pi'}"]]
