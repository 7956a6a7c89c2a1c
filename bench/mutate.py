"""Mutation run: one-line faults applied one at a time; each must turn some test red.

    .venv/bin/python bench/mutate.py                         # every list in bench/mutations/*.yaml
    .venv/bin/python bench/mutate.py bench/mutations/health.yaml --only ecc-no-gpu
    .venv/bin/python bench/mutate.py --list

A list is YAML: entries of {id, file, find, replace, tests: [pytest args], why}. `find` must occur exactly
once in `file` (a path from the project root); the mutant is `file` with it replaced by `replace`. For each
entry the given tests run with the worktree's .venv pytest: a red run (exit 1, or 2 when the mutant breaks
collection) is "caught", a green one "survived", a run past --timeout "caught (timed out)".

Why: a check that cannot fail tells an operator a broken node is fine. A test suite that stays
green under a mutant does not test that line.

Files are changed in place (the tests import the package from src/), and always put back: in a
`finally`, on SIGINT/SIGTERM/SIGHUP too, with their original bytes and mtime; the original bytes are
also kept in bench/.mutate-journal.json while a mutant is in place, so a run killed with SIGKILL is
undone by the next run before it starts. Byte-code is not written (PYTHONDONTWRITEBYTECODE) so no
stale .pyc of a mutant outlives it. Before any mutant, the union of all selected tests runs once
unmutated and must pass: a red baseline would make every mutant look caught.

Exit 0: every mutant caught; 1: some survived (or a test run could not tell); 2: a bad list or a red
baseline. Prints a table and the run time; asserts nothing else (bench/ convention).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ("id", "file", "find", "replace", "tests", "why")


class ListError(Exception):
    """A mutation list that cannot be used; the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str
    source: str  # list file and entry, for messages


def load(paths: list[Path], root: Path) -> list[Mutation]:
    """Every entry of the lists, checked: fields, types, `find` exactly once in `file`, ids unique."""
    out: list[Mutation] = []
    seen: dict[str, str] = {}
    errors: list[str] = []
    for path in paths:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ListError(f"{path}: cannot read the list: {exc}") from None
        if not isinstance(data, list):
            raise ListError(f"{path}: a mutation list is a YAML list of entries {{{', '.join(FIELDS)}}}")
        for i, entry in enumerate(data):
            where = f"{path}: entry {i + 1}"
            if not isinstance(entry, dict):
                errors.append(f"{where}: not a mapping")
                continue
            where = f"{path}: entry {i + 1} ({entry.get('id', '?')})"
            missing = [f for f in FIELDS if f not in entry]
            unknown = sorted(set(entry) - set(FIELDS))
            if missing or unknown:
                errors.append(f"{where}: " + "; ".join(
                    ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown {', '.join(unknown)}"]
                                                                             if unknown else [])))
                continue
            tests = entry["tests"]
            if not all(isinstance(entry[f], str) for f in ("id", "file", "find", "replace", "why")) or not (
                    isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)):
                errors.append(f"{where}: id, file, find, replace and why are strings; tests a non-empty list of "
                              "pytest arguments")
                continue
            if entry["id"] in seen:
                errors.append(f"{where}: id {entry['id']!r} already used by {seen[entry['id']]}")
                continue
            seen[entry["id"]] = where
            target = root / entry["file"]
            try:
                text = target.read_text()
            except OSError as exc:
                errors.append(f"{where}: file {entry['file']}: {exc.strerror}")
                continue
            n = text.count(entry["find"])
            if n != 1:
                errors.append(f"{where}: find occurs {n} times in {entry['file']}, must be exactly once; quote more "
                              "of the line")
                continue
            if entry["find"] == entry["replace"]:
                errors.append(f"{where}: replace equals find: not a mutation")
                continue
            out.append(Mutation(entry["id"], entry["file"], entry["find"], entry["replace"], tuple(tests),
                                entry["why"], where))
    if errors:
        raise ListError("\n".join(errors))
    return out


# ---- in place, always put back ----------------------------------------------------------------------

class Restorer:
    """Keeps the original bytes and mtime of the one mutated file; puts them back on restore(), on the
    signals that end a run, and (through the journal) on the next run after a SIGKILL."""

    def __init__(self, root: Path, journal: Path) -> None:
        self.root, self.journal = root, journal
        self.path: Path | None = None
        self.original: bytes = b""
        self.mtime_ns = 0

    def recover(self) -> str | None:
        """A journal left by a killed run: put its file back first."""
        if not self.journal.exists():
            return None
        doc = json.loads(self.journal.read_text())
        path = Path(doc["path"])
        path.write_bytes(bytes.fromhex(doc["original"]))
        os.utime(path, ns=(doc["mtime_ns"], doc["mtime_ns"]))
        self.journal.unlink()
        return str(path)

    def apply(self, m: Mutation) -> None:
        path = self.root / m.file
        self.original = path.read_bytes()
        self.mtime_ns = path.stat().st_mtime_ns
        self.path = path
        tmp = self.journal.with_suffix(".tmp")
        tmp.write_text(json.dumps({"path": str(path), "original": self.original.hex(), "mtime_ns": self.mtime_ns}))
        os.replace(tmp, self.journal)
        path.write_text(self.original.decode().replace(m.find, m.replace, 1))

    def restore(self) -> None:
        if self.path is None:
            return
        self.path.write_bytes(self.original)
        os.utime(self.path, ns=(self.mtime_ns, self.mtime_ns))  # the .pyc of the original stays valid
        self.path = None
        self.journal.unlink(missing_ok=True)


def _raise_interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# ---- running the tests ------------------------------------------------------------------------------

