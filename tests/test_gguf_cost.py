"""Your own checkpoint on a CPU: a GGUF file becomes a Hugging Face folder (``scripts/gguf_to_hf.py``), and a run's
cost is estimated from its suite before the model loads and refused beyond ``cost.limit_s`` (``harness.plan``)."""
from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from harness import api, pipeline, plan
from harness.conf_utils import compose
from harness.config import ConfigError
from harness.models import gguf_to_folder
from harness.pipeline import setup
from tests import forkrun
from tests.conftest import ROOT


def test_cost_counts_the_suites_tokens_per_evaluator_and_length():
    """The estimate's token counts are the suite's: eval=quick on tiny_llama (C = 512) is PPL on 2 documents and
    passkey on 5 prompts at C, 2C, 4C, and passkey decodes its answer budget per prompt."""
    cfg = compose(["method=base", "train=none", "eval=quick"])
    s = setup(cfg, data=False)
    est = plan.run_cost(cfg, pipeline.selected(s.suite), s.method)
    ppl, pk = est["entries"]["ppl_books"], est["entries"]["passkey"]
    assert {L: r["prompts"] for L, r in ppl.items()} == {512: 2, 1024: 2, 2048: 2}
    assert sum(r["prompt_tokens"] for r in ppl.values()) == 2 * (512 + 1024 + 2048)
    gen = s.suite.evaluators[1].args.gen_tokens
    assert sum(r["generated_tokens"] for r in pk.values()) == 15 * gen and est["train"] is None
    assert est["seconds"] == pytest.approx(sum(r["seconds"] for e in est["entries"].values() for r in e.values()))
    lines = plan.cost_lines(est)
    assert "passkey: lengths 1,2,4 x C, 15 prompts, 17,920 tokens to prefill" in "\n".join(lines)


def test_a_run_beyond_the_limit_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """A checkpoint folder whose weights are missing: the cost line refuses the run, so loading was never tried."""
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "ckpt"
    shutil.copytree(api.TINY_LLAMA, d)
    (d / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"^cost: this run's evaluation is estimated at .* beyond cost.limit_s=5 "):
        api.evaluate(str(d), evaluator="passkey", lengths=[1, 2, 4, 8, 16], samples=500,
                     overrides=["cost.limit_s=5"])
    row = json.loads(next((tmp_path / "results" / "runs").glob("*.json")).read_text())
    assert row["status"] == "failed" and "cost: this run's evaluation is estimated" in row["error"]
    assert not row.get("model_info")


def test_the_default_limit_passes_the_committed_configs():
    """make run's two runs and a tiny-study point (its suite) stay below the default limit on a device that does a
    2048^3 bf16 matmul at >= 100 GFLOP/s (this 2-core CPU: ~2400 idle, 50-120 measured while four other agents ran
    their jobs); SmolLM2 on eval=quick (8k-32k tokens), the run of the issue that would have taken hours, does not."""
    plan._FLOPS[("cpu", "torch.bfloat16")] = plan._FLOPS[("cpu", "torch.float32")] = 100e9
    try:
        def evaluation(ov):
            cfg = compose(ov)
            s = setup(cfg, data=False)
            est = plan.run_cost(cfg, pipeline.selected(s.suite), s.method, device=torch.device("cpu"))
            return est["seconds"] - (est["train"] or {}).get("seconds", 0)

        for ov in (["method=base", "train=none", "eval=run"], ["method=yarn", "train=quick", "eval=run"],
                   ["experiment=tiny_study", "point=tiny_study/yarn"], ["experiment=tiny_study",
                                                                       "point=tiny_study/landmark"]):
            assert evaluation(ov) < plan.DEFAULT_COST_LIMIT_S / 2, ov
        assert evaluation(["model=smollm2_135m", "method=base", "train=none", "eval=quick"]) > \
            plan.DEFAULT_COST_LIMIT_S
    finally:
        plan._FLOPS.clear()


def test_gguf_conversion_refuses_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such GGUF file"):
        gguf_to_folder(str(tmp_path / "x.gguf"), str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="does not load from a GGUF file"):
        gguf_to_folder("tiny_llama", str(tmp_path / "out"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        gguf_to_folder("smollm2_135m", str(tmp_path / "full"))


@pytest.mark.slow
def test_the_shipped_smollm2_gguf_becomes_a_folder_with_the_same_logits(tmp_path):
    """``scripts/gguf_to_hf.py smollm2_135m DIR``: plain transformers loads DIR, with the GGUF model's logits."""
    from transformers import AutoModelForCausalLM

    from harness.models import load_model

    r = forkrun.run([sys.executable, str(ROOT / "scripts" / "gguf_to_hf.py"), "smollm2_135m", str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("gguf: loading") and "window C = 8192" in r.stdout
    ids = torch.randint(10, 40000, (1, 64), generator=torch.Generator().manual_seed(0))
    ref = load_model("smollm2_135m").model
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        torch.testing.assert_close(got(ids).logits, ref(ids).logits, rtol=0, atol=0)
