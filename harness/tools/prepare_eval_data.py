"""Write every evaluation file the paper suites read, once, on a login node with network, into one root that the
evaluators then read offline: ``paths.eval_root`` (``$HARNESS_EVAL_ROOT``, default ``data/evals``).

    python scripts/prepare_eval_data.py --dry-run                        # list each file, its source and size
    python scripts/prepare_eval_data.py                                  # everything, into paths.eval_root
    python scripts/prepare_eval_data.py --out /data/evals --only paper   # what experiment=paper_* reads
    python scripts/prepare_eval_data.py --only longbench manyshot_trec
    python scripts/prepare_eval_data.py --source-dir S --only paper      # offline, from local files (below)
    export HARNESS_EVAL_ROOT=/data/evals                                 # then eval=paper finds every file

Writes (under ``--out``; ``paper`` = every part but short_context; the paths are conf/eval/paper.yaml's and the
paper experiments' defaults)
  pg19/test.bin                      PG19 test books (emozilla/pg19-test) tokenised as LongLoRA's test.bin is:
                                     uint16 token ids, each book ``[BOS] + ids`` (EOS when the tokenizer has
                                     none), books concatenated in split order; what ppl.py's ``bin:`` reader reads
  pg19/test/NNNNN.txt                the same books as text (nll_by_position, and PPL for non-LLaMA tokenizers)
  proof-pile/test_sampled_data.bin   Proof-pile test split (hoskinson-center/proof-pile): as LongLoRA's file,
                                     ``--proofpile-docs`` (128) documents of at least ``--proofpile-min-tokens``
                                     (32768) tokens drawn at random (seed 0; LongLoRA's own draw is not published
                                     on the hub), in split order, same format as pg19/test.bin
  proof-pile/test_sampled/NNNNN.txt  the same documents as text
  proof-pile/test_sampled_ids.json   which test documents were drawn (their line numbers), with the rule
  PaulGrahamEssays/*.txt             the NIAH haystack (gkamradt/LLMTest_NeedleInAHaystack, as LCEG's needle test)
  squad/dev-v2.0.json                SQuAD v2 dev, the official file (RULER qa_1)
  hotpotqa/hotpot_dev_distractor_v1.json  HotpotQA dev distractor, the official file (RULER qa_2)
  longbench/<task>.jsonl             THUDM/LongBench data.zip, the 16 EN + code tasks, official fields
  manyshot_trec/trec_<n>shots.jsonl  Leooyii/manyshots_trec (the controlled study's files, LongBench format)
  short_context/<task>/<split>.jsonl arc_challenge/{train,test}, hellaswag/{train,validation}, mmlu/{dev,test} (57
                                     subjects, with a subject field), truthfulqa/validation: short_context.py's layout
  helmet/{kilt,msmarco,alce}/...     HELMET's released files (princeton-nlp/HELMET data.tar.gz), the ones the
                                     helmet_* evaluators' tasks name; helmet/prompts/*.json ALCE's prompt files
                                     (the HELMET repository's prompts/)
  helmet/{longqa,summ}/*.jsonl       NarrativeQA (stories over 131072 ``--tokenizer`` tokens, HELMET's filter),
                                     InfiniteBench's English book QA / choice / summaries, Multi-LexSum's short
                                     summaries, from the hub datasets HELMET loads, with the fields its loaders read
  MANIFEST.json                      per part: its source, the tokenizer of its .bin files, when it was written
Each written file is read back with the reader its evaluator uses before the part counts as done. The token
files depend on ``--tokenizer`` (a local folder, a model config name of conf/model, or a hub id; default
llama2_7b's hub id): the .bin files are LLaMA's format, so keep the default for eval=paper.

``--source-dir S`` reads the same sources from local files in their official formats instead of the network
(a CI rehearsal runs the real script on tests/fixtures/eval_sources.py's files):
  S/pg19/*.parquet | *.jsonl[.gz]              records with a ``text`` field, as emozilla/pg19-test has
  S/proof-pile/*.jsonl[.gz] | *.parquet        records with a ``text`` field (the hub's test/proofpile_test.jsonl.gz)
  S/PaulGrahamEssays/*.txt                     one essay per file
  S/squad/dev-v2.0.json                        the official SQuAD v2 dev file
  S/hotpotqa/hotpot_dev_distractor_v1.json     the official HotpotQA dev distractor file
  S/longbench/<task>.jsonl                     data.zip's files, unzipped
  S/manyshots_trec/trec_<n>shots.jsonl         the files of Leooyii/manyshots_trec
  S/short_context/<task>/<split>.jsonl         the layout written above
  S/helmet/<file>                              the layout written above (HELMET's extracted data/ folder)
Files are read in sorted name order. A missing source is one line naming it.

``--dry-run`` prints one line per file (``<path under out>  <-  <source>  (<size>)``; a ``*.txt`` line stands for
one file per document) and writes nothing. Without ``--source-dir`` it needs no network, so sizes are "size unknown
until download". Needs ``datasets`` and ``huggingface_hub`` (hub parts); never called by the harness at run time.
"""
# No `from __future__ import annotations`: the dataclasses below resolve their annotations when the file is loaded
# by path, without a sys.modules entry (tests load scripts that way: tests/conftest.py load_file_module).
import argparse
import gzip
import json
import os
import random
import shutil
import sys
import tarfile
import time
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

