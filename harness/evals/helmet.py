"""What HELMET's categories share (Yen et al. 2024, ``princeton-nlp/HELMET``): its data files, its metrics
(``utils.py``, ``eval_alce.py``), a sample fitted to an evaluation length, and the loop every category evaluator runs.

Each category is one evaluator (one file + one YAML): ``helmet_rag``, ``helmet_rerank``, ``helmet_cite``,
``helmet_longqa``, ``helmet_summ`` (``helmet_recall`` is the synthetic one). A category declares its tasks
(:class:`Task`: the file it reads, how a sample becomes HELMET's prompt, the metric HELMET reports for it, the
generation budget, whether decoding stops at a newline); :class:`HelmetCategory` runs them: per length and task the
``samples`` test samples HELMET's loader draws (``random.Random(seed).sample`` of the sorted ids, seed 42), each
prompt fitted to the length (``fit``), greedy decoding with prefix reuse, HELMET's post-processing and metric, 0..100.
The category's ``average`` is the mean over its tasks (HELMET's category score), in RULER's output shape (the tables'
``ruler`` reader): ``tasks``, ``per_sample`` in sample order, ``task_ci`` and ``ci`` (``harness.stats``).

Data: HELMET's released files (``data.tar.gz`` of ``princeton-nlp/HELMET`` on the hub: ``kilt/``, ``msmarco/``,
``alce/``; the ALCE demo prompts of the repository's ``prompts/``; LongQA and summarisation from the hub datasets
they load, written as JSONL with the fields below), prepared offline by ``harness prepare-eval --only helmet`` on a
connected machine into ``<eval_root>/helmet``; ``data_dir: ""`` reads the small fixtures in HELMET's formats under
``harness/assets/fixtures/helmet`` (for tests and the CPU).

Length: HELMET fixes the number of passages (``k50`` ... ``k1000``) or truncates the document (with the LLaMA-2
tokenizer and the postfix ``" ... [the rest of the text is omitted]"``) per input length. Here the sample is fitted
to L for the model's own tokenizer: passages are dropped from the end, the ones holding the answer kept, until prompt
+ generation budget <= L (``k`` and whether a gold passage had to go are recorded); a document is cut at the token
that makes it fit, with HELMET's postfix. Differences are stated in each category's docstring.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytrec_eval

from harness.config import ConfigError
from harness.evals import EvalArgs, check_nonneg, check_positive, split_lengths, tasks_x_samples, write_jsonl
from harness.evals.common import PrefixCache, reuse_order
from harness.evals.ruler_data import DoesNotFit, largest_fitting
from harness.stats import bounded_interval

FIXTURES = Path(__file__).resolve().parents[1] / "assets" / "fixtures" / "helmet"
TRUNCATION_POSTFIX = " ... [the rest of the text is omitted]"  # data.py truncate_llama2


# --- metrics: utils.py ------------------------------------------------------------------------------------------------
def normalize_answer(s: str) -> str:
    """SQuAD normalisation (``utils.normalize_answer``): lower, punctuation off, articles to spaces, whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _answers(answers) -> list[str]:
    if isinstance(answers, str):
        return [answers]
    if answers and isinstance(answers[0], list):
        return [a for group in answers for a in group]
    return list(answers)


def f1_score(prediction: str, truth: str) -> float:
    """``utils.f1_score``'s F1 (yes / no / noanswer must match exactly)."""
    p, t = normalize_answer(prediction), normalize_answer(truth)
    if (p in ("yes", "no", "noanswer") or t in ("yes", "no", "noanswer")) and p != t:
        return 0.0
    common = Counter(p.split()) & Counter(t.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p.split()), same / len(t.split())
    return 2 * prec * rec / (prec + rec)


_ROUGE: list = []


def rouge(prediction: str, answers) -> dict:
    """``utils.calculate_metrics``' ROUGE part: Google's ``rouge_score`` (rougeL, rougeLsum, stemmer on), the max
    over the answers of F1 and of recall."""
    if not _ROUGE:
        from rouge_score import rouge_scorer

        _ROUGE.append(rouge_scorer.RougeScorer(["rougeL", "rougeLsum"], use_stemmer=True))
    sc = [_ROUGE[0].score(target=a, prediction=prediction) for a in _answers(answers)]
    out = {}
    for k in ("rougeL", "rougeLsum"):
        out[f"{k}_f1"] = max(r[k].fmeasure for r in sc)
        out[f"{k}_recall"] = max(r[k].recall for r in sc)
    return out


