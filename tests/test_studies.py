"""A row belongs to a study by declaration: where rows go, which rows build which study's tables and findings, and
how two rows that compete for one cell are settled (issue 45)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from controlled_study import build_all, build_studies
from controlled_study.rows import RowSet, load_spec
from harness import lifecycle, results
from harness.conf_utils import compose
from harness.config import ConfigError
from tests.test_tables import make_row


def _put(res: Path, study: str | None, rows: list[dict]) -> Path:
    runs = results.study_dir(res, study) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for r in rows:
        if study:
            r["config"]["study"] = {"experiment": study}
        (runs / f"{r['run_id']}.json").write_text(json.dumps(r))
    return runs


def test_a_run_of_a_study_writes_into_the_study_folder_and_a_plain_run_into_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_RESULTS_DIR", str(tmp_path / "res"))
    assert lifecycle.results_dir(compose(["experiment=tiny_study", "point=tiny_study/base"])) == tmp_path / "res" / \
        "tiny_study"
    assert lifecycle.results_dir(compose(["method=base", "train=none", "eval=run"])) == tmp_path / "res"
    assert lifecycle.results_dir(compose(["method=base", "+study.experiment=my_look"])) == tmp_path / "res" / "my_look"
    for bad in ("../up", "a/b", "runs", "tables", ".hidden", "x" * 129, "sp ace"):
        with pytest.raises(ConfigError, match=r"^study\.experiment: ") as e:
            lifecycle.results_dir(compose(["method=base", f"+study.experiment='{bad}'"]))
        assert "\n" not in str(e.value)


def test_each_study_is_built_from_its_own_rows_only(tmp_path, capsys):
    res = tmp_path / "results"
    _put(res, "study_a", [make_row(tmp_path, "a-base", "base", train="none", ppl_base=15.0),
                          make_row(tmp_path, "a-pi", "pi", ppl_base=17.0)])
    loose = _put(res, None, [make_row(tmp_path, "loose-pi", "pi", ppl_base=90.0, t_end="2027-01-01T00:00:00"),
                             make_row(tmp_path, "loose-yarn", "yarn")])
    # a row that declares study_a but sits among the rows of no study: read by neither, one line says where it belongs
    stray = make_row(tmp_path, "stray-pi", "pi", ppl_base=50.0, t_end="2027-01-02T00:00:00")
    stray["config"]["study"] = {"experiment": "study_a"}
    (loose / "stray-pi.json").write_text(json.dumps(stray))
    outs = {o["study"]: o for o in build_studies(res, figures=False)}
    assert set(outs) == {"study_a", None}
    ids_a = {r["run_id"] for r in outs["study_a"]["rowset"].all_rows}
    ids_loose = {r["run_id"] for r in outs[None]["rowset"].all_rows}
    assert ids_a == {"a-base", "a-pi"} and ids_loose == {"loose-pi", "loose-yarn"}
    err = capsys.readouterr().err
    assert len([ln for ln in err.splitlines() if "stray-pi.json" in ln and "declares study 'study_a'" in ln]) == 1
    assert {e.label for e in outs["study_a"]["rowset"].entries} == {"tiny_llama", "PI"}
    a = "".join(p.read_text() for p in (res / "study_a" / "tables").glob("*.md"))
    assert "PI" in a and not re.search(r"loose|stray|YaRN =", a)   # no loose row named, none used
    assert (res / "tables" / "table2_tiny_llama.md").is_file() and (res / "study_a" / "README.md").is_file()
    top = (res / "README.md").read_text()
    assert "[study_a](study_a/README.md)" in top and "loose" not in top


def test_the_index_does_not_change_when_rows_of_no_study_are_added(tmp_path):
    res = tmp_path / "results"
    _put(res, "study_a", [make_row(tmp_path, "a-base", "base", train="none")])
    build_studies(res, figures=False)
    before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
    _put(res, None, [make_row(tmp_path, "loose-base", "base", train="none", t_end="2027-01-01T00:00:00")])
    build_studies(res, figures=False)
    after = {p: p.read_bytes() for p in res.rglob("*") if p.is_file() and p in before}
    assert after == before


def _fewer(row: dict, n: int) -> dict:
    """The row with only its first ``n`` passkey prompts per length."""
    pk = row["metrics"]["passkey"]
    pk["correct"] = {L: v[:n] for L, v in pk["correct"].items()}
    pk["accuracy"] = {L: sum(v) / len(v) for L, v in pk["correct"].items()}
    pk["samples_per_length"] = n
    return row


def test_a_newer_row_with_fewer_samples_is_refused_with_one_line_naming_both_files(tmp_path, capsys):
    res = tmp_path / "results"
    old = make_row(tmp_path, "r1-base-full", "base", train="none", t_end="2026-01-01T00:00:00")
    new = _fewer(make_row(tmp_path, "r2-base-few", "base", train="none", t_end="2026-02-01T00:00:00"), 3)
    runs = _put(res, "study_a", [old, new])
    out = build_all(res, study="study_a", figures=False)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("refused:")]
    assert lines == [f"refused: {runs / 'r2-base-few.json'} (n = 3, newer) would displace "
                     f"{runs / 'r1-base-full.json'} (n = 10) in tiny_llama/base/tiny: fewer samples; the older row "
                     "keeps its cells"]
    t = {x.id: x for x in out["tables"]}["summary_passkey_tiny_llama"]
    cells = [c for c in t.rows[0][2:]]
    assert {c.n for c in cells} == {10}          # every cell from the row with more samples
    assert [c.ours for c in cells] == [sum(v) / 10 for v in old["metrics"]["passkey"]["correct"].values()]
    md = (res / "study_a" / "tables" / "summary_passkey_tiny_llama.md").read_text()
    assert "2 rows compete for its cells" in md and "r2-base-few.json (n = 3, newer) would displace" in md
    # a newer row with as many samples or more displaces the older one (the newest is taken)
    capsys.readouterr()
    more = make_row(tmp_path, "r3-base-more", "base", train="none", t_end="2026-03-01T00:00:00")
    _put(res, "study_a", [more])
    out = build_all(res, study="study_a", figures=False)
    t = {x.id: x for x in out["tables"]}["summary_passkey_tiny_llama"]
    assert [c.ours for c in t.rows[0][2:]] == [sum(v) / 10 for v in more["metrics"]["passkey"]["correct"].values()]
    assert "refused" not in "".join(
        ln for ln in capsys.readouterr().err.splitlines() if "r3-base-more" in ln)


def test_rows_of_different_suites_never_fill_the_same_cell():
    tiny = make_row(Path("/nonexistent"), "r1-tiny", "base", train="none", t_end="2026-01-01T00:00:00")
    quick = _fewer(make_row(Path("/nonexistent"), "r2-quick", "base", train="none", t_end="2026-02-01T00:00:00"), 3)
    quick["eval"] = quick["config"]["eval"]["name"] = "quick"
    rs = RowSet([tiny, quick], load_spec())
    by = {e.label: e for e in rs.entries}
    assert set(by) == {"tiny_llama [eval=tiny]", "tiny_llama [eval=quick]"}
    assert [r["run_id"] for r in by["tiny_llama [eval=tiny]"].rows] == ["r1-tiny"]
    assert rs.refusals() == []      # not competitors: two entries, each with its own cells
    # a suite that measures nothing in common (eval=extended beside eval=tiny) joins the configuration's entry
    tiny = make_row(Path("/nonexistent"), "r1-tiny", "base", train="none", suites=("ppl", "passkey"))
    ext = make_row(Path("/nonexistent"), "r3-ext", "base", train="none", suites=("longbench",))
    ext["eval"] = "extended"
    (e,) = RowSet([tiny, ext], load_spec()).entries
    assert {r["run_id"] for r in e.rows} == {"r1-tiny", "r3-ext"} and e.label == "tiny_llama"
    # ... but one that measures something the entry measures is an entry of its own
    ext2 = make_row(Path("/nonexistent"), "r4-ext", "base", train="none", suites=("longbench", "passkey"))
    ext2["eval"] = "extended"
    assert len(RowSet([tiny, ext2], load_spec()).entries) == 2


def test_footnote_says_which_row_was_taken_and_why(tmp_path):
    a = make_row(tmp_path, "r1", "pi", ppl_base=20.0, t_end="2026-01-01T00:00:00")
    b = make_row(tmp_path, "r2", "pi", ppl_base=18.0, t_end="2026-02-01T00:00:00")
    res = tmp_path / "results"
    _put(res, "s", [a, b])
    out = build_all(res, study="s", figures=False)
    md = (res / "s" / "tables" / "table2_tiny_llama.md").read_text()
    assert re.search(r"PI: 2 rows compete for its cells \(same model, method, train, data, eval protocol and suite\); "
                     r"taken per cell: the newest with a value \(r2\)", md), md
    assert out["rowset"].refusals() == []


def test_findings_compare_on_the_study_suite_only():
    """A quick look inside a study (eval=quick rows, newer) never stands in for the study's rows in a finding."""
    from controlled_study import findings as fd

    rows = [make_row(Path("/nonexistent"), f"r{i}-{m}", m, train="none" if m == "base" else "tiny")
            for i, m in enumerate(("base", "pi", "yarn"))]
    quick = _fewer(make_row(Path("/nonexistent"), "r9-pi-quick", "pi", t_end="2027-01-01T00:00:00"), 3)
    quick["eval"] = "quick"
    ev = fd.Evidence(RowSet(rows + [quick], load_spec()), "tiny_llama")
    assert ev.suite == "tiny" and ev.other_suites == ["quick"]
    assert [r["run_id"] for r in ev.entry("pi").rows] == ["r1-pi"]


