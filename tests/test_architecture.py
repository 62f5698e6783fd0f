"""The import floors of ``harness/`` (docs/architecture.md): a module imports only from floors below its own (or
from its own package), and no import cycle exists. Read from the source with ``ast`` (function-level imports
included), nothing is imported, so a back-arrow fails here before it can become a circular import at run time."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.contamination import EVAL_FRAGMENTS, contains_eval_template

HARNESS = Path(__file__).resolve().parents[1] / "harness"
STUDY = HARNESS.parent / "controlled_study"  # the study app on the library: its tables, findings, figures

# Lowest first. A unit is a top-level module (``results``) or a package (``evals``: all its modules).
FLOORS = [
    ("basement", {"safe"}),  # names never paths, shell words, non-finite numbers, env settings: imports nothing
    ("ground", {"codeversion", "conf_utils", "config", "contamination", "device", "memory", "progress", "results",
                "sequence_group", "stats", "tracking"}),
    ("registry", {"registry"}),  # Registry.build checks a node with config.to_args
    ("components", {"models", "methods", "data"}),
    ("consumers", {"evals", "train"}),
    ("search", {"search"}),
    ("parallel", {"eval_distributed"}),  # data-parallel evaluation: ranks run evaluators; pipeline starts them
    ("lifecycle", {"lifecycle"}),  # a run's row from start to finish: the one writer of results/runs/*.json
    ("orchestration", {"pipeline", "plan", "report", "status", "sweeps"}),
    ("library", {"api"}),  # the public API (extend, evaluate, save, load): run.py's stages are api.run
    ("launch", {"submit"}),  # a sweep submitted to Slurm (validates with the pipeline, records for status)
    ("entry", {"precheck", "shards", "cli", "lmeval"}),  # cli: `harness <tool>`; lmeval: the model for lm-eval
    ("app", {"app"}),  # the Hydra app of one run (run.py, `harness run`, every Slurm job)
    ("tools", {"tools"}),  # the library's tools behind `harness <tool>` (plan, submit, build-data, prepare-*, ...)
    # the controlled study, an app on the library (package controlled_study): tables, findings, figures and the
    # paper's numbers, reading what the evaluators declare and the methods' facts; nothing in harness imports it
    ("study", {"controlled_study"}),
]
FLOOR = {unit: i for i, (_, units) in enumerate(FLOORS) for unit in units}


def modules() -> dict[str, Path]:
    out = {}
    for top in (HARNESS, STUDY):
        for p in sorted(top.rglob("*.py")):
            name = ".".join((top.name,) + p.relative_to(top).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the harness modules it imports (the longest existing prefix of each imported name)."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != m and not m.startswith(t + "."):
                    edges[m].add(t)
    return edges


def unit(module: str) -> str:
    return module.split(".")[0] if module.startswith(STUDY.name) else module.split(".")[1]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_module_has_a_floor():
    missing = sorted({unit(m) for m in modules()} - set(FLOOR))
    assert not missing, f"place these in FLOORS (tests/test_architecture.py, docs/architecture.md): {missing}"


def test_imports_only_go_down():
    bad = []
    for m, targets in import_graph().items():
        for t in sorted(targets):
            if unit(t) != unit(m) and FLOOR.get(unit(t), -1) >= FLOOR.get(unit(m), -1):
                bad.append(f"{m} ({FLOORS[FLOOR[unit(m)]][0]}) imports {t} ({FLOORS[FLOOR[unit(t)]][0]})")
    assert not bad, "imports against the floors:\n" + "\n".join(bad)


def test_no_import_cycle():
    assert not cycles(import_graph())


ROOT = HARNESS.parent
ROW_WRITERS = {"harness/results/live.py", "harness/lifecycle.py"}  # the row file's writer, and the row's lifecycle


def row_writes(text: str) -> list[str]:
    """The calls in a source file that write a results row: ``write_row`` / ``start_heartbeat``, or an atomic write
    whose target (its first argument) names the ``runs`` directory or ``row_path``."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        target = ast.unparse(node.args[0]) if node.args else ""
        if name in ("write_row", "start_heartbeat") or (
                name.startswith("atomic_write") and ("runs" in target or "row_path" in target)):
            out.append(ast.unparse(node))
    return out


def test_one_module_writes_rows():
    """``harness/lifecycle.py`` owns a run's row: no other source file (harness, scripts, benchmarks, run.py) writes
    ``results/runs/*.json``, by ``results.write_row`` or by an atomic write into the runs directory."""
    files = [*HARNESS.rglob("*.py"), *(ROOT / "scripts").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
             ROOT / "run.py"]
    bad = {str(f.relative_to(ROOT)): hits for f in files
           if str(f.relative_to(ROOT)) not in ROW_WRITERS and (hits := row_writes(f.read_text()))}
    assert not bad, f"rows are written through harness.lifecycle only: {bad}"
    assert row_writes("results.write_row(cfg.paths.results_dir, row)")  # the check can fail
    assert row_writes('atomic_write_json(Path(d) / "runs" / f"{rid}.json", row)')
    assert not row_writes('atomic_write_json(out, factors)  # results/factors, not a row')


