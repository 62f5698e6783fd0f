"""Length settings in units of the native window C (issue 16): the same method YAML means the same thing on every
model, the paper's scale factors come out of a plain composed config on LLaMA2-7B, the tiny_llama rows keep their
meaning, and impossible values are refused before anything loads with one line naming the key and the valid range.
Nothing here loads LLaMA2-7B: its configs are composed and validated, and the frequencies are checked on small random
models whose window is set to 4096."""
from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import ROOT, random_llama

from harness import conf_utils, lifecycle, pipeline, precheck
from harness.config import ConfigError
from harness.methods import build_method
from harness.methods.rope import default_inv_freq, rope_dims
from harness.models import ModelHandle

PAPER_LENGTHS = (4096, 8192, 16384, 32768, 65536)  # Table 8 columns: 4k .. 64k
TABLE8 = {"ntk_32k": [29, 29, 29, 29, 61], "ntk_64k": [57] * 5, "ntk_frozen": [1, 3, 7, 15, 31],
          "ntk_dynamic": [29, 29, 29, 29, 61]}  # ntk_dynamic: its YAML is the NTK-32K setting


def composed(*overrides):
    cfg = conf_utils.compose(list(overrides))
    method, train = pipeline.validate(cfg, data=False)
    return cfg, method, train


def ntk_t(method, length: int, c: int) -> float:
    """The multiplier t the built method uses at ``length``, read from its own frequencies (base ratio)."""
    from harness.methods.rope import ntk_by_length_parameters

    model = random_llama(hidden=256, heads=2, layers=1, ctx=c, head_dim=128)
    method.apply(ModelHandle(model, None, "random", c, {}))
    base, d = rope_dims(model.config)
    inv, _ = model.get_decoder().rotary_emb.rope_state(length)
    ratio = float(default_inv_freq(base, d)[-1] / inv[-1])  # the lowest frequency is divided by exactly t
    assert ntk_by_length_parameters  # the rope type the methods use (harness.methods.rope)
    return ratio


@pytest.mark.parametrize("name", sorted(TABLE8))
def test_compose_llama2_gives_table8_scale_factors(name):
    """``python run.py method=<ntk> model=llama2_7b`` (no other override) -> Table 8's t at 4k..64k, both from the
    method's own arithmetic and from the rotary frequencies it installs on a model with C = 4096."""
    cfg, method, _ = composed(f"method={name}", "model=llama2_7b", "train=none")
    assert cfg.model.native_ctx == 4096
    want = TABLE8[name]
    if hasattr(method, "scale_factor"):
        assert [method.scale_factor(L, 4096) for L in PAPER_LENGTHS] == want
    for L, t in zip(PAPER_LENGTHS, want):
        assert ntk_t(build_method(cfg.method), L, 4096) == pytest.approx(t, rel=1e-5)


@pytest.mark.parametrize("name", ["ntk_32k", "ntk_64k"])
def test_method_level_call_gives_paper_scale_factors(name):
    """A call from code (no Hydra): the method's YAML is layered under the node, so ntk_64k is not ntk_dynamic."""
    m = build_method({"name": name})
    assert [m.scale_factor(L, 4096) for L in PAPER_LENGTHS] == TABLE8[name]
    # the same YAML on Phi-2 (C = 2k) and tiny_llama (C = 256): the same t at C..16C
    for c in (2048, 256):
        assert [m.scale_factor(k * c, c) for k in (1, 2, 4, 8, 16)] == TABLE8[name]


def test_paper_llama2_points_need_no_method_override():
    """Every method setting of the LLaMA2 points is the method YAML itself (lengths in units of C), and the values
    are the paper's: NTK t per Table 8, Self-Extend W = 1024 / G = 64, LM-Infinite M = 4096 / G = 10."""
    from harness import sweeps

    for p in sorted(p for d in conf_utils.conf_dirs() for p in (d / "point" / "paper_llama2").glob("*.yaml")):
        from omegaconf import OmegaConf

        node = OmegaConf.load(p).get("method") or {}
        assert set(node) <= {"facts"}, f"{p.name} overrides the method"  # a variant's name (facts) is not a setting
    seen = set()
    for job in sweeps.expand(["experiment=paper_llama2"]):
        cfg = sweeps.compose(job)
        method, _ = pipeline.validate(cfg, data=False)
        name = cfg.method.name
        seen.add(name)
        settings = {k: v for k, v in dict(cfg.method).items() if k != "facts"}  # facts: the variant's label only
        assert settings == {k: v for k, v in conf_utils.group_defaults("method", name).items() if k != "facts"}
        if name in TABLE8:
            assert [method.scale_factor(L, 4096) for L in PAPER_LENGTHS] == TABLE8[name]
        if name == "self_extend":
            assert method.check(4096) == 1024 and method.args.group == 64
        if name == "lm_infinite":
            assert method.check(4096) == (4096, 4096) and method.args.n_global == 10
    assert {"ntk_32k", "ntk_64k", "self_extend", "lm_infinite", "ntk_frozen"} <= seen