from harness.conf_utils import compose
from harness.config import ConfigError
from harness.data.sources import local_directory
from harness.evals import EVALS, ruler_data
from harness.evals.helmet import HelmetCategory, read_samples
from harness.evals.longbench import load_task
from harness.evals.longbench_metrics import TASKS
from harness.evals.manyshot_trec import SHOTS
from harness.evals.ppl import check_dataset, load_token_stream

ROOT = Path(__file__).resolve().parents[2]
PG19 = "emozilla/pg19-test"
PROOFPILE = ("hoskinson-center/proof-pile", "test/proofpile_test.jsonl.gz")
LONGBENCH = ("THUDM/LongBench", "data.zip")
MANYSHOT_TREC = "Leooyii/manyshots_trec"
ESSAYS = "https://api.github.com/repos/gkamradt/LLMTest_NeedleInAHaystack/contents/needlehaystack/PaulGrahamEssays"
SQUAD = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"  # the URLs RULER's download script uses
HOTPOTQA = "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json"
SHORT_CONTEXT = ("arc_challenge/train", "arc_challenge/test", "hellaswag/train", "hellaswag/validation", "mmlu/dev",
                 "mmlu/test", "truthfulqa/validation")
HELMET = ("princeton-nlp/HELMET", "data.tar.gz")  # scripts/download_data.sh: kilt/, msmarco/, alce/, ...
HELMET_PROMPTS = "https://raw.githubusercontent.com/princeton-nlp/HELMET/main/"  # prompts/*.json (ALCE's)
HELMET_LONG_MIN = 131072  # load_narrativeqa keeps stories longer than this many LLaMA-2 tokens
UNKNOWN = "size unknown until download"
PROOFPILE_SEED = 0


@dataclass
class Entry:
    """One file (or, with a ``*`` in ``path``, one file per document) that a part writes under the root."""

    path: str                              # relative to the root
    source: str                            # hub repository / URL, or local file(s)
    size: str                              # "N bytes" when known before writing
    write: Callable[[Path], None]          # writes it, given the root
    check: Callable[[Path], None] | None = None  # reads it back as its evaluator does


