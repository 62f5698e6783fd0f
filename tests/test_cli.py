"""The ``harness`` console command (harness/cli.py, ``[project.scripts]``): every tool it names exists, and it runs
them as their own ``__main__`` with their own exit codes."""
from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

from harness import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_is_declared_and_every_tool_exists():
    """The installed distribution's entry point (make setup reinstalls when pyproject.toml changes)."""
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "harness"]
    assert ep.value == "harness.cli:main" and ep.load() is cli.main
    for tool, (target, what) in cli.TOOLS.items():
        assert what, tool
        if target.startswith("-m "):
            assert (ROOT / (target[3:].replace(".", "/") + ".py")).is_file(), tool
        else:
            assert (ROOT / target).is_file() and "__main__" in (ROOT / target).read_text(), tool


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
    library = {"plan", "submit", "build-data", "gguf-to-hf", "prepare-eval", "prepare-cluster"}
    assert set(installed) == study | library   # every tool but run.py (the Hydra app) and the -m modules
    for name, ep in installed.items():
        assert ep.value.startswith("controlled_study." if name in study else "harness.tools."), name
        assert callable(ep.load()) and ep.load().__doc__, name   # its first docstring line is the usage line
    for name in library:   # the checkout's script is a thin front for the same function
        module = installed[name].value.split(":")[0]
        script = ROOT / "scripts" / (module.rsplit(".", 1)[1] + ".py")
        assert f"from {module} import main" in script.read_text(), name
    for name, script in (("tables", "make_tables.py"), ("findings", "make_findings.py"), ("export", "export_rows.py")):
        assert installed[name].load() is getattr(study_tools, name)
        assert f"from controlled_study.tools import {name} as main" in (ROOT / "scripts" / script).read_text()
    assert "from controlled_study.study import main" in (ROOT / "scripts" / "study.py").read_text()
    assert "tables" in cli.usage() and "findings" in cli.usage()
    (tmp_path / "runs").mkdir()
    assert cli.main(["findings", "--results", str(tmp_path)]) == 0   # no rows: no study, exit 0
    assert "make findings: 0 set(s) of rows" in capsys.readouterr().out
    assert cli.main(["findings", "--no-such-flag"]) == 2   # argparse's own exit code comes back
