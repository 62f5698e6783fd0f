"""Fine-tuning: the paper's recipe (Table 7 / Section 4) as one typed config, one step function, two engines.

- ``harness.train.step``: the step shared by both engines (forward, loss, backward with accumulation).
- ``harness.train.loop``: single-process engine (this CPU, quick runs): AdamW, linear warm-up, EMA, atomic
  resumable checkpoints.
- ``harness.train.deepspeed_engine``: multi-process ZeRO-3 engine launched with torchrun (CPU gloo or GPU nccl).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.config import AUTOCAST, ConfigError

SCHEDULES = ("constant_with_warmup", "linear", "cosine")  # after the linear warm-up (harness.train.step.lr_lambda)


class Terminated(BaseException):
    """SIGTERM (Slurm preemption or time limit, ``kill``): raised in the main thread so the row ends ``failed``
    (``harness.lifecycle.raise_on_sigterm``). A ``BaseException``: a kill ends a sweep too."""


class Preempted(Terminated):
    """The distributed engine stopped on SIGUSR2 / SIGTERM after saving a resumable checkpoint (the message names
    its step); the requeued job resumes from it (``harness.train.deepspeed_engine``)."""


@dataclass
class TrainArgs:
    name: str = "none"
    enabled: bool = False  # false = frozen method, no fine-tuning
    engine: str = "single"  # single | deepspeed
    seq_len: int = 0  # training length in tokens (paper: 32768; tiny: 2048 = 8C)
    tokens: int = 0  # tokens to train on (paper: 1B; 2B for NTK-64K-2B)
    global_batch: int = 32  # sequences per optimizer step = micro_batch x grad accumulation x world size
    micro_batch: int = 1
    world_size: int = 1  # ranks for the deepspeed engine, all nodes together
    # deepspeed engine: nodes the ranks are spread over, world_size / nodes each (one launcher per node, the same
    # run.py on every node; harness.train.zero.nodes); the same batches and weights as one node of world_size ranks
    nodes: int = 1
    # deepspeed engine: ranks that share one sequence (DeepSpeed Ulysses: each holds seq_len / N tokens, attention
    # head-parallel); world_size / N sequences in parallel (harness.train.zero.sequence)
    sequence_parallel: int = 1
    logits_tile_mib: int = 256  # sequence_parallel > 1: the LM head's fp32 logits per loss tile (TiledFusedLogitsLoss)
    mlp_tiles: int = 1  # deepspeed engine: each MLP in this many pieces along the sequence (DeepSpeed's TiledMLP)
    lr: float = 2e-5
    schedule: str = "constant_with_warmup"  # constant_with_warmup | linear | cosine (after the linear warm-up)
    warmup_steps: int = 20
    weight_decay: float = 0.0
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    ema: bool = True  # evaluate the EMA of the weights (paper; absent from its code release)
    ema_decay: float = 0.99  # constant decay (paper recipes; docs/ema.md)
    # divide out the base model's share d^t of the average (harness.train.ema); false: the committed tiny rows'
    # behaviour (and config hash), true in the paper recipes
    ema_bias_correction: bool = False
    autocast: str = "auto"  # auto | bfloat16 | float32
    grad_checkpointing: bool = False
    zero_stage: int = 3  # deepspeed engine
    offload: bool = False  # deepspeed: offload optimizer + params to CPU
    # deepspeed engine: auto (torch AdamW as client optimizer, fused on GPU; DeepSpeed's CPU Adam with offload)
    # | torch | deepspeed (DeepSpeed's JIT-compiled AdamW: FusedAdam on GPU); see deepspeed_engine.optimizer_kind
    optimizer: str = "auto"
    doc_masking: bool = False  # position_ids restart at every BOS, attention never crosses a document boundary
    save_every: int = 50  # steps between resumable checkpoints (0 = none)
    # single engine: also a checkpoint once this many seconds passed since the last one (0 = steps only): a GPU window
    # that is cut off loses at most that much training (the deepspeed engine saves by steps only: a clock-based save
    # there would need every rank to agree on it every step)
    save_every_s: float = 0.0
    keep_checkpoints: bool = False  # keep the resumable checkpoints of a finished run (default: removed)
    max_steps: int = 0  # cap on optimizer steps (0 = tokens / (global_batch x seq_len))
    convergence_check: bool = True  # measure base and fine-tuned model inside C (harness.evals.convergence)
    log_every: int = 5
    seed: int = 0

    def steps(self) -> int:
        n = self.tokens // (self.global_batch * self.seq_len) if self.seq_len > 0 else 0
        return min(n, self.max_steps) if self.max_steps else n

    def data_parallel(self) -> int:
        """Sequences in flight at once: the ranks over the ranks that share one sequence."""
        return max(1, self.world_size // max(1, self.sequence_parallel))

    def accumulation(self) -> int:
        per = self.micro_batch * self.data_parallel()
        if self.global_batch % per:
            sp = f" / sequence_parallel {self.sequence_parallel}" if self.sequence_parallel > 1 else ""
            raise ConfigError(f"train: global_batch {self.global_batch} is not a multiple of micro_batch x "
                              f"world_size{sp} = {per}")
        return self.global_batch // per

    def _deepspeed_count(self, key: str, what: str, off: bool, why: str) -> int:
        """``train.<key>``: an integer >= 1 (``off``: 1 means off), above 1 only with the deepspeed engine."""
        v = getattr(self, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            valid = "an integer >= 1; 1 = off" if off else "an integer >= 1"
            raise ConfigError(f"train.{key}: {v!r} is not a {what} (valid: {valid})")
        if v > 1 and self.engine != "deepspeed":
            raise ConfigError(f"train.{key}={v} needs train.engine=deepspeed ({why})")
        return v

    def check_nodes(self) -> None:
        n = self._deepspeed_count("nodes", "node count", False, "the single engine runs in this process")
        if self.world_size % n:
            raise ConfigError(f"train.nodes={n} does not divide train.world_size={self.world_size} (every node "
                              f"starts the same number of ranks; valid: a divisor of the ranks)")

    def check_mlp_tiles(self) -> None:
        self._deepspeed_count("mlp_tiles", "tile count", True, "DeepSpeed's TiledMLP")

    def check_sequence_parallel(self) -> None:
        sp = self._deepspeed_count("sequence_parallel", "rank count", True, "the single engine has one rank")
        if sp == 1:
            return
        if self.world_size % sp:
            raise ConfigError(f"train.sequence_parallel={sp} does not divide train.world_size={self.world_size} "
                              f"(valid: a divisor of the ranks)")
        per = self.world_size // max(1, self.nodes)
        if self.nodes > 1 and per % sp:
            raise ConfigError(f"train.sequence_parallel={sp} does not divide the {per} ranks of a node "
                              f"(train.world_size={self.world_size} over train.nodes={self.nodes}): a sequence's "
                              f"all-to-all would cross nodes; valid: a divisor of {per}")
        if self.seq_len % sp:
            raise ConfigError(f"train.sequence_parallel={sp} does not divide train.seq_len={self.seq_len} (every "
                              f"rank holds an equal slice; valid: a divisor of the training length)")

    def validate(self) -> None:
        if not self.enabled:
            return
        if self.seq_len <= 0:
            raise ConfigError(f"train={self.name}: seq_len must be positive, got {self.seq_len}")
        for key, value, valid in (("global_batch", self.global_batch, "an integer >= 1 (sequences per step)"),
                                  ("save_every", self.save_every, "an integer >= 0 (steps; 0 = no checkpoints)"),
                                  ("save_every_s", self.save_every_s, "a number >= 0 (seconds; 0 = by steps only)"),
                                  ("weight_decay", self.weight_decay, "a number >= 0"),
                                  ("tokens", self.tokens, "an integer >= 1")):
            low = 1 if key in ("global_batch", "tokens") else 0
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low or \
                    (isinstance(value, float) and not math.isfinite(value)):
                raise ConfigError(f"train.{key}: {value!r} is not {valid}")
        if self.steps() < 1:
            raise ConfigError(f"train={self.name}: {self.tokens} tokens is less than one step of "
                              f"{self.global_batch} x {self.seq_len}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"train={self.name}: unknown schedule {self.schedule!r} (valid: {', '.join(SCHEDULES)})")
        if self.autocast not in AUTOCAST:
            raise ConfigError(f"train={self.name}: unknown autocast {self.autocast!r} (valid: {', '.join(AUTOCAST)})")
        if self.warmup_steps < 0 or not self.lr > 0 or self.micro_batch < 1 or self.world_size < 1:
            raise ConfigError(f"train={self.name}: need warmup_steps >= 0, lr > 0, micro_batch >= 1, world_size >= 1 "
                              f"(got {self.warmup_steps}, {self.lr}, {self.micro_batch}, {self.world_size})")
        if self.engine not in ("single", "deepspeed"):
            raise ConfigError(f"train={self.name}: unknown engine {self.engine!r} (single | deepspeed)")
        if self.engine == "deepspeed" and self.optimizer not in ("auto", "torch", "deepspeed"):
            raise ConfigError(f"train={self.name}: unknown optimizer {self.optimizer!r} (auto | torch | deepspeed)")
        self.check_nodes()
        self.check_mlp_tiles()
        self.check_sequence_parallel()
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train={self.name}: ema_decay must be in [0, 1), got {self.ema_decay}")
        self.accumulation()
