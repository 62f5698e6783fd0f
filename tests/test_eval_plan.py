"""One evaluation plan (``harness.evals.suite.plan``, the one place a suite is cut): the units it makes, and one suite
evaluated four ways -- in one CPU process, on a virtual node whose placement splits the longest PPL length over two
GPUs, data-parallel in two ranks, and sharded by length -- giving the same documents and the same numbers. Before the
plan, the placement's short group filtered PPL's documents at its own longest length (512 here) instead of the
entry's (1024), so PPL at C was scored on other documents on a multi-GPU node than anywhere else."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.evals.suite import Suite, plan
from harness.sweeps import compose

LENGTHS = [256, 512, 1024]  # tiny_llama: C/2, C, 2C
# work accounting, not results: where a rank's block starts, its first prompt re-encodes the shared head
NOT_RESULTS = {"tokens_reused", "tokens_encoded", "generation_seconds", "samples_per_s"}
# per-sample record fields that are timings
NOT_RECORDED = {"seconds", "generation_seconds", "tokens_reused", "tokens_encoded"}


def _suite_args() -> list[str]:
    return ["method=base", "train=none", "eval=quick", f"eval.lengths=[{','.join(map(str, LENGTHS))}]",
            "eval.suite.ppl_books.samples=2", "eval.suite.passkey.samples=1", "eval.suite.passkey.gen_tokens=6",
            "+evaluator@eval.suite.niah=niah", "eval.suite.niah.depth_intervals=1", "eval.suite.niah.gen_tokens=6",
            "autocast=float32", "cost.limit_s=0"]


def _suite():
    return Suite.of(compose(_suite_args()))


def test_the_plan_cuts_only_where_asked_and_views_keep_the_entrys_pins():
    """Whole entries without a placement; cut by GPUs per replica where a placement differs (the lengths it leaves
    out, beyond a method's limit, with the first unit); one unit per length for the shards, named ``<entry>@<L>``;
    every view through ``Spec.view`` keeps PPL's document filter of the entry's largest length."""
    suite = _suite()
    assert [(u.name, u.devices) for u in plan(suite)] == [("ppl_books", 1), ("passkey", 1), ("niah", 1)]
    assert all(u.view is ev for u, ev in zip(plan(suite), suite.evaluators))
    place = {"ppl_books": {256: 1, 512: 1, 1024: 2}, "passkey": {256: 1, 512: 1}}
    units = plan(suite, place)
    assert [(u.name, u.devices) for u in units] == [("ppl_books@256+512", 1), ("ppl_books@1024", 2),
                                                    ("passkey", 1), ("niah", 1)]
    assert [u.view.args.min_tokens for u in units[:2]] == [1024, 1024]  # the whole entry's filter, both parts
    assert units[0].node["min_tokens"] == 1024 and units[0].node["lengths"] == [256, 512]
    assert suite.evaluators[0].args.min_tokens == 0 and suite.evaluators[0].args.lengths == LENGTHS  # untouched
    shards = plan(suite, by_length=True)
    assert [u.name for u in shards] == [f"{e}@{L}" for e in ("ppl_books", "passkey", "niah") for L in LENGTHS]
    assert {u.view.args.min_tokens for u in shards[:3]} == {1024}
    assert plan(suite, {"passkey": {256: 1, 512: 2}})[1].lengths == (256, 1024)  # 1024: not placed, goes first


def _records(run_dirs: list[Path]) -> dict:
    """Every per-sample record under ``run_dirs`` (``samples/*.jsonl``), by file name, timings left out."""
    out: dict = {}
    for d in run_dirs:
        for f in sorted(Path(d).glob("samples/*.jsonl")):
            out.setdefault(f.name, []).extend({k: v for k, v in json.loads(x).items() if k not in NOT_RECORDED}
                                              for x in f.read_text().splitlines())
    return out


def _metrics(row: dict) -> dict:
    return {k: {m: v for m, v in out.items() if m not in NOT_RESULTS} for k, out in row["metrics"].items()}


def _run(args: list[str]):
    from harness import api, lifecycle

    cfg = compose(args)
    r = lifecycle.start(cfg)
    api.run(cfg, r)
    assert r.finish() is None
    return r.row


@pytest.mark.integration
def test_one_suite_evaluated_four_ways_scores_the_same_documents_and_numbers(results_env, monkeypatch):
    """PPL (yarn protocol) at C/2, C and 2C, passkey and NIAH on tiny_llama, four ways:

    1. one CPU process;
    2. a virtual node of two 50 MiB GPUs, where PPL at 2C needs both (``harness.memory.replica_gpus``) and every
       other input one: the plan cuts PPL into ``ppl_books@256+512`` on one GPU and ``ppl_books@1024`` on two;
    3. data-parallel: the same virtual node's parent (``eval_world_size: auto`` = 2 GPUs) starting two gloo ranks that
       evaluate on the CPU (``harness.eval_distributed``);
    4. sharded by length (``+shard=all``: one unit per length, merged into one row).

    Every way scores the same documents (each PPL window's document name and span in the per-sample records) and
    gives bit-identical metrics and records: the same windows are batched alike (PPL batches are cut at batch edges,
    passkey and NIAH prompts are seeded per length), and on the virtual node the split model computes the same ops on
    the same CPU data. Data-parallel prompt loops restart prefix reuse at a rank's block edge, which changes only the
    work accounting (``tokens_reused``), left out."""
    from harness import shards
    from tests.virtual_node import VirtualNode

    one = _run(_suite_args() + ["device=cpu", "eval_world_size=1"])
    node = VirtualNode(gpus=2, capacity=50 * 2**20).install(monkeypatch)
    with node:
        split = _run(_suite_args() + ["device=auto", "eval_world_size=1"])
    assert list(split["timings"]) == list(one["timings"])
    node.capacity = 80 * 2**30  # one GPU holds every input: one replica per GPU, two ranks
    with node:
        ranks = _run(_suite_args() + ["device=auto", "eval_world_size=auto"])
    sharded = shards.run(compose(_suite_args() + ["device=cpu", "+shard=all"]), log=lambda m: None)
    assert sharded["status"] == "ok" and list(sharded["shards"]) == [f"{e}@{L}" for e in ("ppl_books", "passkey",
                                                                                           "niah") for L in LENGTHS]
    want = _metrics(one)
    assert want["ppl_books"]["min_tokens"] == 1024 and want["ppl_books"]["documents"] == 2
    for name, row in (("split", split), ("data-parallel", ranks), ("sharded", sharded)):
        assert row["status"] == "ok", name
        assert _metrics(row) == want, name
        assert row["eval_versions"] == one["eval_versions"], name
    base = _records([one["run_dir"]])
    docs = {(r["length"], r["doc_name"], r["begin"], r["end"]) for r in base["ppl_yarn.jsonl"]}
    assert len(docs) == 2 * len(LENGTHS)
    shard_dirs = [Path(sharded["run_dir"]) / "shards" / s for s in sharded["shards"]]
    for name, got in (("split", _records([split["run_dir"]])), ("data-parallel", _records([ranks["run_dir"]])),
                      ("sharded", _records(shard_dirs))):
        assert got == base, name
    ranks_done = [json.loads((Path(ranks["run_dir"]) / "eval_job" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["items_computed"] > 0 for r in ranks_done)  # both ranks did part of the work