def test_checker_sees_back_arrows_and_cycles():
    """The checks can fail: a synthetic graph with a back-arrow and a cycle is caught."""
    edges = {"harness.data.a": {"harness.evals.b"}, "harness.evals.b": {"harness.data.a"}}
    assert cycles(edges) == [["harness.data.a", "harness.evals.b"]]
    assert FLOOR[unit("harness.evals.b")] >= FLOOR[unit("harness.data.a")]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


@pytest.mark.parametrize("name", ["PASSKEY_TASK", "PASSKEY_GARBAGE", "PASSKEY_INFO", "PASSKEY_QUESTION",
                                  "NIAH_NEEDLE", "NIAH_QUESTION", "NIAH_PROMPT", "RULER_NIAH_NEEDLE",
                                  "RULER_REPEAT_NOISE", "RULER_TASKS"])
def test_template_filter_catches_the_evaluation_templates(name):
    """The ground-floor filter (``harness.contamination``) catches every distinctive evaluation template, and
    ``harness.evals.templates`` re-exports the same fragments."""
    from harness.evals import templates

    assert templates.EVAL_FRAGMENTS is EVAL_FRAGMENTS
    value = getattr(templates, name)
    texts = ([t["template"] + t["answer_prefix"] for t in value.values()] if isinstance(value, dict) else [value])
    for text in texts:
        assert contains_eval_template(text), (name, text[:80])


# -- typed contracts: the one builder of a component --------------------------------------------------------------
def test_registry_build_fills_the_name_and_checks_the_node():
    from dataclasses import dataclass

    from harness.config import ConfigError
    from harness.registry import Registry

    reg = Registry("thing", "harness.methods")  # the package only matters for autoload; mark it loaded
    reg._loaded = True

    @dataclass
    class NewArgs:
        name: str = ""  # a file in the new style: no name default
        k: int = 1

    @reg.register("new")
    class New:
        Args = NewArgs

        def __init__(self, args):
            self.args = args

    @reg.register("old")
    class Old:  # today's style: the Args repeats its registered name
        @dataclass
        class Args:
            name: str = "old"
            k: int = 1

        def __init__(self, args):
            self.args = args

    assert reg.build({"name": "new", "k": 3}, "thing=new").args == NewArgs(name="new", k=3)
    assert reg.build({"k": 2}, "suite.x", name="new").args.name == "new"  # looked up by key, name filled
    assert reg.build({"name": "old"}, "thing=old").args.name == "old"
    assert reg.build({}, "thing=old", name="old", defaults={"k": 5}).args.k == 5  # YAML defaults under the node
    assert reg.build({"name": "old", "k": 7}, "thing=old", defaults={"k": 5}).args.k == 7
    cls, args = reg.args({"name": "new"}, "thing=new")
    assert cls is New and args.k == 1
    with pytest.raises(ConfigError, match=r"thing=nope: unknown thing 'nope'"):
        reg.build({"name": "nope"}, "thing=nope")
    with pytest.raises(ConfigError, match=r"thing=new: .*valid keys: name, k"):
        reg.build({"name": "new", "kk": 1}, "thing=new")
    with pytest.raises(ConfigError, match="has no name"):
        reg.build({}, "thing")


def test_evaluator_version_defaults_to_one():
    from harness.evals import Spec, build_evaluators
    from harness.pipeline import eval_version

    (ev,) = build_evaluators({"passkey": {"name": "passkey", "lengths": [64]}})
    assert eval_version(ev) == type(ev).spec.version >= 1 and Spec("x").version == 1

    class Bumped:
        spec = Spec("accuracy", version=3)

    assert eval_version(Bumped()) == 3


def test_every_registered_component_meets_its_registry_contract():
    """One contract per registry: methods inherit the one small base (``methods.Method``); models, dataset
    builders and evaluators satisfy their ``Protocol`` (``ModelBuilder``, ``DataBuilder``, ``Evaluator``), with an
    ``Args`` dataclass derived from the registry's shared fields."""
    import dataclasses

    from harness.data import DATA, DataArgs, DataBuilder
    from harness.evals import EVALS, EvalArgs, Evaluator
    from harness.methods import METHODS, Method, MethodArgs
    from harness.models import MODELS, ModelArgs, ModelBuilder

    for reg, base_args, check in ((MODELS, ModelArgs, lambda c: isinstance(c, ModelBuilder)),
                                  (DATA, DataArgs, lambda c: isinstance(c, DataBuilder)),
                                  (EVALS, EvalArgs, lambda c: isinstance(c(c.Args()), Evaluator)),
                                  (METHODS, MethodArgs, lambda c: issubclass(c, Method))):
        for name, cls in reg.items():
            assert dataclasses.is_dataclass(cls.Args) and issubclass(cls.Args, base_args), (reg.kind, name)
            assert check(cls), f"{reg.kind} {name!r} does not meet its registry's contract"


