"""The papers' numbers (``paper_numbers.yaml``): every cell addressed by (table id, row, column)."""
from __future__ import annotations

import math
from pathlib import Path

from controlled_study.rows import load_yaml

HERE = Path(__file__).parent


class Paper:
    def __init__(self, path: str | Path | None = None):
        self.data = load_yaml(path or HERE / "paper_numbers.yaml")
        self.tables: dict = self.data["tables"]

    def table(self, tid: str) -> dict:
        return self.tables[tid]

    def rows(self, tid: str, key: str | None = None, **match) -> list[dict]:
        out = []
        for r in self.tables[tid]["rows"]:
            if key is not None and r.get("key") != key:
                continue
            if any(r.get(k) != v for k, v in match.items()):
                continue
            out.append(r)
        return out

    def value(self, tid: str, row_key: str, col: str, **match):
        """(has_cell, value): has_cell is False when the paper has no such row/column; value None for "-"."""
        t = self.tables[tid]
        cols = t["columns"]
        rows = self.rows(tid, row_key, **match)
        if not rows or col not in cols:
            return False, None
        v = rows[0]["values"][cols.index(col)]
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return True, float(v)
        return True, v

    def column_value(self, tid: str, row_key: str, method_key: str):
        """For tables whose columns are methods (``column_keys``): the cell (task row, method column)."""
        t = self.tables[tid]
        keys = t.get("column_keys") or []
        rows = self.rows(tid, row_key)
        if not rows or method_key not in keys:
            return False, None
        v = rows[0]["values"][keys.index(method_key)]
        return True, (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)

    def decimals(self, tid: str, col_index: int = 0) -> int:
        d = self.tables[tid].get("decimals", 2)
        return int(d[col_index]) if isinstance(d, list) else int(d)

    def cells(self):
        """Every numeric cell: (table id, row label, column label, value)."""
        for tid, t in self.tables.items():
            for r in t["rows"]:
                for c, v in zip(t["columns"], r["values"]):
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        yield tid, r["label"], c, float(v)


def isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)
