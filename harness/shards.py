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
- Shards (``plan``): ``train`` when the train config is enabled, then the units of the run's evaluation plan cut one
  per length (``harness.evals.suite.plan(suite, by_length=True)``, the one place a suite is cut): ``<entry>@<L>`` (the
  entry's ``lengths`` replaced by ``[L]``) for an evaluator that declares ``by_length`` (its lengths computed
  independently: ppl, passkey, RULER, NIAH without its own ``context_lengths`` grid), or one shard ``<entry>``
  (LongBench, many-shot, NLL by position, ...). The names never depend on the node's GPUs.
  ``+shard=`` takes one name, ``all`` (every missing shard, in plan order, in this job) or ``train``.
- A sharded job is a run restricted to some units: the stages of ``harness.api.run`` (setup, cost, load + method,
  fine-tune, evaluate), recording into a :class:`ShardRun` instead of a ``harness.lifecycle.Run``.
- A shard is finished when ``shards/<name>.json`` (``train``: ``checkpoint/`` with ``train_info.json``) exists with
  status ``ok``. Each result file is written atomically (temp file + rename) *before* the row is updated, so the shard
  files are the source of truth: a merge rebuilds the row's metrics from all of them.
- Merge: ``harness.lifecycle.merge`` (the row's one owner) locks the row, reads it, and this module rebuilds
  ``metrics`` (per entry, the deep union of its shards' outputs, in length order: ``{"accuracy": {"256": ..}} +
  {"accuracy": {"512": ..}}``), timings and each shard's status from the files; the lifecycle's rule then settles
  the row: ``ok`` when every planned shard is, ``failed`` (with the shard's one-line error) when one failed in its
  latest attempt, ``running`` otherwise.
- A shard's output equals the unsharded evaluator's output restricted to its length when the evaluator treats
  lengths independently (seeds per length); what a one-length part keeps of the whole entry is the evaluator's
  ``Spec.pins``, applied by the plan (``Spec.view``): ``min_tokens: 0`` (ppl, yarn protocol: documents as long as the
  largest length) is pinned to the entry's largest length so every shard scores the same documents (the longlora
  protocol has no filter: every shard scores the same first documents anyway).
- An evaluation shard of a fine-tuned run loads the fine-tuned weights from ``checkpoint/`` (written by the ``train``
  shard); it fails with a one-line message if the run was not trained yet.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from harness import api, lifecycle, results
from harness.conf_utils import compose
from harness.config import ConfigError
from harness.evals.suite import Suite, merge_outputs
from harness.evals.suite import plan as plan_units

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


def plan(cfg, suite: Suite | None = None) -> list[Shard]:
    """Every shard of the run, in execution order (``suite``: the run's, when already built): ``train``, then the
    units of the evaluation plan cut one per length (``harness.evals.suite.plan`` with ``by_length``; never by this
    node's GPUs, so every job of the run agrees on the names)."""
    out = [Shard("train")] if train_enabled(cfg) else []
    if suite is None:
        suite = Suite.of(cfg)
    for u in plan_units(suite, by_length=True):
        out.append(Shard(u.name, u.entry, u.lengths[0] if u.lengths else None))
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


deep_merge = merge_outputs  # union of two evaluator outputs: dicts key by key, anything else: b wins


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


class ShardRun:
    """What a sharded job's stages record into, in place of a ``harness.lifecycle.Run`` (``harness.api.run`` calls
    the same methods): the fine-tune's ``train_info`` marks the ``train`` shard finished
    (``checkpoint/train_info.json``), each evaluated unit becomes its shard's file (``shards/<name>.json``, per-sample
    records under ``shards/<name>/``), a failed unit its shard's failure, and the row is merged after each."""

    def __init__(self, cfg, rdir: Path, shards: list[Shard], log=print):
        self.cfg, self.rdir, self.shards, self.log = cfg, Path(rdir), shards, log
        self.by_name = {s.name: s for s in shards}
        self.fields: dict = {}
        self.recorded: set = set()  # the shards this job recorded (ok or failed)
        self.row = merge(cfg, rdir, shards)

    def _merge(self) -> None:
        self.row = merge(self.cfg, self.rdir, self.shards)

    def record(self, **fields) -> None:
        self.fields.update({k: v for k, v in fields.items() if v is not None})
        if fields.get("train_info") is not None:  # last: marks the train shard finished
            results.atomic_write_json(self.rdir / "checkpoint" / "train_info.json", fields["train_info"])
            self.log(f"shard train: done ({fields['train_info'].get('steps')} steps)")
            self._merge()

    def record_unit(self, unit, output: dict, seconds: float, version: int) -> None:
        self.recorded.add(unit.name)
        _record(self.rdir, self.by_name[unit.name], status="ok", result=output, seconds=seconds,
                method_params=self.fields.get("method_params"), eval_version=version)
        self.log(f"shard {unit.name}: done in {seconds:.1f} s")
        self._merge()

    def unit_failed(self, unit, error: BaseException) -> bool:
        self.failed(self.by_name[unit.name], error)
        return True  # the job's other shards still run

    def failed(self, shard: Shard, error: BaseException) -> None:
        self.recorded.add(shard.name)
        if shard.name == "train":
            (self.rdir / "train_error.log").write_text(lifecycle.one_line(error) + "\n")
        else:
            _record(self.rdir, shard, status="failed", error=lifecycle.one_line(error))
        self.log(f"shard {shard.name}: failed: {lifecycle.one_line(error)}")
        self._merge()

    def samples_dir(self, unit) -> Path:
        return self.rdir / "shards" / unit.name


def evaluation_config(cfg, rdir: Path):
    """The config an evaluation shard's stages run: the run's fine-tuned checkpoint as the model (written by the
    ``train`` shard) and no fine-tune; the run's own config otherwise."""
    if not train_enabled(cfg):
        return cfg
    ckpt = rdir / "checkpoint"
    if not (ckpt / "train_info.json").exists():
        raise RuntimeError(f"run {rdir.name} is not fine-tuned yet: run its +shard=train (or +shard=all) first")
    cfg = copy.deepcopy(cfg)
    cfg.model.path = str(ckpt)
    cfg.train.enabled = False
    return cfg


def run(cfg, log=print) -> dict:
    """Run the shards named by ``cfg.shard`` that are not finished yet; returns the merged row. Raises when a shard
    fails (after recording it, so the row says which one and why). A sharded job is a run restricted to some units:
    its stages are ``harness.api.run``'s, called once for the ``train`` shard (no unit) and once for the evaluation
    shards it runs (the units of those names, on the fine-tuned checkpoint with a fresh method: the tuned one may
    have changed, e.g. LongRoPE's recovered factors), recording into a :class:`ShardRun`."""
    spec = str(cfg[SHARD_KEY])
    rdir = run_dir(cfg)
    rdir.mkdir(parents=True, exist_ok=True)
    suite = Suite.of(cfg)  # built once: the plan, and the stages of every shard this job runs
    shards = plan(cfg, suite)
    rec = ShardRun(cfg, rdir, shards, log)  # the row exists (status running) from the first job on
    if not (rdir / "run.json").exists():
        lifecycle.write_run_file(rdir, rec.row)
    chosen = select(cfg, spec, shards)
    todo = [s for s in chosen if not is_done(rdir, s)]
    skipped = [s.name for s in chosen if s not in todo]
    if skipped:
        log(f"shards already finished, skipped: {', '.join(skipped)}")
    failure = None
    if any(s.name == "train" for s in todo):
        try:
            api.run(cfg, rec, names=(), suite=suite)
        except Exception as e:  # recorded; nothing to evaluate
            rec.failed(Shard("train"), e)
            raise
    names = [s.name for s in todo if s.name != "train"]
    if names:
        try:
            api.run(evaluation_config(cfg, rdir), rec, names=names, suite=suite)
        except Exception as e:  # noqa: BLE001 - a unit's failure is already recorded; a failure before any unit:
            failure = e  # each shard's
            for s in todo:
                if s.name != "train" and s.name not in rec.recorded:
                    rec.failed(s, e)
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
