"""`make bench`: run every ``benchmarks/bench_*.py`` (each exposes ``run(smoke=False) -> dict``) and write the numbers
to ``results/bench.json`` (one entry per benchmark file, with the time and machine it ran on).

    python scripts/bench.py                 # all
    python scripts/bench.py ppl training    # only benchmarks/bench_ppl.py and bench_training.py
    python scripts/bench.py --smoke         # every benchmark at tiny sizes (seconds each): that none has rotted;
                                            # nothing written unless --out FILE (tests/test_benchmarks.py)

Every benchmark takes its model, its native window C and each method's settings from the harness's own builders and
configs (``load_model``, ``build_method``, the configs' ``ctx_x`` lengths), never from numbers of its own.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
import traceback
from pathlib import Path

from harness.results import atomic_write_json, hardware, now_iso, versions

ROOT = Path(__file__).resolve().parents[1]


def benchmarks(names: list[str] | None = None) -> list[Path]:
    """The benchmark files (``bench_gpu.py`` is ``make bench-gpu``: a CUDA GPU only, its own ``--smoke``)."""
    files = sorted(f for f in (ROOT / "benchmarks").glob("bench_*.py") if f.stem != "bench_gpu")
    return [f for f in files if f.stem.removeprefix("bench_") in names] if names else files


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="benchmarks to run (bench_<name>.py); default: all")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: that every benchmark runs (numbers meaningless)")
    ap.add_argument("--out", default="", help="the JSON written (default: results/bench.json; --smoke: none)")
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
            res = mod.run(smoke=True) if a.smoke else mod.run()
            entry = {"status": "ok", "results": res}
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
