"""Issue 32, item 5: the dress rehearsal of the paper sweep on CPU. The command a researcher types on a login node,
``python run.py -m experiment=paper_llama2``, runs for real with only size knobs overridden, through submitit's
local executor (``hydra/launcher=submitit_local``, hydra-submitit-launcher's), on data the real prepare scripts
write from fixture files in the official formats, and ends in rows and ``make tables``.

Two sweep points cover the paths: ``paper_llama2/base`` (frozen) and ``paper_llama2/ntk_32k`` (fine-tuned with the
paper's recipe: DeepSpeed ZeRO-3 on 2 gloo ranks, EMA, the SlimPajama mixture). Everything else is the
experiment's own: its model config (``model=llama2_7b`` with a tiny hub folder in place of the weights), its data
(``data=slimpajama_upsampled``), its recipe (``train=paper``), its suite (``eval=paper`` + LongBench + many-shot
TREC) and its launcher path. The size knobs (``SIZE_KNOBS``), each with why it is a size and not a behaviour:

- ``model.path`` / ``model.native_ctx``: the tiny Llama (``harness/assets/tiny_llama``, copied as a hub folder)
  instead of LLaMA2-7B; C = 512 stands for 4096, so the paper's lengths scale by 1/8 (8C = 4096 tokens);
- ``train.seq_len=1024``, ``train.tokens=8192``, ``train.global_batch=2``, ``train.world_size=2``: 4 optimizer steps
  of 2 sequences on 2 ranks (micro batch 1, no accumulation) instead of 953 steps of 32 on 8 GPUs;
  ``train.warmup_steps=1`` and ``train.save_every=2`` fit the warm-up and the resumable saves into those 4 steps;
  ``train.keep_checkpoints=true`` keeps the saves after the run so the test can see where they went (retention
  only). The ``++`` form because the frozen point's ``train=none`` has none of these keys (they change nothing
  there: it trains nothing);
- evaluation lengths: ``eval.lengths=[512,1024]`` (C and 2C, for the paper's 4k..64k), the PPL grids the same
  (for 2k..64k), NLL by position at 1024 tokens in 8 buckets (for 32k in 64), NIAH on a 2 x 2 grid at 512..1024
  (for LCEG's 40 x 10 at 1k..128k), LongBench and many-shot TREC at a 512-token budget (for 32k);
- sample counts and generation caps: passkey 2 prompts per length (50), RULER 1 sample per task and length (500)
  and 8 new tokens, NIAH 8 new tokens (50), LongBench 1 sample per task with at most 8 new tokens, many-shot TREC 1
  test item per shot count with 8 new tokens;
- the prepare scripts: ``--proofpile-docs 2 --proofpile-min-tokens 1024`` (LongLoRA's 128 documents of 32k tokens;
  the fixture has 2 long ones);
- dtype: none where the CPU has native bf16 (the paper's bf16 weights and autocast run as they are); on a CPU
  without it (bf16 there is ~100x slower, ``harness.device.fast_bf16_cpu``) float32 weights, training and
  evaluation autocast (``model.dtype``, ``train.autocast``, ``autocast``).

Which check catches which break of the issue:
- the paper's data not composed (``override /data: slimpajama_upsampled`` removed from the experiment; tried by
  hand): the sweep still runs, since the rehearsal's 8,192 tokens are within the CPU mixture's ``max_tokens``, and
  ``test_the_fine_tuned_row_trained_on_the_prepared_shards`` fails on ``data == local_mix``; at the paper's budget
  the point is refused in one line, so ``test_multi_node_and_the_cpu_mixture_are_refused_in_one_line`` fails too;
- checkpoints back in the checkout (``paths.ckpt_dir: outputs/ckpt``, the environment ignored; tried by hand):
  ``test_checkpoints_went_to_the_scratch_directory``;
- the multi-node suggestion or checkpoints without scratch under the Slurm launcher:
  ``test_multi_node_and_the_cpu_mixture_are_refused_in_one_line``;
- ``zstandard`` not installed: the prepare script's estimate and the data build cannot read the shards (the
  fixture); an evaluation file the prepare script does not write: the job's validation refuses the suite and its
  row fails (``test_the_sweep_ends_in_one_ok_row_per_point``) or the entry falls back
  (``test_every_paper_suite_entry_read_the_prepared_files``); the EMA share not recorded:
  ``test_the_fine_tuned_row_trained_on_the_prepared_shards``. (These by reading the code, not tried.)
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from tests import forkrun

pytestmark = pytest.mark.integration

POINTS = {"paper_llama2/base": "base", "paper_llama2/ntk_32k": "ntk_32k"}  # sweep point -> the row's method
C, LENGTHS = 512, "[512,1024]"  # the tiny model's window; the evaluated lengths, C and 2C
SIZE_KNOBS = [
    f"model.native_ctx={C}",
    "++train.seq_len=1024", "++train.tokens=8192", "++train.global_batch=2", "++train.world_size=2",
    "++train.warmup_steps=1", "++train.save_every=2", "++train.keep_checkpoints=true",
    f"eval.lengths={LENGTHS}", f"eval.suite.ppl_pg19.lengths={LENGTHS}", f"eval.suite.ppl_proofpile.lengths={LENGTHS}",
    "eval.suite.nll_by_position.length=1024", "eval.suite.nll_by_position.buckets=8",
    "eval.suite.passkey.samples=2",
    "eval.suite.niah.context_lengths=[512,1024,2]", "eval.suite.niah.depth_intervals=2", "eval.suite.niah.gen_tokens=8",
    "eval.suite.ruler.samples=1", "eval.suite.ruler.max_new_tokens=8",
    "eval.suite.longbench.lengths=[512]", "eval.suite.longbench.max_length=512", "eval.suite.longbench.samples=1",
    "eval.suite.longbench.max_gen_cap=8",
    "eval.suite.manyshot_trec.lengths=[512]", "eval.suite.manyshot_trec.max_length=512",
    "eval.suite.manyshot_trec.samples=1", "eval.suite.manyshot_trec.max_gen=8",
]
FLOAT32 = ["model.dtype=float32", "++train.autocast=float32", "autocast=float32"]  # CPUs without native bf16
SWEEP_TIMEOUT_S = 900


def _script(env: dict, *args: str, timeout: int = 300) -> str:
    """Run a repository script as a researcher would (``python scripts/...``); its output, or the test fails with
    its tail."""
    out = forkrun.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args[0]} exited {out.returncode}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
    return out.stdout


def _dirs_in(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()} if path.is_dir() else set()


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """Prepare the data with the real scripts, run the sweep, run ``make tables``; what each produced."""
    from harness.device import fast_bf16_cpu
    from tests.fixtures.eval_sources import make_eval_sources
    from tests.fixtures.slimpajama_shards import make_shards

    tmp = tmp_path_factory.mktemp("rehearsal")
    model = tmp / "hub" / "tiny_llama"
    shutil.copytree(ROOT / "harness" / "assets" / "tiny_llama", model)  # a hub folder, as a downloaded model is
    env = dict(os.environ, HARNESS_DATA_ROOT=str(tmp / "data"), HARNESS_EVAL_ROOT=str(tmp / "evals"),
               HARNESS_RESULTS_DIR=str(tmp / "results"), HARNESS_OUTPUT_DIR=str(tmp / "outputs"),
               HARNESS_CKPT_DIR=str(tmp / "scratch" / "ckpt"), HARNESS_CACHE_DIR=str(tmp / "cache"),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline",
               PYTHONPATH=str(ROOT))
    for k in [k for k in env if k.startswith("HARNESS_") and k not in ("HARNESS_DATA_ROOT", "HARNESS_EVAL_ROOT",
              "HARNESS_RESULTS_DIR", "HARNESS_OUTPUT_DIR", "HARNESS_CKPT_DIR", "HARNESS_CACHE_DIR")]:
        del env[k]  # a HARNESS_PG19_BIN etc. of the caller's shell would bypass the prepared files

    t0 = time.time()
    shards = make_shards(tmp / "src" / "slimpajama")
    _script(env, "scripts/prepare_cluster_data.py", "--root", str(tmp / "data"), "--only", "slimpajama",
            "--source-dir", str(shards))
    sources = make_eval_sources(tmp / "src" / "evals", scale=3)  # books of ~1,300 tokens: windows of 2C fit
    _script(env, "scripts/prepare_eval_data.py", "--out", str(tmp / "evals"), "--only", "paper", "--source-dir",
            str(sources), "--tokenizer", str(model), "--proofpile-docs", "2", "--proofpile-min-tokens", "1024")
    checkout_ckpts = _dirs_in(ROOT / "outputs" / "ckpt")
    knobs = [f"model.path={model}", *SIZE_KNOBS, *([] if fast_bf16_cpu() else FLOAT32)]
    sweep = forkrun.run([sys.executable, "run.py", "-m", "experiment=paper_llama2", "hydra/launcher=submitit_local",
                            f"point={','.join(POINTS)}", *knobs],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S)
    rows = [json.loads(f.read_text()) for f in sorted((tmp / "results" / "paper_llama2" / "runs").glob("*.json"))]
    tables = None
    if sweep.returncode == 0:
        _script(env, "scripts/make_tables.py", "--study", "paper_llama2", "--tables", str(tmp / "tables"),
                "--figures", str(tmp / "figures"))
        tables = {p.name: p.read_text() for p in (tmp / "tables").glob("*.md")}
    print(f"rehearsal: {time.time() - t0:.0f} s (prepare, sweep, tables)")
    return {"tmp": tmp, "env": env, "sweep": sweep, "rows": rows, "tables": tables,
            "new_checkout_ckpts": _dirs_in(ROOT / "outputs" / "ckpt") - checkout_ckpts}


def _row(rehearsal, method: str) -> dict:
    rows = [r for r in rehearsal["rows"] if r["method"] == method]
    assert len(rows) == 1, [(r["method"], r["status"]) for r in rehearsal["rows"]]
    return rows[0]


def test_the_sweep_ends_in_one_ok_row_per_point(rehearsal):
    sweep = rehearsal["sweep"]
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-5000:]
    rows = rehearsal["rows"]
    assert sorted(r["method"] for r in rows) == sorted(POINTS.values())
    for r in rows:
        assert r["status"] == "ok", (r["method"], r["error"])
        assert r["config"]["study"]["experiment"] == "paper_llama2" and r["model"] == "llama2_7b"
        hydra_cfg = (Path(r["run_dir"]) / ".hydra" / "hydra.yaml").read_text()
        assert "submitit_launcher.LocalLauncher" in hydra_cfg  # ran as a submitit job, not in the sweep's process
    base, ntk = _row(rehearsal, "base"), _row(rehearsal, "ntk_32k")
    assert base["train"] == "none" and base["train_info"] is None
    assert ntk["train"] == "paper" and ntk["config"]["train"]["engine"] == "deepspeed"


def test_the_fine_tuned_row_trained_on_the_prepared_shards(rehearsal):
    """The paper's data, not the CPU mixture: the row's data config reads the shards the prepare script linked from
    the fixture files, and the cache the training read says which sources its tokens came from."""
    ntk = _row(rehearsal, "ntk_32k")
    tmp = rehearsal["tmp"]
    assert ntk["data"] == "slimpajama_upsampled"
    assert Path(ntk["config"]["data"]["path"]) == tmp / "data" / "slimpajama"
    manifest = json.loads((tmp / "data" / "MANIFEST.json").read_text())
    assert manifest["slimpajama"]["source_dir"] == str((tmp / "src" / "slimpajama").resolve())
    prepared = sorted((tmp / "data" / "slimpajama").rglob("*.jsonl.zst"))
    assert prepared and all(p.resolve().is_relative_to(tmp / "src" / "slimpajama") for p in prepared)
    built = [json.loads(p.read_text()) for p in (tmp / "cache" / "data").glob("slimpajama_upsampled-*.json")]
    assert len(built) == 1, "one data build for the sweep"
    stats = built[0]["stats"]
    assert built[0]["key"]["args"]["path"] == ntk["config"]["data"]["path"]
    assert set(stats["tokens"]) == set(ntk["config"]["data"]["shares"]) and all(stats["tokens"].values())
    info = ntk["train_info"]
    assert info["world_size"] == 2 and info["zero_stage"] == 3 and info["steps"] == 4
    assert info["tokens_seen"] == 8192
    ema = info["ema"]  # the recipe's EMA and the share of the base model left in the evaluated weights
    assert ema["steps"] == 4 and ema["bias_correction"] is True and ema["base_share"] == 0.0


def test_checkpoints_went_to_the_scratch_directory(rehearsal):
    """``paths.ckpt_dir`` follows ``HARNESS_CKPT_DIR`` (the Slurm launcher's setup line exports it on scratch):
    the resumable saves are there, and nothing of this sweep was written under the checkout's ``outputs/ckpt``."""
    ntk = _row(rehearsal, "ntk_32k")
    scratch = rehearsal["tmp"] / "scratch" / "ckpt"
    assert ntk["config"]["paths"]["ckpt_dir"] == str(scratch)
    saved = [p for p in scratch.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert saved, f"no checkpoint file under {scratch}"
    assert not rehearsal["new_checkout_ckpts"], rehearsal["new_checkout_ckpts"]


def test_every_paper_suite_entry_read_the_prepared_files(rehearsal):
    """Every entry of ``eval=paper`` and of the experiment's extrinsic suite ran and measured something, on the
    files under ``$HARNESS_EVAL_ROOT``, not on a fallback (the shipped Shakespeare, the fixtures in the package)."""
    from harness import conf_utils

    evals = rehearsal["tmp"] / "evals"
    suite = conf_utils.compose(["experiment=paper_llama2", "point=paper_llama2/ntk_32k"]).eval.suite
    for method in POINTS.values():
        r = _row(rehearsal, method)
        m, cfg = r["metrics"], r["config"]["eval"]["suite"]
        assert r["config"]["eval"]["name"] == "paper" and set(m) == set(suite) == set(cfg), method
        assert m["ppl_pg19"]["dataset"] == f"bin:{evals / 'pg19' / 'test.bin'}"
        assert m["ppl_proofpile"]["dataset"] == f"bin:{evals / 'proof-pile' / 'test_sampled_data.bin'}"
        for name in ("ppl_pg19", "ppl_proofpile"):
            assert set(m[name]["ppl"]) == {"512", "1024"}, (method, name, m[name].get("skipped"))
        assert cfg["nll_by_position"]["dataset"] == f"dir:{evals / 'pg19' / 'test'}" and m["nll_by_position"]["nll"]
        assert m["niah"]["haystack"] == str(evals / "PaulGrahamEssays") and set(m["niah"]["score"]) == {"512", "1024"}
        assert set(m["passkey"]["accuracy"]) == {"512", "1024"}
        assert cfg["ruler"]["essay_dir"] == str(evals / "PaulGrahamEssays")
        assert cfg["ruler"]["squad_path"] == str(evals / "squad" / "dev-v2.0.json")
        assert cfg["ruler"]["hotpotqa_path"] == str(evals / "hotpotqa" / "hotpot_dev_distractor_v1.json")
        assert not m["ruler"].get("skipped_tasks"), m["ruler"].get("skipped_tasks")  # qa_1 / qa_2 found their files
        assert cfg["longbench"]["data_dir"] == str(evals / "longbench") and len(m["longbench"]["tasks"]) == 16
        assert m["manyshot_trec"]["data"] == str(evals / "manyshot_trec") and m["manyshot_trec"]["accuracy"]


def test_make_tables_lists_the_points(rehearsal):
    """``make tables`` with ``HARNESS_RESULTS_DIR`` set (no ``--results``) reads the sweep's rows: the index counts
    them, and the cost table has a line per point (the base model's row is labelled with the model's name)."""
    tables = rehearsal["tables"]
    assert tables, "make tables wrote no table"
    assert f"{len(POINTS)} rows read: {len(POINTS)} ok" in tables["index.md"], tables["index.md"][:500]
    cost = tables["cost_llama2_7b.md"].splitlines()
    for label in ("llama2_7b", "ntk_32k"):
        assert any(line.startswith(f"| {label} ") for line in cost), (label, cost)


def test_multi_node_and_the_cpu_mixture_are_refused_in_one_line(tmp_path, monkeypatch):
    """The two ways the paper sweep used to go wrong before anything ran: the Slurm launcher's old multi-node
    suggestion (a second node would run the whole point again) and the CPU miniature's data under the paper's
    recipe on LLaMA2-7B. Each is one line; the Slurm launcher puts a point's checkpoints on scratch."""
    from harness import conf_utils, pipeline, precheck, submit
    from harness.config import ConfigError

    point = ["experiment=paper_llama2", "point=paper_llama2/ntk_32k", "hydra/launcher=slurm_a100"]
    with pytest.raises(ConfigError) as e:
        submit.plan_sweep([*point, "hydra.launcher.nodes=2", "train.world_size=16"])
    line = precheck.explain(e.value, point)
    assert "\n" not in line and "hydra.launcher.nodes=2" in line, line
    monkeypatch.delenv("HARNESS_CKPT_DIR", raising=False)
    monkeypatch.setenv("SCRATCH", str(tmp_path))
    planned = submit.plan_sweep(point)
    assert planned["ckpt_dir"] == str(tmp_path / "long-context-harness" / "ckpt")
    cfg = conf_utils.compose(["model=llama2_7b", "method=yarn", "train=paper", "data=local_mix"])
    with pytest.raises(ConfigError) as e:
        pipeline.validate(cfg, data=False)
    line = precheck.explain(e.value, [])
    assert "\n" not in line and "data=local_mix" in line and "slimpajama_upsampled" in line, line
