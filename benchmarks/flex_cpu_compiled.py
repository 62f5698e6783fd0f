"""What torch's *compiled* flex_attention can do on a CPU, for the one attention whose fused path matters most at the
tiny suite's lengths (Self-Extend): is any fused form no slower than the reference tile loops on this machine?

The harness's ``flex`` backend runs flex_attention eagerly on CPU (``harness/methods/flex.py``), which ``make bench``
measures far slower than the tile loops. ``torch.compile(flex_attention)`` does run on CPU (inductor's C++ template),
but in torch 2.13 only for inference and without the log-sum-exp (``return_aux=AuxRequest(lse=True)`` raises
"torch.compile on CPU only supports inference and `return_lse` is not supported yet"), so the harness's two-call
Self-Extend (neighbour band + grouped part merged by log-sum-exp) cannot use it. The form measured here needs no
log-sum-exp: ONE flex call over concatenated keys, q' = [q, q_grouped] (head dim 2D), keys [k, 0] for the neighbour
band and [0, k_grouped] for the grouped part (2L keys), values [v; v], mask = band on the first L keys, m - n >= W on
the second L: exactly one softmax over the union. Each form's max |difference| from the reference is reported
beside its timing.

Per length: one attention call (B = 1, 4 heads x 64, fp32, tiny_llama's sizes; W = C / 4 = 128, G = 64, the study's
Self-Extend), reference tile loops (``self_extend_attention``, blocks 256 x 512) vs eager flex (the harness's
``flex`` backend) vs the compiled single call, median of 3 after a warm-up call (compilation and block-mask
construction excluded and reported separately). Not part of ``make bench`` (it compiles C++ kernels: minutes).

    python benchmarks/flex_cpu_compiled.py [--threads 2] [--lengths 512,2048,8192] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from types import SimpleNamespace

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from harness.methods import _blockwise as bw
from harness.methods.self_extend import group_shift, self_extend_attention


def timed(fn, reps: int = 3) -> tuple[float, object]:
    out = fn()  # warm-up (and the result)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


HEADS, D, WINDOW, GROUP = 4, 64, 128, 64


def one_length(n: int, compiled, inv: torch.Tensor) -> dict:
    """The three forms at one length (the checks of equality included)."""
    shift = group_shift(WINDOW, GROUP, False)
    q, k, v = (torch.randn(1, HEADS, n, D) for _ in range(3))
    pos = torch.arange(n)[None]
    mods = {b: SimpleNamespace(harness_self_extend=(WINDOW, GROUP, False, 256, 512), harness_inv_freq=inv,
                               head_dim=D, harness_attn_backend=b) for b in ("reference", "flex")}
    with torch.no_grad():
        t_ref, (ref, _) = timed(lambda: self_extend_attention(mods["reference"], q, k, v, None, position_ids=pos))
        t_eager, (eag, _) = timed(lambda: self_extend_attention(mods["flex"], q, k, v, None, position_ids=pos))
        qg = bw.rotate(q, (pos // GROUP + shift) - pos, inv)
        kg = bw.rotate(k, (pos // GROUP) - pos, inv)
        q2 = torch.cat([q, qg], -1)
        k2 = torch.cat([torch.cat([k, torch.zeros_like(k)], -1), torch.cat([torch.zeros_like(kg), kg], -1)], 2)
        v2 = torch.cat([v, v], 2)

        def union(b, h, qi, ki):
            near = (ki < n) & (qi >= ki) & (qi - ki < WINDOW)
            far = (ki >= n) & (qi - (ki - n) >= WINDOW)
            return near | far

        t0 = time.perf_counter()
        bm = create_block_mask(union, None, None, n, 2 * n, device="cpu", _compile=True)
        t_mask = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled(q2, k2, v2, block_mask=bm, scale=D ** -0.5)
        t_first = time.perf_counter() - t0
        t_comp, comp = timed(lambda: compiled(q2, k2, v2, block_mask=bm, scale=D ** -0.5))
    comp = comp.transpose(1, 2)  # the attention functions return [B, L, H, D]
    return {"tokens": n, "reference_s": round(t_ref, 4), "flex_eager_s": round(t_eager, 4),
            "flex_compiled_single_call_s": round(t_comp, 4), "compiled_first_call_s": round(t_first, 2),
            "block_mask_s": round(t_mask, 2),
            "max_abs_diff_eager_vs_reference": float((eag - ref).abs().max()),
            "max_abs_diff_compiled_vs_reference": float((comp - ref).abs().max())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    inv = 1.0 / (500.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    compiled = torch.compile(flex_attention)
    rows = []
    for n in (int(x) for x in a.lengths.split(",")):
        rows.append(one_length(n, compiled, inv))
        print(json.dumps(rows[-1]), flush=True)
    result = {"what": "Self-Extend attention, one call, B=1, 4 heads x 64, fp32, W=128, G=64 (tiny_llama, C=512)",
              "machine": platform.processor() or platform.machine(), "threads": a.threads,
              "torch": torch.__version__, "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
