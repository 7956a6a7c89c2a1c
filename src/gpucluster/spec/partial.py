"""The meaning checks on a spec the syntax layer refused: every finding in one run.

Design (rebuild a partial model, taint what failed): the syntax layer reports the fields it refused.
We then build the ClusterSpec again from the same data, validating every field that passed as the
syntax layer did, and putting a *taint* where a field failed, is missing, or is close to a misspelt
key (the user meant to set it). A taint is a value that raises `Tainted` on any use: comparing, hashing, truthiness,
arithmetic, formatting, attribute access. Each rule unit of `gpucluster.spec.rules` (a cross-cutting
rule, or one group's rules) then runs on this model; a unit that touches a taint stops there, and the
findings it yielded before are kept,
since none of them depended on a refused value. So `count: four` in one group hides only what
depends on that count, and a partition typo elsewhere is still reported.

Why not defaults or placeholders: a placeholder count of 1 would invent findings (replicas above the
chunk servers, a controller count); a taint can only hide findings, never invent one. The planner
does not run on a partial model: nearly all of its results depend on every count.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from functools import cache
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from gpucluster.errors import Finding
from gpucluster.spec.model import ClusterSpec
from gpucluster.spec.rules import rule_units


class Tainted(Exception):
    """A rule read a value the syntax layer refused."""


def _refuse(self: _Taint, *_args: object, **_kwargs: object) -> Any:
    raise Tainted(self.path)


class _Taint:
    __slots__ = ("path",)

    def __init__(self, path: tuple):
        self.path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise Tainted(self.path)

    def __repr__(self) -> str:
        return "<refused>"

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __bool__ = __len__ = __iter__ = _refuse
    __contains__ = __getitem__ = __str__ = __format__ = __int__ = __float__ = __index__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __neg__ = __abs__ = __round__ = _refuse


_BAD = object()  # trie mark: this very value failed


def partial_spec(data: dict, refused: Iterable[tuple]) -> ClusterSpec:
    """ClusterSpec of `data` with a taint at each refused path (error locations, as pydantic gives them)."""
    trie: dict = {}
    for loc in refused:
        node = trie
        for part in loc:
            node = node.setdefault(part, {})
        node[_BAD] = True
    return _model(ClusterSpec, data, trie, ())


def meaning_findings(spec: ClusterSpec) -> list[Finding]:
    """Every rule's findings on a partial spec; a rule stops at the first refused value it reads."""
    out: list[Finding] = []
    for unit in rule_units(spec):
        try:
            for finding in unit():
                out.append(finding)
        except Exception:  # Tainted, or an error raised by something built from a taint
            continue
    return out


def _model(cls: type[BaseModel], raw: dict, trie: dict, path: tuple) -> BaseModel:
    fields = cls.model_fields
    unset = [name for name in fields if name not in raw]
    # a misspelt key stands for the fields it is close to: `oversubscribtion` hides what a ratio decides
    meant = {m for k in trie if k is not _BAD and k not in fields
             for m in difflib.get_close_matches(str(k)[:64], unset, n=3, cutoff=0.6)}
    values: dict[str, Any] = {}
    for name, info in fields.items():
        here = path + (name,)
        if name not in raw:
            if info.is_required() or name in meant:
                values[name] = _Taint(here)
            continue
        sub = trie.get(name)
        values[name] = _value(info.annotation, raw[name], sub, here) if sub else _clean(cls, name, raw[name], here)
    return cls.model_construct(**values)


def _value(tp: Any, raw: Any, trie: dict, path: tuple) -> Any:
    if _BAD in trie:
        return _Taint(path)
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(raw, dict):
        return _model(tp, raw, trie, path)
    if origin in (tuple, list) and isinstance(raw, (list, tuple)):
        item = typing.get_args(tp)[0]
        return tuple(_value(item, x, trie[i], path + (i,)) if i in trie else _adapt(item, x, path + (i,))
                     for i, x in enumerate(raw))
    if origin is dict and isinstance(raw, dict):
        key_tp, item = typing.get_args(tp)
        clean = {k: v for k, v in raw.items() if k not in trie}
        out = _adapt(dict[key_tp, item], clean, path) if clean else {}
        if isinstance(out, dict):
            for k in raw:
                if k in trie:
                    out[k] = _value(item, raw[k], trie[k], path + (k,))
            return out
    return _Taint(path)


def _clean(cls: type[BaseModel], name: str, raw: Any, path: tuple) -> Any:
    """A field the syntax layer accepted, validated again on its own (tuples, nested models, normal paths)."""
    try:
        return _field_adapter(cls, name).validate_python(raw)
    except ValidationError:
        return _Taint(path)


def _adapt(tp: Any, raw: Any, path: tuple) -> Any:
    try:
        return _adapter(tp).validate_python(raw)
    except (ValidationError, TypeError):
        return _Taint(path)


@cache
def _field_adapter(cls: type[BaseModel], name: str) -> TypeAdapter:
    info = cls.model_fields[name]
    return TypeAdapter(typing.Annotated[info.annotation, *info.metadata]) if info.metadata else _adapter(
        info.annotation)


@cache
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


def _unwrap(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else tp
    return tp


__all__ = ["Tainted", "meaning_findings", "partial_spec"]
