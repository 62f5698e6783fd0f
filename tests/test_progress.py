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
    # the first prompt of a set at once (a log shows the evaluator started), then quiet until the set ends
    assert [ln.split(",")[0] for ln in lines] == ["eval niah: 1/5 prompts", "eval niah: 5/5 prompts",
                                                  "eval niah: 4/4 prompts"]


def test_every_training_step_reaches_the_tracker(tmp_path):
    from tests.test_train import _args, _chunks, _single_run

    steps = []
    _single_run(tmp_path / "ck", _args(), _chunks(), progress=TrainProgress(on_step=lambda *a: steps.append(a)))
    assert [s[0] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 2
    step, total, loss, tps, lr = steps[-1]
    assert step == total and loss > 0 and tps > 0 and lr > 0


def test_printed_times_include_the_first_prompt():
    """The clock of an entry starts when the entry starts (``begin``), not when its first prompt ends: a set of one
    slow prompt (a PPL length scored in one batch) says how long it took, not "0 s" (the old lines)."""
    import time

    lines: list[str] = []
    p = EvalProgress(every_s=3600, terminal=False, write=lines.append)
    p.begin("ppl_books")
    time.sleep(0.3)
    p("ppl_books", 1, 1)            # the whole first length in one batch
    time.sleep(0.2)
    p("ppl_books", 1, 1)            # the next length: its clock starts where the first ended
    secs = [float(ln.rsplit(", ", 1)[1].removesuffix(" s")) for ln in lines]
    assert len(secs) == 2 and 0.25 <= secs[0] < 1.0 and 0.15 <= secs[1] < 0.3, lines


def test_training_lines_off_a_terminal_first_step_then_a_cadence(capsys):
    import time

    p = TrainProgress(terminal=False, every_s=0.2)
    assert p.p is None                                   # no rich live display in a pipe
    for step in range(1, 7):
        p(step, 6, 2.0 - step * 0.1, 1000.0, 1e-3)
        time.sleep(0.05)
    err = [ln for ln in capsys.readouterr().err.splitlines() if "fine-tune: step" in ln]
    assert err[0].endswith("fine-tune: step 1/6, loss 1.900, 1000 tok/s, lr 1.00e-03, 0 s")
    assert "step 6/6" in err[-1] and 2 <= len(err) < 6   # the first, one per 0.2 s, the last
