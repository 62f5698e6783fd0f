"""A configuration's hash (the row's ``config_hash``: what ``make study`` skips on, a sharded run's id) names what a
run measures, not where it ran: the execution settings added for GPUs keep every recorded row matched."""
from __future__ import annotations

from harness.results import config_hash
from tests.conftest import ROOT


def test_execution_settings_are_not_part_of_the_hash():
    cfg = {"model": {"name": "m"}, "seed": 0}
    assert config_hash(cfg) == config_hash({**cfg, "device": "cuda:3", "eval_world_size": 8})
    assert config_hash(cfg) != config_hash({**cfg, "seed": 1})
    data = {**cfg, "data": {"name": "local_mix", "seed": 0}}
    assert config_hash(data) == config_hash({**data, "data": {**data["data"], "max_tokens": 5, "scale": "cpu"}})
    assert config_hash(data) != config_hash({**data, "data": {**data["data"], "seed": 1}})


def test_the_committed_tiny_study_rows_still_match_their_points(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("HARNESS_RESULTS_DIR", raising=False)
    from controlled_study import study
    jobs, _ = study.plan(["experiment=tiny_study"])
    # matched by hash: done, or (a fine-tuned point measured by an older convergence gate) to run again for the gate
    assert jobs and all(j["done"] or j["old_gate"] for j in jobs), [j["label"] for j in jobs
                                                                    if not (j["done"] or j["old_gate"])]


# what leaves the hash (placement and bookkeeping), key by key, for the default run's composed config: a setting added
# to the config lands in the hash unless it is listed here and in harness.results.NOT_IN_CONFIG_HASH
OUT_OF_THE_HASH = {"device", "eval_world_size", "paths.results_dir", "paths.output_dir", "paths.ckpt_dir",
                   "paths.cache_dir", "paths.eval_root", "logger.name", "logger.mode", "logger.project", "logger.group",
                   "data.cache_dir", "data.max_tokens", "data.scale", "data.larger", "train.save_every",
                   "train.log_every", "train.keep_checkpoints", "train.nodes", "method.facts", "cost.limit_s"}


def _leaves(cfg: dict) -> list[str]:
    """Top-level keys and the keys of each group (one level down): what a command line sets."""
    return [f"{k}.{kk}" if isinstance(v, dict) else k for k, v in cfg.items()
            for kk in (v if isinstance(v, dict) else [None])]


def _set(cfg: dict, key: str, value) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items()}
    g, _, k = key.partition(".")
    if k:
        out[g][k] = value
    else:
        out[g] = value
    return out


def test_what_is_in_and_out_of_the_hash(monkeypatch):
    """Every key of the composed config, changed one at a time: exactly the placement and bookkeeping keys leave
    the hash (paths: moving HARNESS_CKPT_DIR re-ran a whole study), everything that decides a result is in."""
    from omegaconf import OmegaConf

    from harness.conf_utils import compose

    for var in ("HARNESS_RESULTS_DIR", "HARNESS_OUTPUT_DIR", "HARNESS_CKPT_DIR", "HARNESS_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    cfg = OmegaConf.to_container(compose(["logger=wandb"]), resolve=True)
    h = config_hash(cfg)
    out = {k for k in _leaves(cfg) if config_hash(_set(cfg, k, "__changed__")) == h}
    assert out == {k for k in OUT_OF_THE_HASH if k in _leaves(cfg)}, sorted(out ^ OUT_OF_THE_HASH)
    for k in ("seed", "autocast", "method.scale", "train.lr", "train.seed", "data.seed", "eval.lengths",
              "model.native_ctx", "model.path", "eval_batch_tokens", "attention.backend"):
        assert k in _leaves(cfg) and k not in out, k
    monkeypatch.setenv("HARNESS_CKPT_DIR", "/somewhere/else")
    monkeypatch.setenv("HARNESS_OUTPUT_DIR", "/scratch/out")
    assert config_hash(OmegaConf.to_container(compose(["logger=wandb"]), resolve=True)) == h


def test_a_rows_hash_is_recomputed_from_its_config_on_read(tmp_path):
    """Committed rows keep their recorded hash (the older rule) and are matched by the recomputed one; a hand-edited
    ``config_hash`` no longer marks a point done."""
    import json

    from harness.results import LEGACY_NOT_IN_CONFIG_HASH, NOT_IN_CONFIG_HASH, read_rows_in, row_hash

    committed = sorted((ROOT / "results").glob("*/runs/*.json"))  # every committed study's rows
    rules = (LEGACY_NOT_IN_CONFIG_HASH, NOT_IN_CONFIG_HASH)  # rows written before the current rule, and since
    for p in committed:  # every committed row's recorded hash is its config's under the rule it was written with
        row = json.loads(p.read_text())
        if isinstance(row.get("config"), dict) and row["config"]:
            assert row["config_hash"] in {config_hash(row["config"], rule) for rule in rules}, p.name
    row = json.loads(committed[-1].read_text())
    good = row_hash(row)
    (tmp_path / "a.json").write_text(json.dumps(row))
    (tmp_path / "b.json").write_text(json.dumps({**row, "run_id": "b", "config_hash": "0123456789abcdef"}))
    got = {r["run_id"]: r["config_hash"] for r in read_rows_in(tmp_path)}
    assert set(got.values()) == {good}
