"""The benchmark tables' shared pieces: a paired ratio with its spread, and a markdown
table under a caption."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def spread(r: Mapping[str, float]) -> str:
    """``ratio [low-high]``: a median ratio and the range of the rounds behind it."""
    return f"{r['ratio']:.3f} [{r['low']:.2f}-{r['high']:.2f}]"


def markdown(caption: str, header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A caption, a blank line, and a table whose first column is text, the rest numbers."""
    lines = [caption, "", "| " + " | ".join(header) + " |"]
    lines.append("| --- |" + " ---: |" * (len(header) - 1))
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
