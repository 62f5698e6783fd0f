"""Offline, deterministic generator of the 13 RULER tasks (NVIDIA/RULER release 4f6507e, which LCEG copies
byte for byte), plus RULER's metrics. Written from the original ``scripts/data/synthetic/*.py`` and
``scripts/eval/synthetic/constants.py``; see ``../shared/notes/evals.md`` section 3.

What is the same as the original: the task configs (``synthetic.yaml``), templates, answer prefixes, model template
(``base``), needle format, the singular/plural rewrite of the niah template when one value is asked for, the
40 needle depths, the haystack kinds (essay / repeat / needle), the fixed-seed shuffles (``random.Random(seed)``
of the needles, of the cwe word list, of the fwe words), the vt ICL example (built at 500 tokens with 3-letter
names, template cut as in the original), the cwe small/large settings (example 20/3/1 and 6/1 below 4096 tokens,
40/10/3 and 30/3 above), the fwe Zipf counts ``int(n * k**-alpha / zeta(alpha))`` with ``vocab[0] = '...'``, the
qa document format and distractor choice, the increments of the length search (essay +500 words, repeat/needle
+25 lines or +5 below 4096, vt +10 noises, cwe +10 words, fwe +L//32 words, qa +10 documents), and the metrics.

What differs, and why:
- Words: RULER uses the wonderwords lists (a dependency that is not installed and whose lists change between
  versions); here ``harness/assets/ruler/{adjectives,nouns,verbs}.txt`` (written for this project), extended by
  deterministic pseudo-words when a length needs more distinct words than the lists hold.
- Sentences: ``nltk.sent_tokenize`` needs the punkt model (a download); ``split_sentences`` is a regex splitter.
- Randomness: one ``random.Random`` per (seed, task, length, sample), so a sample depends only on its seed and on
  the haystack size, not on how many probes the length search made (the original uses the global RNG).
- Length search: the largest size that fits is searched over increments (the 2025 RULER HEAD bisects; here each
  probe is predicted from the token counts of the previous ones, which gives the same size as doubling + bisection
  in ~4 tokenisations instead of ~2 log2(size)), probing with ``input + answers`` as the original, then each
  sample is shrunk by one increment until ``prompt tokens + tokens_to_generate <= L`` (one tokenisation per sample
  when it fits at once, its count reused for ``length``). Prompt tokens are counted WITH the special tokens the
  model is fed (BOS), one stricter than RULER's ``tokenizer.tokenize``. fwe also reserves ``tokens_to_generate``
  (the original fills the input up to L and can exceed L by up to 50 tokens). Generation time is dominated by
  tokenisation; 13 tasks x 100 samples x {512..4096} with the tiny tokenizer are timed by ``make bench``.
- vt: the original's per-sample shrink loop regenerates with the unshrunk size (a bug that can loop forever);
  here it shrinks.
- Haystack ``essay``: Paul Graham essays from a local directory (``*.txt``, or RULER's ``PaulGrahamEssays.json``)
  when given, else the Shakespeare test split (offline prose).
"""
from __future__ import annotations

import bisect
import json
import math
import random
import re
import string
import uuid
from functools import cache
from pathlib import Path

import numpy as np

from harness.data.sources import load_source
from harness.evals.templates import (
    RULER_MODEL_TEMPLATES,
    RULER_NIAH_NEEDLE,
    RULER_QA_DOCUMENT,
    RULER_REPEAT_NOISE,
    RULER_TASKS,
    tokenizer_chat_template,
)

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "ruler"
DEPTHS = [int(x) for x in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)]

