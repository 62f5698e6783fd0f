"""Prepare everything a cluster run needs, offline-first: run this once on a login node (with network), then train
and evaluate on compute nodes with ``HF_HUB_OFFLINE=1`` from local files only.

    python scripts/prepare_cluster_data.py --root /data/lceg                 # everything
    python scripts/prepare_cluster_data.py --root /data/lceg --only models  # just the weights
    python scripts/prepare_cluster_data.py --root /data/lceg --dry-run      # print the plan, download nothing
    python scripts/prepare_cluster_data.py --only lceg_release              # the paper's released checkpoints
    python scripts/prepare_cluster_data.py --only models_today              # Llama-3.1-8B, Qwen2.5-7B, Mistral-7B
    export HARNESS_DATA_ROOT=/data/lceg                                     # conf/data/slimpajama_upsampled.yaml

What it fetches (each step is skipped when its ``.done`` marker exists, so an interrupted run can be repeated):

- models: ``meta-llama/Llama-2-7b-hf`` (gated: accept the licence on the hub and ``huggingface-cli login`` first)
  and ``microsoft/phi-2`` into the Hugging Face cache (``HF_HOME``), where ``conf/model/{llama2_7b,phi2}.yaml``
  resolve their hub ids with ``local_files_only``;
- lceg_release (only with ``--only lceg_release``, ~13 GB each): the controlled study's released fine-tuned
  checkpoints, every ``path`` of ``conf/model/lceg/*.yaml`` (``experiment=lceg_release``);
- models_today (only with ``--only models_today``): ``conf/model/{llama3_1_8b,qwen2_5_7b,mistral_7b}.yaml``'s hub
  ids (Llama-3.1 is gated like Llama-2: accept its licence first);
- slimpajama: the first ``--slimpajama-shards`` shards of ``cerebras/SlimPajama-627B`` ``train/chunk1``
  (``*.jsonl.zst``, records with ``meta.redpajama_set_name``) into ``<root>/slimpajama`` -- the input of
  ``data=slimpajama_upsampled``, which streams them with Fu et al.'s per-source length upsampling. Short
  documents are kept at 10%, so the builder scans several times the tokens it keeps; if the shards run out
  before the budget is filled it says so: download more shards;
- pg19 / proofpile: the PG19 test books (``emozilla/pg19-test``) and the Proof-pile test split
  (``hoskinson-center/proof-pile``) as one ``.txt`` per document in ``<root>/pg19`` and ``<root>/proofpile``, for
  the ppl evaluator's ``dataset: dir:<root>/pg19``.

``<root>/MANIFEST.json`` records what was fetched (repository, files, time).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

MODELS = {"llama2_7b": "meta-llama/Llama-2-7b-hf", "phi2": "microsoft/phi-2"}
CONF_MODEL = Path(__file__).resolve().parents[1] / "conf" / "model"
TODAY = ("llama3_1_8b", "qwen2_5_7b", "mistral_7b")
SLIMPAJAMA = "cerebras/SlimPajama-627B"
PG19 = "emozilla/pg19-test"
PROOFPILE = "hoskinson-center/proof-pile"
STEPS = ("models", "slimpajama", "pg19", "proofpile")  # the default: what the study needs
OPT_IN = ("lceg_release", "models_today")             # large downloads, only when named with --only


def hub_ids(step: str) -> dict[str, str]:
    """model option -> hub id of a model step, read from the model YAMLs (their ``path``), so the pre-fetch list
    and the configs never disagree."""
    import yaml

    if step == "models":
        return dict(MODELS)
    files = sorted((CONF_MODEL / "lceg").glob("*.yaml")) if step == "lceg_release" else \
        [CONF_MODEL / f"{n}.yaml" for n in TODAY]
    out = {}
    for f in files:
        node = yaml.safe_load(f.read_text())
        out[node["name"]] = node["path"]
    return out


def plan(a) -> list[tuple[str, str]]:
    out = []
    for step in ("models", *OPT_IN):
        if step in a.only:
            out += [(step, f"{repo} -> Hugging Face cache ({os.environ.get('HF_HOME', '~/.cache/huggingface')})")
                    for repo in hub_ids(step).values()]
    if "slimpajama" in a.only:
        out.append(("slimpajama", f"SlimPajama {SLIMPAJAMA}: "
                                  f"train/chunk1/example_train_{{0..{a.slimpajama_shards - 1}}}"
                                  f".jsonl.zst -> {a.root}/slimpajama"))
    if "pg19" in a.only:
        out.append(("pg19", f"{PG19} (test) -> {a.root}/pg19/*.txt"))
    if "proofpile" in a.only:
        out.append(("proofpile", f"{PROOFPILE} (test) -> {a.root}/proofpile/*.txt"))
    return out


def _done(root: Path, step: str) -> Path:
    return root / f".{step}.done"


def fetch_models(root: Path, step: str = "models") -> dict:
    from huggingface_hub import list_repo_files, snapshot_download

    got = {}
    for name, repo in hub_ids(step).items():
        weights = ["*.safetensors"]
        if not any(f.endswith(".safetensors") for f in list_repo_files(repo)):
            weights = ["*.bin"]  # a checkpoint saved without safetensors (pytorch_model*.bin)
        path = snapshot_download(repo, allow_patterns=["*.json", *weights, "tokenizer*", "*.model", "*.txt"])
        got[name] = {"repo": repo, "path": path}
    return got


def fetch_slimpajama(root: Path, shards: int) -> dict:
    from huggingface_hub import snapshot_download

    files = [f"train/chunk1/example_train_{i}.jsonl.zst" for i in range(shards)]
    snapshot_download(SLIMPAJAMA, repo_type="dataset", allow_patterns=files, local_dir=str(root / "slimpajama"))
    return {"repo": SLIMPAJAMA, "files": len(files)}


def _write_texts(ds, out: Path, field: str = "text") -> int:
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for i, r in enumerate(ds):
        (out / f"{i:05d}.txt").write_text(r[field], encoding="utf-8")
        n += 1
    return n


def fetch_eval_texts(root: Path, which: str) -> dict:
    from datasets import load_dataset

    repo = PG19 if which == "pg19" else PROOFPILE
    ds = load_dataset(repo, split="test")
    return {"repo": repo, "documents": _write_texts(ds, root / which)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=os.environ.get("HARNESS_DATA_ROOT", "data"))
    p.add_argument("--only", nargs="+", choices=STEPS + OPT_IN, default=list(STEPS))
    p.add_argument("--slimpajama-shards", type=int, default=200)
    p.add_argument("--dry-run", action="store_true", help="print what would be fetched and exit")
    a = p.parse_args(argv)
    root = Path(a.root)
    for step, what in plan(a):
        state = "done" if _done(root, step).exists() else "to fetch"
        print(f"[{state}] {what}")
    if a.dry_run:
        return 0
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        print("HF_HUB_OFFLINE=1 is set: unset it on the login node to download", file=sys.stderr)
        return 2
    root.mkdir(parents=True, exist_ok=True)
    manifest_path = root / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for step in a.only:
        if _done(root, step).exists():
            continue
        t0 = time.time()
        if step in ("models", *OPT_IN):
            got = fetch_models(root, step)
        elif step == "slimpajama":
            got = fetch_slimpajama(root, a.slimpajama_shards)
        else:
            got = fetch_eval_texts(root, step)
        manifest[step] = {"fetched": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(time.time() - t0), **got}
        manifest_path.write_text(json.dumps(manifest, indent=1))
        _done(root, step).touch()
        print(f"{step}: ok ({manifest[step]['seconds']} s)")
    print(f"done. On compute nodes: export HARNESS_DATA_ROOT={root.resolve()} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
