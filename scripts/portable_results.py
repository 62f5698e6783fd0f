"""Rewrite the committed results so that they carry no machine paths (issue 58): every JSON file under ``results/``
(rows, the GPU check's records, factor files, the archive) with each absolute path made relative to the checkout it
was written in, an interpreter's path its name, and a path outside any checkout ``.../<last two parts>``
(``harness.results.portable``). Keys, order and formatting are kept; a row's config hash is unchanged (its paths are
not hashed), so no study point changes its done state. Idempotent.

    python scripts/portable_results.py            # rewrite in place; prints what changed
    python scripts/portable_results.py --check    # exit 1 when a file still holds a machine path
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.results import atomic_write_text, machine_paths, portable, row_hash

ROOT = Path(__file__).resolve().parents[1]


def _indent(text: str) -> int | None:
    """The indentation a JSON file was written with (rows: 1; records: 1 or 2), None for one line."""
    lines = text.splitlines()
    if len(lines) < 2:
        return None
    return len(lines[1]) - len(lines[1].lstrip(" ")) or None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--check", action="store_true", help="only report; exit 1 when a machine path is left")
    a = ap.parse_args(argv)
    changed, left = 0, []
    for f in sorted(Path(a.results).rglob("*.json")):
        text = f.read_text()
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        new = portable(obj, outside=True, any_checkout=True)
        if isinstance(obj, dict) and isinstance(obj.get("config"), dict) and row_hash(new) != row_hash(obj):
            raise SystemExit(f"portable_results: {f}: rewriting would change its config hash; nothing written")
        if new != obj:
            if a.check:
                left += [f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}: {p}" for p in machine_paths(obj)]
                continue
            out = json.dumps(new, indent=_indent(text), default=str) + ("\n" if text.endswith("\n") else "")
            atomic_write_text(f, out)
            changed += 1
    if a.check:
        print("\n".join(left[:20]) + (f"\n... and {len(left) - 20} more" if len(left) > 20 else ""))
        return 1 if left else 0
    print(f"portable_results: {changed} file(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
