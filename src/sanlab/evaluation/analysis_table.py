"""The table every analysis returns: rows under named columns, rendered as Markdown (rounded; p-values by
``p_text``, never rounded onto 0.01 or 0.05) for reading and as CSV (full precision) for re-use.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any

from sanlab.evaluation.significance import p_text


def _cell(value: Any, digits: int | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and digits is not None:
        fixed = f"{value:.{digits}f}"
        if value != 0 and abs(float(fixed)) < 10 ** (1 - digits):  # where fewer than two digits would show (a
            return f"{value:.{max(digits, 2)}g}"  # learning rate of 5e-4 is not 0.00 or 0.001): significant digits
        return fixed  # (0.098 at 2 decimals shows two: 0.10, as its neighbours in a column of deltas)
    return str(value)


@dataclass(frozen=True)
class Table:
    """Rows under named columns; rendered as Markdown (rounded) or CSV (full precision)."""

    columns: tuple[str, ...]
    rows: tuple[tuple, ...]
    digits: int = 2
    # (column, digits) where ``digits`` is not right; None: as the value is written (a swept setting, 0.0005)
    column_digits: tuple[tuple[str, int | None], ...] = ()
    p_columns: tuple[str, ...] = ()  # p-values: rendered by ``p_text`` (never rounded onto 0.01 or 0.05)

    def __post_init__(self):
        bad = [r for r in self.rows if len(r) != len(self.columns)]
        if bad:
            raise ValueError(f"table rows must have {len(self.columns)} cells ({self.columns}), got {bad[0]}")

    def column(self, name: str) -> list:
        return [row[self.columns.index(name)] for row in self.rows]

    def markdown(self) -> str:
        escape = lambda s: s.replace("|", "\\|")  # noqa: E731  (a token may be "|")
        lines = ["| " + " | ".join(escape(c) for c in self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        digits = [dict(self.column_digits).get(c, self.digits) for c in self.columns]
        p_value = [c in self.p_columns for c in self.columns]
        lines += ["| " + " | ".join(escape(p_text(v) if is_p and isinstance(v, float) else _cell(v, d))
                                    for v, d, is_p in zip(row, digits, p_value)) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows([["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row]
                          for row in self.rows])
        return buf.getvalue()
