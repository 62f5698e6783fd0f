"""scripts/prepare_eval_data.py produces every file the paper suites read: its ``--dry-run`` lists each data path
of the composed ``eval.suite`` (so a file added to a suite without a prepare step fails here), and run offline with
``--source-dir`` on official-format fixtures (tests/fixtures/eval_sources.py) it writes files that the evaluators'
own readers and validation accept."""
from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT
from omegaconf import OmegaConf

from harness import conf_utils
from harness.config import ConfigError
from harness.evals import check_suite
from tests.fixtures.eval_sources import make_eval_sources

EXPERIMENTS = ("paper_llama2", "paper_phi2", "entropy_abf")
EVAL_FILES = [ROOT / "conf" / "eval" / "paper.yaml"] + [conf_utils.find_conf("experiment", e) for e in EXPERIMENTS]
VARIABLES = sorted({v for f in EVAL_FILES for v in re.findall(r"(?:oc\.env|env_or):(HARNESS_\w+)", f.read_text())})


@pytest.fixture
def prep():
    from harness.tools import prepare_eval_data

    return prepare_eval_data


@pytest.fixture
def eval_root(tmp_path, monkeypatch):
    """paths.eval_root under tmp_path, with no per-file variable overriding it."""
    for v in VARIABLES:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HARNESS_EVAL_ROOT", str(tmp_path / "evals"))
    return tmp_path / "evals"


def suite_of(experiment: str) -> tuple[dict, int]:
    cfg = conf_utils.compose([f"experiment={experiment}"])
    return OmegaConf.to_container(cfg.eval.suite, resolve=True), int(cfg.model.native_ctx)


def data_paths(suite: dict) -> list[str]:
    """Every local data location of a suite: ``bin:``/``dir:`` datasets and non-empty ``*_dir``/``*_path`` keys."""
    out = []
    for entry in suite.values():
        for k, v in entry.items():
            if k == "dataset" and isinstance(v, str) and v[:4] in ("bin:", "dir:"):
                out.append(v[4:])
            elif (k.endswith("_dir") or k.endswith("_path")) and v:
                out.append(v)
    return out


def listing(prep, capsys, argv) -> list[str]:
    assert prep.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    return [ln.split("  <-  ")[0] for ln in lines if "  <-  " in ln]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_dry_run_lists_every_file_the_suite_reads(experiment, eval_root, prep, capsys):
    suite, _ = suite_of(experiment)
    paths = data_paths(suite)
    assert paths and all(p.startswith(f"{eval_root}/") for p in paths), paths  # one root for all evaluation data
    listed = listing(prep, capsys, ["--out", str(eval_root), "--dry-run"])
    for p in paths:
        rel = p.removeprefix(f"{eval_root}/")
        assert rel in listed or any(x.startswith(rel + "/") for x in listed), f"{rel} has no prepare step"
    assert not eval_root.exists()  # a dry run writes nothing


def test_each_variable_still_overrides_its_entry(eval_root, monkeypatch):
    assert "HARNESS_PG19_BIN" in VARIABLES and "HARNESS_SQUAD_JSON" in VARIABLES
    for v in VARIABLES:  # a distinct value each, so each one is seen to reach its own entry
        monkeypatch.setenv(v, f"/elsewhere/{v}")
    found = {p for e in EXPERIMENTS for p in data_paths(suite_of(e)[0])}
    assert {f"/elsewhere/{v}" for v in VARIABLES} <= found
    assert not any(p.startswith(f"{eval_root}/") for p in found)  # every entry has its variable


def test_the_default_root_is_the_composed_eval_root(eval_root, prep, capsys):
    assert prep.main(["--dry-run", "--only", "squad"]) == 0
    assert f"under {eval_root}" in capsys.readouterr().out


