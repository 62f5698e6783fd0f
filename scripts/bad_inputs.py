"""The bad-input catalogue (issues 21 item 2 + 5, 16 item 2): run ``run.py`` on each bad input, classify the outcome.

    python scripts/bad_inputs.py --json after.json                          # this checkout
    PYTHONPATH=/path/to/old python scripts/bad_inputs.py --root /path/to/old --json before.json   # another commit
    python scripts/bad_inputs.py --markdown docs/bad_inputs.md --before before.json --after after.json
    python scripts/bad_inputs.py --list                                     # the cases, nothing run

Every case is a cheap run (``method=base train=none eval=quick`` at one length and one sample, or a 2-step
``train=quick``) with its own temporary directories: rows (``HARNESS_RESULTS_DIR`` and ``paths.results_dir``), run
directories (``HARNESS_OUTPUT_DIR``), checkpoints (``HARNESS_CKPT_DIR``); the tokenised-data cache stays the
checkout's ``.cache``. Nothing is written under the checkout's ``results/``. Cases run one after another (``--timeout``
seconds each, 120 by default, address space capped at ``--mem-gib``) and are classified:

    clean      non-zero exit, no traceback, the last stderr line names the problem (the key, value or file), and a
               ``failed`` row exists in the results directory (when that directory can be written at all)
    unclear    non-zero exit without a traceback, but the last line does not name the problem, or no failed row
               (the reason says which)
    traceback  a Python traceback was printed (or Hydra's "Error executing job")
    crash      killed by a signal (native abort, out of memory)
    silent     exit 0: the bad input was accepted
    hang       still running after the timeout
    n/a        the case's key does not exist in that checkout (recorded, not run)

Controls (good inputs) are run too and must end ``ok``; they are not counted in the catalogue's totals.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BASE = ["method=base", "train=none", "eval=quick", "eval.lengths=[256]", "eval.suite.passkey.samples=1",
        "eval.suite.ppl_books.samples=1"]
TRAIN = ["train=quick", "train.tokens=8192"]  # 2 steps of one 8C sequence
NIAH = ["+evaluator@eval.suite.niah=niah", "eval.suite.niah.depth_intervals=1", "eval.suite.niah.gen_tokens=4",
        "eval.suite.niah.buffer=-1"]
CATEGORIES = ["clean", "unclear", "traceback", "crash", "silent", "hang", "n/a"]


@dataclass
class Case:
    name: str
    group: str                      # which issue item it belongs to
    args: list[str]                 # overrides on top of BASE ({tmp} = the case's temporary directory)
    words: list[str]                # each must appear in the last stderr line ("a|b": either), case-insensitive
    tokens_args: list[str] | None = None   # the same bad value for a checkout whose lengths are token counts
    setup: str | None = None        # see _setup
    writable: bool = True           # whether a failed row can be written at all
    requires: tuple[str, str] | None = None  # (file, text): the case applies only where the file holds the text
    results_elsewhere: bool = False  # HARNESS_RESULTS_DIR points elsewhere: the row belongs in paths.results_dir
    control: bool = False           # a good input: must end ok
    env: dict = field(default_factory=dict)


CASES = [
    # ---------------------------------------------------------------- controls
    Case("control: frozen base run", "control", [], [], control=True),
    # ---------------------------------------------------------------- issue 21 item 2: places that refuse writes
    Case("results dir is a file", "21.2", [], ["{tmp}/res"], setup="results_file", writable=False),
    Case("results dir read-only", "21.2", [], ["{tmp}/res"], setup="results_ro", writable=False),
    Case("results dir full", "21.2", [], ["{tmp}/res"], setup="results_full", writable=False),
    Case("outputs dir (hydra.run.dir) under a file", "21.2", ["hydra.run.dir={tmp}/afile/run"], ["{tmp}/afile"],
         setup="afile"),
    Case("checkpoint dir is a file (fine-tune)", "21.2", TRAIN + ["train.save_every=1"], ["{tmp}/ck"],
         setup="ckpt_file"),
    # ---------------------------------------------------------------- issue 21 item 5: late or missing validation
    Case("eval length 0", "21.5", ["eval.lengths=[0]"], ["eval.lengths"]),
    Case("eval length 1e9", "21.5", ["eval.lengths=[1000000000]"], ["eval.lengths"]),
    Case("eval length not an integer", "21.5", ["eval.lengths=[300.5]"], ["eval.lengths"]),
    Case("eval length 0 after fine-tuning config", "21.5", TRAIN + ["eval.lengths=[0]"], ["eval.lengths"]),
    Case("schedule typo", "21.5", TRAIN + ["train.schedule=cosinee"], ["schedule"]),
    Case("autocast=fp8", "21.5", ["autocast=fp8"], ["autocast"]),
    Case("train.autocast=fp8", "21.5", TRAIN + ["train.autocast=fp8"], ["autocast"]),
    Case("PPL data dir empty", "21.5", ["eval.suite.ppl_books.dataset=dir:{tmp}/empty"], ["{tmp}/empty"],
         setup="ppl_dirs"),
    Case("PPL data dir of binary garbage", "21.5", ["eval.suite.ppl_books.dataset=dir:{tmp}/garbage"],
         ["{tmp}/garbage"], setup="ppl_dirs"),
    Case("PPL .bin file of odd length", "21.5", ["eval.suite.ppl_books.dataset=bin:{tmp}/odd.bin"], ["odd.bin"],
         setup="ppl_dirs"),
    Case("PPL unknown dataset name", "21.5", ["eval.suite.ppl_books.dataset=pg19"], ["pg19"]),
    Case("unknown key typo (train.lrr)", "21.5", ["train.lrr=1"], ["train.lrr"]),
    Case("unknown evaluator key (samplez)", "21.5", ["eval.suite.passkey.samplez=1"], ["samplez"]),
    Case("unknown method name", "21.5", ["method=nosuch"], ["nosuch"]),
    Case("unknown model name", "21.5", ["model=nosuch"], ["nosuch"]),
    Case("malformed override (eval.lengths=[256)", "21.5", ["eval.lengths=[256"], ["eval.lengths"]),
    Case("-m sweep with unknown key", "21.5", ["-m", "method=base,pi", "train.lrr=1"], ["train.lrr"]),
    Case("-m sweep with eval length 0", "21.5", ["-m", "eval.lengths=[0]"], ["eval.lengths"]),
    Case("unknown key, results dir given only as paths.results_dir", "21.2/21.5", ["train.lrr=1"], ["train.lrr"],
         results_elsewhere=True),
    Case("passkey samples negative", "21.5", ["eval.suite.passkey.samples=-1"], ["samples"]),
    Case("eval_batch_tokens negative", "21.5", ["eval_batch_tokens=-1"], ["eval_batch_tokens"],
         requires=("conf/config.yaml", "eval_batch_tokens")),
    Case("attention.backend unknown", "21.5", ["attention.backend=nosuch"], ["backend"],
         requires=("conf/config.yaml", "backend:")),
    # ---------------------------------------------------------------- issue 16 item 2: impossible method values
    Case("NTK clamp below C", "16.2", ["method=ntk_32k", "method.min_len=0.5"], ["min_len"],
         tokens_args=["method=ntk_32k", "method.min_len=256"]),
    Case("NTK cap below C (t < 1)", "16.2", ["method=ntk_64k", "method.max_len=0.5"], ["max_len"],
         tokens_args=["method=ntk_64k", "method.max_len=256", "method.min_len=256"]),
    Case("NTK factor < 1", "16.2", ["method=ntk_dynamic", "method.factor=0.5"], ["factor"]),
    Case("PI scale < 1", "16.2", ["method=pi", "method.scale=0.5"], ["scale"]),
    Case("YaRN scale nan", "16.2", ["method=yarn", "method.scale=nan"], ["scale"]),
    Case("ABF rope_theta negative", "16.2", ["method=abf", "method.rope_theta=-50000"], ["rope_theta"]),
    Case("Self-Extend window >= C", "16.2", ["method=self_extend", "method.window=1.5"], ["window"],
         tokens_args=["method=self_extend", "method.window=768"]),
    Case("LM-Infinite n_local < 0", "16.2", ["method=lm_infinite", "method.n_local=-1"], ["n_local"]),
    Case("NIAH context length 1e8", "16.2/16.6", NIAH + ["eval.suite.niah.context_lengths=[1000,100000000,3]"],
         ["niah"]),
    Case("NIAH haystack dir missing", "16.2", NIAH + ["eval.suite.niah.haystack_dir={tmp}/no"], ["haystack_dir"]),
]


# ------------------------------------------------------------------------------------------------ running
def _merge(base: list[str], args: list[str]) -> list[str]:
    """``base`` with every key that ``args`` sets replaced (Hydra refuses a key given twice)."""
    def key(a):
        return a.split("=", 1)[0].lstrip("+~") if "=" in a else a

    keys = {key(a) for a in args}
    merged = [a for a in base if key(a) not in keys] + args
    return [a for a in merged if a.startswith("-")] + [a for a in merged if not a.startswith("-")]  # -m first


def _units_of_c(root: Path) -> bool:
    """Whether this checkout's method lengths are multiples of C (else token counts, the pre-issue-16 code)."""
    text = (root / "conf/method/ntk_dynamic.yaml").read_text()
    for line in text.splitlines():
        if line.startswith("min_len:"):
            return float(line.split(":", 1)[1].split("#")[0]) <= 64
    return True


