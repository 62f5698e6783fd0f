"""Pretrain the embedded default model ``tiny_llama`` and write it under ``harness/assets/tiny_llama``.

    make tiny-model                                 # every stage, as shipped (the model card lists them)
    python scripts/pretrain_tiny.py --out DIR ...   # one stage (--init-from continues a previous one)
    python scripts/pretrain_tiny.py --gate-only     # re-measure the gate and rewrite the model card

The model is the miniature of LLaMA2-7B's setting: native window C = 512 (LLaMA2: 4096), so the paper's
4k -> 32k -> 64k becomes 512 -> 4096 -> 8192. Architecture: 4 layers, hidden 256, 4 heads of dim 64, SwiGLU 688,
untied embeddings, byte-level BPE with 4096 tokens and single-digit number tokens; rope_theta = 500 (the share of
RoPE pairs that never complete a turn within C matches LLaMA2-7B's at 4k; the card says why and what cannot match).

Training data: natural text (train splits of the Shakespeare plays and CPython sources) and synthetic retrieval
documents (``harness.data.synthetic``: varied wording, separators, fillers; never an evaluation template), packed
into windows of C. ``--answer-batch`` adds, per step, graded-retrieval documents whose loss is on their answers
only (``answer_batch``): the associative-recall curriculum of the last stage.

On a GPU: ``--device cuda`` (``auto``, the default, picks CUDA when there is one) trains there in bf16 autocast;
``make tiny-model PRETRAIN_ARGS="--device cuda"`` runs every stage so. A fresh first stage may change the sizes
(``--layers --hidden --heads --intermediate``; a continued stage keeps its parent's) and may keep an existing
tokenizer (``--tokenizer-from``: the shipped one keeps the study's token ids). Each stage records its device
in ``pretrain_stats.json`` and the card's stage table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from harness.data import sources
from harness.data.synthetic import FillerFactory, synthetic_document
from harness.device import autocast
from harness.models.tiny_llama import ASSET_DIR, SPECIAL_TOKENS, tiny_config

ROOT = Path(__file__).resolve().parents[1]


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


def build_sequences(tok, n_seq: int, seed: int, natural_share: float = 0.45, seq: int = 256,
                    long_share: float = 0.0, max_doc: int = 0) -> np.ndarray:
    rng = random.Random(seed)
    plays = [d.text for d in sources.shakespeare("train")]
    code = [d.text for d in sources.python_stdlib("train")]
    natural = plays + code  # by tokens: 70% plays, 30% code (environment.md recipe)
    weights = [0.7 * len(t) / sum(map(len, plays)) for t in plays] + [0.3 * len(t) / sum(map(len, code)) for t in code]
    filler = FillerFactory(plays[:20] + code[:20], seed)
    bos, eos = tok.bos_token_id, tok.eos_token_id

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False).input_ids)

    out = np.zeros((n_seq, seq), dtype=np.int16)
    for s in range(n_seq):
        ids: list[int] = []
        if rng.random() < long_share:  # one contiguous slice of a book or source file filling the whole window
            text = rng.choices(natural, weights)[0]
            start = rng.randrange(max(1, len(text) - 6 * seq))
            ids = [bos] + tok(text[start : start + 6 * seq], add_special_tokens=False).input_ids
        no_fit = False
        while len(ids) < seq:
            remaining = seq - len(ids)
            if remaining < 24 or no_fit or rng.random() < natural_share:
                text = rng.choices(natural, weights)[0]
                n = remaining if rng.random() < 0.5 else rng.randint(min(24, remaining), remaining)
                start = rng.randrange(max(1, len(text) - 6 * n))
                body = tok(text[start : start + 6 * n], add_special_tokens=False).input_ids
                ids += ([bos] + body)[:n]
                continue
            budget = remaining - 3 if rng.random() < 0.5 else rng.randint(20, remaining - 3)
            if max_doc:  # short synthetic documents (little filler): a curriculum stage
                budget = min(budget, rng.randint(40, max_doc))
            for _ in range(20):
                doc = tok(synthetic_document(rng, filler, budget, count), add_special_tokens=False).input_ids
                if len(doc) + 2 <= remaining:
                    break
                budget = int(budget * 0.85)
            else:  # no synthetic document fits the rest of the window: fill it with natural text
                no_fit = True
                continue
            ids += [bos] + doc + [eos]
        out[s] = ids[:seq]
    return out


def answer_batch(tok, n: int, seq: int, seed: int, kinds: dict[str, float], filler: FillerFactory):
    """``n`` graded-retrieval documents (``lookup`` / ``multivalue`` / ``chain``, 40 tokens to a whole window each)
    whose labels are their answers only: the associative-recall curriculum of stage 8. The same documents as in the
    packed mixture, but the loss falls on the tokens that need the look-up, not on the random keys, values and
    filler around them (which are unpredictable and dominate a document's loss). Measured here: on the stage-7
    model, 300 steps of 16 such documents raised exact-match on held-out look-ups from 0.10 to 0.66, where 600 steps
    of the same kinds with the loss on every token had not moved it (model card). Returns (input_ids,
    attention_mask, labels), right-padded."""
    rng = random.Random(seed)
    names, weights = zip(*kinds.items())

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False).input_ids)

    rows = []
    for _ in range(n):
        text, spans = synthetic_document(rng, filler, rng.randint(40, seq - 2), count,
                                         kind=rng.choices(names, weights)[0], answers=True)
        enc = tok(text, return_offsets_mapping=True)
        ids, offsets = enc.input_ids[:seq], enc.offset_mapping[:seq]
        labels = [-100] * len(ids)
        for j, (a, b) in enumerate(offsets):
            if b > a and text[a:b].strip() and any(a < e and b > s for s, e in spans):
                labels[j] = ids[j]
        rows.append((ids, labels))
    width = max(len(r[0]) for r in rows)
    input_ids = torch.full((n, width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((n, width), -100, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, : len(ids)], labels[i, : len(lab)], mask[i, : len(ids)] = torch.tensor(ids), torch.tensor(lab), 1
    return input_ids, mask, labels


def copy_pool(tok) -> torch.Tensor:
    """Token ids of digits and common short words: the alphabet of the induction warm-up."""
    from harness.data.synthetic import ADJS, NOUNS, VERBS

    ids = {tok.convert_tokens_to_ids(str(d)) for d in range(10)}
    for w in NOUNS + ADJS + VERBS + ["is", "the", "a", "of", "and", "to", "key", "code", "value"]:
        ids.update(tok(" " + w, add_special_tokens=False).input_ids[:1])
    return torch.tensor(sorted(i for i in ids if i is not None and i > 4))


def copy_batch(batch: int, pool: torch.Tensor, gen: torch.Generator, seq: int = 256) -> torch.Tensor:
    """Induction-head warm-up: each sequence is a random span (16-48 tokens over a 64-token subset of ``pool``)
    repeated to fill the window. Measured here: from scratch, the copy circuit forms in ~100 steps on such data
    (loss on repeats 8.3 -> 0.01), while on the varied documents alone it did not form in 2,600 steps, nor on spans
    over random 64-token subsets of the whole vocabulary. No evaluation text is involved."""
    rows = []
    for _ in range(batch):
        alphabet = pool[torch.randperm(len(pool), generator=gen)[:64]]
        n = int(torch.randint(16, 49, (1,), generator=gen))
        span = alphabet[torch.randint(0, len(alphabet), (n,), generator=gen)]
        rows.append(span.repeat(seq // n + 1)[:seq])
    return torch.stack(rows)


ARCH = ("layers", "hidden", "heads", "intermediate")


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA when available, else CPU; ``cuda`` without a GPU is an error, not a silent CPU run."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pretrain_tiny: --device cuda but torch sees no CUDA device")
    return torch.device(name)


def device_label(device: torch.device, threads: int) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({threads} threads)"


def expand_layers(model, n: int) -> list[int]:
    """Block expansion (LLaMA Pro, Wu et al. 2024): insert ``n`` decoder blocks, spread evenly, each a copy of the
    block before it with its output projections (attention ``o_proj``, MLP ``down_proj``) set to zero, so that the
    new block adds nothing to the residual stream: the expanded model computes exactly what the original did, and a
    continued stage trains the added depth from there. Returns the new blocks' indices."""
    import copy

    def identity_copy(layer):
        new = copy.deepcopy(layer)
        torch.nn.init.zeros_(new.self_attn.o_proj.weight)
        torch.nn.init.zeros_(new.mlp.down_proj.weight)
        return new

    layers = list(model.model.layers)
    every = max(1, len(layers) // n) if n else 0
    out, added = [], []
    for i, layer in enumerate(layers):
        out.append(layer)
        if len(added) < n and (i + 1) % every == 0:
            added.append(len(out))
            out.append(identity_copy(layer))
    while len(added) < n:  # more new blocks than old ones: the rest after the last
        added.append(len(out))
        out.append(identity_copy(out[-1]))
    for idx, layer in enumerate(out):  # the KV cache addresses layers by index
        layer.self_attn.layer_idx = idx
    model.model.layers = torch.nn.ModuleList(out)
    model.config.num_hidden_layers = len(out)
    return added


def pretrain(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rng = random.Random(args.seed)
    from transformers import AutoTokenizer, LlamaForCausalLM

    sizes = {k: getattr(args, k) for k in ARCH if getattr(args, k) is not None}
    if args.expand_layers and not args.init_from:
        raise SystemExit("pretrain_tiny: --expand-layers grows a model given by --init-from")
    if args.init_from and args.tokenizer_from:
        raise SystemExit("pretrain_tiny: --tokenizer-from is for a fresh model; --init-from keeps its parent's")
    if args.init_from and sizes:
        raise SystemExit(f"pretrain_tiny: {', '.join('--' + k for k in sizes)} only apply to a fresh model; "
                         f"a stage continued --init-from keeps its parent's sizes")
    if args.init_from:  # continue pretraining (a later stage): same tokenizer, weights from the previous stage
        tok = AutoTokenizer.from_pretrained(args.init_from)
        tok.save_pretrained(out)
        model = LlamaForCausalLM.from_pretrained(args.init_from, dtype=torch.float32)
        previous = json.loads((Path(args.init_from) / "pretrain_stats.json").read_text())
        # a stage may change the native window and the RoPE base (the model re-adapts during the stage)
        model.config.rope_parameters = {**model.config.rope_parameters, "rope_theta": args.rope_theta}
        model.config.max_position_embeddings = args.seq_len
        model.model.rotary_emb.__init__(model.config)
        if args.expand_layers:
            added = expand_layers(model, args.expand_layers)
            print(f"block expansion: {args.expand_layers} new blocks at {added}", flush=True)
    else:
        if args.tokenizer_from:  # a fresh model on an existing tokenizer (e.g. the shipped one: rows stay comparable)
            tok = AutoTokenizer.from_pretrained(args.tokenizer_from)
            tok.save_pretrained(out)
        else:
            corpus = [d.text for d in sources.shakespeare("train")] + [d.text for d in sources.python_stdlib("train")]
            filler = FillerFactory(corpus[:20] + corpus[-20:], args.seed)
            synth = [synthetic_document(rng, filler, rng.randint(30, 250)) for _ in range(20000)]
            tok = train_tokenizer(corpus + synth, args.vocab, out)
        config = tiny_config(vocab_size=len(tok), rope_theta=args.rope_theta, bos=tok.bos_token_id,
                             eos=tok.eos_token_id, pad=tok.pad_token_id, native_ctx=args.seq_len, **sizes)
        model = LlamaForCausalLM(config)
        previous = None
    model.to(device)
    print(f"tokenizer: {len(tok)} tokens ({time.time() - t0:.0f}s); training on {device_label(device, args.threads)}",
          flush=True)

    if args.kind_weights:  # e.g. "repeat=0.45,retrieval=0.25,kv=0.2,recall=0.1" (copy-heavy curriculum stage)
        from harness.data.synthetic import set_kind_weights

        set_kind_weights(**{k: float(v) for k, v in (kv.split("=") for kv in args.kind_weights.split(","))})
    n_seq = args.steps * args.batch
    data_seed = args.seed + len((previous or {}).get("stages") or ([1] if previous else []))
    data_file = out / f".data-{n_seq}x{args.seq_len}-{data_seed}.npy"
    if data_file.exists():  # resuming: the stage's sequences are a pure function of its arguments
        data = np.load(data_file)
    else:
        data = build_sequences(tok, n_seq, data_seed, args.natural_share, args.seq_len, args.long_share,
                               args.max_doc_tokens)
        np.save(data_file, data)
    print(f"data: {n_seq} x {args.seq_len} tokens ({time.time() - t0:.0f}s)", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_at(step):
        if step < args.warmup:
            return (step + 1) / args.warmup
        if args.schedule == "constant":
            return 1.0
        p = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    answer_kinds = {k: float(v) for k, v in (kv.split("=") for kv in args.answer_kinds.split(","))}
    answer_filler = FillerFactory([d.text for d in sources.shakespeare("train")][:20]
                                  + [d.text for d in sources.python_stdlib("train")][:20], args.seed)
    answer_losses: list[float] = []
    model.train()
    losses, start = [], 0
    ckpt = out / ".resume"
    if (ckpt / "state.pt").exists():  # a killed stage restarts where its last checkpoint left it
        from safetensors.torch import load_model

        load_model(model, str(ckpt / "model.safetensors"), device=str(device))
        st = torch.load(ckpt / "state.pt", weights_only=True)
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        start, losses = int(st["step"]), [float(x) for x in st["losses"]]
        answer_losses[:] = [float(x) for x in st.get("answer_losses", [])]
        torch.set_rng_state(st["rng"])
        print(f"resumed at step {start}", flush=True)
    copy_gen = torch.Generator().manual_seed(args.seed)
    pool = copy_pool(tok)
    for step in range(start, args.steps):
        batch = torch.from_numpy(data[step * args.batch : (step + 1) * args.batch].astype(np.int64))
        if step < args.copy_warmup:
            batch = copy_batch(args.batch, pool, copy_gen, args.seq_len)
        batch = batch.to(device)
        with autocast(device, "auto"):
            loss = lm_loss = model(input_ids=batch, labels=batch).loss
        if args.answer_batch:  # the associative-recall curriculum: answer-only loss on graded documents
            ids, mask, labels = answer_batch(tok, args.answer_batch, args.seq_len, args.seed * 1_000_003 + step,
                                             answer_kinds, answer_filler)
            ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
            with autocast(device, "auto"):
                answer_loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            answer_losses.append(answer_loss.item())
            loss = loss + args.answer_weight * answer_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(lm_loss.item())
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t0
            extra = f" answer-loss {np.mean(answer_losses[-50:]):.3f}" if answer_losses else ""
            print(f"step {step} loss {np.mean(losses[-50:]):.3f}{extra} lr {sched.get_last_lr()[0]:.2e} ({el:.0f}s)",
                  flush=True)
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            from safetensors.torch import save_model

            tmp = out / ".resume.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            save_model(model, str(tmp / "model.safetensors"))
            torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step + 1,
                        "losses": torch.tensor(losses),
                        "answer_losses": torch.tensor(answer_losses), "rng": torch.get_rng_state()}, tmp / "state.pt")
            shutil.rmtree(ckpt, ignore_errors=True)
            tmp.rename(ckpt)
    model.to("cpu")
    if args.save_dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    data_file.unlink(missing_ok=True)
    stats = {
        "stages": (previous.get("stages") or [previous]) + [None] if previous else [None],
        "natural_share": args.natural_share, "long_share": args.long_share, "max_doc_tokens": args.max_doc_tokens,
        "copy_warmup_steps": args.copy_warmup, "kind_weights": args.kind_weights or "default",
        "steps": args.steps, "batch": args.batch, "seq_len": args.seq_len,
        "tokens": args.steps * args.batch * args.seq_len,
        "lr": args.lr, "warmup": args.warmup, "schedule": args.schedule, "seed": args.seed,
        "rope_theta": args.rope_theta,
        "answer_batch": args.answer_batch, "answer_weight": args.answer_weight,
        "answer_kinds": args.answer_kinds if args.answer_batch else "",
        "final_answer_loss": float(np.mean(answer_losses[-50:])) if answer_losses else None,
        "final_loss": float(np.mean(losses[-50:])), "wall_seconds": round(time.time() - t0),
        "device": device_label(device, args.threads), "expand_layers": args.expand_layers,
        "architecture": {"layers": model.config.num_hidden_layers, "hidden": model.config.hidden_size,
                         "heads": model.config.num_attention_heads, "intermediate": model.config.intermediate_size},
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
    """The base-model gate (``harness.evals.gate``): retrieval inside C, collapse past C, graded retrieval at C."""
    from harness.evals.gate import measure_gate
    from harness.models import load_model

    cfg = json.loads((out / "config.json").read_text())
    handle = load_model("tiny_llama", path=str(out), native_ctx=int(cfg["max_position_embeddings"]))
    res = measure_gate(handle, seed=seed, passkey_n=n, ruler_n=n)
    for c in res["checks"]:
        print(f"gate {c['check']}: {c['value']} ({c['rule']}: {'ok' if c['passed'] else 'FAIL'})", flush=True)
    return res


def _fmt(v, ci=None, n=None) -> str:
    if v is None:
        return "not measurable"
    s = f"{v:.2f}"
    if ci is not None:
        s += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return s + (f" (n={n})" if n is not None else "")


def write_card(out: Path, g: dict):
    """The model card's measured part (``gate.json`` + tables in ``README.md`` between the GATE markers); the
    design text above the markers is written by hand and kept."""
    stats = json.loads((out / "pretrain_stats.json").read_text())
    C = g["native_ctx"]
    lines = [
        "<!-- GATE:BEGIN (written by scripts/pretrain_tiny.py --gate-only; do not edit by hand) -->",
        f"Measured by `harness.evals.gate.measure_gate` (seed {g['seed']}), plain RoPE, C = {C}; 95% intervals "
        "(Wilson for 0/1 scores, percentile bootstrap for partial credit and for the PPL ratio, paired over "
        "documents).",
        "",
        "| check | measured [95% CI] (n) | rule | result |", "|---|---|---|---|",
    ]
    for c in g["checks"]:
        key = c["check"]
        if key.startswith("passkey"):
            L = key.split("= ")[1]
            e = g["passkey"][L]
            m = _fmt(e["value"], e["ci"], e["n"])
        elif key.startswith("books"):
            e = g["ppl_books"]["ratio_4C_over_C"]
            m = _fmt(e["value"], e["ci"], e["n"]) + " documents"
        else:
            t = key.split()[1]
            e = g["ruler"][t]
            m = _fmt(e["value"], e.get("ci"), e["n"])
        lines.append(f"| {key} | {m} | {c['rule']} | {'pass' if c['passed'] else '**FAIL**'} |")
    lines += ["", f"Gate: **{'passed' if g['passed'] else 'NOT passed'}**.", "",
              "| also measured | value |", "|---|---|"]
    for L, e in g["passkey"].items():
        lines.append(f"| passkey at {L} | {_fmt(e['value'], e['ci'], e['n'])} |")
    for key in ("ppl_books", "ppl_code"):
        e = g[key]
        ppls = " / ".join(f"{v:.1f}" for v in e["ppl"].values())
        lines.append(f"| {key} PPL at C / 4C ({e['documents']} docs) | {ppls}"
                     f"; ratio {_fmt(e['ratio_4C_over_C']['value'], e['ratio_4C_over_C']['ci'])} |")
    for t, e in g["ruler"].items():
        lines.append(f"| RULER {t} at C | {_fmt(e['value'], e.get('ci'), e['n'])} |")
    lines += ["", "| pretraining stage | steps x batch x window | lr, schedule | data | final loss | wall |",
              "|---|---|---|---|---|---|"]
    for i, st in enumerate(stats.get("stages") or []):
        lines.append(f"| {i + 1} | {st['steps']} x {st['batch']} x {st['seq_len']} | {st['lr']}, "
                     f"{st.get('schedule', 'cosine')} | natural text {st.get('natural_share', 0.45)}"
                     + (f", whole-window slices {st['long_share']}" if st.get("long_share") else "") + ", kinds "
                     f"{st.get('kind_weights', 'default')}, theta {st.get('rope_theta')} | {st['final_loss']:.3f} | "
                     f"{st['wall_seconds']} s |")
    devices = sorted({st["device"] for st in stats.get("stages") or [] if st.get("device")})
    where = "2 CPU cores" if not devices else ", ".join(devices)  # stages before devices were recorded: this CPU
    lines += ["", f"Total: {stats['steps']} steps, {stats['tokens']:,} tokens, {stats['wall_seconds']} s of "
              f"pretraining on {where}; parameters: " + f"{stats['params']:,}.",
              "<!-- GATE:END -->"]
    card = out / "README.md"
    text = card.read_text() if card.exists() else "# tiny_llama\n\n<!-- GATE:BEGIN --><!-- GATE:END -->\n"
    head, _, rest = text.partition("<!-- GATE:BEGIN")
    tail = rest.partition("<!-- GATE:END -->")[2]
    card.write_text(head + "\n".join(lines) + tail)
    (out / "gate.json").write_text(json.dumps(g, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ASSET_DIR))
    ap.add_argument("--steps", type=int, default=1400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rope-theta", type=float, default=1000.0, help="RoPE base (a continued stage may change it)")
    ap.add_argument("--seq-len", type=int, default=256, help="pretraining window = the model's native window C")
    ap.add_argument("--save-every", type=int, default=200, help="steps between resumable checkpoints (0 = none)")
    ap.add_argument("--save-dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where to train (auto: CUDA when available); bf16 autocast on CUDA and on bf16-capable CPUs")
    for k in ARCH:
        ap.add_argument(f"--{k}", type=int, default=None,
                        help=f"model {k} of a fresh model (default: tiny_config's; not with --init-from)")
    ap.add_argument("--expand-layers", type=int, default=0,
                    help="with --init-from: insert N identity-initialised blocks (LLaMA Pro block expansion)")
    ap.add_argument("--gate-samples", type=int, default=50, help="prompts per gate check (0: no gate)")
    ap.add_argument("--gate-only", action="store_true")
    ap.add_argument("--kind-weights", default="", help="synthetic document kinds, e.g. repeat=0.45,retrieval=0.25")
    ap.add_argument("--copy-warmup", type=int, default=0, help="first N steps on repeated random spans (induction)")
    ap.add_argument("--init-from", default="", help="continue pretraining from this model dir (stage 2)")
    ap.add_argument("--tokenizer-from", default="",
                    help="a fresh model (no --init-from) on this model dir's tokenizer instead of training one")
    ap.add_argument("--schedule", choices=["cosine", "constant"], default="cosine",
                    help="after warm-up: cosine to 10%% of lr, or constant")
    ap.add_argument("--natural-share", type=float, default=0.45,
                    help="share of sequences' documents that are natural text")
    ap.add_argument("--max-doc-tokens", type=int, default=0, help="cap on synthetic document length (0: the window)")
    ap.add_argument("--long-share", type=float, default=0.0,
                    help="share of windows that are one contiguous slice of a book / source file (no packing)")
    ap.add_argument("--answer-batch", type=int, default=0,
                    help="graded documents per step with the loss on their answers only (0: none)")
    ap.add_argument("--answer-weight", type=float, default=1.0, help="weight of that answer-only loss")
    ap.add_argument("--answer-kinds", default="lookup=0.5,multivalue=0.25,chain=0.25",
                    help="kinds of the answer-supervised documents")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.gate_only:
        pretrain(args)
    if args.gate_samples > 0:  # 0: an intermediate stage, no gate
        write_card(Path(args.out), gate(Path(args.out), args.gate_samples, seed=1234))


if __name__ == "__main__":
    main()