# synthetic.yaml (4f6507e)
TASKS = {
    "niah_single_1": ("niah", dict(type_haystack="repeat", type_needle_k="words", type_needle_v="numbers",
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_single_2": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers",
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_single_3": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="uuids",
                                   num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_multikey_1": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers",
                                     num_needle_k=4, num_needle_v=1, num_needle_q=1)),
    "niah_multikey_2": ("niah", dict(type_haystack="needle", type_needle_k="words", type_needle_v="numbers",
                                     num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_multikey_3": ("niah", dict(type_haystack="needle", type_needle_k="uuids", type_needle_v="uuids",
                                     num_needle_k=1, num_needle_v=1, num_needle_q=1)),
    "niah_multivalue": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers",
                                     num_needle_k=1, num_needle_v=4, num_needle_q=1)),
    "niah_multiquery": ("niah", dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers",
                                     num_needle_k=1, num_needle_v=1, num_needle_q=4)),
    "vt": ("variable_tracking", dict(num_chains=1, num_hops=4)),
    "cwe": ("common_words_extraction", dict(freq_cw=30, freq_ucw=3, num_cw=10)),
    "fwe": ("freq_words_extraction", dict(alpha=2.0, coded_wordlen=6, vocab_size=-1)),
    "qa_1": ("qa", dict(dataset="squad")),
    "qa_2": ("qa", dict(dataset="hotpotqa")),
}
ALL_TASKS = list(TASKS)
METRIC = {t: ("string_match_part" if kind == "qa" else "string_match_all") for t, (kind, _) in TASKS.items()}


class DoesNotFit(Exception):
    """The task's template, minimal content and generation budget do not fit in the length."""


# --- metrics (scripts/eval/evaluate.py, scripts/eval/synthetic/constants.py) --------------------------------------
def postprocess_pred(pred: str) -> str:
    pred = pred.strip()
    return re.sub(r"[\x00-\x1f]", "\n", pred).strip()


def string_match_all(preds: list[str], refs: list[list[str]]) -> float:
    score = sum(sum(1.0 if r.lower() in p.lower() else 0.0 for r in ref) / len(ref) for p, ref in zip(preds, refs))
    return round(score / len(preds) * 100, 2)


def string_match_part(preds: list[str], refs: list[list[str]]) -> float:
    score = sum(max(1.0 if r.lower() in p.lower() else 0.0 for r in ref) for p, ref in zip(preds, refs))
    return round(score / len(preds) * 100, 2)


METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part}


