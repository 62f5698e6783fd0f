"""ppl: perplexity over long documents with the two protocols that both get called "sliding window 256".

``protocol: yarn`` (``jquesnelle/yarn eval/perplexity.py``; the YaRN / PI tables): documents with at least
``min_tokens`` tokens (``0`` = the largest evaluation length, eval.sh's ``--dataset-min-tokens``), the first
``samples`` of them, each scored from its start. With ``truncate`` (Proof-pile tables) each document gives one window
``[BOS] + doc[:L-1]`` and every one of its L-1 tokens is scored; without, the window slides by ``stride`` and each
window scores only tokens not scored before. PPL = exp(unweighted mean of per-window mean NLL), as in the original.

``protocol: longlora`` (``dvlab-research/LongLoRA eval.py``, reused by the controlled study's LCEG
``eval_perplexity/eval_*.py``): the first ``samples`` documents (LCEG: 10) *whatever their length* (``min_tokens:
0``, the default, reproduces LCEG's ``data[:np.flatnonzero(data == data[0])[10]]`` exactly: short documents and a
document that is only its separator stay in the stream), concatenated into one stream, windows of L tokens starting
every ``stride`` tokens (the last start dropped: ``all_ix.pop()``), every window scored in full (L-1 predictions),
PPL = e^(mean window loss). ``min_tokens: N > 0`` is an explicit filter (documents shorter than N tokens are left out
of the stream; not LCEG). Text datasets put the tokenizer's BOS before each document (EOS when it has no BOS);
``dataset: bin:<path>`` reads LongLoRA's pre-tokenised ``.bin`` files (PG19 ``test.bin``, Proof-pile
``test_sampled_data.bin``: uint16 LLaMA token ids, documents starting with the token ``data[0]``) and uses the stream
as it is, its own separators included, whatever the tokenizer (it is only meaningful with the LLaMA tokenizer). The
numbers of the two protocols are not comparable. ``max_windows > 0`` scores an evenly spaced subset of the windows
(CPU budget); the row records how many windows were scored out of how many.

``all_windows: true`` (yarn protocol; issue 48) scores every non-overlapping full window
``[BOS] + doc[k(L-1):(k+1)(L-1)]`` of every document instead of its first one, every token of each; the row keeps
each window's mean NLL and the document it came from (``window_doc``), so that an interval can treat the windows of
one book as dependent (``harness.stats.cluster_ppl_ratio``).

``stride`` (256) is an absolute token count on purpose: both originals slide by 256 tokens whatever the model.
Refused before anything loads (``check`` / ``check_data``): a missing, empty or non-text data directory, a missing or
malformed ``.bin``, an unknown source name, samples or stride below 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from harness.config import ConfigError
from harness.data.sources import SOURCES, load_source, local_directory
from harness.evals import (
    EVALS,
    EvalArgs,
    Spec,
    check_nonneg,
    check_positive,
    lengths_within,
    split_lengths,
    write_jsonl,
)
from harness.evals.common import token_nll, window_nlls
from harness.stats import ppl_interval

DATASET_FORMS = f"{', '.join(sorted(SOURCES))}, dir:<directory of .txt files>, bin:<LongLoRA .bin file>"


def load_documents(dataset: str, split: str):
    if dataset.startswith("dir:"):
        return local_directory(dataset[4:])
    return load_source(dataset, split)


def check_dataset(dataset: str, where: str) -> None:
    """One line for a dataset that cannot be read: unknown source, missing / empty / non-text directory, missing or
    malformed .bin. Reads the directory's files (strict UTF-8), so it costs one pass over the text."""
    if dataset.startswith("bin:"):
        p = Path(dataset[4:])
        if not p.is_file():
            raise ConfigError(f"{where}.dataset: {p} not found (a LongLoRA .bin token file)")
        n = p.stat().st_size
        if n < 4 or n % 2:
            raise ConfigError(f"{where}.dataset: {p} is not a uint16 token stream ({n} bytes; valid: an even "
                              f"number of bytes >= 4)")
        return
    if dataset.startswith("dir:"):
        try:
            local_directory(dataset[4:])
        except (OSError, ValueError) as e:
            raise ConfigError(f"{where}.dataset: {e}") from None
        return
    if dataset not in SOURCES:
        raise ConfigError(f"{where}.dataset: unknown dataset {dataset!r} (valid: {DATASET_FORMS})")