@dataclass
class Context:
    """What every part needs: where sources come from, the tokenizer of the .bin files, Proof-pile's draw."""

    source_dir: Path | None
    tokenizer: str
    proofpile_docs: int
    proofpile_min_tokens: int
    loaded: dict = field(default_factory=dict)  # documents read once and shared by the entries of a part

    def local(self, rel: str) -> Path:
        """A file of the source directory; missing is one line."""
        p = self.source_dir / rel
        if not p.is_file():
            raise SystemExit(f"prepare_eval_data: {p} not found (--source-dir layout: see the script's docstring)")
        return p

    def local_files(self, rel_dir: str, patterns: tuple[str, ...]) -> list[Path]:
        d = self.source_dir / rel_dir
        files = sorted({f for pat in patterns for f in d.glob(pat) if f.is_file()})
        if not files:
            raise SystemExit(f"prepare_eval_data: {d} holds no {' | '.join(patterns)} files (--source-dir layout: "
                             f"see the script's docstring)")
        return files

    def copy_size(self, rel: str) -> str:
        return f"{self.local(rel).stat().st_size:,} bytes" if self.source_dir else UNKNOWN


# ---------------------------------------------------------------------------------------------------------------
# reading sources


def read_url(url: str) -> bytes:
    req = urllib.request.Request(url, headers={"User-Agent": "long-context-harness/prepare_eval_data"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def hub_file(repo: str, filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo, filename, repo_type="dataset"))


def records(files: list[Path]):
    """Records of local data files, in order: ``.parquet`` (pyarrow), ``.jsonl`` or ``.jsonl.gz`` (one JSON object
    a line)."""
    for f in files:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            yield from pq.read_table(f).to_pylist()
            continue
        with (gzip.open(f, "rt", encoding="utf-8") if f.suffix == ".gz" else open(f, encoding="utf-8")) as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)


def texts(ctx: Context, what: str) -> list[str]:
    """The documents (``text`` fields) of PG19's or Proof-pile's test split, from the hub or ``--source-dir``."""
    if what not in ctx.loaded:
        patterns = ("*.parquet", "*.jsonl", "*.jsonl.gz")
        if ctx.source_dir:
            rows = records(ctx.local_files(what, patterns))
        elif what == "pg19":
            from datasets import load_dataset

            rows = load_dataset(PG19, split="test")
        else:
            rows = records([hub_file(*PROOFPILE)])
        ctx.loaded[what] = [r["text"] for r in rows]
    return ctx.loaded[what]


def source_of(ctx: Context, what: str, hub: str) -> str:
    if not ctx.source_dir:
        return hub
    files = ctx.local_files(what, ("*.parquet", "*.jsonl", "*.jsonl.gz"))
    return ", ".join(str(f) for f in files)


# ---------------------------------------------------------------------------------------------------------------
# token files


def tokenizer_path(spec: str) -> str:
    """``spec``: a local folder, a model config name (conf/model/<name>.yaml's ``path``; the shipped model's folder
    when that is empty), or a hub id."""
    import yaml

    conf = ROOT / "conf" / "model" / f"{spec}.yaml"
    if Path(spec).is_dir() or not conf.is_file():
        return spec
    return yaml.safe_load(conf.read_text()).get("path") or str(ROOT / "harness" / "assets" / spec)


@cache
def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    path = tokenizer_path(spec)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise SystemExit(f"prepare_eval_data: --tokenizer {spec}: cannot load {path!r} "
                         f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})") from None
    if len(tok) > 1 << 16:
        raise SystemExit(f"prepare_eval_data: --tokenizer {spec} has {len(tok):,} tokens; LongLoRA's .bin format is "
                         f"uint16 (at most 65,536)")
    return tok


def separator(tok) -> int:
    """The token that starts every document of a .bin file: BOS, else EOS (as ppl.py does for text datasets)."""
    sep = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if sep is None:
        raise SystemExit("prepare_eval_data: the tokenizer has neither BOS nor EOS to separate documents")
    return sep


