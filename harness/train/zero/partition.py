"""ZeRO-3's partitions as the DeepSpeed engine reads them: this rank's piece of a parameter (the EMA's ``local``:
each rank averages its own partition, ``harness.train.ema.EMA``) and the full tensor gathered from every rank's
piece (the final weights)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def partition(p: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a parameter: its ZeRO-3 partition, or the whole tensor when not partitioned (the EMA's
    ``local``)."""
    t = getattr(p, "ds_tensor", None)
    return t if t is not None else p.data


def gather_full(p: torch.Tensor, local: torch.Tensor, dev) -> torch.Tensor:
    """The full tensor of parameter ``p`` from every rank's partition ``local`` (ZeRO-3 partitions are contiguous
    slices of the flattened parameter, in rank order, padded at the end)."""
    if getattr(p, "ds_tensor", None) is None:
        return local
    flat = local.reshape(-1).to(dev).contiguous()
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, flat)
    return torch.cat(parts).narrow(0, 0, p.ds_numel).view(p.ds_shape)  # the padding at the end dropped