def _mount_tmpfs(path: Path, size: str, readonly=False, full=False) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        return False
    (path / "runs").mkdir()
    if full:
        with open(path / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
    if readonly:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
    return True


def _setup(kind: str | None, tmp: Path) -> list[Path]:
    """Prepare the case's directories; returns mount points to unmount afterwards."""
    mounts = []
    if kind == "results_file":
        (tmp / "res").write_text("not a directory")
    elif kind in ("results_ro", "results_full"):
        if not _mount_tmpfs(tmp / "res", "64k", readonly=kind == "results_ro", full=kind == "results_full"):
            raise RuntimeError("cannot mount a tmpfs (needs root on Linux)")
        mounts.append(tmp / "res")
    elif kind == "afile":
        (tmp / "afile").write_text("a file")
    elif kind == "outputs_file":
        (tmp / "out").write_text("not a directory")
    elif kind == "ckpt_file":
        (tmp / "ck").write_text("not a directory")
    elif kind == "ppl_dirs":
        for d in ("empty", "garbage", "blank"):
            (tmp / d).mkdir()
        (tmp / "garbage" / "a.txt").write_bytes(bytes(range(256)) * 8)
        (tmp / "blank" / "a.txt").write_text("")
        (tmp / "odd.bin").write_bytes(b"\x01\x00\x02")
    return mounts


def _rows(d: Path) -> list[dict]:
    runs = d / "runs"
    out = []
    if runs.is_dir():
        for p in sorted(runs.glob("*.json")):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                out.append({"status": "unreadable", "file": p.name})
    return out


def _limit_memory(gib: float):
    def f():
        os.setsid()
        b = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (b, b))
    return f


