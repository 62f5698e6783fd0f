"""landmark: Landmark Attention (Mohtashami & Jaggi 2023; epfml/landmark-attention ``llama/``), fine-tuned.

What the original does:
- Data (``train.py::add_mem_tokens``): a ``<landmark>`` token is inserted after every ``mem_freq`` tokens of each
  training sequence (not after the last token), so a block is mem_freq + 1 tokens. LLaMA fine-tune: mem_freq = 63
  (block 64), training context 512 (``model_max_length``), landmarks counted in the loss (non-flash path), the new
  token's embedding rows initialised to the mean (``smart_tokenizer_and_embedding_resize``). The controlled study
  keeps 512 / 64.
- Attention (``llama_mem.py::landmark_grouped_softmax``), for a query: softmax 1 runs over the query's own block
  (its regular tokens) and all visible landmark tokens of other blocks; every earlier block's regular tokens get a
  softmax within their block, multiplied by the probability softmax 1 gave that block's landmark; landmark tokens
  themselves carry zero output weight, and a landmark query does not see itself. Probabilities sum to 1.
- Inference with retrieval (``run_test.py``: ``cache_top_k=5``; ``LlamaAttention.forward`` with ``mem_freq``):
  the landmark-inserted input is processed in chunks of
  ``train_len - train_len % block - (k+1) * block`` tokens (512/64/5 -> 128) with the KV cache. A chunk's queries
  attend to (a) the incomplete last block of the cache and the chunk itself (causal), and (b) k blocks retrieved
  from the complete blocks of the cache, chosen per head and per query token by the score q . landmark_key, where
  the landmark keys are rotated at synthetic positions (the last k at their own, all older ones at the position of
  the (k+1)-th last); the selected blocks are placed, in order, at slots right before the current position
  (``prefix_len = full_len - (k+1) * block``, one slot later for a block among the k most recent) and re-rotated
  there. Everything goes through the same grouped softmax (retrieved blocks are groups gated by their landmarks).

This implementation:
- ``train_batch``: splits each packed training sequence into ``train_len`` pieces (tiny: the 2048-token chunks of
  ``train=tiny`` become 4 x 512) and inserts landmarks exactly as ``add_mem_tokens``; labels = inputs (landmarks
  in the loss, ``include_landmark_in_loss``).
- The decoder (``model.get_decoder()``, what the evaluators call) is wrapped: in eval mode it inserts landmarks
  itself (after every mem_freq original tokens, counted across calls through the KV cache, as the original's
  ``prepare_inputs_for_generation``), runs the stock decoder chunk by chunk with the cache (its own temporary cache
  when called without one, e.g. for perplexity), uses stream indices (original tokens + landmarks) as positions,
  and returns hidden states for the original tokens only. In train mode it passes the (already inserted) ids
  through and only marks which tokens are landmarks.
- The attention is a registered transformers attention function; the HF cache holds post-RoPE keys, and the
  synthetic positions of retrieval are reached by re-rotating by the position difference (rotations compose; the
  original caches pre-RoPE keys instead). GQA: selection is per query head, as the original's per-head selection.
- Differences, documented: the original's grouped softmax has a hard cap of 64 buckets (``max_mem_cnt``; more than
  63 earlier blocks overflow its scatter index); here the number of buckets is unbounded (with block 64 and
  train_len 512 training never exceeds 8 blocks and inference with retrieval never exceeds k + 2 + chunk/block, so
  the cap is never reached by the original settings either). The original returns only the last chunk's hidden
  states (``last_logits = outputs[0]`` overwrites the concatenation); here all chunks are returned, which is what
  perplexity needs. Padding: right padding is supported (blocks are counted from each row's start); left padding is
  not (blocks would be misaligned). The optional CPU offloading / ``max_over_tokens`` aggregation and the Triton
  kernel are not reproduced. ``top_k: 0`` = no retrieval: one pass of grouped softmax over the whole input.

Tiny scaling: the original block (64) and training length (512) are kept: 512 = C for tiny_llama (C = 512; for
LLaMA-2 it is C/8). The study's 8C training sequences are split into 512-token pieces (Table 7 of Lu et al.: Landmark
gets the same tokens and batch as every method), so tokens per step match the other points. With retrieval,
query-key distances stay below ~512, inside the trained range, at any length.
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from harness.config import ConfigError
from harness.methods import BLOCKWISE, METHODS, Method, MethodArgs
from harness.methods import _blockwise as bw
from harness.methods import flex as fx

ATTN_NAME = "harness_landmark"
TOKEN = "<landmark>"


# ---------------------------------------------------------------------------------------------------- formulas
def grouped_softmax(s, vis, is_mem, same, bucket, n_buckets: int):
    """The landmark grouped softmax over the last dim.

    s: scores [..., K]; vis: visible keys (causal & not padded); is_mem: key is a landmark; same: key is in the
    query's own block; bucket: block id of each key (a landmark shares its block's id); all broadcastable to s.
    Returns probabilities [..., K]; landmark keys get 0, so each row sums to 1 (if it sees anything)."""
    shape = s.shape
    vis, is_mem, same = (t.expand(shape) for t in (vis, is_mem, same))
    bucket = bucket.expand(shape).contiguous()
    own = vis & same & ~is_mem
    top = own | (vis & is_mem & ~same)
    grp = vis & ~same & ~is_mem
    p1 = torch.softmax(s.masked_fill(~top, torch.finfo(s.dtype).min), dim=-1)  # finite: no NaN grads
    p1 = torch.where(top, p1, torch.zeros_like(p1))  # rows with nothing visible: 0
    xg = s.masked_fill(~grp, bw.NEG_INF)
    mb = torch.full((*shape[:-1], n_buckets), bw.NEG_INF, dtype=s.dtype, device=s.device)
    mb = mb.scatter_reduce(-1, bucket, xg.detach(), reduce="amax", include_self=True)
    mg = mb.gather(-1, bucket)
    e = torch.where(grp, torch.exp(xg - torch.where(torch.isinf(mg), torch.zeros_like(mg), mg)), torch.zeros_like(s))
    den = torch.zeros_like(mb).scatter_add(-1, bucket, e)
    pin = e / den.gather(-1, bucket).clamp_min(torch.finfo(s.dtype).tiny)
    w = torch.zeros_like(mb).scatter_add(-1, bucket, torch.where(is_mem & top, p1, torch.zeros_like(p1)))
    return torch.where(own, p1, torch.zeros_like(p1)) + pin * w.gather(-1, bucket)


def insert_landmarks(ids: torch.Tensor, mem_freq: int, mem_id: int, n_before: int = 0, trailing: bool = True):
    """Insert ``mem_id`` after every mem_freq-th original token (counting ``n_before`` tokens already seen).
    Returns (stream [B, L'], keep [L] = stream index of each original token). ``trailing=False`` drops a landmark
    that would come last (``add_mem_tokens``)."""
    b, n = ids.shape
    t = torch.arange(n, device=ids.device)
    after = (n_before + t + 1) % mem_freq == 0
    if not trailing and n > 0:
        after[-1] = False
    before = torch.cumsum(after.long(), 0) - after.long()  # landmarks inserted before token t (in this call)
    keep = t + before
    total = n + int(after.sum())
    stream = ids.new_full((b, total), mem_id)
    stream[:, keep] = ids
    return stream, keep


def chunk_length(train_len: int, mem_freq: int, top_k: int) -> int:
    block = mem_freq + 1
    return train_len - train_len % block - (top_k + 1) * block


# ---------------------------------------------------------------------------------------------------- attention
def _full_grouped(q, k, v, is_mem_k, valid, scale, q_block):
    """No retrieval: grouped softmax over all keys (training; first chunk; top_k = 0). Blocked over queries."""
    b, h, lq, d = q.shape
    n_kv, kv = k.shape[1], k.shape[2]
    blk = torch.cumsum(is_mem_k.long(), -1) - is_mem_k.long()  # [B, kv]: landmarks strictly before
    nb = int(blk.max()) + 1 if kv else 1
    k_idx = torch.arange(kv, device=q.device)
    q_idx = k_idx[kv - lq:]
    qg = bw.group_q(q, n_kv)
    outs = []
    for qs in range(0, lq, q_block):
        qe = min(lq, qs + q_block)
        s = torch.matmul(qg[:, :, :, qs:qe], k[:, :, None].transpose(-1, -2)) * scale  # [B, Hkv, g, bq, kv]
        vis = ((q_idx[qs:qe, None] >= k_idx[None])[None] & valid[:, None])[:, None, None]
        same = (blk[:, kv - lq + qs:kv - lq + qe, None] == blk[:, None])[:, None, None]
        p = grouped_softmax(s, vis, is_mem_k[:, None, None, None], same, blk[:, None, None, None], nb)
        outs.append(torch.matmul(p.to(v.dtype), v[:, :, None]))
    out = torch.cat(outs, dim=3) if len(outs) > 1 else outs[0]
    return out.reshape(b, h, lq, d)


def _retrieval(q, k, v, is_mem_new, valid, scale, q_block, mem_freq, top_k, inv):
    """Chunk with a cache of complete blocks: top-k block retrieval (run_test.py / llama_mem.py semantics)."""
    b, h, lq, d = q.shape
    n_kv, kv = k.shape[1], k.shape[2]
    g = h // n_kv
    block = mem_freq + 1
    past = kv - lq
    incomplete = past % block
    full = past - incomplete
    nm = full // block
    top = min(top_k, nm)
    prefix_len = full - (top + 1) * block
    dev = q.device
    head_kv = torch.arange(h, device=dev) // g
    # landmark keys at their synthetic positions
    b_idx = torch.arange(nm, device=dev)
    slot = torch.where(b_idx >= nm - top, b_idx - (nm - top) + 1, torch.zeros_like(b_idx))
    mem_pos = prefix_len + mem_freq + block * slot
    lm_keys = bw.rotate(k[:, :, mem_freq:full:block], mem_pos - (b_idx * block + mem_freq), inv)  # [B,Hkv,nm,D]
    lm_scores = torch.matmul(bw.group_q(q, n_kv), lm_keys[:, :, None].transpose(-1, -2)).reshape(b, h, lq, nm)
    sel = lm_scores.topk(top, dim=-1).indices.sort(dim=-1).values  # [B, H, lq, top]
    rank = torch.arange(top, device=dev)
    slot_start = prefix_len + rank * block + torch.where(sel >= nm - top, block, 0)
    delta = slot_start - sel * block  # [B, H, lq, top]
    past_k = k[:, :, :full].reshape(b, n_kv, nm, block, d)  # [B, Hkv, nm, block, D]
    past_v = v[:, :, :full].reshape(b, n_kv, nm, block, d)
    # main part: the incomplete block of the cache + the chunk
    km, vm = k[:, :, full:], v[:, :, full:]
    n_main = kv - full
    is_mem_main = torch.cat([torch.zeros(b, incomplete, dtype=torch.bool, device=dev), is_mem_new], dim=1)
    blk_main = torch.cumsum(is_mem_main.long(), -1) - is_mem_main.long() + top  # buckets top.. for main blocks
    valid_main = valid[:, full:]
    k_idx = torch.arange(n_main, device=dev)
    q_idx = k_idx[n_main - lq:]
    pref_mem = (torch.arange(top * block, device=dev) % block == mem_freq)
    pref_bucket = torch.arange(top * block, device=dev) // block
    nb = int(blk_main.max()) + 1 if n_main else top + 1
    bi = torch.arange(b, device=dev)[:, None, None, None]
    hi = head_kv[None, :, None, None]
    qg = bw.group_q(q, n_kv)
    outs = []
    for qs in range(0, lq, q_block):
        qe = min(lq, qs + q_block)
        n_q = qe - qs
        s_sel = sel[:, :, qs:qe]
        # q . R(delta) k = (R(-delta) q) . k: rotating the query once per retrieved block, rather than each of the
        # block's keys, gives the original's scores (it re-rotates keys) with 1/block of the rotation work
        q_rot = bw.rotate_each(q[:, :, qs:qe, None], -delta[:, :, qs:qe], inv)  # [B, H, bq, top, D]
        s_pref = torch.einsum("bhqtd,bhqtkd->bhqtk", q_rot, past_k[bi, hi, s_sel]).reshape(b, h, n_q, top * block)
        s_pref = s_pref * scale
        vals = past_v[bi, hi, s_sel]  # [B, H, bq, top, block, D]
        s_main = torch.matmul(qg[:, :, :, qs:qe], km[:, :, None].transpose(-1, -2)).reshape(b, h, n_q, n_main) * scale
        s = torch.cat([s_pref, s_main], dim=-1)
        vis_main = (q_idx[qs:qe, None] >= k_idx[None])[None] & valid_main[:, None]  # [B, bq, n_main]
        vis = torch.cat([torch.ones(b, n_q, top * block, dtype=torch.bool, device=dev), vis_main], dim=-1)[:, None]
        is_mem = torch.cat([pref_mem.expand(b, -1), is_mem_main], dim=-1)[:, None, None]
        same_main = blk_main[:, n_main - lq + qs:n_main - lq + qe, None] == blk_main[:, None]
        same = torch.cat([torch.zeros(b, n_q, top * block, dtype=torch.bool, device=dev), same_main], dim=-1)[:, None]
        bucket = torch.cat([pref_bucket.expand(b, -1), blk_main], dim=-1)[:, None, None]
        p = grouped_softmax(s, vis, is_mem, same, bucket, nb)
        p_pref, p_main = p[..., :top * block], p[..., top * block:]
        o = torch.einsum("bhqtk,bhqtkd->bhqd", p_pref.reshape(b, h, n_q, top, block), vals)
        o = o + torch.matmul(p_main.reshape(b, n_kv, g, n_q, n_main), vm[:, :, None]).reshape(b, h, n_q, d)
        outs.append(o)
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def landmark_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None,
                       landmark_is_mem=None, **kwargs):
    mem_freq, top_k, q_block = module.harness_landmark
    fx.use_fused(module, query, method="landmark", reason="its grouped softmax needs one normaliser per (query, "
                 "block), which no flex mask or score_mod expresses")  # auto -> this reference; flex -> one line
    b, h, lq, d = query.shape
    kv = key.shape[2]
    dev = query.device
    if landmark_is_mem is None:
        raise ValueError("landmark attention needs the landmark mask (call the model through the landmark method)")
    scale = bw.default_scaling(module, scaling)
    valid = bw.key_valid(attention_mask, b, kv, dev)
    past = kv - lq
    is_mem_new = landmark_is_mem.to(dev).bool().expand(b, lq)
    qf, kf, vf = query.float(), key.float(), value.float()
    if past > 0 and top_k > 0 and past // (mem_freq + 1) > 0:
        out = _retrieval(qf, kf, vf, is_mem_new, valid, scale, q_block, mem_freq, top_k, module.harness_inv_freq)
    else:
        past_mem = (torch.arange(past, device=dev) % (mem_freq + 1) == mem_freq)[None].expand(b, past)
        is_mem_k = torch.cat([past_mem, is_mem_new], dim=1)
        out = _full_grouped(qf, kf, vf, is_mem_k, valid, scale, q_block)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


bw.register_attention(ATTN_NAME, landmark_attention)


# ---------------------------------------------------------------------------------------------------- decoder
def stream_length(n_tokens: int, mem_freq: int) -> int:
    """Stream length (tokens + landmarks) after n_tokens original tokens, a landmark after every mem_freq-th."""
    return n_tokens + n_tokens // mem_freq


def _resync(cache, input_ids, position_ids, mem_freq):
    """Continue a landmark cache. The cache remembers the original ids it holds (``harness_landmark_ids``); callers
    that crop the cache by original-token counts (``evals.common.PrefixCache``) or pass ``position_ids`` that start
    earlier than the cache end are brought back in step: the cache is cropped to the longest prefix of whole
    original tokens it still holds, and the missing original tokens are fed again before ``input_ids``.
    Returns (ids to feed, original tokens before them, stream length before them)."""
    stored = getattr(cache, "harness_landmark_ids", None)
    if stored is None:
        raise ValueError("landmark: the KV cache was not filled through the landmark decoder")
    n_pos = stored.shape[1] if position_ids is None else int(position_ids.reshape(-1)[0])
    n_pos = max(0, min(n_pos, stored.shape[1]))
    held = cache.get_seq_length()
    m = min(n_pos, held)
    while m > 0 and stream_length(m, mem_freq) > held:
        m -= 1
    if stream_length(m, mem_freq) < held:
        cache.crop(stream_length(m, mem_freq) - held)  # transformers 5: a negative count of entries to remove
    feed = torch.cat([stored[:, m:n_pos].to(input_ids.device), input_ids], dim=1)
    return feed, m, stream_length(m, mem_freq)


def _decoder_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                     inputs_embeds=None, use_cache=None, **kwargs):
    """Replaces ``forward`` on the decoder instance (``model.get_decoder()``)."""
    from transformers import DynamicCache
    from transformers.modeling_outputs import BaseModelOutputWithPast

    st = self.harness_landmark_state
    base = type(self).forward
    if input_ids is None:
        raise ValueError("landmark: the decoder needs input_ids (landmarks are inserted by id)")
    if not st["auto_insert"]:  # training: ids already carry their landmarks
        return base(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    past_key_values=past_key_values, use_cache=use_cache,
                    landmark_is_mem=input_ids == st["mem_id"], **kwargs)
    mem_freq, block, top_k = st["mem_freq"], st["mem_freq"] + 1, st["top_k"]
    cache = past_key_values
    feed, n_before, past_stream = input_ids, 0, 0
    if cache is not None and cache.get_seq_length() > 0:
        if attention_mask is not None:
            raise ValueError("landmark: attention_mask together with a non-empty cache is not supported")
        feed, n_before, past_stream = _resync(cache, input_ids, position_ids, mem_freq)
    stream, keep = insert_landmarks(feed, mem_freq, st["mem_id"], n_before)
    keep = keep[feed.shape[1] - input_ids.shape[1]:]  # hidden states of the caller's tokens only
    stream_mask = None
    if attention_mask is not None:  # a landmark is real iff the token it follows is (right padding)
        idx = torch.arange(stream.shape[1], device=stream.device)
        src = torch.searchsorted(keep, idx, right=True) - 1  # the original token at / right before each index
        stream_mask = attention_mask.bool()[:, src]
    own_cache = cache
    if own_cache is None and top_k > 0:
        own_cache = DynamicCache(config=self.config)
    pieces, s = [], 0
    n = stream.shape[1]
    if past_stream % block and top_k > 0:
        s = min(n, block - past_stream % block)
        pieces.append((0, s))
    step = st["chunk"] if top_k > 0 else n
    while s < n:
        pieces.append((s, min(n, s + step)))
        s += step
    hidden = []
    for s, e in pieces:
        pos = torch.arange(past_stream + s, past_stream + e, device=stream.device)[None]
        out = base(self, input_ids=stream[:, s:e], position_ids=pos,
                   attention_mask=None if stream_mask is None else stream_mask[:, :e],
                   past_key_values=own_cache, use_cache=own_cache is not None,
                   landmark_is_mem=stream[:, s:e] == st["mem_id"], **kwargs)
        hidden.append(out.last_hidden_state)
    h = torch.cat(hidden, dim=1)[:, keep]
    if cache is not None:
        cache.harness_landmark_ids = torch.cat([getattr(cache, "harness_landmark_ids", feed[:, :0])[:, :n_before],
                                                feed], dim=1)
    return BaseModelOutputWithPast(last_hidden_state=h, past_key_values=cache if use_cache else None)


@METHODS.register("landmark")
class Landmark(Method):
    needs = BLOCKWISE
    sequence_parallel = ("inserts a landmark token after every block of the training sequence: its length and "
                         "token order change, and a sequence-parallel group splits one fixed-length sequence")

    @dataclass
    class Args(MethodArgs):
        name: str = "landmark"
        mem_freq: int = 63  # regular tokens per block (block = mem_freq + 1 = 64; original LLaMA fine-tune)
        train_len: int = 512  # training context (original: 512); 0 = the train config's seq_len as given
        top_k: int = 5  # blocks retrieved at inference (run_test.py: 5); 0 = no retrieval
        include_landmark_in_loss: bool = True  # original non-flash training: landmarks are predicted too
        q_block: int = 64  # query rows per attention block (memory bound)

    def __init__(self, args):
        super().__init__(args)
        self.mem_id = None

    def check(self, native_ctx: int, train=None) -> int:
        """Checks the settings (block and training length are absolute token counts, see the YAML); returns the
        inference chunk length."""
        a = self.args
        if a.mem_freq < 1 or a.top_k < 0 or a.train_len < 0 or a.q_block < 1:
            raise ConfigError(f"method=landmark: need mem_freq >= 1, top_k >= 0, train_len >= 0, q_block >= 1 "
                              f"(got {a.mem_freq}, {a.top_k}, {a.train_len}, {a.q_block})")
        chunk = chunk_length(a.train_len or 512, a.mem_freq, a.top_k)
        if a.top_k > 0 and chunk <= 0:
            block = a.mem_freq + 1
            top = (a.train_len or 512) // block - 2
            raise ConfigError(f"method=landmark: top_k={a.top_k} is too large for train_len={a.train_len} and block "
                              f"{block} (chunk length {chunk} <= 0; valid: 0..{max(top, 0)})")
        if train is not None and train.enabled and a.train_len and train.seq_len > a.train_len \
                and train.seq_len % a.train_len:
            raise ConfigError(f"method=landmark: train.seq_len {train.seq_len} is not a multiple of train_len "
                              f"{a.train_len} (training sequences are split into train_len pieces)")
        return chunk

    def apply(self, handle) -> None:
        a = self.args
        chunk = self.check(handle.native_ctx)
        model, tok = handle.model, handle.tokenizer
        self.mem_id = ensure_landmark_token(model, tok)
        dec = model.get_decoder()
        dec.harness_landmark_state = {"auto_insert": True, "mem_id": self.mem_id, "mem_freq": a.mem_freq,
                                      "top_k": a.top_k, "chunk": chunk}
        dec.forward = types.MethodType(_decoder_forward, dec)
        bw.install(model, ATTN_NAME, "harness_landmark", (a.mem_freq, a.top_k, a.q_block))

    def train_mode(self, handle) -> None:
        handle.model.get_decoder().harness_landmark_state["auto_insert"] = False

    def eval_mode(self, handle) -> None:
        handle.model.get_decoder().harness_landmark_state["auto_insert"] = True

    def attention_keys(self, seq_len: int) -> float:
        # training splits the sequence into train_len pieces (the 1/mem_freq landmark tokens not counted)
        return min(seq_len, self.args.train_len) if self.args.train_len else seq_len

    def train_batch(self, input_ids):
        a = self.args
        ids = input_ids
        if a.train_len and ids.shape[1] > a.train_len:
            if ids.shape[1] % a.train_len:
                raise ConfigError(f"method=landmark: training length {ids.shape[1]} is not a multiple of "
                                  f"train_len {a.train_len}")
            ids = ids.reshape(-1, a.train_len)
        stream, _ = insert_landmarks(ids, a.mem_freq, self.mem_id, trailing=False)
        labels = stream if a.include_landmark_in_loss else stream.masked_fill(stream == self.mem_id, -100)
        return {"input_ids": stream, "labels": labels}


def ensure_landmark_token(model, tokenizer) -> int:
    """The id of ``<landmark>``; added to the tokenizer (and the embeddings resized, new rows = mean of the old
    ones, as ``smart_tokenizer_and_embedding_resize``) when the tokenizer lacks it."""
    if TOKEN in tokenizer.get_vocab():
        mem_id = tokenizer.convert_tokens_to_ids(TOKEN)
    else:
        tokenizer.add_special_tokens({"additional_special_tokens": [TOKEN]})
        mem_id = tokenizer.convert_tokens_to_ids(TOKEN)
    n_vocab = model.get_input_embeddings().weight.shape[0]
    if mem_id >= n_vocab:
        model.resize_token_embeddings(len(tokenizer))
        with torch.no_grad():
            for emb in (model.get_input_embeddings(), model.get_output_embeddings()):
                if emb is not None and emb.weight.shape[0] > n_vocab:
                    emb.weight[n_vocab:] = emb.weight[:n_vocab].mean(dim=0, keepdim=True)
    return int(mem_id)