def token_ids(tok, docs: list[str]) -> list[np.ndarray]:
    """Token ids without special tokens, one uint16 array per document (the .bin dtype; the tokenizer fits it,
    ``load_tokenizer``); text that looks like a special token (``<s>``) stays text, so the separator occurs only
    where a document starts (ppl.py splits the stream on it)."""
    out = []
    for i in range(0, len(docs), 32):
        batch = tok(docs[i : i + 32], add_special_tokens=False, split_special_tokens=True).input_ids
        out += [np.asarray(ids, dtype=np.uint16) for ids in batch]
    return out


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary name, so an interrupted run never leaves a short file that looks complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_bin(path: Path, tok, docs: list[np.ndarray]) -> None:
    sep = np.asarray([separator(tok)], dtype=np.uint16)
    write_atomic(path, np.concatenate([x for d in docs for x in (sep, d)]).tobytes())


def write_texts(d: Path, docs: list[str]) -> None:
    """One ``NNNNN.txt`` per document, in order (``local_directory`` reads them sorted), replacing older files."""
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for i, t in enumerate(docs):
        (d / f"{i:05d}.txt").write_text(t, encoding="utf-8")


def check_bin(n_docs: int):
    def check(path: Path) -> None:

        check_dataset(f"bin:{path}", "prepare_eval_data")
        got = len(load_token_stream(str(path), 1 << 62))
        if got != n_docs:
            raise ConfigError(f"{path}: {got} documents read back, {n_docs} written (a separator inside a document)")
    return check


def check_text_dir(path: Path) -> None:

    local_directory(path)


# ---------------------------------------------------------------------------------------------------------------
# the parts


def part_pg19(ctx: Context) -> list[Entry]:
    src = source_of(ctx, "pg19", f"{PG19} (HF dataset, split test)")
    size = "size unknown until built" if ctx.source_dir else UNKNOWN

    def books(root: Path) -> None:
        write_texts(root / "pg19" / "test", texts(ctx, "pg19"))

    def tokens(root: Path) -> None:
        tok = load_tokenizer(ctx.tokenizer)
        write_bin(root / "pg19" / "test.bin", tok, token_ids(tok, texts(ctx, "pg19")))

    return [Entry("pg19/test.bin", f"{src}, tokenised with {tokenizer_path(ctx.tokenizer)}", size, tokens,
                  lambda root: check_bin(len(texts(ctx, "pg19")))(root / "pg19" / "test.bin")),
            Entry("pg19/test/*.txt", f"{src} (one file per book)", size, books,
                  lambda root: check_text_dir(root / "pg19" / "test"))]


def sample_proofpile(ctx: Context) -> tuple[list[int], list[np.ndarray]]:
    """LongLoRA's rule: documents of at least ``min_tokens`` tokens, ``docs`` of them drawn at random. A document
    with fewer UTF-8 bytes than that cannot qualify (a token covers at least one byte; + 1 for a leading-space
    marker), so only the others are tokenised, in batches whose ids are dropped once counted. Returns (line
    numbers in the split, token ids), in split order."""
    if "proof-pile sample" not in ctx.loaded:
        docs, need, tok = texts(ctx, "proof-pile"), ctx.proofpile_min_tokens, load_tokenizer(ctx.tokenizer)
        maybe = [i for i, t in enumerate(docs) if len(t.encode("utf-8")) + 1 >= need]
        long = [i for k in range(0, len(maybe), 32) for i, ids in
                zip(maybe[k : k + 32], token_ids(tok, [docs[i] for i in maybe[k : k + 32]])) if len(ids) >= need]
        if not long:
            raise SystemExit(f"prepare_eval_data: no Proof-pile test document has {need:,} tokens or more "
                             f"(--proofpile-min-tokens)")
        picked = sorted(random.Random(PROOFPILE_SEED).sample(long, min(ctx.proofpile_docs, len(long))))
        print(f"proof-pile: {len(long):,} of {len(docs):,} test documents have >= {need:,} tokens; "
              f"{len(picked)} drawn")
        ctx.loaded["proof-pile sample"] = (picked, token_ids(tok, [docs[i] for i in picked]))
    return ctx.loaded["proof-pile sample"]


