"""Ulysses sequence parallelism for the DeepSpeed engine (``train.sequence_parallel=N``), through DeepSpeed's own
implementation (``deepspeed.runtime.sequence_parallel.ulysses_sp``): the ranks of one group each hold ``seq_len / N``
tokens of the same sequence; DeepSpeed's attention wrapper swaps the split from tokens to heads around every
attention call (two all-to-alls, ``deepspeed::dim_zero_all_to_all``), so each rank attends over the whole sequence
with ``heads / N`` heads, and everything else (embedding, RoPE, MLPs, the loss) runs on the rank's slice.

What this module adds to DeepSpeed's parts, and why:

- **The slice** (:func:`SequenceParallel.shard`): the layout of DeepSpeed's ``UlyssesSPDataLoaderAdapter``: labels
  shifted on the whole sequence first (a slice's last token predicts the next slice's first), then input ids,
  position ids and shifted labels cut in rank order. Not the adapter itself: every rank reads the same
  memory-mapped cache (``batches_for_step``), so the rank of a group read the sequence its data-parallel index
  names and cut its slice, with no gather of the batch to every rank (the adapter's round trip). The sequences of a
  step are those of a run with ``world_size / N`` ranks and the same global batch (the same tokens).
- **The loss** (:func:`SequenceParallel.loss`): the decoder's hidden states of the slice through the LM head in
  tiles (DeepSpeed's ``TiledFusedLogitsLoss``; a tile's fp32 logits stay under ``train.logits_tile_mib``), summed
  and divided by the whole micro-batch's count of predicted tokens: the group's shares add up to the sequence's
  mean loss. ZeRO-3's gradient reduce-scatter (DeepSpeed 0.19, ``reduce_scatter: true``, its default, pinned in
  the JSON) averages over all W ranks, not over the W / N sequences, so each rank back-propagates N times its share
  (ArcticTraining gets the same factor from the backward of an all-gather of the losses); the reported loss is the
  share. Measured: without the factor every gradient is exactly 1 / N of the one-rank gradient. ZeRO stages 1-2
  scale by the data-parallel size instead, so sequence parallelism is refused there. No rank materialises
  ``[seq_len, vocab]`` logits.
- **The length** (``harness.sequence_group``): a RoPE that depends on the sequence length asks the group for it.
- **The attention function**: DeepSpeed wraps the one the model uses (``register_with_transformers`` refuses any
  other); a stock implementation (sdpa) is switched to ``harness_causal`` when the batches restart positions
  (``train.doc_masking``, a method whose ``restarts_positions`` is set), since DeepSpeed's wrapper drops the
  attention mask and ``harness_causal`` reads the documents from the gathered position ids.

Refused, one line each (:func:`check`): a method whose attention depends on the head index or that changes the
token sequence (its ``sequence_parallel`` fact says why), a head count the group does not divide, a KV head count
neither divides the other (DeepSpeed's rule). ``register_with_transformers`` replaces the attention function
process-wide and its groups are global: one per process (the ranks are processes of their own)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from harness.config import ConfigError
from harness.methods.flex import CAUSAL_NAME, STOCK
from harness.sequence_group import set_sequence_group

IGNORE = -100  # the label of a token no loss is taken on (transformers' and DeepSpeed's)
_REGISTERED: list = []  # [setting, DeepSpeed's parallel state] once this process wrapped its attention function


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check(a, method, config=None) -> None:
    """Refuse what sequence parallelism cannot train (``a``: TrainArgs; ``config``: the checkpoint's transformers
    config, or the model YAML's ``shape``, or None when neither is known here): one ConfigError line naming the
    reason and the valid values."""
    sp = a.sequence_parallel
    if sp == 1 or not a.enabled:
        return
    where = f"train.sequence_parallel={sp}"
    if a.zero_stage != 3:
        raise ConfigError(f"{where} needs train.zero_stage=3 (stages 1-2 scale the gradients of a split sequence "
                          f"differently; got {a.zero_stage})")
    reason = getattr(method, "sequence_parallel", "")
    if reason:
        raise ConfigError(f"{where}: method={method.name} {reason} (valid: sequence_parallel=1)")
    if not config:
        return
    if hasattr(config, "get") and "heads" in config:  # a model YAML's ``shape`` (the plan's, no checkpoint here)
        heads = int(config["heads"])
        kv = int(config.get("kv_heads") or heads)
    else:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(text.num_attention_heads)
        kv = int(getattr(text, "num_key_value_heads", None) or heads)
    if heads % sp:
        raise ConfigError(f"{where}: the model's {heads} attention heads do not split over {sp} ranks (each rank "
                          f"attends with heads / N of them; valid: one of {divisors(heads)})")
    if kv % sp and sp % kv:
        raise ConfigError(f"{where}: the model's {kv} KV heads and {sp} ranks do not divide one another (DeepSpeed "
                          f"splits or replicates KV heads; valid: one of "
                          f"{[d for d in divisors(heads) if kv % d == 0 or d % kv == 0]})")


def tiles_for(tokens: int, vocab: int, mib: int) -> int:
    """Tiles of a slice's LM head so that one tile's fp32 logits take at most ``mib`` MiB."""
    per_token = vocab * 4
    return max(1, math.ceil(tokens * per_token / (max(1, int(mib)) * 2**20)))


@dataclass
class SequenceParallel:
    """This rank's place in its sequence-parallel group and what it needs per micro-batch."""

    size: int
    rank: int  # within the group
    group: Any
    mpu: Any  # DeepSpeed's parallel state (deepspeed.initialize(mpu=...))
    tile_mib: int

    def shard(self, batch: dict) -> dict:
        """The model inputs of this rank's slice of a full-sequence micro-batch (``method.train_batch``'s), plus
        ``count``: the predicted tokens of the whole micro-batch (the loss's denominator)."""
        ids = batch["input_ids"]
        b, length = ids.shape
        if length % self.size:
            raise ValueError(f"train.sequence_parallel={self.size}: a micro-batch of {length} tokens does not split "
                             f"into {self.size} equal slices")
        pos = batch.get("position_ids")
        if pos is None:
            pos = torch.arange(length, device=ids.device).expand(b, length)
        labels = batch.get("labels", ids)
        shifted = F.pad(labels, (0, 1), value=IGNORE)[:, 1:]
        n = length // self.size
        cut = slice(n * self.rank, n * (self.rank + 1))
        return {"input_ids": ids[:, cut].contiguous(), "position_ids": pos.expand(b, length)[:, cut].contiguous(),
                "shift_labels": shifted[:, cut].contiguous(), "count": int((shifted != IGNORE).sum())}

    def loss(self, model, batch: dict, accumulation: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(what to back-propagate, this rank's share of the micro-batch's mean loss). The share is the slice's
        summed token losses over the whole micro-batch's count; the group's shares add up to the mean. The LM head's
        gradient is taken tile by tile inside the forward (``TiledFusedLogitsLoss``), already divided by
        ``accumulation``: the caller back-propagates the first value as it is."""
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

        head = getattr(model, "module", model).get_output_embeddings()
        # through the engine's own forward (DeepSpeed counts micro-steps there and hooks the outputs' backward: a
        # call of the inner decoder overwrote the first micro-batch's gradient with the second's): no logits
        # (``logits_to_keep`` of no position), the final hidden states from ``hidden_states[-1]``
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                    output_hidden_states=True, logits_to_keep=torch.zeros(0, dtype=torch.long))
        hidden = out.hidden_states[-1]
        y = batch["shift_labels"]
        # ZeRO-3's reduce-scatter averages every gradient over all W ranks; a group's shares add up to the
        # sequence's gradient only once each is multiplied by the group's size (module docstring)
        scale = self.size / (max(1, batch["count"]) * accumulation)

        def tile_loss(module, x, target):
            logits = module(x).float()
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE,
                                   reduction="sum") * scale

        tiles = tiles_for(y.numel(), head.weight.shape[0], self.tile_mib)
        scaled = TiledFusedLogitsLoss.apply(tile_loss, head, hidden, y, None, tiles, [head.weight], "sum")
        return scaled, scaled.detach() * accumulation / self.size


def setup(model, a, method) -> SequenceParallel | None:
    """Wrap the model's attention function with DeepSpeed's Ulysses attention for ``a.sequence_parallel`` ranks
    and make this rank's group known to the length-dependent RoPEs (after ``method.train_mode``: the attention
    implementation it trains with is the one wrapped). None when ``sequence_parallel`` is 1."""
    sp = a.sequence_parallel
    if sp == 1:
        return None
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    check(a, method, model.config)
    impl = model.config._attn_implementation
    if impl in STOCK and (a.doc_masking or getattr(method, "restarts_positions", False)):
        model.set_attn_implementation(CAUSAL_NAME)  # documents from the gathered position ids (module docstring)
        impl = CAUSAL_NAME
    key = (impl, sp, a.micro_batch, a.seq_len, model.config.num_attention_heads,
           getattr(model.config, "num_key_value_heads", None), getattr(model.config, "head_dim", None))
    if _REGISTERED and _REGISTERED[0] != key:
        raise RuntimeError(f"sequence parallelism was set up in this process for {_REGISTERED[0]}, not {key}: "
                           f"DeepSpeed's wrapper and groups are process-wide (one setting per process)")
    if not _REGISTERED:
        _REGISTERED[:] = [key, UlyssesSPAttentionHF.register_with_transformers(
            model, core_attn_implementation=impl, sequence_parallel_size=sp, micro_batch_size=a.micro_batch,
            seq_length=a.seq_len, seq_length_is_variable=False)]
    mpu = _REGISTERED[1]
    group = mpu.get_sequence_parallel_group()
    set_sequence_group(group)
    return SequenceParallel(sp, dist.get_rank(group), group, mpu, a.logits_tile_mib)


def tile_mlps(model, tiles: int) -> int:
    """Run every gated MLP (``gate_proj`` / ``up_proj`` / ``down_proj``: the LLaMA family) in ``tiles`` pieces
    along the sequence with DeepSpeed's ``TiledMLP``: its forward keeps only its input, its backward recomputes
    one piece at a time, so the [tokens, MLP width] intermediates exist for 1/tiles of the tokens at once (at the
    cost of one more MLP forward). The arithmetic is the same per token (the loss and gradients match the untiled
    model's to rounding: ``tests/test_sequence_parallel.py``). ``tiles`` <= 1: nothing. Returns the MLPs tiled."""
    if tiles <= 1:
        return 0
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    def forward(mlp, x):
        return mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))

    n = 0
    for module in model.modules():
        if all(hasattr(module, k) for k in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            params = [module.gate_proj.weight, module.up_proj.weight, module.down_proj.weight]

            def tiled(x, _mlp=module, _params=params):
                return TiledMLP.apply(forward, _mlp, x, tiles, _params)

            module.forward = tiled
            n += 1
    if not n:
        raise ConfigError(f"train.mlp_tiles={tiles}: the model has no gated MLP (gate_proj / up_proj / down_proj) "
                          f"to tile; use train.mlp_tiles=1")
    return n
