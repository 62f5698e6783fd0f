"""Render a plain sbatch script (a Slurm job array, one task per sweep point) from the same config that
``python run.py -m <overrides> hydra/launcher=slurm_a100`` would submit through submitit: resources from
``conf/hydra/launcher/slurm_a100.yaml`` + ``conf/local/slurm.yaml``, points from the experiment's sweep.

    python scripts/render_sbatch.py experiment=paper_llama2                  # -> slurm/paper_llama2.sbatch
    python scripts/render_sbatch.py experiment=paper_llama2 --out -          # print it
    python scripts/render_sbatch.py experiment=entropy_abf hydra.launcher.timeout_min=600 --out slurm/x.sbatch

The generated script runs ``python run.py <point overrides> hydra.run.dir=<fixed per array task>`` with ``srun
--cpus-per-task=<cpus_per_task>`` on the allocation (srun >= 22.05 no longer inherits it from sbatch: its one task,
run.py and the ranks torchrun starts over the node's GPUs, would get one CPU). Requeue: ``--requeue`` (preemption) and
``--signal=B:USR1@<signal_delay_s>`` + a trap that, near the time limit, sends SIGUSR2 to run.py (its training saves a
checkpoint and stops), waits for it and calls ``scontrol requeue``; the requeued task runs in the same directory, so
its row keeps its run_id and training resumes from the newest checkpoint. The rules of a submission
(``harness.submit``) hold here too: a job's nodes are its point's ``train.nodes`` and its GPUs the point's
``train.world_size`` (one task per node: every node runs ``run.py``, ``harness.train.zero.nodes``), checkpoints under
``$HARNESS_CKPT_DIR`` or ``$SCRATCH`` (the launcher's setup line, rendered as is: the script stops at that line when
neither is set where it runs).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness import submit, sweeps
from harness.config import ConfigError
from harness.safe import UnsafeName, check_name, safe_file, sbatch_value, shell_word

ROOT = Path(__file__).resolve().parents[1]


def _time(minutes: int) -> str:
    d, m = divmod(int(minutes), 24 * 60)
    h, m = divmod(m, 60)
    return f"{d}-{h:02d}:{m:02d}:00" if d else f"{h:02d}:{m:02d}:00"


def render(overrides: list[str], name: str | None = None) -> str:
    """The sbatch script's text. Every value from a setting is quoted (``harness.safe``): a shell word with
    ``shell_word`` (the points are a ``case`` of bash arrays, ``"${POINT[@]}"``: each override arrives as one
    argument, nothing in it runs), an ``#SBATCH`` value with ``sbatch_value`` (Slurm parses those lines, not the
    shell); a value with a newline cannot be put on one line and is refused (``UnsafeName``, one line)."""
    if not any(o.startswith("hydra/launcher=") for o in overrides):
        overrides = [*overrides, "hydra/launcher=slurm_a100"]
    hydra_overrides = [o for o in overrides if o.startswith("hydra")]
    run_overrides = [o for o in overrides if not o.startswith("hydra")]
    for o in overrides:
        shell_word(o, "override")  # a newline in an override: refused before anything is composed
    jobs = sweeps.expand(overrides)
    points = [[o for o in job if not o.startswith("hydra")] for job in jobs]
    cfgs = [sweeps.compose(job, with_hydra=True) for job in jobs]  # every point must compose before rendering
    lc = OmegaConf.to_container(cfgs[0].hydra.launcher, resolve=False)
    exp = OmegaConf.select(cfgs[0], "study.experiment") or "sweep"
    name = check_name(name or exp, "the job name (--name / study.experiment)")
    try:
        submit.nodes_rule(lc, cfgs)
    except ConfigError as e:
        raise SystemExit(f"render_sbatch: {e}") from None
    gpus, n_nodes = int(lc.get("gpus_per_node") or 0), int(lc.get("nodes") or 1)
    cpus = int(OmegaConf.select(cfgs[0], "hydra.launcher.cpus_per_task") or 1)  # srun >= 22.05 does not inherit it
    setup = OmegaConf.to_container(cfgs[0].hydra.launcher, resolve=True).get("setup") or []
    out_dir = f"{cfgs[0].paths.output_dir}/slurm/{name}"
    sb = [("job-name", name), ("nodes", n_nodes), ("ntasks-per-node", 1), ("gpus-per-node", gpus),
          ("cpus-per-task", cpus), ("mem", f"{lc.get('mem_gb')}G"), ("time", _time(lc["timeout_min"]))]
    site = []
    for key in ("partition", "account", "qos", "constraint"):
        if lc.get(key):
            sb.append((key, lc[key]))
        else:
            site.append(f"##SBATCH --{key}=   # not set: conf/local/slurm.yaml (or sbatch --{key}=...)")
    for k, v in (lc.get("additional_parameters") or {}).items():
        if k == "requeue":
            continue  # always rendered below
        sb.append((check_name(str(k), "hydra.launcher.additional_parameters key").replace("_", "-"), v))
    sb += [("array", f"0-{len(points) - 1}%{lc.get('array_parallelism', 16)}"), ("requeue", True),
           ("signal", f"B:USR1@{lc.get('signal_delay_s', 120)}"), ("open-mode", "append"),
           ("output", f"{out_dir}/%A_%a.out")]
    directives = [f"#SBATCH --{k}" + ("" if v is True else "=" + sbatch_value(v, f"#SBATCH --{k}")) for k, v in sb]
    cmd_line = "python run.py -m " + " ".join(shell_word(o) for o in run_overrides + hydra_overrides)
    # hydra.run.dir as one Hydra quoted string (spaces, parentheses and $ are Hydra syntax too), one shell word
    hydra_dir = "hydra.run.dir='" + re.sub(r"(\\+)(?=')", r"\1\1", out_dir).replace("'", "\\'") + "/"
    lines = [
        "#!/bin/bash",
        f"# Generated by scripts/render_sbatch.py from the config of: {cmd_line}",
        "# (conf/hydra/launcher/slurm_a100.yaml + conf/local/slurm.yaml). Re-render instead of editing.",
        f"#   sbatch {name}.sbatch                 # every point ({len(points)} array tasks)",
        f"#   sbatch --array=3 {name}.sbatch       # one point (index into the case below)",
        f"# Submit from the repository root, with the project's Python first on PATH, after: mkdir -p "
        f"{shell_word(out_dir, 'paths.output_dir')}",
        *directives,
        *site,
        "set -euo pipefail",
        "",
        "# one point per array task, each override one argument (quoted: nothing in a setting runs as shell text)",
        'case "$SLURM_ARRAY_TASK_ID" in',
        *[f"  {i}) POINT=({' '.join(shell_word(o, 'override') for o in p)}) ;;" for i, p in enumerate(points)],
        '  *) echo "no point $SLURM_ARRAY_TASK_ID in this array (0-' + str(len(points) - 1) + ')" >&2; exit 2 ;;',
        "esac",
        *[str(s) for s in setup],
        "# near the time limit: USR2 to run.py (through srun), whose training ranks save a checkpoint and stop",
        "# (harness/train/deepspeed_engine.py, Preemption); then requeue. A preemption's SIGTERM does the same.",
        "trap 'echo \"$(date): time limit near: saving, then requeueing\"; kill -USR2 \"$SRUN_PID\" || true; "
        "wait \"$SRUN_PID\" || true; scontrol requeue \"$SLURM_JOB_ID\"; exit 0' USR1",
        "# the training inside run.py is the distributed engine's: torchrun --nproc_per_node=train.world_size / "
        "train.nodes on each node",
        "# (one run.py per node: node 0 writes the row). One run directory per array task, the same",
        "# after a requeue: the row keeps its run_id, training resumes from its newest checkpoint (keyed by config",
        "# fingerprint under paths.ckpt_dir).",
        f'srun --ntasks={n_nodes} --ntasks-per-node=1 --cpus-per-task={cpus} --gpus-per-node={gpus} '
        'python run.py "${POINT[@]}" '
        + shell_word(hydra_dir) + '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\'" &',
        "SRUN_PID=$!",
        'wait "$SRUN_PID"',
        "",
    ]
    return "\n".join(lines)


def _bad_override(overrides: list[str]) -> str:
    """``"<override>: "`` for the first override Hydra's grammar refuses, else ``""``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except HydraException:
            return f"{o}: "
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="+", help="run.py overrides, e.g. experiment=paper_llama2")
    ap.add_argument("--out", default=None, help="output file (default slurm/<experiment>.sbatch; - = stdout)")
    ap.add_argument("--name", default=None, help="job name (default: the experiment)")
    a = ap.parse_args(argv)
    try:
        text = render(a.overrides, a.name)
    except UnsafeName as e:  # a value no generated line can carry: one line, nothing written
        raise SystemExit(f"render_sbatch: {e}") from None
    except (HydraException, OmegaConfBaseException, ConfigError) as e:  # an override that does not parse or compose
        print(f"render_sbatch: {_bad_override(a.overrides) or ''}{str(e).strip().splitlines()[0]} (nothing written)",
              file=sys.stderr)
        raise SystemExit(2) from None
    if a.out == "-":
        sys.stdout.write(text)
        return 0
    name = a.name or next((o.split("=", 1)[1] for o in a.overrides if o.startswith("experiment=")), "sweep")
    out = Path(a.out) if a.out else safe_file(ROOT / "slurm", name, ".sbatch", "the job name")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
