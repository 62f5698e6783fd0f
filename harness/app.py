"""The Hydra app of one run: model x method x data x train x eval -> one results row (``python run.py``, ``harness
run``, every Slurm job; ``run.py`` in the checkout is a thin front for :func:`cli`).

Table of contents: start the row (``harness.lifecycle``) -> the stages, ``harness.api.run`` (the library's
``api.evaluate`` and every sharded job run the same): check every group and build the suite once, estimate the run's
cost and refuse one beyond ``cost.limit_s`` -> load the model and apply the method -> fine-tune if the train config
says so -> run every unit of the suite's evaluation plan -> finish the row. A failure anywhere finishes the row as
``failed`` with a one-line error and exits non-zero; whatever was already measured stays in the row.

It is the library's app and needs nothing else installed. An installed package adds to it through entry points: its
configs (the group ``harness.conf``: the controlled study's sweep points and experiments, ``controlled_study/conf``)
and the lines of the evaluation table wandb logs at the end (the group ``harness.table_lines``: the controlled
study's ``make export`` lines, ``controlled_study.export.flatten``; none installed: no table). The config tree is the
library's ``conf/`` (``harness.conf_utils.CONF_DIR``), and the job is named ``run`` (its log, ``run.log``, and what
``python run.py`` always named it).
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from harness import api, lifecycle, precheck, report, shards, tracking
from harness.conf_utils import CONF_DIR, installed_table_lines
from harness.train import Terminated
from harness.train.zero import nodes
from harness.train.zero.launch import follow


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        precheck.resolve_model(cfg)  # model=hub: a missing or wrong checkpoint is one line before anything starts
        node = nodes.role(cfg)  # train.nodes > 1: this node's place; a Slurm step of the wrong size is refused
    except Exception as e:  # noqa: BLE001 - one line, a failed row, exit 2
        precheck.refuse_in_job(e)
    if node is not None and node.follower:  # another node than node 0: join its training, no row, no evaluation
        sys.exit(follow(cfg, node, hydra.core.hydra_config.HydraConfig.get().runtime.output_dir))
    if cfg.get("shard") is not None:  # sharded evaluation (+shard=...): jobs that share one row, harness/shards.py
        return _sharded(cfg)
    lifecycle.raise_on_sigterm()                                                  # kill / Slurm -> a failed row
    try:
        run = lifecycle.start(cfg, run_dir=hydra.core.hydra_config.HydraConfig.get().runtime.output_dir)
    except OSError as e:  # the results or the run directory refuses the row: no run without a record
        line = lifecycle.start_failed(cfg, e)
        print(f"run failed: {line}", file=sys.stderr)
        lifecycle.exit_failed(line)
    row = run.row
    tracker = tracking.NULL
    try:
        tracker = tracking.start(cfg, row, table_lines=installed_table_lines())  # wandb: an installed table
        api.run(cfg, run, on_result=tracker.log,  # 0. check + cost, 1. model + method, 2. fine-tune, 3. evaluate
                train_progress=report.TrainProgress(on_step=tracker.log_step), eval_progress=report.EvalProgress())
        problem = run.finish()                                                    # 4. the row
        if problem:
            raise OSError(f"the finished row could not be written: {problem}")
    except (Exception, KeyboardInterrupt, Terminated) as e:  # noqa: BLE001 - every failure: a failed row
        line = run.fail(e)
        print(f"run failed: {line}", file=sys.stderr)
        report.print_summary(row)  # what was measured before the failure is never lost, even when unwritable
        tracking.finish(tracker, row)
        lifecycle.exit_failed(line, stop_sweep=not isinstance(e, Exception))  # a kill or Ctrl-C ends a sweep too
    tracking.finish(tracker, row)
    report.print_summary(row)
    for line in (report.convergence_line(row), report.versus_base(row, run.results_dir)):
        if line:
            report.out.print(line, soft_wrap=True)
    report.out.print(f"row: {run.path}", soft_wrap=True)


def _sharded(cfg: DictConfig) -> None:
    try:
        row = shards.run(cfg, log=lambda m: print(m, flush=True))
    except Exception as e:  # noqa: BLE001
        print(f"run failed: {lifecycle.one_line(e)}", file=sys.stderr)
        lifecycle.exit_failed(lifecycle.one_line(e))
    print(f"row ({row['status']}): {lifecycle.results_dir(cfg)}/runs/{row['run_id']}.json")


def cli(argv: list[str] | None = None) -> int:
    """one run (or -m, a sweep): model x method x data x train x eval -> one results row.

    ``argv``: the command line after the program (Hydra's overrides and flags; default ``sys.argv[1:]``), which
    Hydra reads from ``sys.argv``. A sweep's jobs are composed and checked before launch (or submitted to Slurm)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    sys.argv = [sys.argv[0] if sys.argv else "run.py", *argv]
    precheck.precheck_or_exit(argv)  # a sweep: every job composed and checked before launch (or submitted)
    lifecycle.run_guarded(main, argv,  # failures outside a run's try: one line + a failed row
                          on_config_error=precheck.config_refusal(argv))
    return 0
