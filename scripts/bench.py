"""`make bench`: run every ``benchmarks/bench_*.py`` (each exposes ``run() -> dict``) and write the numbers to
``results/bench.json`` (one entry per benchmark file, with the time and machine it ran on).

    python scripts/bench.py                 # all
    python scripts/bench.py ppl training    # only benchmarks/bench_ppl.py and bench_training.py
"""
from __future__ import annotations

import importlib.util
import json
import platform
import sys
import time
import traceback
from pathlib import Path

from harness.results import atomic_write_json, hardware, now_iso, versions

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    out = ROOT / "results" / "bench.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    # bench_gpu.py is `make bench-gpu`: it writes its own results/bench_gpu.json on a CUDA GPU only
    files = sorted(f for f in (ROOT / "benchmarks").glob("bench_*.py") if f.stem != "bench_gpu")
    if argv:
        files = [f for f in files if f.stem.removeprefix("bench_") in argv]
    status = 0
    for f in files:
        name = f.stem.removeprefix("bench_")
        spec = importlib.util.spec_from_file_location(f"bench_{name}", f)
        mod = importlib.util.module_from_spec(spec)
        t0 = time.time()
        try:
            spec.loader.exec_module(mod)
            res = mod.run()
            entry = {"status": "ok", "results": res}
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            entry = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
            status = 1
        entry.update(time=now_iso(), seconds=round(time.time() - t0, 1), machine=platform.node(),
                     hardware=hardware(), versions=versions())
        data[name] = entry
        atomic_write_json(out, data)
        print(f"bench {name}: {entry['status']} ({entry['seconds']} s)")
        print(json.dumps(entry.get("results", entry.get("error")), indent=1)[:3000])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
