"""Intrinsic evaluators (issue 6): PPL-evaluator throughput vs the model's raw forward, RULER generation time, and
the wall/CPU time of every entry of the tiny default suite.

- ``ppl_vs_forward``: tokens/s of the ``ppl`` evaluator (YaRN truncated protocol, one document) vs a plain
  ``model(input_ids)`` forward of the same length, on tiny_llama at 1k..16k (target ratio >= 0.9).
  ``BENCH_SMOLLM2=1`` adds SmolLM2-135M at 8k and the peak RSS of a 16k-token SmolLM2 PPL pass (slow here).
- ``ruler_generation``: 13 tasks x 100 samples x {512, 1024, 2048, 4096} with the tiny tokenizer and the tiny
  suite's RULER settings (qa_1/qa_2 from a small hand-made SQuAD/HotpotQA-format file; target <= 60 s).
- ``tiny_suite``: every entry of ``conf/eval/tiny.yaml`` on tiny_llama (frozen, no method), wall and process CPU s.
Wall times depend on the load of the machine; process CPU seconds are reported beside them.
"""
from __future__ import annotations

import json
import os
import random
import resource
import tempfile
import time
from pathlib import Path

import torch


def _doc_tokens(tok, n: int) -> list[int]:
    from harness.data.sources import load_source

    ids: list[int] = []
    for d in load_source("shakespeare", "test"):
        ids += tok(d.text, add_special_tokens=False).input_ids
        if len(ids) >= n:
            break
    while len(ids) < n:
        ids += ids
    return ids[:n]


def _time(fn, repeat: int = 2) -> tuple[float, float]:
    best_w, best_c = float("inf"), float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        best_w, best_c = min(best_w, time.perf_counter() - w), min(best_c, time.process_time() - c)
    return best_w, best_c


def ppl_vs_forward(handle, lengths, repeat: int = 2) -> dict:
    from harness.evals import EvalContext
    from harness.evals.ppl import Perplexity

    model, tok = handle.model, handle.tokenizer
    out = {}
    with tempfile.TemporaryDirectory() as d:
        ids = _doc_tokens(tok, max(lengths) + 256)
        for L in lengths:
            doc_dir = Path(d) / f"doc{L}"  # one document of about L + 64 tokens: tokenising it is part of the cost
            doc_dir.mkdir()
            (doc_dir / "d.txt").write_text(tok.decode(ids[: L + 64]))
            ev = Perplexity(Perplexity.Args(dataset=f"dir:{doc_dir}", samples=1, lengths=[L], min_tokens=L - 1))
            x = torch.tensor([[tok.bos_token_id] + ids[: L - 1]])
            with torch.no_grad():
                fw, fc = _time(lambda: model(input_ids=x), repeat)  # noqa: B023
            ew, ec = _time(lambda: ev.run(handle, None, EvalContext(Path(d))), repeat)  # noqa: B023
            out[str(L)] = {"forward_tok_s": round(L / fw), "ppl_eval_tok_s": round(L / ew),
                           "ratio": round(fw / ew, 3), "forward_cpu_s": round(fc, 3), "ppl_eval_cpu_s": round(ec, 3)}
    return out


