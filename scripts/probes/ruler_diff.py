"""Differential check of the project's RULER-style samples against lm-eval's RULER generator (issue 48).

    pip install --target /tmp/ww wonderwords==3.0.1      # lm-eval's RULER imports it (not a project dependency)
    python scripts/probes/ruler_diff.py --pythonpath /tmp/ww [--samples 30] [--lengths 1024,2048,4096]
        [--write docs/ruler_check.md]

Both generators are run here, offline, with the same tokenizer (the shipped tiny_llama's) on the tasks lm-eval can
build without a download: niah_single_1 (repeat haystack), niah_multikey_2 (needle haystack, word keys),
niah_multikey_3 (needle haystack, uuid keys and values), vt and fwe. The essay tasks (niah_single_2/3,
niah_multikey_1, niah_multivalue, niah_multiquery) need Paul Graham essays from the Hub and nltk's punkt model, qa_1 /
qa_2 need SQuAD / HotpotQA, and cwe is left out (its word lists come from wonderwords in both, but lm-eval's cwe reads
them at import from a network-free path only in newer versions): those are compared by construction only, in
docs/ruler_check.md. lm-eval's generator imports nltk and asks for the punkt model at import; the import is made
with nltk's lookup answered locally (no download; punkt is used only by the essay haystack, not compared here).

Per task and length, over ``--samples`` samples of each generator (ours: ``harness.evals.ruler_data``, default
settings, seed 42; lm-eval: its ``generate_samples`` / ``sys_vartrack_w_noise_random`` / ``sys_kwext`` after
``random.seed(42)``): the prompt's first and last lines (template), the prompt length in tokens + the generation
budget against L, the haystack size, where the answer sits in the context (fraction of the context before it; a
Kolmogorov-Smirnov two-sample test between the generators), the answer's format and the share of keys drawn from
lm-eval's word list. ``--write`` replaces the generated section of the given markdown file (between its markers).
"""
from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- ruler_diff: begin (generated) -->", "<!-- ruler_diff: end -->"
TASKS = ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "fwe"]
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def import_lm_eval_ruler():
    """lm-eval's RULER generators, imported without the punkt download it attempts at import."""
    import nltk

    find = nltk.data.find

    def local_find(resource, *a, **k):
        if "punkt" in str(resource):
            return ""
        return find(resource, *a, **k)

    nltk.data.find = local_find
    try:
        from lm_eval.tasks.ruler import fwe_utils, prepare_niah, vt_utils
    finally:
        nltk.data.find = find
    return prepare_niah, vt_utils, fwe_utils


def lm_eval_samples(task: str, L: int, n: int, tok, mods) -> list[dict]:
    prepare_niah, vt_utils, fwe_utils = mods
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE

    random.seed(42)
    np.random.seed(42)
    cfg = {"niah_single_1": dict(type_haystack="repeat", type_needle_k="words", type_needle_v="numbers"),
           "niah_multikey_2": dict(type_haystack="needle", type_needle_k="words", type_needle_v="numbers"),
           "niah_multikey_3": dict(type_haystack="needle", type_needle_k="uuids", type_needle_v="uuids")}
    if task in cfg:
        return prepare_niah.generate_samples(prepare_niah.get_haystack(type_haystack=cfg[task]["type_haystack"]),
                                             max_seq_length=L, template=TEMPLATE, num_samples=n, TOKENIZER=tok,
                                             **cfg[task])
    if task == "vt":
        icl = vt_utils.sys_vartrack_w_noise_random(tokenizer=tok, num_samples=1, max_seq_length=500, incremental=5)[0]
        return vt_utils.sys_vartrack_w_noise_random(tokenizer=tok, num_samples=n, max_seq_length=L, icl_example=icl)
    if task == "fwe":
        return fwe_utils.sys_kwext(tokenizer=tok, max_seq_length=L, num_samples=n)
    raise ValueError(task)


def our_samples(task: str, L: int, n: int, tok) -> list[dict]:
    from harness.evals.ruler_data import RulerGenerator

    return RulerGenerator(tok, seed=42).samples(task, L, n)