def pytest_argv(root: Path, pytest: str | None) -> list[str]:
    if pytest:
        return [pytest]
    venv = root / ".venv" / "bin" / "pytest"
    return [str(venv)] if venv.exists() else [sys.executable, "-m", "pytest"]


def run_tests(argv: list[str], tests: tuple[str, ...] | list[str], root: Path,
              timeout: float) -> tuple[int, float, str]:
    """(exit status, seconds, last lines); 124 when it ran past `timeout` (the whole group is killed)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [*argv, "-q", "-x", "-p", "no:cacheprovider", "--no-header", *tests]
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    except OSError as exc:
        return 127, 0.0, f"cannot run {argv[0]}: {exc.strerror or exc}"
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except BaseException as exc:  # a timeout, or Ctrl-C: the tests' whole group goes, then the caller restores
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        rc = 124
    tail = " | ".join(line.strip() for line in (out or "").strip().splitlines()[-3:])
    return rc, time.monotonic() - t0, tail


def baseline_runs(mutations: list[Mutation]) -> list[list[str]]:
    """The mutations' test selections, unmutated, in few pytest runs: selections on the same files with
    `-k EXPR` are merged into one `-k "(a) or (b)"`; any other selection runs as it is."""
    by_paths: dict[tuple[str, ...], list[str] | None] = {}
    alone: list[list[str]] = []
    for m in mutations:
        args, paths, exprs = list(m.tests), [], []
        while args:
            a = args.pop(0)
            if a == "-k" and args:
                exprs.append(args.pop(0))
            elif a.startswith("-"):
                break
            else:
                paths.append(a)
        else:
            key = tuple(paths)
            if not exprs:
                by_paths[key] = None
            elif len(exprs) == 1 and by_paths.get(key, []) is not None:
                by_paths[key] = [*by_paths.get(key, []), exprs[0]]
            else:
                alone.append(list(m.tests))
            continue
        alone.append(list(m.tests))
    runs = [[*paths] + (["-k", " or ".join(f"({e})" for e in dict.fromkeys(exprs))] if exprs else [])
            for paths, exprs in by_paths.items()]
    return runs + [a for a in dict.fromkeys(map(tuple, alone))]


def verdict(rc: int) -> str:
    if rc in (1, 2):
        return "caught"
    if rc == 124:
        return "caught (timed out)"
    if rc == 0:
        return "SURVIVED"
    return f"error (pytest exit {rc})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Apply one-line mutations one at a time; report which survive.")
    p.add_argument("lists", nargs="*", type=Path, help="mutation lists (default: bench/mutations/*.yaml)")
    p.add_argument("--root", type=Path, default=ROOT, help="project root: files and tests are relative to it")
    p.add_argument("--only", action="append", default=[], metavar="ID", help="run only this mutation (repeatable)")
    p.add_argument("--pytest", help="pytest to run (default: ROOT/.venv/bin/pytest)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one test run may take (default 300)")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the selected tests")
    p.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = p.parse_args(argv)
    root = args.root.resolve()
    lists = args.lists or sorted((root / "bench" / "mutations").glob("*.yaml"))
    if not lists:
        print(f"mutate: no lists given and none in {root}/bench/mutations", file=sys.stderr)
        return 2
    journal = root / "bench" / ".mutate-journal.json"
    journal.parent.mkdir(parents=True, exist_ok=True)
    lock = open(root / "bench" / ".mutate.lock", "w")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("mutate: another mutation run holds bench/.mutate.lock in this tree", file=sys.stderr)
        return 2
    restorer = Restorer(root, journal)
    recovered = restorer.recover()
    if recovered:
        print(f"mutate: put back {recovered} from a run that was killed with a mutant in place")
    try:
        mutations = load(lists, root)
    except ListError as exc:
        print(f"mutate: {exc}", file=sys.stderr)
        return 2
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutations})
        if unknown:
            print(f"mutate: no mutation with id {', '.join(unknown)} (see --list)", file=sys.stderr)
            return 2
        mutations = [m for m in mutations if m.id in args.only]
    if args.list:
        for m in mutations:
            print(f"{m.id:40} {m.file}: {m.why}")
        return 0
    pytest = pytest_argv(root, args.pytest)
    t0 = time.monotonic()
    # SIGINT too: a process started in the background of a non-interactive shell (or by a runner that
    # ignores it) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler of its own.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)
    rows: list[tuple[Mutation, str, float, str]] = []
    try:
        if not args.no_baseline:
            for sel in baseline_runs(mutations):
                rc, secs, tail = run_tests(pytest, list(sel), root, args.timeout * 2)
                print(f"baseline {'ok' if rc == 0 else 'RED':3} {secs:6.1f} s  {' '.join(sel)}", flush=True)
                if rc != 0:
                    print(f"mutate: the unmutated tests fail, so no mutant can be judged: {tail}", file=sys.stderr)
                    return 2
        for m in mutations:
            restorer.apply(m)
            try:
                rc, secs, tail = run_tests(pytest, m.tests, root, args.timeout)
            finally:
                restorer.restore()
            rows.append((m, verdict(rc), secs, tail))
            print(f"{verdict(rc):18} {secs:6.1f} s  {m.id}", flush=True)
    except KeyboardInterrupt:
        restorer.restore()
        print("mutate: interrupted; the mutated file is put back", file=sys.stderr)
        return 130
    finally:
        restorer.restore()
    survived = [r for r in rows if not r[1].startswith("caught")]
    print(f"\n{len(rows)} mutation(s): {len(rows) - len(survived)} caught, {len(survived)} not "
          f"({time.monotonic() - t0:.0f} s)")
    for m, v, _secs, tail in survived:
        print(f"  {v}: {m.id} ({m.source}): {m.file}: {m.why}\n    tests: {' '.join(m.tests)}\n    {tail}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
