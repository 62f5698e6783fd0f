"""Progress a person can watch: evaluation prompts as they finish (a bar on a terminal, periodic lines in a Slurm
log), and every fine-tuning step's loss, learning rate and tokens/s handed to the tracker (wandb)."""
from __future__ import annotations

from pathlib import Path

from harness.evals import EvalContext
from harness.report import EvalProgress, TrainProgress


def test_eval_progress_lines_off_a_terminal(tmp_path):
    lines: list[str] = []
    p = EvalProgress(every_s=0.0, terminal=False, write=lines.append)
    p.tokens = {"tokens": 2048}
    ctx = EvalContext(run_dir=Path(tmp_path), progress=p, entry="passkey")
    assert ctx.map(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]
    assert [ln.split(",")[0] for ln in lines] == [f"eval passkey: {i}/3 prompts at 2048 tokens" for i in (1, 2, 3)]
    assert "ETA" in lines[0] and "ETA" not in lines[-1]


def test_eval_progress_is_quiet_between_periods_but_says_when_a_set_ends(tmp_path):
    lines: list[str] = []
    ctx = EvalContext(run_dir=Path(tmp_path), progress=EvalProgress(every_s=3600, terminal=False, write=lines.append),
                      entry="niah")
    ctx.map(lambda x: x, range(5))
    ctx.map_blocks(lambda xs: list(xs), range(4))  # batched work (PPL windows): reported when the batch set ends
    assert [ln.split(",")[0] for ln in lines] == ["eval niah: 5/5 prompts", "eval niah: 4/4 prompts"]


def test_every_training_step_reaches_the_tracker(tmp_path):
    from tests.test_train import _args, _chunks, _single_run

    steps = []
    _single_run(tmp_path / "ck", _args(), _chunks(), progress=TrainProgress(on_step=lambda *a: steps.append(a)))
    assert [s[0] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 2
    step, total, loss, tps, lr = steps[-1]
    assert step == total and loss > 0 and tps > 0 and lr > 0
