"""``harness <tool> [args]``: the installed packages' tools behind one console command (``[project.scripts]``).

    harness run method=ntk_dynamic model=llama2_7b     # = python run.py ...
    harness tables                                     # = make tables (python scripts/make_tables.py)
    harness findings | study | plan | submit | export | status | prepare-eval | prepare-cluster | build-data
    harness gguf-to-hf smollm2_135m smollm2-hf           # = python scripts/gguf_to_hf.py ...
    harness lm-eval --model harness --model_args pretrained=DIR,method=yarn --tasks ...   # = python -m harness.lmeval

Every tool is installed code, of two kinds. An installed package's function, registered under the entry-point group
``harness.tools`` (``pyproject.toml``): the library's own (``plan``, ``submit``, ... in ``harness/tools``) and the
controlled study's (the Hydra app ``run``, ``study``, ``tables``, ``findings``, ``export``: ``controlled_study``), so
the library's command runs the study's code without importing it; and a ``-m`` module of this package, run as
``__main__``. The checkout's ``run.py`` and ``scripts/<tool>.py`` are thin fronts for the same functions, so the
command and ``python <script> ...`` are one program (the same Hydra app, the same exit codes).
"""
from __future__ import annotations

import runpy
import sys
from importlib.metadata import entry_points

from harness.conf_utils import TOOLS_GROUP

TOOLS = {  # tool -> (-m module of this package, what it does)
    "status": ("-m harness.status", "unfinished, stale and failed rows of the results directory"),
    "lm-eval": ("-m harness.lmeval", "lm-eval's command line with the model `harness` (a method and its settings)"),
}


GROUP = TOOLS_GROUP  # the entry-point group through which an installed package adds a tool


def installed_tools() -> dict:
    """tool -> its entry point, for every installed package's ``harness.tools`` (a module of ``TOOLS`` wins)."""
    return {ep.name: ep for ep in entry_points(group=GROUP) if ep.name not in TOOLS}


def tools() -> dict:
    """tool -> what it does: this package's modules, then the installed packages' tools (their function's first
    docstring line)."""
    out = {t: what for t, (_, what) in TOOLS.items()}
    for name, ep in sorted(installed_tools().items()):
        doc = (ep.load().__doc__ or "").strip().splitlines()
        out[name] = doc[0].rstrip(".") if doc else ep.value
    return out


def usage() -> str:
    listed = tools()
    width = max(map(len, listed))
    return "usage: harness <tool> [args]\n" + "\n".join(f"  {t:{width}s}  {what}" for t, what in listed.items())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    tool, *args = argv
    installed = installed_tools()
    if tool in installed:  # an installed package's function: called with the arguments, its return is the exit code
        fn = installed[tool].load()
        return _run(lambda: sys.exit(fn(args)), [f"harness {tool}", *args])
    if tool not in TOOLS:
        print(f"harness: unknown tool {tool!r} (valid: {', '.join([*TOOLS, *installed])})", file=sys.stderr)
        return 2
    module = TOOLS[tool][0][3:]  # a module of this package
    return _run(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True), [module, *args])


def _run(call, argv: list[str]) -> int:
    """``call()`` with ``sys.argv = argv``; its exit code."""
    sys.argv = argv
    try:
        call()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