def part_proofpile(ctx: Context) -> list[Entry]:
    src = source_of(ctx, "proof-pile", f"{PROOFPILE[0]} {PROOFPILE[1]} (HF dataset)")
    size = "size unknown until built" if ctx.source_dir else UNKNOWN
    rule = (f"{ctx.proofpile_docs} documents of >= {ctx.proofpile_min_tokens} tokens "
            f"({tokenizer_path(ctx.tokenizer)}), "
            f"seed {PROOFPILE_SEED}")

    def tokens(root: Path) -> None:
        write_bin(root / "proof-pile" / "test_sampled_data.bin", load_tokenizer(ctx.tokenizer),
                  sample_proofpile(ctx)[1])

    def docs(root: Path) -> None:
        all_texts = texts(ctx, "proof-pile")
        write_texts(root / "proof-pile" / "test_sampled", [all_texts[i] for i in sample_proofpile(ctx)[0]])

    def ids(root: Path) -> None:
        body = {"source": src, "rule": rule, "ids": sample_proofpile(ctx)[0]}
        write_atomic(root / "proof-pile" / "test_sampled_ids.json", json.dumps(body, indent=1).encode())

    return [Entry("proof-pile/test_sampled_data.bin", f"{src}: {rule}", size, tokens,
                  lambda root: check_bin(len(sample_proofpile(ctx)[0]))(root / "proof-pile" / "test_sampled_data.bin")),
            Entry("proof-pile/test_sampled/*.txt", f"{src}: the same documents as text", size, docs,
                  lambda root: check_text_dir(root / "proof-pile" / "test_sampled")),
            Entry("proof-pile/test_sampled_ids.json", f"{src}: the drawn documents' line numbers", size, ids)]


def part_essays(ctx: Context) -> list[Entry]:
    def check(root: Path) -> None:
        check_text_dir(root / "PaulGrahamEssays")

    if ctx.source_dir:
        files = ctx.local_files("PaulGrahamEssays", ("*.txt",))
        return [Entry(f"PaulGrahamEssays/{f.name}", str(f), f"{f.stat().st_size:,} bytes",
                      lambda root, f=f: write_atomic(root / "PaulGrahamEssays" / f.name, f.read_bytes()), check)
                for f in files]

    def fetch(root: Path) -> None:
        listing = json.loads(read_url(ESSAYS))
        for item in listing:
            if item["name"].endswith(".txt"):
                write_atomic(root / "PaulGrahamEssays" / item["name"], read_url(item["download_url"]))

    return [Entry("PaulGrahamEssays/*.txt", f"{ESSAYS} (one file per essay)", UNKNOWN, fetch, check)]


def copy_or_fetch(ctx: Context, rel: str, local: str, hub: str, fetch: Callable[[], bytes],
                  check: Callable[[Path], None] | None = None) -> Entry:
    """An entry written byte for byte: from ``--source-dir``/``local``, else ``fetch()``."""
    def write(root: Path) -> None:
        write_atomic(root / rel, ctx.local(local).read_bytes() if ctx.source_dir else fetch())

    src = str(ctx.source_dir / local) if ctx.source_dir else hub
    return Entry(rel, src, ctx.copy_size(local), write, (lambda root: check(root / rel)) if check else None)


def check_qa(reader_name: str):
    def check(path: Path) -> None:

        try:
            qas, docs = getattr(ruler_data, reader_name)(path)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{path}: not in the official format ({type(e).__name__}: {e})") from None
        if not qas or not docs:
            raise ConfigError(f"{path}: no answerable questions")
    return check


def part_squad(ctx: Context) -> list[Entry]:
    return [copy_or_fetch(ctx, "squad/dev-v2.0.json", "squad/dev-v2.0.json", SQUAD, lambda: read_url(SQUAD),
                          check_qa("read_squad"))]


