"""Prepare everything a cluster run needs, offline-first: run this once on a login node (with network), then train
and evaluate on compute nodes with ``HF_HUB_OFFLINE=1`` from local files only.

    python scripts/prepare_cluster_data.py --root /data/lceg                 # everything
    python scripts/prepare_cluster_data.py --root /data/lceg --only models  # just the weights
    python scripts/prepare_cluster_data.py --root /data/lceg --dry-run      # the plan and every file read; no download
    python scripts/prepare_cluster_data.py --root /data/lceg --estimate     # shards each recipe needs (2 shards read)
    python scripts/prepare_cluster_data.py --only lceg_tokens               # the paper's released training tokens
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
- slimpajama: shards of ``cerebras/SlimPajama-627B`` ``train/chunk1`` (``*.jsonl.zst``, records with
  ``meta.redpajama_set_name``) into ``<root>/slimpajama`` -- the input of ``data=slimpajama_upsampled``, which
  streams them with Fu et al.'s per-source length upsampling. Short documents are kept at 1/10, so the builder
  scans several times the tokens it keeps: the step first reads the first ``--estimate-shards`` shards, counts
  per source the tokens the upsampling rule keeps (the builder's own functions) and prints, with the arithmetic,
  the shards each recipe's budget needs (``--estimate`` stops there); it then fetches the largest count plus 10%
  (or ``--slimpajama-shards``). ``--source-dir`` links local shards in SlimPajama's layout instead of downloading
  (offline). If the shards still run out, the builder says how many it needs;
- lceg_tokens (only with ``--only lceg_tokens``): the paper's released training tokens,
  ``Leooyii/Slimpajama_downsample_<release>`` (``--lceg-release``: 32k_1B, 64k_1B, 64k_2B) into
  ``<root>/lceg_tokens/<release>`` -- the input of ``data=lceg_tokens``;
- evaluation data (PG19 and Proof-pile tokens and texts, essays, SQuAD, HotpotQA, LongBench, TREC):
  ``scripts/prepare_eval_data.py``, under ``paths.eval_root``.

``<root>/MANIFEST.json`` records what was fetched (repository, files, time).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from harness.conf_utils import group_defaults
from harness.data.lceg_tokens import RELEASES, SUFFIXES, hub_id
from harness.data.slimpajama_upsampled import shard_files, shard_lengths, shards_needed

MODELS = {"llama2_7b": "meta-llama/Llama-2-7b-hf", "phi2": "microsoft/phi-2"}
CONF_MODEL = Path(__file__).resolve().parents[2] / "conf" / "model"
TODAY = ("llama3_1_8b", "qwen2_5_7b", "mistral_7b")
SLIMPAJAMA = "cerebras/SlimPajama-627B"
STEPS = ("models", "slimpajama")  # the default: what the study's training needs
OPT_IN = ("lceg_release", "models_today")             # large downloads, only when named with --only
DATA_OPT_IN = ("lceg_tokens",)  # the paper's released training tokens (data=lceg_tokens), only when named
ESTIMATE_RECIPES = ("paper", "paper_64k_2b")  # conf/train recipes whose token budgets the shard estimate sizes
MARGIN = 1.1  # shards fetched = the estimate for the largest recipe + 10%: the first shards are only a sample
OVERHEAD = 2  # BOS + EOS around each kept document (LLaMA-2's tokenizer has both), counted in a source's budget


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
        src = f"local shards under {a.source_dir}" if a.source_dir else f"SlimPajama {SLIMPAJAMA} train/chunk1"
        n = a.slimpajama_shards or "the estimate's count of"
        out.append(("slimpajama", f"{src}: {n} shards -> {a.root}/slimpajama"))
    if "lceg_tokens" in a.only:
        out.append(("lceg_tokens", f"{hub_id(a.lceg_release)} (dataset) -> {a.root}/lceg_tokens/{a.lceg_release}"))
    return out


def _done(root: Path, step: str) -> Path:
    return root / f".{step}.done"


def _marker(a, step: str) -> Path:
    """A step's ``.done`` marker; one per release for lceg_tokens (fetching 64k_2B after 32k_1B is not done)."""
    return _done(Path(a.root), f"{step}_{a.lceg_release}" if step == "lceg_tokens" else step)


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


def hub_shards(n: int) -> list[str]:
    """The first ``n`` SlimPajama shards of the hub, in its numbering order."""
    return [f"train/chunk1/example_train_{i}.jsonl.zst" for i in range(n)]


def first_shards(a) -> list[Path]:
    """The first ``--estimate-shards`` shards as local files: from ``--source-dir``, else downloaded into
    ``<root>/slimpajama`` (the first of the shards the step fetches anyway)."""

    if a.source_dir:
        files = shard_files(Path(a.source_dir))[: a.estimate_shards]
        if not files:
            raise SystemExit(f"--source-dir {a.source_dir}: no *.jsonl / *.jsonl.zst / *.parquet shards")
        return files
    from huggingface_hub import snapshot_download

    dest = Path(a.root) / "slimpajama"
    names = hub_shards(a.estimate_shards)
    snapshot_download(SLIMPAJAMA, repo_type="dataset", allow_patterns=names, local_dir=str(dest))
    return [dest / f for f in names]


