"""base: the unmodified model (plain RoPE at its pretrained base). The control row of every study."""
from __future__ import annotations

from harness.methods import METHODS, Method


@METHODS.register("base")
class Base(Method):
    pass
