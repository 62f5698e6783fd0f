"""Hub models are data: ``conf/model/llama2_7b.yaml`` / ``phi2.yaml`` name the generic builder (``builder: hub``),
which loads any local or cached checkpoint and keeps the YAML's name and window."""
from __future__ import annotations

import pytest

from harness.conf_utils import compose
from harness.config import ConfigError
from harness.models import build_model, rotary_dim
from harness.models.tiny_llama import ASSET_DIR


@pytest.mark.parametrize("name,ctx,path", [("llama2_7b", 4096, "meta-llama/Llama-2-7b-hf"),
                                           ("phi2", 2048, "microsoft/phi-2")])
def test_hub_models_compose_to_the_generic_builder(name, ctx, path):
    m = compose([f"model={name}", "method=base", "train=none"]).model
    assert (m.name, m.builder, m.native_ctx, m.path) == (name, "hub", ctx, path)


def test_hub_builder_loads_a_local_checkpoint_under_the_yaml_name():
    h = build_model({"name": "my_model", "builder": "hub", "path": str(ASSET_DIR), "native_ctx": 512,
                     "dtype": "float32", "attn_implementation": "sdpa"})
    assert h.name == "my_model" and h.native_ctx == 512 and h.info["path"] == str(ASSET_DIR)
    assert h.info["rotary_dim"] == rotary_dim(h.model.config) > 0
    ref = build_model({"name": "tiny_llama"})
    assert all((a == b).all() for a, b in zip(h.model.state_dict().values(), ref.model.state_dict().values()))


def test_unknown_builder_is_one_config_error():
    with pytest.raises(ConfigError, match="unknown model 'nope'"):
        build_model({"name": "x", "builder": "nope", "path": "/nowhere"})
