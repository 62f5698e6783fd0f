"""Data is not code: the one place that decides whether a name from a row, a setting or a path may become part of a
file path or of shell text, whether a number may be recorded, and how an environment setting is read.

The basement floor of ``harness`` (it imports nothing of it; every floor above may import it):

- ``check_name(value, what)``: a name that becomes a file or directory name (a model, method, data, recipe or suite
  name, a table id, a study or sweep name, a suite entry) matches ``NAME_PATTERN``: letters, digits, ``_ . + -``,
  not starting with a dot or a dash, at most ``NAME_MAX`` characters. ``../x``, ``a/b``, ``.hidden``, an empty or
  a non-string name are refused with ``UnsafeName`` (a ``ValueError``) naming ``what`` and the value.
- ``inside(root, *parts)`` / ``safe_file(root, name, suffix)``: a path under ``root`` that stays inside it once
  resolved (symlinks and ``..`` included); ``UnsafeName`` otherwise. Every file name built from a row or a setting
  goes through one of them (tables, figures, run directories, job records).
- ``shell_word(value)`` / ``sbatch_value(value)``: a value as one shell word (``shlex.quote``) or as one ``#SBATCH``
  option value (Slurm's own parser: double quotes, backslash escapes); a value with a newline, a carriage return or
  a NUL cannot be put in a line safely and is refused (``UnsafeName``).
- ``nonfinite(obj)``: where a nested structure of numbers holds NaN or an infinity (``"ppl.1024"``): a non-finite
  number is a failure, not a result.
- ``env_setting(name, default)``: an environment variable that is unset *or empty* gives ``default`` (``HARNESS_
  RESULTS_DIR=`` must not put rows into ``./runs/``); ``${env_or:NAME,default}`` is the same in the YAMLs.
"""
from __future__ import annotations

import math
import os
import re
import shlex
from pathlib import Path

NAME_MAX = 128
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")  # NAME_MAX characters
UNSAFE_CHARS = ("\n", "\r", "\0")  # what no generated line may hold (a newline starts a new shell / #SBATCH line)


class UnsafeName(ValueError):
    """A name that would not stay a name (a path, shell text): one line naming the setting and the value."""


def is_safe_name(value) -> bool:
    return isinstance(value, str) and NAME_PATTERN.fullmatch(value) is not None


def check_name(value, what: str) -> str:
    """``value`` when it is a safe file name (``NAME_PATTERN``), else ``UnsafeName`` naming ``what``."""
    if not is_safe_name(value):
        raise UnsafeName(f"{what}: {str(value)[:200]!r} is not a safe name (valid: letters, digits, _ . + -, not "
                         f"starting with . or -, 1..{NAME_MAX} characters; a name never becomes a path)")
    return value


def inside(root: str | Path, *parts: str | Path) -> Path:
    """``root / parts...``, refused (``UnsafeName``) when it resolves outside ``root`` (``..``, an absolute part, a
    symlink that leads out)."""
    root = Path(root)
    path = root.joinpath(*parts)
    base = root.resolve()
    got = path.resolve()
    if got != base and base not in got.parents:
        raise UnsafeName(f"{path}: resolves to {got}, outside {base} (a name from data never leaves its folder)")
    return path


def safe_file(root: str | Path, name: str, suffix: str = "", what: str = "file name") -> Path:
    """``root / (name + suffix)`` for a ``name`` that passes ``check_name`` and a path that stays inside ``root``."""
    return inside(root, check_name(name, what) + suffix)


def check_line_safe(value, what: str) -> str:
    s = str(value)
    bad = [repr(c) for c in UNSAFE_CHARS if c in s]
    if bad:
        raise UnsafeName(f"{what}: {s[:200]!r} holds {', '.join(bad)}, which no generated script line can carry "
                         f"(valid: a value on one line)")
    return s


def shell_word(value, what: str = "value") -> str:
    """``value`` as exactly one shell word (``shlex.quote``); a newline / CR / NUL is refused (``UnsafeName``)."""
    return shlex.quote(check_line_safe(value, what))


def sbatch_value(value, what: str = "#SBATCH value") -> str:
    """``value`` as one ``#SBATCH`` option value: Slurm (not the shell) parses these lines, splitting on blanks
    outside double quotes, with ``\\`` escaping the next character and an unquoted ``#`` starting a comment; a value
    is double-quoted with ``\\`` and ``"`` escaped. A newline / CR / NUL is refused (it would end the line and start
    another directive or a shell command)."""
    s = check_line_safe(value, what)
    if re.fullmatch(r"[\w@%+=:,./-]+", s):
        return s  # nothing Slurm's parser would split or strip
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def nonfinite(obj, where: str = "", depth: int = 64, replace: bool = False) -> list[str]:
    """The dotted paths in ``obj`` (dicts, lists, numbers) whose value is a NaN or an infinity (floats, and numpy
    scalars through ``float``), as ``"ppl.1024 = nan"``; ``depth`` bounds the walk. ``replace``: set each such value
    to None in place (a reader treating it as missing)."""
    out: list[str] = []
    stack = [(obj, where, 0)]
    while stack:
        x, at, d = stack.pop()
        if isinstance(x, (dict, list, tuple)):
            if d >= depth:
                continue
            items = list(x.items()) if isinstance(x, dict) else list(enumerate(x))
            for k, v in reversed(items):
                sub = (f"{at}.{k}" if at else str(k)) if isinstance(x, dict) else f"{at}[{k}]"
                if _is_nonfinite(v):
                    out.append(f"{sub} = {float(v)}")
                    if replace and not isinstance(x, tuple):
                        x[k] = None
                else:
                    stack.append((v, sub, d + 1))
        elif _is_nonfinite(x) and not at:
            out.append(f"value = {float(x)}")
    return sorted(out)


class NonFinite(FloatingPointError):
    """A result holds a NaN or an infinity (or a derived number overflowed): a failure, not a result."""


def check_finite(obj, where: str) -> None:
    """Raise ``NonFinite`` naming ``where`` and the first non-finite values of ``obj`` (``nonfinite``)."""
    bad = nonfinite(obj)
    if bad:
        raise NonFinite(f"{where}: non-finite {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} (a non-finite "
                        f"number is a failure, not a result)")


def _is_nonfinite(x) -> bool:
    if isinstance(x, (bool, str, bytes, dict, list, tuple)) or x is None:
        return False
    try:
        return not math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


def env_setting(name: str, default: str | None = None) -> str | None:
    """``os.environ[name]`` unless it is unset or empty (then ``default``)."""
    v = os.environ.get(name)
    return v if v else default
