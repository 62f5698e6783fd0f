"""`make bench`: run the ``benchmarks/bench_*.py`` (each exposes ``run(smoke=False) -> dict``) and write the numbers
to ``results/bench.json`` (one entry per benchmark file, with the time, the machine's load and the versions it ran
on). Each is a ratio against a named peer measured in the same process, beside the machine's limit
(``benchmarks/common.py``).

    python scripts/bench.py                 # the default set, at most ~15 minutes on the idle 2-core machine
    python scripts/bench.py --full          # also the benchmarks marked FULL_ONLY (the whole suite's cost, the
                                            # default run from outside, SmolLM2's passes) and each one's full sizes
    python scripts/bench.py ppl training    # only benchmarks/bench_ppl.py and bench_training.py
    python scripts/bench.py --smoke         # every benchmark at tiny sizes (seconds each): that none has rotted and
                                            # that each target can fail (a slowed variant fails it); nothing written
                                            # unless --out FILE (tests/test_benchmarks.py)

Every benchmark takes its model, its native window C and each method's settings from the harness's own builders and
configs (``load_model``, ``build_method``, the configs' ``ctx_x`` lengths), never from numbers of its own.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from harness.results import atomic_write_json, hardware, now_iso, versions

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the benchmarks' shared module, benchmarks/common.py


def benchmarks(names: list[str] | None = None) -> list[Path]:
    """The benchmark files (``bench_gpu.py`` is ``make bench-gpu``: a CUDA GPU only, its own ``--smoke``)."""
    files = sorted(f for f in (ROOT / "benchmarks").glob("bench_*.py") if f.stem != "bench_gpu")
    return [f for f in files if f.stem.removeprefix("bench_") in names] if names else files


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="benchmarks to run (bench_<name>.py); default: all")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: that every benchmark runs (numbers meaningless)")
    ap.add_argument("--out", default="", help="the JSON written (default: results/bench.json; --smoke: none)")
    ap.add_argument("--full", action="store_true", help="also the FULL_ONLY benchmarks, and full sizes")
    a = ap.parse_args(argv)
    out = Path(a.out) if a.out else (None if a.smoke else ROOT / "results" / "bench.json")
    data = json.loads(out.read_text()) if out is not None and out.exists() else {}
    status = 0
    for f in benchmarks(a.names):
        name = f.stem.removeprefix("bench_")
        spec = importlib.util.spec_from_file_location(f"bench_{name}", f)
        mod = importlib.util.module_from_spec(spec)
        t0 = time.time()
        try:
            spec.loader.exec_module(mod)
            if getattr(mod, "FULL_ONLY", False) and not (a.full or a.smoke or a.names):
                print(f"bench {name}: skipped (FULL_ONLY: --full or its name)", flush=True)
                continue
            load0 = os.getloadavg()[0]
            kw = {"full": True} if a.full and "full" in inspect.signature(mod.run).parameters else {}
            res = mod.run(smoke=True) if a.smoke else mod.run(**kw)
            entry = {"status": "ok", "results": res,
                     "loadavg_1min": {"before": round(load0, 2), "after": round(os.getloadavg()[0], 2)}}
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            entry = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
            status = 1
        entry.update(time=now_iso(), seconds=round(time.time() - t0, 1), machine=platform.node(),
                     hardware=hardware(), versions=versions(), smoke=a.smoke)
        data[name] = entry
        if out is not None:
            atomic_write_json(out, data)
        print(f"bench {name}: {entry['status']} ({entry['seconds']} s)", flush=True)
        print(json.dumps(entry.get("results", entry.get("error")), indent=1)[:3000], flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
