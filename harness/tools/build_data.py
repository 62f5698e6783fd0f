"""Build the fine-tuning data a run will read, before the GPU job: on a login or CPU node, so the job only loads it.

    python scripts/build_data.py experiment=paper_llama2 point=paper_llama2/ntk_32k     # one row's data
    python scripts/build_data.py -m experiment=paper_llama2                             # every job of the sweep
    python scripts/build_data.py experiment=paper_llama2 point=paper_llama2/yarn --tokenizer-only

The config is composed as ``run.py`` composes it and validated as it is (a CPU mixture under the paper's recipe is
refused here too). The tokenizer is the one the run's ranks use: the model is loaded and the method applied, as in
``harness.train.deepspeed_engine.train_rank`` (a method may extend the tokenizer: landmark adds ``<landmark>``),
and the run's own ``harness.data.build_data`` is called with the recipe's ``seq_len`` and ``tokens``: the same cache
key, hence the same file (``harness.data.cached_chunks``: one build per key, under a lock, so a run started
meanwhile waits and then loads it). ``--tokenizer-only`` skips the weights (seconds instead of a 13 GB load; the
same key for every method that leaves the tokenizer as loaded, i.e. all but landmark on a tokenizer without
``<landmark>``). Prints the cache file and the tokens per source.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness import conf_utils, pipeline, sweeps
from harness.config import ConfigError
from harness.data import build_data
from harness.models import MODELS, build_model


def tokenizer_of(cfg, method, tokenizer_only: bool):
    """The tokenizer the run's training ranks tokenise with: the model's, after the method is applied; with
    ``tokenizer_only`` the model's as loaded (``harness.models.load_pretrained``'s rules, without weights)."""

    if not tokenizer_only:
        handle = build_model(cfg.model)
        method.apply(handle)
        return handle.tokenizer
    from transformers import AutoTokenizer

    name = cfg.model.get("name")
    cls, args = MODELS.args(cfg.model, f"model={name}", name=cfg.model.get("builder") or name)
    path, gguf = cls.source(args) if hasattr(cls, "source") else (args.path, args.gguf_file)
    kw = {"gguf_file": gguf} if gguf else {}
    if not os.path.isdir(path) and not gguf:
        kw["local_files_only"] = os.environ.get("HF_HUB_OFFLINE", "1") == "1"
    try:
        tok = AutoTokenizer.from_pretrained(path, **kw)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot load the tokenizer from {path!r}: {first}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def build_one(overrides: list[str], tokenizer_only: bool) -> dict | None:
    """Build (or find) the data of the run these overrides compose; None for a run that does not fine-tune."""

    cfg = conf_utils.compose(overrides)
    method, train = pipeline.validate(cfg, data=False)
    if not train.enabled:
        return None
    cache_dir = Path(str(cfg.data.cache_dir))
    before = set(cache_dir.glob("*.npy")) if cache_dir.is_dir() else set()
    chunks = build_data(cfg.data, tokenizer_of(cfg, method, tokenizer_only), train.seq_len, train.tokens)
    path = Path(chunks.filename).resolve()
    stats = json.loads(path.with_suffix(".json").read_text()).get("stats") or {}
    return {"path": str(path), "built": path not in {p.resolve() for p in before}, "shape": list(chunks.shape),
            "data": cfg.data.name, "tokens": stats.get("tokens") or {}}


def main(argv=None) -> int:
    """build a run's tokenised data cache before its GPU job."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--multirun", action="store_true", help="every job of the sweep the overrides define")
    p.add_argument("--tokenizer-only", action="store_true", help="load the tokenizer, not the weights")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for run.py")
    a = p.parse_args(argv)
    jobs = sweeps.expand(a.overrides) if a.multirun else [a.overrides]
    for overrides in jobs:
        try:
            got = build_one(overrides, a.tokenizer_only)
        except ConfigError as e:
            print(f"{' '.join(overrides)}: {e}", file=sys.stderr)
            return 1
        if got is None:
            print(f"{' '.join(overrides)}: no fine-tuning (train.enabled=false), no data")
            continue
        total = sum(got["tokens"].values())
        print(f"{' '.join(overrides)}: data={got['data']} {got['shape'][0]:,} x {got['shape'][1]:,} tokens "
              f"({'built' if got['built'] else 'already built'}) -> {got['path']}")
        for src, n in sorted(got["tokens"].items(), key=lambda kv: -kv[1]):
            print(f"  {src:<24} {n:>15,} tokens  {n / max(1, total):6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
