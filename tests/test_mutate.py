"""bench/mutate.py on a toy project: a mutant the toy test sees is caught, one it does not see survives
(exit 1), the file is put back after each, and after a Ctrl-C in the middle of a test run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTATE = ROOT / "bench" / "mutate.py"
TOY = "def bar(x):\n    return x >= 10\n\n\ndef nap():\n    return 0\n"
TOY_TEST = ("import time\nfrom toy import bar, nap\n\n\ndef test_bar():\n    assert bar(10) and not bar(9)\n\n\n"
            "def test_nap():\n    time.sleep(nap())\n")


def toy(tmp_path: Path, entries: str) -> Path:
    (tmp_path / "toy.py").write_text(TOY)
    (tmp_path / "test_toy.py").write_text(TOY_TEST)
    (tmp_path / "bench" / "mutations").mkdir(parents=True)
    (tmp_path / "bench" / "mutations" / "toy.yaml").write_text(entries)
    return tmp_path


def mutate(root: Path, *args: str) -> subprocess.Popen:
    """bench/mutate.py on the toy, with a pytest that is this interpreter's (--pytest names one program)."""
    shim = root / "pytest-x"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m pytest \"$@\"\n")
    shim.chmod(0o755)
    return subprocess.Popen([sys.executable, str(MUTATE), "--root", str(root), "--pytest", str(shim), *args],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def entry(id_: str, find: str, replace: str) -> str:
    return (f"- id: {id_}\n  file: toy.py\n  find: {find!r}\n  replace: {replace!r}\n"
            "  tests: [test_toy.py]\n  why: toy\n")


def run(root: Path, *args: str) -> tuple[int, str]:
    proc = mutate(root, *args)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def test_a_caught_mutant_and_a_survivor(tmp_path: Path) -> None:
    root = toy(tmp_path, entry("bar-bar", "x >= 10", "x > 10") + entry("dead-nap", "return 0", "return 0.0"))
    rc, out = run(root)
    assert rc == 1, out
    assert "caught" in out.split("bar-bar")[0].splitlines()[-1]
    assert "SURVIVED: dead-nap" in out and "0 survivors" not in out
    assert (root / "toy.py").read_text() == TOY
    rc, out = run(root, "--only", "bar-bar")
    assert rc == 0 and "1 caught, 0 not" in out, out


def test_find_must_occur_exactly_once(tmp_path: Path) -> None:
    root = toy(tmp_path, entry("twice", "return", "return not"))
    rc, out = run(root)
    assert rc == 2 and "find occurs 2 times in toy.py" in out and "entry 1 (twice)" in out, out


def test_ctrl_c_puts_the_file_back(tmp_path: Path) -> None:
    root = toy(tmp_path, entry("slow", "return 0", "return 30"))
    proc = mutate(root, "--no-baseline")
    deadline = time.monotonic() + 30
    while (root / "toy.py").read_text() == TOY and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "return 30" in (root / "toy.py").read_text()
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert (root / "toy.py").read_text() == TOY
    assert not (root / "bench" / ".mutate-journal.json").exists()