def run_case(case: Case, root: Path, python: str, timeout: float, mem_gib: float, units_c: bool) -> dict:
    base = {"name": case.name, "group": case.group, "control": case.control}
    if case.requires and case.requires[1] not in (root / case.requires[0]).read_text():
        return {**base, "category": "n/a", "reason": f"{case.requires[0]} has no {case.requires[1]!r}",
                "args": [], "rc": None, "seconds": 0.0, "last_line": ""}
    tmp = Path(tempfile.mkdtemp(prefix="bad_inputs-"))
    args = (case.tokens_args if (case.tokens_args and not units_c) else case.args)
    args = [a.replace("{tmp}", str(tmp)) for a in _merge(BASE, args)]
    res = tmp / "res"
    res_env = tmp / "res_env" if case.results_elsewhere else res
    argv = args + [f"paths.results_dir={res}"]
    env = {**os.environ, "PYTHONPATH": str(root), "HARNESS_RESULTS_DIR": str(res_env),
           "HARNESS_OUTPUT_DIR": str(tmp / "out"), "HARNESS_CKPT_DIR": str(tmp / "ck"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
           "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", **case.env}
    env.pop("HYDRA_FULL_ERROR", None)
    mounts = []
    t0 = time.time()
    try:
        mounts = _setup(case.setup, tmp)
        p = subprocess.Popen([python, str(root / "run.py"), *argv], cwd=root, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=_limit_memory(mem_gib))
        try:
            out, err = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            rc = None
        seconds = time.time() - t0
        rows = _rows(res) if res.is_dir() else []
        rows_env = _rows(res_env) if case.results_elsewhere and res_env.is_dir() else []
    finally:
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else ""
    words = [w.replace("{tmp}", str(tmp)) for w in case.words]
    category, reason = classify(case, rc, out, err, last, words, rows, rows_env)
    shutil.rmtree(tmp, ignore_errors=True)
    return {**base, "category": category, "reason": reason.replace(str(tmp), "<tmp>"),
            "args": [a.replace(str(tmp), "<tmp>") for a in argv],
            "rc": rc, "seconds": round(seconds, 1), "last_line": last.replace(str(tmp), "<tmp>")[:400],
            "stderr_lines": len(lines), "stderr_tail": [ln.replace(str(tmp), "<tmp>")[:300] for ln in lines[-8:]],
            "rows": [r.get("status") for r in rows],
            "rows_in_HARNESS_RESULTS_DIR": [r.get("status") for r in rows_env]}


def classify(case, rc, out, err, last, words, rows, rows_env):
    text = out + err
    if rc is None:
        return "hang", "still running after the timeout"
    if "Traceback (most recent call last)" in text or "Error executing job" in text:
        tb = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(" ") and not ln.startswith("Set the")
              and not ln.startswith("Traceback") and not ln.startswith("Error executing job")]
        return "traceback", (tb[-1] if tb else last)[:300]
    if rc < 0:
        return "crash", f"killed by signal {-rc} ({signal.Signals(-rc).name})"
    if rc == 0:
        if case.control:
            return "ok", ""
        statuses = [r.get("status") for r in rows]
        return "silent", f"exit 0, rows {statuses}"
    if case.control:
        return "unclear", f"a control failed: {last}"
    missing = [w for w in words if not any(x.lower() in last.lower() for x in w.split("|"))]
    if missing:
        return "unclear", f"last line does not name {', '.join(missing)}"
    if case.writable and not any(r.get("status") == "failed" for r in rows):
        if any(r.get("status") == "failed" for r in rows_env):
            return "unclear", "the failed row went to HARNESS_RESULTS_DIR (default results/), not paths.results_dir"
        return "unclear", f"no failed row in the results dir (rows: {[r.get('status') for r in rows]})"
    return "clean", ""


