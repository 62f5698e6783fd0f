"""hub: any causal LM that transformers loads from a local directory or a hub id already in the local cache.

The study's hub models are data, not code: ``conf/model/llama2_7b.yaml`` and ``conf/model/phi2.yaml`` say
``builder: hub`` and give the path, window, dtype and attention implementation; this one builder loads them (never
downloading at run time: ``scripts/prepare_cluster_data.py`` fills the cache on a login node). The handle carries
the YAML's ``name`` (the results row's model column) and the rotary dimension the RoPE methods act on
(``harness.models.rotary_dim``: Phi-2 rotates 32 of its 80 head dims). A new hub model is one YAML.
"""
from __future__ import annotations

from harness.models import MODELS, ModelArgs, ModelHandle, load_pretrained, rotary_dim


@MODELS.register("hub")
class Hub:
    Args = ModelArgs

    @staticmethod
    def build(a: ModelArgs, device=None, device_map=None) -> ModelHandle:
        model, tok = load_pretrained(a.path, a.dtype, a.attn_implementation, gguf_file=a.gguf_file, device=device,
                                     device_map=device_map)
        return ModelHandle(model, tok, a.name, a.native_ctx, {"path": a.path, "rotary_dim": rotary_dim(model.config)})
