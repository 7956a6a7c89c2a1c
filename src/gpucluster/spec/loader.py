"""Read a spec file into a `ClusterSpec`, keeping the line and column of every key so findings can name it.

Three steps, each bounded: `source` reads at most 1 MB of a regular file (or stdin), `yamldoc` composes
the YAML from its events (depth, size and alias expansion bounded; duplicate keys, odd tags and
control characters refused), and the pydantic model checks types and ranges. When that syntax layer
refuses fields, the meaning checks still run on the rest (`partial`), so one run reports everything.
"""

from __future__ import annotations

import datetime
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gpucluster import trace
from gpucluster.errors import Finding, SpecError, did_you_mean, shown
from gpucluster.spec.model import ClusterSpec, LoadedSpec
from gpucluster.spec.partial import meaning_findings, partial_spec
from gpucluster.spec.source import MAX_BYTES, decode, read_source
from gpucluster.spec.yamldoc import MAX_VALUES, Document, parse_document


def load_spec(path: str | Path) -> LoadedSpec:
    """Parse and validate the syntax layer (types, ranges, keys). Raises SpecError with every finding,
    the meaning findings of what the syntax layer accepted included. The meaning and the plan of a spec
    that passes come from `gpucluster.cluster.load_cluster`, which calls this once. `-` reads stdin."""
    trace.mark("parse")
    raw, name = read_source(path)
    doc = parse_document(decode(raw, name), name, raw)
    if doc.fatal:
        raise SpecError(doc.findings)
    return _validate(doc, Path(name))


def parse_yaml(text: str, name: str) -> tuple[Any, dict[tuple, int], list[Finding]]:
    """(data, line of every path, YAML findings) of a spec's text."""
    doc = parse_document(text, name)
    return doc.data, doc.lines, doc.findings


def validate_data(data: dict, lines: dict[tuple, int], path: Path) -> LoadedSpec:
    """The syntax layer on data already parsed (tests and benchmarks generate specs as data)."""
    return _validate(Document(data=data, lines=lines), Path(path))


def _validate(doc: Document, source: Path) -> LoadedSpec:
    name = str(source)
    try:
        spec = ClusterSpec.model_validate(doc.data)
    except ValidationError as exc:
        errors = _real(exc.errors(include_url=False))
    else:
        if not doc.findings:
            return LoadedSpec(spec=spec, source=source, lines=doc.lines, columns=doc.columns)
        errors = []
    taken = [p for p in doc.tainted]
    errors, renamed = _misspelt(errors)
    syntax = [_finding(err, doc, name, renamed) for err in errors if not _under(tuple(err["loc"]), taken)]
    refused = [tuple(err["loc"]) for err in errors] + taken
    meaning = [f for f in meaning_findings(partial_spec(doc.data, refused)) if f.level == "error"]
    located = [Finding(f.path, f.message, f.fix, f.rule, f.level, name, *_where(doc, f.path)) for f in meaning]
    raise SpecError(doc.findings + syntax + located)


def _real(errors: list[dict]) -> list[dict]:
    """Pydantic counts a list's length after dropping the items that failed, so one bad group also
    reports "node_groups should have at least 1 item": that error says nothing the item's does not."""
    locs = [tuple(e["loc"]) for e in errors]
    return [e for e, loc in zip(errors, locs, strict=True)
            if not (e["type"] == "too_short" and any(o[: len(loc)] == loc and o != loc for o in locs))]


def _under(loc: tuple, paths: list[tuple]) -> bool:
    """A schema error inside a value the YAML layer already refused says the same thing twice."""
    return any(loc[: len(p)] == p for p in paths)


def _where(doc: Document, loc: tuple) -> tuple[int | None, int | None]:
    while loc and loc not in doc.lines:
        loc = loc[:-1]
    return doc.lines.get(loc), doc.columns.get(loc)


def _finding(err: dict, doc: Document, name: str, renamed: dict[tuple, str] | None = None) -> Finding:
    loc = tuple(err["loc"])
    kind = err["type"]
    line, column = _where(doc, loc)
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        hint = did_you_mean(str(loc[-1]), allowed)
        fix = hint or (f"allowed keys here: {', '.join(sorted(allowed))}" if allowed else "remove it")
        msg = f"unknown key '{shown(loc[-1])}'"
        if renamed and loc in renamed:  # one cause, one finding: the required key it stands for is not reported
            msg += f", and the required key '{renamed[loc]}' is missing"
            fix = f"{hint} rename it"
        return Finding(loc, msg, fix, "unknown-key", file=name, line=line, column=column)
    if kind == "missing":
        return Finding(loc, "required key is missing", f"add '{loc[-1]}'", "required", file=name, line=line,
                       column=column)
    rule, msg, fix = _explain(kind, err, doc.texts.get(loc), loc)
    if loc and loc[-1] == "[key]":  # pydantic's marker for a mapping key that failed
        loc, msg = loc[:-1], f"the key {shown(loc[-2])}: {msg}"
    return Finding(loc, msg, fix, rule, file=name, line=line, column=column)