def counts(results: list[dict]) -> dict:
    c = {k: 0 for k in CATEGORIES}
    for r in results:
        if not r.get("control"):
            c[r["category"]] = c.get(r["category"], 0) + 1
    return c


# ------------------------------------------------------------------------------------------------ reporting
def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    s = r["category"]
    if r["category"] in ("clean", "unclear", "crash") and r.get("last_line"):
        s += f": `{r['last_line'][:160]}`"
    elif r.get("reason"):
        s += f": {r['reason'][:160]}"
    return s.replace("|", "\\|")


def markdown(before: list[dict], after: list[dict], head: str) -> str:
    b = {r["name"]: r for r in before}
    a = {r["name"]: r for r in after}
    names = [c.name for c in CASES if c.name in a or c.name in b]
    cb, ca = counts(before), counts(after)
    out = [head, "", "| | " + " | ".join(CATEGORIES) + " |", "|---|" + "---|" * len(CATEGORIES)]
    out.append("| before | " + " | ".join(str(cb.get(k, 0)) for k in CATEGORIES) + " |")
    out.append("| after | " + " | ".join(str(ca.get(k, 0)) for k in CATEGORIES) + " |")
    out += ["", "| case | issue | before | after |", "|---|---|---|---|"]
    group = {c.name: c.group for c in CASES}
    for n in names:
        out.append(f"| {n} | {group.get(n, '')} | {_cell(b.get(n))} | {_cell(a.get(n))} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose run.py runs (default: this one)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--only", help="comma-separated substrings of case names")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case (then: hang)")
    ap.add_argument("--mem-gib", type=float, default=8.0, help="address-space cap per case")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--markdown", type=Path, help="with --before/--after: write the comparison table")
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path)
    a = ap.parse_args(argv)
    if a.markdown:
        head = a.markdown.read_text().split("<!-- table -->")[0] + "<!-- table -->" if a.markdown.exists() else ""
        a.markdown.write_text(markdown(json.loads(a.before.read_text()), json.loads(a.after.read_text()), head))
        return 0
    cases = [c for c in CASES if not a.only or any(s.lower() in c.name.lower() for s in a.only.split(","))]
    if a.list:
        for c in cases:
            print(f"{c.group:10} {c.name:55} {' '.join(c.args)}")
        return 0
    root = a.root.resolve()
    units_c = _units_of_c(root)
    print(f"root {root} (method lengths in {'units of C' if units_c else 'tokens'}), {len(cases)} cases", flush=True)
    results = []
    for i, c in enumerate(cases, 1):
        r = run_case(c, root, a.python, a.timeout, a.mem_gib, units_c)
        results.append(r)
        line = f"[{i:2}/{len(cases)}] {r['category']:9} {r['seconds']:6.1f}s  {c.name}  | "
        line += r["reason"] or r["last_line"]
        print(line[:260], flush=True)
        if a.json:
            a.json.write_text(json.dumps(results, indent=1))
    print()
    print(f"{'case':58} {'category':10} last stderr line / reason")
    for r in results:
        print(f"{r['name'][:58]:58} {r['category']:10} {(r['reason'] or r['last_line'])[:150]}")
    print("counts (controls excluded):", counts(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
