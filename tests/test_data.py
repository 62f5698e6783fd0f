"""Fine-tuning data: per-source length upsampling (Fu et al. 2024), exact packing, document positions, caches."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, load_file_module, random_llama

from harness.data.mixture import (
    long_token_share,
    mixture_stats,
    pack,
    sample_mixture,
    source_budgets,
    source_token_shares,
)
from harness.train.step import add_document_positions, document_position_ids
from tests import forkrun

BOS, EOS = 1, 2
RANGES = {"books": (10, 1000), "code": (1000, 2000), "web": (2000, 3000)}  # token ids identify the source


def _corpus(seed=0):
    """Three sources with log-normal document lengths (few long ones), token ids in a per-source range."""
    rng = np.random.default_rng(seed)
    out = {}
    for (src, (lo, hi)), mu in zip(RANGES.items(), (5.5, 5.0, 4.5)):
        lens = np.clip(rng.lognormal(mu, 1.0, size=400).astype(int), 5, 4000)
        out[src] = [list(rng.integers(lo, hi, size=n)) for n in lens]
    return out


def _packed_shares(arr):
    flat = arr.reshape(-1)
    return {s: float(((flat >= lo) & (flat < hi)).sum()) for s, (lo, hi) in RANGES.items()}


def test_budgets_sum_exactly():
    b = source_budgets({"a": 1, "b": 1, "c": 1}, 1000)
    assert sum(b.values()) == 1000 and max(b.values()) - min(b.values()) <= 1


@pytest.mark.parametrize("seq_len", [256, 512])
def test_shares_kept_long_share_raised_chunks_exact(seq_len):
    docs = _corpus()
    shares = {"books": 0.5, "code": 0.3, "web": 0.2}
    n = seq_len * 300
    picks = sample_mixture(docs, shares, n, seq_len, upsample=5.0, seed=0)
    arr = pack(docs, picks, seq_len, n, BOS, EOS)
    assert arr.shape == (300, seq_len)  # every chunk exactly the training length
    # shares measured on the packed chunks themselves (document tokens, identified by their id range)
    counted = _packed_shares(arr)
    tot = sum(counted.values())
    for s, target in shares.items():
        assert abs(counted[s] / tot - target) < 0.01, (s, counted[s] / tot, target)
    for s, v in source_token_shares(picks).items():
        assert abs(v - shares[s]) < 0.01
    lengths = {s: [len(d) for d in v] for s, v in docs.items()}
    natural = long_token_share(lengths, None, seq_len)
    sampled = long_token_share(lengths, picks, seq_len)
    assert sampled > natural + 0.05, (natural, sampled)
    # per source too: the mix is kept *and* each source gets longer
    st = mixture_stats(docs, picks, shares, seq_len)
    for s in shares:
        assert st["sources"][s]["long_share_sampled"] > st["sources"][s]["long_share_natural"]
    # without upsampling the long share stays near the natural one
    flat = sample_mixture(docs, shares, n, seq_len, upsample=1.0, seed=0)
    assert abs(long_token_share(lengths, flat, seq_len) - natural) < abs(sampled - natural) / 2


def test_packing_crosses_document_boundaries_and_wraps_documents():
    docs = {"a": [[5] * 10, [6] * 7], "b": [[7] * 3]}
    picks = sample_mixture(docs, {"a": 0.5, "b": 0.5}, 32, long_threshold=8, upsample=1.0, seed=1)
    arr = pack(docs, picks, 8, 32, BOS, EOS, pad=0)
    assert arr.shape == (4, 8)
    flat = arr.reshape(-1).tolist()
    assert flat[0] == BOS and flat.count(BOS) == flat.count(EOS) >= 3
    assert sum(1 for i in range(1, 4) if arr[i, 0] not in (BOS,)) >= 1  # some chunk starts mid-document


def test_sampling_is_deterministic():
    docs = _corpus(1)
    s = {"books": 0.2, "code": 0.4, "web": 0.4}
    a = pack(docs, sample_mixture(docs, s, 4096, 256, 4.0, seed=3), 256, 4096, BOS, EOS)
    b = pack(docs, sample_mixture(docs, s, 4096, 256, 4.0, seed=3), 256, 4096, BOS, EOS)
    c = pack(docs, sample_mixture(docs, s, 4096, 256, 4.0, seed=4), 256, 4096, BOS, EOS)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_document_position_ids():
    ids = torch.tensor([[9, 9, BOS, 9, 9, 9, BOS, 9], [BOS, 9, 9, 9, 9, 9, 9, 9]])
    pos = document_position_ids(ids, BOS)
    assert pos.tolist() == [[0, 1, 0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]]
    batch = add_document_positions({"input_ids": ids, "labels": ids}, BOS)
    assert torch.equal(batch["position_ids"], pos) and batch["use_cache"] is False


def test_document_masking_isolates_documents():
    """With document position ids, the second packed document's logits equal those of the document alone: the
    positions restart and attention does not reach back into the first document (transformers' packed mask)."""
    m = random_llama(vocab=64, ctx=64)
    g = torch.Generator().manual_seed(0)
    d1 = torch.cat([torch.tensor([BOS]), torch.randint(3, 64, (11,), generator=g)])
    d2 = torch.cat([torch.tensor([BOS]), torch.randint(3, 64, (9,), generator=g)])
    packed = torch.cat([d1, d2])[None]
    with torch.no_grad():
        alone = m(input_ids=d2[None]).logits[0]
        masked = m(**{k: v for k, v in add_document_positions({"input_ids": packed}, BOS).items()}).logits[0, len(d1):]
        plain = m(input_ids=packed, use_cache=False).logits[0, len(d1):]
    torch.testing.assert_close(masked, alone, atol=1e-5, rtol=1e-5)
    assert (plain - alone).abs().max() > 1e-3  # without it the documents do see each other


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ROOT / "harness" / "assets" / "tiny_llama")


