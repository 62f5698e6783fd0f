"""short_context: retention of short-context ability, through lm-evaluation-harness (0.4.x) with the in-memory model.

The cluster configuration is LongRoPE's Table 8 (= the Open LLM Leaderboard v1 set YaRN runs in
``eval-harness.sh``): ARC-Challenge 25-shot (acc_norm), HellaSwag 10-shot (acc_norm), MMLU 5-shot (acc,
sample-weighted over subjects like lm-eval's ``mmlu`` group), TruthfulQA mc2 0-shot. The task definitions follow
lm-eval's own YAMLs (``arc_easy.yaml``/``arc_challenge.yaml``, ``hellaswag.yaml`` + ``utils.process_docs``,
``mmlu/default/_default_template_yaml`` with per-subject few-shot from ``dev`` via ``first_n``,
``truthfulqa_mc2.yaml`` with the fixed 6-QA prompt) but read local JSONL files: at run time this evaluator writes one
task YAML per task (``dataset_path: json`` + ``dataset_kwargs: {data_files: ...}``) into
``<run_dir>/short_context_tasks/`` and loads them with ``TaskManager(include_path=..., include_defaults=False)``,
so nothing touches the network (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1`` are set).

Data directory layout (the shipped fixtures, written for this project, and ``scripts/prepare_eval_data.py``'s
output on a cluster share it): ``arc_challenge/{train,test}.jsonl`` (fields id, question, choices{text,label},
answerKey), ``hellaswag/{train,validation}.jsonl`` (activity_label, ctx_a, ctx_b, endings, label),
``mmlu/{dev,test}.jsonl`` (question, subject, choices, answer), ``truthfulqa/validation.jsonl`` (question,
mc1_targets, mc2_targets).

Evaluator contract: lm-eval's ``HFLM`` is subclassed so that its one model call (``_model_call``) computes
``get_output_embeddings()(get_decoder()(input_ids).last_hidden_state)``, i.e. the same two entry points every
other evaluator uses (methods that act through the decoder work unchanged). Inputs are short, so the full logits of
a batch are fine here.

Scores are reported 0..100; ``average`` is the plain mean of the task scores. Per-sample log-likelihoods go to
``samples/short_context.jsonl``; ``resume: true`` skips tasks whose summary is already in that file (or in
``resume_from``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.config import ConfigError
from harness.evals import EVALS, EvalArgs, Spec, lengths_within, write_jsonl
from harness.safe import check_name, inside

FIXTURES = Path(__file__).resolve().parents[1] / "assets" / "fixtures" / "short_context"
# LongRoPE Table 8 / Open LLM Leaderboard v1 shots and metrics.
DEFAULT_FEWSHOT = {"arc_challenge": 25, "hellaswag": 10, "mmlu": 5, "truthfulqa_mc2": 0}
# documents of the split lm-eval scores per task (the plan's count when ``limit`` is 0)
SPLIT_DOCS = {"arc_challenge": 1172, "hellaswag": 10042, "mmlu": 14042, "truthfulqa_mc2": 817}
METRIC = {"arc_challenge": "acc_norm", "hellaswag": "acc_norm", "mmlu": "acc", "truthfulqa_mc2": "acc"}
# lm-eval truthfulqa_mc1.yaml's fixed QA primer (Lin et al. 2021), verbatim.
TQA_PRIMER = (
    "Q: What is human life expectancy in the United States?\n"
    "A: Human life expectancy in the United States is 78 years.\n\n"
    "Q: Who was president of the United States in 1955?\n"
    "A: Dwight D. Eisenhower was president of the United States in 1955.\n\n"
    "Q: Which party did he belong to?\n"
    "A: He belonged to the Republican Party.\n\n"
    "Q: What is the square root of banana?\n"
    "A: I have no comment.\n\n"
    "Q: How does a telescope work?\n"
    "A: Telescopes use lenses or mirrors to focus light and make objects appear closer.\n\n"
    "Q: Where were the 1992 Olympics held?\n"
    "A: The 1992 Olympics were held in Barcelona, Spain."
)


# --- functions the generated task YAMLs reference (``!function sc_utils.<name>``) ----------------------------------
def _hs_preprocess(text: str) -> str:
    import re

    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag_process_docs(dataset):
    """lm-eval ``hellaswag/utils.py``: query = activity_label + ': ' + ctx_a + ' ' + ctx_b.capitalize()."""
    def one(doc):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return {"query": _hs_preprocess(doc["activity_label"] + ": " + ctx),
                "choices": [_hs_preprocess(e) for e in doc["endings"]], "gold": int(doc["label"])}
    return dataset.map(one)


def truthfulqa_mc2_results(doc, results):
    """lm-eval ``truthfulqa/utils.py process_results_mc2``: normalised probability mass on the true answers."""
    import numpy as np

    ll = np.array([r[0] for r in results])
    probs = np.exp(ll)
    probs = probs / probs.sum()
    labels = np.array(doc["mc2_targets"]["labels"])
    return {"acc": float(probs[labels == 1].sum())}


# --- task YAMLs ---------------------------------------------------------------------------------------------------
MC_METRICS = [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
              {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]


def _yaml(cfg: dict, functions: dict | None = None) -> str:
    """yaml.safe_dump of the plain keys plus ``key: !function sc_utils.name`` lines (lm-eval's custom tag)."""
    import yaml

    txt = yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True, width=10**6)
    for k, fn in (functions or {}).items():
        txt += f"{k}: !function sc_utils.{fn}\n"
    return txt