def estimate(files: list[Path]) -> int | None:
    """Print, from ``files`` (the first shards), the shards the token budget of each recipe in ``ESTIMATE_RECIPES``
    needs per source under ``conf/data/slimpajama_upsampled.yaml``'s rule, with the arithmetic; return the
    largest count, or None when a source has no document in the sample (read more shards)."""

    d = group_defaults("data", "slimpajama_upsampled")
    shares, cpt, up = dict(d["shares"]), float(d["chars_per_token"]), float(d["upsample"])
    lengths, k, tot = shard_lengths(files, cpt), len(files), sum(d["shares"].values())
    print(f"estimate from the first {k} shard(s) ({', '.join(f.name for f in files)}): tokens = characters / {cpt:g};"
          f" documents of >= long_threshold tokens kept, shorter ones with p = 1/{up:g}; +{OVERHEAD} BOS/EOS per "
          f"kept document; per shard = (long + short / {up:g} + {OVERHEAD} x kept documents) / {k}")
    most: int | None = 0
    for name in ESTIMATE_RECIPES:
        t = group_defaults("train", name)
        seq = int(t["seq_len"])
        n = int(t["tokens"]) // seq * seq
        thr = int(d["long_threshold"]) or seq
        need = shards_needed(lengths, k, shares, n, thr, up, OVERHEAD)
        print(f"train={name}: {n:,} tokens ({n // seq:,} x {seq:,}); long = >= {thr:,} tokens")
        for src, v in need.items():
            docs = lengths.get(src, [])
            long, short = sum(x for x in docs if x >= thr), sum(x for x in docs if x < thr)
            kept_docs = sum(1 for x in docs if x >= thr) + sum(1 for x in docs if x < thr) / up
            shards = f"{v['shards']:,} shards" if v["shards"] else "unknown: no document in the sample"
            print(f"  {src:<24} {shares[src] / tot:6.1%} = {v['budget']:>13,} tokens / {v['kept_per_shard']:>12,.0f} "
                  f"per shard [({long:,} + {short:,} / {up:g} + {OVERHEAD} x {kept_docs:,.1f}) / {k}] = {shards}")
        counts = [v["shards"] for v in need.values()]
        if None in counts:
            print(f"  -> unknown: read more shards (--estimate-shards {2 * k})")
            most = None
            continue
        top = max(need, key=lambda s_: need[s_]["shards"])
        print(f"  -> train={name} needs {need[top]['shards']:,} shards ({top} fills last)")
        most = None if most is None else max(most, need[top]["shards"])
    return most


def fetch_slimpajama(a) -> dict:
    """The slimpajama step: the estimate from the first shards, then the shards it asks for plus 10% (or
    ``--slimpajama-shards``) into ``<root>/slimpajama``: downloaded, or linked from ``--source-dir``."""

    need = estimate(first_shards(a))
    n = a.slimpajama_shards or (math.ceil(need * MARGIN) if need else 0)
    if not n:
        raise SystemExit("the estimate cannot size the download (a source has no document in the first shards): "
                         "give --slimpajama-shards N, or a larger --estimate-shards")
    dest = Path(a.root) / "slimpajama"
    if a.source_dir:
        src = Path(a.source_dir).resolve()
        for f in shard_files(src)[:n]:
            link = dest / f.relative_to(src)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not (link.exists() or link.is_symlink()):
                link.symlink_to(f)
        got = {"source_dir": str(src)}
    else:
        from huggingface_hub import snapshot_download

        snapshot_download(SLIMPAJAMA, repo_type="dataset", allow_patterns=hub_shards(n), local_dir=str(dest))
        got = {"repo": SLIMPAJAMA}
    have = len(shard_files(dest))
    if have < n:
        print(f"warning: {dest} holds {have} shards, {n} asked for (the source has no more); "
              f"data=slimpajama_upsampled says how many its budget lacks", file=sys.stderr)
    return {**got, "files": have, "estimate": need}


