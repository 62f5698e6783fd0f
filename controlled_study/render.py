"""Tables as data (``Table``) and their Markdown / LaTeX renderings.

A cell shows ours with its 95% interval beside the paper's number for the same cell: ``ours [lo, hi] / paper (ours -
paper)``; a cell the paper does not have shows ours only; a missing value prints as an em dash; ``n.m.`` marks an
evaluator that is not measurable at this scale for the model, a dagger a number the rows give no interval for (both
explained in a footnote, with the sample sizes and the legend of the short labels). Numbers are rounded as the
paper rounds that column (``decimals``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.results import atomic_write_text
from harness.safe import safe_file

DASH = "\u2014"


NM = "n.m."        # "not measurable at this scale": the reason goes in a footnote
NO_CI = "\u2020"    # a number without an interval: the reason goes in a footnote


@dataclass
class Cell:
    ours: float | None = None
    paper: float | None = None
    decimals: int = 2
    ci: tuple | None = None
    has_paper: bool = False      # the paper has this cell (even if it prints "-")
    text: str | None = None      # non-numeric content (e.g. a context-window label)
    n: int | None = None         # sample size behind ours
    unit: str = ""               # what n counts (prompts, documents, ...)
    source: str = ""             # evaluator (for the sample-size footnote)
    nm: str | None = None        # ours is not measurable at this scale: why
    no_ci: str | None = None     # ours has no interval: why

    def fill(self, x, scale: float = 1.0, source: str = "") -> Cell:
        """Ours from an ``estimates.Est`` (value, interval, n; the reason when there is no interval)."""
        if x is None or x.value is None:
            return self
        self.ours = x.value * scale
        self.ci = (x.lo * scale, x.hi * scale) if x.ci else None
        self.n, self.unit, self.source = x.n, x.unit, source
        self.no_ci = None if self.ci else (x.note or "no per-sample scores in the row")
        return self

    def _f(self, v) -> str:
        if v is None:
            return DASH
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        if isinstance(v, float) and math.isinf(v):
            return "inf"
        return f"{v:.{self.decimals}f}"

    def diff(self):
        if self.ours is None or self.paper is None:
            return None
        if not (math.isfinite(self.ours) and math.isfinite(self.paper)):
            return None
        return self.ours - self.paper

    def parts(self, with_ci: bool = True) -> tuple[str, str | None, str | None]:
        if self.text is not None:
            return self.text, None, None
        if self.nm is not None:
            return NM, (self._f(self.paper) if self.has_paper else None), None
        ours = self._f(self.ours)
        if with_ci and self.ci is not None and self.ours is not None:
            ours += f" [{self.ci[0]:.{self.decimals}f}, {self.ci[1]:.{self.decimals}f}]"
        elif with_ci and self.ours is not None and self.no_ci:
            ours += NO_CI
        if not self.has_paper:
            return ours, None, None
        d = self.diff()
        return ours, self._f(self.paper), (f"{d:+.{self.decimals}f}" if d is not None else None)

    def markdown(self) -> str:
        ours, paper, d = self.parts(True)
        if paper is None:
            return ours
        return f"{ours} / {paper}" + (f" ({d})" if d is not None else "")

    def latex(self) -> str:
        ours, paper, d = self.parts(True)
        ours, paper = tex_text(ours), tex_text(paper) if paper is not None else None
        if paper is None:
            return ours
        return f"{ours} / {paper}" + (f" ({d})" if d is not None else "")


@dataclass
class Table:
    id: str
    title: str
    header: list[str]                      # all column labels (row-label columns first)
    label_cols: int = 1                    # how many leading columns are row labels
    rows: list = field(default_factory=list)     # [ [str, ..., Cell, ...], ... ]
    notes: list[str] = field(default_factory=list)       # printed above the table (what the cells mean)
    footnotes: list[str] = field(default_factory=list)   # printed below
    sections: dict = field(default_factory=dict)         # row index -> section title (e.g. "PG19")
    legend: list[str] = field(default_factory=list)      # what each short label stands for (under the table)
    entries: list = field(default_factory=list)          # our configurations shown in rows (for the legend)

    def add(self, labels: list[str], cells: list[Cell], entry=None):
        self.rows.append(list(labels) + list(cells))
        if entry is not None and entry not in self.entries:
            self.entries.append(entry)

    def cell(self, row_label: str, col_label: str) -> Cell | None:
        j = self.header.index(col_label)
        for r in self.rows:
            if r[self.label_cols - 1] == row_label or r[0] == row_label:
                return r[j]
        return None

    def n_ours(self) -> int:
        return sum(1 for r in self.rows for c in r if isinstance(c, Cell) and c.ours is not None)


def derived_notes(t: Table) -> list[str]:
    """Footnotes every table gets from its cells: sample sizes, what "n.m." and the dagger mean, and why."""
    cells = [c for r in t.rows for c in r if isinstance(c, Cell)]
    out = []
    sizes: dict = {}
    for c in cells:
        if c.ours is not None and c.nm is None and c.n:
            sizes.setdefault((c.source or "ours", c.unit), set()).add(c.n)
    if sizes:
        out.append("Sample size per cell of ours: " + "; ".join(
            f"{src}: n = {', '.join(str(x) for x in sorted(ns))} {unit}".rstrip() for (src, unit), ns in
            sorted(sizes.items())) + ". Intervals: Wilson for accuracies and bounded scores, Student t over documents "
            "for perplexity (the mean NLL, exponentiated; 95%).")
    nms = list(dict.fromkeys(c.nm for c in cells if c.nm))
    if nms:
        out.append(f"{NM} = not measurable at this scale (the threshold and the base's score; the "
                   "threshold is the evaluator's `floor`, harness/evals/<name>.py): " + "; ".join(nms) + ".")
    nocis = list(dict.fromkeys(c.no_ci for c in cells if c.no_ci and c.ours is not None and c.ci is None
                               and c.nm is None))
    if nocis:
        out.append(f"{NO_CI} no interval: " + "; ".join(nocis) + " (rows written before per-sample scores were "
                   "kept in the row).")
    if t.legend:
        out.append("Legend: " + "; ".join(t.legend) + ".")
    return out


def md_escape(s: str) -> str:
    return str(s).replace("|", "\\|")


def to_markdown(t: Table) -> str:
    out = [f"### {t.title}", ""]
    out += [f"{n}  " for n in t.notes]
    if t.notes:
        out.append("")
    ncol = len(t.header)
    out.append("| " + " | ".join(md_escape(h) for h in t.header) + " |")
    out.append("|" + "|".join([":--"] * t.label_cols + ["--:"] * (ncol - t.label_cols)) + "|")
    for i, r in enumerate(t.rows):
        if i in t.sections:
            out.append("| " + " | ".join([f"**{md_escape(t.sections[i])}**"] + [""] * (ncol - 1)) + " |")
        out.append("| " + " | ".join(md_escape(c.markdown() if isinstance(c, Cell) else c) for c in r) + " |")
    notes = derived_notes(t) + t.footnotes
    if notes:
        out.append("")
        out += [f"{i + 1}. {md_escape(n)}" for i, n in enumerate(notes)]
    return "\n".join(out) + "\n"


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", DASH: "---",
        NO_CI: r"$^\dagger$"}


def tex_text(s: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(s))


def to_latex(t: Table) -> str:
    ncol = len(t.header)
    out = ["% generated by scripts/make_tables.py from results/runs/ -- do not edit", r"\begin{table}[t]",
           r"\centering", r"\small", f"\\caption{{{tex_text(t.title)}}}", f"\\label{{tab:{t.id}}}",
           r"\begin{tabular}{" + "l" * t.label_cols + "r" * (ncol - t.label_cols) + "}", r"\toprule",
           " & ".join(tex_text(h) for h in t.header) + r" \\", r"\midrule"]
    for i, r in enumerate(t.rows):
        if i in t.sections:
            if i:
                out.append(r"\midrule")
            out.append(f"\\multicolumn{{{ncol}}}{{l}}{{\\textit{{{tex_text(t.sections[i])}}}}} \\\\")
        out.append(" & ".join(c.latex() if isinstance(c, Cell) else tex_text(c) for c in r) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}"]
    notes = t.notes + derived_notes(t) + t.footnotes
    if notes:
        out.append(r"\par\smallskip\footnotesize " + r" \\ ".join(tex_text(n) for n in notes))
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def write(t: Table, out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, tex = (safe_file(out_dir, t.id, suffix, "table id") for suffix in (".md", ".tex"))  # never outside out_dir
    atomic_write_text(md, to_markdown(t))  # temp file + rename: a full disk keeps the previous table
    atomic_write_text(tex, to_latex(t))
    return [md, tex]