def _misspelt(errors: list[dict]) -> tuple[list[dict], dict[tuple, str]]:
    """A required key written with a typo is one mistake, not two: drop its "required key is missing" and
    say in the unknown key's finding that it stands for the required one. Returns the errors kept and
    {unknown key's loc: the required key it is close to}."""
    missing = {tuple(e["loc"]) for e in errors if e["type"] == "missing"}
    renamed: dict[tuple, str] = {}
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] != "extra_forbidden":
            continue
        siblings = [m[-1] for m in missing if m[:-1] == loc[:-1] and isinstance(m[-1], str)]
        close = difflib.get_close_matches(str(loc[-1])[:64], siblings, n=1, cutoff=0.6)
        if close:
            renamed[loc] = close[0]
            missing.discard(loc[:-1] + (close[0],))
    kept = [e for e in errors if e["type"] != "missing" or tuple(e["loc"]) in missing]
    return kept, renamed


_NON_DECIMAL = re.compile(r"^[-+]?(0[0-9_]+|0[xXoObB][0-9a-fA-F_]+)$")
_NUMBER = ("int_type", "float_type", "int_parsing", "float_parsing", "int_from_float", "finite_number")
_TEXT = ("string_type", "literal_error", "string_pattern_mismatch", "enum")
# The spec's patterns in words: a message says what to write, never a regular expression alone
_PATTERNS = {
    r"^[a-z][a-z0-9-]*$": "lower-case letters, digits and '-', starting with a letter",
    r"^[a-z][a-z0-9_-]*$": "lower-case letters, digits, '_' and '-', starting with a letter",
    r"^[a-z][a-z0-9-]*#+[a-z0-9-]*$": "lower-case letters, digits and '-' around one run of '#' (the index), "
                                      "e.g. gpu####",
    r"^[A-Za-z0-9_.:-]+$": "one word of letters, digits, '_', '.', ':' and '-'",
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$": "a catalog key: letters, digits, '.', '_' and '-', not starting with a sign",
    r"^/[A-Za-z0-9._/-]*$": "an absolute path of letters, digits, '.', '_', '-' and '/'",
    r"^/[A-Za-z0-9._/-]+$": "an absolute path of letters, digits, '.', '_', '-' and '/'",
}


def pattern_words(pattern: str) -> str:
    """A pattern of the model as docs/spec.md's table and a finding's fix say it."""
    return _PATTERNS.get(pattern) or f"matching `{pattern}`"


