"""Synthetic retrieval documents for the tiny model's pretraining, with varied wording, separators and filler.

Why varied: a tiny model trained on one passkey template learns the template, not retrieval (measured here: the
same words re-spaced dropped its accuracy from 1.00 to 0.07; ``../shared/notes/environment.md``). Every document
therefore draws its key name, value type, info-line phrasing, question phrasing, separators, filler kind and
distractors at random, and no document may contain an evaluation template (``harness.evals.templates``): a
document that would is rejected and drawn again.

Document kinds:
- ``retrieval``: filler with one key/value statement at a random depth, optional distractor statements with other
  key names, a question about the key at the end and the value as answer;
- ``kv``: a list of key/value pairs (word or number keys), then a query for one key and its value;
- ``recall``: a word or code phrase to remember, filler, then a request to repeat it;
- ``cued``: like ``retrieval``, but the question ends with the same cue phrase that introduced the value (the cue's
  wording varies per document: "the vault code is", "Serial number:", "[token]", ...), as a repeated phrase in a
  natural document continues the same way. Its answer is reachable by in-context copying (an induction head), the
  ability passkey / NIAH / RULER measure. Measured here: continuing the 3-stage model on these documents, passkey
  accuracy at C went 0.00 -> 0.30 between steps 400 and 700 while the other kinds had given 0.00 in 3,200 steps.
"""
from __future__ import annotations

import random
import string
from typing import Callable, Sequence

from harness.evals.templates import EVAL_FRAGMENTS

KEY_NAMES = [
    "pass key", "passkey", "secret code", "access code", "magic number", "PIN", "key number", "secret number",
    "lucky number", "vault code", "ticket number", "password", "door code", "serial number", "token", "code word",
    "combination", "reference number", "special number", "hidden value",
]
INTROS = [
    "", "Read the text below and keep the important value in mind.", "Somewhere in this document a value is stored.",
    "Notes:", "Memorise the following detail.", "A value is hidden below; you will be asked for it later.",
    "Pay attention: one line below matters.", "The following text contains one key fact among much noise.",
    "Log file follows.", "Here is a long text. Find the important part.", "Task: remember the value given below.",
]
INFO = [
    "The {k} is {v}.", "{K}: {v}", "the {k} = {v}", "Note that the {k} is {v}.", "{v} is the {k}.",
    "Remember, {k} {v}.", "The {k} is {v}. Keep it. {v} is the {k}.", "[{k}] {v}", "IMPORTANT: {k} is {v}.",
    "My {k} is {v}.", "{K} = {v};", "Your {k}: {v}. Do not forget it.", "The {k} you need is {v}.",
    "{K} -> {v}", "Write down the {k}, it is {v}.",
]
QUESTIONS = [
    "What is the {k}? The {k} is", "Question: what is the {k}?\nAnswer:", "Q: {k}?\nA:", "The {k} mentioned above is",
    "Recall the {k}:", "{K} =", "Which {k} was given? It was", "Tell me the {k}. The {k} is", "{K}?", "So the {k} was",
    "Quiz: the {k} is", "What was the {k}?\n", "Answer with the {k}:", "what {k} did the text contain? It is",
]
SEPARATORS = ["\n", " ", "\n\n", " ", "\n", " | ", "\n- "]
NOUNS = [
    "river", "table", "window", "garden", "horse", "mountain", "letter", "castle", "candle", "forest", "bridge",
    "tower", "ship", "road", "apple", "stone", "cloud", "field", "door", "lamp", "book", "ring", "crown", "song",
    "bird", "cat", "dog", "king", "queen", "storm", "village", "wheel", "clock", "coat", "boat", "house", "wall",
]
ADJS = [
    "red", "old", "quiet", "tall", "bright", "cold", "warm", "small", "large", "dark", "heavy", "light", "soft",
    "loud", "slow", "fast", "round", "sharp", "sweet", "bitter", "empty", "full", "young", "ancient", "golden",
]
VERBS = ["runs", "sleeps", "waits", "falls", "turns", "shines", "stands", "moves", "rests", "sings", "grows"]

Counter = Callable[[str], int]


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 3)


