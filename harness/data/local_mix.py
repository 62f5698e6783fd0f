"""local_mix: the controlled study's data recipe over offline sources (this machine).

Sources: Shakespeare plays (books, PG19-like), CPython stdlib (code, Proof-pile-like) and the tiny model's synthetic
retrieval documents (``harness.data.synthetic``, varied formats, lengths drawn up to the training length). Same
builder as ``slimpajama_upsampled`` (``harness.data.mixture``): per-source token shares, length upsampling,
packing across document boundaries into chunks of exactly the training length.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from harness import progress
from harness.config import ConfigError
from harness.data import DATA, DataArgs, cached_chunks
from harness.data.mixture import mixture_stats, pack, sample_mixture
from harness.data.sources import load_source
from harness.data.synthetic import KINDS, FillerFactory, synthetic_document


def _default_shares():
    return {"shakespeare": 0.45, "python_stdlib": 0.25, "synthetic": 0.30}


def _default_kinds():
    """The synthetic kinds of tiny_llama's retrieval stage (Makefile, stage 5): long-context fine-tuning continues
    a distribution the model was pretrained on, at the longer length, as the paper's SlimPajama mixture continues
    LLaMA2's. Without ``cued`` (the kind that taught the model to retrieve) fine-tuning data would carry no
    retrieval signal the model can use. (Stages 6-7 added graded-retrieval kinds; the fine-tuning mixture was kept
    as it is so that the recipe's learning curves (docs/recipe.md) and the study's rows use the same data.)"""
    return {"cued": 0.70, "repeat": 0.15, "retrieval": 0.05, "kv": 0.05, "recall": 0.05}


@DATA.register("local_mix")
class LocalMix:
    @dataclass
    class Args(DataArgs):
        name: str = "local_mix"
        # token share per source; empty = _default_shares(). (A non-empty dataclass default would be *merged* with
        # the YAML's dict by harness.config.to_args, silently adding sources.)
        shares: dict = field(default_factory=dict)
        long_threshold: int = 0  # 0 = the training length
        upsample: float = 4.0  # short documents are kept with probability 1/upsample, long ones always (Fu et al.)
        doc_tokens: int = 4096  # natural texts are cut into documents of at most this many tokens
        synthetic_docs: int = 600
        synthetic_kinds: dict = field(default_factory=dict)  # kind -> weight; empty = _default_kinds()

    @staticmethod
    def documents(a: LocalMix.Args, tokenizer, seq_len: int) -> dict[str, list[list[int]]]:
        enc = lambda t: tokenizer(t, add_special_tokens=False).input_ids  # noqa: E731
        out: dict[str, list[list[int]]] = {}
        rng = random.Random(a.seed)
        ticker = progress.Ticker()   # a line at once, then every HARNESS_PROGRESS_S seconds: the counts so far
        for src in a.shares:
            ticker.tick(f"data local_mix: {sum(len(d) for d in out.values())} documents tokenised; now {src}",
                        force=True)
            if src == "synthetic":
                texts = [d.text for d in load_source("shakespeare", "train")[:4]]
                filler = FillerFactory(texts, a.seed)
                count = lambda t: len(enc(t))  # noqa: E731
                kinds, weights = zip(*(a.synthetic_kinds or _default_kinds()).items())
                unknown = sorted(set(kinds) - set(KINDS))
                if unknown:
                    raise ConfigError(f"data=local_mix: unknown synthetic kinds {unknown} (known: {sorted(KINDS)})")
                docs = []
                for k in range(a.synthetic_docs):  # log-uniform lengths: many short, some as long as seq_len
                    ticker.tick(lambda k=k: f"data local_mix: synthetic {k}/{a.synthetic_docs} documents")
                    budget = int(32 * (max(seq_len, 64) / 32) ** rng.random())
                    kind = rng.choices(kinds, weights)[0]
                    docs.append(enc(synthetic_document(rng, filler, budget, count, kind=kind)))
                out[src] = docs
            else:
                docs = []
                for k, d in enumerate(load_source(src, "train")):
                    ticker.tick(lambda k=k, src=src, docs=docs: f"data local_mix: {src}: {k} texts read, {len(docs)} "
                                                                f"documents tokenised")
                    ids = enc(d.text)
                    # cut long texts into documents of random length <= doc_tokens (a mix of short and long)
                    i = 0
                    while i < len(ids):
                        n = rng.randint(a.doc_tokens // 8, a.doc_tokens)
                        docs.append(ids[i : i + n])
                        i += n
                out[src] = docs
        return out

    @staticmethod
    def build(a: LocalMix.Args, tokenizer, seq_len: int, n_tokens: int):
        if not a.shares:
            a.shares = _default_shares()
        def make():
            docs = LocalMix.documents(a, tokenizer, seq_len)
            n = (n_tokens // seq_len) * seq_len  # exactly the packed size: realised shares = targets
            threshold = a.long_threshold or seq_len
            overhead = (tokenizer.bos_token_id is not None) + (tokenizer.eos_token_id is not None)
            picks = sample_mixture(docs, a.shares, n, threshold, a.upsample, a.seed, overhead)
            arr = pack(docs, picks, seq_len, n, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
            return arr, mixture_stats(docs, picks, a.shares, threshold, overhead)

        return cached_chunks(a, tokenizer, seq_len, n_tokens, make)
