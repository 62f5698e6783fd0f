"""One results row per run: a JSON file under ``results/runs/``, written atomically (temp file + rename).

Row schema (the ``Row`` TypedDict, a comment per key; ``ROW_FIELDS``; version ``SCHEMA_VERSION``):

- ``run_id``: unique id (UTC time + random suffix); also the file name, so two runs never overwrite each other.
- ``status``: ``running`` | ``ok`` | ``failed``; ``error``: one line when failed.
- ``time_start`` / ``time_end`` (ISO, UTC), ``timings`` (seconds per phase and per evaluator).
- ``model``, ``method``, ``data``, ``train``, ``eval``: the option chosen in each config group (stable short names).
- ``method_params``: the method's parameters; ``train_info``: what fine-tuning actually did (tokens seen,
  effective global batch, schedule, EMA with the base model's share of the evaluated weights) or ``null`` for
  frozen runs.
- ``metrics``: ``{suite entry: evaluator output}``, e.g. ``metrics.passkey.accuracy["1024"]``; ``eval_versions``:
  ``{suite entry: the evaluator's version}`` (its class attribute ``version``, 1 unless a change of its numbers
  bumped it), so rows measured by different versions of an evaluator can be told apart.
- ``config`` (resolved) and ``config_hash``; ``git_sha``; ``command``; ``versions`` (packages); ``hardware``.
- ``host``, ``pid`` of the process that writes the row, and ``heartbeat`` (ISO, UTC): rewritten every
  ``heartbeat_every_s`` seconds while the run lives (``start_heartbeat``), so a ``running`` row whose process was
  killed is recognisable: ``liveness(row)`` says ``stale`` when the process is gone (same host) or the heartbeat is
  older than a few periods (any host). ``python -m harness.status`` lists rows that way; the tables count them.

Files are created readable by the group and others as the umask allows (0644 under the usual 022), never 0600,
so teammates sharing a results directory can read every row.
"""
from __future__ import annotations

from harness.results.atomic import (  # noqa: F401 - the package's names
    FILE_MODE,
    HELD_SIGNALS,
    STALE_STAGING_S,
    Staged,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    replacing_dirs,
    signals_held,
    terminate_raises,
)
from harness.results.live import (  # noqa: F401 - the package's names
    age_s,
    liveness,
    pid_alive,
    start_heartbeat,
    stop_heartbeat,
    write_row,
)
from harness.results.reading import (  # noqa: F401 - the package's names
    MAX_FILE_BYTES,
    MAX_JSON_DEPTH,
    REQUIRED_KEYS,
    ROW_TYPES,
    STATUSES,
    check_row,
    decode_json,
    read_json_file,
    read_row_file,
    read_rows_in,
    row_problem,
)
from harness.results.schema import (  # noqa: F401 - the package's names
    GROUPS,
    LEGACY_NOT_IN_CONFIG_HASH,
    NOT_IN_CONFIG_HASH,
    PACKAGES,
    REPO,
    ROW_FIELDS,
    SCHEMA_VERSION,
    Row,
    config_hash,
    git_sha,
    hardware,
    machine_paths,
    new_row,
    new_run_id,
    now_iso,
    portable,
    row_hash,
    row_path,
    versions,
)
from harness.results.study_folders import (  # noqa: F401 - the package's names
    NOT_STUDIES,
    read_rows,
    studies,
    study_dir,
    study_name,
    study_of,
)