def _value(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.7:
        return str(rng.randint(0, 10 ** rng.randint(1, 7) - 1))
    if r < 0.85:
        return f"{rng.choice(ADJS)}-{rng.choice(NOUNS)}"
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(4, 8)))


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _simple_sentence(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.4:
        return f"The {rng.choice(NOUNS)} is {rng.choice(ADJS)}."
    if r < 0.7:
        return f"A {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)}."
    return f"{_cap(rng.choice(NOUNS))}s {rng.choice(VERBS)[:-1]} near the {rng.choice(NOUNS)}."


class FillerFactory:
    """Produces filler pieces (sentences / lines) from natural text or from repeated simple sentences."""

    def __init__(self, texts: Sequence[str], seed: int = 0):
        self.lines = [ln.strip() for t in texts for ln in t.splitlines() if len(ln.strip()) > 3]
        self.rng = random.Random(seed)

    def pieces(self, rng: random.Random, n: int) -> list[str]:
        kind = rng.random()
        if kind < 0.35 and self.lines:  # a contiguous run of natural-text lines
            start = rng.randrange(max(1, len(self.lines) - n))
            return self.lines[start : start + n]
        if kind < 0.7:  # a small set of simple sentences repeated, like passkey garbage but never the same words
            pool = [_simple_sentence(rng) for _ in range(rng.randint(2, 5))]
            block = " ".join(pool)
            return [block] * n
        return [_simple_sentence(rng) for _ in range(n)]


def _retrieval(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    k = rng.choice(KEY_NAMES)
    v = _value(rng)
    sep = rng.choice(SEPARATORS)
    intro = rng.choice(INTROS)
    info = rng.choice(INFO).format(k=k, K=_cap(k), v=v)
    q = rng.choice(QUESTIONS).format(k=k, K=_cap(k))
    head = [intro] if intro else []
    fixed = count(sep.join(head + [info, q])) + count(v) + 2
    distract = []
    if rng.random() < 0.35:
        for _ in range(rng.randint(1, 3)):
            k2 = rng.choice([n for n in KEY_NAMES if n != k])
            distract.append(rng.choice(INFO).format(k=k2, K=_cap(k2), v=_value(rng)))
        fixed += sum(count(d) for d in distract)
    room = budget - fixed
    pieces = filler.pieces(rng, 400) if room > 0 else []
    body, used = [], 0
    for p in pieces:
        c = count(p) + 1
        if used + c > room:
            break
        body.append(p)
        used += c
    for line in [info] + distract:
        body.insert(rng.randint(0, len(body)), line)
    answer_sep = "" if q.endswith("\n") else " "
    return sep.join(head + body + [q]) + answer_sep + v


def _kv(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    n = rng.randint(2, 12)
    word_keys = rng.random() < 0.6
    keys: list[str] = []  # distinct, in draw order (a set's order would depend on PYTHONHASHSEED)
    while len(keys) < n:
        key = f"{rng.choice(ADJS)}-{rng.choice(NOUNS)}" if word_keys else str(rng.randint(100, 99999))
        if key not in keys:
            keys.append(key)
    vals = [_value(rng) for _ in keys]
    line_fmt = rng.choice(["{a}: {b}", "{a} = {b}", "key {a} value {b}", "\"{a}\": \"{b}\"", "{a} -> {b}"])
    sep = rng.choice(SEPARATORS)
    lines = [line_fmt.format(a=a, b=b) for a, b in zip(keys, vals)]
    qfmt = rng.choice(["What is the value of {a}? {b}", "Look up {a}: {b}", "{a} -> {b}", "The value for {a} is {b}",
                       "Query {a}. Answer: {b}"])
    asked = rng.sample(range(n), rng.randint(1, min(4, n)))  # several queries: more copy targets per document
    q = sep.join(qfmt.format(a=keys[i], b=vals[i]) for i in asked)
    room = budget - count(sep.join(lines + [q])) - 2
    body = list(lines)
    if room > 20:
        extra, used = [], 0
        for p in filler.pieces(rng, 200):
            c = count(p) + 1
            if used + c > room:
                break
            extra.append(p)
            used += c
        for p in extra:  # interleave filler between the pairs
            body.insert(rng.randint(0, len(body)), p)
    return sep.join(body + [q])


def _recall(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    word = f"{rng.choice(ADJS)} {rng.choice(NOUNS)}" if rng.random() < 0.5 else _value(rng)
    first = rng.choice(["Remember the phrase: {w}.", "Keep this in mind: {w}", "The word of the day is {w}.",
                        "Today's code: {w}"]).format(w=word)
    last = rng.choice(["Repeat the phrase:", "What was the word of the day?", "Now write it again:",
                       "Which code was it?"])
    sep = rng.choice(SEPARATORS)
    room = budget - count(first + last) - count(word) - 2
    body, used = [], 0
    for p in filler.pieces(rng, 300):
        c = count(p) + 1
        if used + c > room:
            break
        body.append(p)
        used += c
    return sep.join([first] + body + [last]) + " " + word


def _repeat(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    """A span of text (or random numbers / words) and then the same span again: the classic induction-head signal
    (every token of the second copy is predictable only by copying)."""
    kind = rng.random()
    if kind < 0.4:
        span = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(3, 30)))
    elif kind < 0.7:
        span = " ".join(rng.choice(NOUNS + ADJS + VERBS) for _ in range(rng.randint(3, 30)))
    else:
        span = " ".join(filler.pieces(rng, rng.randint(1, 4)))
    ids_budget = max(8, (budget - 6) // 2)
    while count(span) > ids_budget and len(span) > 8:
        span = span[: len(span) * 3 // 4]
    sep = rng.choice(["\n", " ", " || ", "\nAgain: ", "\nRepeat:\n", ". "])
    gap = []
    room = budget - 2 * count(span) - 4
    if room > 10 and rng.random() < 0.5:
        used = 0
        for p in filler.pieces(rng, 100):
            c = count(p) + 1
            if used + c > room:
                break
            gap.append(p)
            used += c
    reps = rng.choice([1, 1, 2, 3])  # several repetitions: most tokens after the first copy are copy targets
    return span + sep + (" ".join(gap) + sep if gap else "") + sep.join([span] * reps)


CUES = ["the {k} is", "{K}:", "{k} =", "my {k} is", "{K} ->", "the {k} you need is", "[{k}]", "your {k}:",
        "The {k} is", "{K} is", "the {k} was", "{k}:", "the {k} equals"]
CUE_ENDS = [".", "", ";", ". Keep it.", ". Do not lose it.", ".", " (note this)", "!"]
CUE_LEADS = ["", "Question: ", "Now recall. ", "What was it? ", "Q: ", "So ", "Quiz time. ", "Tell me: ", "Answer: ",
             "Once more, ", "Recall: "]


def _cued(rng, filler: FillerFactory, budget: int, count: Counter, distract_p: float = 0.3) -> str:
    k = rng.choice(KEY_NAMES)
    v = _value(rng) if rng.random() < 0.3 else str(rng.randint(10, 10 ** rng.randint(2, 7)))
    cue = rng.choice(CUES).format(k=k, K=_cap(k))
    info = f"{cue} {v}{rng.choice(CUE_ENDS)}"
    if rng.random() < 0.3:
        info += f" {v} is the {k}." if rng.random() < 0.5 else f" Again, {cue} {v}."
    q = rng.choice(CUE_LEADS) + cue
    sep = rng.choice(SEPARATORS)
    intro = rng.choice(INTROS)
    distract = []
    if rng.random() < distract_p:  # other keys with their own cues: the cue must be matched, not just "a number"
        for _ in range(rng.randint(1, 3)):
            k2 = rng.choice([n for n in KEY_NAMES if n != k])
            distract.append(rng.choice(CUES).format(k=k2, K=_cap(k2)) + f" {_value(rng)}{rng.choice(CUE_ENDS)}")
    room = budget - count(sep.join([intro, info, q] + distract)) - count(v) - 3
    body, used = [], 0
    for p in filler.pieces(rng, 400) if room > 0 else []:
        c = count(p) + 1
        if used + c > room:
            break
        body.append(p)
        used += c
    for line in [info] + distract:
        body.insert(rng.randint(0, len(body)), line)
    return sep.join(([intro] if intro else []) + body + [q]) + " " + v


KINDS = {"retrieval": _retrieval, "kv": _kv, "recall": _recall, "repeat": _repeat, "cued": _cued}
KIND_WEIGHTS = {"retrieval": 0.40, "kv": 0.30, "recall": 0.10, "repeat": 0.20}  # ``cued``: pretraining stages only


def set_kind_weights(**weights: float) -> None:
    """Change the mixture of document kinds (the pretraining curriculum's copy-heavy stage uses this)."""
    KIND_WEIGHTS.clear()
    KIND_WEIGHTS.update(weights)


def contains_eval_template(text: str) -> bool:
    return any(f in text for f in EVAL_FRAGMENTS)


def synthetic_document(rng: random.Random, filler: FillerFactory, budget_tokens: int,
                       count: Counter = _approx_tokens, kind: str | None = None) -> str:
    """One synthetic document of at most about ``budget_tokens`` tokens (as measured by ``count``)."""
    kinds, weights = zip(*KIND_WEIGHTS.items())
    for _ in range(100):
        k = kind or rng.choices(kinds, weights)[0]
        doc = KINDS[k](rng, filler, budget_tokens, count)
        if not contains_eval_template(doc):
            return doc
    raise RuntimeError("could not draw a synthetic document free of evaluation templates")
