"""Download the extrinsic evaluation data once, on a login node with network, into a local directory that the
evaluators then read offline (``eval.suite.<entry>.data_dir=...``).

    python scripts/prepare_eval_data.py --out /data/evals                 # everything
    python scripts/prepare_eval_data.py --out /data/evals --only longbench manyshot_trec

Writes
  <out>/longbench/<task>.jsonl            THUDM/LongBench (data.zip in the HF dataset repo), 16 EN + code tasks,
                                          official fields (input, context, answers, length, dataset, language,
                                          all_classes, _id), one JSON object per line
  <out>/manyshot_trec/trec_<n>shots.jsonl Leooyii/manyshots_trec (the controlled study's files, LongBench format)
  <out>/short_context/...                 arc_challenge/{train,test}, hellaswag/{train,validation},
                                          mmlu/{dev,test} (all 57 subjects, with a subject field),
                                          truthfulqa/validation: the layout harness/evals/short_context.py reads

Then e.g. ``python run.py eval=extrinsic eval.lengths=[32768] eval.suite.longbench.data_dir=/data/evals/longbench
eval.suite.manyshot_trec.data_dir=/data/evals/manyshot_trec
eval.suite.short_context.data_dir=/data/evals/short_context``
(plus the full-size settings listed in conf/eval/extrinsic.yaml).

Needs ``datasets`` and ``huggingface_hub`` and network access; never called by the harness at run time.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import zipfile
from pathlib import Path

from harness.evals._longbench_metrics import TASKS
from harness.evals.manyshot_trec import SHOTS

ROOT = Path(__file__).resolve().parents[1]


def write_jsonl(path: Path, rows) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n


def longbench(out: Path) -> None:
    """LongBench v1 from the dataset repo's data.zip (the loading script of THUDM/LongBench reads the same zip)."""
    from huggingface_hub import hf_hub_download

    z = zipfile.ZipFile(hf_hub_download("THUDM/LongBench", "data.zip", repo_type="dataset"))
    names = {Path(n).name: n for n in z.namelist()}
    for t in TASKS:
        member = names.get(f"{t}.jsonl")
        if member is None:
            raise SystemExit(f"longbench: {t}.jsonl not in data.zip")
        data = z.read(member)
        (out / "longbench").mkdir(parents=True, exist_ok=True)
        (out / "longbench" / f"{t}.jsonl").write_bytes(data)
        print(f"longbench/{t}.jsonl: {sum(1 for _ in io.BytesIO(data))} samples")


def manyshot_trec(out: Path) -> None:
    from huggingface_hub import hf_hub_download

    for n in SHOTS:
        p = hf_hub_download("Leooyii/manyshots_trec", f"trec_{n}shots.jsonl", repo_type="dataset")
        dst = out / "manyshot_trec" / f"trec_{n}shots.jsonl"
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(Path(p).read_bytes())
        print(f"manyshot_trec/trec_{n}shots.jsonl")


def short_context(out: Path) -> None:
    from datasets import get_dataset_config_names, load_dataset

    d = out / "short_context"
    arc = load_dataset("allenai/ai2_arc", "ARC-Challenge")
    for split in ("train", "test"):
        print("arc", split, write_jsonl(d / "arc_challenge" / f"{split}.jsonl", arc[split]))
    hs = load_dataset("Rowan/hellaswag")
    for split in ("train", "validation"):
        print("hellaswag", split, write_jsonl(d / "hellaswag" / f"{split}.jsonl", hs[split]))
    subjects = [s for s in get_dataset_config_names("cais/mmlu") if s not in ("all", "auxiliary_train")]
    dev, test = [], []
    for s in subjects:
        ds = load_dataset("cais/mmlu", s)
        dev += [dict(r, subject=s) for r in ds["dev"]]
        test += [dict(r, subject=s) for r in ds["test"]]
    print("mmlu dev", write_jsonl(d / "mmlu" / "dev.jsonl", dev), "test", write_jsonl(d / "mmlu" / "test.jsonl", test))
    tq = load_dataset("truthfulqa/truthful_qa", "multiple_choice")
    print("truthfulqa", write_jsonl(d / "truthfulqa" / "validation.jsonl", tq["validation"]))


PARTS = {"longbench": longbench, "manyshot_trec": manyshot_trec, "short_context": short_context}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", nargs="*", choices=sorted(PARTS), default=sorted(PARTS))
    a = ap.parse_args(argv)
    for name in a.only:
        PARTS[name](a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