def _what(value: object) -> str:
    """A value's kind as YAML shows it: what was found where something else belongs."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "a mapping of keys"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a value of another kind"


def _explain(kind: str, err: dict, raw: str | None, loc: tuple = ()) -> tuple[str, str, str]:
    """(rule, message, fix) of one schema error, in gpucluster's words (never the schema library's): the
    rule is the error's kind, the message says what is wrong with the value, the fix what to write.
    The YAML traps are named: a boolean where a number or text belongs, a number where text belongs,
    text (or an octal) where a number belongs, .inf/.nan."""
    value = err.get("input")
    ctx = err.get("ctx") or {}
    written = raw if raw is not None else shown(value)
    key = next((str(p) for p in reversed(loc) if isinstance(p, str) and p != "[key]"), "the value")
    if isinstance(value, bool) and kind in _NUMBER + _TEXT:
        if kind in _NUMBER:
            return ("yaml-bool", f"{written} is a YAML boolean, not a number",
                    "write a number (YAML 1.1 reads yes/no/on/off/true/false as booleans)")
        return "yaml-bool", f"{written} is a YAML boolean, not text", f"quote it ('{written}')"
    if value is None and kind in _NUMBER + _TEXT + ("bool_type",):
        return kind, "the value is empty", "write a value, or remove the key to take the default"
    if kind in ("int_type", "int_parsing"):
        if isinstance(value, float):
            return "int_from_float", f"{written} is not a whole number", "use a whole number"
        if isinstance(value, str) and _NON_DECIMAL.match(value):  # YAML 1.1 would read 8 or 31: we kept the text
            return ("int_parsing", f"'{shown(value)}' is not a plain decimal number (YAML 1.1 reads a leading 0 "
                    "as octal and 0x as hex)", "write it in decimal, without a leading 0")
        if isinstance(value, str):
            return ("int_parsing", f"'{shown(value)}' is text, not a whole number",
                    "change the value's type: write a whole number, without quotes or units")
        return ("int_type", f"{key} takes a whole number, not {_what(value)}",
                "change the value's type: write a whole number")
    if kind in ("float_type", "float_parsing"):
        if isinstance(value, str):
            return ("float_parsing", f"'{shown(value)}' is text, not a number",
                    "change the value's type: write a number, without quotes or units")
        if isinstance(value, int):
            return "float_type", "the number is too large", "change the value into the documented range"
        return "float_type", f"{key} takes a number, not {_what(value)}", "change the value's type: write a number"
    if kind == "finite_number":
        return kind, f"{written} is not a finite number", "write a finite number (no .inf or .nan)"
    if kind == "bool_type":
        return kind, f"{written} is not a boolean", "write true or false, unquoted"
    if kind == "string_type" and isinstance(value, (int, float, datetime.date)):
        what = "date" if isinstance(value, datetime.date) else "number"
        return kind, f"{written} is read by YAML as a {what}, not text", f"quote it ('{written}')"
    if kind == "string_type":
        return kind, f"{key} takes text, not {_what(value)}", "change the value's type: write one line of text"
    if kind.startswith("value_error"):
        # the model's validators write "problem; fix"
        msg, _, fix = err["msg"].removeprefix("Value error, ").partition("; ")
        return kind, msg, fix or "change the value"
    if "fix" in ctx:  # gpucluster's own errors (PydanticCustomError) carry their fix
        return kind, err["msg"], str(ctx["fix"])
    return (kind, *_worded(kind, key, value, written, ctx))


def _bound(x: object) -> str:
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else str(x)


# A bound the value misses, by the schema's kind: (its name in the error's ctx, how the value misses it, the
# values the fix allows); {bound} is the bound, {key} the field.
_BOUNDS = {
    "greater_than_equal": ("ge", "is below {bound}, the least {key} takes", "{bound} or more"),
    "greater_than": ("gt", "is not above {bound}", "more than {bound}"),
    "less_than_equal": ("le", "is above {bound}, the most {key} takes", "{bound} or less"),
    "less_than": ("lt", "is not below {bound}", "less than {bound}"),
}


def _worded(kind: str, key: str, value: object, written: str, ctx: dict) -> tuple[str, str]:
    """(message, fix) of the schema's other kinds: ranges, lengths, patterns, choices, shapes."""
    if kind in _BOUNDS:
        name, misses, allowed = _BOUNDS[kind]
        bound = _bound(ctx[name])
        return f"{written} {misses.format(bound=bound, key=key)}", \
            f"change the value into that range: {allowed.format(bound=bound)}"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        return f"'{shown(value)}' is not a valid {key}", f"write {pattern_words(pattern)}"
    if kind in ("literal_error", "enum"):
        return f"{written} is not one of the choices for {key}", f"use one of {ctx.get('expected')}"
    if kind == "string_too_long":
        n = len(value) if isinstance(value, str) else "?"
        return f"{key} is {n} characters long, more than the {ctx.get('max_length')} it takes", "shorten it"
    if kind == "string_too_short":
        return f"{key} is empty", "give it a value"
    if kind == "too_long":
        return (f"{key} has {ctx.get('actual_length')} entries, more than the {ctx.get('max_length')} it takes",
                "remove entries, or split the cluster into several specs")
    if kind == "too_short":
        return f"{key} is empty", "add at least one entry"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{key} is a section of keys, not {_what(value)}", "write it as 'key: value' lines indented under it"
    if kind in ("tuple_type", "list_type", "set_type"):
        return f"{key} is a list, not {_what(value)}", "write it as a list: [a, b] or one '- item' per line"
    if kind == "int_parsing_size":
        return f"{written} is far too large a number", "use a smaller number"
    if kind == "int_from_float":
        return f"{written} is not a whole number", "use a whole number"
    if kind == "invalid_key":
        return "a key is not text", "write the key as text"
    return f"{key} does not take {written}", "change the value (docs/spec.md describes each field)"


def _allowed_keys(loc: tuple) -> set[str]:
    """Field names of the model found at loc, walking ClusterSpec's annotations."""
    tp: Any = ClusterSpec
    for part in loc:
        tp = _step(tp, part)
        if tp is None:
            return set()
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return set(tp.model_fields)
    return set()


def _unwrap(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is not type(None):
                return _unwrap(arg)
    return tp


def _step(tp: Any, part: Any) -> Any:
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(part))
        return field.annotation if field else None
    if origin in (tuple, list):
        return typing.get_args(tp)[0]
    if origin is dict:
        return typing.get_args(tp)[1]
    return None


__all__ = ["MAX_BYTES", "MAX_VALUES", "load_spec", "parse_yaml", "validate_data"]