def _local(d: Path, **splits) -> dict:
    return {"dataset_path": "json", "dataset_kwargs": {"data_files": {k: str(d / v) for k, v in splits.items()}}}


def write_task_yamls(data_dir: Path, out: Path, fewshot: dict, tasks: list[str]) -> dict[str, list[str]]:
    """Write one lm-eval task YAML per task (MMLU: one per subject); return {our task: [lm-eval task names]}."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sc_utils.py").write_text(
        "from harness.evals.short_context import hellaswag_process_docs, truthfulqa_mc2_results  # noqa: F401\n")
    names: dict[str, list[str]] = {}
    for t in tasks:
        if t == "arc_challenge":
            cfg = {"task": "sc_arc_challenge", **_local(data_dir / t, train="train.jsonl", test="test.jsonl"),
                   "output_type": "multiple_choice", "training_split": "train", "test_split": "test",
                   "num_fewshot": fewshot[t], "doc_to_text": "Question: {{question}}\nAnswer:",
                   "doc_to_target": "{{choices.label.index(answerKey)}}", "doc_to_choice": "{{choices.text}}",
                   "metric_list": MC_METRICS}
            (out / "sc_arc_challenge.yaml").write_text(_yaml(cfg))
            names[t] = ["sc_arc_challenge"]
        elif t == "hellaswag":
            cfg = {"task": "sc_hellaswag", **_local(data_dir / t, train="train.jsonl", validation="validation.jsonl"),
                   "output_type": "multiple_choice", "training_split": "train", "validation_split": "validation",
                   "num_fewshot": fewshot[t], "doc_to_text": "{{query}}", "doc_to_target": "{{gold}}",
                   "doc_to_choice": "choices", "metric_list": MC_METRICS}
            (out / "sc_hellaswag.yaml").write_text(_yaml(cfg, {"process_docs": "hellaswag_process_docs"}))
            names[t] = ["sc_hellaswag"]
        elif t == "mmlu":
            d = data_dir / "mmlu"
            rows = {s: [json.loads(x) for x in (d / f"{s}.jsonl").read_text().splitlines() if x.strip()]
                    for s in ("dev", "test")}
            names[t] = []
            for subj in sorted({r["subject"] for r in rows["test"]}):
                sd = inside(out / "mmlu_data", check_name(subj, f"{d / 'test.jsonl'}: subject"))  # data, not a path
                sd.mkdir(parents=True, exist_ok=True)
                for s in ("dev", "test"):
                    mine = [r for r in rows[s] if r["subject"] == subj]
                    (sd / f"{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine))
                cfg = {"task": f"sc_mmlu_{subj}", **_local(sd, dev="dev.jsonl", test="test.jsonl"),
                       "output_type": "multiple_choice", "test_split": "test", "fewshot_split": "dev",
                       "fewshot_config": {"sampler": "first_n"}, "num_fewshot": fewshot[t],
                       "description": "The following are multiple choice questions (with answers) about "
                                      f"{subj.replace('_', ' ')}.\n\n",
                       "doc_to_text": "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}"
                                      "\nD. {{choices[3]}}\nAnswer:",
                       "doc_to_choice": ["A", "B", "C", "D"], "doc_to_target": "answer",
                       "metric_list": MC_METRICS[:1]}
                (out / f"sc_mmlu_{subj}.yaml").write_text(_yaml(cfg))
                names[t].append(f"sc_mmlu_{subj}")
        elif t == "truthfulqa_mc2":
            cfg = {"task": "sc_truthfulqa_mc2", **_local(data_dir / "truthfulqa", validation="validation.jsonl"),
                   "output_type": "multiple_choice", "validation_split": "validation", "num_fewshot": 0,
                   "doc_to_text": TQA_PRIMER + "\n\nQ: {{question}}\nA:", "doc_to_target": 0,
                   "doc_to_choice": "{{mc2_targets.choices}}", "metric_list": MC_METRICS[:1]}
            (out / "sc_truthfulqa_mc2.yaml").write_text(_yaml(cfg, {"process_results": "truthfulqa_mc2_results"}))
            names[t] = ["sc_truthfulqa_mc2"]
        else:
            raise ConfigError(f"short_context: unknown task {t!r}; known: {sorted(DEFAULT_FEWSHOT)}")
    return names


_CONTRACT: list = []


def contract_class():
    """lm-eval's ``HFLM`` whose forward goes through ``get_decoder()`` + ``get_output_embeddings()`` (the class,
    made once: ``harness.lmeval``'s registered model subclasses it)."""
    if not _CONTRACT:
        from lm_eval.models.huggingface import HFLM

        class ContractHFLM(HFLM):
            def _model_call(self, inps, attn_mask=None, labels=None):
                with torch.no_grad():
                    out = self.model.get_decoder()(input_ids=inps, use_cache=False)
                    return self.model.get_output_embeddings()(out.last_hidden_state)

        _CONTRACT.append(ContractHFLM)
    return _CONTRACT[0]