# --- text helpers ---------------------------------------------------------------------------------------------------
_ABBREV = r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bvs\.)(?<!\be\.g\.)(?<!\bi\.e\.)"
_SENT_END = re.compile(_ABBREV + r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Regex replacement for ``nltk.sent_tokenize``: split after . ! ? (plus closing quotes/brackets) followed by
    whitespace and an upper-case letter or digit, except after a few common abbreviations."""
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        end = m.start() + len(m.group(0).rstrip())
        out.append(text[start:end].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


def _read_list(name: str) -> list[str]:
    return [w.strip() for w in (ASSETS / name).read_text().splitlines() if w.strip()]


def pseudo_words(n: int, seed: int = 0) -> list[str]:
    """Deterministic pronounceable pseudo-words (consonant-vowel syllables), lower case, distinct."""
    rng = random.Random(f"pseudo-{seed}")
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    out, seen = [], set()
    while len(out) < n:
        w = "".join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(2, 3)))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


@cache
def word_lists() -> tuple[list[str], list[str], list[str]]:
    return _read_list("adjectives.txt"), _read_list("nouns.txt"), _read_list("verbs.txt")


@cache
def niah_words() -> list[str]:
    adjs, nouns, _ = word_lists()
    return sorted({f"{a}-{n}" for a in adjs for n in nouns})


@cache
def cwe_words(min_size: int, seed: int) -> list[str]:
    adjs, nouns, verbs = word_lists()
    words = sorted(set(nouns + adjs + verbs))
    if len(words) < min_size:
        have = set(words)
        words = sorted(have | {w for w in pseudo_words(2 * min_size) if w not in have})[: max(min_size, len(words))]
    random.Random(seed).shuffle(words)
    return words


class Haystack:
    """The essay haystack as a list of words (``re.sub(r'\\s+', ' ', text).split(' ')`` as in RULER)."""

    def __init__(self, essay_dir: str = "", min_words: int = 0):
        self.source = "shakespeare_test"
        text = ""
        if essay_dir:
            p = Path(essay_dir)
            if p.is_file() and p.suffix == ".json":
                text, self.source = json.loads(p.read_text())["text"], str(p)
            elif p.is_dir():
                js = p / "PaulGrahamEssays.json"
                if js.is_file():
                    text, self.source = json.loads(js.read_text())["text"], str(js)
                else:
                    text = "".join(f.read_text(encoding="utf-8", errors="ignore") for f in sorted(p.glob("*.txt")))
                    self.source = str(p)
        if not text:
            text = "\n".join(d.text for d in load_source("shakespeare", "test"))
        self.words = re.sub(r"\s+", " ", text).strip().split(" ")
        base = list(self.words)
        while len(self.words) < min_words:  # RULER caps at the essay size; repeating keeps long lengths possible
            self.words += base
        self._text = ""

    def sentences(self, n: int) -> list[str]:
        """``split_sentences(" ".join(self.words[:n]))`` without re-running the regex over the prefix every time:
        the sentence ends of the whole haystack are found once. The words hold no whitespace, so a sentence end of
        the prefix (which needs the start of the next word as look-ahead) is exactly a sentence end of the whole
        text whose match ends before the prefix does; the rest of the prefix is the tail."""
        if not self._text:
            self._text = " ".join(self.words)
            self._word_end = np.cumsum([len(w) + 1 for w in self.words]) - 1  # char end of " ".join(words[:i+1])
            self._sents, self._match_end, start = [], [], 0
            for m in _SENT_END.finditer(self._text):
                self._sents.append(self._text[start : m.start() + len(m.group(0).rstrip())].strip())
                start = m.end()
                self._match_end.append(start)
        n = min(n, len(self.words))
        if n <= 0:
            return []
        k = int(self._word_end[n - 1])
        j = bisect.bisect_left(self._match_end, k)  # the sentence ends whose match ends before the prefix does
        tail = self._text[self._match_end[j - 1] if j else 0 : k].strip()
        return [x for x in self._sents[:j] if x] + ([tail] if tail else [])


# --- generators ---------------------------------------------------------------------------------------------------
def _rand(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return rng.choice(niah_words())
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(kind)


def niah_input(rng, n, template, cfg, seed, haystack: Haystack | None):
    nk = max(cfg["num_needle_k"], cfg["num_needle_q"])
    nv, nq = cfg["num_needle_v"], cfg["num_needle_q"]
    tk, tv = cfg["type_needle_k"], cfg["type_needle_v"]
    keys, values, needles = [], [], []
    for _ in range(nk):
        keys.append(_rand(rng, tk))
        vals = []
        for _ in range(nv):
            vals.append(_rand(rng, tv))
            needles.append(RULER_NIAH_NEEDLE.format(type_needle_v=tv, key=keys[-1], value=vals[-1]))
        values.append(vals)
    random.Random(seed).shuffle(needles)
    if cfg["type_haystack"] == "essay":
        sents = haystack.sentences(n)  # = split_sentences(" ".join(haystack.words[:n]).strip())
        pos = [0] + sorted(int(len(sents) * (d / 100)) for d in rng.sample(DEPTHS, len(needles))) + [len(sents)]
        parts = []
        for i in range(1, len(pos)):
            parts.append(" ".join(sents[pos[i - 1] : pos[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        context = " ".join(parts)
    else:
        if n < len(needles):
            raise DoesNotFit("haystack smaller than the number of needles")
        if cfg["type_haystack"] == "repeat":
            lines = [RULER_REPEAT_NOISE] * n
        else:
            lines = [RULER_NIAH_NEEDLE.format(type_needle_v=tv, key=_rand(rng, tk), value=_rand(rng, tv))
                     for _ in range(n)]
        for idx, e in zip(sorted(rng.sample(range(n), len(needles)), reverse=True), needles):
            lines.insert(idx, e)
        context = "\n".join(lines)
    idx = rng.sample(range(nk), nq)
    queries = [keys[i] for i in idx]
    answers = [a for i in idx for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    if nq * nv == 1:
        template = (template.replace("Some", "A").replace("are all", "is").replace("are", "is")
                    .replace("answers", "answer"))
        tv = tv[:-1]
    return template.format(type_needle_v=tv, context=context, query=query), answers


def vt_input(rng, n, template, cfg, is_icl=False):
    num_chains, num_hops = cfg["num_chains"], cfg["num_hops"]
    k = 3 if is_icl else 5
    num_hops = min(10, num_hops) if is_icl else num_hops
    names = ["".join(rng.choices(string.ascii_uppercase, k=k)) for _ in range((num_hops + 1) * num_chains)]
    while len(set(names)) < num_chains * (num_hops + 1):
        names.append("".join(rng.choices(string.ascii_uppercase, k=k)))
    vars_, chains = [], []
    for i in range(0, len(names), num_hops + 1):
        v = names[i : i + num_hops + 1]
        vars_.append(v)
        chain = [f"VAR {v[0]} = {rng.randint(10000, 99998)}"]
        chain += [f"VAR {v[j + 1]} = VAR {v[j]} " for j in range(num_hops)]
        chains.append(chain)
    noise = RULER_REPEAT_NOISE + "\n"
    sents = [noise] * n
    if len(sents) <= len(chains[0]):
        sents = [s + "." if len(s.strip()) > 0 else s for s in [x for nz in sents for x in nz.split(".")]]
        if len(sents) <= len(chains[0]):
            chains = [c[: len(sents) - 1] for c in chains]
    for chain in chains:
        positions = sorted(rng.sample(range(len(sents)), len(chain)))
        for p, j in zip(positions, range(len(chain))):
            sents.insert(p + j, chain[j])
    context = " ".join(sents).replace(". \n", ".\n")
    if is_icl:
        task_t, prefix = RULER_TASKS["variable_tracking"]["template"], RULER_TASKS["variable_tracking"]["answer_prefix"]
        cut, cut_ans = template.index(task_t[:20]), template.index(prefix[:10])
        template = " ".join(template[cut:cut_ans].split()[:-1]) + template[cut_ans:]
    value = chains[0][0].split("=")[-1].strip()
    return template.format(context=context, query=value, num_v=num_hops + 1), vars_[0]


def cwe_example(rng, words, n, common_rep, uncommon_rep, num_cw, seed):
    if n > len(words):
        raise DoesNotFit("not enough distinct words")
    full = rng.sample(words, n)
    common, uncommon = full[:num_cw], full[num_cw:]
    lst = common * int(common_rep) + uncommon * int(uncommon_rep)
    random.Random(seed).shuffle(lst)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(lst)), common


def cwe_input(rng, n, template, cfg, seed, L, words, small_threshold):
    if L < small_threshold:
        ctx_ex, ans_ex = cwe_example(rng, words, 20, 3, 1, cfg["num_cw"], seed)
        ctx, ans = cwe_example(rng, words, n, 6, 1, cfg["num_cw"], seed)
    else:
        ctx_ex, ans_ex = cwe_example(rng, words, 40, 10, 3, cfg["num_cw"], seed)
        ctx, ans = cwe_example(rng, words, n, cfg["freq_cw"], cfg["freq_ucw"], cfg["num_cw"], seed)
    example = template.format(context=ctx_ex, query="") + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ans_ex))
    return example + "\n" + template.format(context=ctx, query=""), ans


def fwe_vocab(rng, cfg, L, seed):
    size = L // 50 if cfg["vocab_size"] == -1 else cfg["vocab_size"]
    size = max(size, 4)
    wl = cfg["coded_wordlen"]
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=wl)) for _ in range(size)]
    while len(set(vocab)) < size:
        vocab.append("".join(rng.choices(string.ascii_lowercase, k=wl)))
    vocab = sorted(set(vocab))
    random.Random(seed).shuffle(vocab)
    vocab[0] = "..."
    return vocab


def fwe_input(vocab, n, template, cfg, seed):
    from scipy.special import zeta

    k = np.arange(1, len(vocab) + 1)
    cnt = (n * (k ** -cfg["alpha"]) / zeta(cfg["alpha"])).astype(int)
    words = [w for w, c in zip(vocab, cnt) for _ in range(c)]
    random.Random(seed).shuffle(words)
    return template.format(context=" ".join(words), query=""), vocab[1:4]


def read_squad(path):
    data = json.loads(Path(path).read_text())
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    idx = {c: i for i, c in enumerate(docs)}
    qas = []
    for d in data["data"]:
        more = [idx[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            for q in p["qas"]:
                if not q.get("is_impossible", False):
                    qas.append({"query": q["question"], "outputs": [a["text"] for a in q["answers"]],
                                "context": [idx[p["context"]]],
                                "more_context": [i for i in more if i != idx[p["context"]]]})
    return qas, docs


def read_hotpotqa(path):
    data = json.loads(Path(path).read_text())
    docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
    idx = {c: i for i, c in enumerate(docs)}
    qas = [{"query": d["question"], "outputs": [d["answer"]],
            "context": [idx[f"{t}\n{''.join(p)}"] for t, p in d["context"]]} for d in data]
    return qas, docs


def qa_input(rng, n, template, qas, docs, index, seed):
    q = qas[index % len(qas)]
    cur, more = q["context"], q.get("more_context", [])
    if n < len(docs):
        if n - len(cur) > len(more):
            used = set(cur + more)
            extra = [i for i in range(len(docs)) if i not in used]
            chosen = cur + more + rng.sample(extra, max(0, n - len(cur) - len(more)))
        else:
            chosen = cur + rng.sample(more, max(0, n - len(cur)))
        chosen = [docs[i] for i in chosen]
    else:
        chosen = list(docs)
    random.Random(seed).shuffle(chosen)
    context = "\n\n".join(RULER_QA_DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(chosen))
    return template.format(context=context, query=q["query"]), q["outputs"]


# --- length control -----------------------------------------------------------------------------------------------
def largest_fitting(size, budget: int, limit: int | None = None) -> int:
    """Largest m >= 1 (up to ``limit``) whose probe fits, ``size(m) <= budget``, for a ``size`` non-decreasing in m
    (``size(m)`` = the probe's token count, None when the probe cannot be built: does not fit); 0 if m = 1 does
    not fit. Same answer as doubling + bisection, in fewer tokenisations: each probe is predicted from the counts
    already seen (extrapolated from the last two fitting probes until the boundary is bracketed, then linear
    interpolation between the nearest fitting and non-fitting probes, with a bisection step whenever
    interpolation moves the same side twice in a row). Token counts grow about linearly with the haystack, so a
    search takes ~4 tokenisations instead of ~2 log2(m)."""
    known: dict[int, int | None] = {}

    def fits(m: int) -> bool:
        if m not in known:
            known[m] = size(m)
        return known[m] is not None and known[m] <= budget

    if not fits(1):
        return 0
    cap = max(limit, 1) if limit is not None else None
    lo, hi, prev = 1, None, None  # fits(lo); hi = the smallest probed m that does not fit
    side, repeat = None, 0  # the side the last interpolation moved, and how many times in a row
    while True:
        if (cap is not None and lo >= cap) or (hi is not None and hi - lo <= 1):
            return lo
        c_lo = known[lo]
        c_hi = known.get(hi) if hi is not None else None
        bisected = False
        if hi is None and prev is not None and c_lo > known[prev]:  # extrapolate the last two fitting probes
            guess = lo + int((budget - c_lo) * (lo - prev) // (c_lo - known[prev]))
        elif hi is None:
            guess = 2 * lo
        elif c_hi is not None and c_hi > c_lo and repeat < 2:  # interpolate inside the bracket
            guess = lo + int((budget - c_lo) * (hi - lo) // (c_hi - c_lo))
        else:
            guess, bisected = (lo + hi) // 2, True
        upper = hi - 1 if hi is not None else cap
        guess = max(lo + 1, guess if upper is None else min(guess, upper))
        now = "lo" if fits(guess) else "hi"
        if now == "lo":
            prev, lo = lo, guess
        else:
            hi = guess
        if bisected or hi is None:
            side, repeat = None, 0
        else:
            side, repeat = now, (repeat + 1 if now == side else 1)


class RulerGenerator:
    """Samples of one task at one length. ``count(text)`` = prompt tokens as fed to the model (BOS included)."""

    def __init__(self, tokenizer, seed: int = 42, model_template: str = "base", essay_dir: str = "",
                 squad_path: str = "", hotpotqa_path: str = "", tokens_to_generate: dict | None = None,
                 small_threshold: int = 4096, vt_icl_length: int = 500, essay_increment: int = 500,
                 remove_newline_tab: bool = False, vt_increment: int = 10, answer_prefix_join: str | None = None):
        self.tok, self.seed = tokenizer, seed
        # None: RULER's answer prefix as is (it starts with a space); a string (HELMET: "\n") replaces that space
        self.answer_prefix_join = answer_prefix_join
        if model_template == "tokenizer":  # the checkpoint's own chat template (an instruct model)

            self.model_template = tokenizer_chat_template(tokenizer, "task_template")
        else:
            self.model_template = RULER_MODEL_TEMPLATES.get(model_template, model_template)
        self.essay_dir, self.paths = essay_dir, {"squad": squad_path, "hotpotqa": hotpotqa_path}
        self.ttg_override = dict(tokens_to_generate or {})
        self.small_threshold, self.vt_icl_length = small_threshold, vt_icl_length
        self.essay_increment = essay_increment
        self.vt_increment = vt_increment  # noise lines per length-search step (RULER: 10)
        self.remove_newline_tab = remove_newline_tab
        self._haystack: Haystack | None = None
        self._qa: dict = {}
        self._counter = None

    def count(self, text: str) -> int:
        """Prompt tokens as fed to the model: ``len(tokenizer(text).input_ids)``. With a fast (Rust) tokenizer
        the backend is called directly without offsets (``encode_batch_fast``; same ids, ~25% less time),
        after checking on a probe text that it counts exactly as the tokenizer does."""
        if self._counter is None:
            self._counter = self._fast_counter() or (lambda t: len(self.tok(t).input_ids))
        return self._counter(text)

    def _fast_counter(self):
        backend = getattr(self.tok, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_batch_fast"):
            return None

        def fast(t: str) -> int:
            return len(backend.encode_batch_fast([t], add_special_tokens=True)[0].ids)

        probe = ("Some special magic numbers are hidden within the following text.\n\tOne of the special magic "
                 "uuids for 4f2b-88aa is: 123e4567-e89b-12d3-a456-426614174000. VAR ABCDE = 12345  \n\n Answer:")
        try:
            same = all(fast(t) == len(self.tok(t).input_ids) for t in (probe, " " + probe, probe[:40]))
        except Exception:  # noqa: BLE001 - any backend quirk: use the tokenizer itself
            return None
        return fast if same else None

    def tokens_to_generate(self, task: str) -> int:
        kind = TASKS[task][0]
        return int(self.ttg_override.get(task, self.ttg_override.get(kind, RULER_TASKS[kind]["tokens_to_generate"])))

    def template(self, kind: str) -> str:
        t = RULER_TASKS[kind]
        prefix = t["answer_prefix"] if self.answer_prefix_join is None else \
            self.answer_prefix_join + t["answer_prefix"].lstrip(" ")
        return self.model_template.format(task_template=t["template"]) + prefix

    def unavailable(self, task: str) -> str | None:
        """Reason the task cannot run here (qa data missing), else None."""
        kind, cfg = TASKS[task]
        if kind == "qa":
            p = self.paths[cfg["dataset"]]
            if not p or not Path(p).is_file():
                name = "SQuAD v2 dev (dev-v2.0.json)" if cfg["dataset"] == "squad" else \
                    "HotpotQA dev distractor (hotpot_dev_distractor_v1.json)"
                return f"{name} not found locally (set {cfg['dataset']}_path); no download at run time"
        return None

    def haystack(self, words_needed: int) -> Haystack:
        if self._haystack is None or len(self._haystack.words) < words_needed:
            self._haystack = Haystack(self.essay_dir, words_needed)
        return self._haystack

    def qa_data(self, dataset: str):
        if dataset not in self._qa:
            reader = read_squad if dataset == "squad" else read_hotpotqa
            self._qa[dataset] = reader(self.paths[dataset])
        return self._qa[dataset]

    def _builder(self, task: str, L: int, index: int):
        """(build(n) -> (input, answers), increment, limit) for one sample; build is deterministic in n."""
        kind, cfg = TASKS[task]
        tmpl = self.template(kind)
        sseed = f"ruler-{self.seed}-{task}-{L}-{index}"
        rng = lambda: random.Random(sseed)  # noqa: E731
        if kind == "niah":
            if cfg["type_haystack"] == "essay":
                hay = self.haystack(2 * L)  # a word is at least one token: 2L words are always enough
                inc = self.essay_increment
                return (lambda n: niah_input(rng(), n, tmpl, cfg, self.seed, hay)), inc, len(hay.words) // inc
            inc = 25 if L >= self.small_threshold else 5
            return (lambda n: niah_input(rng(), n, tmpl, cfg, self.seed, None)), inc, None
        if kind == "variable_tracking":
            icl = self.vt_icl(task)

            def build(n):
                text, ans = vt_input(rng(), n, tmpl, cfg)
                cut = text.index(RULER_TASKS["variable_tracking"]["template"][:20])
                return text[:cut] + " " + icl + "\n\n" + text[cut:], ans

            return build, self.vt_increment, None
        if kind == "common_words_extraction":
            words = cwe_words(L // 2, self.seed)
            return (lambda n: cwe_input(rng(), n, tmpl, cfg, self.seed, L, words, self.small_threshold)), 10, \
                len(words) // 10
        if kind == "freq_words_extraction":
            vocab = fwe_vocab(rng(), cfg, L, self.seed)
            return (lambda n: fwe_input(vocab, n, tmpl, cfg, self.seed)), max(L // 32, 1), None
        if kind == "qa":
            qas, docs = self.qa_data(cfg["dataset"])
            return (lambda n: qa_input(rng(), n, tmpl, qas, docs, index, self.seed)), 10, \
                max(1, math.ceil(len(docs) / 10))
        raise ValueError(kind)

    @cache  # noqa: B019 (one generator per evaluation run)
    def vt_icl(self, task: str) -> str:
        """The vt one-shot example: a 3-letter-name sample built at ``vt_icl_length`` tokens, answer appended."""
        kind, cfg = TASKS[task]
        tmpl = self.template(kind)
        ttg = RULER_TASKS[kind]["tokens_to_generate"]
        build = lambda n: vt_input(random.Random(f"ruler-{self.seed}-vt-icl"), n, tmpl, cfg, is_icl=True)  # noqa
        m = largest_fitting(lambda m: self.count(" ".join([(b := build(5 * m))[0]] + b[1])),
                             self.vt_icl_length - ttg)
        text, ans = build(5 * m if m else 1)  # one noise line (split into sentences) when 5 do not fit
        return text + " " + " ".join(ans) + "\n\n"

    def samples(self, task: str, L: int, n_samples: int) -> list[dict]:
        """``n_samples`` samples {input, outputs, length (prompt tokens + tokens_to_generate), tokens_to_generate}.
        Raises DoesNotFit when even the smallest instance exceeds L."""
        ttg = self.tokens_to_generate(task)

        def size(build, inc):  # the length search probes with the answers appended, as the original does
            def f(m):
                try:
                    text, ans = build(inc * m)
                except DoesNotFit:
                    return None
                return self.count(text + " " + " ".join(ans))
            return f

        build0, inc, limit = self._builder(task, L, 0)
        m_star = largest_fitting(size(build0, inc), L - ttg, limit)
        if m_star == 0:
            m_star = 1
        out = []
        for i in range(n_samples):
            build, inc, _ = self._builder(task, L, i) if i else (build0, inc, limit)
            m = m_star
            while m > 0:  # shrink by one increment until the prompt itself fits: one tokenisation per sample
                try:
                    text, ans = build(inc * m)
                except DoesNotFit:
                    m -= 1
                    continue
                n_tok = self.count(text)
                if n_tok + ttg <= L:
                    break
                m -= 1
            if m == 0:
                raise DoesNotFit(f"{task} does not fit in {L} tokens with tokens_to_generate={ttg}")
            if self.remove_newline_tab:
                text = " ".join(text.replace("\n", " ").replace("\t", " ").strip().split())
                n_tok = self.count(text)
            out.append({"index": i, "input": text, "outputs": list(ans), "length": n_tok + ttg,
                        "tokens_to_generate": ttg, "size": inc * m})
        return out
