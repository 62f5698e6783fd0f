"""Data-parallel evaluation (``harness.eval_distributed``, ``EvalContext.map``): the split/merge of ``ctx.map`` in a
real 2-rank gloo group, the ``eval_world_size`` key, that ``data_parallel`` marks exactly the evaluators whose prompt
loop goes through ``ctx.map``, and (slow) ``run.py`` with 2 CPU ranks writing the same row as one process."""
from __future__ import annotations

import inspect
import json
import os
import socket
import sys

import pytest
import torch.multiprocessing as mp

from harness.config import ConfigError
from harness.evals import EVALS, EvalContext, block_bounds
from tests import forkrun
from tests.conftest import ROOT


def test_block_bounds_cover_every_item_once_in_order():
    for n in range(0, 23):
        for world in (1, 2, 3, 8):
            for align in (1, 2, 5):
                blocks = [block_bounds(n, r, world, align) for r in range(world)]
                assert [i for lo, hi in blocks for i in range(lo, hi)] == list(range(n))
                assert all(lo % align == 0 for lo, hi in blocks if hi > lo)  # edges at multiples of align
                sizes = [-(-(hi - lo) // align) for lo, hi in blocks]  # units per rank: as even as possible
                assert max(sizes) - min(sizes) <= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ctx = EvalContext(run_dir=out_dir, rank=rank, world_size=world)
        items = list(range(7))
        got = {
            "map": ctx.map(lambda x: (x * x, rank), items),
            "blocks": ctx.map_blocks(lambda xs: [(x + 100, rank, len(xs)) for x in xs], items, align=3),
            "empty": ctx.map(lambda x: x, []),
            "is_main": ctx.is_main,
            "computed": ctx.computed,
        }
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(got, f)
    finally:
        dist.destroy_process_group()


def test_map_splits_contiguous_blocks_and_every_rank_gets_the_whole_ordered_list(tmp_path):
    """Two gloo ranks (processes): each computes one contiguous block, both get the full list in item order."""
    mp.start_processes(_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["map"] == r1["map"]
    assert [v for v, _ in r0["map"]] == [x * x for x in range(7)]
    assert [who for _, who in r0["map"]] == [0, 0, 0, 0, 1, 1, 1]  # contiguous blocks, rank order
    assert r0["blocks"] == r1["blocks"]
    # align=3: units [0,3) [3,6) [6,7) -> rank 0 takes two units (6 items) in one call, rank 1 the last item
    assert r0["blocks"] == [[x + 100, 0, 6] for x in range(6)] + [[106, 1, 1]]
    assert r0["empty"] == [] == r1["empty"]
    assert (r0["is_main"], r1["is_main"]) == (True, False)
    assert (r0["computed"], r1["computed"]) == (4 + 6, 3 + 1)


def test_one_rank_map_is_a_plain_loop(tmp_path):
    ctx = EvalContext(run_dir=tmp_path)
    calls = []
    assert ctx.map(lambda x: calls.append(x) or -x, [3, 1, 2]) == [-3, -1, -2]
    assert calls == [3, 1, 2]
    assert ctx.map_blocks(lambda xs: [len(xs)] * len(xs), [5, 6, 7], align=2) == [3, 3, 3]  # one call, all items


def test_eval_world_size_is_checked_with_one_line_naming_the_key():
    from harness.eval_distributed import resolve_world_size

    assert resolve_world_size(3) == 3
    assert resolve_world_size("auto") >= 1
    for bad in (0, -2, "two", 1.5, True):
        with pytest.raises(ConfigError, match=r"^eval_world_size: .* \(valid: auto"):
            resolve_world_size(bad)


def test_pipeline_validate_refuses_a_bad_eval_world_size():
    from harness import pipeline
    from harness.conf_utils import compose

    with pytest.raises(ConfigError, match="^eval_world_size"):
        pipeline.validate(compose(["train=none", "eval_world_size=0"]), data=False)


def test_data_parallel_attribute_is_honest():
    """``Spec(data_parallel=True)`` exactly where the evaluator's module (or the module of a class it inherits its
    loop from) sends its work through ``ctx.map`` / ``ctx.map_blocks`` (an evaluator without it runs whole on every
    rank)."""
    names = EVALS.names()  # every registered evaluator (the registry imports the package's modules)
    assert {"passkey", "ppl", "niah", "ruler", "longbench", "manyshot_trec"} <= {
        n for n in names if EVALS.spec(n).data_parallel}
    for n in names:
        cls = EVALS.get(n)
        src = "".join(inspect.getsource(sys.modules[c.__module__]) for c in cls.__mro__
                      if c.__module__.startswith("harness."))
        uses = "ctx.map(" in src or "ctx.map_blocks(" in src
        assert cls.spec.data_parallel == uses, n


def _run(args, tmp_path, timeout=600):
    env = {**os.environ, "HARNESS_RESULTS_DIR": str(tmp_path / "res"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
           "HARNESS_CKPT_DIR": str(tmp_path / "ck"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    r = forkrun.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    (row_file,) = (tmp_path / "res" / "runs").glob("*.json")
    return json.loads(row_file.read_text())


# work accounting, not results: a rank's first prompt re-encodes the head the previous prompt shared
NOT_RESULTS = {"tokens_reused", "tokens_encoded", "generation_seconds", "samples_per_s"}


def test_two_cpu_ranks_write_the_row_of_one_process(tmp_path):
    """tiny_llama frozen; PPL (2 windows per batch at 256 tokens, so batches split across ranks), passkey 2 lengths x 4
    prompts and NIAH 2 lengths x 3 depths, once in one process and once in 2 gloo ranks: the same metrics and the
    same per-sample records (predictions, correctness, NLLs), and both ranks did half of the work."""
    args = ["method=base", "train=none", "eval=quick", "eval.lengths=[256,512]", "eval.suite.passkey.samples=4",
            "eval.suite.ppl_books.samples=4", "eval_batch_tokens=512", "+evaluator@eval.suite.niah=niah",
            "eval.suite.niah.depth_intervals=3", "eval.suite.niah.gen_tokens=8"]
    one = _run(args + ["eval_world_size=1"], tmp_path / "one")
    two = _run(args + ["eval_world_size=2"], tmp_path / "two")
    assert one["status"] == two["status"] == "ok"
    assert list(one["metrics"]) == list(two["metrics"]) == ["ppl_books", "passkey", "niah"]
    for key in one["metrics"]:
        a = {k: v for k, v in one["metrics"][key].items() if k not in NOT_RESULTS}
        b = {k: v for k, v in two["metrics"][key].items() if k not in NOT_RESULTS}
        assert a == b, key
    assert one["eval_versions"] == two["eval_versions"]
    assert one["metrics"]["ppl_books"]["scored"]["256"]["windows"] == 4
    for name in ("ppl_yarn", "passkey", "niah"):
        f1 = os.path.join(one["run_dir"], "samples", f"{name}.jsonl")
        f2 = os.path.join(two["run_dir"], "samples", f"{name}.jsonl")
        r1 = [json.loads(x) for x in open(f1)]
        r2 = [json.loads(x) for x in open(f2)]
        assert r1 == r2 and r1, name  # rank 0 alone wrote every rank's records, once, in order
    ranks = [json.loads(open(os.path.join(two["run_dir"], "eval_job", f"rank{r}.json")).read()) for r in (0, 1)]
    # passkey 2 + 2 prompts, NIAH 3 of 6, PPL one batch of 2 windows at 256 and 2 of 4 windows at 512, per rank
    assert [r["items_computed"] for r in ranks] == [11, 11]
    assert {r["device"] for r in ranks} == {"cpu"}
