"""Plain-text tables for the terminal: each column as wide as its widest cell,
and, given a line width, text columns narrowed so that the table fits it.

Also the two ways long text is shortened for the terminal: a chain of op types
summarised (`summarise_ops`) and a long name cut in its middle (`elide_middle`); and
names listed in a sentence (`spoken`).
"""
from __future__ import annotations

from typing import Iterable, Sequence

# The widest line the text output aims for by default (`--wide` lifts it).
LINE_WIDTH = 160
# The most characters a name in a line of prose under a table takes (`--wide` lifts it).
NAME_WIDTH = 60
ELLIPSIS = "..."
# A narrowed column keeps at least this many characters.
MIN_CELL = 12
OP_SEPARATOR = " > "


def elide_middle(text: str, width: int | None) -> str:
    """`text` cut in its middle to at most `width` characters: both ends of a name
    say most (its block and its layer), so they stay. None: no limit."""
    if width is None or len(text) <= width:
        return text
    if width <= len(ELLIPSIS):
        return text[:width]
    kept = width - len(ELLIPSIS)
    head = (kept + 1) // 2
    return text[:head] + ELLIPSIS + text[len(text) - (kept - head):]


def _runs(ops: Sequence[str]) -> list[tuple[str, int]]:
    """Repeats of one op type in a row as one (op, count): ["Relu", "Relu"] -> [("Relu", 2)]."""
    runs: list[tuple[str, int]] = []
    for op in ops:
        if runs and runs[-1][0] == op:
            runs[-1] = (op, runs[-1][1] + 1)
        else:
            runs.append((op, 1))
    return runs


def _label(run: tuple[str, int]) -> str:
    op, count = run
    return op if count == 1 else f"{op} x{count}"


def summarise_ops(ops: Sequence[str], width: int | None = 60) -> str:
    """A chain of op types as "A > B > C", in at most about `width` characters:
    repeats in a row counted ("ConstantOfShape x836"), and when that is still too long,
    the first and last ops with the count of those between. None: every op, joined."""
    if width is None:
        return OP_SEPARATOR.join(ops)
    runs = _runs(ops)
    text = OP_SEPARATOR.join(map(_label, runs))
    if len(text) <= width or len(runs) < 3:
        return elide_middle(text, width)
    head, middle, tail = runs[:1], runs[1:-1], runs[-1:]
    # take runs from both ends in turn while the summary still fits
    while middle:
        front = len(head) <= len(tail)
        trial = (head + middle[:1], tail) if front else (head, middle[-1:] + tail)
        if len(_with_gap(*trial, len(ops))) > width:
            break
        head, tail = trial
        middle = middle[1:] if front else middle[:-1]
    return _with_gap(head, tail, len(ops))


def _with_gap(head: list[tuple[str, int]], tail: list[tuple[str, int]], total: int) -> str:
    """The runs at both ends, and between them how many ops are left out."""
    shown = sum(count for _, count in head + tail)
    return OP_SEPARATOR.join([*map(_label, head), f"... {total - shown} more", *map(_label, tail)])


def _fitted_widths(widths: list[int], right: set[int], indent: str, width: int) -> list[int]:
    """Column widths for a table no wider than `width`: the left-aligned (text)
    columns share what the right-aligned (number) columns leave, the widest
    narrowed first, none below MIN_CELL."""
    total = len(indent) + sum(widths) + 2 * (len(widths) - 1)
    text_columns = [i for i in range(len(widths)) if i not in right]
    if total <= width or not text_columns:
        return widths
    room = width - (total - sum(widths[i] for i in text_columns))
    cap = max(widths[i] for i in text_columns)
    while cap > MIN_CELL and sum(min(widths[i], cap) for i in text_columns) > room:
        cap -= 1
    return [min(w, cap) if i in text_columns else w for i, w in enumerate(widths)]


def text_table(
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    right: Iterable[int] = (),
    rule: bool = True,
    indent: str = "",
    width: int | None = None,
) -> list[str]:
    """The header, a rule of dashes (unless `rule` is False), then the rows. The
    columns whose indices are in `right` (numbers) align right, the others left.
    With a `width`, cells of text columns are cut in the middle so that the lines fit it."""
    cells = [list(header), *(list(r) for r in rows)]
    right = set(right)
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    if width is not None:
        widths = _fitted_widths(widths, right, indent, width)
        cells = [[elide_middle(v, w) for v, w in zip(line, widths)] for line in cells]

    def line(values: list[str]) -> str:
        padded = (v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths)))
        return (indent + "  ".join(padded)).rstrip()

    lines = [line(cells[0])]
    if rule:
        lines.append(indent + "  ".join("-" * w for w in widths))
    return lines + [line(values) for values in cells[1:]]


def spoken(names: Sequence[str], conjunction: str = "or") -> str:
    """Names as a sentence lists them: "a", "a or b", "a, b or c"."""
    names = list(names)
    return names[0] if len(names) < 2 else f"{', '.join(names[:-1])} {conjunction} {names[-1]}"
