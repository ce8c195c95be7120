"""Plain-text tables for the terminal: each column as wide as its widest cell."""
from __future__ import annotations

from typing import Iterable, Sequence


def text_table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    right: Iterable[int] = (),
    rule: bool = True,
    indent: str = "",
) -> list[str]:
    """The header, a rule of dashes (unless `rule` is False), then the rows. The
    columns whose indices are in `right` (numbers) align right, the others left."""
    cells = [list(header), *(list(r) for r in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    right = set(right)

    def line(values: list[str]) -> str:
        padded = (v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths)))
        return (indent + "  ".join(padded)).rstrip()

    lines = [line(cells[0])]
    if rule:
        lines.append(indent + "  ".join("-" * w for w in widths))
    return lines + [line(values) for values in cells[1:]]
