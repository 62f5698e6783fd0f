"""Results rows -> table entries: filtering, matching, labels, lengths as multiples of the native window.

A table entry is one configuration: (model, method, method parameters, train, data, eval protocol, evaluation suite),
where the eval protocol is the perplexity protocol (``yarn`` | ``longlora``) of the row's PPL entries and the suite is
the row's ``eval`` option (or the suite it ``extends``: ``suite_of``); rows of another suite that measure nothing the
entry measures (no table source in common: ``eval=extended`` beside ``eval=tiny``) join the entry of the same
configuration, so rows of different suites never fill the same cell. Only ``status == "ok"`` rows are used; failed and
still-running rows are counted for a footnote. When several rows of one entry carry a value for the same cell, they
compete (``Pick``): the newest (``time_end``, then ``time_start``, then ``run_id``) is taken, except that a newer row
with fewer samples for the cell than the row it would displace is refused (the older row keeps the cell); the table says
which row was taken and why in a footnote, and ``RowSet.refusals`` gives one line per refused row naming both files.

Training seeds: rows of one configuration fine-tuned with different seeds (``data.seed`` / ``train.seed``: the
sample and order of the training mixture and the training RNG; the evaluation prompts follow the global ``seed`` and
stay the same) are one entry, but a cell never mixes seeds: a ``RowSet`` shows one seed per entry, the first in
order (seed 0 in the study) unless ``seed=`` names another that the entry has. ``results/<study>/findings.md``
re-tests every finding on each other seed and reports the seed-to-seed differences; a footnote names the entries
with several.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from harness.evals import EVALS
from harness.evals.convergence import current, outdated
from harness.methods import METHODS, row_key
from harness.results import liveness, study_of
from harness.results import read_rows_in as _read_rows_in

HERE = Path(__file__).parent


def load_yaml(path: str | Path) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


def suite_of(row: dict) -> str:
    """The evaluation suite a row's cells belong to: its ``eval`` option, or the suite that option declares it
    ``extends`` (``conf/eval/<name>.yaml``: the same prompts with more of them at some length, e.g. ``ruler_8c``, or
    another view of the same documents, e.g. ``windows``), recorded in the row's own config (``config.eval.extends``).
    A suite that extends another joins its cells, and a cell's competing rows follow ``RowSet.pick`` (a newer row
    with fewer samples never displaces an older one)."""
    ev = (row.get("config") or {}).get("eval")
    ext = ev.get("extends") if isinstance(ev, dict) else None
    return str(ext) if isinstance(ext, str) and ext else str(row.get("eval"))


def read_rows_in(directory: str | Path) -> list[dict]:
    """Every row (``*.json``) directly in ``directory``: an archived study (``results/archive/<name>/``); anything
    else is skipped with a warning naming it (``harness.results.read_rows_in``, the one reader of row files)."""
    return _read_rows_in(directory)


def load_spec(path: str | Path | None = None) -> dict:
    """The tables' layout (``spec.yaml``) and its sources: the ones it names (the paper's columns, e.g. PG19 read from
    ``ppl_pg19`` or ``ppl_books``), and one for every registered evaluator that no source reads, named after it and
    matched by its name (``evaluator``): how a number of it is read, its headline metric and its column in the
    2024-benchmarks table are what it declares (``harness.evals.Spec``)."""
    spec = load_yaml(path or HERE / "spec.yaml")
    read = {src.get("evaluator") or src.get("reads") for src in spec["sources"].values()}
    for name in EVALS.names():
        if name not in read and name not in spec["sources"]:
            spec["sources"][name] = {"entries": [name], "evaluator": name}
    return spec


def kfmt(tokens: float) -> str:
    """4096 -> '4k', 2048 -> '2k', 512 -> '0.5k' (the paper's column labels; 1k = 1024 tokens)."""
    k = tokens / 1024
    if abs(k - round(k)) < 1e-9:
        return f"{int(round(k))}k"
    return f"{k:g}k"


def num(v):
    """A finite or NaN float, or None (for missing / non-numeric)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _sort_time(row: dict):
    return (str(row.get("time_end") or ""), str(row.get("time_start") or ""), str(row.get("run_id") or ""))


def native_ctx(row: dict) -> int | None:
    m = ((row.get("config") or {}).get("model") or {})
    v = m.get("native_ctx")
    try:
        return int(v) if v else None
    except (TypeError, ValueError):
        return None


def train_len(row: dict) -> int | None:
    """Longest sequence seen in fine-tuning (None when frozen)."""
    if is_frozen(row):
        return None
    t = (row.get("config") or {}).get("train") or {}
    for k in ("seq_len", "max_seq_len", "train_len"):
        if t.get(k):
            try:
                return int(t[k])
            except (TypeError, ValueError):
                pass
    info = row.get("train_info") or {}
    return int(info["seq_len"]) if info.get("seq_len") else None


def training_seed(row: dict) -> str | None:
    """The seed of a fine-tuned row's training side: ``"1"`` when ``data.seed == train.seed == 1``, else
    ``"data 1, train 0"``; None for a frozen row (no training: nothing to seed)."""
    if is_frozen(row):
        return None
    cfg = row.get("config") or {}
    d, t = (cfg.get("data") or {}).get("seed", 0), (cfg.get("train") or {}).get("seed", 0)  # 0: the config default
    return str(t) if d == t else f"data {d}, train {t}"


def _seed_order(s: str | None):
    try:
        return (0, int(s), "")
    except (TypeError, ValueError):
        return (1, 0, str(s))


def is_frozen(row: dict) -> bool:
    t = row.get("train")
    if t in (None, "none"):
        return True
    cfg_t = (row.get("config") or {}).get("train") or {}
    return cfg_t.get("enabled") is False


def method_key(row: dict) -> str:
    """Canonical method key: the variant its sweep point declares (``harness.methods.row_key``: NTK-64K on 2x the
    tokens is ntk_64k_2b), else the row's method name, with the Dynamic NTK class (``ntk_dynamic``, formerly ``ntk``)
    split by how it was trained into the paper's ntk_frozen / ntk_32k / ntk_64k. A row whose method column is not its
    config's method (a learning curve's ``<method>_curve``, a factor search's ``<method>_search``) keeps that name, so
    it never joins the method's study entry, whatever the method's facts declare."""
    m = row.get("method") or "?"
    mp = row.get("method_params") or {}
    if m != (((row.get("config") or {}).get("method") or {}).get("name") or m):
        return m  # an entry point named the row itself (``lifecycle.start(names=)``: pi_curve, longrope_search)
    key = row_key(row)
    if key != m:
        return key
    if m in ("ntk_dynamic", "ntk"):
        v = str(mp.get("variant") or "").lower().replace("-", "_")
        if v in ("ntk_32k", "ntk_64k", "ntk_frozen"):
            return v
        if is_frozen(row):
            return "ntk_frozen"
        tl, c = train_len(row), native_ctx(row)
        if tl and c:
            return f"ntk_{kfmt(4096 * tl / c).lower()}"
        return "ntk_dynamic"
    return m


def ppl_protocol(row: dict, spec: dict) -> str | None:
    metrics = row.get("metrics") or {}
    for src in ("ppl_pg19", "ppl_proofpile"):
        for e in spec["sources"][src]["entries"]:
            if isinstance(metrics.get(e), dict) and metrics[e].get("protocol"):
                return str(metrics[e]["protocol"])
    return None


def _params_str(mp) -> str:
    return json.dumps(mp or {}, sort_keys=True, default=str)


@dataclass
class Entry:
    model: str
    method: str                  # canonical key (paper row key)
    params: str                  # canonical JSON of method_params
    train: str
    data: str
    protocol: str | None
    suite: str = ""                            # the rows' evaluation suite (``suite_of``): never two in one cell
    rows: list = field(default_factory=list)   # ok rows, newest first
    label: str = ""
    suffix: str = ""                           # what tells it apart from other entries with the same label
    seed: str | None = None                    # the training seed whose rows are in ``rows``
    by_seed: dict = field(default_factory=dict)  # training seed -> its ok rows, newest first (every seed)

    @property
    def key(self):
        return (self.model, self.method, self.params, self.train, self.data, self.protocol, self.suite)

    @property
    def newest(self) -> dict:
        return self.rows[0]

    @property
    def native_ctx(self) -> int | None:
        return native_ctx(self.newest)

    @property
    def facts(self):
        """The method's facts as its newest row recorded them (``harness.methods.facts`` of a row); the registry's by
        the entry's key for a row that recorded none under that key (the Dynamic NTK class split by training)."""
        f = METHODS.facts(self.newest) if self.rows else None
        return f if f is not None and f.key == self.method else METHODS.facts(self.method)

    @property
    def frozen(self) -> bool:
        return is_frozen(self.newest)

    @property
    def train_len(self) -> int | None:
        return train_len(self.newest)

    @property
    def method_params(self) -> dict:
        return json.loads(self.params)

    @property
    def seeds(self) -> list:
        """The training seeds this configuration has rows for, in order (``[None]`` for a frozen entry)."""
        return sorted(self.by_seed, key=_seed_order)

    def with_seed(self, seed) -> Entry:
        """The same entry showing the rows of ``seed``."""
        return replace(self, rows=list(self.by_seed[seed]), seed=seed)


@dataclass
class Pick:
    """The value of one cell and where it came from."""
    value: object = None
    row: dict | None = None
    entry_key: str | None = None      # suite entry it was read from
    candidates: int = 0               # rows of the entry that had a value for this cell
    why: str = ""                     # why this row was taken, when others competed for the cell


class RowSet:
    def __init__(self, rows: list[dict], spec: dict, seed: str | None = None, gate: bool = True,
                 runs_dir: str | Path | None = None):
        """``gate=False``: rows that failed the convergence gate are kept (the findings' sensitivity line).
        ``runs_dir``: the folder the rows were read from (lines that name a row's file use it)."""
        self.spec, self.all_rows, self.seed, self.gate, self.runs_dir = spec, rows, seed, gate, runs_dir
        self.failed = [r for r in rows if r.get("status") == "failed"]
        unfinished = [r for r in rows if r.get("status") not in ("ok", "failed")]
        self.stale = [r for r in unfinished if liveness(r) == "stale"]  # killed or lost: will never finish
        self.running = [r for r in unfinished if liveness(r) != "stale"]
        ok = sorted([r for r in rows if r.get("status") == "ok"], key=_sort_time, reverse=True)
        # a fine-tuned row gated by an older convergence gate is superseded by a row of the same configuration gated
        # by the current one (``make study`` re-runs such points): it feeds no cell and is named in a footnote

        rerun = {r.get("config_hash") for r in ok if r.get("config_hash") and current(r)}  # recomputed on read
        self.superseded = [r for r in ok if outdated(r) and r.get("config_hash") in rerun]
        ok = [r for r in ok if not (outdated(r) and r.get("config_hash") in rerun)]
        # fine-tuned rows that failed the convergence gate (harness.evals.convergence) measure an unfinished recipe,
        # not the method: left out of every table and finding, named in a footnote
        self.unconverged = [r for r in ok if converged(r) is False] if gate else []
        groups: dict = {}
        for r in ok:
            e = Entry(str(r.get("model")), method_key(r), _params_str(r.get("method_params")), str(r.get("train")),
                      str(r.get("data")), ppl_protocol(r, spec), suite_of(r))
            groups.setdefault(e.key, e).rows.append(r)
        # rows without a PPL entry join the (single) entry of the same configuration that has one, when the two
        # measure nothing in common (another suite's rows never fill a cell of this one)
        for k in [k for k in groups if k[5] is None]:
            mine = self.sources(groups[k])
            partners = [g for g in groups.values() if g.key[:5] == k[:5] and g.protocol is not None
                        and (g.suite == k[6] or not (mine & self.sources(g)))]
            if len(partners) == 1:
                partners[0].rows = sorted(partners[0].rows + groups.pop(k).rows, key=_sort_time, reverse=True)
        for e in groups.values():  # one training seed per entry (module docstring)
            for r in e.rows:
                e.by_seed.setdefault(training_seed(r), []).append(r)
            # the seed shown is chosen before the gate, so that a seed whose rows failed it shows no rows instead of
            # another seed's (a cell, and a finding's seed, never borrow a row of another training seed); asked for a
            # seed it has no row of (``reseeded``: a finding re-tested on another training seed), a fine-tuned
            # configuration shows none (a part missing on a seed is inconclusive there), a frozen one its own rows
            # (nothing to seed: the same rows on every training seed)
            e.seed = seed if seed in e.by_seed else e.seeds[0] if seed is None or e.seeds == [None] else seed
            if gate:
                e.by_seed = {s: kept for s, rs in e.by_seed.items()
                             if (kept := [r for r in rs if converged(r) is not False])}
            e.rows = list(e.by_seed.get(e.seed, []))
        self._all_entries = list(groups.values())   # with those whose shown seed failed the gate (``other_seeds``)
        self.entries: list[Entry] = [e for e in self._all_entries if e.rows]
        self._label()
        self.dup_notes: dict = {}   # (model, label) -> {"used": run ids taken, "rows": n, "why": {reasons}}
        self._refused: dict = {}    # (refused run id, kept run id) -> the one line that says so

    def sources(self, e: Entry) -> set:
        """The table sources (``spec.yaml``) the rows of ``e`` have a suite entry for."""
        return {src for r in e.rows for src in self.spec["sources"] if self.entry_keys(r, src)}

    def _label(self):
        """Short, unique labels: the method's label (``harness.methods.facts``; the base model: its own name; a row of
        no method, a factor search: its name), `` (FT)`` for a fine-tuned entry when a frozen entry has the same
        label, then `` #2``, `` #3`` (by first run time) when configurations still collide. ``legend()`` says what
        each label stands for."""
        for e in self.entries:
            f = e.facts
            e.label = (f.label if f else e.method).format(model=e.model)
            e.suffix = ""
        # the same configuration measured by two suites: two table rows, each named by its suite
        same: dict = {}
        for e in self.entries:
            same.setdefault(e.key[:6], []).append(e)
        for group in same.values():
            if len({e.suite for e in group}) > 1:
                for e in group:
                    e.suffix = f" [eval={e.suite}]"
        by: dict = {}
        for e in self.entries:
            by.setdefault((e.model, e.label), []).append(e)
        for group in by.values():
            if len(group) > 1 and len({e.frozen for e in group}) > 1:
                for e in group:
                    if not e.frozen:
                        e.suffix = " (FT)"
            sub: dict = {}
            for e in group:
                sub.setdefault(e.suffix, []).append(e)
            for same in sub.values():
                if len(same) > 1:
                    for i, e in enumerate(sorted(same, key=lambda x: _sort_time(x.rows[-1]))):
                        if i:
                            e.suffix += f" #{i + 1}"
        for e in self.entries:
            e.label += e.suffix

    def legend(self, entries) -> list[str]:
        """One line per label: the method, how it was trained, its parameters (file paths shortened)."""
        out, seen = [], set()
        for e in entries:
            if e is None or e.label in seen:
                continue
            seen.add(e.label)
            tr = "frozen" if e.frozen else f"fine-tuned ({e.train}" + (f", {e.train_len} tokens" if e.train_len
                                                                       else "") + ")"
            ps = ", ".join(f"{k}={_short(v)}" for k, v in sorted(e.method_params.items())
                           if k != "name" and not k.endswith("sha256"))
            name = (e.newest.get("method") or e.method)
            out.append(f"{e.label} = {name}, {tr}" + (f"; {ps}" if ps else ""))
        return out

    def main_suite(self, model: str) -> str | None:
        """The suite most configurations of ``model`` ran (ties: by name): the study's suite, which the findings
        compare on (rows of another suite never stand in for it)."""
        n: dict = {}
        for e in self.for_model(model):
            n[e.suite] = n.get(e.suite, 0) + 1
        return min(n, key=lambda s: (-n[s], s)) if n else None

    def models(self) -> list[str]:
        return sorted({e.model for e in self.entries})

    def other_seeds(self, model: str | None = None) -> list[str]:
        """Training seeds some entry (of ``model``) has beside the one shown."""
        return sorted({s for e in self._all_entries if model is None or e.model == model for s in e.by_seed
                       if s is not None and s != e.seed}, key=_seed_order)

    def reseeded(self, seed: str) -> RowSet:
        """The same rows showing training seed ``seed`` wherever an entry has it."""
        return RowSet(self.all_rows, self.spec, seed, self.gate, self.runs_dir)

    def for_model(self, model: str) -> list[Entry]:
        return [e for e in self.entries if e.model == model]

    # -- reading metrics ---------------------------------------------------------------------------------------
    def entry_keys(self, row: dict, source: str) -> list[str]:
        src = self.spec["sources"][source]
        metrics = row.get("metrics") or {}
        keys = [k for k in src.get("entries", []) if isinstance(metrics.get(k), dict)]
        ev = src.get("evaluator")
        if ev:
            suite = (((row.get("config") or {}).get("eval") or {}).get("suite") or {})
            for k, node in suite.items():
                if (isinstance(node, dict) and node.get("name") == ev and k not in keys
                        and isinstance(metrics.get(k), dict)):
                    keys.append(k)
        return keys

    def pick(self, entry: Entry, source: str, getter) -> Pick:
        """The row of ``entry`` whose value ``getter(metrics_of_suite_entry, row)`` fills the cell: of the rows that
        give one, the newest, unless it has fewer samples for the cell than the row it would displace (then it is
        refused and the older row keeps the cell; ``refusals``). Going from the oldest to the newest candidate, each
        displaces the one before unless it has fewer samples (both known: ``cell_samples``)."""
        out = Pick()
        cands = []
        for r in entry.rows:   # newest first
            for k in self.entry_keys(r, source):
                try:
                    v = getter(r["metrics"][k], r)
                except (KeyError, TypeError, ValueError, ZeroDivisionError):
                    v = None
                if v is None:
                    continue
                cands.append((v, r, k, cell_samples(r["metrics"][k], v)))
                break
        if not cands:
            return out
        taken, why = cands[-1], "the only row"
        for c in reversed(cands[:-1]):   # older -> newer
            if c[3] is not None and taken[3] is not None and c[3] < taken[3]:
                self._refuse(c[1], taken[1], c[3], taken[3])
                why = "more samples than a newer row (refused)"
                continue
            taken, why = c, "the newest"
        out.value, out.row, out.entry_key, out.candidates, out.why = taken[0], taken[1], taken[2], len(cands), why
        if out.candidates > 1:
            note = self.dup_notes.setdefault((entry.model, entry.label), {"used": set(), "rows": 0, "why": set()})
            note["used"].add(out.row.get("run_id"))
            note["rows"] = max(note["rows"], len(entry.rows))
            note["why"].add(why)
        return out

    def _refuse(self, new: dict, kept: dict, n_new: int, n_kept: int) -> None:
        self._refused.setdefault((new.get("run_id"), kept.get("run_id")), (
            f"refused: {self.row_file(new)} (n = {n_new}, newer) would displace {self.row_file(kept)} "
            f"(n = {n_kept}) in "
            f"{new.get('model')}/{method_key(new)}/{new.get('eval')}: fewer samples; the older row keeps its cells"))

    def row_file(self, row: dict) -> str:
        """The file a row was read from: ``<runs_dir>/<run_id>.json`` (where its study keeps it when unknown)."""
        if self.runs_dir is not None:
            return str(Path(self.runs_dir, f"{row.get('run_id')}.json"))

        st = study_of(row)
        return f"results/{st + '/' if st else ''}runs/{row.get('run_id')}.json"

    def refusals(self) -> list[str]:
        """One line per newer row refused a cell because it has fewer samples than the row it would displace, naming
        both files (``make tables`` prints them)."""
        return [self._refused[k] for k in sorted(self._refused, key=str)]

    def footnotes(self, model: str | None = None) -> list[str]:
        notes = []
        multi = [e for e in self.entries if (model is None or e.model == model) and len(e.by_seed) > 1]
        if multi:
            notes.append("Fine-tuned with several training seeds (cells show one, never a mix; "
                         "results/<study>/findings.md re-tests each finding on every seed): " + "; ".join(
                             f"{e.label} seeds {', '.join(map(str, e.seeds))}, shown: {e.seed}" for e in multi) + ".")
        for (m, label), n in sorted(self.dup_notes.items()):
            if model is None or m == model:
                why = ("; a newer row with fewer samples than the row it would displace is refused" if
                       any("refused" in w for w in n["why"]) else "")
                notes.append(f"{label}: {n['rows']} rows compete for its cells (same model, method, train, data, eval "
                             f"protocol and suite); taken per cell: the newest with a value{why} "
                             f"({', '.join(sorted(x for x in n['used'] if x))}).")
        refused = [line for (new, kept), line in sorted(self._refused.items(), key=str)
                   if model is None or any(r.get("run_id") == new and r.get("model") == model for r in self.all_rows)]
        if refused:
            notes.append("Refused (fewer samples than the row they would displace): " + "; ".join(
                line.removeprefix("refused: ") for line in refused) + ".")
        sup = [r for r in self.superseded if model is None or r.get("model") == model]
        if sup:
            notes.append(f"{len(sup)} row(s) gated by an older convergence gate are superseded by a re-run of the same "
                         "configuration under the current gate: " + ", ".join(sorted(str(r.get("run_id"))
                                                                               for r in sup)) + ".")
        if self.failed:
            ids = ", ".join(sorted(str(r.get("run_id")) for r in self.failed)[:6])
            more = "" if len(self.failed) <= 6 else f" and {len(self.failed) - 6} more"
            notes.append(f"{len(self.failed)} failed run(s) ignored: {ids}{more}.")
        unc = [r for r in self.unconverged if model is None or r.get("model") == model]
        if unc:
            rule = ((unc[0].get("train_info") or {}).get("convergence") or {}).get("rule", "")
            notes.append(f"{len(unc)} fine-tuned row(s) left out, failed the convergence gate ({rule}): " + "; ".join(
                f"{method_key(r)} {r.get('run_id')} ({_gate_text(r)})" for r in unc) + ".")
        if self.running:
            notes.append(f"{len(self.running)} unfinished run(s) (status running) ignored.")
        if self.stale:
            ids = ", ".join(sorted(str(r.get("run_id")) for r in self.stale)[:6])
            notes.append(f"{len(self.stale)} stale run(s) ignored (status running, but the process is gone or its "
                         f"heartbeat stopped: killed): {ids}.")
        return notes


def cell_samples(m: dict, value) -> int | None:
    """How many samples a cell's value rests on: the ``Est``'s ``n`` when the value is one, else what the suite
    entry says (``samples_per_length``, ``documents``, or the longest per-sample list it keeps); None when unknown."""
    n = getattr(value, "n", None)
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    if not isinstance(m, dict):
        return None
    for k in ("samples_per_length", "documents", "samples"):
        if isinstance(m.get(k), int) and not isinstance(m.get(k), bool):
            return m[k]
    best = None
    for k in ("correct", "per_sample"):
        series = m.get(k)
        if isinstance(series, dict):
            for v in series.values():
                lists = [v] if isinstance(v, list) else [x for x in v.values() if isinstance(x, list)] \
                    if isinstance(v, dict) else []
                for xs in lists:
                    best = max(best or 0, len(xs))
    return best


def converged(row: dict):
    """The convergence gate's verdict recorded in the row (True / False), None when the row has none."""
    g = (row.get("train_info") or {}).get("convergence") if isinstance(row.get("train_info"), dict) else None
    return g.get("converged") if isinstance(g, dict) and isinstance(g.get("converged"), bool) else None


def _gate_text(row: dict) -> str:
    g = row["train_info"]["convergence"]
    r, pk = g.get("ppl_ratio_vs_base") or {}, g.get("passkey") or {}
    parts = []
    if isinstance(r.get("value"), (int, float)):
        parts.append(f"PPL ratio at C {r['value']:.2f}" + (f" [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
                                                            if isinstance(r.get("ci"), list) else ""))
    if isinstance(pk.get("value"), (int, float)):
        parts.append(f"passkey at C {pk['value']:.2f}" + (f" [{pk['ci'][0]:.2f}, {pk['ci'][1]:.2f}]"
                                                            if isinstance(pk.get("ci"), (list, tuple)) else ""))
    return ", ".join(parts) or "no numbers"


def _short(v) -> str:
    """A parameter value for a legend: file paths by their name, floats without trailing zeros."""
    if isinstance(v, str) and "/" in v:
        return Path(v).name
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)) and len(v) > 4:
        return f"[{len(v)} values]"
    return str(v)


def at_factor(series: dict | None, native: int | None, factor: float):
    """The value of a {length: value} series at length = factor x native (None when absent)."""
    if not isinstance(series, dict) or not native:
        return None
    for L, v in series.items():
        try:
            if abs(int(L) / native - factor) < 1e-9:
                return num(v)
        except (TypeError, ValueError):
            continue
    return None


def factors(series: dict | None, native: int | None) -> list[float]:
    if not isinstance(series, dict) or not native:
        return []
    out = []
    for L in series:
        try:
            out.append(int(L) / native)
        except (TypeError, ValueError):
            pass
    return out


def finite(v) -> bool:
    return v is not None and isinstance(v, float) and math.isfinite(v)
