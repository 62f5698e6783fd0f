"""Runs that survive unwritable or full directories, kills and reruns: one line and a failed row where a row can be
written, no stack trace, nothing measured lost; killed runs recognisable (pid, host, heartbeat -> ``stale``); rows
readable by teammates; results on stdout."""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import ROOT

from harness import lifecycle, pipeline, results
from harness.results import liveness, read_rows
from tests import forkrun

QUICK = ["method=base", "train=none", "eval=quick", "eval.lengths=[256]", "eval.suite.passkey.samples=1",
         "eval.suite.ppl_books.samples=1"]


def _env(tmp_path, **over):
    env = {**os.environ, "HARNESS_RESULTS_DIR": str(tmp_path / "res"), "HARNESS_OUTPUT_DIR": str(tmp_path / "out"),
           "HARNESS_CKPT_DIR": str(tmp_path / "ck"), "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    env.update({k: str(v) for k, v in over.items()})
    return env


def _run(args, env, prelude: str | None = None, timeout=600):
    """``run.py args``; with ``prelude``, that code runs first in the same process (to inject failures)."""
    if prelude is None:
        cmd = [sys.executable, str(ROOT / "run.py"), *args]
    else:
        code = prelude + f"\nimport runpy, sys\nsys.argv = [{str(ROOT / 'run.py')!r}] + {list(args)!r}\n" \
                         f"runpy.run_path({str(ROOT / 'run.py')!r}, run_name='__main__')\n"
        cmd = [sys.executable, "-c", code]
    return forkrun.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def _one_clean_line(r, *must_contain):
    """Non-zero exit, no stack trace, and a last stderr line ``run failed: ...`` naming what it must name."""
    assert r.returncode != 0, r.stdout[-2000:]
    text = r.stdout + r.stderr
    assert "Traceback" not in text and "Error executing job" not in text and "HYDRA_FULL_ERROR" not in text, text
    last = [ln for ln in r.stderr.splitlines() if ln.strip()][-1]
    assert last.startswith("run failed: "), last
    for m in must_contain:
        assert m in last, (m, last)
    return last


@contextmanager
def _tmpfs(path: Path, size: str = "1m", readonly: bool = False, full: bool = False):
    """A small filesystem at ``path`` (root, Linux): read-only or full. Skips where it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        pytest.skip("mounting a small filesystem needs root on Linux")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        (path / "runs").mkdir()
        if full:
            with open(path / "filler", "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError:
                    pass
        if readonly:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# ------------------------------------------------------------------------------------------ unwritable places
@pytest.mark.parametrize("kind", ["file", "readonly", "full"])
def test_results_dir_that_refuses_the_row(tmp_path, kind):
    """A results directory that is a file, read-only or full: the run does not start, one line names the row."""
    res = tmp_path / "res"
    if kind == "file":
        res.write_text("not a directory")
        r = _run(QUICK, _env(tmp_path))
    else:
        with _tmpfs(res, "64k", readonly=kind == "readonly", full=kind == "full"):
            r = _run(QUICK, _env(tmp_path))
    last = _one_clean_line(r, str(res / "runs"))
    assert "[no row written: " in last  # says that no row could be written
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("samples"))  # nothing evaluated


@pytest.mark.parametrize("multirun", [False, True])
def test_outputs_dir_unwritable_before_the_run(tmp_path, multirun):
    """Hydra's own mkdir of the run directory fails: one line naming the directory and a failed row."""
    (tmp_path / "out").write_text("not a directory")
    r = _run((["-m"] if multirun else []) + QUICK, _env(tmp_path))
    _one_clean_line(r, str(tmp_path / "out"))
    (row,) = read_rows(tmp_path / "res")
    assert row["status"] == "failed" and str(tmp_path / "out") in row["error"]


FILL_DISK_WHEN_MEASURED = textwrap.dedent("""
    import errno, os, pathlib
    import harness.results.live as R  # the row file's writer
    _write, _text = R.atomic_write_text, pathlib.Path.write_text
    full = []
    def write(path, text):  # the disk fills once the first evaluator result is being written
        if full or ('"metrics": {}' not in text and '"metrics"' in text):
            full.append(1)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return _write(path, text)
    def write_text(self, *a, **k):
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return _text(self, *a, **k)
    R.atomic_write_text = write
    pathlib.Path.write_text = write_text
""")


def test_disk_filling_mid_run(tmp_path):
    """The disk fills after the first evaluator result (injected ENOSPC for every later write, the error handler's
    included): one line saying what could not be written, the measured metric still printed on stdout, and the row
    left behind is recognisably dead (``stale``), not ``running`` forever."""
    r = _run(QUICK[:3] + ["eval.lengths=[256,512]", "eval.suite.passkey.samples=1", "eval.suite.ppl_books.samples=1"],
             _env(tmp_path), prelude=FILL_DISK_WHEN_MEASURED)
    last = _one_clean_line(r, "No space left on device", "not updated")
    assert "ppl_books.ppl" in r.stdout  # what was measured before the failure is not lost
    (row,) = read_rows(tmp_path / "res")
    assert row["status"] == "running" and row["pid"] and row["host"] == socket.gethostname()
    assert liveness(row) == "stale", last
    s = forkrun.run([sys.executable, "-m", "harness.status", str(tmp_path / "res")], capture_output=True,
                       text=True, cwd=ROOT)
    assert s.returncode == 0 and "stale" in s.stdout and row["run_id"] in s.stdout


def test_error_handler_write_failures_never_raise(tmp_path):
    """The failure handler itself cannot write (results dir and run dir refuse): it returns what it could not
    write instead of raising, and keeps the row in the run directory when only the results directory refuses."""
    (tmp_path / "res").write_text("a file")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    row = results.new_row("r1", {}, {}, run_dir)
    problem = lifecycle.Run(tmp_path / "res", row).finish(RuntimeError("boom"))
    assert row["status"] == "failed" and row["error"] == "RuntimeError: boom"
    assert "not updated" in problem and "row kept in" in problem
    assert json.loads((run_dir / "row.json").read_text())["status"] == "failed"
    row2 = results.new_row("r2", {}, {}, tmp_path / "res" / "nowhere")  # run dir cannot exist either
    problem2 = lifecycle.Run(tmp_path / "res", row2).finish(RuntimeError("boom"))
    assert "error.log not written" in problem2 and "not updated" in problem2


def test_failed_row_start_in_process_is_one_line(tmp_path, capsys):
    """``run_guarded``: an exception escaping Hydra before the run began (injected) -> one line + a failed row."""
    env = {"HARNESS_RESULTS_DIR": str(tmp_path / "res")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        def boom():
            raise PermissionError(errno.EACCES, "Permission denied", "/some/outputs/2026-01-01")

        with pytest.raises(SystemExit) as ex:
            lifecycle.run_guarded(boom, ["method=base"])
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert ex.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["run failed: PermissionError: [Errno 13] Permission denied: '/some/outputs/2026-01-01'"]
    (row,) = read_rows(tmp_path / "res")
    assert row["status"] == "failed" and "/some/outputs" in row["error"]


# ------------------------------------------------------------------------------------------ killed runs
def _start_run(tmp_path, **env):
    # far more prompts than the test waits for: the run must still be alive when it is killed, on any machine (a fast
    # CI machine finished a 5-prompt run between the heartbeat check and the SIGKILL)
    args = QUICK[:3] + ["eval.lengths=[256,512,1024]", "eval.suite.passkey.samples=2000",
                        "eval.suite.ppl_books.samples=200"]
    p = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], env=_env(tmp_path, **env), cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 900  # a bound on a hang, not a speed check (process start-up took minutes at load 15)
    while not read_rows(tmp_path / "res"):
        assert p.poll() is None and time.time() < deadline, p.stderr.read() if p.poll() is not None else "no row"
        time.sleep(0.05)
    return p


def test_killed_run_is_stale_and_terminated_run_is_failed(tmp_path):
    """A live run's row carries pid, host and a heartbeat that advances; SIGKILL leaves it ``running`` but shown as
    ``stale`` by ``liveness``, ``python -m harness.status`` and the tables; SIGTERM (Slurm, ``kill``) ends the
    row ``failed``."""
    p = _start_run(tmp_path / "a", HARNESS_HEARTBEAT_S=0.3)
    (row,) = read_rows(tmp_path / "a" / "res")
    assert row["pid"] == p.pid and row["host"] == socket.gethostname() and row["heartbeat_every_s"] == 0.3
    assert liveness(row) == "running"
    t0 = time.time()
    while read_rows(tmp_path / "a" / "res")[0]["heartbeat"] == row["heartbeat"]:
        assert time.time() - t0 < 300 and p.poll() is None, "the heartbeat does not advance"
        time.sleep(0.2)
    assert p.poll() is None, "the run ended before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    (row,) = read_rows(tmp_path / "a" / "res")
    assert row["status"] == "running" and liveness(row) == "stale"
    s = forkrun.run([sys.executable, "-m", "harness.status", str(tmp_path / "a" / "res")], capture_output=True,
                       text=True, cwd=ROOT)
    assert "1 stale" in s.stdout and f"{socket.gethostname()}:{p.pid}" in s.stdout, s.stdout
    from controlled_study.rows import RowSet, load_spec

    rs = RowSet([row], load_spec())
    assert rs.stale == [row] and not rs.running and any("stale" in n for n in rs.footnotes())

    p = _start_run(tmp_path / "b")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=900)
    assert p.returncode != 0 and "Traceback" not in err, err
    assert [ln for ln in err.splitlines() if ln.strip()][-1] == "run failed: Terminated: terminated by SIGTERM"
    (row,) = read_rows(tmp_path / "b" / "res")
    assert row["status"] == "failed" and row["error"] == "Terminated: terminated by SIGTERM"


