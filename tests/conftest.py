"""Shared fixtures and the test tiers. Fast tests use small random models built in memory (seeded); tests that need
the shipped ``tiny_llama`` use the ``tiny`` fixture; SmolLM2 tests are marked ``slow``.

Tiers: every collected test gets exactly one of ``unit``, ``integration``, ``slow`` (``pytest_collection_modifyitems``
below). ``slow`` is marked by hand; ``integration`` is a module or test in ``INTEGRATION`` or one marked
``@pytest.mark.integration``; everything else is ``unit``, and a unit test that starts a process or runs the
fine-tuning loop fails (``_no_process``).
"""
from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_file_module(path, name: str | None = None):
    """The module in the file at ``path`` (a script or benchmark, which are not packages), loaded by its path."""
    import importlib.util

    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, os.cpu_count() or 1))


def random_llama(vocab=256, hidden=64, layers=2, heads=4, kv_heads=None, ctx=64, theta=10000.0, head_dim=None,
                 seed=0, **rope):
    """A small random LlamaForCausalLM (float32, eval mode, sdpa) for unit tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads or heads, max_position_embeddings=ctx,
                      rope_parameters={"rope_type": "default", "rope_theta": theta, **rope},
                      head_dim=head_dim or hidden // heads, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def small_llama():
    return random_llama()


@pytest.fixture
def virtual_node(monkeypatch):
    """A CUDA node of two emulated 80 GB GPUs (``tests/virtual_node.py``): ``torch.cuda`` and ``harness.device`` see
    them, and the test enters ``with virtual_node:`` where its tensors live on them."""
    from tests.virtual_node import VirtualNode

    return VirtualNode(gpus=2, capacity=80 * 2**30).install(monkeypatch)


@pytest.fixture(scope="session")
def tiny():
    """The shipped tiny_llama (ModelHandle), loaded once per session."""
    from harness.models import load_model

    return load_model("tiny_llama")


@pytest.fixture
def results_env(tmp_path, monkeypatch):
    """Point rows, run directories, checkpoints and caches at a temporary directory."""
    for k, sub in (("HARNESS_RESULTS_DIR", "results"), ("HARNESS_OUTPUT_DIR", "outputs"),
                   ("HARNESS_CKPT_DIR", "ckpt"), ("HARNESS_CACHE_DIR", "cache")):
        monkeypatch.setenv(k, str(tmp_path / sub))
    return tmp_path


# The integration tier: modules (``test_x.py``) and tests (``test_x.py::test_name``, every parametrised case) that
# start processes (run.py, scripts, torchrun ranks, multiprocessing), run the fine-tuning loop or a pipeline stage,
# or run a whole tool at smoke sizes (bench_gpu --smoke).
# A new test may instead carry ``@pytest.mark.integration``. ``_no_process`` below finds what this list misses.
INTEGRATION = (
    "test_concurrency.py",
    "test_determinism.py",
    "test_e2e.py",
    "test_gpu_check.py",
    "test_pretrain_tiny.py",
    "test_recipe_curves.py",
    "test_robustness.py",
    "test_shards.py",
    "test_study.py",
    "test_bench_gpu.py::test_bench_gpu_smoke_runs_every_section",
    "test_checkpoints.py::test_checkpoint_files_get_the_umask_permissions",
    "test_checkpoints.py::test_concurrent_runs_of_one_config_do_not_corrupt_each_other",
    "test_checkpoints.py::test_corrupt_newest_checkpoint_falls_back_with_warning",
    "test_checkpoints.py::test_finished_run_cleans_up_unless_asked_to_keep",
    "test_checkpoints.py::test_publish_prunes_dead_writers_and_keeps_live_ones",
    "test_data.py::test_prepare_cluster_data_dry_run",
    "test_device.py::test_finetune_feeds_batches_on_the_model_device",
    "test_ema.py::test_resume_keeps_the_ema_update_count",
    "test_eval_parallel.py::test_map_splits_contiguous_blocks_and_every_rank_gets_the_whole_ordered_list",
    "test_eval_parallel.py::test_two_cpu_ranks_write_the_row_of_one_process",
    "test_export.py::test_make_export_writes_csv_and_parquet_and_skips_stray_files",
    "test_findings.py::test_make_findings_script",
    "test_foundation.py::test_bad_input_one_line_and_failed_row",
    "test_foundation.py::test_cfg_job_composes_for_cluster_model",
    "test_foundation.py::test_nan_loss_is_an_error",
    "test_foundation.py::test_train_loop_decreases_loss_and_records_ema",
    "test_hub_checkpoint.py::test_a_missing_or_wrong_path_is_one_line_and_a_row_naming_the_model",
    "test_hub_checkpoint.py::test_run_py_on_a_checkpoint_folder_writes_an_ok_row_that_says_what_ran",
    "test_methods_dca_pose.py::test_pose_one_training_step",
    "test_paper_data.py::test_run_py_refuses_before_anything_loads",
    "test_progress.py::test_every_training_step_reaches_the_tracker",
    "test_search.py::test_longrope_recovery_stage_uses_the_searched_short_factors",
    "test_sweeps.py::test_one_paper_point_prints_the_cluster_data_and_the_paper_suite",
    "test_sweeps.py::test_plain_sbatch_template",
    "test_sweeps.py::test_requeued_job_keeps_its_row",
    "test_sweeps.py::test_slurm_submission_of_paper_llama2",
    "test_tables.py::test_make_tables_script",
    "test_train.py::test_killing_the_parent_of_a_zero3_run_ends_its_ranks_and_resume_is_exact",
    "test_train.py::test_sigkill_mid_run_resumes_to_identical_weights",
    "test_train.py::test_single_engine_does_not_resume_other_config",
    "test_train.py::test_single_engine_trains_with_ema",
    "test_train.py::test_zero3_two_ranks_matches_single_engine_and_loads",
    "test_train_gpu_path.py::test_ranks_agree_on_stopping_when_one_rank_got_the_signal",
    "test_train_gpu_path.py::test_zero3_ranks_save_and_stop_on_slurms_sigterm_then_resume",
    "test_window_units.py::test_a_command_line_that_does_not_compose_leaves_its_row_in_its_own_results_dir",
    "test_window_units.py::test_bad_input_is_one_line_and_a_failed_row",
)
TIERS = ("unit", "integration", "slow")
TIERS_KEY = pytest.StashKey[dict]()  # node id -> its tier names (the fixture ``collected_tiers``)
# A unit test may run these: a results row records the checkout's commit (``harness.results.git_sha``) and the
# machine (``platform.platform()`` asks ``uname -p`` once per process); each takes a few ms.
ALLOWED_PROGRAMS = ("git", "uname")


def _listed(item) -> bool:
    """Whether ``INTEGRATION`` names the item's module or the item (parametrised cases share their test's entry)."""
    module = item.path.name
    return module in INTEGRATION or f"{module}::{item.originalname}" in INTEGRATION


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, so `pytest -m unit` sees the marks
def pytest_collection_modifyitems(config, items):
    """Give every test its tier; keep each test's tier names for ``tests/test_tiers.py``."""
    for item in items:
        names = {m.name for m in item.iter_markers()}
        if not names & {"slow", "integration"}:
            item.add_marker("integration" if _listed(item) else "unit")
    config.stash[TIERS_KEY] = {item.nodeid: sorted({m.name for m in item.iter_markers()} & set(TIERS))
                               for item in items}


