"""Intrinsic evaluators: PPL protocols, NLL by position, NIAH, passkey, RULER (issue 6).

Fast tier: small random Llamas (hidden 64) and the shipped tiny tokenizer (harness/assets/tiny_llama, present
before the weights). Every check compares against an independent computation: HF's own ``labels=`` loss, the
reference loops written out here from the originals, RULER's metric definitions on hand-made cases."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_llama

from harness.evals import EvalContext
from harness.evals import ruler_data as rd
from harness.evals.common import PrefixCache, greedy_generate, token_nll
from harness.evals.niah import LCEG_EXPECTED, NeedleInAHaystack, insert_needle, lceg_score, period_ids, rouge_score
from harness.evals.nll_by_position import NLLByPosition, bucket_means
from harness.evals.ppl import Perplexity, longlora_starts, yarn_windows
from harness.evals.ruler import Ruler
from harness.evals.templates import EVAL_FRAGMENTS, NIAH_NEEDLE, RULER_TASKS
from harness.models import ModelHandle

ROOT = Path(__file__).resolve().parents[1]
TINY_TOK = ROOT / "harness" / "assets" / "tiny_llama"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_TOK))


@pytest.fixture(scope="module")
def model64():
    return random_llama(vocab=4096, hidden=64, layers=2, heads=4, ctx=256, seed=1)


class Limit:
    """A method stand-in with a maximum length (lengths beyond it must become skip entries)."""

    name = "limit"

    def __init__(self, n=None):
        self.n = n

    def max_length(self, handle):
        return self.n


def ctx(tmp_path):
    return EvalContext(tmp_path, 0, "float32")


def toy_docs(tmp_path, n_docs=3, words=900):
    d = tmp_path / "docs"
    d.mkdir(exist_ok=True)
    rng = random.Random(0)
    vocab = "the a king queen river stone light dark went came saw said and of to in".split()
    for i in range(n_docs):
        (d / f"doc{i}.txt").write_text(" ".join(rng.choice(vocab) for _ in range(words)) + ".")
    return d


# --- PPL protocols ------------------------------------------------------------------------------------------------
def reference_yarn_scored(seq_len, L, stride, truncate, add_bos):
    """jquesnelle/yarn eval/perplexity.py, the loop written out: tokens scored per window."""
    max_tok = L - 1 if add_bos else L
    if truncate:
        seq_len, stride = min(seq_len, max_tok), max_tok
    prev_end, out = 0, []
    for begin in range(0, seq_len, stride):
        end = min(begin + max_tok, seq_len)
        out.append(end - prev_end)
        prev_end = end
        if end == seq_len:
            break
    return out


@pytest.mark.parametrize("n,L,truncate", [(1000, 256, True), (1000, 256, False), (300, 256, False),
                                          (4096, 1024, False), (255, 256, True)])
def test_yarn_protocol_scores_each_token_once(n, L, truncate):
    w = yarn_windows(n, L, 256, truncate, add_bos=True)
    assert [t for _, _, t in w] == reference_yarn_scored(n, L, 256, truncate, True)
    if truncate:
        assert len(w) == 1 and w[0][2] == min(n, L - 1)
    else:
        assert sum(t for _, _, t in w) == n  # every token scored exactly once
        assert all(e - b <= L - 1 for b, e, _ in w)


@pytest.mark.parametrize("n,L", [(5000, 1024), (2000, 256), (1300, 1024), (1024, 1024)])
def test_longlora_protocol_window_count(n, L):
    starts = longlora_starts(n, L, 256)
    assert len(starts) == max(len(range(0, n - L, 256)) - 1, 0)
    assert starts == list(range(0, n - L, 256))[:-1]


def test_ppl_matches_direct_hf_loss(tmp_path, tok, model64):
    """The evaluator's PPL equals exp of the mean of HF's own labels= losses, window by window, for both protocols."""
    d = toy_docs(tmp_path)
    h = ModelHandle(model64, tok, "rand", 256)
    docs = [tok(p.read_text(), add_special_tokens=False).input_ids for p in sorted(d.glob("*.txt"))]
    L = 256
    # yarn, truncate: [BOS] + doc[:L-1], HF mean loss per doc, exp(mean over docs)
    ev = Perplexity(Perplexity.Args(dataset=f"dir:{d}", protocol="yarn", samples=3, lengths=[L]))
    r = ev.run(h, None, ctx(tmp_path))
    losses = [model64(torch.tensor([[1] + x[: L - 1]]), labels=torch.tensor([[1] + x[: L - 1]])).loss.item()
              for x in docs]
    assert r["ppl"][str(L)] == pytest.approx(math.exp(np.mean(losses)), rel=1e-4)
    assert r["scored"][str(L)]["tokens"] == 3 * (L - 1)
    # longlora: BOS-joined stream, windows every 256 (last dropped), full-window loss, 2.71828 ** mean
    ev = Perplexity(Perplexity.Args(dataset=f"dir:{d}", protocol="longlora", samples=3, lengths=[L], min_tokens=1))
    r = ev.run(h, None, ctx(tmp_path))
    stream = [t for x in docs for t in [1] + x]
    starts = list(range(0, len(stream) - L, 256))[:-1]
    ll = [model64(torch.tensor([stream[i : i + L]]), labels=torch.tensor([stream[i : i + L]])).loss.item()
          for i in starts]
    assert r["scored"][str(L)]["windows"] == len(starts) > 0
    assert r["ppl"][str(L)] == pytest.approx(2.71828 ** np.mean(ll), rel=1e-4)


def test_ppl_all_windows_scores_every_window_and_names_its_book(tmp_path, tok, model64):
    """all_windows: every non-overlapping full window [BOS] + doc[k(L-1):(k+1)(L-1)] of every document, each scored in
    full (HF's own loss per window), its document recorded; the first window of each equals the default protocol's."""
    d = toy_docs(tmp_path)
    h = ModelHandle(model64, tok, "rand", 256)
    docs = [tok(p.read_text(), add_special_tokens=False).input_ids for p in sorted(d.glob("*.txt"))]
    L = 64
    r = Perplexity(Perplexity.Args(dataset=f"dir:{d}", samples=3, lengths=[L], all_windows=True)).run(
        h, None, ctx(tmp_path))
    want = [(j, b) for j, x in enumerate(docs) for b in range(0, len(x) - (L - 1) + 1, L - 1)]
    assert r["all_windows"] and r["window_doc"][str(L)] == [j for j, _ in want]
    assert len(set(r["window_doc"][str(L)])) == 3 and len(want) > 3
    losses = [model64(torch.tensor([[1] + docs[j][b:b + L - 1]]), labels=torch.tensor([[1] + docs[j][b:b + L - 1]]))
              .loss.item() for j, b in want]
    assert r["per_sample"][str(L)] == pytest.approx(losses, rel=1e-4, abs=1e-4)
    assert r["scored"][str(L)] == {"tokens": len(want) * (L - 1), "windows": len(want)}
    first = Perplexity(Perplexity.Args(dataset=f"dir:{d}", samples=3, lengths=[L])).run(h, None, ctx(tmp_path))
    starts = [i for i, (j, b) in enumerate(want) if b == 0]
    assert [r["per_sample"][str(L)][i] for i in starts] == pytest.approx(first["per_sample"][str(L)], abs=1e-5)


def lceg_windows(path, L, docs=10):
    """Leooyii/LCEG eval_perplexity/eval_*.py, written out: the first ``docs`` documents of the .bin (split at the
    token ``data[0]``), window starts every 256 tokens, the last one dropped (get_as_batch)."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    doc_start_idx = np.flatnonzero(data == data[0])
    data = data[: doc_start_idx[docs]]
    all_ix = list(range(0, len(data) - L, 256))
    all_ix.pop()
    return np.asarray(data, dtype=np.int64), all_ix


def write_bin(path, lengths, seed=0):
    """A LongLoRA-style .bin: documents of the given lengths, each starting with BOS = 1 (a length-1 document is
    only its BOS), other ids in 3..4095."""
    rng = np.random.default_rng(seed)
    parts = [np.concatenate([[1], rng.integers(3, 4096, n - 1)]) for n in lengths]
    np.concatenate(parts).astype(np.uint16).tofile(path)


class NoBos:
    """The tiny tokenizer without a BOS token (as SmolLM2's): text streams then separate documents with EOS."""

    def __init__(self, tok):
        self.tok, self.bos_token_id, self.eos_token_id = tok, None, tok.eos_token_id

    def __call__(self, *a, **k):
        return self.tok(*a, **k)


def test_ppl_longlora_default_scores_lcegs_windows(tmp_path, tok, model64):
    """protocol=longlora with default settings scores exactly the windows of LCEG's loop on a stream with short
    documents and a BOS-only document (the old default dropped documents shorter than the largest length), with
    the .bin's own separators whatever the tokenizer's BOS; min_tokens > 0 is the explicit filter."""
    path = tmp_path / "test.bin"
    write_bin(path, [900, 40, 1500, 1, 300, 2000, 64, 800, 10, 1200, 700, 500])  # 12 documents, LCEG keeps 10
    h = ModelHandle(model64, tok, "rand", 256)
    lengths = [512, 1024]
    ev = Perplexity(Perplexity.Args(dataset=f"bin:{path}", protocol="longlora", samples=10, lengths=lengths,
                                    max_windows=0))
    assert ev.args.min_tokens == 0
    r = ev.run(h, None, ctx(tmp_path))
    recs = [json.loads(x) for x in (tmp_path / "samples" / "ppl_longlora.jsonl").read_text().splitlines()]
    for L in lengths:
        data, ix = lceg_windows(path, L)
        assert r["scored"][str(L)]["windows"] == r["scored"][str(L)]["windows_total"] == len(ix) > 0
        assert [x["begin"] for x in recs if x["length"] == L] == ix
    assert r["documents"] == 10 and r["documents_too_short"] == 0
    # the PPL is LCEG's: 2.71828 ** mean of HF's full-window loss over those windows
    data, ix = lceg_windows(path, 512)
    losses = [model64(torch.tensor(data[i : i + 512])[None], labels=torch.tensor(data[i : i + 512])[None]).loss.item()
              for i in ix]
    assert r["ppl"]["512"] == pytest.approx(2.71828 ** np.mean(losses), rel=1e-4)
    # no BOS in the tokenizer: the same stream (the file's separators are kept), the same number
    r2 = Perplexity(ev.args).run(ModelHandle(model64, NoBos(tok), "rand", 256), None, ctx(tmp_path / "nobos"))
    assert r2["ppl"] == r["ppl"] and r2["scored"] == r["scored"]
    # the filter is an explicit option: documents shorter than 1024 tokens left out, still the first 10 kept
    rf = Perplexity(Perplexity.Args(dataset=f"bin:{path}", protocol="longlora", samples=10, lengths=[512],
                                    min_tokens=1024)).run(h, None, ctx(tmp_path / "f"))
    assert rf["documents"] == 3 and rf["documents_too_short"] == 9 and rf["min_tokens"] == 1024
    assert rf["scored"]["512"]["windows_total"] != len(lceg_windows(path, 512)[1])


def test_ppl_text_stream_keeps_short_and_empty_documents(tmp_path, tok, model64):
    """Text datasets under protocol=longlora: the first `samples` documents whatever their length, an empty document
    kept as its separator alone (LCEG keeps a BOS-only document); without a BOS the separator is EOS."""
    d = tmp_path / "docs"
    d.mkdir()
    texts = ["the king went to the river. " * 60, "", "a stone.", "the queen came and saw the light. " * 50]
    for i, t in enumerate(texts):
        (d / f"doc{i}.txt").write_text(t)
    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    ev = Perplexity(Perplexity.Args(dataset=f"dir:{d}", protocol="longlora", samples=4, lengths=[256]))
    stream, n, short = ev.stream(tok, ev.min_tokens([256]))
    assert (n, short) == (4, 0)
    assert stream == [t for x in ids for t in [tok.bos_token_id] + x]
    stream, n, _ = ev.stream(NoBos(tok), 0)
    assert stream == [t for x in ids for t in [tok.eos_token_id] + x] and n == 4
    r = ev.run(ModelHandle(model64, tok, "rand", 256), None, ctx(tmp_path))
    assert r["documents"] == 4 and r["scored"]["256"]["windows_total"] == len(longlora_starts(len(stream), 256, 256))
    # yarn keeps its own default: documents at least as long as the largest length
    ev_y = Perplexity(Perplexity.Args(dataset=f"dir:{d}", protocol="yarn", samples=4, lengths=[256]))
    assert ev_y.min_tokens([256]) == 256 and ev_y.documents(tok, 256)[1] == 2


def test_ppl_skips_lengths_beyond_method(tmp_path, tok, model64):
    d = toy_docs(tmp_path)
    ev = Perplexity(Perplexity.Args(dataset=f"dir:{d}", samples=1, lengths=[128, 512]))
    r = ev.run(ModelHandle(model64, tok, "rand", 256), Limit(256), ctx(tmp_path))
    assert "512" in r["skipped"] and "128" in r["ppl"]


# --- NLL by position ---------------------------------------------------------------------------------------------
def test_nll_by_position_matches_direct(tmp_path, tok, model64):
    d = toy_docs(tmp_path)
    L = 200
    ev = NLLByPosition(NLLByPosition.Args(dataset=f"dir:{d}", samples=2, buckets=4, lengths=[L, 4096]))
    r = ev.run(ModelHandle(model64, tok, "rand", 256), Limit(300), ctx(tmp_path))
    assert r["length"] == L and "4096" in r["skipped"]
    docs = [tok(p.read_text(), add_special_tokens=False).input_ids[: L - 1] for p in sorted(d.glob("*.txt"))[:2]]
    per_pos = []
    for x in docs:
        ids = torch.tensor([[1] + x])
        with torch.no_grad():
            logp = torch.log_softmax(model64(ids).logits[0, :-1].float(), -1)
        per_pos.append(-logp.gather(1, ids[0, 1:, None])[:, 0])
    mean = torch.stack(per_pos).mean(0).numpy()
    assert r["positions"] == [1, 51, 101, 150]
    expect = [mean[0:50].mean(), mean[50:100].mean(), mean[100:149].mean(), mean[149:199].mean()]
    assert np.allclose(r["nll"], expect, atol=1e-4)


def test_token_nll_batched_chunks_match_direct(model64):
    """Chunked NLL (several chunks, a batch of 2) equals -log_softmax of the full logits at the next token."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 4096, (2, 130), generator=g)
    with torch.no_grad():
        logp = torch.log_softmax(model64(ids).logits[:, :-1].float(), -1)
    expect = -logp.gather(2, ids[:, 1:, None])[..., 0]
    got = token_nll(model64, ids, chunk=50, dtype="float32")
    assert got.shape == (2, 129) and torch.allclose(got, expect, atol=1e-5)


def test_bucket_means_shapes():
    pos, val = bucket_means(np.arange(10, dtype=float), 3)
    assert pos == [1, 4, 8] and val == [1.0, 4.5, 8.0]


# --- generation with prefix reuse -------------------------------------------------------------------------------
def test_prefix_cache_equals_plain_greedy(model64):
    g = torch.Generator().manual_seed(0)
    base = torch.randint(3, 4096, (120,), generator=g).tolist()
    prompts = [base + [5, 6, 7], base[:80] + [9, 9], base + [5, 6, 7, 8], base[:10]]
    pc = PrefixCache(model64, "float32")
    for p in prompts:
        assert pc.generate(p, 6) == greedy_generate(model64, torch.tensor([p]), 6, dtype="float32")
    assert pc.tokens_reused > 0


# --- NIAH --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [0, 11, 33, 50, 89, 100])
def test_niah_needle_lands_after_sentence_end_at_depth(tok, depth):
    text = " ".join(f"Sentence number {i} talks about the weather and the sea." for i in range(200))
    ctx_ids = tok(text, add_special_tokens=False).input_ids
    needle = tok(NIAH_NEEDLE, add_special_tokens=False).input_ids
    periods = period_ids(tok)
    L, buffer = 1200, 200
    new, point = insert_needle(ctx_ids, needle, depth, L, buffer, periods)
    trimmed = ctx_ids[: L - buffer - len(needle)]
    assert len(new) == len(trimmed) + len(needle) <= L - buffer
    assert new[point : point + len(needle)] == needle
    if depth == 100:
        assert point == len(trimmed)
        return
    target = int(len(trimmed) * depth / 100)
    assert point <= target
    assert point == 0 or trimmed[point - 1] in periods  # right after a '.' token
    # within one sentence: no sentence end between the insertion point and the requested depth
    assert not any(t in periods for t in trimmed[point : target - 1]) if target > point else True
    assert target - point < len(tok("Sentence number 100 talks about the weather and the sea.").input_ids) + 2


def test_niah_scores():
    assert lceg_score("Eat a sandwich and sit in Dolores Park on a sunny day.") == pytest.approx(11 / 12)
    assert lceg_score("nothing relevant") == 0.0
    assert rouge_score(NIAH_NEEDLE) == pytest.approx(10.0)
    assert LCEG_EXPECTED.lower().split().count("a") == 2


def test_niah_evaluator_grid_and_skip(tmp_path, tok, model64):
    ev = NeedleInAHaystack(NeedleInAHaystack.Args(lengths=[256, 384, 1024], depth_intervals=3, gen_tokens=4,
                                                  buffer=-1))
    r = ev.run(ModelHandle(model64, tok, "rand", 256), Limit(512), ctx(tmp_path))
    assert set(r["score"]) == {"256", "384"} and "1024" in r["skipped"]
    assert set(r["grid"]["256"]) == {"0", "50", "100"} and r["depths"] == [0, 50, 100]
    assert r["tokens_reused"] > 0 and not r["over_budget"]
    recs = [json.loads(x) for x in (tmp_path / "samples" / "niah.jsonl").read_text().splitlines()]
    assert len(recs) == 6 and all(x["prompt_tokens"] + 4 <= x["length"] for x in recs)


def test_niah_paper_grid():
    ev = NeedleInAHaystack(NeedleInAHaystack.Args(context_lengths=[1000, 128000, 40]))
    ls = ev.lengths()
    assert len(ls) == 40 and ls[:3] == [1000, 4256, 7513] and ls[-1] == 128000
    assert ev.depths() == [0, 11, 22, 33, 44, 56, 67, 78, 89, 100]


# --- RULER -------------------------------------------------------------------------------------------------------
def test_ruler_metrics_match_reference():
    assert rd.string_match_part(["x Paris"], [["paris", "London"]]) == 100
    assert rd.string_match_all(["a b"], [["a", "c"]]) == 50
    assert rd.string_match_all(["1234567 and 7654321", "nothing"], [["1234567", "7654321"], ["1"]]) == 50
    assert rd.string_match_all(["ABC", "x"], [["abc", "d", "e"], ["x"]]) == 66.67
    assert rd.string_match_part(["no", "Berlin"], [["paris"], ["berlin", "bonn"]]) == 50
    assert rd.postprocess_pred("  a\x00b\tc \n") == "a\nb\nc"


def test_ruler_templates_verbatim():
    assert "assgined" in RULER_TASKS["variable_tracking"]["answer_prefix"]
    assert RULER_TASKS["niah"]["tokens_to_generate"] == 128
    assert [RULER_TASKS[k]["tokens_to_generate"] for k in
            ("variable_tracking", "common_words_extraction", "freq_words_extraction", "qa")] == [30, 120, 50, 32]
    assert len(rd.ALL_TASKS) == 13 and rd.METRIC["qa_1"] == "string_match_part" and rd.METRIC["vt"] == \
        "string_match_all"
    assert "special magic" in EVAL_FRAGMENTS


def test_ruler_singular_rewrite(tok):
    g = rd.RulerGenerator(tok)
    s = g.samples("niah_single_1", 2048, 1)[0]
    assert s["input"].startswith("A special magic number is hidden within the following text.")
    assert s["input"].endswith("mentioned in the provided text is")
    assert "One of the special magic numbers for" in s["input"]  # needles keep the plural
    m = g.samples("niah_multivalue", 2048, 1)[0]
    assert m["input"].startswith("Some special magic numbers are hidden") and len(m["outputs"]) == 4


def test_split_sentences():
    assert rd.split_sentences("Hello there. Mr. Smith came! Did he? 3 cats. ok") == \
        ["Hello there.", "Mr. Smith came!", "Did he?", "3 cats. ok"]


def test_haystack_sentences_equal_split_sentences():
    """The precomputed sentence ends give exactly ``split_sentences`` of every word prefix."""
    h = rd.Haystack.__new__(rd.Haystack)
    h.words = ('He said "Go." Then Mr. Smith left! (Really?) 3 dogs. e.g. Fine. "Yes!" she cried. ok. A b. '
               'C.').split(" ") * 3
    h._text = ""
    for n in range(len(h.words) + 2):
        assert h.sentences(n) == rd.split_sentences(" ".join(h.words[:n]).strip()), n
    big = rd.Haystack("", 3000)
    for n in random.Random(0).sample(range(1, 3000), 40):
        assert big.sentences(n) == rd.split_sentences(" ".join(big.words[:n]).strip()), n


def reference_largest_fitting(fits, limit=None):
    """The previous search (doubling, then bisection), written out."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while (limit is None or hi <= limit) and fits(hi):
        lo, hi = hi, hi * 2
    if limit is not None:
        hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def test_largest_fitting_equals_bisection_in_fewer_probes():
    rng = random.Random(0)
    probes_new = probes_ref = 0
    for _ in range(300):
        a, b, budget = rng.randint(0, 300), rng.uniform(5, 400), rng.randint(50, 9000)
        limit = rng.choice([None, None, rng.randint(0, 200)])
        broken = rng.choice([None, rng.randint(1, 400)])  # from this size on, the probe cannot be built
        bumps = np.cumsum([rng.choice([0, 0, 0, 1, 7]) for _ in range(5000)])
        sizes = [a + int(b * m) + int(bumps[m]) for m in range(5000)]  # non-decreasing, not linear

        def size(m, broken=broken, sizes=sizes):
            return None if broken is not None and m >= broken else sizes[m]

        seen_new, seen_ref = set(), set()

        def size_counted(m, seen_new=seen_new):
            seen_new.add(m)
            return size(m)

        def fits_ref(m, seen_ref=seen_ref, budget=budget):
            seen_ref.add(m)
            return size(m) is not None and size(m) <= budget

        assert rd.largest_fitting(size_counted, budget, limit) == reference_largest_fitting(fits_ref, limit)
        probes_new, probes_ref = probes_new + len(seen_new), probes_ref + len(seen_ref)
    assert probes_new < 0.75 * probes_ref


def test_ruler_count_equals_tokenizer(tok):
    g = rd.RulerGenerator(tok)
    for text in ["", "x", " Memorize and track the chain(s) of variable assignment.\n\nVAR ABC = 12345 ",
                 "One of the special magic uuids for 1f2e is: 2b8c0f3e-5d41-4a1e-9a70-0c2b9b1f6a11.\t\n Answer:"]:
        assert g.count(text) == len(tok(text).input_ids)


@pytest.fixture(scope="module")
def qa_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qa")
    paras = [{"context": f"Paragraph {i} says the capital of land {i} is City{i}.",
              "qas": [{"question": f"What is the capital of land {i}?", "is_impossible": False,
                       "answers": [{"text": f"City{i}"}]}]} for i in range(300)]
    (d / "squad.json").write_text(json.dumps({"data": [{"paragraphs": paras[i : i + 10]} for i in range(0, 300, 10)]}))
    hp = [{"question": f"Who built tower {i}?", "answer": f"Builder{i}",
           "context": [[f"Tower {i}", [f"Tower {i} was built by Builder{i}."]], [f"Other {i}", ["Unrelated."]]]}
          for i in range(300)]
    (d / "hotpot.json").write_text(json.dumps(hp))
    return d


def tiny_ruler_args():
    """The RULER settings of the tiny default suite (conf/eval/tiny.yaml)."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "eval" / "tiny.yaml"))["suite"]["ruler"]
    node.pop("lengths", None)
    return node


def test_ruler_samples_fit_and_contain_answers(tok, qa_files):
    """Every task at 256..4096 with the tiny tokenizer and the tiny suite's settings: prompt + generation budget
    <= L and every answer in the prompt, or a DoesNotFit (-> skip entry); from 4C = 1024 on every task fits."""
    cfg = tiny_ruler_args()
    g = rd.RulerGenerator(tok, seed=42, tokens_to_generate=cfg.get("tokens_to_generate", {}),
                          small_threshold=cfg.get("small_threshold", 4096),
                          essay_increment=cfg.get("essay_increment", 500),
                          vt_icl_length=cfg.get("vt_icl_length", 500), squad_path=str(qa_files / "squad.json"),
                          hotpotqa_path=str(qa_files / "hotpot.json"))
    fitted = {}
    for L in (256, 512, 1024, 2048, 4096):
        for task in rd.ALL_TASKS:
            assert g.unavailable(task) is None
            try:
                (s,) = g.samples(task, L, 1)
            except rd.DoesNotFit:
                assert L < 1024, f"{task} must fit at {L}"
                continue
            n = len(tok(s["input"]).input_ids)
            assert n + s["tokens_to_generate"] <= L and s["length"] == n + s["tokens_to_generate"]
            assert n + s["tokens_to_generate"] > 0.5 * L or task in ("niah_multikey_3",)  # the haystack fills L
            for a in s["outputs"]:
                assert a in s["input"], (task, L, a)
            fitted.setdefault(L, []).append(task)
    assert len(fitted[1024]) == len(fitted[4096]) == 13


def test_ruler_default_settings_at_4096(tok):
    """RULER's own settings (128-token budget, 500-word essay steps): niah_single_2 at 4096 as in the notes."""
    g = rd.RulerGenerator(tok)
    for s in g.samples("niah_single_2", 4096, 2):
        assert len(tok(s["input"]).input_ids) + 128 <= 4096 and s["outputs"][0] in s["input"]
        assert s["size"] % 500 == 0
    assert g.unavailable("qa_1") and g.unavailable("qa_2")


def test_ruler_deterministic(tok):
    a = rd.RulerGenerator(tok, seed=3).samples("vt", 1024, 2)
    b = rd.RulerGenerator(tok, seed=3).samples("vt", 1024, 2)
    c = rd.RulerGenerator(tok, seed=4).samples("vt", 1024, 2)
    assert a == b and a != c
    assert a[0]["input"].startswith(" Memorize and track")  # the one-shot example comes first, as in RULER
    assert "assgined the value" in a[0]["input"]


def test_ruler_evaluator_contract(tmp_path, tok, model64):
    ev = Ruler(Ruler.Args(tasks=["niah_single_1", "fwe", "qa_1"], samples=1, lengths=[256, 1024, 4096],
                          tokens_to_generate={"niah": 16, "freq_words_extraction": 8}, small_threshold=10**6))
    r = ev.run(ModelHandle(model64, tok, "rand", 256), Limit(1024), ctx(tmp_path))
    assert "qa_1" in r["skipped_tasks"] and "qa_1" not in r["tasks"]
    assert r["skipped"]["4096"].startswith("method limit supports at most")
    assert "niah_single_1" in r["skipped"]["256"]  # template + budget do not fit the native window
    assert r["average_over"]["1024"] == ["niah_single_1", "fwe"]
    assert r["average"]["1024"] == pytest.approx((r["tasks"]["niah_single_1"]["1024"] + r["tasks"]["fwe"]["1024"]) / 2,
                                                 abs=0.01)
    recs = [json.loads(x) for x in (tmp_path / "samples" / "ruler.jsonl").read_text().splitlines()]
    assert all(x["prompt_tokens"] <= x["budget"] <= x["length"] for x in recs)


def test_suites_compose():
    """The tiny and paper suites compose and every entry validates against its evaluator's Args."""
    from omegaconf import OmegaConf

    from harness.conf_utils import compose
    from harness.evals import build_evaluators

    for suite in ("tiny", "paper"):
        cfg = compose([f"eval={suite}"])
        evs = build_evaluators(OmegaConf.to_container(cfg.eval.suite, resolve=True))
        names = {type(e).registered_name for e in evs}
        assert {"ppl", "niah", "ruler", "passkey", "nll_by_position"} <= names


def test_passkey_prefix_reuse_same_predictions(tok, model64):
    from harness.evals.passkey import run_passkey

    a = run_passkey(model64, tok, 256, 3, seed=0, gen_tokens=4, dtype="float32", reuse_prefix=True)
    b = run_passkey(model64, tok, 256, 3, seed=0, gen_tokens=4, dtype="float32", reuse_prefix=False)
    assert [r["prediction"] for r in a] == [r["prediction"] for r in b]
    assert all(r["prompt_tokens"] + 4 <= 256 for r in a)


# --- per-sample scores and intervals in the row; batched, cached windows (issue 20) --------------------------------
def test_rows_keep_per_sample_scores_and_intervals(tmp_path, tok, model64):
    from harness.evals.passkey import Passkey

    d = toy_docs(tmp_path)
    h = ModelHandle(model64, tok, "rand", 256)
    r = Perplexity(Perplexity.Args(dataset=f"dir:{d}", samples=3, lengths=[128, 256])).run(h, None, ctx(tmp_path))
    for L in ("128", "256"):
        x = r["per_sample"][L]
        assert len(x) == 3 and r["ppl"][L] == pytest.approx(math.exp(np.mean(x)), rel=1e-5)
        assert r["ci"][L][0] <= r["ppl"][L] <= r["ci"][L][1]
    p = Passkey(Passkey.Args(samples=4, gen_tokens=4, lengths=[256])).run(h, None, ctx(tmp_path))
    c = p["correct"]["256"]
    assert len(c) == 4 and p["accuracy"]["256"] == sum(c) / 4 and len(p["depth"]["256"]) == 4
    assert p["ci"]["256"][0] <= p["accuracy"]["256"] <= p["ci"]["256"][1] and p["ci"]["256"][1] > 0  # Wilson
    n = NLLByPosition(NLLByPosition.Args(dataset=f"dir:{d}", samples=3, buckets=4, lengths=[200]))
    m = n.run(h, None, ctx(tmp_path))
    assert np.allclose(np.mean(m["per_doc"], axis=0), m["nll"], atol=1e-4)
    assert all(lo <= v <= hi for lo, v, hi in zip(m["ci_lo"], m["nll"], m["ci_hi"]))


@pytest.mark.parametrize("method", ["base", "ntk_32k", "self_extend", "lm_infinite", "landmark"])
def test_batched_windows_equal_one_at_a_time(tiny, method):
    """PPL windows of one length run as a batch give the NLL of running them one by one, for RoPE and for the
    custom (blockwise) attention methods, so batching never changes a score."""
    from harness.conf_utils import group_defaults
    from harness.evals.common import window_nlls
    from harness.methods import build_method
    from harness.models import load_model

    h = load_model("tiny_llama")
    m = build_method(group_defaults("method", method))
    m.apply(h)
    m.eval_mode(h)
    g = torch.Generator().manual_seed(5)
    wins = [torch.randint(3, 4000, (256,), generator=g).tolist() for _ in range(3)]
    one = window_nlls(h.model, wins, dtype="float32", batch_tokens=0)
    batch = window_nlls(h.model, wins, dtype="float32", batch_tokens=3 * 256)
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(one, batch))


