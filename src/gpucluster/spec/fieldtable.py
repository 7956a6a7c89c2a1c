"""docs/spec.md's table of every field: required or its default, its type and bounds, from the model.

Why generated: a default written by hand in a document drifts from the one in the model (once,
`nodes_per_rack` defaulted to 1 and spec.md did not say so). The table sits between two markers in
docs/spec.md; tests/test_expand.py fails when it differs from what this module writes, and

    python -m gpucluster.spec.fieldtable docs/spec.md

rewrites it. The `catalog:` section has a table of its own in spec.md and is left out here.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gpucluster.spec.expand import scalar
from gpucluster.spec.loader import pattern_words
from gpucluster.spec.model import ClusterSpec

BEGIN = "<!-- fields:begin (generated from spec/model.py by gpucluster.spec.fieldtable; do not edit) -->"
END = "<!-- fields:end -->"
SKIP = {("catalog",)}  # documented in "The `catalog:` section: every field"


def field_table() -> str:
    rows = ["| field | required / default | type and bounds | what it is |", "|---|---|---|---|"]
    _rows(ClusterSpec, (), rows)
    return "\n".join(rows) + "\n"


def _rows(model: type[BaseModel], path: tuple[str, ...], rows: list[str]) -> None:
    for name, info in model.model_fields.items():
        here = path + (name,)
        if here in SKIP:
            continue
        tp = info.annotation
        sub = _model_in(tp)
        rows.append(f"| `{_dotted(here, tp)}` | {_default(info)} | {_cell(_type(tp, info))} | "
                    f"{_cell(info.description or '')} |")
        if sub is not None:
            _rows(sub, here + (("[]",) if _is_list(tp) else ("<name>",) if _is_dict(tp) else ()), rows)


def _dotted(path: tuple[str, ...], tp: Any) -> str:
    out = ""
    for part in path:
        out += part if part == "[]" else (f".{part}" if out else part)
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None:
        return "none"
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump() for v in value]
    if isinstance(value, (tuple, list)):
        return "`[" + ", ".join(scalar(v) if not isinstance(v, dict) else _flow(v) for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{_flow(value)}`"
    return f"`{scalar(value)}`"


def _flow(value: dict) -> str:
    return "{" + ", ".join(f"{k}: {scalar(v)}" for k, v in value.items()) + "}"


def _unwrap(tp: Any) -> tuple[Any, list]:
    """The type under Annotated/Optional, and the constraints met on the way."""
    meta: list = []
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            tp, *more = typing.get_args(tp)
            meta += more
        elif typing.get_origin(tp) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp, meta
            tp = args[0]
        else:
            return tp, meta


def _model_in(tp: Any) -> type[BaseModel] | None:
    tp, _ = _unwrap(tp)
    if typing.get_origin(tp) in (tuple, list):
        tp, _ = _unwrap(typing.get_args(tp)[0])
    elif typing.get_origin(tp) is dict:
        tp, _ = _unwrap(typing.get_args(tp)[1])
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _is_dict(tp: Any) -> bool:
    return typing.get_origin(_unwrap(tp)[0]) is dict


def _is_list(tp: Any) -> bool:
    return typing.get_origin(_unwrap(tp)[0]) in (tuple, list)


def _type(tp: Any, info: FieldInfo | None = None) -> str:
    inner, meta = _unwrap(tp)
    meta += list(info.metadata) if info else []
    nullable = inner is not tp and type(None) in typing.get_args(_strip_annotated(tp))
    origin = typing.get_origin(inner)
    if origin is Literal:
        text = " | ".join(scalar(a) for a in typing.get_args(inner))
    elif origin in (tuple, list):
        item = _type(typing.get_args(inner)[0])
        text = "list of sections" if item == "section" else f"list of {item}"
    elif origin is dict:
        key, value = typing.get_args(inner)
        value_text = _type(value)
        text = f"mapping of {_type(key)} to {'sections' if value_text == 'section' else value_text}"
    elif isinstance(inner, type) and issubclass(inner, BaseModel):
        text = "section"
    else:
        text = {int: "integer", float: "number", bool: "boolean", str: "text"}.get(inner, getattr(inner, "__name__",
                                                                                                  str(inner)))
    unit = "characters" if inner is str else "entries"
    bounds = _bounds(meta, unit)
    if bounds:
        text += f" ({bounds})"
    return text + (" or null" if nullable else "")


def _strip_annotated(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _bounds(meta: list, unit: str) -> str:
    """Ranges, lengths and patterns of the constraint objects pydantic and annotated-types keep."""
    out = []
    for m in meta:
        for attr, words in (("ge", ">= {}"), ("gt", "> {}"), ("le", "<= {}"), ("lt", "< {}"),
                            ("min_length", f"at least {{}} {unit}"), ("max_length", f"at most {{}} {unit}")):
            value = getattr(m, attr, None)
            if value is not None and not (attr == "min_length" and value == 0):
                out.append(words.format(f"{value:,}" if isinstance(value, int) else value))
        pattern = getattr(m, "pattern", None)
        if isinstance(pattern, str):
            out.append(pattern_words(pattern))
    return ", ".join(dict.fromkeys(out)).replace("at least 1 entries", "at least 1 entry")


def updated(doc: str) -> str:
    """docs/spec.md's text with the table between the markers replaced by the model's."""
    head, found, rest = doc.partition(BEGIN)
    if not found:
        raise ValueError(f"docs/spec.md has no {BEGIN!r} marker")
    _, found, tail = rest.partition(END)
    if not found:
        raise ValueError(f"docs/spec.md has no {END!r} marker")
    return f"{head}{BEGIN}\n{field_table()}{END}{tail}"


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/spec.md")
    path.write_text(updated(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
