"""Sharded evaluation: one run's evaluation split into (suite entry x length) shards that run as separate jobs and
merge into the run's single results row; a rerun skips the shards already finished.

    python run.py experiment=paper_llama2 point=paper_llama2/ntk_32k +shard=train          # fine-tune once
    python run.py -m experiment=paper_llama2 point=paper_llama2/ntk_32k \\
        +shard=ppl_pg19@65536,niah@65536,ruler@32768,ruler@65536 hydra/launcher=slurm_a100   # shards in parallel
    python run.py experiment=tiny_study point=tiny_study/pi +shard=all          # everything missing, in order
    python -m harness.shards plan experiment=paper_llama2 point=paper_llama2/ntk_32k       # list the shards

How it fits together:

- Identity. Every job of a sharded run composes the same config except ``shard``, so the run id is derived from that
  config: ``sh-<config_hash>`` (``run_id``). All its jobs share ``<paths.output_dir>/sharded/<run_id>/`` (the row's
  ``run_dir``: ``run.json``, ``checkpoint/`` of the fine-tune, ``shards/<entry>@<L>.json`` results and
  ``shards/<entry>@<L>/samples/`` per-sample records) and the one row ``<results_dir>/runs/<run_id>.json``.
  Rerunning the same command therefore finds the same row; to start over, delete that directory and row.
- Shards (``plan``): ``train`` when the train config is enabled, then for every suite entry one shard per evaluation
  length (``<entry>@<L>``: the entry's ``lengths`` replaced by ``[L]``) for an evaluator that declares ``by_length``
  (its lengths computed independently: ppl, passkey, RULER, NIAH without its own ``context_lengths`` grid), or one
  shard ``<entry>`` (LongBench, many-shot, NLL by position, ...).
  ``+shard=`` takes one name, ``all`` (every missing shard, in plan order, in this job) or ``train``.
- A shard is finished when ``shards/<name>.json`` (``train``: ``checkpoint/`` with ``train_info.json``) exists with
  status ``ok``. Each result file is written atomically (temp file + rename) *before* the row is updated, so the shard
  files are the source of truth: a merge rebuilds the row's metrics from all of them.
- Merge: ``harness.lifecycle.merge`` (the row's one owner) locks the row, reads it, and this module rebuilds
  ``metrics`` (per entry, the deep union of its shards' outputs, in length order: ``{"accuracy": {"256": ..}} +
  {"accuracy": {"512": ..}}``), timings and each shard's status from the files; the lifecycle's rule then settles
  the row: ``ok`` when every planned shard is, ``failed`` (with the shard's one-line error) when one failed in its
  latest attempt, ``running`` otherwise.
- A shard's output equals the unsharded evaluator's output restricted to its length when the evaluator treats
  lengths independently (seeds per length); ``min_tokens: 0`` (ppl, yarn protocol: documents as long as the largest
  length) is pinned to the entry's largest length so every shard scores the same documents (its ``Spec.pins``; the
  longlora protocol has no filter: every shard scores the same first documents anyway).
- An evaluation shard of a fine-tuned run loads the fine-tuned weights from ``checkpoint/`` (written by the ``train``
  shard); it fails with a one-line message if the run was not trained yet.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from harness import lifecycle, pipeline, results
from harness.conf_utils import compose
from harness.config import ConfigError

SHARD_KEY = "shard"


@dataclass(frozen=True)
class Shard:
    name: str  # "train" | "<entry>@<L>" | "<entry>"
    entry: str | None = None
    length: int | None = None


def plain_config(cfg) -> dict:
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop(SHARD_KEY, None)
    return plain


def run_id(cfg) -> str:
    """The sharded run's id: a hash of the resolved config without ``shard`` (every job of the run agrees on it)."""
    return "sh-" + results.config_hash(plain_config(cfg))


def run_dir(cfg) -> Path:
    return Path(cfg.paths.output_dir) / "sharded" / run_id(cfg)


def train_enabled(cfg) -> bool:
    return bool((cfg.get("train") or {}).get("enabled", False))


def plan(cfg, suite: pipeline.Suite | None = None) -> list[Shard]:
    """Every shard of the run, in execution order (``suite``: the run's, when already built)."""
    out = [Shard("train")] if train_enabled(cfg) else []
    if suite is None:
        suite = pipeline.Suite.of(cfg)
    for (entry, node), ev in zip(suite.nodes.items(), suite.evaluators):
        # an evaluator that computes its lengths independently says so (``by_length``): one shard per length
        lengths = (node or {}).get("lengths") if ev.spec.splits(ev.args) else None
        if lengths:
            out += [Shard(f"{entry}@{int(L)}", entry, int(L)) for L in lengths]
        else:
            out.append(Shard(entry, entry, None))
    return out


