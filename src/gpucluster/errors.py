"""Findings: every problem with a spec, located, with the rule it breaks and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    path: tuple[str | int, ...]
    message: str
    fix: str = ""
    rule: str = "spec"
    level: str = "error"
    file: str = ""
    line: int | None = None

    @property
    def field(self) -> str:
        return dotted(self.path)

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else (self.file or "<spec>")
        text = f"{where}: {self.field or '<top>'}: {self.message}"
        if self.fix:
            text += f"; {self.fix}"
        return f"{text} [{self.rule}]"


def dotted(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), sorted(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


@dataclass
class SpecError(Exception):
    """Raised with every finding of a spec at once; the CLI prints them and exits 2."""

    findings: list[Finding] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(f.render() for f in self.findings)


class UsageError(Exception):
    """A problem with how a command was called (missing file, unwritable output): exit 2."""


class OperationError(RuntimeError):
    """An outside tool (podman, ssh, ansible, slurmctld) failed while doing what was asked: exit 1,
    with the message (which carries the command and its output tail), never a traceback."""
