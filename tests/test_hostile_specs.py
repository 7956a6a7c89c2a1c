"""Hostile specs never harm: every case of tests/hostile/corpus.py, through `gpucluster render`, exits 2
with a located finding (file:line where the spec has lines) naming its rule, prints no traceback, and
leaves the output folder an earlier render wrote byte-identical, with no temporary folder beside it.

One test per kind (yaml-trap, alias-bomb, types, bounds, paths, file-kind), parametrized over its
cases. Cases run in-process (main()), except those fed on standard input, which run the real command.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, example_path
from hostile.corpus import KINDS, SPEC_CASES, SpecCase

from gpucluster.cli import main

ENTRY = [sys.executable, "-m", "gpucluster.cli"]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under folder, by relative path, with its bytes (folders as None)."""
    out: dict[str, bytes] = {}
    for path in sorted(folder.rglob("*")):
        out[str(path.relative_to(folder))] = None if path.is_dir() else path.read_bytes()
    return out


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.parent.iterdir() if ".gpucluster-" in p.name]


@pytest.fixture(scope="module")
def earlier(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """An output folder written by a good render of staging.yaml, and its snapshot."""
    out = tmp_path_factory.mktemp("earlier") / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["render", str(example_path("staging")), "-o", str(out)]) == 0
    return out, snapshot(out)


def run_render(case: SpecCase, folder: Path, out: Path) -> tuple[int, str, str | None, int | None]:
    spec, line = case.build(folder)
    argv = ["render", spec, "-o", str(out)]
    if case.stdin is not None:
        res = subprocess.run(ENTRY + argv, input=case.stdin(), capture_output=True, timeout=120, cwd=ROOT,
                             env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
        return res.returncode, (res.stdout + res.stderr).decode("utf-8", "replace"), "<stdin>", line
    buf_out, buf_err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf_out), contextlib.redirect_stderr(buf_err):
        rc = main(argv)
    return rc, buf_out.getvalue() + buf_err.getvalue(), spec, line


def check_case(case: SpecCase, tmp_path: Path, earlier: tuple[Path, dict[str, bytes]]) -> None:
    source, before = earlier
    out = tmp_path / "out"
    shutil.copytree(source, out)
    folder = tmp_path / "spec"
    folder.mkdir()
    rc, text, name, line = run_render(case, folder, out)
    assert "Traceback" not in text, text
    assert rc == 2, f"exit {rc}:\n{text}"
    errors = [ln for ln in text.splitlines() if ln.startswith("error: ")]
    assert errors, text
    if case.located:
        at = rf"^error: {re.escape(name)}:(\d+): "
        lines = [int(m[1]) for m in (re.match(at, ln) for ln in errors) if m]
        assert lines, f"no finding names {name}:LINE:\n{text}"
        if line is not None:
            assert line in lines, f"no finding at line {line}:\n{text}"
    else:
        assert errors[0].startswith(f"error: {name}"), text
    assert case.says in text, text
    rules = set(re.findall(r"\[([\w-]+)\]$", text, re.M))
    assert rules & case.rules, f"expected one of {sorted(case.rules)}, got {sorted(rules)}:\n{text}"
    assert snapshot(out) == before, "the earlier output folder changed"
    assert leftovers(out) == [], "a temporary folder was left beside the output"


def cases(kind: str) -> list:
    return [pytest.param(c, id=c.name) for c in SPEC_CASES if c.kind == kind]


def test_corpus_size_and_kinds():
    assert len(SPEC_CASES) >= 60
    assert set(KINDS) == {"yaml-trap", "alias-bomb", "types", "bounds", "paths", "file-kind"}
    assert len({c.id for c in SPEC_CASES}) == len(SPEC_CASES)


@pytest.mark.parametrize("case", cases("yaml-trap"))
def test_yaml_trap(case, tmp_path, earlier):
    check_case(case, tmp_path, earlier)


@pytest.mark.parametrize("case", cases("alias-bomb"))
def test_alias_bomb(case, tmp_path, earlier):
    check_case(case, tmp_path, earlier)


@pytest.mark.parametrize("case", cases("types"))
def test_types(case, tmp_path, earlier):
    check_case(case, tmp_path, earlier)


@pytest.mark.parametrize("case", cases("bounds"))
def test_bounds(case, tmp_path, earlier):
    check_case(case, tmp_path, earlier)


@pytest.mark.parametrize("case", cases("paths"))
def test_paths(case, tmp_path, earlier):
    check_case(case, tmp_path, earlier)


@pytest.mark.parametrize("case", cases("file-kind"))
def test_file_kind(case, tmp_path, earlier):
    check_case(case, tmp_path, earlier)


def test_divisors_in_square_root_time():
    """The planner's spine and core counts are divisors of uplink counts; a user switch may claim 2 x 10^9
    ports (now refused by the catalog bound, but the planner must not depend on it)."""
    from gpucluster.fabric.plan import _divisors

    for n in range(1, 2000):
        assert _divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n
    big = _divisors(2 * 10**9)  # 2^10 * 5^9: 11 * 10 divisors
    assert len(big) == 110 and big == sorted(big) and all(2 * 10**9 % d == 0 for d in big)