def _context_fraction(text: str, answer: str) -> float | None:
    i = text.find(answer)
    return None if i < 0 else i / max(1, len(text))


def _units(task: str, text: str) -> int:
    if task == "niah_single_1":
        return text.count("The grass is green.")
    if task.startswith("niah_multikey"):
        return text.count("One of the special magic")
    if task == "vt":
        return text.count("The grass is green.")
    return len(text.split())


def _line(s: str, last: bool) -> str:
    lines = [x for x in s.strip().split("\n") if x.strip()]
    x = lines[-1] if last else lines[0]
    x = re.sub(r"\b\d{5,}\b", "<num>", x)
    x = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<uuid>", x)
    x = re.sub(r"\b[a-z]+-[a-z]+\b", "<key>", x)
    x = re.sub(r"\b[A-Z]{3,5}\b", "<VAR>", x)
    x = re.sub(r"\b[a-z]{6}\b", "<w>", x)          # fwe's coded words
    return re.sub(r"(?:(?:\.\.\.|<w>) ?)+", "<words> ", x).strip()


def compare(task: str, L: int, n: int, tok, mods, words: set) -> dict:
    from scipy.stats import ks_2samp

    ours, theirs = our_samples(task, L, n, tok), lm_eval_samples(task, L, n, tok, mods)
    out = {"task": task, "L": L, "n": (len(ours), len(theirs))}
    # lm-eval keeps the answer prefix apart (gen_prefix); ours ends the prompt with it (RULER's own files do too)
    full = [s["input"] + (" " + s["gen_prefix"] if s.get("gen_prefix") else "") for s in theirs]
    out["first line"] = (_line(ours[0]["input"], False) == _line(full[0], False))
    out["last line"] = (_line(ours[0]["input"], True) == _line(full[0], True))
    out["last line ours"], out["last line lm-eval"] = _line(ours[0]["input"], True), _line(full[0], True)
    lo = [s["length"] / L for s in ours]
    lt = [s["length"] / L for s in theirs]
    out["length/L"] = (np.mean(lo), np.min(lo), np.max(lo)), (np.mean(lt), np.min(lt), np.max(lt))
    out["units"] = (np.mean([_units(task, s["input"]) for s in ours]),
                    np.mean([_units(task, s["input"]) for s in theirs]))
    if task != "fwe":
        do = [x for s in ours if (x := _context_fraction(s["input"], s["outputs"][0])) is not None]
        dt = [x for s in theirs if (x := _context_fraction(s["input"], s["outputs"][0])) is not None]
        ks = ks_2samp(do, dt)
        out["depth"] = (np.mean(do), np.mean(dt), float(ks.statistic), float(ks.pvalue))
    ans_o = [a for s in ours for a in s["outputs"]]
    ans_t = [a for s in theirs for a in s["outputs"]]

    def fmt(xs):
        if all(re.fullmatch(r"\d{7}", a) for a in xs):
            return "7-digit numbers"
        if all(UUID.match(a) for a in xs):
            return "uuid4"
        if all(re.fullmatch(r"[A-Z]{5}", a) for a in xs):
            return "5-letter names"
        if all(re.fullmatch(r"[a-z]{6}", a) for a in xs):
            return "6-letter coded words"
        return "mixed"

    out["answers"] = (fmt(ans_o), fmt(ans_t), np.mean([len(s["outputs"]) for s in ours]),
                      np.mean([len(s["outputs"]) for s in theirs]))
    if task.startswith("niah") and "words" in ("words" if task != "niah_multikey_3" else ""):
        keys_o = [k for s in ours for k in re.findall(r"for ([a-z]+-[a-z]+)", s["input"].rsplit("\n", 1)[-1])]
        out["keys in lm-eval's word list"] = np.mean([k in words for k in keys_o]) if keys_o else None
    return out


