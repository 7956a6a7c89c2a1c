"""Speed and memory of `gpucluster inventory SPEC -o DIR`, the whole process. Prints, never asserts.

    .venv/bin/python bench/inventory.py                    # colossus-200k, 5 runs after 1 warm-up
    .venv/bin/python bench/inventory.py SPEC --runs 9

Each run is a fresh `gpucluster inventory` process (import, one parse, one plan, the compile into the
state folder, the inventory written as one set), timed from outside: wall from a monotonic clock, CPU
and peak RSS from the kernel's accounting of the reaped child (os.wait4). GPUCLUSTER_TRACE counts the
parses and plans the run made (one of each). Target (issue: one compiled load): under 1 s and 100 MB
for Colossus 200k (before the refactor: 5.6 s, 329 MB). Quote the median; a wide min-max spread says
the machine was busy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPUCLUSTER = Path(sys.executable).with_name("gpucluster")


def one_run(spec: Path, work: Path, trace: Path) -> tuple[float, float, float]:
    out, state = work / "inv", work / "state"
    for folder in (out, state):
        shutil.rmtree(folder, ignore_errors=True)
    env = dict(os.environ, GPUCLUSTER_TRACE=str(trace))
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(GPUCLUSTER), "inventory", str(spec), "-o", str(out), "--state-dir", str(state)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"gpucluster inventory exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
    proc.stderr.close()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def spread(values: list[float], fmt: str) -> str:
    return (f"median {format(statistics.median(values), fmt)} "
            f"(min {format(min(values), fmt)}, max {format(max(values), fmt)})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", default=str(ROOT / "examples" / "colossus-200k.yaml"))
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    spec = Path(args.spec)
    with tempfile.TemporaryDirectory(prefix="gpc-bench-") as tmp:  # mkdtemp: 0700, this user's
        work = Path(tmp)
        trace = work / "trace"
        one_run(spec, work, work / "warmup-trace")  # warm-up: the page cache, not counted
        runs = []
        for _ in range(args.runs):
            trace.write_text("")
            runs.append(one_run(spec, work, trace))
        lines = trace.read_text().splitlines()
        files = [p for p in (work / "inv").rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        hosts = (work / "inv" / "hosts.yml").stat().st_size
    walls, cpus, peaks = zip(*runs, strict=True)
    print(f"gpucluster inventory {spec.name} -o DIR: {args.runs} runs after 1 warm-up "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"  wall    {spread(list(walls), '.2f')} s")
    print(f"  cpu     {spread(list(cpus), '.2f')} s")
    print(f"  peak    {spread(list(peaks), '.0f')} MB (one process's largest resident set)")
    print(f"  output  {len(files)} files, {size / 1e3:.0f} kB (hosts.yml {hosts / 1e3:.0f} kB)")
    events = [ln.split(" ", 1)[0] for ln in lines]
    print(f"  last run: {events.count('parse')} spec parse(s), {events.count('plan')} plan(s) (GPUCLUSTER_TRACE)")
    print("  target: under 1 s and 100 MB (before the one-compiled-load refactor: 5.6 s, 329 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
