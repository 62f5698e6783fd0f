"""`make tables`: each study's tables and figures regenerated from its own rows, ``results/<study>/runs/*.json``, and
those of the rows of no study (``results/runs/``: ``make run``, a plain ``run.py`` or sweep) beside them.

``build_studies(results)`` builds every study of a results directory (``harness.results.studies``) into its own
folder (``results/<study>/tables``, ``figures``, ``README.md``), the rows of no study into ``results/tables`` and
``results/figures``, and the index of studies (``results/README.md``, ``front.write_index``). A study is built from
its own rows only: a row of another study, or of none, never fills its cells.

``build_all(results_dir, study=...)`` builds one of them: it reads the rows (only through
``harness.results.read_rows``), groups them into
configurations (``rows.RowSet``), builds every table the rows support (``build.build_tables``) beside the papers'
numbers (``paper_numbers.yaml``, read by ``paper.Paper``), renders Markdown + LaTeX (``render``) and draws the
figures (``figures``). ``spec.yaml`` says which suite entry / metric feeds which column.
"""
from __future__ import annotations

import sys
from pathlib import Path

from controlled_study.build import build_tables
from controlled_study.front import write_front, write_index
from controlled_study.paper import Paper
from controlled_study.render import write
from controlled_study.rows import RowSet, load_spec, read_rows_in
from harness.results import atomic_write_text, read_rows, replacing_dirs, studies, study_dir
from harness.safe import UnsafeName

TABLE_FILES = (".md", ".tex")   # what make tables owns in a tables folder (anything else there is kept)
FIGURE_FILES = (".png", ".pdf")  # ... in a figures folder


def build_studies(results_dir: str | Path, figures: bool = True, only: str | None = None) -> list[dict]:
    """Every study of ``results_dir`` (``only``: that one), each from its own rows into its own folder, then the rows
    of no study (when there are any, or an earlier build of them to replace), then the index ``results/README.md``.
    Returns ``build_all``'s result per study built (``"study"``: its name, None for the rows of no study)."""
    results_dir = Path(results_dir)
    names = [only] if only else studies(results_dir)
    out = []
    for name in names:
        out.append({"study": name, **build_all(results_dir, figures=figures, study=name)})
    loose = results_dir / "runs"
    if only is None and (any(loose.glob("*.json")) or (results_dir / "tables" / "index.md").is_file()):
        out.append({"study": None, **build_all(results_dir, figures=figures, study=None)})

    write_index(results_dir)
    return out


def build_all(results_dir: str | Path, tables_dir: str | Path | None = None, figures_dir: str | Path | None = None,
              spec_path: str | Path | None = None, paper_path: str | Path | None = None,
              figures: bool = True, runs_dir: str | Path | None = None, study: str | None = None) -> dict:
    """One study's tables and figures: ``study`` names it (its rows in ``results_dir/<study>/runs``, its outputs
    in ``results_dir/<study>/``); None = the rows of no study (``results_dir/runs``, outputs in ``results_dir``).
    ``runs_dir``: read the rows from this directory instead (an archived study). The tables (and figures) folders
    are replaced whole (``results.replacing_dirs``): built beside them, swapped in at the end together with the
    study's front page, so a full disk or a SIGTERM leaves the previous files and a finished build the new ones,
    never a mix; files there that make tables does not write (not ``*.md`` / ``*.tex``, ``*.png`` / ``*.pdf``) are
    kept."""
    root = Path(results_dir)
    results_dir = study_dir(root, study)
    tables_dir = Path(tables_dir or results_dir / "tables")
    figures_dir = Path(figures_dir or results_dir / "figures")
    rows = read_rows(root, study) if runs_dir is None else read_rows_in(runs_dir)
    rs = RowSet(rows, load_spec(spec_path), runs_dir=runs_dir or results_dir / "runs")
    paper = Paper(paper_path)
    errors: list = []
    tables = build_tables(rs, paper, errors)
    targets = {tables_dir: lambda n: n.endswith(TABLE_FILES)}
    if figures:
        targets[figures_dir] = lambda n: n.endswith(FIGURE_FILES)
    before = {d: sorted(p.name for p in d.iterdir() if targets[d](p.name)) if d.is_dir() else [] for d in targets}
    with replacing_dirs(targets) as stage:
        new_tables, written = stage.path(tables_dir), []
        for t in tables:
            try:
                written += write(t, new_tables)
            except UnsafeName as e:  # a table id that is no file name: not written, said so
                errors.append(f"table {t.id!r}: {e}")
        figs, fig_notes = [], []
        if figures:
            from controlled_study.figures import build_figures  # deferred: matplotlib only when figures are drawn

            figs = build_figures(rs, paper, stage.path(figures_dir), errors, fig_notes)
        src = f"{runs_dir}" if runs_dir is not None else rows_source(study)
        lines = [f"# Tables and figures (generated by `make tables` from {src}; do not edit)", "",
                 f"{len(rows)} rows read: {sum(r.get('status') == 'ok' for r in rows)} ok, {len(rs.failed)} failed, "
                 f"{len(rs.running)} unfinished, {len(rs.stale)} stale (killed); {len(rs.entries)} configurations.", "",
                 "Every number of ours carries its sample size and a 95% interval (Wilson for accuracies and bounded "
                 "scores, Student t over documents for perplexity); `n.m.` = not measurable at this scale "
                 "(thresholds: each evaluator's `floor`, `harness/evals/<name>.py`). The findings: "
                 "[../findings.md](../findings.md).", ""]
        # tables and figures of an earlier build that this one did not write (a model without rows any more, a
        # figure now at the floor) are gone with the old folder: said here, so the index explains the difference
        names = {p.name for p in written}
        lines += [f"- removed {n}: not built from these rows" for n in before[tables_dir]
                  if n != "index.md" and n not in names]
        if figures:
            drawn = {p.name for p in figs}
            fig_notes += [f"removed {n}: not drawn from these rows" for n in before[figures_dir] if n not in drawn]
        lines += [f"- [{t.title}]({t.id}.md) ([LaTeX]({t.id}.tex))" for t in tables
                  if new_tables / f"{t.id}.md" in written]
        lines += [f"- figure: [{p.stem}]({Path('..') / 'figures' / p.name})" for p in figs if p.suffix == ".png"]
        lines += [f"- figure note: {m}" for m in fig_notes]
        lines += [f"- **not built**: {m}" for m in errors]
        atomic_write_text(new_tables / "index.md", "\n".join(lines) + "\n")
        if runs_dir is None:  # the study's front page (an archived study keeps only its tables), with the swap

            stage.on_commit(lambda: write_front(results_dir, tables_dir, study=study))
    for line in rs.refusals():  # a newer row with fewer samples than the one it would displace: one line each
        print(line, file=sys.stderr, flush=True)
    # the paths as they are after the swap
    written = [tables_dir / p.name for p in written]
    figs = [figures_dir / p.name for p in figs]
    return {"rows": len(rows), "tables": [t for t in tables if tables_dir / f"{t.id}.md" in written],
            "files": written + [tables_dir / "index.md"], "figures": figs, "rowset": rs, "errors": errors,
            "figure_notes": fig_notes}


def rows_source(study: str | None) -> str:
    """Where a study's rows are, as its generated files say it (relative to the repository)."""
    return f"results/{study}/runs/" if study else "results/runs/"
