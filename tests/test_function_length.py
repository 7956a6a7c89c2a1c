"""No function in the package is over 80 lines, except those listed in EXCEPTIONS (none today), each with its reason.

Why: a function that long does several things without naming them; split where the split has a name (one
step of the plan, one kind of line, one subcommand). An exception is for generated or table-like code only,
with the reason beside it; an entry whose function got short fails until it leaves the list, so the list only
shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "gpucluster"
LIMIT = 80

# "module path under src/gpucluster:function" -> why it may be longer
EXCEPTIONS: dict[str, str] = {}


def _lengths() -> dict[str, int]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"
                out[key] = max(out.get(key, 0), node.end_lineno - node.lineno + 1)
    return out


LENGTHS = _lengths()


def test_no_function_is_over_the_limit_unless_listed() -> None:
    long = sorted(f"src/gpucluster/{k}: {n} lines" for k, n in LENGTHS.items() if n > LIMIT and k not in EXCEPTIONS)
    assert not long, f"over {LIMIT} lines: split where the split has a name\n" + "\n".join(long)


@pytest.mark.parametrize("key", EXCEPTIONS)
def test_every_exception_is_still_long(key: str) -> None:
    assert LENGTHS.get(key, 0) > LIMIT, (
        f"src/gpucluster/{key} is {LENGTHS.get(key, 0)} lines now, within {LIMIT}: remove it from EXCEPTIONS")