def test_liveness_rules(monkeypatch):
    now = results.now_iso()
    old = "2020-01-01T00:00:00+00:00"
    here = socket.gethostname()
    assert liveness({"status": "ok"}) == "ok" and liveness({"status": "failed"}) == "failed"
    assert liveness({"status": "running", "host": here, "pid": os.getpid(), "heartbeat": now,
                     "heartbeat_every_s": 60}) == "running"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert liveness({"status": "running", "host": here, "pid": dead.pid, "heartbeat": now,
                     "heartbeat_every_s": 60}) == "stale"
    other = {"status": "running", "host": "another-node", "pid": 1, "heartbeat_every_s": 60}
    assert liveness({**other, "heartbeat": now}) == "running"
    assert liveness({**other, "heartbeat": old}) == "stale"
    # sharded: jobs come and go
    assert liveness({**other, "heartbeat": old, "shards": {"train": "missing"}}) == "running"
    assert liveness({"status": "running"}, mtime=time.time() - 7200) == "stale"  # a row from before heartbeats
    assert liveness({"status": "running"}, mtime=time.time()) == "running"


# ------------------------------------------------------------------------------------------ sharing
def test_rows_and_run_files_readable_by_teammates(tmp_path):
    """Rows and atomically written files get the umask's mode (0644 under 022, 0640 under 027), never mkstemp's
    0600; checkpoint directories are listable (0755 under 022)."""
    code = textwrap.dedent(f"""
        import os
        os.umask(0o027)
        from harness import results
        from harness.train.checkpoint import Store
        results.write_row({str(tmp_path / "r27")!r}, {{"run_id": "x", "status": "ok"}})
        d = Store({str(tmp_path / "ck27")!r}, "k").new_tmp(1)
        print(oct(os.stat(d).st_mode & 0o777))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.stat(tmp_path / "r27" / "runs" / "x.json").st_mode & 0o777 == 0o640
    assert r.stdout.strip() == oct(0o750)
    old = os.umask(0o022)
    os.umask(old)
    if old == 0o022:
        p = results.write_row(tmp_path / "r", {"run_id": "y", "status": "ok"})
        assert os.stat(p).st_mode & 0o777 == 0o644


# ------------------------------------------------------------------------------------------ stray files, full disks
STRAY = {"truncated.json": b'{"run_id": "t", "status": "o', "empty.json": b"",
         "latin1.json": '{"run_id": "l", "status": "ok", "method": "caf\u00e9"}'.encode("latin-1"),
         "a_list.json": b'[{"run_id": "x", "status": "ok"}]', "no_keys.json": b'{"metrics": {}}'}


def _study_rows(tmp: Path) -> Path:
    """A results dir with three real rows (the tables' test rows) and one file of every stray kind."""
    from test_tables import make_row, write_rows

    res = write_rows(tmp, [make_row(tmp, "r1-base", "base", train="none"), make_row(tmp, "r2-pi", "pi"),
                           make_row(tmp, "r3-yarn", "yarn")])
    for name, data in STRAY.items():
        (res / "runs" / name).write_bytes(data)
    return res


def _script(*args, timeout=300):
    return forkrun.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_stray_row_files_cost_one_warning_each_in_status_tables_and_findings(tmp_path):
    """A results dir holding a truncated, an empty, a non-UTF-8, a JSON-list and a keyless row file beside real rows:
    ``make status``, ``make tables`` and ``make findings`` exit 0, each with one warning per stray file naming it and
    why, and use the real rows."""
    res = _study_rows(tmp_path)
    why = {"truncated.json": "not JSON", "empty.json": "empty", "latin1.json": "not UTF-8",
           "a_list.json": "JSON list, not an object", "no_keys.json": "no run_id / status"}
    runs = [("status", ["-m", "harness.status", str(res), "--all"]),
            ("tables", [str(ROOT / "scripts/make_tables.py"), "--results", str(res), "--no-figures"]),
            ("findings", [str(ROOT / "scripts/make_findings.py"), "--results", str(res)])]
    for what, args in runs:
        r = _script(*args)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (what, r.stderr[-3000:])
        warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: skipping")]
        for name, reason in why.items():
            mine = [ln for ln in warnings if str(res / "runs" / name) in ln]
            assert len(mine) == 1 and reason in mine[0], (what, name, warnings)
        assert len(warnings) == len(STRAY), (what, warnings)
    assert "3 rows" in _script("-m", "harness.status", str(res)).stdout
    assert (res / "tables" / "index.md").read_text().count("3 rows read") == 1
    assert "r2-pi" in (res / "findings.md").read_text()


def test_full_disk_during_make_tables_keeps_the_previous_tables(tmp_path):
    """``make tables`` / ``make findings`` into a disk that fills: exit 1 with one line naming the file, every
    previously written table and findings.md intact, no temporary file left behind."""
    res = _study_rows(tmp_path)
    with _tmpfs(tmp_path / "disk", size="4m") as disk:
        tables, findings = disk / "tables", disk / "findings.md"
        ok = _script(str(ROOT / "scripts/make_tables.py"), "--results", str(res), "--tables", str(tables),
                     "--no-figures")
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert _script(str(ROOT / "scripts/make_findings.py"), "--results", str(res), "--out", str(findings)
                       ).returncode == 0
        before = {p.name: p.read_bytes() for p in [*tables.iterdir(), findings]}
        assert any(n.endswith(".tex") for n in before) and all(before.values())
        from test_tables import make_row, write_rows

        write_rows(tmp_path, [make_row(tmp_path, f"r{i}-{m}", m, train=t) for i, (m, t) in enumerate(
            [("ntk_dynamic", "tiny"), ("self_extend", "none"), ("clex", "tiny"), ("abf", "tiny")], 4)])  # bigger
        with open(disk / "filler", "wb", buffering=0) as f:  # unbuffered: nothing left to flush at close
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        for what, args in (("tables", [str(ROOT / "scripts/make_tables.py"), "--results", str(res), "--tables",
                                       str(tables), "--no-figures"]),
                           ("findings", [str(ROOT / "scripts/make_findings.py"), "--results", str(res), "--out",
                                         str(findings)])):
            r = _script(*args)
            lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("warning: skipping")]
            assert r.returncode == 1 and "Traceback" not in r.stderr and len(lines) == 1, (what, r.stderr[-3000:])
            assert "No space left on device" in lines[0] and str(disk) in lines[0], lines
        after = {p.name: p.read_bytes() for p in [*tables.iterdir(), findings]}
        assert after == before


# ------------------------------------------------------------------------------------------ errors naming key or file
@pytest.mark.parametrize("override,says", [
    ("model.dtype=float8", "model.dtype: unknown weights dtype 'float8' (valid: float32, bfloat16, float16)"),
    ("seed=abc", "seed: 'abc' is not a seed (valid: an integer"),
    ("model.path={tok}", "model.path: {tok} has no tokenizer files (valid: a folder with one of tokenizer.json"),
])
def test_bad_model_settings_name_the_key_before_the_model_loads(tmp_path, monkeypatch, override, says):
    from harness import models
    from harness.conf_utils import compose
    from harness.config import ConfigError

    tok = tmp_path / "no_tokenizer"  # a model folder without its tokenizer
    tok.mkdir()
    for f in ("config.json", "model.safetensors"):
        (tok / f).symlink_to(ROOT / "harness/assets/tiny_llama" / f)
    cfg = compose(["method=base", "train=none", "eval=quick", override.format(tok=tok)])
    monkeypatch.setattr(models, "load_pretrained", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(ConfigError) as e:
        pipeline.validate(cfg)
    assert str(e.value).startswith(says.format(tok=tok)), str(e.value)


def test_malformed_longbench_line_names_file_and_line(tmp_path):
    from harness.config import ConfigError
    from harness.evals.longbench import FIXTURES, load_task

    good = (FIXTURES / "narrativeqa.jsonl").read_text(encoding="utf-8").splitlines()[0]
    bad = tmp_path / "narrativeqa.jsonl"
    bad.write_text(good + "\n\n" + '{"input": "q", "context": "unterminated\n' + good + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"longbench: {bad} line 3: not JSON \(Unterminated string"):
        load_task(tmp_path, "narrativeqa")
    bad.write_text(good + "\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"longbench: {bad} line 2 lacks fields"):
        load_task(tmp_path, "narrativeqa")


@pytest.mark.parametrize("damage", ["pickled object array", "truncated", "wrong shape", "not numpy"])
def test_corrupt_data_cache_is_rebuilt_with_a_warning(tmp_path, capsys, damage):
    from dataclasses import dataclass

    import numpy as np

    from harness.data import cached_chunks

    @dataclass
    class Args:
        name: str = "mix"
        cache_dir: str = str(tmp_path / "cache")
        seed: int = 0

    class Tok:
        def get_vocab(self):
            return {"a": 0, "b": 1}

    want = np.arange(4 * 16, dtype=np.int32).reshape(4, 16)
    built = []

    def build():
        built.append(1)
        return want.copy()

    first = cached_chunks(Args(), Tok(), 16, 64, build)
    path = next((tmp_path / "cache").glob("*.npy"))
    assert np.array_equal(first, want) and len(built) == 1
    del first
    if damage == "pickled object array":
        np.save(path, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "wrong shape":
        np.save(path, want.reshape(8, 8))
    else:
        path.write_bytes(b"\x00garbage" * 40)
    capsys.readouterr()
    again = cached_chunks(Args(), Tok(), 16, 64, build)
    err = capsys.readouterr().err
    assert np.array_equal(again, want) and len(built) == 2
    assert err.count("warning:") == 1 and f"warning: data cache {path} is unusable" in err and "rebuilding" in err, err
    cached_chunks(Args(), Tok(), 16, 64, build)  # the rebuilt file is used as is
    assert len(built) == 2 and not capsys.readouterr().err
