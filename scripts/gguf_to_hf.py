"""`harness gguf-to-hf`: a Hugging Face folder from a GGUF file (``harness/tools/gguf_to_hf.py``: the code and its
usage; this is its front)."""
from __future__ import annotations

import sys

from harness.tools.gguf_to_hf import main

if __name__ == "__main__":
    sys.exit(main())
