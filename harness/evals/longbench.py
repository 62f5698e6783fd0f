"""longbench: LongBench v1, the 16 English + code tasks of the controlled study's Table 4 (``THUDM/LongBench
LongBench/pred.py`` + ``eval.py``; the controlled study's copy is ``Leooyii/LCEG longbench/``).

Per sample, as ``pred.py``: ``prompt = dataset2prompt[task].format(**sample)``; tokenise with the model's tokenizer
(BOS included); if longer than the prompt budget ``max_length``, keep the first ``int(max_length/2)`` and the last
``int(max_length/2)`` tokens (**middle truncation**); greedy decoding of up to ``dataset2maxlen[task]`` new tokens
(the generation budget comes *on top of* the prompt budget, as in both originals); the prediction is the decoded new
tokens (``skip_special_tokens=True``). Scores: ``harness.evals.longbench_metrics`` (official metrics, golden-checked
against LongLoRA's shipped predictions).

Two variants (``variant``):

* ``lceg`` (default, the controlled study): no chat template for any task (base models); first-line
  post-processing for 12 tasks (LCEG ``eval.py``: the QA tasks, trec/triviaqa/samsum, passage_count/retrieval).
* ``longbench`` (THUDM): ``chat_template`` (e.g. ``llama2`` -> ``"[INST]{prompt}[/INST]"``) on every task except
  trec/triviaqa/samsum/lcc/repobench-p, and first-line post-processing only for trec/triviaqa/samsum.

Truncation (``truncation``): ``tokens`` (default) splices the token ids, so the model sees exactly the first and
last halves of the budget. ``text`` reproduces the original literally: both halves are decoded
(``skip_special_tokens=True``), concatenated as text and re-tokenised, which can change a token or two at the seam.
A chat template always goes through ``text`` (it wraps the truncated text, as in ``pred.py``).

Fixture note: the shipped fixtures' few-shot ``input`` fields (trec ``"Question: ...\nType:"``, triviaqa
``"Passage: ...\nQuestion: ...\nAnswer:"``, samsum ``"Dialogue: ...\nSummary:"``) follow the layout LongLoRA's
shipped TREC predictions imply (the model continues after ``Type:``); the real files were not available offline to
confirm it. The loader and templates do not depend on it.

Departure: samsum's ``min_length=context_length+1`` (no immediate stop) is not reproduced; samsum stops at EOS or
the first newline token like the original, so an immediate newline gives an empty summary (ROUGE 0).

Averages: per task ``round(100*mean, 2)``; ``categories`` = mean of the tasks of each LongBench category;
``category_average`` (the LongBench README's "Avg", mean of category means) and ``task_average`` (mean over the
tasks: the controlled study's Table 4 "Avg." and the Entropy-ABF paper's 12-task "Macro"). ``average`` is the one
named by ``average`` (default ``categories``, the results contract). ``subset: entropy_abf`` runs the Entropy-ABF
paper's 12 tasks (no synthetic, no code).

Per-sample predictions are appended to ``samples/longbench.jsonl`` (the ``pred.py`` output fields plus task, _id,
prompt length and score); ``resume: true`` reuses finished predictions from ``resume_from`` (a JSONL file or a run
directory; default: this run's own file) and only generates the missing ones; ``rescore_file`` recomputes every
score from such a file without generating.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.config import ConfigError
from harness.evals import EVALS, EvalArgs, Spec, check_nonneg, lengths_within, write_jsonl
from harness.evals import longbench_metrics as M
from harness.evals.common import greedy_generate
from harness.evals.templates import tokenizer_chat_template

FIXTURES = Path(__file__).resolve().parents[1] / "assets" / "fixtures" / "longbench"
CHAT_TEMPLATES = {"": "{prompt}", "none": "{prompt}", "llama2": "[INST]{prompt}[/INST]"}
SUBSETS = {"paper": M.TASKS, "entropy_abf": M.ENTROPY_ABF_TASKS}
ASSUMED_SAMPLES = 200  # ASSUMPTION (the plan): samples per task when not capped (most official test sets have 200)


def load_task(data_dir: str | Path, task: str, samples: int = 0) -> list[dict]:
    """Official LongBench JSONL (``{data_dir}/{task}.jsonl``; fields input, context, answers, length, dataset,
    language, all_classes, _id)."""
    p = Path(data_dir) / f"{task}.jsonl"
    if not p.exists():
        raise ConfigError(f"longbench: {p} not found (run scripts/prepare_eval_data.py on a login node)")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ConfigError(f"longbench: {p} is not UTF-8 (byte offset {e.start})") from None
    rows = []
    for n, line in enumerate(lines, 1):  # an error names the file and the line (JSON's own names neither)
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"longbench: {p} line {n}: not JSON ({e})") from None
        missing = {"input", "context", "answers"} - set(r) if isinstance(r, dict) else {"input", "context", "answers"}
        if missing:
            raise ConfigError(f"longbench: {p} line {n} lacks fields {sorted(missing)}")
        rows.append(r)
    return rows[:samples] if samples > 0 else rows


def middle_truncate(ids: list[int], max_length: int) -> list[int]:
    """``pred.py``: if longer than max_length keep ``ids[:half] + ids[-half:]`` with ``half = int(max_length/2)``."""
    if len(ids) <= max_length:
        return list(ids)
    half = int(max_length / 2)
    return list(ids[:half]) + list(ids[-half:])


def build_input(tokenizer, task: str, sample: dict, max_length: int, chat_template: str = "",
                truncation: str = "tokens") -> tuple[list[int], bool]:
    """Token ids the model sees for one sample, and whether the prompt was truncated."""
    prompt = M.PROMPTS[task].format(**sample)
    ids = tokenizer(prompt).input_ids
    truncated = len(ids) > max_length
    if task in M.NO_CHAT_TASKS:
        tmpl = "{prompt}"
    elif chat_template == "tokenizer":  # the checkpoint's own template (an instruct model)

        tmpl = tokenizer_chat_template(tokenizer)
    else:
        tmpl = CHAT_TEMPLATES[chat_template]
    if truncation == "tokens" and tmpl == "{prompt}":
        return middle_truncate(ids, max_length), truncated
    if truncated:
        half = int(max_length / 2)
        prompt = tokenizer.decode(ids[:half], skip_special_tokens=True) + \
            tokenizer.decode(ids[-half:], skip_special_tokens=True)
    return tokenizer(tmpl.format(prompt=prompt)).input_ids, truncated


def stop_ids(tokenizer, task: str) -> tuple:
    if task != "samsum":
        return ()
    nl = tokenizer.encode("\n", add_special_tokens=False)
    return (nl[-1],) if nl else ()


def record_key(r: dict) -> tuple:
    return (r["task"], str(r.get("_id", r.get("i"))), r["max_length"], r["variant"], r.get("chat_template", ""),
            r["max_gen"])


def read_records(path: str | Path) -> list[dict]:
    p = Path(path)
    if p.is_dir():
        p = p / "samples" / "longbench.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def summarize(records: list[dict], first_line_tasks, categories=None, average: str = "categories") -> dict:
    """Task scores, category means and the two overall averages from per-sample records (no generation)."""
    by_task: dict = {}
    for r in records:
        by_task.setdefault(r["task"], []).append(r)
    order = [t for t in M.TASKS if t in by_task]
    tasks, n = {}, {}
    for t in order:
        rs = by_task[t]
        tasks[t] = M.task_score(t, [r["pred"] for r in rs], [r["answers"] for r in rs], rs[0].get("all_classes"),
                                first_line_tasks)
        n[t] = len(rs)
    avg = M.averages(tasks, categories)
    out = {"tasks": tasks, "categories": avg["categories"], "category_average": avg["category_average"],
           "task_average": avg["task_average"], "n": n}
    out["average"] = out["task_average"] if average == "tasks" else out["category_average"]
    return out


def rescore_file(path: str | Path, variant: str = "lceg", average: str = "categories") -> dict:
    """Recompute the scores of a saved ``samples/longbench.jsonl`` (or a run directory) without generating."""
    return summarize(read_records(path), M.FIRST_LINE_TASKS[variant], average=average)


@EVALS.register("longbench")
class LongBench:
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        records={"task": "task", "score": ("score",)},  # samples/longbench.jsonl fields (the tables' intervals)
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # samples generated through ctx.map (per task)

    def count_prompts(self, lengths, limit):
        """{prompt budget: tasks x samples}: an upper bound (every prompt counted at the full budget)."""
        a = self.args
        ok = lengths_within(a.lengths, lengths, limit)
        tasks = a.tasks or SUBSETS[a.subset]
        budget = int(a.max_length or max(ok or [0]))
        return ({budget: len(tasks) * (a.samples or ASSUMED_SAMPLES)},
                f"UPPER BOUND: {len(tasks)} tasks x samples (ASSUMPTION {ASSUMED_SAMPLES} when not capped) x the "
                f"full {budget}-token budget")

    @dataclass
    class Args(EvalArgs):
        name: str = "longbench"
        data_dir: str = ""  # directory of official <task>.jsonl files; "" = the shipped fixtures
        subset: str = "paper"  # paper (16 tasks of Table 4) | entropy_abf (12 tasks, Entropy-ABF Table 2)
        tasks: list = field(default_factory=list)  # explicit task list (overrides subset)
        samples: int = 0  # first N samples per task (0 = all)
        max_length: int = 0  # prompt budget in tokens (LCEG model2maxlen); 0 = the largest of ``lengths``
        variant: str = "lceg"  # lceg (no chat template, 12 first-line tasks) | longbench (THUDM pred.py/eval.py)
        chat_template: str = ""  # variant longbench only: "" | llama2 | tokenizer (the checkpoint's own template)
        truncation: str = "tokens"  # tokens (exact halves) | text (decode + re-tokenise, literal pred.py)
        max_gen_cap: int = 0  # cap on the per-task generation length (CPU budget); 0 = official dataset2maxlen
        average: str = "categories"  # which overall average is "average": categories (README) | tasks (Table 4)
        resume: bool = False
        resume_from: str = ""  # JSONL or run dir with earlier predictions; "" = this run's samples file

    def __init__(self, args):
        if args.variant not in M.FIRST_LINE_TASKS:
            raise ConfigError(f"longbench: variant must be one of {sorted(M.FIRST_LINE_TASKS)}, got {args.variant!r}")
        if args.chat_template not in (*CHAT_TEMPLATES, "tokenizer"):
            raise ConfigError(f"longbench: chat_template must be one of {sorted(CHAT_TEMPLATES) + ['tokenizer']}")
        if args.variant == "lceg" and args.chat_template not in ("", "none"):
            raise ConfigError("longbench: variant lceg never applies a chat template (use variant=longbench)")
        if args.truncation not in ("tokens", "text"):
            raise ConfigError("longbench: truncation must be tokens or text")
        if args.average not in ("categories", "tasks"):
            raise ConfigError("longbench: average must be categories or tasks")
        if args.subset not in SUBSETS:
            raise ConfigError(f"longbench: subset must be one of {sorted(SUBSETS)}")
        bad = [t for t in args.tasks if t not in M.PROMPTS]
        if bad:
            raise ConfigError(f"longbench: unknown tasks {bad}; known: {M.TASKS}")
        self.args = args

    def task_list(self) -> list[str]:
        return list(self.args.tasks) or list(SUBSETS[self.args.subset])

    def gen_tokens_per_prompt(self) -> tuple[float, str]:
        """The plan's decode budget per prompt: the mean over the tasks of LongBench's ``dataset2maxlen``, capped
        by ``max_gen_cap``."""
        a = self.args
        per = [M.MAX_GEN[t] if a.max_gen_cap <= 0 else min(M.MAX_GEN[t], a.max_gen_cap) for t in self.task_list()]
        return (sum(per) / len(per) if per else 0), "mean of LongBench's per-task dataset2maxlen"

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_nonneg(where, samples=a.samples, max_length=a.max_length, max_gen_cap=a.max_gen_cap)
        if self.max_length() <= 0:
            raise ConfigError(f"{where}: set max_length (tokens) or lengths")

    def check_data(self, where: str) -> None:
        d = Path(self.args.data_dir or FIXTURES)
        missing = [t for t in self.task_list() if not (d / f"{t}.jsonl").is_file()]
        if missing:
            raise ConfigError(f"{where}.data_dir: {d} lacks {', '.join(f'{t}.jsonl' for t in missing)} (run "
                              f"scripts/prepare_eval_data.py on a login node; \"\" = the shipped fixtures)")
        for t in self.task_list():  # a malformed line fails here, before the model loads (file and line named)
            load_task(d, t)

    def max_length(self) -> int:
        return int(self.args.max_length or max([int(x) for x in self.args.lengths] or [0]))

    def budget(self, handle, method) -> tuple[int, str | None]:
        a = self.args
        L = int(a.max_length or max([int(x) for x in a.lengths] or [0]))
        if L <= 0:
            raise ConfigError("longbench: set max_length or lengths")
        lim = method.max_length(handle) if method is not None else None
        if lim is not None and L > lim:
            return int(lim), f"prompt budget clipped from {L} to {lim}: method {method.name} supports at most {lim}"
        return L, None

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        tok, model = handle.tokenizer, handle.model
        L, note = self.budget(handle, method)
        data_dir = a.data_dir or str(FIXTURES)
        out_path = ctx.samples_path("longbench")
        done = {}
        if a.resume:
            for r in read_records(a.resume_from or out_path):
                done[record_key(r)] = r
        first_line = M.FIRST_LINE_TASKS[a.variant]
        chat = a.chat_template if a.variant == "longbench" else ""
        records, generated, gen_time, reused = [], 0, 0.0, 0
        for task in self.task_list():
            max_gen = M.MAX_GEN[task] if a.max_gen_cap <= 0 else min(M.MAX_GEN[task], a.max_gen_cap)
            items = []
            for i, s in enumerate(load_task(data_dir, task, a.samples)):
                key_rec = {"task": task, "_id": s.get("_id", i), "i": i, "max_length": L, "variant": a.variant,
                           "chat_template": chat, "max_gen": max_gen}
                items.append((s, key_rec, done.get(record_key(key_rec))))

            def one(item, task=task, max_gen=max_gen):
                s, key_rec, _ = item
                ids, truncated = build_input(tok, task, s, L, chat, a.truncation)
                t0 = time.time()
                new = greedy_generate(model, torch.tensor([ids]), max_gen, eos_token_id=tok.eos_token_id,
                                      dtype=ctx.autocast, stop_ids=stop_ids(tok, task))
                seconds = time.time() - t0
                pred = tok.decode(new, skip_special_tokens=True)
                rec = dict(key_rec, pred=pred, answers=s["answers"], all_classes=s.get("all_classes"),
                           length=s.get("length"), prompt_tokens=len(ids), truncated=truncated,
                           new_tokens=len(new))
                rec["score"] = round(M.sample_score(task, pred, s["answers"], s.get("all_classes"), first_line), 6)
                if ctx.world_size == 1:
                    write_jsonl(out_path, [rec])  # as soon as it exists: a killed run resumes from here
                return rec, seconds

            fresh = iter(ctx.map(one, [it for it in items if it[2] is None]))
            for _, _, prev in items:
                if prev is not None:
                    if a.resume_from and Path(a.resume_from) != out_path:
                        write_jsonl(out_path, [prev])  # this run's file is complete on its own
                    records.append(prev)
                    reused += 1
                    continue
                rec, seconds = next(fresh)
                gen_time += seconds
                generated += 1
                if ctx.world_size > 1:
                    write_jsonl(out_path, [rec])  # the main rank writes every rank's records, in sample order
                records.append(rec)
        cats = None if a.tasks or a.subset == "paper" else \
            {c: ts for c, ts in M.CATEGORIES.items() if any(t in SUBSETS[a.subset] for t in ts)}
        out = summarize(records, first_line, cats, a.average)
        out.update(max_length=L, variant=a.variant, subset=a.subset if not a.tasks else "custom",
                   data=("fixtures" if not a.data_dir else a.data_dir), generated=generated, resumed=reused,
                   samples_per_s=round(generated / gen_time, 3) if gen_time > 0 else None)
        if note:
            out["note"] = note
        return out
