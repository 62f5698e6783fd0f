"""Components own their facts: a method and an evaluator kept outside the harness (one .py file and one YAML each,
written into a temporary folder and named in ``HARNESS_PLUGINS``) reach a composed sweep, the tables, the findings'
families, the plan and the report with nothing else touched; a component that leaves out what they need fails when
it registers."""
from __future__ import annotations

import io
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from controlled_study import build_all
from controlled_study import estimates as est
from controlled_study.build import attention
from controlled_study.findings import Evidence, approx, exact_ft
from controlled_study.paper import Paper
from controlled_study.rows import RowSet, load_spec
from harness import plan, report, sweeps
from harness.config import ConfigError
from harness.evals import EVALS, EvalArgs, Spec
from harness.methods import METHODS, Method, build_method, facts
from tests.test_tables import C, make_row, write_rows

METHOD_PY = '''
"""A method kept outside the harness: plain RoPE under another name (what it does is not the point here)."""
from dataclasses import dataclass

from harness.methods import METHODS, Method, MethodArgs


@METHODS.register("toy_rope")
class ToyRope(Method):
    @dataclass
    class Args(MethodArgs):
        scale: float = 2.0
'''
METHOD_YAML = """
name: toy_rope
scale: 3.0
facts: {label: Toy-RoPE, family: approximate, trains: true}
"""
EVAL_PY = '''
"""An evaluator kept outside the harness: counts its prompts, measures nothing; its records name their fields
unlike any shipped evaluator's (ctx, hit), and its floor is a threshold no shipped evaluator uses."""
from dataclasses import dataclass

from harness.evals import EVALS, EvalArgs, Spec, lengths_within


@EVALS.register("toy_eval")
class ToyEval:
    spec = Spec(metric="accuracy", reader="percent", generates=True, records={"length": "ctx", "score": ("hit",)},
                floor={"threshold": 40, "chance": 0.0, "ceiling": 100})

    @dataclass
    class Args(EvalArgs):
        samples: int = 3

    def __init__(self, args):
        self.args = args

    def count_prompts(self, lengths, limit):
        ok = lengths_within(self.args.lengths, lengths, limit)
        return {L: self.args.samples for L in ok}, "samples x lengths"

    def gen_tokens_per_prompt(self):
        return 5.0, "toy budget"

    def run(self, handle, method, ctx):
        return {"accuracy": {}}
'''
EVAL_YAML = """
name: toy_eval
samples: 7
lengths: ${eval.lengths}
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """The two plugin modules and their YAMLs in ``tmp_path``, on the path and in ``HARNESS_PLUGINS``; the registries
    are restored afterwards (no other test sees them)."""
    for r in (METHODS, EVALS):
        r.autoload()  # the shipped components, registered before the plugins are listed
    saved = [(r, dict(r._items), set(r._plugins)) for r in (METHODS, EVALS)]
    for rel, text in {"toy_method.py": METHOD_PY, "conf/method/toy_rope.yaml": METHOD_YAML,
                      "toy_eval.py": EVAL_PY, "conf/evaluator/toy_eval.yaml": EVAL_YAML}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HARNESS_PLUGINS", "toy_method,toy_eval")
    yield tmp_path
    for r, items, loaded in saved:
        r._items, r._plugins = items, loaded
    for m in ("toy_method", "toy_eval"):
        sys.modules.pop(m, None)


def test_plugin_method_and_evaluator_reach_every_consumer(plugins, tmp_path):
    # a sweep: the new method beside a shipped one, the new evaluator added to the tiny suite
    jobs = sweeps.expand(["model=llama2_7b", "method=toy_rope,pi", "+evaluator@eval.suite.toy=toy_eval"])
    assert [j[1] for j in jobs] == ["method=toy_rope", "method=pi"]
    cfg = sweeps.compose(jobs[0])
    assert cfg.method.name == "toy_rope" and cfg.eval.suite.toy.samples == 7   # the plugins' YAMLs composed
    assert build_method(cfg.method).args.scale == 3.0                          # facts are not a parameter
    assert "toy_rope" in METHODS and "toy_eval" in EVALS

    # the plan counts the new evaluator's prompts and decoded tokens by its own cost model
    ev = plan.point_plan(cfg, plan.PlanArgs(bench="/none"))["eval"]["toy"]
    lengths = list(cfg.eval.lengths)
    assert ev["prompts"] == 7 * len(lengths) and ev["evaluator"] == "toy_eval"
    assert (ev["gen_tokens_per_prompt"], ev["gen_basis"]) == (5.0, "toy budget")

    # the tables: a row of the new method renders with its label, in its family's group
    rows = [make_row(tmp_path, "r1-base", "base", train="none"), make_row(tmp_path, "r2-toy", "toy_rope")]
    out = build_all(write_rows(tmp_path, rows), tmp_path / "tables", tmp_path / "figures", figures=False)
    assert out["errors"] == []
    t1 = next(t for t in out["tables"] if t.id == "table1_tiny_llama")
    md = (tmp_path / "tables" / "table1_tiny_llama.md").read_text().splitlines()
    assert [r for r in md if r.startswith("|") and "Toy-RoPE" in r][0].startswith(
        "| Approxi. Attention | Fine-Tuned | Toy-RoPE |")
    entry = next(e for e in out["rowset"].entries if e.method == "toy_rope")
    assert entry.label == "Toy-RoPE" and attention(out["rowset"], entry) == "approximate" and t1.n_ours() > 0

    # the findings' families: the new method is on the approximate side, never a paper row of Table 1
    assert Evidence(out["rowset"], "tiny_llama").family(entry) == "approximate"
    paper = Paper()
    assert "toy_rope" not in exact_ft(paper) + approx(paper)

    # the tables' floor rule and record intervals: the base scores 30% at C (3 hits of 10 records, no per-sample
    # scores in the row), below the class's threshold 40; the interval comes from the records' ctx / hit fields;
    # the tables' source of the new evaluator is its own (named after it, matched by the suite entry's evaluator)
    for r in rows:
        r["metrics"]["toy"] = {"accuracy": {str(C): 30.0}}
        r["config"]["eval"]["suite"]["toy"] = {"name": "toy_eval"}
        (tmp_path / "outputs" / r["run_id"] / "samples" / "toy.jsonl").write_text(
            "".join(f'{{"ctx": {C}, "hit": {int(i < 3)}}}\n' for i in range(10)))
    rs = RowSet(rows, load_spec())
    assert rs.spec["sources"]["toy_eval"] == {"entries": ["toy_eval"], "evaluator": "toy_eval"}
    assert est.metric(rs, "toy_eval") == "accuracy" and EVALS.spec("toy_eval").floor["threshold"] == 40
    fl = est.floor(rs, "tiny_llama", "toy_eval")
    assert not fl.measurable and fl.threshold == 40 and "below the threshold 40" in fl.reason
    x = est.at(rs, next(e for e in rs.entries if e.method == "base"), "toy_eval", 1.0)
    assert x.value == 30.0 and x.ci is not None and x.lo < 30.0 < x.hi

    # the report: the new evaluator's headline metric with its interval
    row = {"run_id": "r", "status": "ok", "config": {"eval": {"suite": {"toy": {"name": "toy_eval"}}}},
           "metrics": {"toy": {"accuracy": {"512": 0.5}, "ci": {"512": [0.25, 0.75]}}}}
    con = Console(width=200, record=True, file=io.StringIO())
    con.print(report.summary(row))
    assert "| toy.accuracy | 0.50 [0.25,0.75] |" in con.export_text().replace("\u2502", "|")
    assert facts("toy_rope").trains and not facts("toy_rope").beyond_paper


def test_a_plugin_method_is_a_point_of_the_tiny_study(plugins):
    """``study.every_method``: the plugin's method (listed after the harness was imported) is a point of the tiny
    study with no point file, fine-tuned because its facts say so, its row named by its label."""
    jobs = sweeps.expand(["experiment=tiny_study"])
    assert ["point=tiny_study/toy_rope"] in [[o for o in j if o.startswith("point=")] for j in jobs]
    cfg = sweeps.compose(["experiment=tiny_study", "point=tiny_study/toy_rope"])
    assert cfg.method.name == "toy_rope" and cfg.study.row == "Toy-RoPE" and cfg.train.enabled


def test_component_without_its_facts_fails_when_it_registers(plugins):
    class NoFacts(Method):
        pass

    with pytest.raises(ConfigError, match=r"method 'no_such_toy' .* has no conf/method/no_such_toy.yaml"):
        METHODS.register("no_such_toy")(NoFacts)
    (plugins / "conf" / "method" / "no_such_toy.yaml").write_text("name: no_such_toy\nfacts: {label: X}\n")
    with pytest.raises(ConfigError, match=r"facts: missing \['family', 'trains'\]"):
        METHODS.register("no_such_toy")(NoFacts)

    class Silent:
        @dataclass
        class Args(EvalArgs):
            pass

    with pytest.raises(ConfigError, match=r"evaluator 'silent_toy' .* does not declare \['spec', 'count_prompts'\]"):
        EVALS.register("silent_toy")(Silent)

    class Untyped:  # the old loose attributes: refused, one line naming the type it needs
        spec = {"metric": "accuracy"}

        def count_prompts(self, lengths, limit):
            return {}, ""

    with pytest.raises(ConfigError, match=r"evaluator 'untyped_toy' .*: spec is a dict, not a harness.evals.Spec"):
        EVALS.register("untyped_toy")(Untyped)
    assert "no_such_toy" not in METHODS and "silent_toy" not in EVALS and "untyped_toy" not in EVALS


def test_every_method_and_evaluator_declares_what_the_tables_read():
    """The shipped components: every method's facts (its Table 1 family and training agree with the paper's own
    columns), every evaluator's headline metric and a reader the tables know."""
    from controlled_study.estimates import SHAPES

    names = METHODS.names()
    assert all(facts(n) is not None and facts(n).key == n for n in names)
    for r in Paper().table("table1")["rows"]:
        f = facts(r["key"])
        assert (f.family, "fine-tuned" if f.trains else "frozen") == (r["attention"], r["training"]), r["key"]
    for name, cls in EVALS.items():
        assert isinstance(cls.spec, Spec) and EVALS.spec(name) is cls.spec and callable(cls.count_prompts), name
        assert isinstance(cls.spec.metric, str) and cls.spec.reader in (None, *SHAPES), name


def test_no_table_outside_the_evaluators_is_keyed_by_their_names():
    """What an evaluator's numbers need (record fields, floors, decode budgets) lives on its class: ``spec.yaml``
    maps table columns to sources, and none of its other sections is a table keyed by evaluator names."""
    spec = load_spec()
    keyed = {sec: sorted(set(v) & set(EVALS.names())) for sec, v in spec.items() if isinstance(v, dict)
             and sec != "sources"}
    assert not any(keyed.values()), keyed
    assert "name ==" not in Path(plan.__file__).read_text()
