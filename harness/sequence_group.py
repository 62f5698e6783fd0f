"""Sequence parallelism's process-wide state, at the ground floor: the group whose ranks each hold one slice of the
sequence (``train.sequence_parallel``; set by ``harness.train.zero.sequence.setup``, None otherwise), and the
facts a slice cannot see on its own.

Under Ulysses sequence parallelism each rank runs the embedding, the rotary module and the MLPs on its own
``L / N`` tokens; only attention sees the whole sequence (after DeepSpeed's all-to-all). A RoPE whose frequencies
depend on the sequence length (LongRoPE's short/long switch, Dynamic NTK, CLEX's training scale) must therefore ask
the group for the length: a rank's own ``max(position_ids) + 1`` is the length of the prefix up to its slice (rank
0 of 2 at 2C sees C and would pick LongRoPE's short factors). :func:`global_length` is that question, one
``all_reduce(MAX)`` of one integer per rotary call, on the positions' device (NCCL: the GPU)."""
from __future__ import annotations

import torch
import torch.distributed as dist

_GROUP = None


def set_sequence_group(group) -> None:
    """The sequence-parallel process group of this rank (None: every rank holds its whole sequence)."""
    global _GROUP
    _GROUP = group


def sequence_group():
    return _GROUP


def sequence_world() -> int:
    return 1 if _GROUP is None else dist.get_world_size(_GROUP)


def sequence_rank() -> int:
    return 0 if _GROUP is None else dist.get_rank(_GROUP)


def global_length(position_ids: torch.Tensor) -> int:
    """``max(position_ids) + 1`` over the whole sequence: this rank's slice, and with a sequence-parallel group
    every slice of it (the group's maximum)."""
    n = position_ids.max().reshape(1).to(torch.int64) + 1
    if _GROUP is not None:
        dist.all_reduce(n, op=dist.ReduceOp.MAX, group=_GROUP)
    return int(n.item())


def global_tokens(local: int) -> int:
    """The number of tokens of the whole sequence whose slice on this rank has ``local`` tokens (slices are equal:
    ``harness.train.zero.sequence`` refuses a length the group does not divide)."""
    return local * sequence_world()


def slice_offset(local: int) -> int:
    """Index of this rank's first token in the whole sequence (slices of ``local`` tokens, in rank order)."""
    return local * sequence_rank()


def agreed(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the group's first rank holds it (a broadcast; ``t`` itself without a group): a random draw every
    slice of one sequence must share (CLEX's training scale and positions)."""
    if _GROUP is None:
        return t
    dist.broadcast(t, src=dist.get_global_rank(_GROUP, 0), group=_GROUP)
    return t