def part_hotpotqa(ctx: Context) -> list[Entry]:
    name = "hotpot_dev_distractor_v1.json"
    return [copy_or_fetch(ctx, f"hotpotqa/{name}", f"hotpotqa/{name}", HOTPOTQA, lambda: read_url(HOTPOTQA),
                          check_qa("read_hotpotqa"))]


def check_longbench_format(path: Path) -> None:

    if not load_task(path.parent, path.name.removesuffix(".jsonl")):
        raise ConfigError(f"{path}: no samples")


@cache
def longbench_zip() -> zipfile.ZipFile:
    """THUDM/LongBench's data.zip (the dataset repo's loading script reads the same zip)."""
    return zipfile.ZipFile(hub_file(*LONGBENCH))


def longbench_member(task: str) -> bytes:
    z = longbench_zip()
    names = {Path(n).name: n for n in z.namelist()}
    if f"{task}.jsonl" not in names:
        raise SystemExit(f"prepare_eval_data: longbench: {task}.jsonl not in data.zip")
    return z.read(names[f"{task}.jsonl"])


def part_longbench(ctx: Context) -> list[Entry]:
    return [copy_or_fetch(ctx, f"longbench/{t}.jsonl", f"longbench/{t}.jsonl", f"{'/'.join(LONGBENCH)} ({t}.jsonl)",
                          lambda t=t: longbench_member(t), check_longbench_format) for t in TASKS]


def part_manyshot_trec(ctx: Context) -> list[Entry]:
    def fetch(n: int) -> bytes:
        return hub_file(MANYSHOT_TREC, f"trec_{n}shots.jsonl").read_bytes()

    return [copy_or_fetch(ctx, f"manyshot_trec/trec_{n}shots.jsonl", f"manyshots_trec/trec_{n}shots.jsonl",
                          f"{MANYSHOT_TREC} (HF dataset)", lambda n=n: fetch(n), check_longbench_format)
            for n in SHOTS]


@cache
def short_context_rows() -> dict[str, list[dict]]:
    """The four short-context tasks from their HF datasets, in the layout harness/evals/short_context.py reads."""
    from datasets import get_dataset_config_names, load_dataset

    out = {}
    arc = load_dataset("allenai/ai2_arc", "ARC-Challenge")
    out.update({f"arc_challenge/{s}": list(arc[s]) for s in ("train", "test")})
    hs = load_dataset("Rowan/hellaswag")
    out.update({f"hellaswag/{s}": list(hs[s]) for s in ("train", "validation")})
    subjects = [s for s in get_dataset_config_names("cais/mmlu") if s not in ("all", "auxiliary_train")]
    out["mmlu/dev"], out["mmlu/test"] = [], []
    for s in subjects:
        ds = load_dataset("cais/mmlu", s)
        out["mmlu/dev"] += [dict(r, subject=s) for r in ds["dev"]]
        out["mmlu/test"] += [dict(r, subject=s) for r in ds["test"]]
    out["truthfulqa/validation"] = list(load_dataset("truthfulqa/truthful_qa", "multiple_choice")["validation"])
    return out


def part_short_context(ctx: Context) -> list[Entry]:
    hub = {"arc_challenge": "allenai/ai2_arc ARC-Challenge", "hellaswag": "Rowan/hellaswag", "mmlu": "cais/mmlu",
           "truthfulqa": "truthfulqa/truthful_qa multiple_choice"}

    def rows(key: str) -> bytes:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in short_context_rows()[key]).encode()

    return [copy_or_fetch(ctx, f"short_context/{k}.jsonl", f"short_context/{k}.jsonl",
                          f"{hub[k.split('/')[0]]} (HF dataset)", lambda k=k: rows(k)) for k in SHORT_CONTEXT]


@cache
def helmet_tar() -> tarfile.TarFile:
    return tarfile.open(hub_file(*HELMET), "r:gz")


