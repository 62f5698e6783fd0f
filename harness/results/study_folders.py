"""Studies: a row belongs to the study it declares (``config.study.experiment``) and lives in its folder,
``<results>/<study>/runs/``; ``read_rows`` reads one study's rows."""
from __future__ import annotations

import sys
from pathlib import Path

from harness.results.reading import read_row_file
from harness.safe import check_name

# ------------------------------------------------------------------------------------------------------ studies
# A row belongs to a study by declaration: the study names itself in its config (``study.experiment: <name>``, in
# its experiment YAML, ``experiment/<name>.yaml`` of a config folder, or ``+study.experiment=<name>`` on a command
# line), every row records it (``config.study.experiment``), and the row goes to ``<results>/<name>/runs/``. A row
# of no study (a plain ``run.py``, ``make run``, a sweep without ``experiment=``) goes to ``<results>/runs/``. Each
# study's tables, figures, findings and front page are built from its own folder only (``make tables`` / ``make
# findings``).
# folders of a results directory that are not studies (and names a study may therefore not take)
NOT_STUDIES = frozenset({"runs", "tables", "figures", "export", "archive", "curves", "factors", "jobs", "samples"})


def study_name(name) -> str | None:
    """A declared study name, checked (``harness.safe.check_name``; not a folder a results directory keeps for
    itself, ``NOT_STUDIES``); ``None`` / empty = no study."""
    if name in (None, ""):
        return None
    check_name(name, "study")
    if name in NOT_STUDIES:
        raise ValueError(f"study name {name!r} is a folder the results directory keeps for itself "
                         f"({', '.join(sorted(NOT_STUDIES))}); choose another")
    return name


def study_of(row_or_config: dict) -> str | None:
    """The study a row (or a resolved config) declares, ``config.study.experiment``; ``None`` for a row of no study
    or a name that is not a safe study name (such a row was never written by this harness into a study folder)."""
    cfg = row_or_config.get("config") if "config" in row_or_config else row_or_config
    st = (cfg or {}).get("study") if isinstance(cfg, dict) else None
    name = st.get("experiment") if isinstance(st, dict) else None
    try:
        return study_name(name)
    except ValueError:
        return None


def study_dir(results_dir: str | Path, study: str | None) -> Path:
    """Where a study keeps its rows (``runs/``), tables, figures, findings and front page: ``<results>/<study>``;
    ``<results>`` itself for rows of no study. The name is checked (``study_name``)."""
    study = study_name(study)
    return Path(results_dir) / study if study else Path(results_dir)


def studies(results_dir: str | Path) -> list[str]:
    """The studies a results directory holds: every folder ``<results>/<name>/runs/`` whose name is a study name,
    sorted."""
    out = []
    for d in sorted(Path(results_dir).glob("*/runs")):
        name = d.parent.name
        try:
            if d.is_dir() and study_name(name):
                out.append(name)
        except ValueError:
            continue
    return out


def read_rows(results_dir: str | Path, study: str | None = None, warn=None) -> list[dict]:
    """Every row of one study (``<results>/<study>/runs/``), or of no study (``study`` None: ``<results>/runs/``);
    anything there that is not a row is skipped with a warning naming it. A row that declares another study than
    the folder it sits in is skipped with one line naming it and where it belongs (it never joins a study it did not
    declare). Rows that declare no study are read as members of the folder's study (rows written before rows recorded
    their study: the folder is their declaration)."""
    warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))
    d = study_dir(results_dir, study)
    out = []
    for f in sorted(Path(d, "runs").glob("*.json")):
        row = read_row_file(f, warn, root=Path(d, "runs"))
        if row is None:
            continue
        declared = study_of(row)
        if declared is not None and declared != study:
            warn(f"warning: skipping {f}: it declares study {declared!r}, not "
                 + (f"{study!r}" if study else "none") + f" (its place: {study_dir(results_dir, declared)}/runs/)")
            continue
        out.append(row)
    return out
