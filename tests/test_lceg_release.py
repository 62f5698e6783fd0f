"""``experiment=lceg_release``: the controlled study's released checkpoints (LCEG README "Models"), each under the
method it was fine-tuned with at the paper's inference settings (Table 8), frozen; tested offline with a tiny
checkpoint in the released format standing in for a hub id in a fake local Hugging Face cache."""
from __future__ import annotations

import json
import math
import shutil

import pytest
from omegaconf import OmegaConf

from harness.conf_utils import compose
from harness.models.tiny_llama import ASSET_DIR

# The LCEG README's "Models" table (github.com/Leooyii/LCEG): hub id -> the paper's row. CLEX's link is "TODO".
RELEASED = {
    "Leooyii/PI_32k_Slimpajama_1B": "PI",
    "Leooyii/NTK_32k_Slimpajama_1B": "NTK-32K",
    "Leooyii/NTK_64k_Slimpajama_1B": "NTK-64K",
    "Leooyii/NTK_64k_Slimpajama_2B": "NTK-64K-2B",
    "Leooyii/YaRN_32k_Slimpajama_1B": "YaRN",
    "Leooyii/Longlora_32k_Slimpajama_1B": "LongLoRA",
    "Leooyii/Landmark_512_Slimpajama_1B": "Landmark",
}
# Table 8 (scale factor at 4k, 8k, 16k, 32k, 64k; LLaMA2-7B, C = 4k); "-" rows have no RoPE scale
TABLE8 = {"NTK-Frozen": [1, 3, 7, 15, 31], "PI": [8] * 5, "NTK-32K": [29, 29, 29, 29, 61], "YaRN": [8] * 5,
          "LongLoRA": [8] * 5, "NTK-64K": [57] * 5, "NTK-64K-2B": [57] * 5}
LENGTHS = [4096, 8192, 16384, 32768, 65536]


def _jobs():
    from harness import sweeps

    return [compose(job) for job in sweeps.expand(["experiment=lceg_release"])]


def _scale(method, row: str, length: int) -> float:
    if hasattr(method, "scale_factor"):  # NTK: the multiplier t at this length
        return method.scale_factor(length, 4096)
    return float(method.args.scale)


def test_every_released_checkpoint_is_a_row_under_its_method_at_table_8_settings():
    from harness import pipeline

    jobs = _jobs()
    rows = {str(c.study.row): c for c in jobs}
    released = {str(c.model.path): str(c.study.row) for c in jobs if str(c.model.name).startswith("lceg_")}
    assert released == RELEASED  # every released checkpoint, once, and nothing invented (no CLEX)
    assert set(rows) == set(RELEASED.values()) | {"LLaMA2", "NTK-Frozen", "LM-Infinite", "Self-Extend"}
    for row, cfg in rows.items():
        method, train = pipeline.validate(cfg, data=False)
        assert not train.enabled and cfg.model.native_ctx == 4096, row  # frozen; lengths in units of LLaMA2's C
        assert cfg.eval.name == "paper", row
        if row in TABLE8:
            assert [_scale(method, row, n) for n in LENGTHS] == TABLE8[row], row
    assert rows["LongLoRA"].method.name == "longlora" and rows["Landmark"].method.name == "landmark"
    assert (rows["Landmark"].method.mem_freq, rows["Landmark"].method.top_k) == (63, 5)  # block 64, LCEG run_test
    assert rows["YaRN"].method.name == "yarn" and rows["PI"].method.name == "pi"
    assert rows["LLaMA2"].eval.suite.longbench.max_length == 4096  # LCEG model2maxlen for the base model
    assert rows["PI"].eval.suite.longbench.max_length == 32768


def test_the_prefetch_list_is_the_released_checkpoints():

    from harness.tools import prepare_cluster_data as prep
    assert set(prep.hub_ids("lceg_release").values()) == set(RELEASED)


def _fake_release(tmp_path, repo: str, **config_changes):
    """A tiny checkpoint saved as the release saves it (transformers 4.3x config: ``rope_scaling`` with ``type``),
    placed in a fake hub cache under ``repo``."""
    cache = tmp_path / "hub"
    entry = cache / ("models--" + repo.replace("/", "--"))
    snap = entry / "snapshots" / ("0" * 40)
    shutil.copytree(ASSET_DIR, snap)
    cfg = json.loads((snap / "config.json").read_text())
    theta = cfg.pop("rope_parameters")["rope_theta"]
    cfg.update(rope_theta=theta, **config_changes)
    (snap / "config.json").write_text(json.dumps(cfg))
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("0" * 40)
    return cache


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as c
    import transformers.utils.hub as th

    def use(cache):
        monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
        if hasattr(th, "TRANSFORMERS_CACHE"):
            monkeypatch.setattr(th, "TRANSFORMERS_CACHE", str(cache))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    return use


def test_a_released_checkpoint_runs_offline_from_the_hub_cache(tmp_path, hub_cache, results_env):
    from harness import pipeline

    # the PI release: LCEG's fine-tune.py saved rope_scaling {"type": "linear", "factor": 8} in its config.json
    hub_cache(_fake_release(tmp_path, "Leooyii/PI_32k_Slimpajama_1B", rope_scaling={"type": "linear", "factor": 8.0}))
    cfg = compose(["experiment=lceg_release", "point=lceg_release/pi", "model.native_ctx=512", "model.dtype=float32",
                   "model.attn_implementation=sdpa"])
    assert cfg.model.path == "Leooyii/PI_32k_Slimpajama_1B" and cfg.model.name == "lceg_pi_32k"
    method, train = pipeline.validate(cfg, data=False)
    handle = pipeline.load_and_extend(cfg, method, train)
    assert handle.name == "lceg_pi_32k" and handle.native_ctx == 512
    rp = handle.model.config.rope_parameters
    assert (rp["rope_type"], rp["factor"]) == ("linear", 8.0)
    # the release's own rope scaling is the paper's PI x8: the method leaves it as it is, and the row says so
    rec = method.params()["checkpoint_rope"]
    assert rec["action"] == "unchanged" and rec["rope_parameters"]["factor"] == 8.0
    # a tiny evaluation of the loaded row (PPL at C and 2C, one document)
    suite = {"ppl": {**OmegaConf.to_container(compose(["eval=quick"]).eval.suite.ppl_books, resolve=True),
                     "samples": 1, "lengths": [512, 1024]}}
    ((key, out, _, _),) = list(pipeline.evaluations(cfg, handle, method, tmp_path / "run",
                                                    suite=pipeline.Suite.build(suite)))
    assert key == "ppl" and out["documents"] == 1
    assert {k: v["tokens"] for k, v in out["scored"].items()} == {"512": 511, "1024": 1023}
    assert all(math.isfinite(v) and v > 1 for v in out["ppl"].values()), out["ppl"]
