"""The held-out look-up probe of the tiny_llama model card ("The associative-recall curriculum, tried").

    python scripts/probes/lookup_probe.py                             # exact match of the shipped weights
    python scripts/probes/lookup_probe.py --steps 300 --out DIR       # + 300 answer-only training steps, then again

Documents: 2-8 statements of one ``harness.data.synthetic`` lookup pattern (key style, value style, noun, wording and
separator drawn per document), shuffled, then questions about a random subset of the keys, each followed by an
answer prefix and the value. The score is teacher-forced exact match: a question counts when the model's argmax
predicts every token of its value. The held-out set is 150 documents drawn with seed 999 (about 400 questions);
training documents come from seed 1, with labels on the values only (``-100`` elsewhere). No filler: this probe
measures whether the look-up exists at all on the training formats, not retrieval over a haystack (RULER does
that, on templates the model never saw).
"""
from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch

from harness.data import synthetic as S
from harness.models.tiny_llama import ASSET_DIR


def document(rng: random.Random) -> tuple[str, list[tuple[int, int]]]:
    n = rng.randint(2, 8)
    ks, vs = rng.randrange(6), rng.randrange(4)
    keys = S._distinct(rng, n, lambda: S._key(rng, ks))
    vals = [S._lookup_value(rng, vs) for _ in keys]
    noun, stmt, sep = rng.choice(S.LOOKUP_NOUNS), rng.choice(S.LOOKUP_STATEMENTS), rng.choice(S.SEPARATORS)
    order = list(range(len(keys)))
    rng.shuffle(order)
    text = sep.join(stmt.format(n=noun, k=keys[i], v=vals[i]) for i in order)
    spans = []
    asked = list(range(len(keys)))
    rng.shuffle(asked)
    for i in asked[: rng.randint(1, len(keys))]:
        q = rng.choice(S.LOOKUP_QUESTIONS).format(n=noun, k=keys[i])
        prefixes = S.LOOKUP_ANSWER_PREFIXES if rng.random() < 0.75 else S.LOOKUP_ANSWER_ADJACENT
        prefix = rng.choice(prefixes).format(n=noun, k=keys[i])
        text += sep + q + rng.choice([" ", "\n"]) + prefix
        start = len(text) + 1
        text += " " + vals[i]
        spans.append((start, len(text)))
    return text, spans


def encode(tok, text: str, spans, maxlen: int = 400):
    enc = tok(text, return_offsets_mapping=True)
    ids, offsets = enc.input_ids[:maxlen], enc.offset_mapping[:maxlen]
    labels, questions = [-100] * len(ids), []
    for s, e in spans:
        idx = [j for j, (a, b) in enumerate(offsets) if b > a and a < e and b > s and text[a:b].strip()]
        for j in idx:
            labels[j] = ids[j]
        if idx:
            questions.append(idx)
    return ids, labels, questions


def batch(tok, items):
    width = max(len(x[0]) for x in items)
    ids = torch.full((len(items), width), tok.pad_token_id)
    labels = torch.full((len(items), width), -100)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for b, (x, y, _) in enumerate(items):
        ids[b, : len(x)], labels[b, : len(y)], mask[b, : len(x)] = torch.tensor(x), torch.tensor(y), 1
    return ids, labels, mask


@torch.no_grad()
def exact_match(model, tok, held_out) -> tuple[float, int]:
    model.eval()
    hit = total = 0
    for i in range(0, len(held_out), 25):
        items = held_out[i : i + 25]
        ids, _, mask = batch(tok, items)
        pred = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
        for b, (_, _, questions) in enumerate(items):
            for idx in questions:
                total += 1
                hit += all(int(pred[b, j - 1]) == int(ids[b, j]) for j in idx)
    model.train()
    return hit / max(total, 1), total


def main():
    from transformers import AutoTokenizer, LlamaForCausalLM

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ASSET_DIR))
    ap.add_argument("--steps", type=int, default=0, help="answer-only training steps before measuring again")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="", help="save the trained weights here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    held_rng = random.Random(999)
    held_out = [encode(tok, *document(held_rng)) for _ in range(150)]
    acc, n = exact_match(model, tok, held_out)
    print(f"step 0: exact match {acc:.3f} (n = {n} questions)", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    rng, t0, losses = random.Random(1), time.time(), []
    model.train()
    for step in range(a.steps):
        ids, labels, mask = batch(tok, [encode(tok, *document(rng)) for _ in range(a.batch)])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            acc, n = exact_match(model, tok, held_out)
            print(f"step {step + 1}: answer loss {np.mean(losses[-25:]):.3f}, exact match {acc:.3f} (n = {n}) "
                  f"({time.time() - t0:.0f} s)", flush=True)
    if a.out:
        model.save_pretrained(a.out)
        tok.save_pretrained(a.out)


if __name__ == "__main__":
    main()