def ruler_generation(tok, lengths=(512, 1024, 2048, 4096), samples: int = 100) -> dict:
    from omegaconf import OmegaConf

    from harness.evals._ruler_data import ALL_TASKS, DoesNotFit, RulerGenerator

    root = Path(__file__).resolve().parents[1]
    cfg = OmegaConf.to_container(OmegaConf.load(root / "conf" / "eval" / "tiny.yaml"))["suite"]["ruler"]
    with tempfile.TemporaryDirectory() as d:
        rng = random.Random(0)
        paras = [{"context": f"Paragraph {i}: " + " ".join(rng.choice(["land", "river", "city", "king", "north"])
                                                            for _ in range(60)) + f" The capital is City{i}.",
                  "qas": [{"question": f"What is the capital in paragraph {i}?", "is_impossible": False,
                           "answers": [{"text": f"City{i}"}]}]} for i in range(400)]
        squad = Path(d) / "squad.json"
        squad.write_text(json.dumps({"data": [{"paragraphs": paras[i : i + 5]} for i in range(0, 400, 5)]}))
        hotpot = Path(d) / "hotpot.json"
        hotpot.write_text(json.dumps([{"question": f"Who built tower {i}?", "answer": f"Builder{i}",
                                       "context": [[f"Tower {i}", [f"Tower {i} was built by Builder{i}. " * 3]],
                                                   [f"Other {i}", ["An unrelated paragraph about hills. " * 3]]]}
                                      for i in range(300)]))
        gen = RulerGenerator(tok, tokens_to_generate=cfg["tokens_to_generate"], small_threshold=cfg["small_threshold"],
                             essay_increment=cfg["essay_increment"], vt_icl_length=cfg["vt_icl_length"],
                             squad_path=str(squad), hotpotqa_path=str(hotpot))
        per_len, skipped, n = {}, {}, 0
        w0, c0 = time.perf_counter(), time.process_time()
        for L in lengths:
            t = time.perf_counter()
            for task in ALL_TASKS:
                try:
                    n += len(gen.samples(task, L, samples))
                except DoesNotFit:
                    skipped.setdefault(str(L), []).append(task)
            per_len[str(L)] = round(time.perf_counter() - t, 2)
        return {"tasks": len(ALL_TASKS), "samples_per_task": samples, "samples_generated": n,
                "wall_s": round(time.perf_counter() - w0, 2), "cpu_s": round(time.process_time() - c0, 2),
                "wall_s_per_length": per_len, "skipped (do not fit)": skipped}


def tiny_suite(handle) -> dict:
    from omegaconf import OmegaConf

    from harness.conf_utils import compose
    from harness.evals import EvalContext, build_evaluators

    cfg = compose(["eval=tiny"])
    suite = OmegaConf.to_container(cfg.eval.suite, resolve=True)
    out, tw, tc = {}, 0.0, 0.0
    with tempfile.TemporaryDirectory() as d:
        for key, ev in zip(suite, build_evaluators(suite)):
            w, c = time.perf_counter(), time.process_time()
            ev.run(handle, None, EvalContext(Path(d), 0, "float32"))
            w, c = time.perf_counter() - w, time.process_time() - c
            out[key] = {"wall_s": round(w, 2), "cpu_s": round(c, 2)}
            tw, tc = tw + w, tc + c
    out["total"] = {"wall_s": round(tw, 2), "cpu_s": round(tc, 2), "lengths": cfg.eval.lengths}
    return out


def run() -> dict:
    from harness.models import load_model

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    tiny = load_model("tiny_llama")
    res = {"threads": torch.get_num_threads(),
           "ppl_vs_forward_tiny_llama": ppl_vs_forward(tiny, [1024, 2048, 4096, 8192, 16384]),
           "ruler_generation": ruler_generation(tiny.tokenizer),
           "tiny_suite": tiny_suite(tiny)}
    if os.environ.get("BENCH_SMOLLM2") == "1":
        smol = load_model("smollm2_135m")
        res["ppl_vs_forward_smollm2_135m"] = ppl_vs_forward(smol, [8192], repeat=1)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        from harness.evals import EvalContext
        from harness.evals.ppl import Perplexity

        with tempfile.TemporaryDirectory() as d:
            ids = _doc_tokens(smol.tokenizer, 16384)
            (Path(d) / "d.txt").write_text(smol.tokenizer.decode(ids))
            Perplexity(Perplexity.Args(dataset=f"dir:{d}", samples=1, lengths=[16384], min_tokens=16000)).run(
                smol, None, EvalContext(Path(d)))
        res["smollm2_16k_ppl_peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
        res["smollm2_peak_rss_before_gib"] = round(before / 2**20, 2)
    else:
        res["smollm2"] = "skipped (set BENCH_SMOLLM2=1; minutes on 2 CPU cores)"
    return res


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
