"""LongRoPE / LongRoPE2 factor search: critical dimension, operators, batched fitness, needle-driven PPL, resume."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import random_llama

from harness.methods.longrope import apply_factors
from harness.methods.rope import set_rope_parameters
from harness.search import SearchArgs, build_space, rescale_factors, run_search
from harness.search import critical_dim as cd
from harness.search.evolution import Candidate, Evolution, Space, crossover, is_valid, mutate, project
from harness.search.fitness import ANSWER, Fitness, masked_ppl, needle_document, ppl_with_current_rope


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from harness.models.tiny_llama import ASSET_DIR

    return AutoTokenizer.from_pretrained(str(ASSET_DIR))


# -- critical dimension ----------------------------------------------------------------------------------------
def test_critical_dim_worked_values():
    # LongRoPE2 / methods.md Sec. 9: LLaMA3-8B b=5e5, L=8192, d=128 -> d_tcd = 70 (pair 35)
    assert cd.theoretical_critical_dim(128, 5e5, 8192) == 70
    assert cd.critical_pair(128, 5e5, 8192) == 35
    # LLaMA2-7B (b=1e4, L=4096): (d/2) log_b(L/2pi) = 45.03 -> 92
    assert cd.theoretical_critical_dim(128, 1e4, 4096) == 92
    # tiny_llama (b=1e3, C=256, d=64): its model card says 14 of 32 pairs have period > C -> first is pair 18
    assert cd.theoretical_critical_dim(64, 1e3, 256) == 36
    # Phi3-mini (b=1e4, L=2048, d=96): 48 * log_1e4(2048/2pi) = 30.16 -> 62
    assert cd.theoretical_critical_dim(96, 1e4, 2048) == 62


@pytest.mark.parametrize("d,b,L", [(128, 5e5, 8192), (128, 1e4, 4096), (64, 1e3, 256), (96, 1e4, 2048),
                                   (64, 1e4, 512), (128, 1e6, 32768)])
def test_critical_pair_is_first_pair_with_period_beyond_window(d, b, L):
    k = cd.critical_pair(d, b, L)
    T = cd.periods(d, b)
    assert np.all(T[:k] <= L) and np.all(T[k:] > L)


def test_seed_factors():
    d, s = 64, 8.0
    ntk = cd.ntk_factors(d, s)
    assert ntk[0] == 1.0 and ntk[-1] == pytest.approx(s)
    # NTK factors == the ratio of frequencies under base b' = b s^(d/(d-2))
    b = 1e4
    theta = b ** (-np.arange(0, d, 2) / d)
    theta_ntk = (b * s ** (d / (d - 2))) ** (-np.arange(0, d, 2) / d)
    np.testing.assert_allclose(theta / theta_ntk, ntk, rtol=1e-10)
    y = cd.yarn_factors(d, s, 1e3, 256)
    assert np.all(np.diff(y) >= 0) and y.min() >= 1 and y.max() <= s and y[0] == 1 and y[-1] == s
    assert cd.su_mscale(16, 8192) == pytest.approx(1.143544, abs=1e-6)  # methods.md 8.3 test vector
    assert cd.su_mscale(32, 4096) == pytest.approx(1.190238, abs=1e-6)
    assert cd.mscale_of("yarn", 16, 4096) == pytest.approx(1.277259, abs=1e-6)
    np.testing.assert_allclose(rescale_factors([1.0, 4.0, 8.0], 8, 16), [1.0, 1 + 3 * 15 / 7, 16.0])


# -- operators -------------------------------------------------------------------------------------------------
def _check(c: Candidate, sp: Space):
    lam = c.lam[c.k:]
    assert is_valid(c, sp)
    assert np.all(np.diff(c.lam) >= -1e-12), "factors must be monotone non-decreasing"
    assert lam.min() >= sp.lo - 1e-9 and lam.max() <= sp.hi + 1e-9
    if c.k:
        np.testing.assert_allclose(c.lam[: c.k], c.lam[c.k] ** (np.arange(c.k) / c.k))


@pytest.mark.parametrize("algo", ["longrope", "longrope2"])
def test_mutation_and_crossover_keep_factors_monotone_and_in_range(algo):
    d, b, C, s = 64, 1e3, 256, 8.0
    a = SearchArgs(algorithm=algo, critical_dim="search" if algo == "longrope2" else "none",
                   n_hat_grid=[0, 1, 2, 4, 8])
    sp = build_space(a, d, b, C, s)
    if algo == "longrope":
        assert (sp.lo, sp.hi, sp.k) == (1.0, 8.0, 0)
    else:
        assert (sp.lo, sp.hi, sp.k, sp.k_range) == (8.0, 16.0, 18, (14, 22))
    rng = np.random.default_rng(0)
    pop = [project(v, sp, sp.k) for v in (cd.pi_factors(d, s), cd.ntk_factors(d, s), cd.yarn_factors(d, s, b, C))]
    for c in pop:
        _check(c, sp)
    changed = 0
    for _ in range(400):
        p = pop[int(rng.integers(len(pop)))]
        m = mutate(p, sp, rng, 0.3)
        _check(m, sp)
        changed += m.key() != p.key()
        i, j = rng.choice(len(pop), 2, replace=False)
        x = crossover(pop[i], pop[j], sp, rng, 0.15, 20)
        if x is not None:
            _check(x, sp)
        pop.append(m)
    assert changed > 100
    assert len({c.k for c in pop}) > 1 if algo == "longrope2" else True
    # a non-monotone vector is rejected
    bad = Candidate(np.linspace(s, 1, d // 2), 0, sp.k)
    assert not is_valid(bad, sp)


def test_evolution_converges_and_resumes_identically():
    d_half, s = 8, 4.0
    sp = Space(d_half=d_half, lo=1.0, hi=s, step=0.01)
    target = np.linspace(1.0, s, d_half) ** 1.3 / s ** 0.3

    def fit(cands):
        return [float(np.abs(c.lam - target).sum()) for c in cands]

    def make():
        return Evolution(sp, population=12, mutations=6, crossovers=6, parents=6, seed=3)

    seeds = [project(np.full(d_half, s), sp, 0), project(np.ones(d_half), sp, 0)]
    e1 = make()
    e1.initialize(seeds, fit)
    for _ in range(30):
        e1.step(fit)
    assert all(b <= a + 1e-12 for a, b in zip(e1.curve, e1.curve[1:]))
    assert e1.curve[-1] < 0.5 * e1.curve[0]
    # interrupted after 10 iterations, state round-tripped through JSON, resumed: identical trajectory
    e2 = make()
    e2.initialize(seeds, fit)
    for _ in range(10):
        e2.step(fit)
    st = json.loads(json.dumps(e2.state()))
    e3 = make()
    e3.load_state(st)
    for _ in range(20):
        e3.step(fit)
    assert e3.curve == e1.curve
    assert e3.best()[1].key() == e1.best()[1].key()


# -- fitness: candidates scored through the longrope method == transformers' longrope set by hand ---------------
def test_fitness_matches_transformers_longrope():
    C, L, d = 32, 96, 16
    model = random_llama(vocab=128, hidden=64, heads=4, ctx=C, seed=1)
    ids = torch.randint(3, 128, (2, L), generator=torch.Generator().manual_seed(0))
    lam1 = np.linspace(1.0, 3.0, d // 2)
    lam2 = cd.ntk_factors(d, 3.0)
    ref = []
    for lam, sc in ((lam1, 1.1), (lam2, 1.0)):
        set_rope_parameters(model, rope_type="longrope", short_factor=[1.0] * (d // 2), long_factor=list(lam),
                            original_max_position_embeddings=C, factor=L / C, attention_factor=sc)
        ref.append([ppl_with_current_rope(model, ids[j : j + 1], dtype="float32") for j in range(2)])
    set_rope_parameters(model, rope_type="default")
    cands = [Candidate(lam1), Candidate(lam2)]
    scales = {id(cands[0]): 1.1, id(cands[1]): 1.0}
    for batch in (1, 3):
        f = Fitness(model, ids, None, lambda c: scales[id(c)], batch=batch, dtype="float32")
        got = f(cands)
        for g, r in zip(got, ref):
            assert g == pytest.approx(math.exp(np.mean(np.log(r))), rel=1e-4)
    # the model's own rotary is restored afterwards
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"


def test_start_tokens_use_original_rope_and_fitness_is_the_method_path():
    C, L, d = 32, 80, 16
    model = random_llama(vocab=128, hidden=64, heads=4, ctx=C, seed=2)
    theta = 1.0 / (1e4 ** (torch.arange(0, d, 2).float() / d))
    lam = cd.yarn_factors(d, 2.5, 1e4, C)
    pos = torch.arange(L)[None]
    x = torch.zeros(1, L, 64)
    fac = {"short_factor": [1.0] * (d // 2), "long_factor": list(lam), "original_max_position_embeddings": C,
           "max_position_embeddings": L, "attention_factor": 1.2, "n_hat": 4}
    apply_factors(model, fac, kv_cache="stale")
    cos, sin = model.model.rotary_emb(x, pos)
    f0 = pos[0, :, None].float() * theta[None]
    np.testing.assert_allclose(cos[0, :4].numpy(), torch.cat((f0, f0), -1)[:4].cos().numpy(), atol=1e-6)
    f1 = pos[0, :, None].float() * (theta / torch.tensor(lam, dtype=torch.float32))[None]
    np.testing.assert_allclose(cos[0, 4:].numpy(), 1.2 * torch.cat((f1, f1), -1)[4:].cos().numpy(), atol=1e-5)
    # the factors-file path (the method's apply_factors) gives the search's fitness, start tokens included
    ids = torch.randint(3, 128, (1, L), generator=torch.Generator().manual_seed(1))
    hf = ppl_with_current_rope(model, ids, dtype="float32")
    set_rope_parameters(model, rope_type="default")
    got = Fitness(model, ids, None, lambda c: 1.2, dtype="float32")([Candidate(np.asarray(lam), n_hat=4)])[0]
    assert got == pytest.approx(hf, rel=1e-6)
    no_start = Fitness(model, ids, None, lambda c: 1.2, dtype="float32")([Candidate(np.asarray(lam), n_hat=0)])[0]
    assert no_start != pytest.approx(hf, rel=1e-6)
    with pytest.raises(ValueError, match="native window"):  # documents within C would never use the long factors
        Fitness(model, ids[:, :C], None, lambda c: 1.2)


# -- needle-driven PPL -----------------------------------------------------------------------------------------
def test_needle_ppl_scores_exactly_the_answer_tokens(tok):
    import random

    from harness.data.sources import shakespeare

    hay = tok(shakespeare("test")[0].text, add_special_tokens=False).input_ids
    L = 300
    ids, mask, key = needle_document(tok, hay, L, random.Random(0), needles=2)
    assert len(ids) == len(mask) == L
    n_ans = len(tok(ANSWER.format(key=key), add_special_tokens=False).input_ids)
    assert sum(mask) == n_ans and all(mask[-n_ans:]) and not any(mask[:-n_ans])
    assert tok.decode([i for i, m in zip(ids, mask) if m]).strip() == ANSWER.format(key=key).strip()
    assert tok.decode(ids).count(str(key)) == 3  # two needles + the answer
    # the statistic equals a direct log-softmax over full logits at exactly the answer positions
    model = random_llama(vocab=len(tok), hidden=64, heads=4, ctx=64, seed=3)
    t_ids, t_mask = torch.tensor([ids]), torch.tensor([mask])
    f = Fitness(model, t_ids, t_mask, lambda c: 1.0, dtype="float32", chunk=64)
    got = f([Candidate(np.full(8, 2.0))])[0]
    apply_factors(model, f.factors(Candidate(np.full(8, 2.0))), kv_cache="stale")
    with torch.no_grad():
        logits = model(t_ids).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1)
    pos = [i for i in range(1, L) if mask[i]]
    manual = math.exp(-float(torch.stack([lp[i - 1, ids[i]] for i in pos]).mean()))
    assert got == pytest.approx(manual, rel=1e-4)
    # tokens outside the mask do not count
    nll = torch.rand(1, L - 1)
    nll2 = nll.clone()
    nll2[0, : L - 1 - n_ans] += 5.0
    assert torch.allclose(masked_ppl(nll, t_mask), masked_ppl(nll2, t_mask))


# -- end to end: a tiny search, interrupted and resumed ----------------------------------------------------------
@pytest.mark.parametrize("algo,fitness", [("longrope", "ppl"), ("longrope2", "needle")])
def test_run_search_writes_factors_and_resumes(tmp_path, tok, algo, fitness):
    C, target = 64, 160
    model = random_llama(vocab=len(tok), hidden=64, heads=4, ctx=C, seed=4, theta=1000.0)
    a = SearchArgs(name="t", algorithm=algo, population=4, mutations=2, crossovers=2, parents=3, iterations=1,
                   samples=1, batch=2, fitness=fitness, critical_dim="search" if algo == "longrope2" else "none",
                   n_hat_grid=[0, 2] if algo == "longrope" else [0])
    state = tmp_path / "state.json"
    logs = []
    fac, info = run_search(model, tok, a, C, target, state, seed=0, model_name="random", log=logs.append,
                           dtype="float32")
    assert len(fac["long_factor"]) == len(fac["short_factor"]) == 8
    assert fac["original_max_position_embeddings"] == C and fac["max_position_embeddings"] == target
    assert np.all(np.diff(fac["long_factor"]) >= -1e-9)
    assert len(info["fitness_curve"]) == 2 and info["evaluations"] >= 4
    assert fac["provenance"]["fitness_history"] == info["fitness_curve"]
    assert fac["attention_factor"] == pytest.approx(cd.su_mscale(target / C, C))
    if algo == "longrope2":
        assert info["critical_dim"]["theoretical"] == 2 * cd.critical_pair(16, 1000.0, C)
        assert min(fac["long_factor"][fac["provenance"]["critical_pair"]:]) >= target / C - 1e-9
    a.iterations = 2  # extend: resumes from the state file instead of starting over
    fac2, info2 = run_search(model, tok, a, C, target, state, seed=0, model_name="random", log=logs.append,
                             dtype="float32")
    assert any("resumed" in m for m in logs)
    assert info2["fitness_curve"][:2] == info["fitness_curve"] and len(info2["fitness_curve"]) == 3


def test_longrope2_seeds_are_distinct_valid_and_above_s():
    from harness.search import seed_candidates

    d, b, C, s = 64, 1e3, 256, 8.0
    a = SearchArgs(algorithm="longrope2", critical_dim="theoretical", seeds=["pi", "ntk", "yarn", "ramp", "random"],
                   population=12)
    sp = build_space(a, d, b, C, s)
    seeds = seed_candidates(a, sp, d, b, C, s, seed=0)
    for c in seeds:
        _check(c, sp)
        assert c.k == 18 and c.lam[18:].min() >= s
    assert len({c.key() for c in seeds}) >= 6


def test_yarn_frequency_seed_equals_transformers_yarn():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, b, C, s = 64, 1e3, 256, 8.0
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=C,
                      rope_parameters={"rope_type": "yarn", "rope_theta": b, "factor": s,
                                       "original_max_position_embeddings": C})
    inv, _ = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    theta = 1.0 / (b ** (np.arange(0, d, 2) / d))
    np.testing.assert_allclose(theta / inv.double().numpy(), cd.yarn_frequency_factors(d, s, b, C), rtol=1e-5)


# -- resumability: a search killed mid-run continues where it stopped and ends where an uninterrupted one ends ----
class _Killed(KeyboardInterrupt):
    pass


def _small_search(tok, algo="longrope", **kw):
    C, target = 64, 160
    model = random_llama(vocab=len(tok), hidden=64, heads=4, ctx=C, seed=4, theta=1000.0)
    a = SearchArgs(name="t", algorithm=algo, population=4, mutations=2, crossovers=2, parents=3, iterations=3,
                   samples=1, batch=1, fitness="needle" if algo == "longrope2" else "ppl",
                   critical_dim="search" if algo == "longrope2" else "none",
                   n_hat_grid=[0, 2] if algo == "longrope" else [0], **kw)
    return model, a, C, target


def test_interrupted_search_resumes_to_the_same_result(tmp_path, tok, monkeypatch):
    from harness.search import fitness as fitness_mod

    model, a, C, target = _small_search(tok)
    ref, ref_info = run_search(model, tok, a, C, target, tmp_path / "ref.json", seed=0, model_name="random",
                               dtype="float32", log=lambda m: None)
    assert [p["iteration"] for p in ref_info["progress"]] == [0, 1, 2, 3]
    assert ref_info["resumes"] == 0 and ref_info["this_session"]["fitness_rows"] == ref_info["evaluations"]
    # second run: killed during the 3rd generation (init + 1 iteration saved)
    real_call, calls = fitness_mod.Fitness.__call__, [0]

    def dying(self, cands):
        calls[0] += 1
        if calls[0] == 3:
            raise _Killed()
        return real_call(self, cands)

    monkeypatch.setattr(fitness_mod.Fitness, "__call__", dying)
    state = tmp_path / "state.json"
    with pytest.raises(_Killed):
        run_search(model, tok, a, C, target, state, seed=0, model_name="random", dtype="float32", log=lambda m: None)
    saved = json.loads(state.read_text())
    assert saved["evolution"]["iteration"] == 1 and [p["iteration"] for p in saved["progress"]] == [0, 1]
    monkeypatch.setattr(fitness_mod.Fitness, "__call__", real_call)
    logs = []
    got, info = run_search(model, tok, a, C, target, state, seed=0, model_name="random", dtype="float32",
                           log=logs.append)
    assert any("resumed" in m and "iteration 1" in m for m in logs)
    assert info["resumes"] == 1 and info["this_session"]["fitness_rows"] == info["evaluations"] - 8
    assert info["fitness_curve"] == ref_info["fitness_curve"]
    assert got["long_factor"] == ref["long_factor"] and got["n_hat"] == ref["n_hat"]
    assert [p["iteration"] for p in info["progress"]] == [0, 1, 2, 3]
    # a state scored on other weights is not resumed
    logs.clear()
    run_search(model, tok, a, C, target, state, seed=0, model_name="random", dtype="float32", log=logs.append,
               weights="other")
    assert any("starting over" in m for m in logs)


def test_time_budget_stops_cleanly_after_the_initial_population(tmp_path, tok):
    model, a, C, target = _small_search(tok, time_budget_s=1e-3)
    fac, info = run_search(model, tok, a, C, target, tmp_path / "s.json", seed=0, model_name="random",
                           dtype="float32", log=lambda m: None)
    assert info["iterations"] == 0 and info["stopped"].startswith("time budget")
    assert len(info["fitness_curve"]) == 1 and len(fac["long_factor"]) == 8


def test_fitness_windows_are_held_out_from_the_ppl_evaluator(tok):
    from harness.evals.ppl import load_documents
    from harness.search.fitness import long_documents, needle_documents

    L = 300
    doc = tok(load_documents("shakespeare", "test")[0].text, add_special_tokens=False).input_ids
    w0 = long_documents(tok, "shakespeare", "test", 1, L)[0].tolist()
    w2 = long_documents(tok, "shakespeare", "test", 1, L, offset_windows=2)[0].tolist()
    assert w0[1:] == doc[: L - 1]  # the ppl evaluator's window [BOS] + doc[:L-1]
    assert w2[1:] == doc[2 * (L - 1) : 3 * (L - 1)]
    import random

    ids, mask = needle_documents(tok, "shakespeare", "test", 1, L, offset_windows=2)
    ref, ref_mask, _ = needle_document(tok, doc[2 * (L - 1):], L, random.Random(f"needle-0-{L}"), 1)
    assert ids[0].tolist() == ref and mask[0].tolist() == ref_mask


# -- the methods load a search's output ---------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["longrope", "longrope2"])
def test_method_loads_search_output_and_reproduces_its_fitness(tmp_path, tok, algo):
    from harness.methods import build_method
    from harness.models import ModelHandle
    from harness.search.fitness import long_documents

    model, a, C, target = _small_search(tok, algo)
    a.iterations, a.fitness = 1, "ppl"
    fac, info = run_search(model, tok, a, C, target, tmp_path / "s.json", seed=0, model_name="random",
                           dtype="float32", log=lambda m: None)
    path = tmp_path / "factors.json"
    path.write_text(json.dumps(fac))
    meth = build_method({"name": algo, "factors": str(path)})
    meth.apply(ModelHandle(model, tok, "random", C, {}))
    ids = long_documents(tok, a.dataset, a.split, 1, target)
    got = ppl_with_current_rope(model, ids, dtype="float32")
    # the search scored its candidates through the longrope method's own code: the same number, up to the file's
    # 6-decimal rounding of the factors
    assert got == pytest.approx(info["best_fitness"], rel=1e-6)


def test_progressive_lineage_accepts_factors_searched_on_the_checkpoint(tmp_path):
    from harness.config import ConfigError
    from harness.methods import build_method, check_checkpoint_method, save_method

    d_half = 32

    def factors(name, model_path):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"short_factor": [1.0] * d_half, "long_factor": [2.0] * d_half,
                                 "original_max_position_embeddings": 256, "max_position_embeddings": 512 * len(name),
                                 "provenance": {"model_path": model_path}}))
        return str(p)

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for algo in ("longrope", "longrope2"):
        save_method(ckpt, build_method({"name": algo, "factors": factors("f1", "")}))
        check_checkpoint_method(ckpt, build_method({"name": algo, "factors": factors("f22", str(ckpt))}))
        with pytest.raises(ConfigError):  # searched on another model
            check_checkpoint_method(ckpt, build_method({"name": algo, "factors": factors("f22", str(tmp_path))}))
        with pytest.raises(ConfigError):  # another parameter differs too
            other = {"name": algo, "factors": factors("f22", str(ckpt)), "kv_cache": "stale"}
            check_checkpoint_method(ckpt, build_method(other))
    with pytest.raises(ConfigError):  # another method
        check_checkpoint_method(ckpt, build_method({"name": "pi", "scale": 8}))


def test_progressive_plan_chains_search_finetune_search():
    from conftest import ROOT, load_file_module

    mod = load_file_module(ROOT / "scripts" / "progressive_rope.py")
    opts, extra = mod.parse(["stages=1024,2048,4096", "search=longrope2_tiny", "tag=t", "train.tokens=4096",
                             "search.iterations=2", "seed=1"])
    steps = mod.plan(opts, extra)
    assert [s["name"] for s in steps] == ["search_stage1", "finetune_stage1", "search_stage2", "finetune_stage2",
                                          "search_stage3", "final_eval"]
    cmd = {s["name"]: " ".join(s["cmd"]) for s in steps}
    assert "target_length=1024" in cmd["search_stage1"] and "init_factors" not in cmd["search_stage1"]
    assert "method=longrope2" in cmd["finetune_stage1"] and "train.seq_len=1024" in cmd["finetune_stage1"]
    assert "train.tokens=4096" in cmd["finetune_stage1"] and "search.iterations=2" not in cmd["finetune_stage1"]
    assert "model.path=outputs/progressive/t/finetune_stage1/checkpoint" in cmd["search_stage2"]
    assert "search.init_factors=results/factors/progressive_t/t_stage1_1024.json" in cmd["search_stage2"]
    assert "model.path=outputs/progressive/t/finetune_stage1/checkpoint" in cmd["finetune_stage2"]
    assert "model.path=outputs/progressive/t/finetune_stage2/checkpoint" in cmd["final_eval"]
    assert "method.factors=results/factors/progressive_t/t_stage3_4096.json" in cmd["final_eval"]
    assert all("seed=1" in c for c in cmd.values())
    with pytest.raises(SystemExit):
        mod.plan(*mod.parse(["stages=2048"]))


@pytest.mark.parametrize("name", ["longrope", "longrope2"])
def test_search_yaml_lists_every_argument(name):
    """Hydra only accepts ``search.<key>=...`` on the command line for keys present in the YAML (the progressive
    driver passes ``search.init_factors``)."""
    import dataclasses
    from pathlib import Path

    from omegaconf import OmegaConf

    node = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "search" / f"{name}.yaml")
    assert {f.name for f in dataclasses.fields(SearchArgs)} == set(node.keys())


# -- LongRoPE's recovery search of the short factors (paper Sec. 3.3) --------------------------------------------
def test_short_factor_search_keeps_the_long_factors_and_is_what_the_method_uses_within_C(tmp_path, tok):
    from harness.config import ConfigError
    from harness.methods import build_method
    from harness.models import ModelHandle
    from harness.search.fitness import long_documents

    C, target, d = 64, 160, 16
    model = random_llama(vocab=len(tok), hidden=64, heads=4, ctx=C, seed=5, theta=1000.0)
    long = [round(float(v), 2) for v in cd.yarn_factors(d, target / C, 1000.0, C)]
    trained = tmp_path / "long.json"  # the factors a model was fine-tuned with (short factors 1)
    trained.write_text(json.dumps({"short_factor": [1.0] * (d // 2), "long_factor": long,
                                   "original_max_position_embeddings": C, "max_position_embeddings": target,
                                   "attention_factor": 1.15, "n_hat": 2}))
    a = SearchArgs(name="t", population=6, mutations=2, crossovers=2, parents=3, iterations=2, samples=2, batch=1,
                   factors_for="short", init_factors=str(trained), n_hat_grid=[0])
    fac, info = run_search(model, tok, a, C, C, tmp_path / "s.json", seed=0, model_name="random", dtype="float32",
                           log=lambda m: None)
    assert fac["long_factor"] == long and fac["max_position_embeddings"] == target
    assert fac["attention_factor"] == 1.15 and fac["n_hat"] == 2 and fac["provenance"]["factors_for"] == "short"
    sf = np.asarray(fac["short_factor"])
    assert np.all(np.diff(sf) >= -1e-9) and sf.min() >= 1 - 1e-9 and sf.max() <= target / C + 1e-9
    # the seeds include all ones (the method without this search): the best is never worse than it
    ids = long_documents(tok, a.dataset, a.split, 2, C)
    ones = Fitness(model, ids, None, lambda c: 1.15, dtype="float32", native_ctx=C,
                   fixed_long=json.loads(trained.read_text()))([Candidate(np.ones(d // 2))])[0]
    assert info["best_fitness"] <= ones + 1e-9
    # the longrope method, given the written file, scores exactly the search's best within C (short factors used)
    path = tmp_path / "short.json"
    path.write_text(json.dumps(fac))
    build_method({"name": "longrope", "factors": str(path)}).apply(ModelHandle(model, tok, "random", C, {}))
    got = math.exp(np.mean([math.log(ppl_with_current_rope(model, ids[j : j + 1], dtype="float32"))
                            for j in range(2)]))
    assert got == pytest.approx(info["best_fitness"], rel=1e-5)
    with pytest.raises(ConfigError, match="<= the native window"):
        run_search(model, tok, a, C, 2 * C, tmp_path / "s2.json", dtype="float32", log=lambda m: None)
    with pytest.raises(ConfigError, match="needs init_factors"):
        SearchArgs(factors_for="short").validate()
    with pytest.raises(ValueError, match="exceed the native window"):
        Fitness(model, long_documents(tok, a.dataset, a.split, 1, 2 * C), None, lambda c: 1.0, native_ctx=C,
                fixed_long=json.loads(trained.read_text()))


def test_longrope_recovery_stage_uses_the_searched_short_factors(tmp_path, tok):
    """method.recovery: after fine-tuning, the method's own stage (``after_finetune``, which the pipeline's fine-tuning
    stage calls) runs the short-factor search on the model and the method uses the result (what the gate and the
    evaluation then see)."""
    from harness.config import ConfigError
    from harness.methods import build_method
    from harness.models import ModelHandle
    from harness.search.fitness import long_documents

    C, target, d = 64, 160, 16
    model = random_llama(vocab=len(tok), hidden=64, heads=4, ctx=C, seed=6, theta=1000.0)
    trained = tmp_path / "long.json"
    trained.write_text(json.dumps({"short_factor": [1.0] * (d // 2), "long_factor": list(cd.pi_factors(d, target / C)),
                                   "original_max_position_embeddings": C, "max_position_embeddings": target}))
    meth = build_method({"name": "longrope", "factors": str(trained), "recovery": "longrope_short_tiny"})
    handle = ModelHandle(model, tok, "random", C, {})
    meth.apply(handle)
    digest = meth.params()["factors_sha256"]
    from harness import search
    from harness.methods import StageContext

    ctx = StageContext(tmp_path, 0, "float32", search)
    assert build_method({"name": "longrope", "factors": str(trained)}).after_finetune(handle, ctx) is None
    info = meth.after_finetune(handle, ctx)["recovery"]  # the row's train_info.recovery
    rec = json.loads((tmp_path / "recovered_factors.json").read_text())
    assert info["factors_file"] == str(tmp_path / "recovered_factors.json") == meth.resolved["factors_file"]
    assert meth.params()["factors_sha256"] == digest  # the configured method: rows of several seeds group together
    assert rec["long_factor"] == list(cd.pi_factors(d, target / C))
    assert model.config.rope_parameters["short_factor"] == rec["short_factor"]
    ids = long_documents(tok, "shakespeare", "test", 8, C, offset_windows=2)  # longrope_short_tiny's fitness windows
    got = math.exp(np.mean([math.log(ppl_with_current_rope(model, ids[j : j + 1], dtype="float32"))
                            for j in range(8)]))
    assert got == pytest.approx(info["best_fitness"], rel=1e-5)
    with pytest.raises(ConfigError, match="no conf/search"):
        build_method({"name": "longrope", "recovery": "nope"}).check(C)
