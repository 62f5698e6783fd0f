"""LongRoPE's progressive extension (Ding et al. 2024, Sec. 3.3): search factors for a first target, fine-tune with
them, search again on the fine-tuned checkpoint for a larger target (seeded with the first factors, rescaled),
and so on. Every step is an ordinary command with its own results row; this driver only chains them.

    python scripts/progressive_rope.py stages=2048,4096 search=longrope_tiny train=tiny tag=tiny
    python scripts/progressive_rope.py stages=1024,2048 search=longrope_tiny tag=small \\
        train.tokens=16384 train.global_batch=2 search.iterations=4        # a reduced run
    python scripts/progressive_rope.py ... --dry-run                      # print the commands only

For stages ``L1 < L2 < ... < Ln`` it runs

    1. ``scripts/search_rope.py search=S target_length=L1``                               -> factors F1
    2. ``run.py method=M method.factors=F1 train=T train.seq_len=L1 eval=ppl_only``        -> checkpoint K1
    3. ``scripts/search_rope.py model.path=K1 search.init_factors=F1 target_length=L2``     -> factors F2
       ... (fine-tune after every stage but the last, as LongRoPE-2048k (ft=256k) was not fine-tuned at 2048k)
    4. ``run.py model.path=K(n-1) method=M method.factors=Fn train=none eval=ppl_only eval.lengths=[Ln]``

``M`` is ``longrope`` or ``longrope2`` (the search's algorithm). Factors are relative to the original RoPE and
window C at every stage (stage 2 of 256 -> 4096 searches [1, 16]). A checkpoint fine-tuned under F1 is accepted
with F2 because F2 was searched on it (``harness.methods.longrope.progressive_lineage``).

Arguments (``key=value``): ``stages`` (comma-separated target lengths), ``search`` (conf/search option for every
stage; ``search_later`` overrides it from stage 2 on), ``model`` (default tiny_llama), ``train`` (default tiny),
``tag`` (names the factor files ``results/factors/progressive_<tag>/`` and the run directories
``outputs/progressive/<tag>/``), ``final_eval`` (default true). Keys with a dot are passed on: ``search.*`` and
``verify.*`` to every search, ``train.*`` to every fine-tune, ``model.*`` and ``seed`` to every command. Resumable:
a stage whose factors file / checkpoint already exists is skipped (state in ``outputs/progressive/<tag>/state.json``),
an interrupted search resumes from its own state file, an interrupted fine-tune from its checkpoints.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def parse(argv: list[str]) -> tuple[dict, dict]:
    opts = {"stages": "2048,4096", "search": "longrope_tiny", "search_later": "", "model": "tiny_llama",
            "train": "tiny", "tag": "", "final_eval": "true"}
    passthrough: dict[str, str] = {}
    for arg in argv:
        if "=" not in arg:
            raise SystemExit(f"progressive_rope: expected key=value, got {arg!r}")
        k, v = arg.split("=", 1)
        if k in opts:
            opts[k] = v
        elif "." in k or k == "seed":
            passthrough[k] = v
        else:
            raise SystemExit(f"progressive_rope: unknown key {k!r} (valid: {', '.join(opts)}, or group.key=...)")
    return opts, passthrough


def plan(opts: dict, passthrough: dict) -> list[dict]:
    """The commands of the whole chain (a pure function of the arguments)."""
    stages = [int(x) for x in str(opts["stages"]).split(",") if x.strip()]
    if len(stages) < 2 or any(b <= a for a, b in zip(stages, stages[1:])):
        raise SystemExit("progressive_rope: stages must be >= 2 increasing target lengths, e.g. stages=2048,4096")
    tag = opts["tag"] or f"{opts['model']}_{opts['search']}_{'-'.join(map(str, stages))}"
    fac_dir = Path("results/factors") / f"progressive_{tag}"
    run_dir = Path("outputs/progressive") / tag
    common = [f"{k}={v}" for k, v in passthrough.items() if k.startswith("model.") or k == "seed"]
    to_search = [f"{k}={v}" for k, v in passthrough.items() if k.split(".")[0] in ("search", "verify")]
    to_train = [f"{k}={v}" for k, v in passthrough.items() if k.startswith("train.")]
    algorithm = "longrope2" if opts["search"].startswith("longrope2") else "longrope"
    steps, prev, model_path = [], None, None
    for i, L in enumerate(stages, start=1):
        out = fac_dir / f"{tag}_stage{i}_{L}.json"  # unique stem: the search's state file
        search = opts["search_later"] if (i > 1 and opts["search_later"]) else opts["search"]
        cmd = [PY, "scripts/search_rope.py", f"model={opts['model']}", f"search={search}", f"target_length={L}",
               f"out={out}", f"hydra.run.dir={run_dir}/search_stage{i}", *common, *to_search]
        if model_path:
            cmd.insert(3, f"model.path={model_path}")
        if prev:
            cmd.append(f"search.init_factors={prev}")
        steps.append({"name": f"search_stage{i}", "cmd": cmd, "done_if": str(out)})
        prev = str(out)
        if i < len(stages):
            ft_dir = run_dir / f"finetune_stage{i}"
            cmd = [PY, "run.py", f"model={opts['model']}", f"method={algorithm}", f"method.factors={out}",
                   f"train={opts['train']}", f"train.seq_len={L}", "eval=ppl_only", f"eval.lengths=[{L}]",
                   f"hydra.run.dir={ft_dir}", *common, *to_train]
            if model_path:
                cmd.insert(3, f"model.path={model_path}")
            steps.append({"name": f"finetune_stage{i}", "cmd": cmd,
                          "done_if": str(ft_dir / "checkpoint" / "method.json")})
            model_path = str(ft_dir / "checkpoint")
    if str(opts["final_eval"]).lower() in ("1", "true", "yes"):
        eval_dir = run_dir / "final_eval"
        cmd = [PY, "run.py", f"model={opts['model']}", f"model.path={model_path}", f"method={algorithm}",
               f"method.factors={prev}", "train=none", "eval=ppl_only", f"eval.lengths=[{stages[-1]}]",
               f"hydra.run.dir={eval_dir}", *common]
        steps.append({"name": "final_eval", "cmd": cmd, "done_if": ""})
    return steps


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    opts, passthrough = parse([a for a in argv if a != "--dry-run"])
    steps = plan(opts, passthrough)
    tag_dir = Path(steps[0]["cmd"][[c.startswith("hydra.run.dir=") for c in steps[0]["cmd"]].index(True)]
                   .split("=", 1)[1]).parent
    state_file = ROOT / tag_dir / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"steps": {}, "checkpoints": {}}
    for step in steps:
        line = " ".join(step["cmd"][1:])
        if step["done_if"] and (ROOT / step["done_if"]).exists() and step["name"] in state["steps"]:
            print(f"[progressive] {step['name']}: done ({step['done_if']})", flush=True)
            continue
        print(f"[progressive] {step['name']}: python {line}", flush=True)
        if dry:
            continue
        rc = subprocess.call(step["cmd"], cwd=ROOT)
        if rc != 0:
            print(f"[progressive] {step['name']} failed (exit {rc}); run the same command again to resume",
                  file=sys.stderr)
            return rc
        rec = {"command": line}
        run_json = ROOT / [c for c in step["cmd"] if c.startswith("hydra.run.dir=")][0].split("=", 1)[1] / "run.json"
        if run_json.exists():
            rec["run_id"] = json.loads(run_json.read_text())["run_id"]
        if step["name"].startswith("search"):
            fac = json.loads((ROOT / step["done_if"]).read_text())
            rec["run_id"] = fac["provenance"].get("run_id")
            rec["factors"] = step["done_if"]
        if step["name"].startswith("finetune"):
            state["checkpoints"][step["name"]] = str(Path(step["done_if"]).parent)
        state["steps"][step["name"]] = rec
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(state, indent=1))
    print(f"[progressive] state: {state_file.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
