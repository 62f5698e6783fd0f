"""``harness <tool> [args]``: the checkout's main tools behind one console command (``[project.scripts]``).

    harness run method=ntk_dynamic model=llama2_7b     # = python run.py ...
    harness tables                                     # = make tables (python scripts/make_tables.py)
    harness findings | study | plan | submit | export | status | prepare-eval | prepare-cluster | build-data
    harness gguf-to-hf smollm2_135m smollm2-hf           # = python scripts/gguf_to_hf.py ...
    harness lm-eval --model harness --model_args pretrained=DIR,method=yarn --tasks ...   # = python -m harness.lmeval

Each tool is the checkout's own script, run as ``__main__`` with the given arguments, so the command and
``python <script> ...`` are one program (the same Hydra app, the same exit codes). The project installs editable
(``pip install -e .``, ``make setup``): the scripts and ``conf/`` are read from the checkout beside this package.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TOOLS = {  # tool -> (script, or -m module, what it does)
    "run": ("run.py", "one run (or -m, a sweep): model x method x data x train x eval -> one results row"),
    "tables": ("scripts/make_tables.py", "per study: the paper's tables and figures from results/<study>/runs"),
    "findings": ("scripts/make_findings.py", "per study: the paper's findings tested on its rows"),
    "study": ("scripts/study.py", "the whole tiny study, resumable, then tables and findings"),
    "plan": ("scripts/plan.py", "cost plan of a sweep: memory per rank, tokens, GPU-hours, checkpoint space"),
    "submit": ("scripts/submit.py", "submit a sweep to Slurm and exit (job ids -> results/jobs/)"),
    "export": ("scripts/export_rows.py", "every row as one flat table (CSV and Parquet)"),
    "status": ("-m harness.status", "unfinished, stale and failed rows of the results directory"),
    "prepare-eval": ("scripts/prepare_eval_data.py", "fetch or convert the evaluation data (paths.eval_root)"),
    "prepare-cluster": ("scripts/prepare_cluster_data.py", "fetch the fine-tuning shards, with a size estimate"),
    "build-data": ("scripts/build_data.py", "build a run's tokenised data cache before its GPU job"),
    "gguf-to-hf": ("scripts/gguf_to_hf.py", "a Hugging Face folder from a GGUF file (the shipped SmolLM2 included)"),
    "lm-eval": ("-m harness.lmeval", "lm-eval's command line with the model `harness` (a method and its settings)"),
}


def usage() -> str:
    width = max(map(len, TOOLS))
    return "usage: harness <tool> [args]\n" + "\n".join(f"  {t:{width}s}  {what}" for t, (_, what) in TOOLS.items())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    tool, *args = argv
    if tool not in TOOLS:
        print(f"harness: unknown tool {tool!r} (valid: {', '.join(TOOLS)})", file=sys.stderr)
        return 2
    target = TOOLS[tool][0]
    if target.startswith("-m "):  # a module of this package
        return _run(lambda: runpy.run_module(target[3:], run_name="__main__", alter_sys=True), [target[3:], *args])
    script = ROOT / target
    if not script.is_file():
        print(f"harness: {script} is missing: the tools run from a checkout installed with `pip install -e .`",
              file=sys.stderr)
        return 2
    return _run(lambda: runpy.run_path(str(script), run_name="__main__"), [str(script), *args])


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
