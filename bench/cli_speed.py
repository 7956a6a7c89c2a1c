"""Speed of `gpucluster check|plan|render SPEC` as whole processes, before and after, in one run. Prints,
never asserts.

    .venv/bin/python bench/cli_speed.py                      # colossus-200k, 7 runs each, before = cd22142
    .venv/bin/python bench/cli_speed.py --before REV --runs 9 --spec examples/meta-24k-ib.yaml

Two trees, their runs interleaved so both see the same machine: `before` is git's REV (src/ and templates/
exported with git archive), `after` is this checkout's working tree as it is now (copied, uncommitted
edits included). Each run is a fresh process of the installed entry point with PYTHONPATH at one tree's
src/ (the venv's packages are shared), timed from outside: wall from a monotonic clock, CPU (user+system)
and peak RSS from the kernel's accounting of the reaped child (os.wait4). render writes a fresh folder each
run, cabling.csv included (Colossus 200k: 27 MB); the two trees' rendered folders are compared at the end.

Two modes, both reported:
  bytecode  gpucluster's .pyc written by a warm-up run, as an installed package has them
  source    PYTHONDONTWRITEBYTECODE=1 and no .pyc of gpucluster: each of its modules is compiled at every
            start, as in a checkout on a host that sets that variable (this project's do)
Targets: render of Colossus 200k under 0.35 s wall, check and plan under 0.3 s. Quote medians;
a wide min-max spread, or a load average near the core count, says the machine was busy.
"""

from __future__ import annotations

import argparse
import filecmp
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPUCLUSTER = Path(sys.executable).with_name("gpucluster")
BEFORE = "cd22142"  # the tree the start-up speed work began from
COMMANDS = ("check", "plan", "render")
TARGET = {"check": 0.3, "plan": 0.3, "render": 0.35}


def export(rev: str, dest: Path) -> None:
    """src/ and templates/ of `rev`, without touching the checkout (no worktree, no stash)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src", "templates"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def copy_worktree(dest: Path) -> None:
    for name in ("src", "templates"):
        shutil.copytree(ROOT / name, dest / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))


def one_run(tree: Path, command: str, spec: Path, out: Path, source: bool) -> tuple[float, float, float]:
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if source:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    argv = [str(GPUCLUSTER), command, str(spec)] + (["-o", str(out)] if command == "render" else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tree)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(argv)} (tree {tree.name}) exited {os.waitstatus_to_exitcode(status)}: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def pycs(tree: Path) -> int:
    return sum(1 for _ in (tree / "src").rglob("*.pyc"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "examples" / "colossus-200k.yaml"))
    ap.add_argument("--before", default=BEFORE, metavar="REV", help=f"the tree to compare with (default {BEFORE})")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    spec = Path(args.spec).resolve()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpc-clispeed-") as tmp:  # mkdtemp: 0700, this user's
        work = Path(tmp)
        trees = {"before": work / "before", "after": work / "after"}
        export(args.before, trees["before"])
        copy_worktree(trees["after"])
        results: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}
        for mode in ("source", "bytecode"):
            if mode == "bytecode":
                for tree in trees.values():  # warm-up: writes the trees' .pyc, fills the page cache
                    for command in COMMANDS:
                        one_run(tree, command, spec, work / "out-warm", source=False)
            else:
                assert not any(pycs(t) for t in trees.values()), "source mode needs trees without .pyc"
                for tree in trees.values():  # warm-up: the page cache only (nothing is written)
                    one_run(tree, "render", spec, work / "out-warm", source=True)
            for _ in range(args.runs):
                for command in COMMANDS:
                    for name, tree in trees.items():
                        results.setdefault((mode, command, name), []).append(
                            one_run(tree, command, spec, work / f"out-{name}", source=mode == "source"))
        names = sorted(set(os.listdir(work / "out-before")) | set(os.listdir(work / "out-after")))
        _match, differ, missing = filecmp.cmpfiles(work / "out-before", work / "out-after", names, shallow=False)
        same = not differ and not missing
    end = os.getloadavg()
    print(f"gpucluster check|plan|render {spec.name}: {args.runs} runs each, interleaved, after warm-up; "
          f"{os.cpu_count()} cores, load average {load[0]:.1f} at start, {end[0]:.1f} at end")
    print(f"  before = {args.before}, after = this working tree; median (min-max)")
    for mode in ("bytecode", "source"):
        print(f"  [{mode}]")
        print(f"    {'command':8} {'tree':7} {'wall s':>18} {'cpu s':>18} {'peak MB':>14}")
        for command in COMMANDS:
            for name in trees:
                walls, cpus, peaks = zip(*results[mode, command, name], strict=True)
                print(f"    {command:8} {name:7} {spread(list(walls), '.3f'):>18} {spread(list(cpus), '.3f'):>18} "
                      f"{spread(list(peaks), '.0f'):>14}")
            # run i of `after` ran right after run i of `before`: the ratio pair by pair outlasts a drifting load
            pairs = list(zip(results[mode, command, "before"], results[mode, command, "after"], strict=True))
            walls = [a[0] / b[0] for b, a in pairs]
            cpus = [a[1] / b[1] for b, a in pairs]
            print(f"    {command:8} {'a/b':7} {spread(walls, '.2f'):>18} {spread(cpus, '.2f'):>18}")
    print(f"  rendered folders: {len(names)} files, " + ("identical byte for byte" if same else
                                                           f"DIFFER: {differ + missing}"))
    print("  targets: " + ", ".join(f"{c} under {t} s wall" for c, t in TARGET.items()))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