def test_window_cache_is_shared_and_exact(model64):
    from harness.evals.common import window_nlls

    cache: dict = {}
    wins = [list(range(5, 105)), list(range(7, 107))]
    a = window_nlls(model64, wins, dtype="float32", cache=cache)
    assert len(cache) == 2
    b = window_nlls(model64, [wins[1]], dtype="float32", cache=cache)   # served from the cache
    assert b[0] is a[1]
    c = window_nlls(model64, [wins[1][:50]], dtype="float32", cache=cache)   # another window: computed
    assert len(cache) == 3 and c[0].shape == (49,)


def test_reuse_order_is_a_prefix_tree_walk():
    from harness.evals.common import reuse_order

    p = [[1, 2, 9], [1, 5], [1, 2, 3, 4], [0]]
    assert reuse_order(p) == [3, 2, 0, 1]


def test_default_suite_is_powered():
    """The default suite's sample sizes (issue 20): >= 50 passkey prompts, >= 8 PPL documents, >= 20 RULER samples
    per task and length, NIAH over >= 5 depths."""
    from harness.conf_utils import compose

    s = compose([]).eval.suite
    assert s.passkey.samples >= 50 and s.ppl_books.samples >= 8 and s.ppl_code.samples >= 8
    assert s.nll_by_position.samples >= 8 and s.ruler.samples >= 20 and s.niah.depth_intervals >= 5


