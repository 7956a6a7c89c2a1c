"""Size and speed of `gpucluster fabric test-plan SPEC --json [--summary]` as whole processes, before and after,
in one run. Prints, never asserts.

    .venv/bin/python bench/test_plan.py                      # colossus-200k, 3 runs each, before = 2451b17
    .venv/bin/python bench/test_plan.py --before REV --runs 5 --spec examples/meta-24k-ib.yaml

`before` is git's REV (src/ and templates/ exported with git archive, as bench/cli_speed.py does: no worktree,
no stash), `after` is this checkout's working tree as it is now (copied). Each run is a fresh process of the
installed entry point with PYTHONPATH at one tree's src/, its stdout written to a file; wall from a monotonic
clock, CPU (user+system) and peak RSS from the kernel's accounting of the reaped child (os.wait4). Runs of the
two trees are interleaved so both see the same load. The full forms' outputs are compared byte for byte at the
end (the streamed writer must keep json.dump's text). The before tree has no --summary: its row is absent.
Targets: --json --summary on Colossus 200k under 2 s wall; the full --json under 200 MB peak RSS.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cli_speed import copy_worktree, export, spread  # bench/ is sys.path[0]: the same tree export and figures

ROOT = Path(__file__).resolve().parent.parent
GPUCLUSTER = Path(sys.executable).with_name("gpucluster")
BEFORE = "2451b17"  # main when the streaming plan writer was started
FORMS = {"text": [], "summary": ["--json", "--summary"], "full": ["--json"]}


def one_run(tree: Path, form: str, spec: Path, out: Path) -> tuple[float, float, float, int]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    argv = [str(GPUCLUSTER), "fabric", "test-plan", str(spec), *FORMS[form]]
    with out.open("wb") as sink:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.PIPE, env=env, cwd=tree)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(argv)} (tree {tree.name}) exited {os.waitstatus_to_exitcode(status)}: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "examples" / "colossus-200k.yaml"))
    ap.add_argument("--before", default=BEFORE, metavar="REV", help=f"the tree to compare with (default {BEFORE})")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    spec = Path(args.spec).resolve()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpc-testplan-") as tmp:  # mkdtemp: 0700, this user's
        work = Path(tmp)
        trees = {"before": work / "before", "after": work / "after"}
        export(args.before, trees["before"])
        copy_worktree(trees["after"])
        runs = [(form, name) for form in FORMS for name in trees if not (form == "summary" and name == "before")]
        for form, name in runs:  # warm-up: .pyc and the page cache
            one_run(trees[name], form, spec, work / "warm.out")
        results: dict[tuple[str, str], list[tuple[float, float, float, int]]] = {}
        for _ in range(args.runs):
            for form, name in runs:
                results.setdefault((form, name), []).append(
                    one_run(trees[name], form, spec, work / f"{form}-{name}.out"))
        same = filecmp.cmp(work / "full-before.out", work / "full-after.out", shallow=False)
    end = os.getloadavg()
    print(f"gpucluster fabric test-plan {spec.name}: {args.runs} runs each, interleaved, after a warm-up; "
          f"{os.cpu_count()} cores, load average {load[0]:.1f} at start, {end[0]:.1f} at end")
    print(f"  before = {args.before}, after = this working tree; median (min-max)")
    print(f"    {'form':8} {'tree':7} {'wall s':>18} {'cpu s':>18} {'peak RSS MB':>16} {'stdout MB':>10}")
    for form, name in runs:
        walls, cpus, peaks, sizes = zip(*results[form, name], strict=True)
        print(f"    {form:8} {name:7} {spread(list(walls), '.2f'):>18} {spread(list(cpus), '.2f'):>18} "
              f"{spread(list(peaks), '.0f'):>16} {sizes[0] / 1e6:>10.2f}")
    print("  full --json output: " + ("identical byte for byte" if same else "DIFFERS between the trees"))
    print("  targets: --json --summary under 2 s wall; --json under 200 MB peak RSS")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