def contract_lm(model, tokenizer, batch_size: int, max_length: int | None):
    """An lm-eval HFLM whose forward goes through ``get_decoder()`` + ``get_output_embeddings()``."""
    return contract_class()(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)


def _read_summaries(path: Path) -> dict:
    if path.is_dir():
        path = path / "samples" / "short_context.jsonl"
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("kind") == "task_summary":
                out[(r["task"], r["num_fewshot"], r["limit"])] = r
    return out


_TASK_MANAGERS: dict = {}


def task_manager(task: str, include_path: str = ""):
    """lm-eval's ``TaskManager`` that knows ``task``: the tasks under ``include_path`` alone when the task is one of
    them, else those plus lm-eval's own (indexing lm-eval's ~15k task files takes seconds); each built once per
    process."""
    from lm_eval.tasks import TaskManager

    for defaults in ((False, True) if include_path else (True,)):
        key = (include_path, defaults)
        if key not in _TASK_MANAGERS:
            _TASK_MANAGERS[key] = TaskManager(include_path=include_path or None, include_defaults=defaults)
        if task in _TASK_MANAGERS[key].all_tasks or defaults:
            return _TASK_MANAGERS[key]
    raise AssertionError("unreachable")


def check_offline(task: str, include_path: str, where: str) -> None:
    """Refuse, in one line, an lm-eval task that is unknown or whose data cannot be read offline: the task is built
    as lm-eval builds it (its dataset loaded) with ``HF_DATASETS_OFFLINE=1``, so a dataset that is neither local
    (``dataset_path: json`` + ``data_files``) nor in the local datasets cache fails here, before the model loads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if include_path and not os.path.isdir(include_path):
        raise ConfigError(f"{where}.include_path: {include_path!r} is not a folder (valid: a folder of lm-eval task "
                          f"YAMLs, or \"\")")
    tm = task_manager(task, include_path)
    if task not in tm.all_tasks:
        raise ConfigError(f"{where}.tasks: {task!r} is neither one of the local tasks {sorted(DEFAULT_FEWSHOT)} nor an "
                          f"lm-eval task (lm-eval's own, or a YAML under include_path={include_path or '(none)'!r})")
    try:
        tm.load_task_or_group([task])
    except Exception as e:  # noqa: BLE001 - whatever lm-eval or datasets raise: one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{where}.tasks: lm-eval task {task!r} cannot read its data offline ({type(e).__name__}: "
                          f"{first[:200]}); valid: a task whose dataset is local (dataset_path: json + data_files) "
                          f"or already in the datasets cache") from None


def _first_metric(res: dict, name: str) -> str:
    """The first metric lm-eval reports for task ``name`` (its ``metric_list`` order)."""
    hib = (res.get("higher_is_better") or {}).get(name) or {}
    if hib:
        return next(iter(hib))
    keys = [k.split(",")[0] for k in (res.get("results") or {}).get(name, {}) if "," in k and "stderr" not in k]
    return keys[0] if keys else "acc"


@EVALS.register("short_context")
class ShortContext:
    spec = Spec(
        metric="average")  # the headline metric (harness.evals: what an evaluator declares)

    def count_prompts(self, lengths, limit):
        """{context budget: documents}: an upper bound (every document at the full budget); the documents per task
        are ``limit`` or the size of the split lm-eval scores (``SPLIT_DOCS``; an lm-eval task of another name
        counts ``limit``, or nothing when ``limit`` is 0: its size is not known before it loads)."""
        a = self.args
        budget = int(a.max_length or max(lengths_within(a.lengths, lengths, limit) or [0]))
        n = sum(a.limit or SPLIT_DOCS.get(t, 0) for t in a.tasks)
        return ({budget: n} if budget else {}), (f"UPPER BOUND: {len(a.tasks)} tasks, {n} documents x the full "
                                                 f"{budget}-token budget" if budget else
                                                 "context budget unknown here (max_length 0: the model's)")
    @dataclass
    class Args(EvalArgs):
        name: str = "short_context"
        data_dir: str = ""  # local data (layout in the module docstring); "" = the shipped fixtures
        # the four local tasks (DEFAULT_FEWSHOT) and / or any lm-eval task whose data is readable offline
        tasks: list = field(default_factory=lambda: list(DEFAULT_FEWSHOT))
        num_fewshot: dict = field(default_factory=lambda: dict(DEFAULT_FEWSHOT))  # an lm-eval task: its own default
        limit: int = 0  # documents per lm-eval task (0 = all)
        batch_size: int = 1
        max_length: int = 0  # lm-eval's context limit (it left-truncates); 0 = the model config's
        resume: bool = False
        resume_from: str = ""
        include_path: str = ""  # a folder of lm-eval task YAMLs (lm-eval's --include_path) for tasks of other names

    def __init__(self, args):
        self.args = args

    def external(self) -> list[str]:
        """The tasks that are not the four local ones: lm-eval tasks by name."""
        return [t for t in self.args.tasks if t not in DEFAULT_FEWSHOT]

    def check_data(self, where: str) -> None:
        for t in self.external():
            check_offline(t, self.args.include_path, where)

    def run(self, handle, method, ctx) -> dict:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager

        a = self.args
        fewshot = {**DEFAULT_FEWSHOT, **{k: int(v) for k, v in a.num_fewshot.items()}}
        data_dir = Path(a.data_dir) if a.data_dir else FIXTURES
        task_dir = Path(ctx.run_dir) / "short_context_tasks"
        external = self.external()
        names = write_task_yamls(data_dir, task_dir, fewshot, [t for t in a.tasks if t not in external])
        out_path = ctx.samples_path("short_context")
        prev = _read_summaries(Path(a.resume_from) if a.resume_from else out_path) if a.resume else {}
        todo = [t for t in a.tasks if (t, fewshot.get(t), a.limit) not in prev]
        scores, n_docs, metric = {}, {}, {t: METRIC.get(t) for t in a.tasks}
        for t in a.tasks:
            if t not in todo:
                done = prev[(t, fewshot.get(t), a.limit)]
                scores[t], n_docs[t], metric[t] = done["score"], done["n"], done.get("metric", metric[t])
        seeds = dict(random_seed=ctx.seed, numpy_random_seed=ctx.seed, torch_random_seed=ctx.seed,
                     fewshot_random_seed=ctx.seed)
        if todo:
            lm = contract_lm(handle.model, handle.tokenizer, a.batch_size, a.max_length or None)
            runs = []  # (our tasks, lm-eval results): the local tasks together, each lm-eval task on its own
            local = [t for t in todo if t not in external]
            if local:
                tm = TaskManager(include_path=str(task_dir), include_defaults=False)
                runs.append((local, simple_evaluate(model=lm, tasks=[n for t in local for n in names[t]],
                                                    limit=a.limit or None, task_manager=tm, bootstrap_iters=0,
                                                    log_samples=True, **seeds)))
            for t in [t for t in todo if t in external]:
                res = simple_evaluate(model=lm, tasks=[t], limit=a.limit or None, num_fewshot=fewshot.get(t),
                                      task_manager=task_manager(t, a.include_path), bootstrap_iters=0,
                                      log_samples=True, **seeds)
                names[t] = sorted(res["samples"])
                runs.append(([t], res))
            for ts, res in runs:
                for t in ts:
                    scores[t], n_docs[t], metric[t] = self._score(t, names[t], res, out_path)
                    write_jsonl(out_path, [{"kind": "task_summary", "task": t, "num_fewshot": fewshot.get(t),
                                            "limit": a.limit, "score": scores[t], "n": n_docs[t],
                                            "metric": metric[t]}])
        vals = [v for v in scores.values() if v is not None]
        return {"tasks": scores, "average": round(sum(vals) / len(vals), 2) if vals else None,
                "metric": {t: metric[t] for t in a.tasks}, "num_fewshot": {t: fewshot.get(t) for t in a.tasks},
                "n": n_docs, "data": a.data_dir or "fixtures"}

    @staticmethod
    def _score(t: str, names: list[str], res: dict, out_path: Path):
        """(score, documents, metric) of our task ``t`` over its lm-eval tasks ``names``: lm-eval's own aggregated
        metric of each (``results[name]["<metric>,<filter>"]``: a mean for accuracies, a corpus-level value for
        perplexity, BLEU, ...), documents-weighted over several names, x100 when every per-document value is a
        number in [0, 1] (an accuracy); the per-document values go to ``out_path``."""
        total, n_all, m, unit = 0.0, 0, METRIC.get(t), True
        for name in names:
            samples = res["samples"][name]
            m = METRIC.get(t) or _first_metric(res, name)
            agg = (res.get("results") or {}).get(name) or {}
            key = next((k for k in agg if k.split(",")[0] == m and "stderr" not in k), None)
            if key is None or not samples:
                continue
            mine = [s[m] for s in samples]
            unit = unit and all(isinstance(v, (int, float)) and 0 <= float(v) <= 1 for v in mine)
            total += float(agg[key]) * len(samples)
            n_all += len(samples)
            write_jsonl(out_path, [{"task": t, "lm_eval_task": name, "doc_id": s["doc_id"],
                                    "target": str(s.get("target")),
                                    m: float(v) if isinstance(v, (int, float)) else list(v),
                                    "loglikelihoods": [float(r[0]) for r in s.get("filtered_resps", [])
                                                       if isinstance(r, (list, tuple))]}
                                   for s, v in zip(samples, mine)])
        if not n_all:
            return None, 0, m
        return round((100 if unit else 1) * total / n_all, 2), n_all, m
