"""`make findings`: the coded verdict rule, fed synthetic rows for each verdict of each of the thirteen findings.

Three synthetic studies (tiny_llama-like, C = 256, lengths C..16C, 50 passkey prompts per length, 8 documents per
PPL cell, per-document NLL by position): one where every claim of the paper holds by a wide margin ("paper"), one
where every claim is reversed ("opposite") and one where every quantity sits exactly on its margin ("null"). The
rule must call them reproduced / contradicted / inconclusive, finding by finding; a missing row must give
"inconclusive (no rows: ...)", never a verdict.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from controlled_study import findings as fd
from controlled_study.paper import Paper
from controlled_study.rows import RowSet, load_spec
from harness import stats
from tests import forkrun

ROOT = Path(__file__).resolve().parents[1]

C = 256
FACTORS = (1, 2, 4, 8, 16)
N = 50                                   # passkey prompts per length
DOC = np.linspace(-0.2, 0.2, 8)          # per-document offsets shared by every method (documents are paired)


def noise(method: str) -> np.ndarray:
    """Zero-mean, method-specific per-document noise: paired differences have a spread but an exact mean."""
    rng = np.random.default_rng(sum(map(ord, method)))
    e = rng.normal(0, 0.03, 8)
    return e - e.mean()


def outcomes(acc: float, who: str, L: int) -> list[int]:
    """N passkey outcomes with accuracy ``acc`` (an exact count), the prompts a configuration gets right chosen by
    its name: two configurations share their per-prompt outcomes only where they are the same configuration."""
    k = int(round(acc * N))
    return [int(v) for v in np.random.default_rng(sum(map(ord, who)) * 100003 + L).permutation([1] * k + [0] * (N - k))]


def row(method: str, acc, nll, *, frozen: bool, train_len: int | None = None, nllpos=(4.0, 4.5), key=None,
        study_row: str | None = None, attention_exact=True) -> dict:
    """A results row: passkey accuracy per length factor (exact counts of N, the same prompts for every method:
    paired), mean NLL per length factor (8 documents), NLL by position (mean over positions <= C, > C)."""
    lengths = [int(f * C) for f in FACTORS]
    e = noise(key or method)
    correct = {str(L): outcomes(a, key or method, L) for L, a in zip(lengths, acc)}
    per_sample = {str(L): list(m + DOC + noise(f"{key or method}{L}")) for L, m in zip(lengths, nll)}
    ppl = {L: math.exp(float(np.mean(v))) for L, v in per_sample.items()}
    pos = list(range(1, 16 * C, 128))
    per_doc = [[(nllpos[0] if p <= C else nllpos[1]) + DOC[i] + e[i] for p in pos] for i in range(8)]
    metrics = {
        "ppl_books": {"ppl": ppl, "per_sample": per_sample, "protocol": "yarn", "documents": 8, "skipped": {}},
        "ppl_code": {"ppl": dict(ppl), "per_sample": {L: list(v) for L, v in per_sample.items()}, "protocol": "yarn",
                     "documents": 8, "skipped": {}},   # code (Proof-pile's analogue): the same numbers
        "passkey": {"accuracy": {L: sum(v) / N for L, v in correct.items()}, "correct": correct,
                    "samples_per_length": N, "skipped": {}},
        "nll_by_position": {"positions": pos, "nll": list(np.mean(per_doc, axis=0)), "per_doc": per_doc,
                            "length": 16 * C, "documents": 8},
    }
    suite = {k: {"name": {"ppl_books": "ppl", "ppl_code": "ppl"}.get(k, k)} for k in metrics}
    run_id = f"{key or method}-{'f' if frozen else 't'}"
    return {"schema": 1, "run_id": run_id, "status": "ok", "model": "tiny_llama", "method": method, "data": "local_mix",
            "train": "none" if frozen else "tiny", "eval": "tiny", "method_params": {"name": method},
            "train_info": None if frozen else {"seq_len": train_len}, "metrics": metrics,
            "time_start": "2026-01-01T00:00:00", "time_end": "2026-01-01T00:00:00",
            "config": {"model": {"name": "tiny_llama", "native_ctx": C},
                       "train": {"enabled": not frozen, "seq_len": train_len or C},
                       "eval": {"name": "tiny", "suite": suite},
                       "study": {"row": study_row} if study_row else {}},
            "config_hash": "x", "run_dir": None}


L2 = math.log(2.0)


def world(kind: str) -> list[dict]:
    """Synthetic studies. ``paper``: every claim holds; ``opposite``: every claim reversed; ``null``: every quantity
    exactly on its margin (0 for differences, 1.25 for (f)'s flatness, 1.10 for (k), -0.25 for (i))."""
    T, S = 8 * C, 16 * C
    if kind == "paper":
        spec = {  # method: (frozen, train_len, passkey by factor, NLL by factor, NLL by position (<=C, >C))
            "base": (True, None, [1, 0, 0, 0, 0], [4.0, 4.5, 5.0, 5.2, 5.5], (3.9, 5.0)),
            "ntk_frozen": (True, None, [1, 1, 0, 0, 0], [4.0, 4.1, 4.6, 4.8, 5.0], (3.9, 4.6)),
            "self_extend": (True, None, [1, .5, .5, .5, .5], [4.0] * 5, (3.9, 4.0)),
            "lm_infinite": (True, None, [1, .1, .1, .1, .1], [4.0] * 5, (3.9, 4.0)),
            "pi": (False, T, [1, 1, 1, 1, 0], [4.02, 3.9, 3.85, 3.8, 4.5], (4.0, 3.9)),
            "yarn": (False, T, [1, 1, 1, 1, 0], [4.02, 3.9, 3.85, 3.8, 4.5], (4.0, 3.8)),
            "clex": (False, T, [1, 1, 1, .5, .2], [4.03, 3.9, 3.85, 3.82, 3.9], (4.0, 3.9)),
            "ntk_32k": (False, T, [1, 1, 1, 1, 1], [4.01, 3.88, 3.83, 3.78, 3.8], (4.0, 3.7)),
            "ntk_64k": (False, S, [1, .7, .7, .7, .7], [4.05, 4.0, 4.0, 4.1, 4.1], (4.0, 4.0)),
            "ntk_64k_2b": (False, S, [1, 1, 1, 1, 1], [4.01, 3.88, 3.83, 3.79, 3.8], (4.0, 3.7)),
            "longlora": (False, T, [.2, .2, .2, .2, 0], [4.5, 4.4, 4.4, 4.4, 4.6], (4.4, 4.4)),
            "landmark": (False, 2 * C, [1, .2, .2, 0, 0], [4.1, 4.0, 4.0, 4.0, 4.0], (4.0, 4.0)),
            # the same-data control: the base fine-tuned inside C (lower NLL inside C than the frozen base)
            "base_ft": (False, C, [1, 0, 0, 0, 0], [4.0, 4.5, 5.0, 5.2, 5.5], (3.9, 5.0)),
        }
    elif kind == "opposite":
        spec = {
            "base": (True, None, [1, 1, 1, 1, 1], [4.0, 4.5, 5.0, 5.0, 5.5], (4.2, 3.5)),
            "ntk_frozen": (True, None, [1, 0, 1, 1, 1], [4.0, 4.1, 4.4, 4.5, 4.6], (4.2, 3.5)),
            "self_extend": (True, None, [.6] * 5, [4.0] * 5, (4.2, 3.5)),
            "lm_infinite": (True, None, [0, 1, 1, 1, 1], [3.0, 3.3, 3.5, 3.0 + L2, 3.8], (4.2, 3.5)),
            "pi": (False, T, [.5] * 5, [4.0 + math.log(1.5), 4.45, 4.45, 4.45, 4.3], (3.9, 4.0)),
            "yarn": (False, T, [.45] * 5, [4.0 + math.log(1.5), 4.4, 4.4, 4.4, 4.3], (3.9, 4.0)),
            "clex": (False, T, [.4] * 5, [4.0 + math.log(1.5), 4.35, 4.35, 4.35, 4.3], (3.9, 4.0)),
            "ntk_32k": (False, T, [.2] * 5, [4.0 + math.log(1.5), 4.0, 4.0, 4.1, 4.1], (3.9, 4.0)),
            "ntk_64k": (False, S, [.4] * 5, [4.5, 4.3, 4.3, 4.3, 4.3], (3.9, 4.0)),
            "ntk_64k_2b": (False, S, [0] * 5, [4.5, 3.9, 3.9, 3.9, 3.9], (3.9, 4.0)),
            "longlora": (False, T, [1] * 5, [3.5, 3.2, 3.1, 3.0, 3.0], (3.9, 4.0)),
            "landmark": (False, 2 * C, [0, 1, 1, 1, 1], [4.1, 4.0, 4.0, 4.0, 4.0], (3.9, 4.0)),
            "base_ft": (False, C, [1] * 5, [4.0, 4.5, 5.0, 5.0, 5.5], (4.2, 3.5)),
        }
    else:  # null
        flat = [4.0, 4.0, 4.0, 4.0, 4.0]
        spec = {m: (fz, tl, [.5] * 5, list(flat), (4.0, 4.0)) for m, fz, tl in (
            ("base", True, None), ("ntk_frozen", True, None), ("self_extend", True, None), ("pi", False, T),
            ("yarn", False, T), ("clex", False, T), ("ntk_32k", False, T), ("ntk_64k", False, S),
            ("ntk_64k_2b", False, S), ("longlora", False, T), ("landmark", False, 2 * C), ("base_ft", False, C))}
        spec["lm_infinite"] = (True, None, [.5] * 5, [4.0, 4.0, 4.0, 4.0 + math.log(1.25), 4.0], (4.0, 4.0))
        for m in ("pi", "yarn", "clex", "ntk_32k"):   # (k): PPL at C exactly 1.10 x the base's
            spec[m][3][0] = 4.0 + math.log(1.10)
        for m, v in spec.items():  # (m): fine-tuned PPL at 8C (and 16C, for (c) and (h)) equal to LM-Infinite's
            if not v[0] and m != "base_ft":
                v[3][3] = v[3][4] = 4.0 + math.log(1.25)
    rows = []
    for m, (fz, tl, acc, nll, pos) in spec.items():
        method = {"ntk_64k_2b": "ntk_64k", "base_ft": "base"}.get(m, m)
        rows.append(row(method, acc, nll, frozen=fz, train_len=tl, nllpos=pos, key=m,
                        study_row="NTK-64K-2B" if m == "ntk_64k_2b" else None))
    return rows


def verdicts(rows) -> dict:
    rs = RowSet(rows, load_spec())
    fs, _ = fd.evaluate(rs, "tiny_llama")
    return {f.key: f for f in fs}


KEYS = "abcdefghijklm"


@pytest.mark.parametrize("kind,expected", [("paper", fd.REPRODUCED), ("opposite", fd.CONTRADICTED),
                                           ("null", fd.INCONCLUSIVE)])
def test_every_finding_gets_each_verdict(kind, expected):
    got = verdicts(world(kind))
    assert sorted(got) == list(KEYS)
    wrong = {k: (f.result, f.reason, [p.text() for p in f.parts]) for k, f in got.items() if f.result != expected}
    assert not wrong, wrong
    for f in got.values():                                  # every verdict rests on intervals it prints
        assert all(p.ci is not None or p.why for p in f.parts)


def test_missing_rows_are_inconclusive_never_a_verdict():
    rows = [r for r in world("paper") if r["run_id"] not in ("ntk_64k_2b-t", "lm_infinite-f", "base_ft-t")]
    got = verdicts(rows)
    assert got["j"].result == fd.INCONCLUSIVE and "no rows: ntk_64k_2b" in got["j"].reason
    assert got["f"].result == fd.INCONCLUSIVE and "no rows: lm_infinite" in got["f"].reason
    assert got["k"].result == fd.INCONCLUSIVE and "no rows: base fine-tuned at C" in got["k"].reason
    # no rows at all: every finding inconclusive
    assert {f.result for f in verdicts([]).values()} == {fd.INCONCLUSIVE}


def test_a_difference_pools_only_the_lengths_both_sides_have():
    """A study with some cells not run yet (the SmolLM2 track: Self-Extend at C only, NTK-F at C and 2C; 4C only on
    a GPU): Needle pooled over C..16C compares the same lengths and prompts on both sides, never one side's 2C
    against nothing."""
    rows = world("paper")
    se = next(r for r in rows if r["run_id"] == "self_extend-f")
    pk = se["metrics"]["passkey"]
    for k in ("accuracy", "correct"):
        pk[k] = {L: v for L, v in pk[k].items() if L == str(C)}   # Self-Extend at C only: 1.00; NTK-F at C: 1.00
    part = next(p for p in verdicts(rows)["e"].parts if p.what == "Self-Extend - NTK-F")
    assert part.ci[0] == 0.0 and part.verdict() == fd.INCONCLUSIVE   # pooled over its own lengths it was +0.60


def test_rows_without_per_sample_scores_give_no_verdict_on_ppl():
    rows = world("paper")
    for r in rows:
        r["metrics"]["ppl_books"].pop("per_sample")             # a row written before issue 20
    got = verdicts(rows)
    for k in "chk":
        assert got[k].result == fd.INCONCLUSIVE and "per-document NLL not in the rows" in got[k].reason, k


def test_part_rule():
    P = fd.Part
    assert P("x", (0.3, 0.1, 0.5)).verdict() == fd.REPRODUCED
    assert P("x", (-0.3, -0.5, -0.1)).verdict() == fd.CONTRADICTED
    assert P("x", (0.1, -0.1, 0.3)).verdict() == fd.INCONCLUSIVE
    assert P("x", (0.3, 0.1, 0.5), direction=-1).verdict() == fd.CONTRADICTED
    assert P("x", (1.05, 1.01, 1.08), direction=-1, margin=1.10).verdict() == fd.REPRODUCED   # below the margin
    assert P("x", (1.05, 1.01, 1.12), direction=-1, margin=1.10).verdict() == fd.INCONCLUSIVE
    assert P("x", None, why="no rows: pi").verdict() == fd.INCONCLUSIVE
    # parts that disagree make a mixed finding, not a contradicted one; contradicted needs no part reproduced
    assert fd.verdict([P("a", (1, .5, 1.5)), P("b", (-1, -1.5, -.5))])[0] == fd.MIXED
    assert fd.verdict([P("a", (.1, -.5, 1.5)), P("b", (-1, -1.5, -.5))])[0] == fd.CONTRADICTED
    assert fd.verdict([P("a", (1, .5, 1.5)), P("b", None, why="no rows: x")]) == (fd.INCONCLUSIVE, "no rows: x")
    assert fd.verdict([P("a", (1, .5, 1.5)), P("b", (2, 1, 3))]) == (fd.REPRODUCED, "")
    # fragile: a second reasonable interval (BCa) on another side of the margin than the one that decides
    frag = P("x", (1.04, 0.86, 1.26), direction=-1, margin=1.25, alt=(1.04, 0.90, 1.20), decimals=3)
    assert frag.verdict() == fd.INCONCLUSIVE and frag.fragile and "fragile: BCa [0.900, 1.200]" in frag.text()
    assert not P("x", (0.3, 0.1, 0.5), alt=(0.3, 0.2, 0.4)).fragile


def test_an_accuracy_part_carries_the_paired_bootstrap_as_its_second_interval():
    """A difference of accuracies on the same 50 prompts with 4 discordant pairs, all one way: Newcombe's paired
    interval contains 0 (it decides: inconclusive), the paired percentile bootstrap excludes it, so the part is
    fragile and says so; with 8 discordant pairs both exclude 0 and the part is not fragile."""
    from controlled_study.estimates import Est

    def est(x):
        return Est(float(np.mean(x)), n=len(x), kind="proportion", samples=list(x), paired=True, keys=(512,),
                   lo=0.0, hi=1.0)

    def part(f):
        a = [1] * 10 + [1] * f + [0] * (40 - f)
        b = [1] * 10 + [0] * f + [0] * (40 - f)
        return fd.part_prop("a - b", est(a), est(b), "a", "b")

    weak = part(4)
    assert weak.ci == stats.newcombe_diff([1] * 14 + [0] * 36, [1] * 10 + [0] * 40, paired=True)
    assert weak.verdict() == fd.INCONCLUSIVE and weak.alt[1] > 0 and weak.fragile
    assert "fragile: paired bootstrap [+0.02, +0.16]" in weak.text()
    strong = part(8)
    assert strong.verdict() == fd.REPRODUCED and strong.alt[1] > 0 and not strong.fragile


def test_intervals_behind_the_rule():
    # Wilson never collapses at 0/n, n/n; Newcombe's difference (unpaired: Newcombe 1998 Table II example)
    assert stats.wilson(0, 5)[1] == pytest.approx(0.4345, abs=1e-4) and stats.wilson(5, 5)[0] == pytest.approx(0.5655,
                                                                                                            abs=1e-4)
    d, lo, hi = stats.newcombe_diff([1] * 56 + [0] * 14, [1] * 48 + [0] * 32)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    # paired with phi = 0 is the unpaired interval; positive association narrows it; it always contains the estimate
    a = [1] * 30 + [0] * 20
    b = [1] * 25 + [0] * 25
    up, pa = stats.newcombe_diff(a, b), stats.newcombe_diff(a, b, paired=True)
    assert pa[0] == up[0] and pa[2] - pa[1] < up[2] - up[1] and pa[1] <= pa[0] <= pa[2]
    # coverage of the paired interval on correlated binary pairs is near 95%
    rng = np.random.default_rng(0)
    cover = 0
    for _ in range(400):   # p_a = 0.6; p_b = P(z + e < 0.5) = 0.5 (e symmetric): the true difference is 0.1
        z = rng.random(60)
        x, y = (z < 0.6).astype(float), (z + rng.normal(0, 0.15, 60) < 0.5).astype(float)
        _, lo, hi = stats.newcombe_diff(x, y, paired=True)
        cover += lo <= 0.1 <= hi
    assert cover / 400 > 0.9
    # a PPL interval needs 3 documents; paired ratio of identical documents is 1 exactly
    assert stats.ppl_interval([4.0, 4.1]) is None
    r = stats.ppl_ratio([4.0, 4.1, 4.2], [4.0, 4.1, 4.2])
    assert r == (1.0, 1.0, 1.0)
    rho = stats.spearman_interval(list(range(10)), list(range(10))[::-1])
    assert rho[0] == pytest.approx(-1.0) and rho[2] == pytest.approx(-1.0)


def test_make_findings_script(tmp_path):
    res = tmp_path / "results"
    (res / "runs").mkdir(parents=True)
    for r in world("paper"):
        (res / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    out = forkrun.run([sys.executable, str(ROOT / "scripts" / "make_findings.py"), "--results", str(res)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    md = (res / "findings.md").read_text()
    assert md.count("**reproduced**") == len(fd.FINDINGS) == 13
    assert ("| finding | evidence: paper \u2192 ours | metric, lengths, references | ours (95% CI) \u2192 part "
            "verdict | paper | verdict |") in md
    assert "Verdicts: 13 reproduced, 0 contradicted, 0 mixed, 0 inconclusive." in md
    assert "13 findings (reproduced 13)" in out.stdout
    assert "## Rows used" in md and "`ntk_32k-t`" in md and "## Not testable at this scale" in md


def test_short_context_costs_use_the_same_data_control_and_long_gains_an_in_window_reference():
    """(k) and (l)'s 1..C part are decided against the base fine-tuned inside C (the same-data control), (l)'s
    C..8C part against LM-Infinite (window C); the frozen base is printed beside them and never decides. Here the
    frozen base is made to look bad inside C and good beyond it: nothing changes but the lines beside."""
    rows = world("paper")
    before = verdicts(rows)
    base = next(r for r in rows if r["run_id"] == "base-f")
    shifted = row("base", [1, 0, 0, 0, 0], [4.5, 4.5, 5.0, 5.2, 5.5], frozen=True, nllpos=(4.5, 3.0), key="base")
    after = verdicts([r for r in rows if r is not base] + [shifted])
    assert {k: f.result for k, f in after.items()} == {k: f.result for k, f in before.items()}
    assert [p.what for p in after["l"].parts] == ["YaRN - tiny_llama (FT), NLL 1..C", "YaRN - LM-Infinite, NLL C..8C",
                                                  "NTK-32K - tiny_llama (FT), NLL 1..C",
                                                  "NTK-32K - LM-Infinite, NLL C..8C"]
    assert all(p.verdict() == fd.REPRODUCED for p in after["l"].parts + after["k"].parts)
    # beside, against the frozen base: the 1..C difference has the other sign, and the report says it decides nothing
    short = [p for p in after["l"].controls if p.what.endswith("1..C")]
    assert len(short) == 2 and all(p.ci[2] < 0 for p in short), [p.text() for p in short]
    assert len(after["k"].controls) == len(fd.ft_32k(Paper())) and "same-data control" in after["k"].reference
    assert "LM-Infinite" in after["l"].reference and "in-window" in after["l"].reference
    # without the control there is no verdict on the short-context parts: the frozen base does not stand in for it
    no_ctrl = verdicts([r for r in rows if r["run_id"] != "base_ft-t"])
    assert no_ctrl["k"].result == fd.INCONCLUSIVE and "no rows: base fine-tuned at C" in no_ctrl["k"].reason
    assert no_ctrl["l"].parts[0].why.startswith("no rows: base fine-tuned at C")


def test_a_group_mean_does_not_hide_a_member_going_the_other_way():
    """(a) with one approximate method retrieving better than one exact one: the group mean still favours exact
    attention, the member pair is contradicted and the finding is mixed (not reproduced, not contradicted)."""
    rows = world("paper")
    se = next(r for r in rows if r["run_id"] == "self_extend-f")
    better = row("self_extend", [1, .95, .95, .95, .95], [4.0] * 5, frozen=True, nllpos=(3.9, 4.0))
    got = verdicts([r for r in rows if r is not se] + [better])["a"]
    parts = {p.what: p for p in got.parts}
    assert parts["exact FT - approximate, Needle"].verdict() == fd.REPRODUCED
    assert parts["YaRN - Self-Extend, Needle"].verdict() == fd.CONTRADICTED
    assert parts["NTK-32K - LM-Infinite, Needle"].verdict() == fd.REPRODUCED
    assert len(got.parts) == 1 + 5 * 4 and got.result == fd.MIXED and "contradicted: " in got.reason


def test_holm_over_all_parts_can_only_weaken_a_verdict():
    """Holm's correction: a part whose raw interval barely excludes the margin among many tests loses its side; a
    part far from its margin keeps it; the finding's Holm verdict follows the same rule."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, 8)
    _, lo, hi = stats.mean_interval(x)
    weak = x - x.mean() + 1.05 * (hi - lo) / 2             # the raw interval's lower bound just above 0
    weak_part = fd.Part("weak", stats.mean_interval(weak), at_level=lambda lv: stats.mean_interval(weak, level=lv))
    strong = x - x.mean() + 5.0
    strong_part = fd.Part("strong", stats.mean_interval(strong),
                          at_level=lambda lv: stats.mean_interval(strong, level=lv))
    assert weak_part.verdict() == strong_part.verdict() == fd.REPRODUCED
    f1, f2 = fd.Finding("x", "", "", "", parts=[weak_part]), fd.Finding("y", "", "", "", parts=[strong_part])
    fillers = [fd.Finding(str(i), "", "", "", parts=[fd.Part(str(i), stats.mean_interval(x),
                                                             at_level=lambda lv: stats.mean_interval(x, level=lv))])
               for i in range(8)]
    fd.correct([f1, f2] + fillers)
    assert weak_part.holm == fd.INCONCLUSIVE and strong_part.holm == fd.REPRODUCED
    assert f1.decide().result == fd.REPRODUCED and f1.holm == fd.INCONCLUSIVE and f2.holm == fd.REPRODUCED
    # on the real report every finding states both
    rep = fd.report(RowSet(world("paper"), load_spec()), "tiny_llama")
    assert rep.count("<br>Holm: ") == len(fd.FINDINGS) and "After Holm's correction over all " in rep


def test_ntk_frozen_is_compared_length_by_length_and_the_collapse_is_located():
    """(g): 2C against 4C directly (not 4C..16C pooled), and beside it where NTK-F stops beating the base and where its
    score drops most: in the paper world NTK-F works at 2C and is gone at 4C."""
    got = verdicts(world("paper"))["g"]
    assert [p.what for p in got.parts] == ["NTK-F - tiny_llama at 2C, passkey", "NTK-F at 2C - at 4C, passkey"]
    assert got.result == fd.REPRODUCED
    assert ("passkey: NTK-F beats tiny_llama at every length beyond C up to 2C (the interval excludes 0 at each)"
            in got.notes)
    assert any(n.startswith("passkey: its largest drop: 2C \u2192 4C, 1.00 \u2192 0.00") for n in got.notes), got.notes
    # NTK-F that keeps working to 4C: the direct 2C - 4C part is no longer reproduced, and the drop moves to 4C -> 8C
    rows = [r for r in world("paper") if r["run_id"] != "ntk_frozen-f"]
    rows.append(row("ntk_frozen", [1, 1, 1, 0, 0], [4.0, 4.1, 4.6, 4.8, 5.0], frozen=True, nllpos=(3.9, 4.6)))
    far = verdicts(rows)["g"]
    assert far.parts[1].verdict() == fd.INCONCLUSIVE and far.result == fd.INCONCLUSIVE
    assert any(n.startswith("passkey: its largest drop: 4C \u2192 8C") for n in far.notes), far.notes
    assert any("beyond C up to 4C" in n for n in far.notes), far.notes
    # an NTK-F that never drops (SmolLM2's CPU track stops at 2C, where it still holds): no step is called a drop
    flat = [r for r in world("paper") if r["run_id"] != "ntk_frozen-f"]
    flat.append(row("ntk_frozen", [1, 1, 1, 1, 1], [4.0, 4.1, 4.6, 4.8, 5.0], frozen=True, nllpos=(3.9, 4.6)))
    notes = verdicts(flat)["g"].notes
    assert not any("largest drop" in n for n in notes), notes
    assert any(n.startswith("passkey: no drop from one length to the next up to ") and "; its smallest change: " in n
               for n in notes), notes


def test_duplicate_configurations_are_recognised_by_their_outcomes_and_counted_once():
    """A frozen configuration under another name with LM-Infinite's per-prompt outcomes at every length (StreamingLLM
    with a window of C) is one configuration: (e) compares Self-Extend with it once and the report says so. Two
    configurations that are each all right or all wrong at every length are not called duplicates."""
    rows = world("paper")
    lmi = next(r for r in rows if r["run_id"] == "lm_infinite-f")
    twin = json.loads(json.dumps(lmi))
    twin.update(run_id="streaming_llm-f", method="streaming_llm", method_params={"name": "streaming_llm"})
    twin["time_start"] = twin["time_end"] = "2026-01-02T00:00:00"
    rs = RowSet(rows + [twin], load_spec())
    fs, ev = fd.evaluate(rs, "tiny_llama")
    assert ev.duplicates == {"StreamingLLM": ("LM-Infinite", N * len(FACTORS))}
    e = next(f for f in fs if f.key == "e")
    assert not any("StreamingLLM" in p.what for p in e.parts + e.controls)
    assert "- LM-Infinite = StreamingLLM (n = 250 prompts" in fd.report(rs, "tiny_llama")
    # PI and YaRN both score 1 at C..8C and 0 at 16C in this world: identical outcomes, but no evidence of identity
    assert "YaRN" not in ev.duplicates and "PI" not in ev.duplicates


def test_methods_beyond_the_paper_never_change_a_verdict():
    """A frozen method the paper did not study (DCA here, retrieving as well as Self-Extend) is reported beside (e) and
    kept out of (d): the findings about the paper's methods keep their scope."""
    rows = world("paper")
    before = verdicts(rows)
    dca = row("dca", [1, 1, 1, 1, 1], [4.0, 4.0, 4.0, 4.0, 4.0], frozen=True, key="dca")
    pose = row("pose", [0, 0, 0, 0, 0], [4.0, 3.0, 3.0, 3.0, 3.0], frozen=False, train_len=C, key="pose")
    after = verdicts(rows + [dca, pose])
    assert {k: f.result for k, f in after.items()} == {k: f.result for k, f in before.items()}
    assert [p.text() for p in after["d"].parts] == [p.text() for p in before["d"].parts]
    assert [p.text() for p in after["e"].parts] == [p.text() for p in before["e"].parts]
    assert [p.what for p in after["e"].controls] == ["Self-Extend - DCA"]


def _reseed(r: dict, seed: int) -> dict:
    r = json.loads(json.dumps(r))
    r["run_id"] += f"-s{seed}"
    r["config"]["data"] = {"seed": seed}
    r["config"]["train"]["seed"] = seed
    return r


def test_training_seeds_are_never_mixed_and_a_seed_dependent_verdict_is_inconclusive():
    """A second training seed of NTK-32K whose rows reverse the paper (taken from the "opposite" world): cells show
    seed 0 only, ``reseeded`` shows seed 1, (b) (NTK-32K best, extrapolates) is reproduced on seed 0, not on seed 1,
    so the report calls it inconclusive and says why; the seed-to-seed table pairs the same prompts."""
    paper = world("paper")
    flip = _reseed(next(r for r in world("opposite") if r["run_id"] == "ntk_32k-t"), 1)
    flip["run_id"] = "ntk_32k-t-s1"
    rs = RowSet(paper + [flip], load_spec())
    (e,) = [e for e in rs.for_model("tiny_llama") if e.method == "ntk_32k"]
    assert e.seeds == ["0", "1"] and e.seed == "0" and [r["run_id"] for r in e.rows] == ["ntk_32k-t"]
    assert rs.other_seeds() == ["1"]
    (e1,) = [e for e in rs.reseeded("1").for_model("tiny_llama") if e.method == "ntk_32k"]
    assert [r["run_id"] for r in e1.rows] == ["ntk_32k-t-s1"]
    assert any("seeds 0, 1, shown: 0" in n for n in rs.footnotes())

    alone = {f.key: f.result for f in fd.evaluate(rs, "tiny_llama")[0]}
    fs, _, per_seed = fd.seeded(rs, "tiny_llama")
    got = {f.key: f for f in fs}
    assert alone["b"] == fd.REPRODUCED and per_seed["1"][1] != fd.REPRODUCED
    assert got["b"].result == fd.INCONCLUSIVE and "depends on the training seed" in got["b"].reason
    for k, v in alone.items():  # a finding that does not involve NTK-32K, or holds on both seeds, keeps its verdict
        if per_seed["1"][KEYS.index(k)] == v:
            assert got[k].result == v, k
    # Holm runs over each seed's own parts; across seeds a Holm verdict can only be lost (the shown seed's family-wise
    # 5% holds for the report): never a verdict the shown seed's Holm did not give, inconclusive where seeds differ
    holm_alone = {f.key: f.holm for f in fd.evaluate(rs, "tiny_llama")[0]}
    holm_s1 = {f.key: f.holm for f in fd.evaluate(rs.reseeded("1"), "tiny_llama")[0]}
    for k, f in got.items():
        assert f.holm in (holm_alone[k], fd.INCONCLUSIVE), k
        assert f.holm == (holm_alone[k] if holm_alone[k] == holm_s1[k] else fd.INCONCLUSIVE), k
    assert holm_alone["b"] != holm_s1["b"] and got["b"].holm == fd.INCONCLUSIVE
    rep = fd.report(rs, "tiny_llama")
    assert "## Training seeds" in rep and f"| (b) | reproduced | {per_seed['1'][1]} |" in rep
    line = next(ln for ln in rep.splitlines() if ln.startswith("| NTK-32K | 0 \u2192 1 |"))
    assert "1.00 \u2192 0.20 (-0.80" in line and "n=50" in line and "`ntk_32k-t-s1`" in line
    assert fd.report(RowSet(paper, load_spec()), "tiny_llama").count("Training seeds") == 0


def test_a_seed_whose_row_failed_the_gate_shows_no_rows_instead_of_another_seeds():
    """NTK-32K's seed-0 row failed the convergence gate, its seed-1 row passed: the seed-0 view (cells, findings)
    has no NTK-32K rows rather than borrowing seed 1's (which would compare seed 1 of one method with seed 0 of
    another); seed 1's view shows the seed-1 row; with the gate off (the sensitivity line) seed 0's row is back."""
    rows = world("paper")
    ntk = next(r for r in rows if r["run_id"] == "ntk_32k-t")
    s1 = _reseed(ntk, 1)
    ntk["train_info"]["convergence"] = {"converged": False, "rule": "r"}
    rs = RowSet(rows + [s1], load_spec())
    assert not [e for e in rs.for_model("tiny_llama") if e.method == "ntk_32k"]
    assert [r["run_id"] for r in rs.unconverged] == ["ntk_32k-t"] and rs.other_seeds() == ["1"]
    (e1,) = [e for e in rs.reseeded("1").for_model("tiny_llama") if e.method == "ntk_32k"]
    assert [r["run_id"] for r in e1.rows] == [s1["run_id"]]
    (e0,) = [e for e in RowSet(rows + [s1], load_spec(), gate=False).for_model("tiny_llama") if e.method == "ntk_32k"]
    assert e0.seed == "0" and [r["run_id"] for r in e0.rows] == ["ntk_32k-t"]


def test_a_configuration_missing_on_a_seed_borrows_no_row_there():
    """NTK-32K has rows on training seeds 0 and 1, PI on seed 0 only (its seed-1 run failed): the seed-1 view shows
    NTK-32K's seed-1 row and no PI at all (it used to stand in with its seed-0 row, counting one row as both seeds),
    while frozen configurations (nothing to seed) show their rows on every seed; so a part that needs PI is missing
    on seed 1, and inconclusive across seeds, with the reason named."""
    rows = world("paper")
    rows.append(_reseed(next(r for r in rows if r["run_id"] == "ntk_32k-t"), 1))
    rs = RowSet(rows, load_spec())
    s1 = rs.reseeded("1")
    shown = {e.method for e in rs.for_model("tiny_llama")}
    assert "pi" in shown and "pi" not in {e.method for e in s1.for_model("tiny_llama")}
    (ntk,) = [e for e in s1.for_model("tiny_llama") if e.method == "ntk_32k"]
    assert ntk.seed == "1" and [r["run_id"] for r in ntk.rows] == ["ntk_32k-t-s1"]
    frozen = {e.method for e in rs.for_model("tiny_llama") if e.frozen}
    assert frozen and frozen <= {e.method for e in s1.for_model("tiny_llama")}
    fs, _, per_seed = fd.seeded(rs, "tiny_llama")
    alone = {f.key: f for f in fd.evaluate(rs, "tiny_llama")[0]}
    pi_parts = [p for p in alone["a"].parts if p.what.startswith("PI") or " PI" in p.what]
    assert pi_parts and alone["a"].result == fd.REPRODUCED
    got = {f.key: f for f in fs}
    across = [p for p in got["a"].parts if p.ident in {q.ident for q in pi_parts}]
    assert across and all(p.by_seed["1"] == (fd.INCONCLUSIVE, fd.INCONCLUSIVE) for p in across)
    assert all(p.final() == fd.INCONCLUSIVE for p in across) and got["a"].result == fd.INCONCLUSIVE


def test_a_row_of_an_older_gate_is_superseded_by_its_re_run_under_the_current_gate():
    """PI's row gated by version 1 (passed) and its re-run of the same config under the current gate (failed): the
    old row feeds no cell (else it would stand in for the failed re-run), is named as superseded, and leaves the
    report's gate caveat; without the re-run the old row is used, and the caveat names it."""
    from harness.evals.convergence import GATE_VERSION

    rows = world("paper")
    pi = next(r for r in rows if r["run_id"] == "pi-t")
    pi["config_hash"] = "h-pi"
    old = json.loads(json.dumps(pi))
    old["run_id"], old["time_start"] = "pi-old", "2026-01-01T00:00:00"
    old["train_info"]["convergence"] = {"converged": True, "rule": "r"}  # version 1: no version key
    pi["train_info"]["convergence"] = {"converged": False, "rule": "r", "gate_version": GATE_VERSION}
    rs = RowSet(rows + [old], load_spec())
    assert [r["run_id"] for r in rs.superseded] == ["pi-old"] and [r["run_id"] for r in rs.unconverged] == ["pi-t"]
    assert not [e for e in rs.for_model("tiny_llama") if e.method == "pi"]
    assert any("superseded" in n and "pi-old" in n for n in rs.footnotes())
    rep = fd.report(rs, "tiny_llama")
    assert "Gate caveat" not in rep and "no rows: pi" in next(ln for ln in rep.splitlines() if ln.startswith("| (b)"))
    alone = RowSet([r for r in rows if r["run_id"] != "pi-t"] + [old], load_spec())
    assert not alone.superseded and [e.rows[0]["run_id"] for e in alone.for_model("tiny_llama") if e.method == "pi"]
    assert "**Gate caveat**: 1 fine-tuned rows" in fd.report(alone, "tiny_llama")


def test_a_method_left_out_by_the_gate_is_named_as_such_not_as_never_run():
    """(b) without a converged PI row says "no rows: pi", and the report adds that PI's rows exist but failed the
    convergence gate; a method with no row at all gets no such note."""
    rows = [r for r in world("paper") if r["run_id"] != "clex-t"]
    (pi,) = [r for r in rows if r["run_id"] == "pi-t"]
    pi["train_info"]["convergence"] = {"converged": False, "rule": "r"}
    rep = fd.report(RowSet(rows, load_spec()), "tiny_llama")
    line = next(ln for ln in rep.splitlines() if ln.startswith("| (b)"))
    assert "no rows: pi" in line and "rows of pi exist but failed the convergence gate" in line
    assert "rows of clex" not in line and "no rows: clex" in line
    # the sensitivity line: with the gate-failed PI row put back (and CLEX's row there), (b) is reproduced; the
    # verdict itself stays inconclusive
    rows = world("paper")
    next(r for r in rows if r["run_id"] == "pi-t")["train_info"]["convergence"] = {"converged": False, "rule": "r"}
    rep = fd.report(RowSet(rows, load_spec()), "tiny_llama")
    line = next(ln for ln in rep.splitlines() if ln.startswith("| (b)"))
    assert "**inconclusive** (no rows: pi" in line and "<br>with gate-failed rows: reproduced |" in line
    assert "(1 gate-failed rows; *with gate-failed rows*" in rep


def test_intervals_do_not_depend_on_the_order_of_the_rows():
    """The bootstrap resamples by index: the same rows finished in another order (a seed's row added later) must give
    the same intervals, finding by finding (it moved finding (d)'s interval once: entries are listed newest first)."""
    def rows(order_seed: int) -> list[dict]:
        rs = world("paper")
        by_id = {r["run_id"]: r for r in rs}   # YaRN and NTK-32K swap passkeys: ranks no longer perfectly opposed
        a, b = by_id["yarn-t"], by_id["ntk_32k-t"]
        a["metrics"]["passkey"], b["metrics"]["passkey"] = b["metrics"]["passkey"], a["metrics"]["passkey"]
        for i, j in enumerate(np.random.default_rng(order_seed).permutation(len(rs))):
            rs[j]["time_start"] = rs[j]["time_end"] = f"2026-01-01T00:00:{i:02d}"
        return rs

    texts = [{k: sorted(p.text() for p in f.parts) for k, f in verdicts(rows(s)).items()} for s in range(4)]
    assert all(t == texts[0] for t in texts[1:])


def test_readme_and_findings_md_state_the_counts_the_committed_rows_give():
    """The README's verdict counts are the committed report's, and the report's are what the committed rows give now
    (recomputed, never copied): after adding rows, `make findings` and the README sentence follow."""
    from harness.results import read_rows

    md = (ROOT / "results" / "tiny_study" / "findings.md").read_text()
    raw, holm = re.search(r"Verdicts: ([^.]+)\. After Holm's correction over all \d+ tested parts: ([^.]+)\.",
                          md).groups()
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"(on the committed rows: {raw}; after Holm's correction over all parts: {holm})" in readme
    rs = RowSet(read_rows(ROOT / "results", "tiny_study"), load_spec())   # the study's own rows only
    fs, _, _ = fd.seeded(rs, fd.study_model(rs))
    assert (fd.count_line(fs), fd.count_line(fs, "holm")) == (raw, holm)


def _with_ruler(rows: list[dict], scores: dict) -> list[dict]:
    """Rows with a RULER-style entry (niah_single_2, 20 samples per length, 0/100 per sample): ``scores`` maps a
    row's run id to its accuracy by length factor (rows not named: 0.5 everywhere)."""
    n = 20
    for r in rows:
        acc = scores.get(r["run_id"], [0.5] * len(FACTORS))
        per = {}
        for f, a in zip(FACTORS, acc):
            k = int(round(a * n))
            per[str(int(f * C))] = [100.0] * k + [0.0] * (n - k)
        avg = {L: sum(v) / n for L, v in per.items()}
        r["metrics"]["ruler"] = {"average": avg, "tasks": {"niah_single_2": dict(avg)},
                                 "per_sample": {"niah_single_2": per},
                                 "average_over": {L: ["niah_single_2"] for L in per},
                                 "samples_per_task": n, "skipped": {}}
        r["config"]["eval"]["suite"]["ruler"] = {"name": "ruler"}
    return rows


def test_ntk_frozen_is_read_on_ruler_with_passkey_beside():
    """(g)'s claim comes from the paper's RULER table: with RULER rows the verdict is RULER's, passkey beside it. Here
    passkey says NTK-F generalises to 2C (the paper world) but RULER says it does not: (g) follows RULER (on the old
    code, which read passkey, it was reproduced) and names its evidence."""
    rows = _with_ruler(world("paper"), {"base-f": [1, 0, 0, 0, 0], "ntk_frozen-f": [1, 0, 0, 0, 0]})
    got = verdicts(rows)["g"]
    assert [p.what for p in got.parts] == ["NTK-F - tiny_llama at 2C, RULER-style", "NTK-F at 2C - at 4C, RULER-style"]
    assert got.result == fd.INCONCLUSIVE and got.parts[0].limit.startswith("floor")
    assert [p.what for p in got.controls] == ["NTK-F - tiny_llama at 2C, passkey", "NTK-F at 2C - at 4C, passkey"]
    assert all(p.verdict() == fd.REPRODUCED for p in got.controls)
    assert fd.RULER_STYLE in got.evidence and "Table 3 RULER" in got.evidence
    rows = _with_ruler(world("paper"), {"base-f": [1, 0, 0, 0, 0], "ntk_frozen-f": [1, 1, 0, 0, 0]})
    assert verdicts(rows)["g"].result == fd.REPRODUCED
    # without RULER rows the finding says it falls back to passkey
    assert "RULER not run for this model: read on passkey" in verdicts(world("paper"))["g"].evidence


def test_every_finding_names_its_evidence_and_the_report_labels_ruler():
    rows = _with_ruler(world("paper"), {"base-f": [1, 0, 0, 0, 0], "ntk_frozen-f": [1, 1, 0, 0, 0]})
    got = verdicts(rows)
    assert all(f.evidence.startswith("paper: ") and "\u2192 ours: " in f.evidence for f in got.values())
    assert any("RULER-style" in p.what for p in got["e"].parts) and any("RULER" in p.what for p in got["d"].parts)
    rep = fd.report(RowSet(rows, load_spec()), "tiny_llama")
    assert fd.RULER_STYLE in rep and "docs/ruler_check.md" in rep


def _p(what: str, v: str, holm: str | None = None) -> fd.Part:
    ci = {fd.REPRODUCED: (1.0, 0.5, 1.5), fd.CONTRADICTED: (-1.0, -1.5, -0.5), fd.INCONCLUSIVE: (0.0, -1.0, 1.0)}[v]
    return fd.Part(what, ci, holm=holm or v)


def test_seeds_are_compared_part_by_part_and_raw_and_holm_never_invert():
    """(l) on the committed rows, before: seed 0 mixed, seed 1 contradicted -> "inconclusive" raw, while each seed's
    Holm verdict was contradicted -> "contradicted" after Holm: the two inverted. Part by part, the two parts that
    are contradicted on both seeds make the finding contradicted, raw and after Holm alike."""
    s0 = [_p("a", fd.INCONCLUSIVE), _p("b", fd.CONTRADICTED), _p("c", fd.REPRODUCED, fd.INCONCLUSIVE),
          _p("d", fd.CONTRADICTED)]
    s1 = [_p("a", fd.INCONCLUSIVE), _p("b", fd.CONTRADICTED), _p("c", fd.INCONCLUSIVE), _p("d", fd.CONTRADICTED)]
    old_raw = {fd.verdict(s0)[0], fd.verdict(s1)[0]}
    old_holm = {fd.verdict(s0, lambda p: p.holm)[0], fd.verdict(s1, lambda p: p.holm)[0]}
    assert old_raw == {fd.MIXED, fd.CONTRADICTED} and old_holm == {fd.CONTRADICTED}   # the old rule inverted here
    parts = fd.combine_seeds({"0": s0, "1": s1})
    assert [p.final() for p in parts] == [fd.INCONCLUSIVE, fd.CONTRADICTED, fd.INCONCLUSIVE, fd.CONTRADICTED]
    assert fd.verdict(parts, fd.Part.final)[0] == fd.verdict(parts, fd.Part.final_holm)[0] == fd.CONTRADICTED
    # a part another seed lacks (its entry failed the gate there) is inconclusive across seeds, and named
    parts = fd.combine_seeds({"0": [_p("a", fd.REPRODUCED)], "1": [_p("b", fd.REPRODUCED)]})
    assert [(p.what, p.final(), p.seed_only) for p in parts] == [("a", fd.INCONCLUSIVE, ""),
                                                                ("b", fd.INCONCLUSIVE, "1")]
    assert "[seed 1 only]" in parts[1].text()
    # property: whatever the parts' verdicts on each seed (Holm keeps a part's side or drops it), the finding's Holm
    # verdict is its raw one or inconclusive, or contradicted from mixed: never the reverse of the raw verdict
    rng = np.random.default_rng(0)
    sides = [fd.REPRODUCED, fd.CONTRADICTED, fd.INCONCLUSIVE]
    for _ in range(3000):
        k, seeds = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        by = {}
        for s in range(seeds):
            ps = []
            for j in range(k):
                v = sides[rng.integers(3)]
                ps.append(_p(str(j), v, v if rng.random() < 0.6 else fd.INCONCLUSIVE))
            by[str(s)] = ps
        parts = fd.combine_seeds(by)
        raw, holm = fd.verdict(parts, fd.Part.final)[0], fd.verdict(parts, fd.Part.final_holm)[0]
        allowed = {raw, fd.INCONCLUSIVE} | ({fd.CONTRADICTED} if raw == fd.MIXED else set())
        assert holm in allowed, (raw, holm, [(p.by_seed) for p in parts])


def test_the_report_states_the_seed_rule_and_no_verdict_inverts_on_the_committed_rows():
    from harness.results import read_rows

    rs = RowSet(read_rows(ROOT / "results", "tiny_study"), load_spec())
    model = fd.study_model(rs)
    fs, _, _ = fd.seeded(rs, model)
    for f in fs:
        assert f.holm in {f.result, fd.INCONCLUSIVE} | ({fd.CONTRADICTED} if f.result == fd.MIXED else set()), f.key
    md = (ROOT / "results" / "tiny_study" / "findings.md").read_text()
    head = md.split("| finding |")[0]
    assert "**Seed rule**" in head and fd.SEED_RULE in head


def test_findings_testing_the_gates_quantity_are_read_on_all_rows():
    """The gate admits a fine-tuned row only with PPL(C) within 10% of the base's and passkey(C) >= 0.9; (i), (k), (l)
    test those quantities, so a gate-failed row enters them: here PI failed the gate and still has its (k) part (on
    the old code: "no rows: pi"), while (c), read on gated rows, has no PI; the report says which is which and how
    the gate could bias each finding."""
    rows = world("paper")
    next(r for r in rows if r["run_id"] == "pi-t")["train_info"]["convergence"] = {"converged": False, "rule": "r"}
    got = verdicts(rows)
    pi_k = next(p for p in got["k"].parts if p.what.startswith("PI /"))
    assert pi_k.ci is not None and got["k"].all_rows and got["k"].result == fd.REPRODUCED
    assert got["c"].parts[0].why.startswith("no rows: pi") and not got["c"].all_rows
    assert set(fd.GATE_QUANTITY) == {"i", "k", "l"} and set(fd.GATE_BIAS) == set(KEYS)
    rep = fd.report(RowSet(rows, load_spec()), "tiny_llama")
    line = next(ln for ln in rep.splitlines() if ln.startswith("| (k) Exact"))
    assert "read on all rows, gate-failed included" in line
    assert "## Convergence gate" in rep and "| (k) | all rows (the gate measures what it tests) |" in rep
    gate_k = next(ln for ln in rep.splitlines() if ln.startswith("| (k) | all rows"))
    assert gate_k.endswith("| inconclusive | reproduced |")   # on gated rows PI is missing; on all rows it is read


def test_a_part_held_by_a_ceiling_says_so():
    """(j)'s NTK-32K - NTK-64K on the committed rows: both at 1.00 at 3 of 5 lengths. A difference whose two sides
    are at the top at half its lengths or more is "limited by a ceiling", not merely inconclusive; at 0: a floor."""
    from controlled_study.estimates import Est

    def est(blocks):
        flat = [v for b in blocks for v in b]
        return Est(float(np.mean(flat)), n=len(flat), kind="proportion", samples=flat, paired=True,
                   keys=tuple(range(len(blocks))), lo=0.0, hi=1.0)

    one, half, miss = [1] * 10, [1] * 5 + [0] * 5, [1] * 9 + [0]
    p = fd.part_prop("x - y", est([one, one, miss, half, half]), est([miss, one, one, half, half]), "x", "y")
    assert p.verdict() == fd.INCONCLUSIVE and p.limit == "ceiling: both within one prompt of 1.00 at 3 of 5 lengths"
    assert "(limited by a ceiling: both within one prompt of 1.00 at 3 of 5 lengths)" in p.text()
    assert fd.verdict([p])[1].startswith("limited by a ceiling or floor, not by noise")
    q = fd.part_prop("x - y", est([one, half, half]), est([one, half, [0] * 10]), "x", "y")
    assert q.limit == ""
    z = [0] * 10
    assert fd.part_prop("x - y", est([z]), est([z]), "x", "y").limit == "floor: both within one prompt of 0.00"
    two = [1] * 8 + [0] * 2        # two prompts short: no longer "at the ceiling"
    assert fd.part_prop("x - y", est([two, two, two]), est([one, one, one]), "x", "y").limit == ""


def test_lm_infinite_flatness_is_read_over_every_window_clustered_by_book():
    """(f) with a row that scored every window of the books (``ppl`` all_windows): the part is the ratio over all
    windows with the interval clustered by book (here decisive, while the first window of each book alone would not
    be), the first-window part beside it; the row is listed as used."""
    rows = world("paper")
    rng = np.random.default_rng(3)
    g8 = np.repeat(np.arange(8), 5)
    g1 = np.repeat(np.arange(8), 40)
    book = rng.normal(0, 0.2, 8)
    nll8 = 4.0 + book[g8] + rng.normal(0, 0.02, len(g8))
    nll1 = 4.0 + book[g1] + rng.normal(0, 0.02, len(g1))
    win = {"ppl": {str(C): math.exp(nll1.mean()), str(8 * C): math.exp(nll8.mean())}, "protocol": "yarn",
           "all_windows": True, "per_sample": {str(C): list(nll1), str(8 * C): list(nll8)},
           "window_doc": {str(C): [int(x) for x in g1], str(8 * C): [int(x) for x in g8]}, "documents": 8}
    lmi = next(r for r in rows if r["run_id"] == "lm_infinite-f")
    extra = json.loads(json.dumps({k: v for k, v in lmi.items() if k != "metrics"}))
    extra.update(run_id="lm_infinite-windows", metrics={"ppl_windows": win}, time_end="2026-01-02T00:00:00")
    extra["config"]["eval"] = {"name": "windows", "suite": {"ppl_windows": {"name": "ppl"}}}
    got = verdicts(rows + [extra])["f"]
    p = got.parts[0]
    assert p.what.startswith("LM-Infinite: PPL 8C / PPL C, every window (40 of 8C, 320 of C, 8 books; clustered")
    assert p.ident == "LM-Infinite: PPL 8C / PPL C" and p.verdict() == fd.REPRODUCED
    assert p.alt_name == "cluster bootstrap"
    assert got.controls and got.controls[0].what.endswith("first window of each book")
    rs = RowSet(rows + [extra], load_spec())
    assert "`lm_infinite-windows`" in fd.report(rs, "tiny_llama")


def _real(method: str, acc: list, nll: list, key: str | None = None) -> dict:
    """A frozen row of a real model (C = 8192) at C and 2C: passkey over 20 prompts, PPL on 4 books."""
    c, n = 8192, 20
    lengths = [c, 2 * c]
    correct = {str(L): [int(v) for v in np.random.default_rng(sum(map(ord, key or method)) + L).permutation(
        [1] * int(round(a * n)) + [0] * (n - int(round(a * n))))] for L, a in zip(lengths, acc)}
    per = {str(L): list(m + np.array([0.1, -0.1, 0.05, -0.05]) + noise(f"{key or method}{L}")[:4] -
                        noise(f"{key or method}{L}")[:4].mean()) for L, m in zip(lengths, nll)}
    metrics = {"passkey": {"accuracy": {L: sum(v) / n for L, v in correct.items()}, "correct": correct,
                           "samples_per_length": n},
               "ppl_books": {"ppl": {L: math.exp(float(np.mean(v))) for L, v in per.items()}, "per_sample": per,
                             "protocol": "yarn", "documents": 4}}
    return {"schema": 1, "run_id": f"real-{key or method}", "status": "ok", "model": "smollm2_135m", "method": method,
            "data": "local_mix", "train": "none", "eval": "real_frozen", "method_params": {"name": method},
            "train_info": None, "metrics": metrics, "time_start": "2026-01-01T00:00:00",
            "time_end": "2026-01-01T01:00:00", "timings": {"eval.passkey": 1800.0},
            "config": {"model": {"name": "smollm2_135m", "native_ctx": c}, "train": {"enabled": False},
                       "eval": {"name": "real_frozen", "suite": {"passkey": {"name": "passkey"},
                                                                 "ppl_books": {"name": "ppl"}}},
                       "study": {"experiment": "smollm2_frozen", "row": method}},
            "config_hash": f"h-{method}", "run_dir": None}


def test_the_real_model_frozen_track_has_its_own_section():
    """Frozen rows of a second model (SmolLM2, C = 8192, at C and 2C) get a section of their own with (e), (f), (g)
    (the findings that need no fine-tuning), their own Holm family, the miniature's verdict beside, and each row's
    timings; (f) shows PPL 2C / PPL C (the track's longest length) beside its 8C part, which is not measured, and
    (g)'s 2C - 4C part has no rows at 4C."""
    real = [_real("base", [1.0, 0.0], [3.0, 4.5]), _real("ntk_frozen", [1.0, 0.9], [3.0, 3.1]),
            _real("self_extend", [1.0, 0.95], [3.0, 3.05]), _real("lm_infinite", [1.0, 0.1], [3.0, 3.02])]
    rs = RowSet(world("paper") + real, load_spec())
    rep = fd.report(rs, "tiny_llama")
    sec = rep.split("## Real model, frozen: smollm2_135m", 1)[1].split("\n## ", 1)[0]
    assert "Verdicts on smollm2_135m: " in sec and "a family of its own" in sec and "study smollm2_frozen" in sec
    lines = {ln[:4]: ln for ln in sec.splitlines() if ln.startswith("| (")}
    assert set(lines) == {"| (e", "| (f", "| (g"}
    # the header states each study's own sample size (4 books here, 8 documents in the miniature)
    assert "and NLL over 8 documents, the Student t" in rep
    assert "and NLL over 4 documents, the Student t" in fd.report(RowSet(real, load_spec()), "smollm2_135m")
    # (f)'s claim is at 8C: the 2C ratio is shown beside, not in the verdict (no margin is argued for 2C)
    assert "LM-Infinite: PPL 2C / PPL C (tested at 2C, the claim's 8C not measured" in lines["| (f"]
    assert "LM-Infinite: PPL 8C / PPL C: \u2014 (not measured: the rows stop at 2C" in lines["| (f"]
    assert "| **inconclusive** (not measured: the rows stop at 2C" in lines["| (f"]
    assert "NTK-F at 2C - at 4C, passkey: \u2014 (no rows" in lines["| (g"]
    assert "`real-lm_infinite` (LM-Infinite, lengths 8192, 16384): passkey 1800 s; wall 1.00 h" in sec
    # the main verdicts are the miniature's alone
    assert fd.count_line(fd.seeded(rs, "tiny_llama")[0]) == fd.count_line(fd.seeded(RowSet(world("paper"),
                                                                                              load_spec()),
                                                                                       "tiny_llama")[0])


def test_every_pooled_part_names_the_lengths_it_pooled():
    """A Needle difference pooled over lengths names them in the report (``pooled over C, 2C, ...``): over every
    length where both sides have rows, and only those (a side missing 16C pools C..8C)."""
    rows = world("paper")
    got = {f.key: f for f in fd.evaluate(RowSet(rows, load_spec()), "tiny_llama")[0]}
    texts = [p.text() for p in got["b"].parts if "Needle" in p.what]
    assert texts and all("(pooled over C, 2C, 4C, 8C, 16C)" in t for t in texts), texts
    pi = next(r for r in rows if r["run_id"] == "pi-t")
    for k in ("accuracy", "correct"):
        pi["metrics"]["passkey"][k].pop(str(16 * C))
    got = {f.key: f for f in fd.evaluate(RowSet(rows, load_spec()), "tiny_llama")[0]}
    (pi_part,) = [p for p in got["b"].parts if "Needle" in p.what and "PI" in p.what]
    assert "(pooled over C, 2C, 4C, 8C)" in pi_part.text(), pi_part.text()


def test_a_row_whose_numbers_are_all_nan_leaves_the_findings_to_the_rows_that_have_numbers():
    """A newer YaRN row whose every number is NaN (read as missing, None, by ``read_row_file``) stopped the whole
    study's findings with a ``TypeError`` in (l); it now feeds no part, and every verdict is the one without it."""
    import copy

    rows = world("paper")
    nan = copy.deepcopy(next(r for r in rows if r["run_id"] == "yarn-t"))

    def missing(o):
        if isinstance(o, dict):
            return {k: missing(v) for k, v in o.items()}
        if isinstance(o, list):
            return [missing(v) for v in o]
        return None if isinstance(o, (int, float)) and not isinstance(o, bool) else o

    nan.update(run_id="yarn-nan", metrics=missing(nan["metrics"]), time_start="2026-02-01T00:00:00",
               time_end="2026-02-01T00:00:00")
    want = [f.result for f in fd.evaluate(RowSet(rows, load_spec()), "tiny_llama")[0]]
    got = [f.result for f in fd.evaluate(RowSet(rows + [nan], load_spec()), "tiny_llama")[0]]
    assert got == want