def fetch_lceg_tokens(root: Path, release: str) -> dict:
    """The paper's released training tokens (every file of the hub data set) into ``<root>/lceg_tokens/<release>``."""
    from huggingface_hub import snapshot_download

    dest = root / "lceg_tokens" / release
    snapshot_download(hub_id(release), repo_type="dataset", local_dir=str(dest))
    files = shard_files(dest, SUFFIXES)
    return {"repo": hub_id(release), "files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def read_files(a) -> list[tuple[str, str, str]]:
    """(path, source, size) of every file the selected data steps leave for their data config to read: what is
    already under ``<root>`` (the builder reads every shard there) and what the step would fetch."""

    unknown = "size unknown until download"
    rows: list[tuple[str, str, str]] = []
    root = Path(a.root)
    if "slimpajama" in a.only:
        dest = root / "slimpajama"
        src = Path(a.source_dir) if a.source_dir else None
        local = shard_files(src) if src else []
        have = shard_files(dest) if dest.is_dir() else []
        n = a.slimpajama_shards
        if not n:  # the estimate, when the first shards are already on this machine
            first = local[: a.estimate_shards] if src else have[: a.estimate_shards]
            if len(first) == a.estimate_shards or (src and first):
                n = math.ceil((estimate(first) or 0) * MARGIN)
        if src:
            planned = [(dest / f.relative_to(src), f"local {f}", f"{f.stat().st_size:,} bytes") for f in local[:n]]
            if n > len(local):
                rows.append((f"{dest}/...", f"{n - len(local):,} more shards the estimate asks for: not in {src}",
                             "missing"))
        else:
            names = hub_shards(n or a.estimate_shards)
            planned = [(dest / f, f"{SLIMPAJAMA} {f}",
                        f"{(dest / f).stat().st_size:,} bytes" if (dest / f).exists() else unknown) for f in names]
        rows += [(str(p), source, size) for p, source, size in planned]
        listed = {p for p, _, _ in planned}
        rows += [(str(f), f"already in {dest}", f"{f.stat().st_size:,} bytes") for f in have if f not in listed]
        if not n:
            rows.append((f"{dest}/...", f"{SLIMPAJAMA}: the shards the estimate asks for, once these are read "
                                        f"(or --slimpajama-shards N)", unknown))
    if "lceg_tokens" in a.only:
        dest = root / "lceg_tokens" / a.lceg_release
        files = shard_files(dest, SUFFIXES) if dest.is_dir() else []
        rows += [(str(f), hub_id(a.lceg_release), f"{f.stat().st_size:,} bytes") for f in files]
        if not files:
            rows.append((f"{dest}/*", f"{hub_id(a.lceg_release)} (every file of the data set)", unknown))
    return rows


def main(argv=None) -> int:
    """fetch the fine-tuning shards, with a size estimate."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=os.environ.get("HARNESS_DATA_ROOT") or "data")  # empty = unset
    p.add_argument("--only", nargs="+", choices=STEPS + OPT_IN + DATA_OPT_IN, default=list(STEPS))
    p.add_argument("--slimpajama-shards", type=int, default=0,
                   help="SlimPajama shards to fetch (default: the estimate for the largest recipe + 10%%)")
    p.add_argument("--estimate", action="store_true",
                   help="read the first --estimate-shards shards, print the shards each recipe needs, and exit")
    p.add_argument("--estimate-shards", type=int, default=2, help="shards the estimate reads (default 2)")
    p.add_argument("--source-dir", default="",
                   help="local SlimPajama shards (its train/chunk1/ layout) to link instead of downloading")
    p.add_argument("--lceg-release", choices=sorted(RELEASES), default="32k_1B",
                   help="which released token set lceg_tokens fetches (default 32k_1B: train=paper)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be fetched and every file the data configs will read, and exit")
    a = p.parse_args(argv)
    root = Path(a.root)
    hub_needed = any(s != "slimpajama" or not a.source_dir for s in a.only if not _marker(a, s).exists())
    if a.estimate:
        if not a.source_dir and os.environ.get("HF_HUB_OFFLINE") == "1":
            print("HF_HUB_OFFLINE=1 is set: unset it to download the first shards, or give --source-dir",
                  file=sys.stderr)
            return 2
        return 0 if estimate(first_shards(a)) else 1
    for step, what in plan(a):
        state = "done" if _marker(a, step).exists() else "to fetch"
        print(f"[{state}] {what}")
    if a.dry_run:
        print("files the data configs will read (path <- source, size):")
        for path, source, size in read_files(a):
            print(f"  {path} <- {source} ({size})")
        return 0
    if os.environ.get("HF_HUB_OFFLINE") == "1" and hub_needed:
        print("HF_HUB_OFFLINE=1 is set: unset it on the login node to download", file=sys.stderr)
        return 2
    root.mkdir(parents=True, exist_ok=True)
    manifest_path = root / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for step in a.only:
        if _marker(a, step).exists():
            continue
        t0 = time.time()
        if step in ("models", *OPT_IN):
            got = fetch_models(root, step)
        elif step == "slimpajama":
            got = fetch_slimpajama(a)
        elif step == "lceg_tokens":
            got = fetch_lceg_tokens(root, a.lceg_release)
        manifest[step] = {"fetched": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(time.time() - t0), **got}
        manifest_path.write_text(json.dumps(manifest, indent=1))
        _marker(a, step).touch()
        print(f"{step}: ok ({manifest[step]['seconds']} s)")
    print(f"done. On compute nodes: export HARNESS_DATA_ROOT={root.resolve()} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