def test_local_mix_builds_exact_chunks_and_reuses_cache(tokenizer, tmp_path, monkeypatch):
    from harness.data import build_data
    from harness.data.local_mix import LocalMix

    cfg = {"name": "local_mix", "shares": {"shakespeare": 0.6, "synthetic": 0.4}, "long_threshold": 0,
           "upsample": 4.0, "doc_tokens": 1024, "synthetic_docs": 30, "cache_dir": str(tmp_path), "seed": 0}
    arr = build_data(cfg, tokenizer, 256, 256 * 24)
    assert arr.shape == (24, 256) and isinstance(arr, np.memmap)
    meta = json.loads(next(tmp_path.glob("*.json")).read_text())
    for s, t in meta["stats"]["target_shares"].items():
        assert abs(meta["stats"]["shares"][s] - t) < 0.01
    assert meta["stats"]["long_share_sampled"] > meta["stats"]["long_share_natural"]
    monkeypatch.setattr(LocalMix, "documents", lambda *a, **k: pytest.fail("cache not reused"))
    again = build_data(cfg, tokenizer, 256, 256 * 24)
    assert np.array_equal(np.asarray(arr), np.asarray(again))


def test_one_build_per_cache_key_under_the_lock(tokenizer, tmp_path, capsys):
    """Two builders of one key at once (the array tasks of a sweep, or a run started while scripts/build_data.py
    builds; threads here, each with its own file lock): the build runs once, and the one that waited on the lock
    loads the finished file."""
    import threading
    import time

    from harness.data import DataArgs, cached_chunks

    calls, out, start = [], [None, None], threading.Barrier(2)

    def build():
        calls.append(threading.get_ident())
        time.sleep(0.5)  # both are past the "is it cached?" check before the file exists
        return np.arange(64, dtype=np.uint16).reshape(4, 16)

    def worker(i):
        start.wait()
        out[i] = cached_chunks(DataArgs(name="lock", cache_dir=str(tmp_path)), tokenizer, 16, 64, build)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert all(isinstance(a, np.memmap) and np.array_equal(a, np.arange(64).reshape(4, 16)) for a in out)
    assert "another process is building it; waiting for its lock" in capsys.readouterr().err


def test_local_mix_synthetic_kinds(tokenizer):
    """The fine-tuning mix's synthetic documents follow ``synthetic_kinds`` (default: tiny_llama's last
    pretraining stage, mostly ``cued``); an unknown kind is a config error."""
    from harness.config import ConfigError
    from harness.data.local_mix import LocalMix, _default_kinds

    def docs(kinds):
        a = LocalMix.Args(shares={"synthetic": 1.0}, synthetic_docs=40, synthetic_kinds=kinds, seed=0)
        return [tokenizer.decode(d) for d in LocalMix.documents(a, tokenizer, 256)["synthetic"]]

    assert max(_default_kinds(), key=_default_kinds().get) == "cued"
    repeat_only = docs({"repeat": 1.0})
    default = docs({})
    assert len(repeat_only) == len(default) == 40 and repeat_only != default
    with pytest.raises(ConfigError, match="unknown synthetic kinds"):
        docs({"passkey": 1.0})


def _write_shards(d, seed=0):
    rng = np.random.default_rng(seed)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    for k, src in enumerate(["RedPajamaC4", "RedPajamaGithub", "RedPajamaBook"]):
        with open(d / f"shard_{k}.jsonl", "w") as f:
            for _ in range(150):
                n = int(np.clip(rng.lognormal(3.5 + k * 0.5, 1.0), 3, 3000))
                doc = {"text": " ".join(rng.choice(words, n)), "meta": {"redpajama_set_name": src}}
                f.write(json.dumps(doc) + "\n")


