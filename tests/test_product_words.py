"""The product speaks of the product: no README, doc, source, test, bench, script, role, playbook or plugin
narrates how the project was built (numbered rounds of work, tracker numbers of this project, the working
session, an acceptance list, a person's plan: PATTERNS below). A reader of the product needs what the software does
and what was measured, with its date and machine; a number that points into a tracker they cannot see says
neither. A reference to another project's tracker names that project (`NVIDIA/cuda-repo-management#30`).

This file names the patterns, so it is the one file not searched."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()
SEARCHED = ("README.md", "docs", "src", "tests", "bench", "scripts", "roles", "playbooks", "plugins")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}

PATTERNS = {
    "a numbered stop of work": r"\bstop \d+\b|\bthis [s]top\b",
    "an issue number": r"\bissues? #?\d+",
    "the issue as the source of a figure or a list": r"\bthe issue\b",
    "the working session": r"\bthis [s]ession\b|\bother [s]essions?\b",
    "an acceptance list item": r"\bmust [s]how\b",
    "a person's plan": r"\bthe lead's\b",
}

def _files() -> list[Path]:
    out = []
    for top in SEARCHED:
        path = ROOT / top
        if path.is_file():
            out.append(path)
            continue
        for p in sorted(path.rglob("*")):
            if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts) and p.resolve() != HERE:
                out.append(p)
    return out


def _texts() -> list[tuple[str, str]]:
    out = []
    for p in _files():
        try:
            out.append((p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue  # a binary file (an image, a compiled module)
    return out


TEXTS = _texts()


@cache
def _hits(pattern: str) -> tuple[str, ...]:
    """'file:line: text' for each line that matches; a file is split into lines only when it matches at all."""
    rx = re.compile(pattern, re.IGNORECASE)
    return tuple(f"{name}:{n}: {line.strip()}" for name, text in TEXTS if rx.search(text)
                 for n, line in enumerate(text.splitlines(), 1) if rx.search(line))


@pytest.mark.parametrize("kind", PATTERNS)
def test_no_line_narrates_the_project_history(kind: str) -> None:
    hits = _hits(PATTERNS[kind])
    assert not hits, (f"{kind} ({PATTERNS[kind]}): say what the software does or what was measured instead\n"
                      + "\n".join(hits))
