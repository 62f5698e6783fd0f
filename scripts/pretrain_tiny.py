"""Pretrain the embedded default model ``tiny_llama`` and write it under ``harness/assets/tiny_llama``.

    python scripts/pretrain_tiny.py                 # tokenizer + pretraining (~15 min on 2 CPU cores)
    python scripts/pretrain_tiny.py --gate-only     # re-measure the passkey gate and rewrite the model card

The model is the miniature of LLaMA2-7B's setting: native window C = 256 (LLaMA2: 4096), so the paper's
4k -> 32k -> 64k becomes 256 -> 2048 -> 4096. Architecture: 4 layers, hidden 256, 4 heads of dim 64, SwiGLU 688,
untied embeddings, byte-level BPE with 4096 tokens and single-digit number tokens.

rope_theta = 1000 (documented in the model card): LLaMA2-7B (d=128, b=1e4, C=4096) has 19 of 64 RoPE pairs
(30%) whose period 2*pi*b^(2i/d) exceeds its window, i.e. pairs that never complete a turn in pretraining and are
the ones position interpolation / NTK / YaRN treat differently. With d=64 and C=256, b=1000 gives 14 of 32 pairs
(44%). b=200 would match LLaMA2's share (28%) but measured only 0.83 passkey at C after 5.5M tokens
(environment.md), below the gate, and this CPU (AVX2, no fast bf16) affords about half that many tokens; b=1e4
gives 59%. 1000 is the compromise: as LLaMA2-like as the gate allows.

Training data (by tokens, about): 45% natural text (train split of the Shakespeare plays and CPython sources), 55%
synthetic retrieval documents (``harness.data.synthetic``: varied wording, separators, fillers; never an
evaluation template).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.data import sources  # noqa: E402
from harness.data.synthetic import FillerFactory, synthetic_document  # noqa: E402
from harness.evals.common import autocast  # noqa: E402
from harness.models.tiny_llama import ASSET_DIR, SPECIAL_TOKENS, tiny_config  # noqa: E402

SEQ = 256


def train_tokenizer(texts, vocab_size: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=["<landmark>"], model_max_length=1_000_000,
    )
    fast.save_pretrained(out)
    return fast


def build_sequences(tok, n_seq: int, seed: int, natural_share: float = 0.45) -> np.ndarray:
    rng = random.Random(seed)
    plays = [d.text for d in sources.shakespeare("train")]
    code = [d.text for d in sources.python_stdlib("train")]
    natural = plays + code  # by tokens: 70% plays, 30% code (environment.md recipe)
    weights = [0.7 * len(t) / sum(map(len, plays)) for t in plays] + [0.3 * len(t) / sum(map(len, code)) for t in code]
    filler = FillerFactory(plays[:20] + code[:20], seed)
    bos, eos = tok.bos_token_id, tok.eos_token_id

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False).input_ids)

    out = np.zeros((n_seq, SEQ), dtype=np.int16)
    for s in range(n_seq):
        ids: list[int] = []
        while len(ids) < SEQ:
            remaining = SEQ - len(ids)
            if remaining < 24 or rng.random() < natural_share:
                text = rng.choices(natural, weights)[0]
                n = remaining if rng.random() < 0.5 else rng.randint(min(24, remaining), remaining)
                start = rng.randrange(max(1, len(text) - 6 * n))
                body = tok(text[start : start + 6 * n], add_special_tokens=False).input_ids
                ids += ([bos] + body)[:n]
                continue
            budget = remaining - 3 if rng.random() < 0.5 else rng.randint(20, remaining - 3)
            for _ in range(20):
                doc = tok(synthetic_document(rng, filler, budget, count), add_special_tokens=False).input_ids
                if len(doc) + 2 <= remaining:
                    break
                budget = int(budget * 0.85)
            else:
                continue
            ids += [bos] + doc + [eos]
        out[s] = ids[:SEQ]
    return out


def copy_pool(tok) -> torch.Tensor:
    """Token ids of digits and common short words: the alphabet of the induction warm-up."""
    from harness.data.synthetic import ADJS, NOUNS, VERBS

    ids = {tok.convert_tokens_to_ids(str(d)) for d in range(10)}
    for w in NOUNS + ADJS + VERBS + ["is", "the", "a", "of", "and", "to", "key", "code", "value"]:
        ids.update(tok(" " + w, add_special_tokens=False).input_ids[:1])
    return torch.tensor(sorted(i for i in ids if i is not None and i > 4))


def copy_batch(batch: int, pool: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Induction-head warm-up: each sequence is a random span (16-48 tokens over a 64-token subset of ``pool``)
    repeated to fill the window. Measured here: from scratch, the copy circuit forms in ~100 steps on such data
    (loss on repeats 8.3 -> 0.01), while on the varied documents alone it did not form in 2,600 steps, nor on spans
    over random 64-token subsets of the whole vocabulary. No evaluation text is involved."""
    rows = []
    for _ in range(batch):
        alphabet = pool[torch.randperm(len(pool), generator=gen)[:64]]
        n = int(torch.randint(16, 49, (1,), generator=gen))
        span = alphabet[torch.randint(0, len(alphabet), (n,), generator=gen)]
        rows.append(span.repeat(SEQ // n + 1)[:SEQ])
    return torch.stack(rows)


def pretrain(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rng = random.Random(args.seed)
    from transformers import AutoTokenizer, LlamaForCausalLM

    if args.init_from:  # continue pretraining (stage 2): same tokenizer, weights from the previous stage
        tok = AutoTokenizer.from_pretrained(args.init_from)
        tok.save_pretrained(out)
        model = LlamaForCausalLM.from_pretrained(args.init_from, dtype=torch.float32)
        previous = json.loads((Path(args.init_from) / "pretrain_stats.json").read_text())
    else:
        corpus = [d.text for d in sources.shakespeare("train")] + [d.text for d in sources.python_stdlib("train")]
        filler = FillerFactory(corpus[:20] + corpus[-20:], args.seed)
        synth = [synthetic_document(rng, filler, rng.randint(30, 250)) for _ in range(20000)]
        tok = train_tokenizer(corpus + synth, args.vocab, out)
        config = tiny_config(vocab_size=len(tok), rope_theta=args.rope_theta, bos=tok.bos_token_id,
                             eos=tok.eos_token_id, pad=tok.pad_token_id)
        model = LlamaForCausalLM(config)
        previous = None
    print(f"tokenizer: {len(tok)} tokens ({time.time() - t0:.0f}s)", flush=True)

    if args.kind_weights:  # e.g. "repeat=0.45,retrieval=0.25,kv=0.2,recall=0.1" (copy-heavy curriculum stage)
        from harness.data.synthetic import set_kind_weights

        set_kind_weights(**{k: float(v) for k, v in (kv.split("=") for kv in args.kind_weights.split(","))})
    n_seq = args.steps * args.batch
    data = build_sequences(tok, n_seq, args.seed + len((previous or {}).get("stages") or ([1] if previous else [])),
                           args.natural_share)
    print(f"data: {n_seq} x {SEQ} tokens ({time.time() - t0:.0f}s)", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_at(step):
        if step < args.warmup:
            return (step + 1) / args.warmup
        if args.schedule == "constant":
            return 1.0
        p = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses = []
    copy_gen = torch.Generator().manual_seed(args.seed)
    pool = copy_pool(tok)
    for step in range(args.steps):
        batch = torch.from_numpy(data[step * args.batch : (step + 1) * args.batch].astype(np.int64))
        if step < args.copy_warmup:
            batch = copy_batch(args.batch, pool, copy_gen)
        with autocast(torch.device("cpu"), "auto"):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step} loss {np.mean(losses[-50:]):.3f} lr {sched.get_last_lr()[0]:.2e} ({el:.0f}s)",
                  flush=True)
    model.save_pretrained(out, safe_serialization=True)
    stats = {
        "stages": (previous.get("stages") or [previous]) + [None] if previous else [None],
        "natural_share": args.natural_share, "copy_warmup_steps": args.copy_warmup, "kind_weights": args.kind_weights or "default",
        "steps": args.steps, "batch": args.batch, "seq_len": SEQ, "tokens": args.steps * args.batch * SEQ,
        "lr": args.lr, "warmup": args.warmup, "schedule": args.schedule, "seed": args.seed, "rope_theta": args.rope_theta,
        "final_loss": float(np.mean(losses[-50:])), "wall_seconds": round(time.time() - t0),
        "command": "python scripts/pretrain_tiny.py " + " ".join(sys.argv[1:]),
        "params": sum(p.numel() for p in model.parameters()),
    }
    stats["stages"][-1] = {k: v for k, v in stats.items() if k != "stages"}
    if previous:  # totals over all stages
        stats["steps"] = sum(s["steps"] for s in stats["stages"])
        stats["tokens"] = sum(s["tokens"] for s in stats["stages"])
        stats["wall_seconds"] = sum(s["wall_seconds"] for s in stats["stages"])
    (out / "pretrain_stats.json").write_text(json.dumps(stats, indent=2))
    return stats


def gate(out: Path, n: int, seed: int) -> dict:
    """Passkey accuracy of plain RoPE at C/2, C, 2C, 4C with the harness's own evaluator."""
    from harness.evals.passkey import passkey_accuracy
    from harness.models import load_model

    handle = load_model("tiny_llama", path=str(out))
    res = {}
    for L in (128, 256, 512, 1024):
        res[L] = passkey_accuracy(handle.model, handle.tokenizer, L, n_samples=n, seed=seed)
        print(f"gate passkey@{L}: {res[L]:.3f}", flush=True)
    return res


def write_card(out: Path, gate_res: dict):
    stats = json.loads((out / "pretrain_stats.json").read_text())
    ok = all(v >= 0.9 for k, v in gate_res.items() if int(k) <= 256) and gate_res.get(1024, 1) <= 0.2
    lines = [
        "# tiny_llama: the harness's embedded default model",
        "",
        "A Llama-architecture model pretrained on this CPU by `scripts/pretrain_tiny.py`; the miniature of LLaMA2-7B",
        "for controlled context-extension studies: native window **C = 256** (LLaMA2: 4096).",
        "",
        "| field | value |", "|---|---|",
        f"| parameters | {stats['params']:,} |",
        "| layers / hidden / heads x dim / SwiGLU | 4 / 256 / 4 x 64 / 688 |",
        "| vocabulary | byte-level BPE, 4096 tokens, digits split into single tokens, `<landmark>` reserved |",
        f"| rope_theta | {stats['rope_theta']} (14 of 32 RoPE pairs have period > C: 44%; LLaMA2-7B at 4k: 30%) |",
        f"| pretraining | {stats['steps']} steps x {stats['batch']} x {stats['seq_len']} = {stats['tokens']:,} tokens, "
        f"AdamW lr {stats['lr']}, warm-up {stats['warmup']}, cosine to 10%, autocast (bf16 where the CPU has it, else fp32), seed {stats['seed']} |",
        f"| final training loss | {stats['final_loss']:.3f} |",
        *[f"| stage {i + 1} | {st['steps']} steps x {st['batch']} x {st['seq_len']}, lr {st['lr']}, natural-text share "
          f"{st.get('natural_share', 0.45)}, synthetic kinds {st.get('kind_weights', 'default')}, "
          f"schedule {st.get('schedule', 'cosine')}, final loss "
          f"{st['final_loss']:.3f}, {st['wall_seconds']} s |" for i, st in enumerate(stats.get("stages") or [])],
        f"| wall time | {stats['wall_seconds']} s on 2 CPU cores |",
        "| data | natural text (train split: Shakespeare plays, CPython stdlib) and synthetic documents "
        "(`harness/data/synthetic.py`: retrieval, key-value, recall, repeated spans, cued retrieval) with varied "
        "wording/separators/fillers, shares per stage above; no evaluation template verbatim |",
        "",
        "## Gate: passkey retrieval with plain RoPE (Mohtashami & Jaggi template, never seen in training)",
        "",
        "| length | " + " | ".join(str(k) for k in gate_res) + " |",
        "|---|" + "---|" * len(gate_res),
        "| accuracy | " + " | ".join(f"{v:.2f}" for v in gate_res.values()) + " |",
        "",
        f"Gate (>= 0.90 at <= C, <= 0.20 at 4C): **{'passed' if ok else 'NOT passed'}**.",
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    (out / "gate.json").write_text(json.dumps({"passkey": gate_res, "passed": ok}, indent=2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ASSET_DIR))
    ap.add_argument("--steps", type=int, default=1400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rope-theta", type=float, default=1000.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gate-samples", type=int, default=50)
    ap.add_argument("--gate-only", action="store_true")
    ap.add_argument("--kind-weights", default="", help="synthetic document kinds, e.g. repeat=0.45,retrieval=0.25")
    ap.add_argument("--copy-warmup", type=int, default=0, help="first N steps on repeated random spans (induction)")
    ap.add_argument("--init-from", default="", help="continue pretraining from this model dir (stage 2)")
    ap.add_argument("--schedule", choices=["cosine", "constant"], default="cosine",
                    help="after warm-up: cosine to 10%% of lr, or constant")
    ap.add_argument("--natural-share", type=float, default=0.45, help="share of sequences' documents that are natural text")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.gate_only:
        pretrain(args)
    write_card(Path(args.out), gate(Path(args.out), args.gate_samples, seed=1234))


if __name__ == "__main__":
    main()