def test_phi2_points_keep_their_token_values():
    """Phi-2 (C = 2048) keeps the 32k clamps and the 1024-token Self-Extend window it had in tokens."""
    _, m32, _ = composed("experiment=paper_phi2", "point=paper_phi2/ntk_32k")
    assert m32.lengths(2048) == (32768, 0)
    _, m64, _ = composed("experiment=paper_phi2", "point=paper_phi2/ntk_64k")
    assert m64.lengths(2048) == (32768, 32768)
    _, se, _ = composed("experiment=paper_phi2", "point=paper_phi2/self_extend")
    assert se.check(2048) == 1024


def tiny_rope_theta() -> float:
    cfg = json.loads((ROOT / "harness" / "assets" / "tiny_llama" / "config.json").read_text())
    rp = cfg.get("rope_parameters") or {}
    return float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))


OLD_TINY = {  # the absolute values the YAMLs held for tiny_llama at C = 256 before they moved to units of C
    "ntk_32k": (2048, 0), "ntk_64k": (2048, 2048), "ntk_dynamic": (2048, 0), "self_extend": 64,
    "lm_infinite": (256, 256), "entropy_abf": 256, "train.seq_len": 2048, "tiny_study/ntk_64k train.seq_len": 4096}


def test_tiny_llama_settings_keep_their_meaning():
    """At C = 256 (the window those YAMLs were written for) the new YAMLs give exactly the old absolute token values;
    at the shipped model's C (whatever it is now) the same multiples of C; ABF bases are x50 the model's own base
    (the old absolute 50,000 = 50 x the then base 1000)."""
    for c, over in ((256, ["model.native_ctx=256"]), (conf_utils.compose([]).model.native_ctx, [])):
        want = OLD_TINY if c == 256 else {k: (tuple(x * c // 256 for x in v) if isinstance(v, tuple) else v * c // 256)
                                          for k, v in OLD_TINY.items()}
        for name in ("ntk_32k", "ntk_64k", "ntk_dynamic"):
            cfg, m, _ = composed(f"method={name}", "train=none", *over)
            assert cfg.model.native_ctx == c and m.lengths(c) == want[name]
        assert composed("method=self_extend", "train=none", *over)[1].check(c) == want["self_extend"]
        assert composed("method=lm_infinite", "train=none", *over)[1].check(c) == want["lm_infinite"]
        assert composed("method=entropy_abf", *over)[1].check(c) == want["entropy_abf"]
        assert composed("method=pi", *over)[2].seq_len == want["train.seq_len"]
        assert composed("experiment=tiny_study", "point=tiny_study/ntk_64k", *over)[2].seq_len == \
            want["tiny_study/ntk_64k train.seq_len"]
    base = tiny_rope_theta()
    for name in ("abf", "entropy_abf"):
        m = composed(f"method={name}")[1]
        assert (m.args.rope_theta, m.args.ratio) == (0.0, 50.0)
    from harness.models import load_model

    for name in ("abf", "entropy_abf"):
        h = load_model("tiny_llama")
        build_method({"name": name}).apply(h)
        assert rope_dims(h.model.config)[0] == pytest.approx(50 * base)


def test_tiny_llama_frequencies_equal_the_old_absolute_settings():
    """On the shipped tiny_llama weights taken as C = 256: the ntk_32k / ntk_64k YAMLs install exactly the frequencies
    the old absolute settings (min_len 2048, max_len 0 / 2048 tokens) gave, at every length of the C..16C grid."""
    from harness.methods.rope import ntk_multiplier
    from harness.models import load_model

    for name, (lo, hi), s in (("ntk_32k", (2048, 0), 4.0), ("ntk_64k", (2048, 2048), 8.0)):
        shipped = load_model("tiny_llama")
        h = ModelHandle(shipped.model, shipped.tokenizer, "tiny_llama", 256, shipped.info)  # the YAMLs' C = 256
        base, d = rope_dims(h.model.config)
        build_method({"name": name}).apply(h)
        rot = h.model.get_decoder().rotary_emb
        for L in (256, 512, 1024, 2048, 4096):
            t = ntk_multiplier(s, L, 256, lo, hi)
            torch.testing.assert_close(rot.rope_state(L)[0], default_inv_freq(base * t ** (d / (d - 2)), d))


# ------------------------------------------------------------------------------------------------ refused up front
BAD = {  # overrides -> (substrings the one line must contain)
    "ntk clamp below C": (["method=ntk_32k", "method.min_len=0.5"], ["min_len", "below 1 C", "valid"]),
    "ntk cap below C (t < 1)": (["method=ntk_64k", "method.max_len=0.5"], ["max_len", "valid"]),
    "ntk cap below clamp": (["method=ntk_dynamic", "method.max_len=4"], ["max_len", "below min_len", "valid"]),
    "ntk clamp in tokens": (["method=ntk_32k", "method.min_len=32768"], ["units of the native window", "valid"]),
    "ntk s < 1": (["method=ntk_dynamic", "method.factor=0.5"], ["factor", ">= 1"]),
    "ntk_frozen s < 1": (["method=ntk_frozen", "method.factor=0.9"], ["factor", ">= 1"]),
    "pi s < 1": (["method=pi", "method.scale=0.5"], ["scale", ">= 1"]),
    "yarn s nan": (["method=yarn", "method.scale=nan"], ["scale", ">= 1"]),
    "self_extend window >= C": (["method=self_extend", "method.window=1.5"], ["window", "valid"]),
    "lm_infinite window 0": (["method=lm_infinite", "method.n_local=0"], ["n_local", "valid"]),
    "abf base <= 0": (["method=abf", "method.ratio=0"], ["ratio", "> 0"]),
    "entropy_abf log base": (["method=entropy_abf", "method.log_base=-1"], ["log_base", "valid"]),
    "landmark top_k": (["method=landmark", "method.top_k=100"], ["top_k", "valid"]),
    "landmark train length": (["method=landmark", "train.seq_len=1000"], ["train.seq_len", "train_len"]),
    "longlora group": (["method=longlora", "train.seq_len=1026"], ["train.seq_len", "group"]),
    "eval length 0": (["eval.lengths=[0]"], ["eval.lengths", "valid"]),
    "eval length 1e8": (["eval.lengths=[100000000]"], ["eval.lengths", "valid", "1024 x the native window"]),
    "eval length not integer": (["eval.lengths=[300.5]"], ["eval.lengths", "valid"]),
    "niah length 1e8": (["eval=tiny", "eval.suite.niah.context_lengths=[1000,100000000,3]"], ["niah", "valid"]),
    "niah buffer": (["eval=tiny", "eval.suite.niah.buffer=100000"], ["buffer", "valid"]),
    "schedule typo": (["train.schedule=cosinee"], ["schedule", "cosine", "valid"]),
    "eval batch tokens negative": (["eval_batch_tokens=-1"], ["eval_batch_tokens", "valid"]),
    "train autocast": (["train.autocast=fp8"], ["autocast", "bfloat16", "valid"]),
    "eval autocast": (["autocast=fp8"], ["autocast", "bfloat16", "valid"]),
    "ppl samples 0": (["eval.suite.ppl_books.samples=0"], ["ppl_books.samples", ">= 1"]),
    "native_ctx": (["model.native_ctx=0"], ["native_ctx", "positive"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_impossible_values_are_one_line_before_loading(case, monkeypatch):
    overrides, words = BAD[case]

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("harness.models.build_model", no_loading)
    monkeypatch.setattr("harness.pipeline.build_model", no_loading)
    monkeypatch.setattr("harness.models.load_pretrained", no_loading)
    cfg = conf_utils.compose(overrides)
    with pytest.raises(ConfigError) as e:
        pipeline.validate(cfg, data=False)
    msg = str(e.value)
    assert "\n" not in msg and lifecycle.one_line(e.value) == msg, msg
    for w in words:
        assert w in msg, (w, msg)


def test_bad_ppl_data_is_refused_naming_the_file(tmp_path):
    empty, garbage, blank = tmp_path / "empty", tmp_path / "garbage", tmp_path / "blank"
    for d in (empty, garbage, blank):
        d.mkdir()
    (garbage / "a.txt").write_bytes(bytes(range(256)) * 8)
    (blank / "a.txt").write_text("")
    bin_odd = tmp_path / "odd.bin"
    bin_odd.write_bytes(b"\x01\x00\x02")
    cases = {f"dir:{empty}": "has no *.txt files", f"dir:{garbage}": "a.txt is not UTF-8 text",
             f"dir:{blank}": "every *.txt file is empty", f"dir:{tmp_path / 'missing'}": "not found",
             f"bin:{tmp_path / 'missing.bin'}": "not found", f"bin:{bin_odd}": "not a uint16 token stream",
             "pg19": "unknown dataset 'pg19'"}
    for ds, words in cases.items():
        cfg = conf_utils.compose(["eval=quick", f"eval.suite.ppl_books.dataset={ds}"])
        with pytest.raises(ConfigError) as e:
            pipeline.validate(cfg)
        assert "eval.suite.ppl_books.dataset" in str(e.value) and words in str(e.value), str(e.value)
        assert "\n" not in str(e.value)


def test_longrope_factors_for_another_window_are_refused_before_loading(monkeypatch):
    monkeypatch.setattr("harness.pipeline.build_model", lambda *a, **k: pytest.fail("a model was loaded"))
    cfg = conf_utils.compose(["method=longrope", "model=llama2_7b", "train=none"])
    pipeline.validate(cfg, data=False)  # the file is data: checked where the run happens
    with pytest.raises(ConfigError, match="factors file .* is for C=512, the model's native window is 4096"):
        pipeline.validate(cfg)


def test_missing_haystack_and_longbench_data_are_refused(tmp_path):
    cfg = conf_utils.compose(["eval=tiny", f"eval.suite.niah.haystack_dir={tmp_path / 'no'}"])
    with pytest.raises(ConfigError, match="niah.haystack_dir"):
        pipeline.validate(cfg)
    cfg = conf_utils.compose(["eval=longbench", f"eval.suite.longbench.data_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="longbench.data_dir.*lacks"):
        pipeline.validate(cfg)


# ------------------------------------------------------------------------------------------------ rotary guards
def test_ntk_multiplier_below_one_is_refused_not_truncated():
    """The old failure: an NTK cap below C gave t = -3, complex frequencies, and only their real part was kept.
    The rope function itself now refuses t < 1, and a complex or non-finite table never reaches inv_freq."""
    from harness.methods.rope import check_inv_freq, ntk_by_length_parameters

    model = random_llama(hidden=128, heads=2, ctx=4096)
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_type": "ntk_by_length", "factor": 8.0,
                                    "original_max_position_embeddings": 4096, "min_len": 2048, "max_len": 2048}
    with pytest.raises(ConfigError, match=r"t = .* = -3 < 1"):
        ntk_by_length_parameters(model.config, seq_len=4096)
    with pytest.raises(ConfigError, match="not real"):
        check_inv_freq(torch.tensor([1.0, -0.5]) ** 0.5 + 0j, "test")
    with pytest.raises(ConfigError, match="not finite"):
        check_inv_freq(torch.tensor([1.0, float("nan")]), "test")
    with pytest.raises(ConfigError, match="not finite and > 0"):
        check_inv_freq(torch.tensor([1.0, -1.0]), "test")
    # the method refuses the same settings before touching the model (one line, key named)
    with pytest.raises(ConfigError, match="max_len"):
        build_method({"name": "ntk_64k", "min_len": 0, "max_len": 0.5}).check(4096)


def test_length_dependent_rope_refuses_a_bad_table():
    from harness.methods.rope import install_length_dependent

    model = random_llama(hidden=128, heads=2, ctx=64)
    install_length_dependent(model, lambda cfg, device=None, seq_len=None: (torch.full((32,), math.inf), 1.0))
    with pytest.raises(ConfigError, match="not finite"):
        model(torch.randint(3, 200, (1, 8)))


def test_memory_check_refuses_what_cannot_fit(monkeypatch):
    from harness import models

    h = ModelHandle(random_llama(hidden=64, heads=4, layers=2, ctx=64), None, "random", 64, {})
    monkeypatch.setattr(models, "available_memory", lambda device: 3 << 20)  # 3 MiB free
    # KV cache: 2 layers x (K, V) x 4 heads x 16 dims x 4 bytes = 1 KiB per token; prefill (harness.memory): one
    # layer at its peak, 3 x 64 + 4 x 64 + 3 x 64 + 2 x 16 = 672 fp32 values = 2688 bytes per token
    models.check_fits(h, 512, generates=True, key="eval.suite.passkey")  # 512 KiB + 1344 KiB: fits
    with pytest.raises(ConfigError, match=r"eval.suite.passkey: an input of 4096 tokens needs about 14.5 MiB beyond "
                                          r"the weights \(KV cache 4.0 MiB \+ prefill activations 10.5 MiB"):
        models.check_fits(h, 4096, generates=True, key="eval.suite.passkey")
    # no cache: one layer, 1024 x 2688 bytes (the LM head's chunk: 1024 x 64 x 4 + 1024 x 256 x 8, less)
    models.check_fits(h, 1024, generates=False, key="eval.suite.ppl")  # 2.6 MiB: fits


# ------------------------------------------------------------------------------------------------ the command line
def _cli(args, tmp_path, timeout=600):
    import os
    import sys

    env = {**os.environ, "HARNESS_RESULTS_DIR": str(tmp_path / "res"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
           "HARNESS_CKPT_DIR": str(tmp_path / "ck"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    from tests import forkrun

    r = forkrun.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True, env=env,
                    cwd=ROOT, timeout=timeout)
    from harness.results import read_rows

    rows = read_rows(tmp_path / "res") if (tmp_path / "res").exists() else []
    lines = [x for x in r.stderr.splitlines() if x.strip() and "warn" not in x.lower()]
    return r, lines, rows


@pytest.mark.parametrize("args,rc,words", [
    (["method=ntk_64k", "method.max_len=0.5", "train=none", "eval=quick"], 1, ["run failed:", "max_len"]),
    (["method=base", "train=none", "eval=quick", "eval.lengths=[100000000]"], 1, ["run failed:", "eval.lengths"]),
    (["method=nosuch", "train=none"], 2, ["config error", "available: abf, base"]),  # composed once, by Hydra
    (["train.lrr=1"], 2, ["config error", "train.lrr", "valid keys of train", "schedule"]),
    (["-m", "method=nosuch,base", "train=none"], 2, ["config error", "available: abf, base"]),
    (["-m", "method=base,pi", "train.lrr=1"], 2, ["config error", "train.lrr", "valid keys of train", "schedule"]),
    (["-m", "method=base,pi", "train=none", "eval=quick", "eval.lengths=[0]"], 2,
     ["config error in sweep job", "method=base", "eval.lengths", "valid"]),
])
def test_bad_input_is_one_line_and_a_failed_row(args, rc, words, tmp_path):
    """Before: the NTK cap gave a silent ok row with complex frequencies, 1e8 spent minutes tokenising, and -m sweeps
    printed Hydra's 6-27-line errors with no row. Now: one line, a failed row with that line, no traceback, and
    nothing is loaded first (these return within seconds of start-up)."""
    r, lines, rows = _cli(args, tmp_path)
    assert r.returncode == rc, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and len(lines) == 1, lines
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert [row["status"] for row in rows] == ["failed"]
    assert rows[0]["error"] in lines[0]


def test_checkpoint_dir_that_is_a_file_is_refused_before_loading(tmp_path):
    (tmp_path / "ck").write_text("not a directory")
    cfg = conf_utils.compose([f"paths.ckpt_dir={tmp_path / 'ck'}"])
    with pytest.raises(ConfigError, match="paths.ckpt_dir: .* is a file"):
        pipeline.validate(cfg, data=False)


def test_a_command_line_that_does_not_compose_leaves_its_row_in_its_own_results_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HARNESS_RESULTS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # a row in ./results would be the wrong place
    with pytest.raises(SystemExit):
        precheck.precheck_or_exit(["-m", "train.lrr=1,2", f"paths.results_dir={tmp_path / 'mine'}"])
    rows = list((tmp_path / "mine" / "runs").glob("*.json"))
    assert len(rows) == 1 and json.loads(rows[0].read_text())["status"] == "failed"
    assert not (tmp_path / "results").exists()
    assert "train.lrr" in capsys.readouterr().err
    # a single run: Hydra composes it, its error reaches precheck.refuse through run_guarded (config_refusal)
    single = ["train.lrr=1", f"paths.results_dir={tmp_path / 'single'}"]
    with pytest.raises(Exception) as e:
        conf_utils.compose(single)
    with pytest.raises(SystemExit) as out:
        precheck.config_refusal(single)(e.value)
    assert out.value.code == 2 and len(list((tmp_path / "single" / "runs").glob("*.json"))) == 1
    assert not (tmp_path / "results").exists()
