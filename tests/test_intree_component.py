"""The proof where a contributor works (issue 49): a new method and a new evaluator added *in the repository*, each
exactly one ``.py`` file plus one YAML, as the README's "Adding a method, an evaluator or a model" says, reach the
tiny study's sweep (a point of its own, from the method registry), the README's checks and the registries'
contracts with nothing else touched: the component tests run in a copy of the checkout that holds them.
(``tests/test_components.py`` proves the tables, findings, plan and report with the same two components kept
outside the repository, through ``HARNESS_PLUGINS``: the same consumers read both.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_components import EVAL_PY as PLUGIN_EVAL_PY

# the whole proof is in the slow tier (~50 s idle: a copy of the checkout and a nested pytest of 5 modules that the
# default tier runs as they are); its short form (one process in the copy) is in the default tier

README = (ROOT / "README.md").read_text()
# the plugin proof's evaluator (tests/test_components.py), kept in the tree under its own name
EVAL_PY = PLUGIN_EVAL_PY.replace("toy_eval", "intree_eval").replace("ToyEval", "IntreeEval")
EVAL_YAML = "name: intree_eval\nsamples: 3\nlengths: ${eval.lengths}\n"


def readme_example() -> dict:
    """The README's example method: its two code blocks, each headed by the path it goes to."""
    out = {}
    for _lang, body in re.findall(r"```(python|yaml)\n(# (?:harness/methods|conf/method)/[^\n]+\n.*?)```", README,
                                 re.S):
        path = body.splitlines()[0][2:].strip()
        out[path] = body
    assert set(out) == {"harness/methods/my_method.py", "conf/method/my_method.yaml"}, sorted(out)
    return out


def checkout_with_the_pair(tmp_path, with_results: bool = True):
    """A copy of the checkout's tracked files (``with_results``: its committed results too) with the README's method
    and the in-tree evaluator added, each one ``.py`` file plus one YAML; and the environment that runs it."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = tmp_path / "repo"
    for rel in tracked.decode().split("\0"):
        if rel and (ROOT / rel).is_file() and (with_results or not rel.startswith("results/")):
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, copy / rel)
    example = readme_example()
    body = example["harness/methods/my_method.py"]
    # the README shows the class; the file also needs its imports (what every method file starts with)
    imports = ("from dataclasses import dataclass\n\nfrom harness.methods import METHODS, Method, MethodArgs\n"
               "from harness.methods.rope import set_rope_parameters\n\n")
    new = {"harness/methods/my_method.py": imports + body, "conf/method/my_method.yaml": example[
        "conf/method/my_method.yaml"], "harness/evals/intree_eval.py": EVAL_PY,
        "conf/evaluator/intree_eval.yaml": EVAL_YAML}
    for rel, text in new.items():
        (copy / rel).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(copy), HARNESS_RESULTS_DIR=str(tmp_path / "results"),
               HARNESS_OUTPUT_DIR=str(tmp_path / "outputs"))
    env.pop("HARNESS_PLUGINS", None)
    return copy, env


# run in the copy: the pair is registered with its facts, the tiny study has a point for the method (its facts say
# it trains: the study's fine-tuning recipe), that point composes and validates like any, and the evaluator runs in
# a suite whose config says only its name
SHORT_CHECK = """
from harness import pipeline
from harness.conf_utils import compose, generated_points
from harness.evals import EVALS
from harness.methods import METHODS

point = generated_points()["tiny_study"]["my_method"]
cfg = compose(["experiment=tiny_study", "point=tiny_study/my_method", "+evaluator@eval.suite.mine=intree_eval"])
method, train = pipeline.validate(cfg, data=False)
print("my_method" in METHODS, "intree_eval" in EVALS, METHODS.facts("my_method").label, point["study"]["row"],
      method.name, train.enabled, type(pipeline.Suite.of(cfg).evaluators[-1]).__name__)
"""


@pytest.mark.integration
def test_a_new_method_and_evaluator_in_the_tree_are_found_by_the_registries_and_the_study(tmp_path):
    """The proof's short form (default tier, one process): with the pair added to a copy of the checkout, the
    registries find both with their facts, the tiny study gets a point for the method from its facts, and a run of
    that point with the evaluator added to its suite composes and validates; nothing else was touched."""
    copy, env = checkout_with_the_pair(tmp_path, with_results=False)
    r = subprocess.run([sys.executable, "-c", SHORT_CHECK], cwd=copy, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "True", "My-Method", "My-Method", "my_method", "True", "IntreeEval"]


@pytest.mark.slow
def test_a_new_method_and_evaluator_in_the_tree_need_nothing_else(tmp_path):
    copy, env = checkout_with_the_pair(tmp_path)

    # the sweep: the tiny study has a point for the new method (fine-tuned: its facts say trains), not yet run
    plan = subprocess.run([sys.executable, "scripts/study.py", "--dry-run"], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=600)
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    line = next(x for x in plan.stdout.splitlines() if "point=tiny_study/my_method " in x)
    assert "to run" in line and "/25]" in line
    # the component tests, run in the copy: the README's checks, the study's sweep, the registries' contracts and
    # the plugin proof (tables, findings, plan, report), with the in-tree pair registered beside the shipped ones
    tests = ["tests/test_readme.py", "tests/test_sweeps.py::test_tiny_study_covers_every_method_and_entropy_abf_steps",
             "tests/test_sweeps.py::test_every_sweep_point_composes",
             "tests/test_architecture.py", "tests/test_components.py"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=copy, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    check = subprocess.run([sys.executable, "-c", "from harness.methods import METHODS; from harness.evals import "
                            "EVALS; print('my_method' in METHODS, 'intree_eval' in EVALS, "
                            "METHODS.facts('my_method').label)"], cwd=copy, env=env, capture_output=True, text=True)
    assert check.stdout.split() == ["True", "True", "My-Method"], check.stderr[-2000:]
