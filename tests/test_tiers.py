"""The test tiers (``tests/conftest.py``): every test has exactly one of unit / integration / slow, the integration
list names tests that exist, and a unit test cannot start a process or run the fine-tuning loop."""
from __future__ import annotations

import ast
import multiprocessing
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import INTEGRATION, ROOT


def test_every_collected_test_has_exactly_one_tier(collected_tiers):
    """Over the whole collection (before ``-m`` deselects), so a test marked both slow and integration fails here."""
    assert collected_tiers
    assert {nodeid: names for nodeid, names in collected_tiers.items() if len(names) != 1} == {}


def test_every_integration_entry_names_a_test_module_or_function():
    """A renamed or deleted test leaves no stale entry behind (it would silently fall back to the unit tier)."""
    stale = []
    for entry in INTEGRATION:
        module, _, name = entry.partition("::")
        path = ROOT / "tests" / module
        if not path.exists():
            stale.append(entry)
        elif name and name not in {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}:
            stale.append(entry)
    assert stale == []


def test_a_unit_test_cannot_start_a_process(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"test_tiers\.py::.*a unit test started a process"):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(pytest.fail.Exception, match="a unit test started a process"):
        multiprocessing.get_context("spawn").Process(target=print).start()
    with pytest.raises(pytest.fail.Exception, match="a unit test started a process"):
        os.system("true")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_unit_test_may_read_git_for_the_rows_commit():
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0


def test_a_unit_test_cannot_run_the_fine_tuning_loop():
    from harness.train.loop import finetune

    with pytest.raises(pytest.fail.Exception, match="a unit test ran the fine-tuning loop"):
        finetune(None, None, None, None, None, "fingerprint")


@pytest.mark.integration
def test_integration_tests_start_processes_and_unit_selects_only_unit_tests():
    """``pytest -m unit`` keeps this module's unit tests and drops this one: the tiers are marked before ``-m``
    deselects. Here (an integration test) processes start and ``finetune`` is the real one."""
    from harness.train.loop import finetune

    assert finetune.__code__.co_name == "finetune"
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "unit", "--collect-only", "-q", __file__], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ids = {line.split("::", 1)[1] for line in out.stdout.splitlines() if "::" in line}
    assert "test_a_unit_test_cannot_start_a_process" in ids
    assert "test_integration_tests_start_processes_and_unit_selects_only_unit_tests" not in ids