def helmet_member(rel: str) -> bytes:
    """``data/<rel>`` of HELMET's data.tar.gz."""
    t = helmet_tar()
    names = {n.removeprefix("./").removeprefix("data/"): n for n in t.getnames()}
    if rel not in names:
        raise SystemExit(f"prepare_eval_data: helmet: {rel} not in {'/'.join(HELMET)}")
    return t.extractfile(names[rel]).read()


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def helmet_converted(ctx: Context, rel: str) -> bytes:
    """The long-document files HELMET loads from the hub at run time, written with the fields its loaders read
    (``load_narrativeqa``: stories longer than 131072 tokens of ``--tokenizer``, HELMET's LLaMA-2 filter;
    ``load_infbench``; ``load_multi_lexsum``: the test split with a short summary, sources joined by blank lines)."""
    from datasets import Features, Sequence, Value, load_dataset

    if rel == "longqa/narrativeqa.jsonl":
        tok, long = load_tokenizer(ctx.tokenizer), {}
        rows = []
        for i, x in enumerate(load_dataset("deepmind/narrativeqa")["test"]):
            doc = x["document"]
            if doc["id"] not in long:
                long[doc["id"]] = len(tok(doc["text"]).input_ids) > HELMET_LONG_MIN
            if long[doc["id"]]:
                rows.append({"id": i, "context": doc["text"], "question": x["question"]["text"],
                             "answer": [a["text"] for a in x["answers"]]})
        return _jsonl(rows)
    if rel == "summ/multi_lexsum.jsonl":
        # the hub's own Parquet conversion of the dataset: no loading script (hub code) runs here
        ds = load_dataset("allenai/multi_lexsum", name="v20230518", revision="refs/convert/parquet")["test"]
        return _jsonl({"id": x["id"], "context": "\n\n".join(x["sources"]), "answer": x["summary/short"]}
                      for x in ds if x["summary/short"] is not None)
    split = {"longqa/infbench_qa_eng.jsonl": "longbook_qa_eng", "summ/infbench_sum_eng.jsonl": "longbook_sum_eng",
             "longqa/infbench_choice_eng.jsonl": "longbook_choice_eng"}[rel]
    ft = Features({"id": Value("int64"), "context": Value("string"), "input": Value("string"),
                   "answer": Sequence(Value("string")), "options": Sequence(Value("string"))})
    return _jsonl(load_dataset("xinrongzhang2022/infinitebench", features=ft)[split])


def helmet_files() -> dict[str, str]:
    """{file under helmet/: the task that reads it} for every HELMET category evaluator's tasks."""
    out = {}
    for name in EVALS.names():
        cls = EVALS.get(name)
        if isinstance(cls, type) and issubclass(cls, HelmetCategory):
            for task_name, t in cls.TASKS.items():
                for f in filter(None, (t.file, t.demo_file, t.prompt_file)):
                    out.setdefault(f, f"{name}.{task_name}")
    return out


def check_helmet(path: Path) -> None:
    rows = read_samples(path) if "prompts" not in path.parts else json.loads(path.read_text())["demos"]
    if not rows:
        raise ConfigError(f"{path}: no samples")


def part_helmet(ctx: Context) -> list[Entry]:
    def fetch(rel: str) -> bytes:
        if rel.startswith("prompts/"):
            return read_url(HELMET_PROMPTS + rel)
        if rel.startswith(("longqa/", "summ/")):
            return helmet_converted(ctx, rel)
        return helmet_member(rel)

    def source(rel: str) -> str:
        return (HELMET_PROMPTS + rel if rel.startswith("prompts/") else "hub datasets HELMET loads (converted)"
                if rel.startswith(("longqa/", "summ/")) else f"{'/'.join(HELMET)} (data/{rel})")

    return [copy_or_fetch(ctx, f"helmet/{rel}", f"helmet/{rel}", source(rel), lambda rel=rel: fetch(rel), check_helmet)
            for rel in sorted(helmet_files())]