def load_token_stream(path: str, samples: int) -> list[np.ndarray]:
    """LongLoRA/LCEG ``.bin`` data (``np.memmap(path, dtype=np.uint16)``, LLaMA token ids, documents concatenated,
    each starting with the token ``data[0]`` = BOS). Returns the first ``samples`` documents, each starting with its
    separator, exactly the slice LCEG keeps: ``data[:np.flatnonzero(data == data[0])[samples]]`` (all documents
    when the file has fewer)."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    starts = list(np.flatnonzero(data == data[0])) + [len(data)]
    return [np.asarray(data[starts[i] : starts[i + 1]], dtype=np.int64) for i in range(min(samples, len(starts) - 1))]


def yarn_windows(n_tokens: int, L: int, stride: int, truncate: bool, add_bos: bool):
    """(begin, end, trg_len) of every window YaRN's loop scores for one document of n_tokens tokens."""
    max_len = L - 1 if add_bos else L
    if truncate:
        n_tokens, stride = min(n_tokens, max_len), max_len
    out, prev_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + max_len, n_tokens)
        out.append((begin, end, end - prev_end))
        prev_end = end
        if end == n_tokens:
            break
    return out


ASSUMED_DOC_TOKENS = 100_000  # ASSUMPTION (the plan): tokens of one PG19 / Proof-pile document when the data is absent


def doc_stream_tokens(dataset: str, samples: int) -> tuple[int, str]:
    """Tokens of the first ``samples`` documents of a LongLoRA ``bin:`` file (the plan's window count), or the
    ASSUMPTION of ``ASSUMED_DOC_TOKENS`` per document when the file is not here; and the basis of the number."""
    if dataset.startswith("bin:"):
        path = Path(dataset[4:])
        if path.is_file():
            return sum(len(d) for d in load_token_stream(str(path), samples)), f"{path} (first {samples} documents)"
    return samples * ASSUMED_DOC_TOKENS, f"ASSUMPTION {samples} x {ASSUMED_DOC_TOKENS:,} tokens (data not here)"


def longlora_starts(n_tokens: int, L: int, stride: int) -> list[int]:
    ix = list(range(0, n_tokens - L, stride))
    if ix:
        ix.pop()
    return ix


def subsample(starts: list[int], k: int) -> list[int]:
    if k <= 0 or len(starts) <= k:
        return starts
    pick = np.linspace(0, len(starts) - 1, k).round().astype(int)
    return [starts[i] for i in pick]


def document_filter(a, lengths: list[int]) -> int:
    """The document-length filter in force for settings ``a`` at ``lengths``: explicit (``min_tokens``), or the
    protocol's default (yarn: the largest length; longlora: none, as LCEG keeps the first documents whatever their
    length)."""
    if a.min_tokens:
        return a.min_tokens
    return max(lengths or [0]) if a.protocol == "yarn" else 0


def whole_entry_filter(a) -> dict:
    """``Spec.pins``: a one-length shard filters the documents as the whole entry does (so every shard scores the
    same documents)."""
    f = document_filter(a, [int(L) for L in a.lengths])
    return {"min_tokens": f} if f != a.min_tokens else {}


