"""Findings: every problem with a spec, located, with the rule it breaks and how to fix it."""

from __future__ import annotations

import difflib
import re
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
        """`file:line: field: message; fix [rule]`. A flag's finding has no file: it is the command line's.
        A finding about the whole document (an empty file) has no field, and names none."""
        if not self.file:
            where = "command line" if self.field.startswith("--") else "<spec>"
        else:
            where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
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


def findings_report(findings: Iterable[Finding], source: str, fail_on: str = "error", **extra: object) -> dict:
    """The JSON document of `check --json` (and of `plan --json` when the spec fails): every finding in
    its stable form and reading order, with counts, so CI can gate on `ok` and editors can place each one.
    `ok` is false when a finding fails the run at the --fail-on level."""
    found = in_order(findings)
    items = [f.as_json() for f in found]
    errors = sum(1 for f in items if f["level"] == "error")
    return {"spec": source, "ok": not failing(found, fail_on), "errors": errors, "warnings": len(items) - errors,
            **extra, "findings": items}


def in_order(findings: Iterable[Finding]) -> list[Finding]:
    """Findings as a reader meets them: the command line's first (no file), then by file, line and column.
    The sort is stable, so findings on one line keep the order the rules found them in."""
    return sorted(findings, key=lambda f: (f.file, f.line or 0, f.column or 0))


LEVELS = ("error", "warning")  # --fail-on: the least severe level that fails the run


def failing(findings: Iterable[Finding], fail_on: str = "error") -> list[Finding]:
    """The findings that fail a run: errors, and warnings too with `--fail-on warning` (ParallelCluster's
    --validation-failure-level, for CI that wants a spec without warnings)."""
    levels = LEVELS[: LEVELS.index(fail_on) + 1]
    return [f for f in findings if f.level in levels]


def summary(findings: Iterable[Finding], fail_on: str = "error") -> str:
    """The last line of every refused run, whatever refused it (syntax, meaning, a flag, --fail-on warning)."""
    items = list(findings)
    bad = len(failing(items, fail_on))
    rest = len(items) - bad
    text = f"{bad} problem{'' if bad == 1 else 's'}"
    if rest:
        text += f" and {rest} warning{'' if rest == 1 else 's'}"
    return text + "; nothing was written"


def _path_matches(pattern: str, field: str) -> bool:
    """`node_groups[2]` matches that group's every field; `node_groups[*].nic` every group's nic. A pattern
    matches the field itself or anything beneath it, on component boundaries (`nic` is not `nics_per_node`)."""
    regex = re.escape(pattern).replace(r"\[\*\]", r"\[\d+\]").replace(r"\*", r"[^.\[]*")
    return re.fullmatch(regex + r"(?:[.\[].*)?", field) is not None


def is_field_pattern(text: str) -> bool:
    """A --suppress value names a field (not a rule) when it has a dot or an index: rules are single words."""
    return "." in text or "[" in text


def suppressed(findings: Iterable[Finding], names: Iterable[str]) -> tuple[list[Finding], list[str]]:
    """Drop the warnings each name matches: a rule (`nic-on-storage`) or a field path (`node_groups[2].nic`,
    `node_groups[*]`). Errors are never dropped: the second value lists each name that matched an error,
    so the caller can say it did not apply."""
    names = list(dict.fromkeys(names))
    kept, refused = [], set()
    for f in findings:
        hits = [n for n in names if (_path_matches(n, f.field) if is_field_pattern(n) else f.rule == n)]
        if hits and f.level != "error":
            continue
        refused.update(hits)
        kept.append(f)
    return kept, sorted(refused)


@dataclass
class SpecError(Exception):
    """Raised with every finding of a spec at once; the CLI prints them and exits 2."""

    findings: list[Finding] = field(default_factory=list)
    fail_on: str = "error"  # the --fail-on level that refused the run (the summary counts by it)

    def __str__(self) -> str:
        return "\n".join(f.render() for f in self.findings)


class UsageError(Exception):
    """A problem with how a command was called (missing file, unwritable output): exit 2."""


class OperationError(RuntimeError):
    """An outside tool (podman, ssh, ansible, slurmctld) failed while doing what was asked: exit 1,
    with the message (which carries the command and its output tail), never a traceback."""
