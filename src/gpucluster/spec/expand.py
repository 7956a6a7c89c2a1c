"""`gpucluster expand`: the spec with every default filled in, each marked, as YAML `check` accepts again.

Why: a default no one can see is a setting no one chose (`nodes_per_rack` is 1 unless set, and a
200k-GPU plan once counted 1,042 racks of one server each). The model knows which fields the YAML set
(`model_fields_set`); every other field is written with its default and a trailing `# default`, so
`grep -v '# default$'` gives back what was written. Comments of the source file are not kept: the
output is the model, in the model's field order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

MARK = "  # default"


def expand_file(path: str | Path) -> str:
    """The expanded text of a spec file (`-`: standard input). Only the syntax layer judges it: a spec
    whose meaning is wrong still has defaults to show. Raises SpecError like check."""
    from gpucluster.spec.loader import load_spec

    return expand_text(load_spec(path).spec)


def expand_text(spec: BaseModel) -> str:
    """The whole spec as YAML, defaults marked."""
    lines = [f"# {getattr(spec, 'name', 'spec')}: every field, as gpucluster reads it; '# default' marks "
             "each value the spec did not set"]
    _fields(spec, 0, False, lines)
    return "\n".join(lines) + "\n"


def scalar(value: Any) -> str:
    """One YAML scalar, quoted where YAML would read it as something else ('22.05', '1:1', 'yes')."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _fields(model: BaseModel, indent: int, default: bool, lines: list[str]) -> None:
    given = model.model_fields_set
    for name in type(model).model_fields:
        _entry(name, getattr(model, name), default or name not in given, indent, lines)


def _entry(key: Any, value: Any, default: bool, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    mark = MARK if default else ""
    head = f"{pad}{scalar(key)}:"
    if isinstance(value, BaseModel):
        lines.append(head + mark)
        _fields(value, indent + 2, default, lines)
    elif isinstance(value, dict) and value:
        lines.append(head + mark)
        for k, v in value.items():
            _entry(k, v, default, indent + 2, lines)
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (BaseModel, dict, list, tuple)) for v in value):
        lines.append(head + mark)
        for item in value:
            _item(item, default, indent + 2, lines)
    elif isinstance(value, (list, tuple)):
        lines.append(f"{head} [{', '.join(scalar(v) for v in value)}]{mark}")
    elif isinstance(value, dict):
        lines.append(f"{head} {{}}{mark}")
    else:
        lines.append(f"{head} {scalar(value)}{mark}")


def _item(item: Any, default: bool, indent: int, lines: list[str]) -> None:
    """One entry of a list: `- ` then its first key on the same line, the rest indented under it."""
    pad = " " * indent
    if not isinstance(item, (BaseModel, dict)):
        lines.append(f"{pad}- {scalar(item)}{MARK if default else ''}")
        return
    start = len(lines)
    if isinstance(item, BaseModel):
        _fields(item, indent + 2, default, lines)
    else:
        for k, v in item.items():
            _entry(k, v, default, indent + 2, lines)
    if len(lines) == start:
        lines.append(f"{pad}- {{}}")
        return
    lines[start] = f"{pad}- {lines[start][indent + 2:]}"


__all__ = ["MARK", "expand_file", "expand_text", "scalar"]


def expand_json(path: str | Path) -> dict[str, Any]:
    """The expanded spec for --json: every value (the model's JSON form) and the field paths that took their
    default (`defaulted`), in the model's field order."""
    from gpucluster.spec.loader import load_spec

    spec = load_spec(path).spec
    defaulted: list[str] = []
    _defaulted(spec, "", defaulted)
    return {"spec": spec.model_dump(mode="json"), "defaulted": defaulted}


def _defaulted(model: BaseModel, prefix: str, out: list[str]) -> None:
    for name in type(model).model_fields:
        where = f"{prefix}.{name}" if prefix else name
        if name not in model.model_fields_set:
            out.append(where)
            continue
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            _defaulted(value, where, out)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    _defaulted(item, f"{where}[{i}]", out)
