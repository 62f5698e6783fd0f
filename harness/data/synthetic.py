"""Synthetic retrieval documents for the tiny model's pretraining, with varied wording, separators and filler.

Why varied: a tiny model trained on one passkey template learns the template, not retrieval (measured here: the
same words re-spaced dropped its accuracy from 1.00 to 0.07; ``../shared/notes/environment.md``). Every document
therefore draws its key name, value type, info-line phrasing, question phrasing, separators, filler kind and
distractors at random, and no document may contain an evaluation template (``harness.evals.templates``, checked
by ``harness.contamination``): a document that would is rejected and drawn again.

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
from collections.abc import Callable, Sequence

from harness.contamination import contains_eval_template

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


# Answer marks: the graded kinds wrap each answer in two control characters that no natural text or filler contains,
# so that a pretraining stage can supervise the answers alone (``split_answers``); ``synthetic_document`` removes
# them unless asked for the spans.
ANSWER_OPEN, ANSWER_CLOSE = "\x02", "\x03"


def _answer(text: str) -> str:
    return f"{ANSWER_OPEN}{text}{ANSWER_CLOSE}"


def split_answers(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``text`` without its answer marks, and the character spans ``[start, end)`` of the marked answers in it."""
    out, spans, start, pos = [], [], None, 0
    for ch in text:
        if ch == ANSWER_OPEN:
            start = pos
        elif ch == ANSWER_CLOSE:
            spans.append((start, pos))
        else:
            out.append(ch)
            pos += 1
    return "".join(out), spans


# --- graded retrieval (RULER's multi-key / multi-value / variable-tracking families, never their templates) --------
LOOKUP_NOUNS = ["code", "number", "id", "value", "tag", "label", "key", "digits", "word", "entry", "figure",
                "reading", "score", "mark", "secret", "count"]
LOOKUP_STATEMENTS = [
    "The {n} for {k} is {v}.", "{k}'s {n}: {v}", "entry {k} -> {v}", "{k} has {n} {v}.", "For {k}, the {n} is {v}.",
    "{n} of {k} = {v}", "[{k}] {n}: {v}", "Record: {k}, {n} {v}.", "We noted that the {n} of {k} is {v}.",
    "{k} -- {n} {v}", "({k}) {n} {v}", "Among the notes: {k} carries the {n} {v}.", "{k}: {v}",
]
LOOKUP_QUESTIONS = [
    "What is the {n} for {k}?", "Which {n} belongs to {k}?", "Look up {k}.", "Give the {n} of {k}.",
    "{k}: which {n} was written above?", "Find {k} in the notes above and report its {n}.", "Query: {k}",
    "What {n} did the text give for {k}?", "Tell me the {n} stored for {k}.",
]
LOOKUP_ANSWER_PREFIXES = [  # generic endings: the key is named earlier in the prefix, or only in the question
    "Answer:", "It is", "The {n} for {k} given in the notes above is", "The answer is",
    "The {n} that belongs to {k} in the text is", "Result:", "The {n} is", "The {n} for {k} mentioned above is",
    "According to the notes, the {n} of {k} written there is", "Found it. The {n} is", "The value we need is",
]
LOOKUP_ANSWER_ADJACENT = ["The {n} for {k} is", "{k} ->", "{k}:", "{n} of {k} ="]  # key right before the value
CHAIN_ASSIGN = ["{a} = {v}", "let {a} = {v}", "{a} := {v}", "set {a} to {v}", "{a} <- {v}", "{a} equals {v}",
                "assign {v} to {a}", "{a} is {v}", "{a} takes {v}", "put {v} into {a}"]
CHAIN_QUESTIONS = ["Which names hold the value {v}?", "Find every variable equal to {v}.",
                   "List all names that end up with {v}.", "Track {v}: which variables carry it?",
                   "Which of the names above are {v}?"]
CHAIN_ANSWER_PREFIXES = ["They are:", "Answer:", "The names are", "Variables:", "These hold {v}:", "In order:"]
LIST_SEPARATORS = [", ", " ", " and ", "; ", ",", " | ", "\n"]


