"""Which RULER tasks can the base model do at its native window C? (The powered suite keeps those, issue 20.)

Runs the frozen base (``method=base``) on every RULER task at length C with the suite's miniature settings
(``conf/eval/<suite>.yaml``) and ``--samples`` samples per task, prints each task's score with its 95% interval, and
the task list to put under ``suite.ruler.tasks`` of the suite: tasks whose score at C is at least ``--threshold``
(the tables' measurability threshold for RULER, ``controlled_study/spec.yaml``). A task that does not fit in C tokens
cannot be done at C and is listed as such.

    python scripts/probes/ruler_screen.py                       # tiny_llama, the tiny suite, 20 samples per task
    python scripts/probes/ruler_screen.py model=smollm2_135m --samples 50
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (model=..., eval=...)")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--threshold", type=float, default=None, help="score (0-100) a task must reach at C; "
                    "default: the RULER threshold of controlled_study/spec.yaml")
    ap.add_argument("--json", default="", help="also write the screen to this file")
    a = ap.parse_args(argv)
    from omegaconf import OmegaConf

    from controlled_study.rows import load_spec
    from harness.conf_utils import compose
    from harness.evals import EvalContext
    from harness.evals.ruler import Ruler
    from harness.evals.ruler_data import ALL_TASKS
    from harness.methods import build_method
    from harness.models import build_model

    thr = a.threshold if a.threshold is not None else float(load_spec()["measurable"]["ruler"]["threshold"])
    cfg = compose(["method=base", "train=none"] + a.overrides)
    node = OmegaConf.to_container(cfg.eval.suite.get("ruler") or {"name": "ruler"}, resolve=True)
    handle = build_model(cfg.model)
    build_method(cfg.method).apply(handle)
    C = int(handle.native_ctx)
    node.update(tasks=list(ALL_TASKS), samples=a.samples, lengths=[C])
    from harness.config import to_args

    ev = Ruler(to_args(Ruler.Args, node, "ruler"))
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        out = ev.run(handle, None, EvalContext(run_dir=Path(d), seed=int(cfg.seed), autocast=str(cfg.autocast)))
    keep, lines = [], []
    for t in ALL_TASKS:
        sc = (out["tasks"].get(t) or {}).get(str(C))
        if sc is None:
            why = out["skipped_tasks"].get(t) or (out["skipped"].get(str(C)) or {}).get(t) or "not run"
            lines.append(f"  {t:16s} not at C: {why}")
            continue
        lo, hi = out["task_ci"][t][str(C)]
        ok = sc >= thr
        keep += [t] if ok else []
        lines.append(f"  {t:16s} {sc:6.1f} [{lo:.1f}, {hi:.1f}]  n={a.samples}  {'keep' if ok else 'below'}")
    print(f"RULER at C = {C} tokens, {cfg.model.name} (base, frozen), {a.samples} samples per task, "
          f"threshold {thr:g} ({time.time() - t0:.0f} s):")
    print("\n".join(lines))
    print(f"tasks: [{', '.join(keep)}]" if keep else "tasks: []   # no task reaches the threshold at C: RULER is "
          "not measurable at this scale")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": cfg.model.name, "C": C, "samples": a.samples, "threshold": thr,
                                            "tasks": out["tasks"], "task_ci": out["task_ci"], "keep": keep},
                                           indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
