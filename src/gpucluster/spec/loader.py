"""Read a spec file into a `ClusterSpec`, keeping the line of every key so findings can name it.

PyYAML composes the document into nodes that carry their start marks; we build plain Python
data from those nodes ourselves, which also lets us refuse duplicate keys (YAML silently keeps
the last) and keep '1:1' a string (YAML 1.1 would read it as the base-60 integer 61).
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gpucluster import trace
from gpucluster.errors import Finding, SpecError, did_you_mean, dotted
from gpucluster.spec.model import ClusterSpec, LoadedSpec

MAX_BYTES = 4 * 1024 * 1024
MAX_VALUES = 200_000  # keys, items and scalars after alias expansion; the largest example has ~400


def load_spec(path: str | Path) -> LoadedSpec:
    """Parse and validate the syntax layer (types, ranges, keys). Raises SpecError with every finding.
    The meaning and the plan come from `gpucluster.cluster.load_cluster`, which calls this once."""
    path = Path(path)
    name = str(path)
    trace.mark("parse")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError([Finding((), f"cannot read the spec: {exc.strerror or exc}",
                                 "give the path of a readable YAML file", "file", file=name)]) from None
    if len(raw) > MAX_BYTES:
        raise SpecError([Finding((), f"the spec is {len(raw)} bytes", f"keep it under {MAX_BYTES} bytes",
                                 "file", file=name)])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([Finding((), f"not UTF-8 text (byte {exc.start})", "save the file as UTF-8",
                                 "file", file=name)]) from None
    data, lines, findings = parse_yaml(text, name)
    if findings:
        raise SpecError(findings)
    return validate_data(data, lines, path)


def parse_yaml(text: str, name: str) -> tuple[Any, dict[tuple, int], list[Finding]]:
    lines: dict[tuple, int] = {}
    findings: list[Finding] = []
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return None, lines, [Finding((), f"not valid YAML: {problem}",
                                     "fix the YAML syntax at that line", "yaml", file=name, line=line)]
    except RecursionError:
        return None, lines, [Finding((), "the YAML nests too deeply", "flatten the document", "yaml", file=name)]
    if node is None:
        return None, lines, [Finding((), "the spec is empty", "start from examples/staging.yaml", "yaml",
                                     file=name, line=1)]
    try:
        data = _build(node, (), lines, findings, name, [MAX_VALUES])
    except RecursionError:
        return None, lines, [Finding((), "the YAML nests too deeply", "flatten the document", "yaml", file=name)]
    except _TooBig:
        return None, lines, [Finding((), f"the YAML expands to more than {MAX_VALUES:,} values (aliases of aliases?)",
                                     "write the spec without nested anchors and aliases", "yaml", file=name)]
    if not isinstance(data, dict):
        findings.append(Finding((), "the spec must be a mapping of keys", "start from examples/staging.yaml",
                                "yaml", file=name, line=node.start_mark.line + 1))
    return data, lines, findings


class _TooBig(Exception):
    pass


def _build(node: yaml.Node, path: tuple, lines: dict, findings: list[Finding], name: str, budget: list[int]) -> Any:
    # Aliases are expanded, so a 1 kB file of aliases of aliases could expand to 10^9 values: count them.
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooBig
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                findings.append(Finding(path, "a key must be a plain word", "write the key as text", "yaml",
                                        file=name, line=key_node.start_mark.line + 1))
                continue
            if key_node.tag == "tag:yaml.org,2002:merge":
                findings.append(Finding(path, "YAML merge keys (<<) are not supported",
                                        "write the keys out", "yaml", file=name,
                                        line=key_node.start_mark.line + 1))
                continue
            key = _scalar(key_node)
            key = key if isinstance(key, (str, int)) and not isinstance(key, bool) else str(key)
            if key in out:
                findings.append(Finding(path + (key,), f"key '{key}' appears twice",
                                        "keep one of them", "yaml", file=name,
                                        line=key_node.start_mark.line + 1))
                continue
            out[key] = _build(value_node, path + (key,), lines, findings, name, budget)
            lines[path + (key,)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, path + (i,), lines, findings, name, budget) for i, item in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.ScalarNode) -> Any:
    # YAML 1.1 reads 1:1 as the sexagesimal integer 61: keep anything with a colon as text.
    if node.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") and ":" in node.value:
        return node.value
    if node.tag == "tag:yaml.org,2002:str":
        return node.value
    return _construct(node)


_CONSTRUCTOR = yaml.SafeLoader("")


def _construct(node: yaml.ScalarNode) -> Any:
    try:
        return _CONSTRUCTOR.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return node.value


def validate_data(data: dict, lines: dict[tuple, int], path: Path) -> LoadedSpec:
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_findings(exc, lines, str(path))) from None
    return LoadedSpec(spec=spec, source=path, lines=lines)


def _findings(exc: ValidationError, lines: dict[tuple, int], name: str) -> list[Finding]:
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        kind = err["type"]
        line = _line(lines, loc)
        if kind == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            hint = did_you_mean(str(loc[-1]), allowed)
            fix = hint or (f"allowed keys here: {', '.join(sorted(allowed))}" if allowed else "remove it")
            out.append(Finding(loc, f"unknown key '{loc[-1]}'", fix, "unknown-key", file=name, line=line))
        elif kind == "missing":
            out.append(Finding(loc, "required key is missing", f"add '{loc[-1]}'", "required",
                               file=name, line=line))
        else:
            msg, fix = err["msg"], _fix(kind, err)
            if kind.startswith("value_error"):
                # the model's validators write "problem; fix"
                msg, _, fix = msg.removeprefix("Value error, ").partition("; ")
                fix = fix or "change the value"
            out.append(Finding(loc, msg, fix, kind, file=name, line=line))
    return out


def _fix(kind: str, err: dict) -> str:
    ctx = err.get("ctx") or {}
    if kind == "string_pattern_mismatch":
        return f"match the pattern {ctx.get('pattern')}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return "change the value into that range"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return "change the value's type"
    if kind == "literal_error":
        return f"use one of {ctx.get('expected')}"
    if kind == "too_short":
        return "add at least one entry"
    if kind in ("string_too_long", "too_long"):
        return "shorten it"
    if kind == "string_too_short":
        return "give it a value"
    if kind == "int_parsing_size":
        return "use a smaller number"
    if kind == "int_from_float":
        return "use a whole number"
    if kind == "invalid_key":
        return "write the key as text"
    return "change the value (docs/spec.md describes each field)"  # every finding carries a fix


def _line(lines: dict[tuple, int], loc: tuple) -> int | None:
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


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


__all__ = ["dotted", "load_spec", "parse_yaml", "validate_data"]
