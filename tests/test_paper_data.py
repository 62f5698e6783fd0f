"""The paper's data at the paper's scale: the CPU miniature's mixture under a cluster recipe is one ConfigError line
in validation (``harness.data.check_budget``, from the data YAML's ``max_tokens``), and every reader the cluster data
reaches is a declared dependency (``zstandard`` for SlimPajama's ``*.jsonl.zst`` shards). The paper's released tokens
(``data=lceg_tokens``) are read as the paper trained on them; ``scripts/prepare_cluster_data.py`` sizes the SlimPajama
download from its first shards, links local shards and lists every file a data config reads; ``scripts/build_data.py``
builds the cache a run then only loads. What the paper experiments compose is checked with their sweep points in
tests/test_sweeps.py."""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import sys

import numpy as np
import pytest
from conftest import ROOT

from harness import conf_utils, pipeline
from harness.config import ConfigError
from tests import forkrun


@pytest.mark.parametrize("train", ["paper", "paper_64k_2b"])
def test_cpu_mixture_under_the_paper_recipe_is_one_line(train):
    cfg = conf_utils.compose(["model=llama2_7b", "method=yarn", f"train={train}"])  # data: the default, local_mix
    assert cfg.data.name == "local_mix"
    with pytest.raises(ConfigError) as e:
        pipeline.validate(cfg, data=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("data=local_mix is the CPU miniature's mixture")
    assert "use data=slimpajama_upsampled" in msg and f"train={train} asks for" in msg


def test_the_budget_rule_is_the_data_yaml_s():
    """The refusal comes from what the data config says it is for, not from the names involved: the cluster data,
    the miniature's own recipe and a local_mix whose ``max_tokens`` is lifted all validate."""
    ok = [["model=llama2_7b", "method=yarn", "train=paper", "data=slimpajama_upsampled"],
          ["method=yarn", "train=tiny"],
          ["model=llama2_7b", "method=yarn", "train=paper", "data.max_tokens=0"]]
    for over in ok:
        pipeline.validate(conf_utils.compose(over), data=False)
    cfg = conf_utils.compose(["method=yarn", "train=tiny", "data.max_tokens=1000"])
    with pytest.raises(ConfigError, match=r"data=local_mix .* for train.tokens <= 1,000 \(data.max_tokens\)"):
        pipeline.validate(cfg, data=False)


@pytest.mark.integration
def test_run_py_refuses_before_anything_loads(tmp_path):
    """The README's one-point command without a data choice: run.py ends with that one line (and a failed row), in
    seconds, before any model or data is loaded (LLaMA2-7B is not on this machine)."""
    env = dict(os.environ, HARNESS_RESULTS_DIR=str(tmp_path / "results"), HARNESS_OUTPUT_DIR=str(tmp_path / "out"),
               HARNESS_CKPT_DIR=str(tmp_path / "ckpt"), HARNESS_CACHE_DIR=str(tmp_path / "cache"),
               HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    out = forkrun.run([sys.executable, str(ROOT / "run.py"), "model=llama2_7b", "method=yarn", "train=paper"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    errors = [ln for ln in (out.stdout + out.stderr).splitlines() if "data=local_mix" in ln]
    assert len(errors) == 1 and "use data=slimpajama_upsampled" in errors[0], out.stdout[-2000:] + out.stderr[-2000:]
    rows = [json.loads(f.read_text()) for f in (tmp_path / "results" / "runs").glob("*.json")]
    assert len(rows) == 1 and rows[0]["status"] == "failed" and rows[0]["error"].startswith("data=local_mix")
    assert not (tmp_path / "cache").exists()  # no data was built


def test_zstandard_is_declared_and_reads_the_cluster_shards(tmp_path):
    """scripts/prepare_cluster_data.py fetches SlimPajama's ``*.jsonl.zst`` shards; data=slimpajama_upsampled reads
    them with ``zstandard``, which must be a declared dependency (a range in pyproject.toml) that is installed at the
    version constraints.txt locks."""
    deps = (ROOT / "pyproject.toml").read_text().split("dependencies = [", 1)[1].split("]", 1)[0]  # [project]'s
    assert len(re.findall(r'^\s*"zstandard[<>=]', deps, flags=re.M)) == 1, deps
    pin = re.findall(r"^zstandard==(\S+)$", (ROOT / "constraints.txt").read_text(), flags=re.M)
    assert len(pin) == 1
    assert importlib.metadata.version("zstandard") == pin[0]

    import zstandard

    from harness.data.slimpajama_upsampled import iter_records

    records = [{"text": f"document {i} " * (i + 1), "meta": {"redpajama_set_name": src}}
               for i, src in enumerate(["RedPajamaC4", "RedPajamaBook", "RedPajamaArXiv"])]
    raw = "".join(json.dumps(r) + "\n" for r in records).encode()
    (tmp_path / "example_train_0.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    got = sorted(iter_records(tmp_path, seed=0), key=lambda st: st[1])
    assert got == sorted(((r["meta"]["redpajama_set_name"], r["text"]) for r in records), key=lambda st: st[1])


# ------------------------------------------------------------------ the paper's released tokens (data=lceg_tokens)
class Llama2Ids:
    """Stands in for LLaMA-2's tokenizer where only its vocabulary matters: the released ids are used as they are."""

    vocab_size = 32000
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 2

    def __len__(self):
        return self.vocab_size

    def get_vocab(self):
        return {f"<{i}>": i for i in range(self.vocab_size)}


def _release(d, length=16):
    """Six examples in three files whose names sort differently as text (part-10 < part-2) and as numbers: a JSON
    Lines file, a JSON array and a Parquet file, each with a column the paper's loader ignores."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir(parents=True)
    ex = [[100 * i + j for j in range(length)] for i in range(6)]
    (d / "part-2.jsonl").write_text("".join(json.dumps({"input_ids": e, "text": "x"}) + "\n" for e in ex[:2]))
    (d / "part-10.json").write_text(json.dumps([{"input_ids": e, "labels": e} for e in ex[2:4]]))
    pq.write_table(pa.table({"input_ids": ex[4:], "text": ["y", "z"]}), d / "part-11.parquet")
    return ex


def test_lceg_tokens_are_the_first_examples_in_the_release_order(tmp_path, monkeypatch):
    """data=lceg_tokens gives the training loop the first tokens / seq_len examples of the release, in its file
    order, unchanged; the cache is shared across seeds and reused."""
    from harness.data import build_data
    from harness.data import lceg_tokens as mod

    ex = _release(tmp_path / "32k_1B")
    cfg = {"name": "lceg_tokens", "path": str(tmp_path / "32k_1B"), "cache_dir": str(tmp_path / "cache"), "seed": 0}
    arr = build_data(cfg, Llama2Ids(), 16, 16 * 5)
    assert np.asarray(arr).tolist() == ex[:5]
    monkeypatch.setattr(mod, "iter_examples", lambda f: pytest.fail("cache not reused"))
    again = build_data({**cfg, "seed": 1}, Llama2Ids(), 16, 16 * 5)
    assert np.array_equal(np.asarray(arr), np.asarray(again))


def test_lceg_tokens_refuses_in_one_line(tmp_path):
    """Another tokenizer's vocabulary, another training length, a budget larger than the files and ids outside
    LLaMA-2's vocabulary: each one ConfigError line before anything is cached."""
    from transformers import AutoTokenizer

    from harness.data import build_data

    _release(tmp_path / "rel")
    cfg = {"name": "lceg_tokens", "path": str(tmp_path / "rel"), "cache_dir": str(tmp_path / "cache"), "seed": 0}
    tiny = AutoTokenizer.from_pretrained(ROOT / "harness" / "assets" / "tiny_llama")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.jsonl").write_text(json.dumps({"input_ids": [5] * 15 + [32000]}) + "\n")
    cases = [(cfg, tiny, 16, 16 * 2, "the released ids are LLaMA-2 tokens (32,000-id vocabulary) but this model's "
                                     "tokenizer has 4,096 ids"),
             (cfg, Llama2Ids(), 32, 32 * 2, "are 16 tokens long (part-2.jsonl row 0) but train.seq_len=32"),
             (cfg, Llama2Ids(), 16, 16 * 7, "holds 6 examples of 16 tokens (96 tokens) but train.tokens=112 needs 7"),
             ({**cfg, "path": str(tmp_path / "bad")}, Llama2Ids(), 16, 16, "a.jsonl row 0 holds token id 32000")]
    for c, tok, seq, n, want in cases:
        with pytest.raises(ConfigError) as e:
            build_data(c, tok, seq, n)
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not list((tmp_path / "cache").glob("*.npy"))


# ------------------------------------------------------------------ SlimPajama shards: estimate, prepare, build
def _prepare(*args, env=None):
    out = forkrun.run([sys.executable, str(ROOT / "scripts" / "prepare_cluster_data.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=dict(os.environ, HF_HUB_OFFLINE="1", **(env or {})))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


@pytest.mark.integration
def test_shard_estimate_is_the_upsampling_rule_over_the_first_shards(tmp_path):
    """``--estimate --source-dir`` reads only the first K shards and prints, per recipe, the shards its budget
    needs: per source, budget / (tokens kept per shard), where a shard keeps every long document and 1/10 of each
    short one (+2 BOS/EOS per kept document); the largest count wins. Checked against that arithmetic done here
    by hand on the fixture's known document lengths."""
    import math

    from harness.conf_utils import group_defaults
    from harness.data.mixture import source_budgets
    from tests.fixtures.slimpajama_shards import DOCS, make_shards

    src = make_shards(tmp_path / "src", n_shards=3)
    (src / "train" / "chunk1" / "example_train_2.jsonl.zst").write_bytes(b"not zstd")  # beyond K=2: never read
    out = _prepare("--root", tmp_path / "root", "--estimate", "--source-dir", src)
    assert "estimate from the first 2 shard(s) (example_train_0.jsonl.zst, example_train_1.jsonl.zst)" in out
    data = group_defaults("data", "slimpajama_upsampled")
    for recipe in ("paper", "paper_64k_2b"):
        t = group_defaults("train", recipe)
        n = t["tokens"] // t["seq_len"] * t["seq_len"]
        per_shard = {s: sum(x + 2 if x >= 4096 else (x + 2) / 10 for x in lengths) for s, lengths in DOCS.items()}
        need = {s: math.ceil(b / per_shard[s]) for s, b in source_budgets(data["shares"], n).items()}
        top = max(need, key=need.get)
        assert f"-> train={recipe} needs {need[top]:,} shards ({top} fills last)" in out, out
    assert not (tmp_path / "root").exists()  # an estimate from a local source writes nothing


@pytest.mark.integration
def test_prepare_links_local_shards_the_builder_reads_and_dry_run_lists_every_file(tmp_path):
    """``--only slimpajama --source-dir`` links local shards into <root>/slimpajama without the network
    (HF_HUB_OFFLINE=1); data=slimpajama_upsampled reads them, and when they run out it names the shard count
    needed in one line; ``--dry-run`` lists every file it will read with its source and size."""
    from transformers import AutoTokenizer

    from harness.data import build_data
    from tests.fixtures.slimpajama_shards import make_shards

    src = make_shards(tmp_path / "src", n_shards=3)
    root = tmp_path / "root"
    _prepare("--root", root, "--only", "slimpajama", "--source-dir", src, "--slimpajama-shards", 2)
    linked = sorted(p.relative_to(root).as_posix() for p in (root / "slimpajama").rglob("*.zst"))
    assert linked == [f"slimpajama/train/chunk1/example_train_{i}.jsonl.zst" for i in (0, 1)]
    assert json.loads((root / "MANIFEST.json").read_text())["slimpajama"]["files"] == 2

    tok = AutoTokenizer.from_pretrained(ROOT / "harness" / "assets" / "tiny_llama")
    cfg = {"name": "slimpajama_upsampled", "path": str(root / "slimpajama"), "cache_dir": str(tmp_path / "cache"),
           "seed": 0, "long_threshold": 4096, "upsample": 10.0}
    assert build_data(cfg, tok, 256, 256 * 8).shape == (8, 256)
    with pytest.raises(ConfigError) as e:
        build_data(cfg, tok, 256, 256 * 4000)
    msg = str(e.value)
    need = int(re.search(r"--slimpajama-shards (\d+)$", msg).group(1))
    assert "\n" not in msg and "the 2 shards under" in msg and need > 2, msg

    listing = _prepare("--root", root, "--dry-run", "--only", "slimpajama", "lceg_tokens", "--slimpajama-shards", 3)
    for i in (0, 1):
        f = root / "slimpajama" / "train" / "chunk1" / f"example_train_{i}.jsonl.zst"
        assert f"{f} <- cerebras/SlimPajama-627B train/chunk1/example_train_{i}.jsonl.zst " \
               f"({f.stat().st_size:,} bytes)" in listing
    assert "example_train_2.jsonl.zst (size unknown until download)" in listing
    assert f"{root}/lceg_tokens/32k_1B/* <- Leooyii/Slimpajama_downsample_32k_1B" in listing


# ------------------------------------------------------------------ built once, before the GPU job
RUN = ["model=tiny_llama", "method=pi", "method.scale=2.0", "train=tiny", "train.seq_len=256", "train.tokens=4096",
       "data.synthetic_docs=30", "eval=quick"]


@pytest.mark.slow  # ~14 s idle: the offline data-build script end to end; its steps are tested above
def test_build_data_script_builds_the_cache_the_run_then_loads(tmp_path, monkeypatch):
    """``scripts/build_data.py <overrides>`` builds the data on a CPU node; the run with the same overrides then
    finds the same cache file in ``pipeline.finetune``'s ``build_data`` call and builds nothing."""
    from harness.data import build_data
    from harness.data.local_mix import LocalMix

    env = dict(os.environ, HARNESS_CACHE_DIR=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    out = forkrun.run([sys.executable, str(ROOT / "scripts" / "build_data.py"), *RUN], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    path = re.search(r"\(built\) -> (\S+\.npy)", out.stdout).group(1)
    assert re.search(r"synthetic\s+[\d,]+ tokens", out.stdout)

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    cfg = conf_utils.compose(RUN)
    method, train = pipeline.validate(cfg)
    handle = pipeline.load_and_extend(cfg, method)
    monkeypatch.setattr(LocalMix, "documents", lambda *a, **k: pytest.fail("the run rebuilt the data"))
    chunks = build_data(cfg.data, handle.tokenizer, train.seq_len, train.tokens)
    assert str(chunks.filename) == path and chunks.shape == (16, 256)