def test_slimpajama_upsampled_streams_local_shards(tokenizer, tmp_path):
    from harness.data import build_data

    shards = tmp_path / "slim"
    shards.mkdir()
    _write_shards(shards)
    shares = {"RedPajamaC4": 0.5, "RedPajamaGithub": 0.25, "RedPajamaBook": 0.25}
    cfg = {"name": "slimpajama_upsampled", "path": str(shards), "shares": shares, "long_threshold": 256,
           "upsample": 5.0, "chars_per_token": 3.0, "cache_dir": str(tmp_path / "cache"), "seed": 0}
    arr = build_data(cfg, tokenizer, 128, 128 * 40)
    assert arr.shape == (40, 128)
    stats = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())["stats"]
    for s, t in shares.items():
        assert abs(stats["shares"][s] - t) < 0.01
    assert stats["long_share_sampled"] > stats["long_share_natural"]
    from harness.config import ConfigError

    with pytest.raises(ConfigError, match="ran out"):
        build_data({**cfg, "seed": 1}, tokenizer, 128, 128 * 4000)


@pytest.mark.integration
def test_prepare_cluster_data_dry_run(tmp_path):
    out = forkrun.run([sys.executable, str(ROOT / "scripts" / "prepare_cluster_data.py"), "--root", str(tmp_path),
                          "--dry-run"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "SlimPajama" in out.stdout and "meta-llama/Llama-2-7b-hf" in out.stdout


def test_graded_documents_mark_their_answers_and_plain_text_is_unchanged():
    """The graded kinds mark their answers for the answer-only curriculum (scripts/pretrain_tiny.py, stage 8): the
    spans cover exactly the answer after the question, the marks never reach the text, and asking for the spans
    does not change the document drawn (same rng, same text)."""
    import random

    from harness.data.synthetic import ANSWER_CLOSE, ANSWER_OPEN, FillerFactory, split_answers, synthetic_document

    filler = FillerFactory(["a line of filler text here", "another line of plain words"] * 10, 0)
    assert split_answers(f"x {ANSWER_OPEN}42{ANSWER_CLOSE} y {ANSWER_OPEN}b{ANSWER_CLOSE}") == ("x 42 y b",
                                                                                                [(2, 4), (7, 8)])
    for kind in ("lookup", "lookup_free", "multivalue", "chain"):
        for seed in range(20):
            text, spans = synthetic_document(random.Random(seed), filler, 200, kind=kind, answers=True)
            assert text == synthetic_document(random.Random(seed), filler, 200, kind=kind)
            assert spans and ANSWER_OPEN not in text and ANSWER_CLOSE not in text
            for s, e in spans:  # an answer is non-empty and also appears before its question (it is retrievable),
                answer = text[s:e]  # except variable tracking's list of names, which is assembled from the chain
                assert answer.strip() == answer and answer
                if kind.startswith("lookup"):
                    assert answer in text[:s]
            assert spans[-1][1] == len(text) or kind.startswith("lookup")
    text, spans = synthetic_document(random.Random(0), filler, 200, kind="cued", answers=True)
    assert spans == [] and text == synthetic_document(random.Random(0), filler, 200, kind="cued")


def test_answer_batch_supervises_answers_only(tokenizer):
    """The stage-8 batch: labels are -100 except on the answer tokens, which decode to the marked answers."""
    import random

    from harness.data.synthetic import FillerFactory, synthetic_document

    mod = load_file_module(ROOT / "scripts" / "pretrain_tiny.py")
    filler = FillerFactory(["a line of filler text here", "another line of plain words"] * 10, 0)
    ids, mask, labels = mod.answer_batch(tokenizer, 6, 256, seed=3, kinds={"lookup": 1.0}, filler=filler)
    assert ids.shape == labels.shape == mask.shape and ids.shape[0] == 6 and ids.shape[1] <= 256
    assert ((labels != -100) <= (mask == 1)).all() and (labels != -100).sum() > 0
    assert (labels[labels != -100] == ids[labels != -100]).all()
    rng = random.Random(3)  # the first document of the batch, drawn again
    text, spans = synthetic_document(rng, filler, rng.randint(40, 254),
                                     lambda t: len(tokenizer(t, add_special_tokens=False).input_ids),
                                     kind=rng.choices(["lookup"], [1.0])[0], answers=True)
    supervised = tokenizer.decode(ids[0][labels[0] != -100]).replace(" ", "")
    assert supervised == "".join(text[s:e] for s, e in spans).replace(" ", "")
