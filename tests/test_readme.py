"""The README states counts and defaults; they must be the code's (a front door that contradicts the code misleads)."""
from __future__ import annotations

import re

import pytest
import yaml

from harness import conf_utils
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def _table_names(section: str) -> set[str]:
    """Every backticked short name in the cells of the README table under ``## <section>``."""
    body = README.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in body.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = line.split("|")
            for cell in cells[1:-1]:
                names |= {m for m in re.findall(r"`([a-z0-9_]+)`", cell)}
    return names


def test_default_run_is_what_the_config_composes():
    defaults = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())["defaults"]
    chosen = {k: v for d in defaults if isinstance(d, dict) for k, v in d.items()}
    label = {"yarn": "YaRN", "pi": "PI"}.get(chosen["method"], chosen["method"])
    assert f"the default: {chosen['model']} x {label} x {chosen['data']}" in README


def _family_cells(section: str) -> list[str]:
    body = README.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return [line.split("|")[1].strip() for line in body.splitlines()
            if line.startswith("|") and not line.startswith("|---")][1:]


def test_the_readme_tables_name_methods_by_family_and_every_evaluator_a_suite_runs():
    """Checked by family, so that a method is one file plus one YAML (issue 49): every name the README's tables
    give is a registered component, every family of the registered methods (``facts.family``) has its row, and
    every evaluator a shipped suite (``conf/eval/*.yaml``) runs is named; a new method of a known family, or an
    evaluator no shipped suite runs yet, needs no README line."""
    from harness.evals import EVALS
    from harness.methods import METHODS

    named = _table_names("Methods")
    assert named and named <= set(METHODS.names()), sorted(named - set(METHODS.names()))
    families = {METHODS.facts(n).family for n in METHODS.names()}
    cells = _family_cells("Methods")
    assert all(any(f in c for c in cells) for f in families), (families, cells)
    in_suites = {line.split(":", 1)[1].strip() for p in (ROOT / "conf" / "eval").glob("*.yaml")
                 for line in p.read_text().splitlines() if line.strip().startswith("- /evaluator@")}
    assert in_suites and in_suites <= set(EVALS.names())
    listed = _table_names("Evaluators")
    assert in_suites <= listed, sorted(in_suites - listed)
    assert listed <= set(EVALS.names()), sorted(listed - set(EVALS.names()))


def test_finding_count_matches_the_report():
    from controlled_study.findings import FINDINGS

    words = {13: "thirteen", 12: "twelve"}
    n = len(FINDINGS)
    stated = re.findall(r"the paper's (\w+) findings", README)
    assert stated and all(s in (str(n), words.get(n)) for s in stated), stated


@pytest.mark.parametrize("group", ["model", "data", "train", "eval", "experiment"])
def test_every_option_the_readme_names_exists_and_every_option_is_named(group):
    row = next(line for line in README.splitlines() if line.startswith(f"| `{group}` |"))
    named = set(re.findall(r"`([a-z0-9_]+)`", row.split("|")[2]))
    yamls = {p.stem for d in conf_utils.conf_dirs() for p in (d / group).glob("*.yaml")}  # the study's experiments too
    assert named and named <= yamls, sorted(named - yamls)
    assert yamls <= named, sorted(yamls - named)  # and every YAML of the group is named


def test_the_readme_is_a_front_door():
    """At most ~12 KB, and no hand-kept results: numbers live in the generated results/README.md."""
    assert len(README.encode()) <= 12_500
    assert "results/README.md" in README
    assert not re.search(r"\d{8}T\d{6}-[0-9a-f]{6}", README), "a run id in the README: results belong in results/"


STUDY = ROOT / "results" / "tiny_study"   # the committed study: its rows in runs/, its tables, findings and page


def test_results_readme_is_generated_from_the_committed_files():
    """Each study's page (results/<study>/README.md) and the index (results/README.md) say what the study's
    tables/index.md and findings.md say (make tables / make findings write them)."""
    from controlled_study.front import verdict_counts
    from harness.results import studies

    assert "tiny_study" in studies(ROOT / "results")
    top = (ROOT / "results" / "README.md").read_text()
    assert top.startswith("# Results (generated")
    front = (STUDY / "README.md").read_text()
    findings = (STUDY / "findings.md").read_text()
    index = (STUDY / "tables" / "index.md").read_text()
    assert front.startswith("# Results of the study `tiny_study` (generated")
    for page in (front, top):
        assert index.splitlines()[2] in page  # the row counts
        assert verdict_counts(findings) and all(f"{n} {v}" in page for v, n in verdict_counts(findings).items())