def test_the_index_shows_each_findings_verdict_in_every_study_as_its_own_report_states_it(tmp_path):
    """Issue 48: the real model's findings beside the miniature's. The index's table across studies copies each
    study's verdict, raw and after Holm, from the report that study's rows produced, and counts the parts with an
    interval (a study without the rows a finding reads shows 0 of n)."""
    from controlled_study.findings.report import write as write_findings

    res = tmp_path / "results"
    _put(res, "study_a", [make_row(tmp_path, "a-base", "base", train="none"),
                          make_row(tmp_path, "a-ntkf", "ntk_frozen", train="none"),
                          make_row(tmp_path, "a-se", "self_extend", train="none")])
    _put(res, "study_b", [make_row(tmp_path, "b-pi", "pi", ppl_base=17.0)])
    build_studies(res, figures=False)
    for s in ("study_a", "study_b"):
        write_findings(res, study=s)
    top = (res / "README.md").read_text()
    assert "## The findings across studies" in top
    table = [ln for ln in top.split("## The findings across studies", 1)[1].splitlines() if ln.startswith("| (")]
    assert len(table) == 13
    for col, s in enumerate(("study_a", "study_b"), start=1):
        md = (res / s / "findings.md").read_text()
        for line in table:
            key = line.split(")", 1)[0] + ")"
            mine = next(ln for ln in md.splitlines() if ln.startswith(key + " "))
            result = re.match(r"\s*\*\*(\w+)\*\*", mine.split("|")[-2]).group(1)
            holm = re.search(r"<br>Holm: (\w+)", mine.split("|")[-2]).group(1)
            cell = line.split("|")[1 + col].strip()
            assert cell.startswith(result) and (holm == result or f"Holm: {holm}" in cell), (s, key, cell, mine)
            n = re.search(r"\((\d+) of (\d+) parts\)$", cell)
            assert n and int(n.group(1)) <= int(n.group(2))
    e = next(ln for ln in table if ln.startswith("| (e) ")).split("|")
    assert re.search(r"\((?!0 of)\d+ of \d+ parts\)$", e[2].strip())   # study_a: Self-Extend beside NTK-F and the base
    assert re.search(r"\(0 of \d+ parts\)$", e[3].strip())         # study_b: no frozen method, nothing measured
