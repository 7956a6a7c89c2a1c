"""Counts in words: '1 warning', '2 warnings', '1 chunk server'. Numbers keep their thousands commas."""

from __future__ import annotations

# Plurals that are not the singular + "s".
_IRREGULAR = {"leaf": "leaves", "switch": "switches", "chassis": "chassis", "is": "are", "has": "have"}


def plural_of(word: str) -> str:
    head, _, last = word.rpartition(" ")
    many = _IRREGULAR.get(last) or (last[:-1] + "ies" if last.endswith("y") and last[-2:-1] not in "aeiou"
                                    else last + "es" if last.endswith(("s", "sh", "ch", "x")) else last + "s")
    return f"{head} {many}" if head else many


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 rail', '8 rails', '24,576 GPUs' (pass `many` where the plural is not regular: 'GPUs')."""
    return f"{n:,} {word if n == 1 else (many or plural_of(word))}"


def number(x: float) -> str:
    """24576 -> '24,576'; 40000.0 -> '40,000'; 251658.24 -> '251,658.24' (never '40,000.0')."""
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.3f}".rstrip("0").rstrip(".")


def plain(doc: str | None) -> str:
    """A module docstring as a command's --help description: the reST/Markdown code marks (``x``, `x`) a
    terminal shows literally are dropped, and the text kept as written (issue 23: no markup in help)."""
    return (doc or "").replace("``", "").replace("`", "").strip()
