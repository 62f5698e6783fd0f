"""Experiment tracking: wandb, offline by default (``logger=wandb``; ``logger.mode=online`` on a cluster), or none.

What a wandb run holds:

- grouped by sweep (``group``: ``logger.group``, else the Hydra sweep's directory name for a ``-m`` sweep, else the
  study, ``study.experiment``; a single run of no study has none) and tagged ``model:<m>``, ``method:<m>``,
  ``train:<t>``, ``eval:<suite>``, so a sweep's runs can be filtered and compared in the UI;
- fine-tuning on the training-step axis (``train/loss``, ``train/lr``, ``train/tokens_per_s``, ``train/progress``);
- evaluation results on their own axis, the evaluation length (``eval/length``; never the training step): each
  evaluator's per-length metrics as ``eval/<entry>/<metric>``;
- at the end, ``eval/results``: a table with one line per entry x metric x length, with its 95% interval and its
  sample size, the lines of ``make export`` (``table_lines``: ``controlled_study.export.flatten``, handed in by
  ``run.py``), and the row's status in the summary.
"""
from __future__ import annotations

import sys

from omegaconf import OmegaConf

# the columns of the evaluation table (a subset of the export's, controlled_study/export.py)
TABLE_COLUMNS = ("entry", "evaluator", "metric", "axis", "x", "length", "length_over_c", "value", "ci_low", "ci_high",
                 "n")


class _Null:
    def log(self, key, value):
        pass

    def log_step(self, step, total, loss, tokens_per_s, lr=None):
        pass

    def finish(self, row):
        pass


def tags(row: dict) -> list[str]:
    """``model:<m>``, ``method:<m>``, ``train:<t>``, ``eval:<suite>`` of a row."""
    return [f"{g}:{row.get(g)}" for g in ("model", "method", "train", "eval") if row.get(g)]


def group(cfg) -> str | None:
    """The wandb group of a run: ``logger.group``, else its Hydra sweep (the sweep directory's name, one per ``-m``
    launch), else its study (``study.experiment``), else None."""
    explicit = OmegaConf.select(cfg, "logger.group", default=None)
    if explicit:
        return str(explicit)
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            from pathlib import Path

            return Path(str(HydraConfig.get().sweep.dir)).name or None
    except (ImportError, ValueError):
        pass
    study = OmegaConf.select(cfg, "study.experiment", default=None)
    return str(study) if study else None


class _Wandb:
    def __init__(self, cfg, row, table_lines=None):
        import wandb

        self.wandb = wandb
        self.table_lines = table_lines
        self.table = None
        self.run = wandb.init(project=cfg.logger.project, mode=cfg.logger.mode, dir=row["run_dir"],
                              name=row["run_id"], group=group(cfg), tags=tags(row),
                              job_type="fine-tune" if row.get("train") not in (None, "none") else "evaluate",
                              config=OmegaConf.to_container(cfg, resolve=True))
        self.run.define_metric("train/*", step_metric="train/step")
        self.run.define_metric("eval/length")
        self.run.define_metric("eval/*", step_metric="eval/length")

    def log(self, key, value):
        """One evaluator's output: its per-length metrics, on the evaluation-length axis."""
        by_length: dict = {}
        for metric, v in (value or {}).items():
            if isinstance(v, dict):
                for L, x in v.items():
                    if isinstance(x, (int, float)) and not isinstance(x, bool) and str(L).isdigit():
                        by_length.setdefault(int(L), {})[f"eval/{key}/{metric}"] = x
        for L in sorted(by_length):
            self.run.log({"eval/length": L, **by_length[L]})

    def log_step(self, step, total, loss, tokens_per_s, lr=None):
        """One fine-tuning step: loss, learning rate and throughput, streamed as training goes."""
        m = {"train/step": step, "train/loss": loss, "train/tokens_per_s": tokens_per_s,
             "train/progress": step / max(1, total)}
        if lr is not None:
            m["train/lr"] = lr
        self.run.log(m)

    def finish(self, row):
        if self.table_lines is not None and row.get("metrics"):
            lines = self.table_lines(row)
            self.table = self.wandb.Table(columns=list(TABLE_COLUMNS),
                                          data=[[ln.get(c) for c in TABLE_COLUMNS] for ln in lines])
            self.run.log({"eval/results": self.table})
        self.run.summary["status"] = row["status"]
        self.run.finish(exit_code=0 if row["status"] == "ok" else 1)


NULL = _Null()


def finish(tracker, row) -> None:
    """Close the tracker; a tracker that fails to close (wandb's disk full, ...) costs a warning, not the row."""
    try:
        tracker.finish(row)
    except Exception as e:  # noqa: BLE001
        print(f"warning: experiment tracker did not finish cleanly: {type(e).__name__}: {e}", file=sys.stderr)


def start(cfg, row, table_lines=None):
    """The run's tracker (``logger=wandb``) or a no-op. ``table_lines(row)``: the lines of its evaluation table."""
    if cfg.get("logger") and cfg.logger.get("name") == "wandb":
        return _Wandb(cfg, row, table_lines)
    return _Null()