def _pseudo(rng: random.Random, lo: int = 2, hi: int = 3) -> str:
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    return "".join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(lo, hi)))


def _plural(noun: str) -> str:
    return noun if noun.endswith("s") else noun[:-1] + "ies" if noun.endswith("y") else noun + "s"


def _key(rng: random.Random, style: int) -> str:
    """A lookup key in one of several styles (one style per document)."""
    if style == 0:
        return f"{rng.choice(ADJS)}-{rng.choice(NOUNS)}"
    if style == 1:
        return _pseudo(rng)
    if style == 2:
        return _cap(_pseudo(rng)) + " " + _cap(_pseudo(rng, 1, 2))
    if style == 3:
        return str(rng.randint(100, 999999))
    if style == 4:
        return "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(4, 8)))
    return f"{rng.choice(NOUNS)} {rng.randint(1, 99)}"


def _lookup_value(rng: random.Random, style: int) -> str:
    if style == 0:
        return str(rng.randint(10, 10 ** rng.randint(3, 7) - 1))
    if style == 1:
        return f"{rng.choice(ADJS)}-{rng.choice(NOUNS)}"
    if style == 2:
        return "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(4, 10)))
    return _pseudo(rng)


def _distinct(rng: random.Random, n: int, draw) -> list[str]:
    out: list[str] = []
    for _ in range(50 * n):
        if len(out) == n:
            break
        x = draw()
        if x not in out:
            out.append(x)
    return out


def _fill_around(rng, filler: FillerFactory, room: int, count: Counter, lines: list[str]) -> list[str]:
    """Filler pieces up to ``room`` tokens with ``lines`` inserted at random positions, in their order."""
    body, used = [], 0
    for p in filler.pieces(rng, 400) if room > 0 else []:
        c = count(p) + 1
        if used + c > room:
            break
        body.append(p)
        used += c
    slots = sorted(rng.randint(0, len(body)) for _ in lines)
    for j, (slot, line) in enumerate(zip(slots, lines)):
        body.insert(slot + j, line)
    return body


