"""lceg_tokens: the paper's released fine-tuning tokens, read as the paper trained on them.

The controlled study released its training data on the Hugging Face hub (LCEG README, "Training Data"):
``Leooyii/Slimpajama_downsample_32k_1B`` (30,774 examples of 32K tokens, ~1B tokens), ``..._64k_1B`` (15,386 of
64K) and ``..._64k_2B`` (30,780 of 64K), built from SlimPajama with Fu et al.'s per-source length upsampling (the
recipe ``slimpajama_upsampled`` rebuilds). LCEG's ``continuous_finetuning/fine-tune.py`` loads the files with
``datasets.load_dataset('json', data_files=dataset_dir)`` and gives the ``input_ids`` column to the Trainer: token
ids of LLaMA-2's tokenizer, every example exactly ``model_max_length`` tokens long, already packed; the other
columns are not used. This builder does the same over a local copy (``scripts/prepare_cluster_data.py --only
lceg_tokens`` downloads it): it reads ``input_ids`` from the ``*.json`` / ``*.jsonl`` / ``*.jsonl.zst`` /
``*.parquet`` files under ``path`` and keeps the first ``n_tokens // seq_len`` examples in file order (files in
their numbering order, rows in file order: the release's own order; the training loop shuffles as it does for
every data set), then stores them in the memory-mapped cache like every builder.

Refused, each in one line: a tokenizer whose vocabulary is not LLaMA-2's 32,000 ids (the ids would mean other
tokens: Phi-2, the tiny model), a ``seq_len`` other than the examples' length (32K examples cannot be cut or joined
into 64K ones without changing what the paper trained on: the 64K releases exist), a token id outside the
vocabulary and a budget larger than the files hold.
"""
from __future__ import annotations

import dataclasses
import io
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.config import ConfigError
from harness.data import DATA, DataArgs, cached_chunks
from harness.data.slimpajama_upsampled import shard_files

LLAMA2_VOCAB = 32000  # LLaMA-2's SentencePiece vocabulary: the tokenizer that made the released ids
SUFFIXES = (".json", ".jsonl", ".jsonl.zst", ".parquet")
# the LCEG README's three releases: examples x length (its Download column links all three rows to the 32k_1B
# page; the 64k ids follow the same naming)
RELEASES = {"32k_1B": (30774, 32768), "64k_1B": (15386, 65536), "64k_2B": (30780, 65536)}


def hub_id(release: str) -> str:
    return f"Leooyii/Slimpajama_downsample_{release}"


def iter_examples(f: Path):
    """Yield the ``input_ids`` of each example of one file, in file order, as int64 arrays."""
    if f.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(f)
        if "input_ids" not in pf.schema_arrow.names:
            raise ConfigError(f"data=lceg_tokens: {f} has no input_ids column (columns: {pf.schema_arrow.names})")
        for batch in pf.iter_batches(columns=["input_ids"], batch_size=16):
            for ids in batch.column(0).to_pylist():
                yield np.asarray(ids, dtype=np.int64)
        return
    if f.name.endswith(".zst"):
        import zstandard

        fh = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(f, "rb")), encoding="utf-8")
    else:
        fh = open(f, encoding="utf-8")
    with fh:
        head = fh.readline()
        if head.lstrip().startswith("["):  # one JSON array of records (datasets' json loader reads this form too)
            rows = json.loads(head + fh.read())
        else:  # JSON Lines
            rows = (json.loads(line) for line in itertools.chain([head], fh) if line.strip())
        for r in rows:
            if not isinstance(r, dict) or "input_ids" not in r:
                raise ConfigError(f"data=lceg_tokens: {f} holds a record without input_ids")
            yield np.asarray(r["input_ids"], dtype=np.int64)


@DATA.register("lceg_tokens")
class LcegTokens:
    @dataclass
    class Args(DataArgs):
        name: str = "lceg_tokens"
        path: str = ""  # local copy of one release (scripts/prepare_cluster_data.py --only lceg_tokens)

    @staticmethod
    def build(a: LcegTokens.Args, tokenizer, seq_len: int, n_tokens: int):
        path = Path(a.path)
        files = shard_files(path, SUFFIXES) if a.path and path.is_dir() else []
        if not files:
            raise ConfigError(f"data=lceg_tokens: no *.json / *.jsonl / *.jsonl.zst / *.parquet files under "
                              f"data.path={a.path!r} (download them with scripts/prepare_cluster_data.py --only "
                              f"lceg_tokens)")
        # the base vocabulary: tokens a method adds on top (landmark's <landmark>) do not change what the ids mean
        vocab = getattr(tokenizer, "vocab_size", None) or len(tokenizer)
        if vocab != LLAMA2_VOCAB:
            raise ConfigError(f"data=lceg_tokens: the released ids are LLaMA-2 tokens ({LLAMA2_VOCAB:,}-id "
                              f"vocabulary) but this model's tokenizer has {vocab:,} ids; use model=llama2_7b, or "
                              f"data=slimpajama_upsampled to tokenise SlimPajama with this tokenizer")
        n = n_tokens // seq_len

        def make():
            arr = np.empty((n, seq_len), dtype=np.uint16)  # LLaMA-2 ids < 65,536 (checked below)
            got, used = 0, []
            for f in files:
                used.append(f.name)
                for row, ids in enumerate(iter_examples(f)):
                    if len(ids) != seq_len:
                        fits = [r for r, (_, length) in RELEASES.items() if length == seq_len]
                        hint = f"the {' / '.join(fits)} release" if fits else "no release (32768 or 65536)"
                        raise ConfigError(f"data=lceg_tokens: the examples under {a.path} are {len(ids):,} tokens "
                                          f"long ({f.name} row {row}) but train.seq_len={seq_len:,}; that length "
                                          f"is {hint}")
                    if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
                        raise ConfigError(f"data=lceg_tokens: {f.name} row {row} holds token id {int(ids.max())} "
                                          f"outside LLaMA-2's {vocab:,}-id vocabulary: not the released tokens")
                    arr[got] = ids
                    got += 1
                    if got == n:
                        break
                if got == n:
                    break
            if got < n:
                raise ConfigError(f"data=lceg_tokens: {a.path} holds {got:,} examples of {seq_len:,} tokens "
                                  f"({got * seq_len:,} tokens) but train.tokens={n_tokens:,} needs {n:,}")
            return arr, {"source": str(path), "files": used, "examples": n, "order": "file order (the release's)",
                         "tokens": {"lceg_tokens": n * seq_len}}

        # the tokens do not depend on the seed: one cache file serves every seed of a sweep
        return cached_chunks(dataclasses.replace(a, seed=0), tokenizer, seq_len, n_tokens, make)
