"""torchrun entry of ``tests/test_sequence_parallel.py`` (2 gloo ranks): for every method of the spec, one
micro-batch's loss and gradients on one rank's whole sequence (all of them first, before DeepSpeed's attention
wrapper exists in this process), then with ``train.sequence_parallel=2`` through the engine's own parts
(``harness.train.zero.sequence``: setup, shard, tiled loss; ``micro_step``), the gradients averaged over the ranks
as ZeRO-3's reduce-scatter averages them (the engine test in the same file runs ZeRO-3 itself), and once more with
each rank's own length. Rank 0 writes ``<out_dir>/sp.json``: per method the losses, the largest gradient
differences and the rows of every LM-head call."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from harness.config import to_args
from harness.methods import build_method
from harness.models import build_model
from harness.sequence_group import set_sequence_group
from harness.train import TrainArgs
from harness.train.step import micro_step
from harness.train.zero import sequence


def built(cfg, name):
    torch.manual_seed(0)
    method = build_method(cfg.methods[name])
    handle = build_model(cfg.model)
    method.apply(handle)
    method.train_mode(handle)
    handle.model.train()
    return handle.model, method


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    cfg = OmegaConf.create(spec["config"])
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    a = to_args(TrainArgs, cfg.train, "train")
    a.validate()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 4000, (a.micro_batch, a.seq_len), generator=g)
    whole = {}
    for name in cfg.methods:  # one rank, the whole sequence: before any wrapper exists
        model, method = built(cfg, name)
        batch = method.train_batch(ids)
        torch.manual_seed(7)  # CLEX draws its training scale and positions: the same draw in every pass
        loss = micro_step(model, batch, 2, "float32")
        whole[name] = (float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    out = {}
    for name in cfg.methods:
        model, method = built(cfg, name)
        sp = sequence.setup(model, a, method)
        rows = []
        model.get_output_embeddings().register_forward_hook(lambda m, i, o, r=rows: r.append(o.shape[:-1].numel()))
        part = sp.shard(method.train_batch(ids))
        torch.manual_seed(7)
        loss = micro_step(model, part, 2, "float32", loss_fn=sp.loss).reshape(1)
        dist.all_reduce(loss, group=sp.group)
        diff, scale, worst = 0.0, 0.0, None
        for n, p in model.named_parameters():
            if p.grad is None:
                continue
            dist.all_reduce(p.grad, group=sp.group)  # ZeRO-3's reduce-scatter: the average over every rank
            p.grad /= dist.get_world_size()
            ref = whole[name][1][n]
            d = float((p.grad - ref).abs().max())
            worst = n if d > diff else worst
            diff, scale = max(diff, d), max(scale, float(ref.abs().max()))
        head_rows = list(rows)
        model.zero_grad(set_to_none=True)
        set_sequence_group(None)  # each rank's own length: the mistake the group's length exists to prevent
        torch.manual_seed(7)
        own = micro_step(model, part, 2, "float32", loss_fn=sp.loss).reshape(1)
        set_sequence_group(sp.group)
        dist.all_reduce(own, group=sp.group)
        own_diff = 0.0
        for n, p in model.named_parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=sp.group)
                p.grad /= dist.get_world_size()
                own_diff = max(own_diff, float((p.grad - whole[name][1][n]).abs().max()))
        out[name] = {"whole": whole[name][0], "split": float(loss), "grad_max_diff": diff, "grad_max": scale,
                     "worst": worst,
                     "split_own_length": float(own), "own_length_grad_diff": own_diff, "head_rows": head_rows,
                     "slice_tokens": part["input_ids"].numel(),
                     "grads": sorted(whole[name][1]) == sorted(n for n, p in model.named_parameters()
                                                                if p.grad is not None)}
    if dist.get_rank() == 0:
        Path(spec["out_dir"], "sp.json").write_text(json.dumps(out, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