def _lookup(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    """Multi-key retrieval: 2-7 statements of one pattern that differ only in their key and value, among filler;
    then 1-3 questions, each naming one key, answered by that key's value. The answer prefix may or may not repeat
    the key, so the value must be found by matching the key named in the question, not the words just before it."""
    n_keys = rng.randint(2, 7)
    ks, vs = rng.randrange(6), rng.randrange(4)
    keys = _distinct(rng, n_keys, lambda: _key(rng, ks))
    vals = [_lookup_value(rng, vs) for _ in keys]
    noun = rng.choice(LOOKUP_NOUNS)
    stmt = rng.choice(LOOKUP_STATEMENTS)
    lines = [stmt.format(n=noun, k=k, v=v) for k, v in zip(keys, vals)]
    rng.shuffle(lines)
    sep = rng.choice(SEPARATORS)
    asked = rng.sample(range(len(keys)), rng.randint(1, min(3, len(keys))))
    qa = []
    for i in asked:
        q = rng.choice(LOOKUP_QUESTIONS).format(n=noun, k=keys[i])
        prefixes = LOOKUP_ANSWER_PREFIXES if rng.random() < 0.75 else LOOKUP_ANSWER_ADJACENT
        a = rng.choice(prefixes).format(n=noun, k=keys[i])
        qa.append(f"{q}{rng.choice([' ', chr(10)])}{a} {_answer(vals[i])}")
    intro = rng.choice(INTROS)
    room = budget - count(sep.join([intro] + lines + qa)) - 3
    body = _fill_around(rng, filler, room, count, lines)
    return sep.join(([intro] if intro else []) + body + qa)


FREE_MODIFIERS = ["", "", "", "secret ", "hidden ", "assigned ", "registered ", "lucky ", "private ", "official ",
                  "unique ", "stored ", "recorded ", "chosen ", "current "]
FREE_NOUNS = LOOKUP_NOUNS + ["pin", "password", "serial", "ticket", "reference", "access code", "digit string",
                             "record number", "identifier", "token"]
FREE_STATEMENTS = [
    "The {np} for {k} is{c} {v}.", "One of the {nps} for {k} is{c} {v}.", "{k} has the {np} {v}.",
    "The {np} of {k}{c} {v}", "For {k}, the {np} is {v}.", "{k}: {np} {v}.", "Note: the {np} assigned to {k} is {v}.",
    "{k} was given the {np} {v}.", "Here is a {np} for {k}: {v}.", "We recorded {v} as the {np} of {k}.",
    "A {np} that belongs to {k} is {v}.", "The {np} linked to {k} reads {v}.",
]
FREE_WHERE = ["", "", " mentioned above", " mentioned in the text", " in the notes above", " given earlier",
              " stated in the document", " from the list", " written before", " mentioned in this text"]
FREE_QUESTIONS = [
    "What is the {np} for {k}{w}?", "Which {np} was given to {k}{w}?", "Tell me the {np} of {k}{w}.",
    "What {np} does {k} have{w}?", "Find the {np} for {k}{w}.", "Question: the {np} of {k}{w}?",
    "Can you recall the {np} for {k}{w}?", "Now, what was the {np} of {k}{w}?",
]
FREE_ANSWERS = ["The {np} for {k}{w} is", "The {np} of {k} is", "{k}'s {np} is", "Answer:", "It is", "The answer is",
                "The {np} is", "For {k}, it is", "{k} ->", "The {np} for {k}{w} was", "Sure. The {np} is"]
FREE_INTROS = ["", "", "Some {nps} are listed in the text below. Remember them; questions follow.",
               "Several {nps} appear below, among other text. You will be asked about them.",
               "Read carefully: a few {nps} are stated in this document.", "Keep track of the {nps} below."]


def _lookup_free(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    """Multi-key retrieval with compositional wording: like ``lookup``, but the value's name (modifier + noun), the
    statement, question, answer prefix, their punctuation and an optional instruction are drawn independently from
    several lists (about 10^5 combinations rather than ``lookup``'s 13 x 9 x 15), so that a look-up learned on them
    cannot be tied to one phrasing."""
    n_keys = rng.randint(2, 7)
    ks, vs = rng.randrange(6), rng.randrange(5)
    keys = _distinct(rng, n_keys, lambda: _key(rng, ks))
    vals = [str(rng.randint(10 ** 6, 10 ** 7 - 1)) if vs == 4 else _lookup_value(rng, vs) for _ in keys]
    np_ = rng.choice(FREE_MODIFIERS) + rng.choice(FREE_NOUNS)
    nps = _plural(np_)
    stmt, c = rng.choice(FREE_STATEMENTS), rng.choice(["", ":"])
    lines = [stmt.format(np=np_, nps=nps, k=k, v=v, c=c) for k, v in zip(keys, vals)]
    rng.shuffle(lines)
    sep = rng.choice(SEPARATORS)
    asked = rng.sample(range(len(keys)), rng.randint(1, min(3, len(keys))))
    qa = []
    for i in asked:
        w = rng.choice(FREE_WHERE)
        q = rng.choice(FREE_QUESTIONS).format(np=np_, k=keys[i], w=w)
        a = rng.choice(FREE_ANSWERS).format(np=np_, k=keys[i], w=w)
        qa.append(f"{q}{rng.choice([' ', chr(10)])}{a} {_answer(vals[i])}")
    intro = rng.choice(FREE_INTROS).format(nps=nps)
    room = budget - count(sep.join([intro] + lines + qa)) - 3
    body = _fill_around(rng, filler, room, count, lines)
    return sep.join(([intro] if intro else []) + body + qa)


def _multivalue(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    """Multi-value retrieval: one key stated with 2-4 values at separate places (plus 0-2 distractor keys with their
    own values); the question asks for every value of the key, answered in order of appearance."""
    ks, vs = rng.randrange(6), rng.randrange(4)
    keys = _distinct(rng, 1 + rng.randint(0, 2), lambda: _key(rng, ks))
    noun = rng.choice(LOOKUP_NOUNS)
    stmt = rng.choice(["One {n} of {k} is {v}.", "{k} also has {n} {v}.", "A {n} for {k}: {v}",
                       "{k} -> {v}", "Another {n} of {k} is {v}.", "{k} {n} {v}", "[{k}] {v}"])
    entries = []
    for j, k in enumerate(keys):
        for _ in range(rng.randint(2, 4) if j == 0 else rng.randint(1, 2)):
            entries.append((k, _lookup_value(rng, vs)))
    rng.shuffle(entries)
    lines = [stmt.format(n=noun, k=k, v=v) for k, v in entries]
    target = keys[0]
    answer = rng.choice(LIST_SEPARATORS).join(v for k, v in entries if k == target)
    q = rng.choice(["List every {n} of {k}.", "What are all the {ns} given for {k}?", "Collect the {ns} of {k}.",
                    "Which {ns} belong to {k}?"]).format(n=noun, ns=_plural(noun), k=target)
    a = rng.choice(["The {ns} of {k} are", "Answer:", "They are", "{k}:", "All of them:"]).format(
        ns=_plural(noun), k=target)
    sep = rng.choice(SEPARATORS)
    tail = f"{q}{rng.choice([' ', chr(10)])}{a} {_answer(answer)}"
    room = budget - count(sep.join(lines + [tail])) - 3
    body = _fill_around(rng, filler, room, count, lines)
    return sep.join(body + [tail])


def _var_name(rng: random.Random, style: int) -> str:
    if style == 0:
        return "".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(3, 6)))
    if style == 1:
        return _pseudo(rng)
    if style == 2:
        return f"{rng.choice(NOUNS)}_{rng.randint(1, 99)}"
    return rng.choice(string.ascii_lowercase) + str(rng.randint(0, 999))


def _chain(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    """Variable tracking: 1-2 chains of assignments (a value, then names assigned from the previous name) in one of
    several syntaxes, spread through filler; the question asks which names hold the first chain's value, answered
    by the chain's names in order; sometimes instead the value of the chain's last name."""
    style = rng.randrange(4)
    syntax = rng.choice(CHAIN_ASSIGN)
    n_chains, hops = rng.choice([1, 1, 2]), rng.randint(1, 5)
    names = _distinct(rng, n_chains * (hops + 1), lambda: _var_name(rng, style))
    if len(names) < n_chains * (hops + 1):
        n_chains, hops = 1, len(names) - 1
    chains, values = [], []
    for c in range(n_chains):
        vs = names[c * (hops + 1) : (c + 1) * (hops + 1)]
        v = str(rng.randint(10, 10 ** rng.randint(2, 6) - 1))
        values.append(v)
        chains.append([syntax.format(a=vs[0], v=v)] + [syntax.format(a=vs[j + 1], v=vs[j]) for j in range(hops)])
    # interleave the chains, each keeping its own order
    lines, idx = [], [0] * n_chains
    while any(idx[c] < len(chains[c]) for c in range(n_chains)):
        c = rng.choice([c for c in range(n_chains) if idx[c] < len(chains[c])])
        lines.append(chains[c][idx[c]])
        idx[c] += 1
    first = names[: hops + 1]
    if rng.random() < 0.75:
        q = rng.choice(CHAIN_QUESTIONS).format(v=values[0])
        a = rng.choice(CHAIN_ANSWER_PREFIXES).format(v=values[0])
        joiner = " " if rng.random() < 0.5 else rng.choice(LIST_SEPARATORS)
        tail = f"{q}{rng.choice([' ', chr(10)])}{a} {_answer(joiner.join(first))}"
    else:
        tail = rng.choice(["What is the value of {x}?", "{x} = ?", "Evaluate {x}."]).format(x=first[-1]) + \
            rng.choice([" It is", "\nAnswer:", " ->", " Value:"]) + f" {_answer(values[0])}"
    sep = rng.choice(["\n", " ", "\n", "; ", " | "])
    room = budget - count(sep.join(lines + [tail])) - 3
    body = _fill_around(rng, filler, room, count, lines)
    return sep.join(body + [tail])


def _one_shot(kind):
    """A document of ``kind`` preceded, sometimes, by a short solved example of the same kind (other names,
    values and wording): the format of a one-shot prompt, where the example's answer must not be copied."""
    def make(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
        if budget < 160 or rng.random() < 0.6:
            return kind(rng, filler, budget, count)
        shot = kind(rng, filler, rng.randint(40, budget // 3), count)
        rest = budget - count(shot) - 2
        return shot + rng.choice(["\n\n", "\n", " ", "\n---\n"]) + kind(rng, filler, rest, count)
    return make


def _entities(rng, filler: FillerFactory, budget: int, count: Counter) -> str:
    """A long-range dependency document: 2-6 entities are introduced with an attribute near the start; the rest is
    filler in which the entities come back, each time with their attribute, so every later mention is predictable
    only from the introduction (far back in a long document, beyond a short window)."""
    ks = rng.randrange(3)
    names = _distinct(rng, rng.randint(2, 6), lambda: _key(rng, [1, 2, 5][ks]))
    attrs = [_lookup_value(rng, rng.randrange(4)) for _ in names]
    intro_fmt = rng.choice(["{k} ({v})", "{K} is known as {v}.", "{k}: {v}", "Meet {k}, whose mark is {v}.",
                            "{k} = {v}"])
    back_fmt = rng.choice(["Later {k} ({v}) returned.", "{K} again, mark {v}.", "{k}: {v}", "Once more {k} = {v}.",
                           "and {k}, that is {v},"])
    sep = rng.choice(SEPARATORS)
    intro = [intro_fmt.format(k=k, K=_cap(k), v=v) for k, v in zip(names, attrs)]
    mentions = [back_fmt.format(k=k, K=_cap(k), v=v) for k, v in
                (rng.choice(list(zip(names, attrs))) for _ in range(rng.randint(2, 8)))]
    head = sep.join(intro)
    room = budget - count(head) - sum(count(m) + 1 for m in mentions) - 3
    body = _fill_around(rng, filler, room, count, mentions)
    # the mentions come after a stretch of filler: move the first filler block ahead of them
    return head + sep + sep.join(body)


KINDS = {"retrieval": _retrieval, "kv": _kv, "recall": _recall, "repeat": _repeat, "cued": _cued,
         "lookup": _one_shot(_lookup), "lookup_free": _one_shot(_lookup_free), "multivalue": _one_shot(_multivalue),
         "chain": _one_shot(_chain),
         "entities": _entities}
KIND_WEIGHTS = {"retrieval": 0.40, "kv": 0.30, "recall": 0.10, "repeat": 0.20}  # ``cued``: pretraining stages only


def set_kind_weights(**weights: float) -> None:
    """Change the mixture of document kinds (the pretraining curriculum's copy-heavy stage uses this)."""
    KIND_WEIGHTS.clear()
    KIND_WEIGHTS.update(weights)


def synthetic_document(rng: random.Random, filler: FillerFactory, budget_tokens: int,
                       count: Counter = _approx_tokens, kind: str | None = None, answers: bool = False):
    """One synthetic document of at most about ``budget_tokens`` tokens (as measured by ``count``); with
    ``answers=True``, the pair (text, character spans of its answers) (the graded kinds mark their answers; the
    other kinds give no spans)."""
    kinds, weights = zip(*KIND_WEIGHTS.items())
    unmarked = str.maketrans("", "", ANSWER_OPEN + ANSWER_CLOSE)

    def count_text(text: str) -> int:  # budgets count the document as it will be read, without its answer marks
        return count(text.translate(unmarked))

    for _ in range(100):
        k = kind or rng.choices(kinds, weights)[0]
        doc, spans = split_answers(KINDS[k](rng, filler, budget_tokens, count_text))
        if not contains_eval_template(doc):
            return (doc, spans) if answers else doc
    raise RuntimeError("could not draw a synthetic document free of evaluation templates")
