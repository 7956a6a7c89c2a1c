"""Findings: every problem with a spec, located, with the rule it breaks and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    """One problem. `line` and `column` are 1-based; `column` is known for what the YAML loader located."""

    path: tuple[str | int, ...]
    message: str
    fix: str = ""
    rule: str = "spec"
    level: str = "error"
    file: str = ""
    line: int | None = None
    column: int | None = None

    @property
    def field(self) -> str:
        return dotted(self.path)

    def as_json(self) -> dict:
        """The stable JSON form (`check --json`, `plan --json` on failure): editors and CI read these keys."""
        return {"file": self.file, "line": self.line, "column": self.column, "field": self.field,
                "rule": self.rule, "level": self.level, "message": self.message, "fix": self.fix}

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
    word = str(word)
    if len(word) > 64:  # no key is that long; difflib's cost grows with the word
        return ""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


def shown(value: object, limit: int = 60) -> str:
    """A value of the user's as it may appear in a message: control characters escaped (a spec must not
    drive the terminal), and cut to `limit` characters (a 1 MB key is not echoed back whole)."""
    text = value if isinstance(value, str) else repr(value)
    text = "".join(c if c.isprintable() or c == " " else f"\\u{ord(c):04x}" for c in text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def findings_report(findings: Iterable[Finding], source: str, **extra: object) -> dict:
    """The JSON document of `check --json` (and of `plan --json` when the spec fails): every finding in
    its stable form, with counts, so CI can gate on `ok` and editors can place each one."""
    items = [f.as_json() for f in findings]
    errors = sum(1 for f in items if f["level"] == "error")
    return {"spec": source, "ok": errors == 0, "errors": errors, "warnings": len(items) - errors,
            **extra, "findings": items}


def suppressed(findings: Iterable[Finding], rules: Iterable[str]) -> tuple[list[Finding], list[str]]:
    """Drop warnings whose rule is in `rules`. Errors are never dropped: the second value names each
    suppressed rule that matched an error, so the caller can say it did not apply."""
    rules = set(rules)
    kept, refused = [], set()
    for f in findings:
        if f.rule in rules and f.level != "error":
            continue
        if f.rule in rules:
            refused.add(f.rule)
        kept.append(f)
    return kept, sorted(refused)


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