# -- floors held by where code lives (issue 49): measured, printed, and held at today's counts -----------------------
# ceilings: today's counts (issue 49, before -> after: function-level harness imports 173 -> 103 -> 3, private names
# crossing a module boundary 20 -> 0, functions over 60 lines 14 -> 11 -> 10, counting controlled_study and the
# tools moved from scripts/ into the packages); lower them as code moves, never raise them.
# The three left each say why at the import: two cycles of harness.methods with its rope and persist modules, and
# matplotlib, imported only when figures are drawn.
MAX_FUNCTION_IMPORTS = 3
MAX_LONG_FUNCTIONS = 10
LONG = 60  # lines of a function (signature, docstring and body)


def _bound_modules(m: str, p: Path, tree: ast.AST, mods: dict) -> dict:
    """Names a module binds to harness modules (``from harness.train import loop``: ``loop`` -> harness.train.loop)."""
    out = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            base = _base(m, p, n)
            out.update({a.asname or a.name: f"{base}.{a.name}" for a in n.names if f"{base}.{a.name}" in mods})
        elif isinstance(n, ast.Import):
            out.update({a.asname: a.name for a in n.names if a.asname and a.name in mods})
    return out


def _base(m: str, p: Path, node: ast.ImportFrom) -> str:
    pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
    base = node.module or ""
    if node.level:
        parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return base


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


OURS = ("harness", "controlled_study")  # the library and the study app on it


def code_shape() -> dict:
    """``function_imports``: harness imports made inside a function; ``private``: a private name (``_x``) or a private
    module used from outside its owner (an import of ``harness.a._b`` from outside package ``harness.a``, ``from
    harness.m import _x`` or ``m._x`` in another module); ``functions``: (lines, qualified name), longest first."""
    mods = modules()
    imports, private, functions = set(), set(), []
    for m, p in mods.items():
        tree = ast.parse(p.read_text(), str(p))
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((f.end_lineno - f.lineno + 1, f"{m}.{f.name}"))
                imports |= {f"{m}:{n.lineno}" for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))
                            and any(t.startswith(OURS) for t in ([_base(m, p, n)] if isinstance(n, ast.ImportFrom)
                                                                     else [a.name for a in n.names]))}
        for n in ast.walk(tree):
            if not isinstance(n, ast.ImportFrom) or not _base(m, p, n).startswith(OURS):
                continue
            base = _base(m, p, n)
            for a in n.names:
                full = f"{base}.{a.name}"
                parts = (full if full in mods else base).split(".")
                i = next((k for k, part in enumerate(parts) if _private(part)), None)
                if i is not None and not (m + ".").startswith(".".join(parts[:i]) + "."):
                    private.add(f"{m} <- {'.'.join(parts[: i + 1])}")
                if full not in mods and _private(a.name) and base != m:
                    private.add(f"{m} <- {full}")
        bound = _bound_modules(m, p, tree, mods)
        private |= {f"{m} <- {bound[n.value.id]}.{n.attr}" for n in ast.walk(tree)
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in bound
                    and _private(n.attr) and bound[n.value.id] != m}
    return {"function_imports": sorted(imports), "private": sorted(private), "functions": sorted(functions,
                                                                                                 reverse=True)}


def test_code_shape_is_printed_and_does_not_grow(capsys):
    """Function-level harness imports, private names crossing a module boundary and the longest functions, counted
    and printed (``pytest -s``); none of the three may grow past today's count, and no private name crosses."""
    s = code_shape()
    long = [f for f in s["functions"] if f[0] > LONG]
    with capsys.disabled():
        print(f"\ncode shape: {len(s['function_imports'])} function-level harness imports, {len(s['private'])} "
              f"private names crossing a module, {len(long)} functions over {LONG} lines; longest: "
              + ", ".join(f"{name} {n}" for n, name in s["functions"][:8]))
    assert not s["private"], s["private"]
    assert len(s["function_imports"]) <= MAX_FUNCTION_IMPORTS
    assert len(long) <= MAX_LONG_FUNCTIONS, long


def test_code_shape_sees_what_it_counts(tmp_path, monkeypatch):
    """The counter can fail: a private module, a private name and a module's private attribute used from another
    module, and an import inside a function, are each seen."""
    pkg = tmp_path / "harness"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "_inner.py").write_text("def _x():\n    pass\n")
    (pkg / "b.py").write_text("from harness.a import _inner\nfrom harness.a._inner import _x\n"
                              "from harness.a import _inner as i\n\ndef f():\n    from harness.a import _inner\n"
                              "    return i._x\n")
    monkeypatch.setitem(globals(), "HARNESS", pkg)
    monkeypatch.setitem(globals(), "STUDY", tmp_path / "no_study")
    s = code_shape()
    assert s["function_imports"] == ["harness.b:6"]
    assert s["private"] == ["harness.b <- harness.a._inner", "harness.b <- harness.a._inner._x"]