def test_source_dir_writes_what_the_evaluators_read(tmp_path, eval_root, prep, capsys):
    """The real script, offline, on fixture sources with the shipped tokenizer: before it runs the composed suites
    are refused; after, they validate and each evaluator's reader finds what was written."""
    from transformers import AutoTokenizer

    from harness.evals import manyshot_trec, niah, ruler_data
    from harness.evals.ppl import load_token_stream

    src = make_eval_sources(tmp_path / "src")
    suites = {e: suite_of(e) for e in EXPERIMENTS}
    with pytest.raises(ConfigError):
        check_suite(*suites["paper_llama2"], data=True)
    argv = ["--out", str(eval_root), "--source-dir", str(src), "--only", "paper", "--tokenizer", "tiny_llama",
            "--proofpile-min-tokens", "200", "--proofpile-docs", "5"]
    listed = listing(prep, capsys, [*argv, "--dry-run"])
    assert "squad/dev-v2.0.json" in listed and "PaulGrahamEssays/bias.txt" in listed
    assert prep.main(argv) == 0
    for suite, native_ctx in suites.values():
        check_suite(suite, native_ctx, data=True)

    tok = AutoTokenizer.from_pretrained(ROOT / "harness" / "assets" / "tiny_llama")
    books = [r["text"] for r in prep.records(sorted((src / "pg19").glob("*.parquet")))]
    docs = load_token_stream(str(eval_root / "pg19" / "test.bin"), 1 << 30)
    assert [d.tolist() for d in docs] == [[tok.bos_token_id] + tok(b, add_special_tokens=False).input_ids
                                          for b in books]
    assert sorted(p.read_text() for p in (eval_root / "pg19" / "test").glob("*.txt")) == sorted(books)
    proof = [r["text"] for r in prep.records([src / "proof-pile" / "proofpile_test.jsonl.gz"])]
    long = [i for i, t in enumerate(proof) if len(tok(t, add_special_tokens=False).input_ids) >= 200]
    assert 0 < len(long) < len(proof)  # the fixture has documents on both sides of the minimum
    assert json.loads((eval_root / "proof-pile" / "test_sampled_ids.json").read_text())["ids"] == long
    assert len(load_token_stream(str(eval_root / "proof-pile" / "test_sampled_data.bin"), 1 << 30)) == len(long)

    pl = suites["paper_llama2"][0]
    assert niah.haystack_text(pl["niah"]["haystack_dir"])[1] == pl["niah"]["haystack_dir"]  # not the fallback
    gen = ruler_data.RulerGenerator(tok, essay_dir=pl["ruler"]["essay_dir"], squad_path=pl["ruler"]["squad_path"],
                                     hotpotqa_path=pl["ruler"]["hotpotqa_path"])
    assert gen.haystack(10).source == pl["ruler"]["essay_dir"]
    squad = json.loads((src / "squad" / "dev-v2.0.json").read_text())
    answerable = [q for a in squad["data"] for p in a["paragraphs"] for q in p["qas"] if not q["is_impossible"]]
    assert gen.unavailable("qa_1") is None and len(gen.qa_data("squad")[0]) == len(answerable)
    assert gen.unavailable("qa_2") is None and gen.qa_data("hotpotqa")[0]
    trec = pl["manyshot_trec"]
    assert all(manyshot_trec.load_lceg(trec["data_dir"], n) for n in trec["shots"])


def test_helmet_part_writes_what_every_helmet_category_reads(tmp_path, eval_root, prep, capsys):
    """``--only helmet`` offline: one entry per file a HELMET category's tasks name, each read back; the
    categories then find their data there and draw the same samples as from the fixtures it was copied from."""
    from transformers import AutoTokenizer

    from harness.evals import EVALS
    from harness.evals.helmet import HelmetCategory

    src = make_eval_sources(tmp_path / "src")
    argv = ["--out", str(eval_root), "--source-dir", str(src), "--only", "helmet"]
    listed = listing(prep, capsys, [*argv, "--dry-run"])
    assert "helmet/kilt/nq-dev-multikilt_1000_k1000_dep6.jsonl" in listed
    assert "helmet/prompts/asqa_revised.json" in listed
    assert prep.main(argv) == 0
    tok = AutoTokenizer.from_pretrained(ROOT / "harness" / "assets" / "tiny_llama")
    cats = [n for n in EVALS.names() if isinstance(EVALS.get(n), type) and issubclass(EVALS.get(n), HelmetCategory)]
    assert len(cats) == 5 and len(listed) == len(set(listed))
    for name in cats:
        cls = EVALS.get(name)
        ev, fx = cls(cls.Args(data_dir=str(eval_root / "helmet"), samples=2)), cls(cls.Args(samples=2))
        ev.check_data(f"eval.suite.{name}")
        for t in cls.TASKS:
            assert [s["prompt"] for s in ev.samples(tok, t, 2048)] == [s["prompt"] for s in fx.samples(tok, t, 2048)]
