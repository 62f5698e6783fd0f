"""Experiment tracking: wandb, offline by default (``logger=wandb``; ``logger.mode=online`` on a cluster), or none."""
from __future__ import annotations

import sys

from omegaconf import OmegaConf


class _Null:
    def log(self, key, value):
        pass

    def log_step(self, step, total, loss, tokens_per_s, lr=None):
        pass

    def finish(self, row):
        pass


class _Wandb:
    def __init__(self, cfg, row):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=cfg.logger.project, mode=cfg.logger.mode, dir=row["run_dir"],
                              name=row["run_id"], config=OmegaConf.to_container(cfg, resolve=True))

    def log(self, key, value):
        flat = {}
        for metric, v in (value or {}).items():
            if isinstance(v, dict):
                for L, x in v.items():
                    if isinstance(x, (int, float)):
                        flat[f"{key}/{metric}/{L}"] = x
        if flat:
            self.run.log(flat)

    def log_step(self, step, total, loss, tokens_per_s, lr=None):
        """One fine-tuning step: loss, learning rate and throughput, streamed as training goes."""
        m = {"train/loss": loss, "train/tokens_per_s": tokens_per_s, "train/progress": step / max(1, total)}
        if lr is not None:
            m["train/lr"] = lr
        self.run.log(m, step=step)

    def finish(self, row):
        self.run.summary["status"] = row["status"]
        self.run.finish(exit_code=0 if row["status"] == "ok" else 1)


NULL = _Null()


def finish(tracker, row) -> None:
    """Close the tracker; a tracker that fails to close (wandb's disk full, ...) costs a warning, not the row."""
    try:
        tracker.finish(row)
    except Exception as e:  # noqa: BLE001
        print(f"warning: experiment tracker did not finish cleanly: {type(e).__name__}: {e}", file=sys.stderr)


def start(cfg, row):
    if cfg.get("logger") and cfg.logger.get("name") == "wandb":
        return _Wandb(cfg, row)
    return _Null()