@pytest.fixture
def collected_tiers(request) -> dict:
    """Node id -> tier names of every collected test, before ``-m`` deselects (a fixture: ``from tests.conftest``
    imports a second copy of this module, whose ``TIERS_KEY`` is another key)."""
    return request.config.stash[TIERS_KEY]


def _refuse(what: str):
    """Fail the running unit test with one line saying what it did and where it belongs."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "a unit test").rsplit(" ", 1)[0]
    pytest.fail(f"{test}: a unit test {what}; mark it integration (@pytest.mark.integration or INTEGRATION in "
                f"tests/conftest.py)", pytrace=False)


def _no_training(*args, **kwargs):
    """Stands in for ``harness.train.loop.finetune`` during a unit test. Its code object replaces finetune's, so it
    runs with loop.py's globals: hence no closure and its own import."""
    from tests.conftest import _refuse

    _refuse("ran the fine-tuning loop")


@pytest.fixture(autouse=True)
def _no_process(request, monkeypatch):
    """A unit test that starts a process (a program not in ``ALLOWED_PROGRAMS``, multiprocessing, fork, os.system)
    or runs the fine-tuning loop fails with one line naming it: the unit tier stays fast and runs anywhere.
    ``finetune`` is swapped by its code object because tests hold the function itself (``from harness.train.loop
    import finetune``)."""
    if request.node.get_closest_marker("unit") is None:
        return
    from harness.train import loop

    execute_child = subprocess.Popen._execute_child

    def start(self, args, *rest, **kwargs):
        first = args if isinstance(args, (str, bytes, os.PathLike)) else args[0]
        if Path(os.fsdecode(first)).name not in ALLOWED_PROGRAMS:
            _refuse(f"started a process ({os.fsdecode(first)})")
        return execute_child(self, args, *rest, **kwargs)

    def refuse(*args, **kwargs):
        _refuse("started a process")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", start)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    monkeypatch.setattr(loop.finetune, "__code__", _no_training.__code__)