@EVALS.register("ppl")
class Perplexity:
    spec = Spec(
        metric="ppl",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ppl",  # the tables read a length's PPL with its interval over windows
        by_length=True,  # lengths scored independently: one shard per length is exact
        pins=whole_entry_filter,  # ... with the document filter of the whole entry
        data_parallel=True)  # windows scored through ctx.map_blocks / ctx.map

    def count_prompts(self, lengths, limit):
        """{length: windows scored} and its basis: one window per document (yarn), or the LongLoRA protocol's
        windows every ``stride`` tokens over the documents' token stream."""
        a = self.args
        ok = lengths_within(a.lengths, lengths, limit)
        if a.protocol == "longlora":
            n, basis = doc_stream_tokens(a.dataset, a.samples)
            return ({L: len(subsample(longlora_starts(n, L, a.stride), a.max_windows)) for L in ok},
                    f"windows every {a.stride} tokens over {basis}")
        if a.all_windows:
            return {L: a.samples for L in ok}, "every non-overlapping window of each document (at least one each)"
        return {L: a.samples for L in ok}, "one window per document and length"
    @dataclass
    class Args(EvalArgs):
        name: str = "ppl"
        dataset: str = "shakespeare"  # a text source, dir:<path> of .txt files, or bin:<path> (LongLoRA .bin tokens)
        split: str = "test"
        protocol: str = "yarn"  # yarn | longlora
        samples: int = 10  # documents
        min_tokens: int = 0  # filter (tokens); 0 = yarn: the largest evaluation length, longlora: none (LCEG)
        truncate: bool = True  # yarn protocol only
        stride: int = 256
        max_windows: int = 0  # longlora protocol: score at most this many windows per length (0 = all)
        chunk: int = 1024  # positions per LM-head chunk
        all_windows: bool = False  # yarn protocol: every non-overlapping full window of each document

    def __init__(self, args):
        if args.protocol not in ("yarn", "longlora"):
            raise ConfigError(f"ppl: unknown protocol {args.protocol!r} (yarn | longlora)")
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, samples=a.samples, stride=a.stride, chunk=a.chunk)
        check_nonneg(where, min_tokens=a.min_tokens, max_windows=a.max_windows)

    def check_data(self, where: str) -> None:
        check_dataset(self.args.dataset, where)

    def min_tokens(self, lengths: list[int]) -> int:
        """The document-length filter in force (:func:`document_filter`)."""
        return document_filter(self.args, lengths)

    def stream(self, tokenizer, min_tokens: int) -> tuple[list[int], int, int]:
        """longlora protocol: (token stream, documents in it, documents left out by the min_tokens filter)."""
        a = self.args
        if a.dataset.startswith("bin:"):  # the file's own separators, whatever the tokenizer
            if not min_tokens:
                docs = load_token_stream(a.dataset[4:], a.samples)
                return [int(x) for d in docs for x in d], len(docs), 0
            kept, short = [], 0
            for d in load_token_stream(a.dataset[4:], 1 << 62):
                if len(d) - 1 >= min_tokens:
                    kept.append(d)
                else:
                    short += 1
                if len(kept) == a.samples:
                    break
            return [int(x) for d in kept for x in d], len(kept), short
        sep = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        docs, short = self.documents(tokenizer, min_tokens)
        out: list[int] = []
        for d in docs:
            out += ([sep] if sep is not None else []) + d
        return out, len(docs), short

    def documents(self, tokenizer, min_tokens: int) -> tuple[list[list[int]], int]:
        """The first ``samples`` documents with at least ``min_tokens`` tokens (no separator), and how many shorter
        ones were passed over."""
        docs, _, short = self.named_documents(tokenizer, min_tokens)
        return docs, short

    def named_documents(self, tokenizer, min_tokens: int) -> tuple[list[list[int]], list[str], int]:
        """:meth:`documents` with each document's name (its file or play; ``#<i>``, its place in a ``bin:`` stream):
        the per-sample records say which document each window is from."""
        docs, names, short = [], [], 0
        if self.args.dataset.startswith("bin:"):  # pre-tokenised stream: drop each document's leading separator
            for i, d in enumerate(load_token_stream(self.args.dataset[4:], 1 << 62 if min_tokens else
                                                    self.args.samples)):
                if len(d) - 1 >= min_tokens:
                    docs.append(d[1:].tolist())
                    names.append(f"#{i}")
                else:
                    short += 1
                if len(docs) == self.args.samples:
                    break
            return docs, names, short
        for d in load_documents(self.args.dataset, self.args.split):
            ids = tokenizer(d.text, add_special_tokens=False).input_ids
            if len(ids) >= min_tokens:
                docs.append(ids)
                names.append(d.name)
            else:
                short += 1
            if len(docs) == self.args.samples:
                break
        return docs, names, short

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        lengths, skipped = split_lengths(a.lengths, handle, method)
        tok, model = handle.tokenizer, handle.model
        min_tokens = self.min_tokens(lengths)
        if a.protocol == "yarn":
            docs, names, short = self.named_documents(tok, min_tokens)
            n_docs = len(docs)
        else:
            stream, n_docs, short = self.stream(tok, min_tokens)
        bos = tok.bos_token_id
        res, scored, per_sample, ci, window_doc = {}, {}, {}, {}, {}
        for L in list(lengths):
            recs: list[dict] = []
            if a.protocol == "yarn" and not n_docs:
                skipped[str(L)] = (f"no document of {a.dataset} has min_tokens = {min_tokens} tokens "
                                   f"({short} shorter ones)")
                continue
            if a.protocol == "longlora" and not longlora_starts(len(stream), L, a.stride):
                skipped[str(L)] = (f"the stream of {n_docs} documents ({len(stream)} tokens) has no window of {L} "
                                   f"tokens (LongLoRA's loop needs more than L + stride tokens)")
                continue
            if a.protocol == "yarn":
                nlls, n = [], 0
                if a.all_windows:  # every full window, back to back, each scored in full
                    w = L - 1 if bos is not None else L
                    wins = [(j, b, b + w, w) for j, d in enumerate(docs) for b in range(0, len(d) - w + 1, w)]
                else:
                    wins = [(j, b, e, trg) for j, d in enumerate(docs)
                            for b, e, trg in yarn_windows(len(d), L, a.stride, a.truncate, bos is not None)]
                windows = [([bos] if bos is not None else []) + docs[j][b:e] for j, b, e, _ in wins]
                # data-parallel: each rank scores a contiguous block of windows, cut at batch edges (one batch =
                # batch_tokens // window length windows, as window_nlls forms them)
                per = max(1, ctx.batch_tokens // len(windows[0])) if ctx.batch_tokens > 0 and windows else 1
                per_tok = ctx.map_blocks(lambda ws: window_nlls(model, ws, a.chunk, ctx.autocast, ctx.batch_tokens,
                                                                ctx.nll_cache), windows, align=per)
                for (j, b, e, trg), nll in zip(wins, per_tok):
                    nlls.append(float(np.mean(nll[-trg:], dtype=np.float64)))
                    n += trg
                    recs.append({"dataset": a.dataset, "length": L, "doc": j, "doc_name": names[j], "begin": b,
                                 "end": e, "scored": trg, "nll": round(nlls[-1], 6)})
                res[str(L)] = math.exp(float(np.mean(nlls))) if nlls else None
                scored[str(L)] = {"tokens": n, "windows": len(nlls)}
                per_sample[str(L)] = [round(x, 6) for x in nlls]  # one mean NLL per window (truncate: per document)
                if a.all_windows:
                    window_doc[str(L)] = [j for j, _, _, _ in wins]
            else:
                starts = longlora_starts(len(stream), L, a.stride)
                use = subsample(starts, a.max_windows)
                losses = ctx.map(lambda i, L=L: token_nll(model, torch.tensor([stream[i : i + L]]), a.chunk,
                                                          ctx.autocast).mean().item(), use)
                recs += [{"dataset": a.dataset, "length": L, "begin": i, "end": i + L, "scored": L - 1,
                          "nll": round(x, 6)} for i, x in zip(use, losses)]
                # LongLoRA eval.py: ppl = 2.71828 ** val_loss (kept verbatim; e differs in the 7th digit)
                res[str(L)] = 2.71828 ** float(np.mean(losses)) if losses else None
                scored[str(L)] = {"tokens": len(use) * (L - 1), "windows": len(use), "windows_total": len(starts)}
                per_sample[str(L)] = [round(x, 6) for x in losses]
            ci[str(L)] = _interval(per_sample[str(L)], a.protocol)
            write_jsonl(ctx.samples_path(f"ppl_{a.protocol}"), recs)
        return {"ppl": res, "protocol": a.protocol, "dataset": a.dataset, "documents": n_docs,
                "documents_too_short": short, "min_tokens": min_tokens, "scored": scored, "skipped": skipped, "ci": ci,
                "per_sample": per_sample, "per_sample_unit": "window mean NLL, in window order (paired across methods)",
                **({"window_doc": window_doc, "all_windows": True} if a.all_windows else {})}


def _interval(nlls: list, protocol: str):
    """95% interval of the PPL over windows: Student t on the mean NLL, exponentiated (``harness.stats.ppl_interval``);
    None below 3 windows."""

    est = ppl_interval(nlls)
    if est is None:
        return None
    if protocol == "longlora":  # the PPL itself is 2.71828 ** mean; the interval is on the same scale
        scale = 2.71828 ** float(np.mean(nlls)) / est[0]
        return [round(est[1] * scale, 4), round(est[2] * scale, 4)]
    return [round(est[1], 4), round(est[2], 4)]