PARTS = {"pg19": part_pg19, "proofpile": part_proofpile, "pg_essays": part_essays, "squad": part_squad,
         "hotpotqa": part_hotpotqa, "longbench": part_longbench, "manyshot_trec": part_manyshot_trec,
         "short_context": part_short_context, "helmet": part_helmet}
GROUPS = {"paper": [p for p in PARTS if p not in ("short_context", "helmet")]}  # what experiment=paper_* read


def written(root: Path, rel: str) -> str:
    """What an entry left on disk: its size, or for a one-file-per-document entry the number of files."""
    if "*" in rel:
        return f"{len(list(root.glob(rel))):,} files"
    return f"{(root / rel).stat().st_size:,} bytes"


def default_root() -> str:
    """The composed ``paths.eval_root`` (``$HARNESS_EVAL_ROOT`` or conf/paths/default.yaml's default)."""

    return str(compose([]).paths.eval_root)


def main(argv=None) -> int:
    """fetch or convert the evaluation data (paths.eval_root)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="the root to write (default: the composed paths.eval_root)")
    ap.add_argument("--only", nargs="+", choices=sorted(PARTS) + sorted(GROUPS), default=list(PARTS),
                    help="parts, or 'paper' for every part the paper experiments read (default: everything)")
    ap.add_argument("--source-dir", type=Path, help="read the sources from this local layout instead of the network")
    ap.add_argument("--tokenizer", default="llama2_7b",
                    help="tokenizer of the .bin files: a local folder, a conf/model name or a hub id (default "
                         "llama2_7b, the LLaMA tokenizer of LongLoRA's files)")
    ap.add_argument("--proofpile-docs", type=int, default=128, help="Proof-pile documents drawn (LongLoRA: 128)")
    ap.add_argument("--proofpile-min-tokens", type=int, default=32768,
                    help="their minimum length in tokens (LongLoRA: 32768)")
    ap.add_argument("--dry-run", action="store_true", help="list each file, its source and size; write nothing")
    a = ap.parse_args(argv)
    if a.source_dir and not a.source_dir.is_dir():
        raise SystemExit(f"prepare_eval_data: --source-dir {a.source_dir} is not a directory")
    if a.proofpile_docs < 1 or a.proofpile_min_tokens < 1:
        raise SystemExit("prepare_eval_data: --proofpile-docs and --proofpile-min-tokens must be >= 1")
    out = a.out or Path(default_root())
    ctx = Context(a.source_dir, a.tokenizer, a.proofpile_docs, a.proofpile_min_tokens)
    parts = list(dict.fromkeys(p for name in a.only for p in GROUPS.get(name, [name])))
    plan = {p: PARTS[p](ctx) for p in parts}
    if a.dry_run:
        for entries in plan.values():
            for e in entries:
                print(f"{e.path}  <-  {e.source}  ({e.size})")
        print(f"dry run: {sum(map(len, plan.values()))} entries under {out.resolve()}; nothing written")
        return 0
    manifest_path = out / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    for part, entries in plan.items():
        t0 = time.time()
        for e in entries:
            try:  # no network, a gated repository, a moved file: one line naming the entry and its source
                e.write(out)
            except OSError as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise SystemExit(f"prepare_eval_data: {part}: {e.path} <- {e.source}: {first}") from None
            try:
                if e.check:
                    e.check(out)
            except (ConfigError, OSError, ValueError) as err:
                raise SystemExit(f"prepare_eval_data: {part}: {e.path} cannot be read back: {err}") from None
            print(f"{e.path}: {written(out, e.path)}")
        manifest[part] = {"written": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(time.time() - t0),
                          "files": [e.path for e in entries], "sources": sorted({e.source for e in entries}),
                          **({"tokenizer": tokenizer_path(ctx.tokenizer)} if part in ("pg19", "proofpile") else {})}
        write_atomic(manifest_path, json.dumps(manifest, indent=1).encode())
    print(f"done. Evaluate with: export HARNESS_EVAL_ROOT={out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
