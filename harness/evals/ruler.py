"""ruler: the 13 RULER tasks (Hsieh et al. 2024, NVIDIA/RULER release 4f6507e = LCEG ``ruler/``), per task and
per length, as in the controlled study's Tables 12-16.

Samples come from our own deterministic offline generator (``harness.evals.ruler_data``; its docstring lists
what is identical to RULER and what differs). Each sample is ``model_template.format(task_template) +
answer_prefix`` (``base`` template, as LCEG uses for its base models), decoded greedily with the KV cache for
``tokens_to_generate`` tokens (RULER's per-task budget, 128/30/120/50/32), and scored with RULER's
``string_match_all`` (niah*, vt, cwe, fwe) or ``string_match_part`` (qa_1, qa_2) after RULER's postprocessing.
Scores are 0..100 per task and length; the per-length ``average`` is the unweighted mean over the tasks that ran
at that length, and ``average_over`` names them. qa_1 / qa_2 need SQuAD v2 dev / HotpotQA dev-distractor JSON
files (``squad_path`` / ``hotpotqa_path``); without them they are listed in ``skipped_tasks`` and excluded from
every average (never silently). A task that cannot fit a length (template + minimal haystack + generation budget
> L, common at the tiny model's 256-token window) is listed in ``skipped`` for that length.

Departures, as flags: ``max_new_tokens`` > 0 caps decoding below ``tokens_to_generate`` (CPU budget; the length
budget still reserves ``tokens_to_generate``); ``tokens_to_generate`` overrides the per-task budgets (the tiny
suite uses smaller ones so that more tasks fit its short windows); ``small_threshold`` moves RULER's fixed 4096
switch between the small and large cwe / repeat-haystack settings; ``essay_increment`` (RULER: 500 words) and
``vt_icl_length`` (RULER: 500 tokens) and ``vt_increment`` (RULER: 10 noise lines) scale the length search and the vt
example to miniature windows.
Decoding stops at EOS (RULER's HF wrapper generates the full budget; the scores are substring matches, so this
only saves time). The samples of one task and length are decoded in lexicographic order of their prompts
(``reuse_order``), each reusing the KV cache of the head it shares with the previous one (``reuse_prefix``); the row
keeps every sample's score in sample order (``per_sample``) and a 95% interval per task and length (``task_ci``)
and per length for the average (``ci``): Wilson on the summed scores / 100 (``harness.stats.bounded_interval``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from harness.config import ConfigError
from harness.evals import (
    EVALS,
    EvalArgs,
    Spec,
    check_nonneg,
    check_positive,
    split_lengths,
    tasks_x_samples,
    write_jsonl,
)
from harness.evals.common import PrefixCache, reuse_order
from harness.evals.ruler_data import (
    ALL_TASKS,
    METRIC,
    METRICS,
    TASKS,
    DoesNotFit,
    RulerGenerator,
    postprocess_pred,
)
from harness.evals.templates import RULER_TASKS
from harness.stats import bounded_interval


@EVALS.register("ruler")
class Ruler:
    spec = Spec(
        metric="average",  # the headline metric (harness.evals: what an evaluator declares)
        reader="ruler",  # the tables read a length's mean over tasks with its interval (0..100)
        records={"length": "length", "task": "task", "score": ("score", "correct")},  # samples/ruler.jsonl fields
        floor={"threshold": 50, "chance": 0.0, "ceiling": 100},  # the tables' floor rule, 0..100
        by_length=True,  # samples seeded per task and length: one shard per length is exact
        generates=True,  # decodes with the KV cache of the whole prompt (memory check: harness.models.check_fits)
        data_parallel=True)  # prompts decoded through ctx.map (each task x length)

    def count_prompts(self, lengths, limit):
        return tasks_x_samples(self.args, lengths, limit)

    def gen_tokens_per_prompt(self) -> tuple[float, str]:
        """The plan's decode budget per prompt: the mean over the tasks of RULER's ``tokens_to_generate`` (or its
        override), capped by ``max_new_tokens``."""
        a = self.args
        cap = int(a.max_new_tokens or 0)
        over = dict(a.tokens_to_generate or {})
        per = [int(over.get(t, over.get(TASKS[t][0], RULER_TASKS[TASKS[t][0]]["tokens_to_generate"])))
               for t in a.tasks]
        per = [min(cap, n) if cap > 0 else n for n in per]
        return (sum(per) / len(per) if per else 0), "mean of RULER's per-task tokens_to_generate"

    @dataclass
    class Args(EvalArgs):
        name: str = "ruler"
        tasks: list = field(default_factory=lambda: list(ALL_TASKS))
        samples: int = 500  # per task and length (RULER: 500; the paper's numbers use RULER's defaults)
        seed: int = 42  # RULER's random_seed; the run seed is added
        model_template: str = "base"  # base | meta-chat | tokenizer (the checkpoint's own) | "...{task_template}..."
        tokens_to_generate: dict = field(default_factory=dict)  # overrides by task or kind name
        max_new_tokens: int = 0  # 0 = decode tokens_to_generate
        small_threshold: int = 4096
        essay_increment: int = 500
        vt_icl_length: int = 500
        vt_increment: int = 10  # noise lines added per step of vt's length search (RULER: 10)
        essay_dir: str = ""  # Paul Graham essays (*.txt or PaulGrahamEssays.json); else Shakespeare test split
        squad_path: str = ""  # dev-v2.0.json
        hotpotqa_path: str = ""  # hotpot_dev_distractor_v1.json
        remove_newline_tab: bool = False
        reuse_prefix: bool = True

    def __init__(self, args):
        unknown = [t for t in args.tasks if t not in ALL_TASKS]
        if unknown:
            raise ConfigError(f"ruler: unknown tasks {unknown}; known: {ALL_TASKS}")
        self.args = args

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, samples=a.samples, essay_increment=a.essay_increment, vt_icl_length=a.vt_icl_length)
        check_nonneg(where, max_new_tokens=a.max_new_tokens, small_threshold=a.small_threshold)

    def check_data(self, where: str) -> None:
        from pathlib import Path

        d = self.args.essay_dir
        if d and not (Path(d).is_file() or (Path(d).is_dir() and (any(Path(d).glob("*.txt"))
                                                                   or (Path(d) / "PaulGrahamEssays.json").is_file()))):
            raise ConfigError(f"{where}.essay_dir: {d} holds no essays (*.txt or PaulGrahamEssays.json; \"\" = the "
                              f"Shakespeare test split)")

    def generator(self, tokenizer, seed: int = 0) -> RulerGenerator:
        a = self.args
        return RulerGenerator(tokenizer, seed=a.seed + seed, model_template=a.model_template, essay_dir=a.essay_dir,
                              squad_path=a.squad_path, hotpotqa_path=a.hotpotqa_path,
                              tokens_to_generate=a.tokens_to_generate, small_threshold=a.small_threshold,
                              vt_icl_length=a.vt_icl_length, essay_increment=a.essay_increment,
                              vt_increment=a.vt_increment,
                              remove_newline_tab=a.remove_newline_tab)

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        lengths, skipped_lengths = split_lengths(a.lengths, handle, method)
        tok, model = handle.tokenizer, handle.model
        gen = self.generator(tok, ctx.seed)
        runner = PrefixCache(model, ctx.autocast, enabled=a.reuse_prefix)
        stops = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
        skipped_tasks = {t: r for t in a.tasks if (r := gen.unavailable(t))}
        tasks = [t for t in a.tasks if t not in skipped_tasks]
        scores: dict = {t: {} for t in tasks}
        per_sample: dict = {t: {} for t in tasks}
        task_ci: dict = {t: {} for t in tasks}
        ci: dict = {}
        skipped: dict = {}
        average, average_over = {}, {}
        t_gen = 0.0
        reused = encoded = 0  # summed over the ranks' prompts (a rank's first prompt is encoded whole)
        for L in lengths:
            for task in tasks:
                t0 = time.time()
                try:
                    samples = gen.samples(task, L, a.samples)
                except DoesNotFit as e:
                    skipped.setdefault(str(L), {})[task] = str(e)
                    continue
                finally:
                    t_gen += time.time() - t0
                ids_all = [tok(s["input"]).input_ids for s in samples]
                preds, recs = [None] * len(samples), [None] * len(samples)

                def one(i: int, samples=samples, ids_all=ids_all):
                    s, ids = samples[i], ids_all[i]
                    n_new = min(a.max_new_tokens, s["tokens_to_generate"]) if a.max_new_tokens > 0 \
                        else s["tokens_to_generate"]
                    r0, e0 = runner.tokens_reused, runner.tokens_encoded
                    out = runner.generate(ids, n_new, stop_ids=stops)
                    return (postprocess_pred(tok.decode(out, skip_special_tokens=True)),
                            runner.tokens_reused - r0, runner.tokens_encoded - e0)

                order = reuse_order(ids_all) if a.reuse_prefix else list(range(len(samples)))
                for i, (pred, n_reused, n_encoded) in zip(order, ctx.map(one, order)):
                    s, ids = samples[i], ids_all[i]
                    reused, encoded = reused + n_reused, encoded + n_encoded
                    preds[i] = pred
                    recs[i] = {"task": task, "length": L, "index": s["index"], "prompt_tokens": len(ids),
                               "budget": s["length"], "outputs": s["outputs"], "pred": preds[i]}
                refs = [s["outputs"] for s in samples]
                scores[task][str(L)] = METRICS[METRIC[task]](preds, refs)
                for r, p, ref in zip(recs, preds, refs):
                    r["score"] = METRICS[METRIC[task]]([p], [ref])
                per_sample[task][str(L)] = [round(r["score"], 4) for r in recs]  # sample order: paired across methods
                est = bounded_interval(per_sample[task][str(L)], 100.0)
                task_ci[task][str(L)] = [round(est[1], 2), round(est[2], 2)] if est else None
                write_jsonl(ctx.samples_path("ruler"), recs)
            ran = [t for t in tasks if str(L) in scores[t]]
            average_over[str(L)] = ran
            average[str(L)] = round(sum(scores[t][str(L)] for t in ran) / len(ran), 2) if ran else None
            est = bounded_interval([per_sample[t][str(L)] for t in ran], 100.0) if ran else None  # equal-size strata
            ci[str(L)] = [round(est[1], 2), round(est[2], 2)] if est else None
        return {"average": average, "ci": ci, "tasks": scores, "task_ci": task_ci, "per_sample": per_sample,
                "average_over": average_over, "skipped_tasks": skipped_tasks,
                "skipped": {**skipped_lengths, **skipped}, "samples_per_task": a.samples,
                "metric": {t: METRIC[t] for t in tasks}, "haystack": gen._haystack.source if gen._haystack else None,
                "generation_seconds": round(t_gen, 2), "tokens_reused": reused, "tokens_encoded": encoded}
