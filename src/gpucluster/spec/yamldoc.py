"""YAML text -> plain data, with the line and column of every key, built from the parser's events.

Why our own composer: PyYAML's composers either recurse (the C one crashes the interpreter on
100,000 nested brackets, the Python one is ~10x slower) or expand aliases without limit. Composing
from the event stream ourselves bounds depth and size while reading, keeps the line and column of
each key, and lets us refuse what YAML accepts silently:

- duplicate keys (YAML keeps the last), merge keys (`<<`), keys that are not scalars;
- explicit tags other than the core ones (`!!python/...`, `!!binary`, custom `!tags`);
- control and bidi characters in any scalar, even written as escapes ("\\x1b", "\\u202e");
- `1:1` as the base-60 integer 61, and `010`/`0x1f` as octal and hex: such numbers stay text, so a
  number field refuses them by name instead of reading 8 or 31.

Problems inside one value are findings that leave the rest readable (`tainted` names their paths,
so the meaning checks skip what depends on them); problems with the document itself are fatal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpucluster.errors import Finding, shown

MAX_VALUES = 50_000  # keys, items and scalars after alias expansion; the largest example has ~400
MAX_DEPTH = 64  # the spec's own nesting is 6 deep

_PARSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_RESOLVER = yaml.SafeLoader("")
_CONSTRUCTOR = yaml.SafeLoader("")
_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
_BOOLS = {"yes": True, "true": True, "on": True, "no": False, "false": False, "off": False}
_INF, _NAN = float("inf"), float("nan")
_DECIMAL = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
# C0/C1 controls but tab, newline and carriage return; Unicode bidi overrides and isolates
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@dataclass
class Document:
    """The parsed spec. `fatal`: no usable data (the findings say why)."""

    data: Any = None
    lines: dict[tuple, int] = field(default_factory=dict)
    columns: dict[tuple, int] = field(default_factory=dict)
    texts: dict[tuple, str] = field(default_factory=dict)  # source text of scalars YAML read as non-text
    findings: list[Finding] = field(default_factory=list)
    tainted: list[tuple] = field(default_factory=list)  # paths whose value a finding refused
    fatal: bool = False


class _Stop(Exception):
    def __init__(self, finding: Finding):
        self.finding = finding


_NOKEY = object()  # a mapping waiting for its next key
_SKIP = object()  # a mapping whose next value is dropped (its key was refused)


@dataclass
class _Frame:
    value: dict | list
    path: tuple
    anchor: str | None
    log_start: int
    size: int = 1
    key: Any = _NOKEY


def parse_document(text: str, name: str, raw: bytes | None = None) -> Document:
    """Compose `text` (the decoded `raw`, whose byte offsets libyaml reports) into a Document."""
    doc = Document()
    composer = _Composer(doc, name)
    try:
        composer.run(text)
    except _Stop as stop:
        doc.findings.append(stop.finding)
        doc.fatal = True
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or str(exc).splitlines()[0]
        doc.findings.append(Finding(composer.writing(), f"not valid YAML: {problem}",
                                    "fix the YAML syntax at that line", "yaml",
                                    file=name, line=mark.line + 1 if mark else None,
                                    column=mark.column + 1 if mark else None))
        doc.fatal = True
    except yaml.reader.ReaderError as exc:
        line, column = _position(text, raw, exc.position)
        char = _char_at(text, line, column)
        doc.findings.append(Finding(composer.writing(), f"a control character ({char}) at line {line}, column {column}",
                                    "remove it (YAML text holds printable characters, tabs and newlines)", "yaml",
                                    file=name, line=line, column=column))
        doc.fatal = True
    except yaml.YAMLError as exc:
        doc.findings.append(Finding(composer.writing(), f"not valid YAML: {shown(str(exc).splitlines()[0], 120)}",
                                    "fix the YAML syntax", "yaml", file=name))
        doc.fatal = True
    if not doc.fatal and doc.data is None:
        doc.findings.append(Finding((), "the spec is empty", "start from examples/staging.yaml", "yaml",
                                    file=name, line=1))
        doc.fatal = True
    elif not doc.fatal and not isinstance(doc.data, dict):
        doc.findings.append(Finding((), "the spec must be a mapping of keys", "start from examples/staging.yaml",
                                    "yaml", file=name, line=doc.lines.get((), 1)))
        doc.fatal = True
    return doc


def _position(text: str, raw: bytes | None, offset: int) -> tuple[int, int]:
    """1-based line and column of a reader error: libyaml counts bytes of the UTF-8, PyYAML characters."""
    if _PARSER is not yaml.SafeLoader and raw is None:
        raw = text.encode("utf-8")
    if _PARSER is not yaml.SafeLoader:
        start = raw.rfind(b"\n", 0, offset) + 1
        prefix = raw[start:offset].decode("utf-8", "replace")
        return raw.count(b"\n", 0, offset) + 1, len(prefix) + 1
    start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - start + 1


def _char_at(text: str, line: int, column: int) -> str:
    lines = text.split("\n", line)
    row = lines[line - 1] if len(lines) >= line else ""
    return f"U+{ord(row[column - 1]):04X}" if 0 < column <= len(row) else "a control character"


class _Composer:
    def __init__(self, doc: Document, name: str):
        self.doc = doc
        self.name = name
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int, list[tuple[tuple, int, int]]]] = {}
        self.order: list[tuple] = []  # paths in the order their lines were set (anchors slice it)
        self.budget = MAX_VALUES
        self.skipping = 0  # depth inside a refused key's subtree

    # ---- findings -----------------------------------------------------------------------------
    def writing(self) -> tuple:
        """The field the parser was inside when the syntax failed: the key whose value was open, or else
        the last key read before the error (a finding names a field, never just "the document")."""
        for frame in reversed(self.stack):
            if isinstance(frame.value, dict) and frame.key not in (_NOKEY, _SKIP):
                return frame.path + (frame.key,)
            if frame.path:
                return frame.path
        return self.order[-1] if self.order else ()

    def _find(self, path: tuple, message: str, fix: str, mark: yaml.Mark) -> None:
        self.doc.findings.append(Finding(path, message, fix, "yaml", file=self.name, line=mark.line + 1,
                                         column=mark.column + 1))
        self.doc.tainted.append(path)

    def _stop(self, message: str, fix: str, mark: yaml.Mark | None = None) -> _Stop:
        return _Stop(Finding(self.writing(), message, fix, "yaml", file=self.name, line=mark.line + 1 if mark else None,
                             column=mark.column + 1 if mark else None))

    def _place(self, path: tuple, mark: yaml.Mark) -> None:
        self.doc.lines[path] = mark.line + 1
        self.doc.columns[path] = mark.column + 1
        self.order.append(path)

    def _spend(self, n: int, mark: yaml.Mark) -> None:
        # Aliases are expanded, so a 1 kB file of aliases of aliases could expand to 10^9 values: count them.
        self.budget -= n
        if self.budget < 0:
            raise self._stop(f"the YAML holds more than {MAX_VALUES:,} values (aliases count each time they "
                             "are used)", "a spec describes groups, not nodes: write it without nested anchors "
                             "and aliases, and without long lists", mark)

    # ---- events -------------------------------------------------------------------------------
    def run(self, text: str) -> None:
        documents = 0
        for ev in yaml.parse(text, Loader=_PARSER):
            if isinstance(ev, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise self._stop("the file holds more than one YAML document",
                                     "keep one spec per file (remove the second '---')", ev.start_mark)
            elif isinstance(ev, (yaml.StreamStartEvent, yaml.StreamEndEvent, yaml.DocumentEndEvent)):
                continue
            elif self.skipping:
                if isinstance(ev, yaml.CollectionStartEvent):
                    self.skipping += 1
                elif isinstance(ev, yaml.CollectionEndEvent):
                    self.skipping -= 1
            elif isinstance(ev, yaml.CollectionEndEvent):
                self._close()
            else:
                self._node(ev)

    def _node(self, ev: yaml.Event) -> None:
        top = self.stack[-1] if self.stack else None
        if top is not None and isinstance(top.value, dict) and top.key is _NOKEY:
            self._key(top, ev)
            return
        if top is not None and isinstance(top.value, dict) and top.key is _SKIP:
            top.key = _NOKEY
            if isinstance(ev, yaml.CollectionStartEvent):
                self.skipping = 1
            return
        if top is None:
            path = ()
            self._place(path, ev.start_mark)
        elif isinstance(top.value, dict):
            path = top.path + (top.key,)  # placed with its key's line
        else:
            path = top.path + (len(top.value),)
            self._place(path, ev.start_mark)
        if isinstance(ev, yaml.AliasEvent):
            value, size = self._alias(ev, path)
        elif isinstance(ev, yaml.ScalarEvent):
            self._spend(1, ev.start_mark)
            value, size = self._scalar(ev, path), 1
        else:
            self._spend(1, ev.start_mark)
            if len(self.stack) >= MAX_DEPTH:
                raise self._stop(f"the YAML nests deeper than {MAX_DEPTH} levels", "flatten the document",
                                 ev.start_mark)
            value = {} if isinstance(ev, yaml.MappingStartEvent) else []
            self._check_tag(ev, path, value)
            self._attach(top, value, 0)
            self.stack.append(_Frame(value, path, ev.anchor, len(self.order)))
            return
        self._attach(top, value, size)
        if ev.anchor is not None and isinstance(ev, yaml.ScalarEvent):
            self.anchors[ev.anchor] = (value, 1, [])

    def _where(self, path: tuple) -> tuple[int, int]:
        return self.doc.lines[path], self.doc.columns[path]

    def _attach(self, top: _Frame | None, value: Any, size: int) -> None:
        if top is None:
            self.doc.data = value
        elif isinstance(top.value, dict):
            top.value[top.key] = value
            top.key = _NOKEY
            top.size += size
        else:
            top.value.append(value)
            top.size += size

    def _close(self) -> None:
        frame = self.stack.pop()
        if self.stack:
            self.stack[-1].size += frame.size
        if frame.anchor is not None:
            # the lines inside the anchored value, relative to it, for every path an alias copies it to
            cut = len(frame.path)
            rel = [(p[cut:], *self._where(p)) for p in self.order[frame.log_start:]]
            self.anchors[frame.anchor] = (frame.value, frame.size, rel)

    def _alias(self, ev: yaml.AliasEvent, path: tuple) -> tuple[Any, int]:
        if ev.anchor not in self.anchors:
            raise self._stop(f"the alias *{shown(ev.anchor)} names no complete anchor before it (or itself)",
                             "define the anchor (&name) before using it, outside its own value", ev.start_mark)
        value, size, rel = self.anchors[ev.anchor]
        self._spend(size, ev.start_mark)
        for sub, line, column in rel:
            self.doc.lines[path + sub] = line
            self.doc.columns[path + sub] = column
            self.order.append(path + sub)
        return value, size

    def _key(self, top: _Frame, ev: yaml.Event) -> None:
        mark = ev.start_mark
        if not isinstance(ev, yaml.ScalarEvent):
            self._find(top.path, "a key must be a plain word", "write the key as text", mark)
            top.key = _SKIP
            if isinstance(ev, yaml.CollectionStartEvent):
                self.skipping = 1
            return
        tag = self._tag(ev)
        if tag == _CORE + "merge":
            self._find(top.path, "YAML merge keys (<<) are not supported", "write the keys out", mark)
            top.key = _SKIP
            return
        key = self._value(tag, ev.value)
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            key = ev.value  # a key `yes` or `1.5` is the text it reads as
        path = top.path + (key,)
        if isinstance(key, str) and _CONTROL.search(key):
            self._find(path, f"a control character ({_first_control(key)}) in a key", "remove it", mark)
        if key in top.value:
            self._find(path, f"key '{shown(key)}' appears twice", "keep one of them", mark)
            top.key = _SKIP
            return
        self._place(path, mark)
        top.key = key

    def _tag(self, ev: yaml.ScalarEvent) -> str:
        if ev.tag is None or ev.tag == "!":
            return _RESOLVER.resolve(yaml.ScalarNode, ev.value, ev.implicit)
        return ev.tag

    def _check_tag(self, ev: yaml.CollectionStartEvent, path: tuple, value: Any) -> None:
        if ev.tag not in (None, "!") and ev.tag not in _ALLOWED_TAGS:
            self._find(path, f"the YAML tag {shown(ev.tag)} is not supported", "remove the tag", ev.start_mark)

    def _scalar(self, ev: yaml.ScalarEvent, path: tuple) -> Any:
        tag = self._tag(ev)
        if ev.tag not in (None, "!") and tag not in _ALLOWED_TAGS:
            self._find(path, f"the YAML tag {shown(ev.tag)} is not supported", "remove the tag", ev.start_mark)
            return ev.value
        value = self._value(tag, ev.value)
        if isinstance(value, str) and _CONTROL.search(value):
            self._find(path, f"a control character ({_first_control(value)}) in the value",
                       "remove it (escapes such as \\x1b or \\u202e included)", ev.start_mark)
        if tag != _CORE + "str":
            self.doc.texts[path] = ev.value  # what was written, for "quote it ('yes')" and "'010' is octal"
        return value

    def _value(self, tag: str, text: str) -> Any:
        if tag == _CORE + "str":
            return text
        # YAML 1.1 reads 1:1 as the sexagesimal integer 61, 010 as octal 8, 0x1f as 31: keep such text
        if tag == _CORE + "int" and not _DECIMAL.match(text):
            return text
        if tag == _CORE + "float" and ":" in text:
            return text
        try:
            if tag == _CORE + "int":  # decimal, as checked above (PyYAML's constructor is 5x slower)
                return int(text.replace("_", ""))
            if tag == _CORE + "bool":
                return _BOOLS[text.lower()]
            if tag == _CORE + "null":
                return None
            if tag == _CORE + "float":
                value = text.replace("_", "").lower()
                return {".inf": _INF, "+.inf": _INF, "-.inf": -_INF}.get(value) or (
                    _NAN if value == ".nan" else float(value))
            return _CONSTRUCTOR.construct_object(yaml.ScalarNode(tag, text), deep=True)
        except (yaml.YAMLError, ValueError, OverflowError, KeyError):
            return text


def _first_control(text: str) -> str:
    m = _CONTROL.search(text)
    return f"U+{ord(m.group()):04X}" if m else "?"


__all__ = ["MAX_DEPTH", "MAX_VALUES", "Document", "parse_document"]