def select(cfg, spec: str, shards: list[Shard] | None = None) -> list[Shard]:
    """The shards ``spec`` names: ``all`` or one shard of the plan (``shards``: the plan, when already made)."""
    shards = plan(cfg) if shards is None else shards
    if spec == "all":
        return shards
    found = [s for s in shards if s.name == spec]
    if not found:
        raise ConfigError(f"shard {spec!r} is not in this run's plan (have: all, {', '.join(s.name for s in shards)})")
    return found


# ------------------------------------------------------------------------------------------------------ files
def shard_file(rdir: Path, name: str) -> Path:
    return Path(rdir) / "shards" / f"{name}.json"


def read_json(p: Path) -> dict | None:
    try:
        return json.loads(Path(p).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_done(rdir: Path, shard: Shard) -> bool:
    if shard.name == "train":
        info = read_json(Path(rdir) / "checkpoint" / "train_info.json")
        return info is not None
    rec = read_json(shard_file(rdir, shard.name))
    return bool(rec) and rec.get("status") == "ok"


deep_merge = pipeline.merge_outputs  # union of two evaluator outputs: dicts key by key, anything else: b wins


# ------------------------------------------------------------------------------------------------------ the row
def merge(cfg, rdir: Path | None = None, shards: list[Shard] | None = None) -> dict:
    """Rebuild the row from the shard files (``harness.lifecycle.merge``: atomic, under the row's lock) and return
    it (``shards``: the plan, when already made)."""
    rdir = Path(rdir or run_dir(cfg))
    shards = plan(cfg) if shards is None else shards
    rid = run_id(cfg)

    def fresh() -> dict:
        return {**results.new_row(rid, plain_config(cfg), None, rdir), "shards": {}}

    def rebuild(row: dict) -> tuple[dict, list[str]]:
        metrics, timings, status, errors, versions = {}, dict(row.get("timings") or {}), {}, [], {}
        for s in shards:
            if s.name == "train":
                info = read_json(rdir / "checkpoint" / "train_info.json")
                status[s.name] = "ok" if info is not None else "missing"
                if info is not None:
                    row["train_info"] = info
                    timings["train"] = info.get("train_seconds")
                continue
            rec = read_json(shard_file(rdir, s.name))
            if not rec:
                status[s.name] = "missing"
                continue
            status[s.name] = rec["status"]
            if rec["status"] == "ok":
                metrics[s.entry] = deep_merge(metrics.get(s.entry, {}), rec["result"])
                if rec.get("eval_version") is not None:
                    versions[s.entry] = rec["eval_version"]
                timings[f"eval.{s.name}"] = rec.get("seconds")
                if rec.get("method_params") is not None:
                    row["method_params"] = rec["method_params"]
            else:
                errors.append(f"shard {s.name}: {rec.get('error')}")
        row["metrics"], row["timings"], row["shards"] = metrics, timings, status
        row["eval_versions"] = versions
        return status, errors

    return lifecycle.merge(lifecycle.results_dir(cfg), rid, fresh, rebuild)


# ------------------------------------------------------------------------------------------------------ running
def _record(rdir: Path, shard: Shard, **fields) -> None:
    rec = {"shard": shard.name, "entry": shard.entry, "length": shard.length, "pid": os.getpid(),
           "host": socket.gethostname(), "time_end": results.now_iso(), **fields}
    results.atomic_write_json(shard_file(rdir, shard.name), rec)


def _train(cfg, rdir: Path, log, setup: pipeline.Setup) -> None:
    # as run.py: with train, the convergence gate's baseline
    handle = pipeline.load_and_extend(cfg, setup.method, setup.train, suite=setup.suite)
    info = pipeline.finetune(cfg, handle, setup.method, setup.train, rdir)
    results.atomic_write_json(rdir / "checkpoint" / "train_info.json", info)  # last: marks the shard finished
    log(f"shard train: done ({info.get('steps')} steps)")


def _load(cfg, rdir: Path, setup: pipeline.Setup | None = None):
    """The model to evaluate: the base model, or the run's fine-tuned checkpoint, with the method applied
    (``setup``: the run's checked groups, when already made)."""
    setup = setup or pipeline.setup(cfg)
    if train_enabled(cfg):
        ckpt = rdir / "checkpoint"
        if not (ckpt / "train_info.json").exists():
            raise RuntimeError(f"run {rdir.name} is not fine-tuned yet: run its +shard=train (or +shard=all) first")
        cfg = copy.deepcopy(cfg)
        cfg.model.path = str(ckpt)
    return pipeline.load_and_extend(cfg, setup.method, suite=setup.suite), setup.method


def shard_suite(suite: pipeline.Suite, shard: Shard) -> pipeline.Suite:
    """The one-entry suite a shard evaluates, a view of the run's built ``suite`` (``Suite.only``): the entry with
    its ``lengths`` replaced by ``[shard.length]`` and what its evaluator says a one-length shard keeps of the whole
    entry (``Spec.shard``: PPL's yarn protocol, the document filter of the entry's largest length)."""
    if shard.length is None:
        return suite.only(shard.entry)
    ev = suite.evaluators[list(suite.nodes).index(shard.entry)]
    return suite.only(shard.entry, **ev.spec.shard(ev.args, shard.length))


def _evaluate(cfg, rdir: Path, shard: Shard, handle, method, suite: pipeline.Suite) -> tuple[dict, int]:
    """The pipeline's evaluation stage on the shard's one-entry view of the run's ``suite`` (per-sample records
    under the shard): (output, evaluator version)."""
    ((_, out, _, version),) = pipeline.evaluations(cfg, handle, method, rdir / "shards" / shard.name,
                                                   shard_suite(suite, shard))
    return out, version


def run(cfg, log=print) -> dict:
    """Run the shards named by ``cfg.shard`` that are not finished yet; returns the merged row. Raises when a shard
    fails (after recording it, so the row says which one and why). The suite is built once per process: for the plan
    and the merges, checked with the run's other groups (``pipeline.setup``) for the shards it runs, and viewed one
    entry and length at a time by each evaluation shard (``shard_suite``). The evaluation shards after a fine-tune
    get a fresh method: the tuned one may have changed, e.g. LongRoPE's recovered factors."""
    spec = str(cfg[SHARD_KEY])
    rdir = run_dir(cfg)
    rdir.mkdir(parents=True, exist_ok=True)
    suite = pipeline.Suite.of(cfg)
    shards = plan(cfg, suite)
    row = merge(cfg, rdir, shards)  # the row exists (status running) from the first job on
    if not (rdir / "run.json").exists():
        lifecycle.write_run_file(rdir, row)
    chosen = select(cfg, spec, shards)
    todo = [s for s in chosen if not is_done(rdir, s)]
    skipped = [s.name for s in chosen if s not in todo]
    if skipped:
        log(f"shards already finished, skipped: {', '.join(skipped)}")
    failure = None
    setup = loaded = None
    for s in todo:
        t0 = time.time()
        try:
            setup = setup or pipeline.setup(cfg, suite=suite)  # inside the try: a bad group is this shard's failure
            if s.name == "train":
                _train(cfg, rdir, log, setup)
                setup = loaded = None
            else:
                if loaded is None:
                    loaded = _load(cfg, rdir, setup)
                out, version = _evaluate(cfg, rdir, s, *loaded, suite)
                _record(rdir, s, status="ok", result=out, seconds=round(time.time() - t0, 2),
                        method_params=loaded[1].params(), eval_version=version)
                log(f"shard {s.name}: done in {time.time() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001 - a failed shard is recorded, the others still run
            failure = failure or e
            if s.name != "train":
                _record(rdir, s, status="failed", error=lifecycle.one_line(e), seconds=round(time.time() - t0, 2))
            else:
                (rdir / "train_error.log").write_text(lifecycle.one_line(e) + "\n")
            log(f"shard {s.name}: failed: {lifecycle.one_line(e)}")
            if s.name == "train":
                break  # nothing to evaluate
        merge(cfg, rdir, shards)
    row = merge(cfg, rdir, shards)
    if failure is not None:
        raise failure
    return row


def main(argv: list[str]) -> int:
    """``python -m harness.shards plan <overrides>``: print the run id, its directory and every shard's state."""
    if not argv or argv[0] != "plan":
        print(__doc__.split("\n\n")[1])
        return 2
    cfg = compose([a for a in argv[1:] if not a.startswith("+shard")])
    rdir = run_dir(cfg)
    print(f"run {run_id(cfg)}  dir {rdir}")
    shards = plan(cfg)
    for s in shards:
        print(f"  {s.name:30s} {'done' if is_done(rdir, s) else 'missing'}")
    missing = [s.name for s in shards if not is_done(rdir, s)]
    if missing:
        ev = [m for m in missing if m != "train"]
        print("\nto run the missing evaluation shards as parallel jobs:\n  python run.py -m "
              + " ".join(argv[1:]) + " +shard=" + ",".join(ev))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