def render(rows: list[dict], n: int, tok_name: str) -> str:
    out = [BEGIN, "",
           f"Generated by `python scripts/probes/ruler_diff.py` ({n} samples per generator, task and length; "
           f"tokenizer: {tok_name}; ours with `RulerGenerator` defaults, seed 42; lm-eval "
           f"{_lm_eval_version()} after `random.seed(42)`). *length/L*: (prompt tokens + generation budget) / L, mean "
           "[min, max]; *units*: haystack sentences (niah_single_1, vt), haystack needles (niah_multikey_2/3), words "
           "(fwe), mean; *depth*: where the answer sits (fraction of the prompt before it), mean of ours vs lm-eval's, "
           "Kolmogorov-Smirnov statistic and p-value; *template*: the prompt's first / last line equal after "
           "masking the random keys and values (lm-eval's answer prefix, kept apart as `gen_prefix`, put back).",
           "",
           "| task | L | n (ours, lm-eval) | template first / last line | length/L ours | length/L lm-eval | units "
           "ours / lm-eval | depth ours / lm-eval (KS, p) | answers ours / lm-eval | keys in lm-eval's words |",
           "|:--|--:|:--|:--|:--|:--|:--|:--|:--|:--|"]
    for r in rows:
        (mo, ao, bo), (mt, at, bt) = r["length/L"]
        d = r.get("depth")
        dep = "\u2014" if d is None else f"{d[0]:.2f} / {d[1]:.2f} ({d[2]:.2f}, p = {d[3]:.2g})"
        a = r["answers"]
        k = r.get("keys in lm-eval's word list")
        out.append(f"| {r['task']} | {r['L']} | {r['n'][0]}, {r['n'][1]} | "
                   f"{'same' if r['first line'] else 'differs'} / {'same' if r['last line'] else 'differs'} | "
                   f"{mo:.3f} [{ao:.3f}, {bo:.3f}] | {mt:.3f} [{at:.3f}, {bt:.3f}] | "
                   f"{r['units'][0]:.1f} / {r['units'][1]:.1f} | {dep} | {a[0]} x{a[2]:g} / {a[1]} x{a[3]:g} | "
                   f"{'—' if k is None else f'{k:.2f}'} |")
    diffs = sorted({(r["task"], r["last line ours"], r["last line lm-eval"]) for r in rows if not r["last line"]})
    if diffs:
        out += ["", "Last lines that differ (masked):", ""]
        out += [f"- {t}: ours `{a}` / lm-eval `{b}`" for t, a, b in diffs]
    return "\n".join(out + ["", END])


def _lm_eval_version() -> str:
    try:
        from importlib.metadata import version

        return version("lm_eval")
    except Exception:  # noqa: BLE001
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pythonpath", default="", help="a directory holding wonderwords (not a project dependency)")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--write", default="", help="markdown file whose generated section is replaced")
    a = ap.parse_args(argv)
    if a.pythonpath:  # the probe's one outside dependency, wonderwords, from a folder the user names
        sys.path.insert(0, a.pythonpath)
    try:
        mods = import_lm_eval_ruler()
    except ImportError as e:
        print(f"ruler_diff: lm-eval's RULER generator does not import here ({e}); install wonderwords into a "
              "directory and pass it with --pythonpath", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tok_dir = ROOT / "harness" / "assets" / "tiny_llama"
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    words = set(mods[0].WORDS)
    rows = []
    for L in [int(x) for x in a.lengths.split(",")]:
        for t in TASKS:
            rows.append(compare(t, L, a.samples, tok, mods, words))
            r = rows[-1]
            print(t, L, r["length/L"], r["units"], r.get("depth"), r["answers"], flush=True)
    md = render(rows, a.samples, "the shipped tiny_llama's")
    if a.write:
        p = Path(a.write)
        text = p.read_text() if p.exists() else ""
        if BEGIN in text and END in text:
            text = text[:text.index(BEGIN)] + md + text[text.index(END) + len(END):]
        else:
            text = text + ("\n" if text else "") + md + "\n"
        p.write_text(text)
        print(f"ruler_diff: wrote {p}")
    else:
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