def calculate_metrics(prediction: str, answers, with_rouge: bool = True) -> dict:
    """``utils.calculate_metrics``: exact match, F1 and substring exact match (each the max over the answers), and
    ROUGE-L / ROUGE-Lsum F1 and recall."""
    ans = _answers(answers)
    out = {"exact_match": float(max(normalize_answer(prediction) == normalize_answer(a) for a in ans)),
           "f1": max(f1_score(prediction, a) for a in ans),
           "substring_exact_match": float(max(normalize_answer(a) in normalize_answer(prediction) for a in ans))}
    return {**out, **(rouge(prediction, ans) if with_rouge else {})}


def parse_output(output: str, prefix: str = "Answer:") -> str | None:
    """``utils.parse_output``: the text after ``prefix`` to the end of its line, else the first line."""
    def strip(s):
        return re.sub(f"^{re.escape(prefix)}", "", s, flags=re.IGNORECASE)

    for pat in (re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")):
        m = pat.search(output)
        if m is not None:
            return strip(m[1].strip()).strip()
    return None


def default_post_process(prediction: str, answers, prefix: str = "Answer:", with_rouge: bool = True) -> dict:
    """``data.default_post_process``: the metrics of the raw prediction and of the parsed one, the max of each."""
    mets = calculate_metrics(prediction, answers, with_rouge)
    parsed = parse_output(prediction, prefix)
    if parsed is not None:
        new = calculate_metrics(parsed, answers, with_rouge)
        mets = {k: max(v, new[k]) for k, v in mets.items()}
    return mets


def parse_rankings(output: str) -> dict[str, int]:
    """``utils.parse_rankings``: the longest ``a > b > c`` run of integer ids in the output, as {id: score} with the
    first ranked highest (a string without one: the whole string as the only id)."""
    output = re.sub(r"[\[\]:]", "", output).lower().replace("id", "")
    longest = ""
    for m in re.finditer(r"(\d+)(?:\s*>\s*(\d+))*", output):
        if len(m.group(0)) > len(longest):
            longest = m.group(0)
    ranks = [x.strip() for x in longest.split(">") if x.strip().isdigit()] if longest else [output]
    out: dict = {}
    for i, r in enumerate(ranks):
        if r not in out:
            out[r] = len(ranks) - i
    return out


def ndcg_at(run: dict[str, float], qrel: dict[str, int], k: int = 10) -> float:
    """trec_eval's ``ndcg_cut.k`` through ``pytrec_eval`` (what HELMET's ``calculate_retrieval_metrics`` reads): the
    ranked documents by score (ties by document id, descending), DCG over the first k with gain = the relevance
    label and discount log2(rank + 1), over the ideal DCG of the judged labels; 0 when none is relevant."""
    ev = pytrec_eval.RelevanceEvaluator({"q": {str(d): int(g) for d, g in qrel.items()}}, {f"ndcg_cut.{k}"})
    return float(ev.evaluate({"q": {str(d): float(v) for d, v in run.items()}}).get("q", {}).get(f"ndcg_cut_{k}", 0.0))


def remove_citations(sent: str) -> str:
    """``utils.remove_citations``: the ``[n]`` markers out of a cited answer."""
    return re.sub(r"\[\d+", "", re.sub(r" \[\d+", "", sent)).replace(" |", "").replace("]", "")


def exact_presence(short_answers: list[str], context: str) -> bool:
    """``eval_alce.exact_presence``: any of the short answers, normalised, inside the normalised context."""
    c = normalize_answer(context)
    return any(normalize_answer(a) in c for a in short_answers)


def str_em(output: str, qa_pairs: list[dict]) -> float:
    """``eval_alce.compute_str_em`` for one sample (ASQA): the share of its question's disambiguations whose short
    answers appear in the output (citations removed first, newlines as spaces)."""
    o = remove_citations(re.sub(r"\n+", " ", output))
    return sum(exact_presence(q["short_answers"], o) for q in qa_pairs) / len(qa_pairs)


def qampari_rec_top5(output: str, answers: list[list[str]]) -> float:
    """``eval_alce.compute_qampari_f1``'s ``qampari_rec_top5`` for one sample: of the comma-separated predictions,
    how many answer groups are hit, capped at 5, over min(5, groups)."""
    o = remove_citations(re.sub(r"\n+", " ", output))
    preds = [normalize_answer(x.strip()) for x in o.rstrip().rstrip(".").rstrip(",").split(",")]
    preds = [p for p in preds if p]
    groups = [[normalize_answer(x) for x in a] for a in answers]
    hit = sum(any(x in preds for x in a) for a in groups)
    return min(5, hit) / min(5, len(groups))


# --- data: data.py's loaders --------------------------------------------------------------------------------------
def read_samples(path: Path) -> list[dict]:
    """A HELMET data file: JSONL, or JSON with the samples under ``data`` (ALCE's files) or as a list."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(x) for x in text.splitlines() if x.strip()]
    obj = json.loads(text)
    return obj["data"] if isinstance(obj, dict) and "data" in obj else obj


def hf_shuffle(items: list, seed: int) -> list:
    """``datasets.Dataset.shuffle(seed=seed)``'s order: ``np.random.default_rng(seed).permutation(len)``."""
    return [items[int(i)] for i in np.random.default_rng(seed).permutation(len(items))]


def draw_keys(samples: list[dict], n: int, seed: int, key: str) -> list[dict]:
    """``load_qa`` / ``load_msmarco_rerank``'s draw: ``random.sample`` (seeded: ``eval.py``'s ``random.seed``) of
    ``n`` of the sorted ids, the samples holding them kept in file order."""
    keys = sorted({str(s[key]) for s in samples})
    chosen = set(random.Random(seed).sample(keys, min(n, len(keys))))
    return [s for s in samples if str(s[key]) in chosen]


def draw_shuffled(samples: list[dict], n: int, seed: int, key: str) -> list[dict]:
    """``load_alce`` / ``load_infbench`` / ``load_narrativeqa``'s draw: ``shuffle(seed).select(range(n))``."""
    return hf_shuffle(samples, seed)[:n]


def draw_if_more(samples: list[dict], n: int, seed: int, key: str) -> list[dict]:
    """``load_multi_lexsum``'s draw: shuffled and cut only when there are more than ``n`` samples."""
    return draw_shuffled(samples, n, seed, key) if len(samples) > n else list(samples)


DRAWS = {"keys": draw_keys, "shuffle": draw_shuffled, "shuffle_if_more": draw_if_more}


def sample_hash(value) -> int:
    """The seed HELMET derives from a sample's id for its demos: sha256 of ``str(id)`` mod 2^31."""
    return int(hashlib.sha256(str(value).encode("utf-8")).hexdigest(), 16) % 2 ** 31


def demos_hashed(pool: list[dict], sample: dict, key: str, shots: int, exclude: set) -> list[dict]:
    """``load_qa`` / ``load_msmarco_rerank``: the pool without the ``exclude`` ids, shuffled with the sample's hash,
    duplicates of an id dropped (``drop_duplicates``), the first ``shots``."""
    seen, out = set(), []
    for d in hf_shuffle([d for d in pool if str(d[key]) not in exclude], sample_hash(sample[key])):
        if str(d[key]) not in seen:
            seen.add(str(d[key]))
            out.append(d)
    return out[:shots]


def demos_seeded(pool: list[dict], sample: dict, key: str, shots: int, seed: int) -> list[dict]:
    """``load_infbench``'s ``add_demos``: the pool without the sample, ``shuffle(seed)``, the first ``shots``."""
    return hf_shuffle([d for d in pool if str(d[key]) != str(sample[key])], seed)[:shots]


@dataclass
class Task:
    """One task of a category: its test ``file`` (under the data folder) and id ``key``; ``build(sample, demos,
    prompt)`` -> HELMET's prompt (``prompt``: the ALCE prompt file's dict, or None); ``score(prediction, sample)`` ->
    HELMET's metric of it in 0..1 (``metric`` its name); the generation budget ``gen_tokens`` (the config's
    ``generation_max_length``) and ``stop_new_line``; ``passages``: the field of passages fitted to the length (None:
    the sample's ``context``, a document cut by tokens) and ``gold(passage)``: the ones that hold the answer, kept;
    ``keep(sample)``: HELMET's filter of the test (and demo) samples; ``draw``: its draw (``DRAWS``); the demos:
    ``demo_file`` (their pool; None: the test file), ``demos`` (``hashed`` | ``seeded`` | ``alce``: ``random.sample``
    of the prompt file's demos) and ``exclude`` (``none`` | ``self`` | ``drawn``: the pool without every drawn test
    id when it has more than twice as many samples, else without the sample's own, ``load_msmarco_rerank``);
    ``prompt_file`` (ALCE's)."""

    file: str
    key: str
    build: Callable
    score: Callable
    metric: str
    gen_tokens: int
    stop_new_line: bool = False
    passages: str | None = "ctxs"
    gold: Callable[[dict], bool] | None = None
    keep: Callable[[dict], bool] | None = None
    draw: str = "keys"
    demo_file: str | None = None
    demos: str = "hashed"
    exclude: str = "none"
    prompt_file: str | None = None


def fit_passages(passages: list[dict], gold, count, budget: int) -> tuple[list[dict], bool]:
    """The passages cut so that the prompt fits ``budget`` tokens (``count(passages)`` -> tokens): the first m kept
    in order, those that hold the answer (``gold``) kept first; (passages, whether a gold one had to go)."""
    ps = list(passages)
    if count(ps) <= budget:
        return ps, False
    is_gold = [bool(gold and gold(p)) for p in ps]
    order = [i for i in range(len(ps)) if is_gold[i]] + [i for i in range(len(ps)) if not is_gold[i]]

    def kept(m):
        return [ps[i] for i in sorted(order[:m])]

    m = largest_fitting(lambda m: count(kept(m)), budget, len(ps))
    return kept(m), m < sum(is_gold)


def fit_document(tok, text: str, count, budget: int) -> tuple[str, bool]:
    """The document cut at the token that makes the prompt fit ``budget`` (``count(text)`` -> tokens), with HELMET's
    postfix (``truncate_llama2``); (text, cut)."""
    if count(text) <= budget:
        return text, False
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    m = largest_fitting(lambda m: count(text[: offsets[m - 1][1]] + TRUNCATION_POSTFIX), budget, len(offsets))
    if m == 0:
        raise DoesNotFit("the prompt without its document does not fit")
    return text[: offsets[m - 1][1]] + TRUNCATION_POSTFIX, True


# --- the category evaluator ------------------------------------------------------------------------------------------
@dataclass
class HelmetArgs(EvalArgs):
    tasks: list = field(default_factory=list)  # [] = every task of the category
    samples: int = 100  # per task and length (HELMET's max_test_samples)
    shots: int = 2  # in-context demos (HELMET's shots)
    data_dir: str = ""  # HELMET's prepared files (``harness prepare-eval --only helmet``); "" = the fixtures
    generation_max_length: dict = field(default_factory=dict)  # {task: tokens}; {} = the category config's
    max_new_tokens: int = 0  # > 0 caps decoding (CPU budget); the length budget still reserves the above
    seed: int = 42  # HELMET's seed (the draws of test samples and demos), added to the run seed
    reuse_prefix: bool = True


class HelmetCategory:
    """The loop of a HELMET category (module docstring); a subclass sets ``NAME``, ``TASKS`` and ``NOT_MEASURED``
    (what HELMET reports that needs a judge model: named in the output, not computed)."""

    NAME = ""
    TASKS: dict[str, Task] = {}
    NOT_MEASURED: str = ""

    def __init__(self, args):
        if not args.tasks:
            args.tasks = list(self.TASKS)
        bad = [t for t in list(args.tasks) + list(args.generation_max_length) if t not in self.TASKS]
        if bad:
            raise ConfigError(f"{self.NAME}: unknown tasks {bad}; known: {list(self.TASKS)}")
        self.args = args

    def count_prompts(self, lengths, limit):
        return tasks_x_samples(self.args, lengths, limit)

    def check(self, native_ctx: int, where: str) -> None:
        a = self.args
        check_positive(where, samples=a.samples)
        check_nonneg(where, shots=a.shots, max_new_tokens=a.max_new_tokens)
        for t, v in a.generation_max_length.items():
            check_positive(f"{where}.generation_max_length", **{t: v})

    def check_data(self, where: str) -> None:
        for t in self.args.tasks:
            task = self.TASKS[t]
            for f in filter(None, (task.file, task.demo_file, task.prompt_file)):
                if not (self.folder() / f).is_file():
                    raise ConfigError(f"{where}.data_dir: {self.folder() / f} not found (HELMET's {t} file; "
                                      f"`harness prepare-eval --only helmet` writes it; \"\" = the fixtures)")

    def folder(self) -> Path:
        return Path(self.args.data_dir) if self.args.data_dir else FIXTURES

    def gen_tokens(self, task: str) -> int:
        return int(self.args.generation_max_length.get(task, self.TASKS[task].gen_tokens))

    def new_tokens(self, task: str) -> int:
        cap = int(self.args.max_new_tokens or 0)
        return min(cap, self.gen_tokens(task)) if cap > 0 else self.gen_tokens(task)

    def gen_tokens_per_prompt(self) -> tuple[float, str]:
        per = [self.new_tokens(t) for t in self.args.tasks]
        return (sum(per) / len(per) if per else 0), "mean of the per-task generation_max_length"

    def drawn(self, task: str, seed: int) -> tuple[list[dict], list[dict], dict | None]:
        """(the drawn test samples, the demo pool, the prompt file) of ``task``: HELMET's filter, then its draw with
        ``seed``."""
        t, a = self.TASKS[task], self.args
        pool = [s for s in read_samples(self.folder() / t.file) if t.keep is None or t.keep(s)]
        prompt = json.loads((self.folder() / t.prompt_file).read_text(encoding="utf-8")) if t.prompt_file else None
        if t.demos == "alce":
            demo_pool = list(prompt["demos"])
        elif t.demo_file:
            demo_pool = [s for s in read_samples(self.folder() / t.demo_file) if t.keep is None or t.keep(s)]
        else:
            demo_pool = pool
        chosen = DRAWS[t.draw](pool, a.samples, seed, t.key)
        return chosen, demo_pool, prompt

    def demos(self, task: str, index: int, sample: dict, chosen: list[dict], pool: list[dict], seed: int) -> list[dict]:
        t, shots = self.TASKS[task], self.args.shots
        if shots == 0:
            return []
        if t.demos == "alce":  # load_alce: random.sample(demos, shots) of the global generator; seeded per sample
            return random.Random(seed + index).sample(pool, min(shots, len(pool)))
        if t.demos == "seeded":
            return demos_seeded(pool, sample, t.key, shots, seed)
        if t.exclude == "drawn":
            exclude = {str(s[t.key]) for s in chosen} if len(pool) > 2 * len(chosen) else {str(sample[t.key])}
        else:
            exclude = {str(sample[t.key])} if t.exclude == "self" else set()
        return demos_hashed(pool, sample, t.key, shots, exclude)

    def samples(self, tok, task: str, L: int, seed: int = 0) -> list[dict]:
        """{index, prompt, sample (as fitted: what the prompt holds, what it is scored against), k and dropped_gold
        or cut} for the drawn test samples of ``task`` fitted to ``L``."""
        t = self.TASKS[task]
        seed = self.args.seed + seed  # HELMET's seed + the run's (0: HELMET's draw)
        chosen, pool, prompt = self.drawn(task, seed)
        out = []
        for i, s in enumerate(chosen):
            demos = self.demos(task, i, s, chosen, pool, seed)
            fitted, extra = self.fit(tok, task, s, demos, prompt, L)
            out.append({"index": i, "prompt": t.build(fitted, demos, prompt), "sample": fitted, **extra})
        return out

    def fit(self, tok, task: str, sample: dict, demos: list[dict], prompt, L: int) -> tuple[dict, dict]:
        """``sample`` with its passages or its document cut so that its prompt and the task's generation budget fit
        ``L``; (the fitted sample, what the fit did)."""
        t, budget = self.TASKS[task], L - self.gen_tokens(task)

        def tokens(fitted: dict) -> int:
            return len(tok(t.build(fitted, demos, prompt)).input_ids)

        if t.passages:
            ps, dropped = fit_passages(sample[t.passages], t.gold, lambda ps: tokens({**sample, t.passages: ps}),
                                       budget)
            if not ps:
                raise DoesNotFit(f"{task}: no passage fits in {L} tokens with {self.gen_tokens(task)} to generate")
            return {**sample, t.passages: ps}, {"k": len(ps), "dropped_gold": dropped}
        doc, cut = fit_document(tok, sample["context"], lambda x: tokens({**sample, "context": x}), budget)
        return {**sample, "context": doc}, {"cut": cut}

    def run(self, handle, method, ctx) -> dict:
        a = self.args
        lengths, skipped_lengths = split_lengths(a.lengths, handle, method)
        tok = handle.tokenizer
        runner = PrefixCache(handle.model, ctx.autocast, enabled=a.reuse_prefix)
        eos = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
        newline = tuple(tok("\n", add_special_tokens=False).input_ids[-1:])
        scores: dict = {t: {} for t in a.tasks}
        per_sample: dict = {t: {} for t in a.tasks}
        task_ci: dict = {t: {} for t in a.tasks}
        average, ci, average_over, skipped = {}, {}, {}, {}
        for L in lengths:
            for task in a.tasks:
                try:
                    samples = self.samples(tok, task, L, ctx.seed)
                except DoesNotFit as e:
                    skipped.setdefault(str(L), {})[task] = str(e)
                    continue
                stops = eos + (newline if self.TASKS[task].stop_new_line else ())
                recs = self._decode(tok, task, L, samples, runner, ctx, stops)
                write_jsonl(ctx.samples_path(self.NAME), recs)
                per_sample[task][str(L)] = [r["score"] for r in recs]   # sample order: paired across methods
                scores[task][str(L)] = round(sum(per_sample[task][str(L)]) / len(recs), 2)
                est = bounded_interval(per_sample[task][str(L)], 100.0)
                task_ci[task][str(L)] = [round(est[1], 2), round(est[2], 2)] if est else None
            ran = [x for x in a.tasks if str(L) in scores[x]]
            average_over[str(L)] = ran
            average[str(L)] = round(sum(scores[x][str(L)] for x in ran) / len(ran), 2) if ran else None
            est = bounded_interval([per_sample[x][str(L)] for x in ran], 100.0) if ran else None
            ci[str(L)] = [round(est[1], 2), round(est[2], 2)] if est else None
        return {"average": average, "ci": ci, "tasks": scores, "task_ci": task_ci, "per_sample": per_sample,
                "average_over": average_over, "skipped": {**skipped_lengths, **skipped}, "samples_per_task": a.samples,
                "metric": {x: self.TASKS[x].metric for x in a.tasks}, "data": a.data_dir or "fixtures",
                **({"not_measured": self.NOT_MEASURED} if self.NOT_MEASURED else {}),
                "tokens_reused": runner.tokens_reused, "tokens_encoded": runner.tokens_encoded}

    def _decode(self, tok, task: str, L: int, samples: list[dict], runner, ctx, stops: tuple) -> list[dict]:
        """Greedy decoding of the task's prompts at L (prefix reuse in ``reuse_order``), scored: one record each."""
        t = self.TASKS[task]
        ids = [tok(s["prompt"]).input_ids for s in samples]
        n_new = self.new_tokens(task)

        def one(i):
            return tok.decode(runner.generate(ids[i], n_new, stop_ids=stops), skip_special_tokens=True)

        order = reuse_order(ids) if self.args.reuse_prefix else list(range(len(samples)))
        recs: list = [None] * len(samples)
        for i, pred in zip(order, ctx.map(one, order)):
            s = samples[i]
            recs[i] = {"task": task, "length": L, "index": s["index"], "prompt_tokens": len(ids[i]), "pred": pred,
                       "score": round(100.0 * float(t.score(pred, s["sample"])), 4),
                       **{k: s[k] for k in ("k", "dropped_gold", "cut") if k in s}}
        return recs