def test_passkey_searches_each_length_once_and_reports_its_prefix_reuse(tiny, tmp_path):
    """A length's prompts start their garbage-length search from the previous prompt's (two tokenisations where
    the doubling-then-bisection took about twenty at 16k tokens): every prompt is the one the full search gives; the
    output reports the prompt tokens prefix reuse saved, as NIAH's does."""
    import random

    from harness.evals.passkey import STEP, garbage_steps, passkey_prompt, passkey_samples

    tok = tiny.tokenizer
    calls = []

    def n_tok(s):
        calls.append(1)
        return len(tok(s).input_ids)

    for L in (512, 2048):
        samples = passkey_samples(tok, L, 12, seed=3)
        rng = random.Random(f"passkey-3-{L}")
        for s in samples:
            key = rng.randint(1, 50000)
            rng.randint(0, s["steps"] * STEP)   # the needle's offset, drawn after the search
            assert s["pass_key"] == key and s["steps"] == garbage_steps(n_tok, L - 8, key, "original")
        calls.clear()
        for s in samples[1:]:   # from the previous prompt's steps: two tokenisations each
            assert garbage_steps(n_tok, L - 8, s["pass_key"], "original", samples[0]["steps"]) == s["steps"]
        assert len(calls) <= 2 * (len(samples) - 1) + 4
        assert passkey_prompt(s["n_garbage"], 0, s["pass_key"]) != ""
    from harness import api

    row = api.evaluate(tiny.model, tok, evaluator="passkey", lengths=[1], samples=4, gen_tokens=4,
                       overrides=["autocast=float32"], results_dir=tmp_path)
    out = row["metrics"]["passkey"]
    assert out["tokens_reused"] > 0 and out["tokens_encoded"] > out["tokens_reused"] / 10
