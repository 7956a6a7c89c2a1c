"""Time and memory of every hostile case: no case may take over 2 s or 200 MB. Prints, never asserts.

    .venv/bin/python bench/hostile.py            # every spec case of tests/hostile/corpus.py, `check` and `render`
    .venv/bin/python bench/hostile.py --top 20   # show the 20 slowest

Each case runs in a fresh interpreter, as `gpucluster check SPEC` and `gpucluster render SPEC -o DIR` do.
Figures per case: the whole command's wall time and peak RSS (wait4 on the child), and the command's own
time after imports (what the spec costs, without Python's start-up), and the child's CPU time (on a
shared machine the steadier figure: wall time there includes waiting for a core). The targets apply to the whole
command; the worst case of each figure is printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def _corpus():
    """tests/hostile/corpus.py, loaded by path (this file is also named hostile)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hostile_corpus", ROOT / "tests" / "hostile" / "corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


SPEC_CASES = _corpus().SPEC_CASES

LIMIT_S, LIMIT_MB = 2.0, 200.0

CHILD = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
from gpucluster.cli import main
t1 = time.perf_counter()
devnull = open(os.devnull, "w")
sys.stdout, real = devnull, sys.stdout
sys.stderr = devnull
rc = main(sys.argv[1:])
t2 = time.perf_counter()
real.write(json.dumps({"rc": rc, "import_s": t1 - t0, "command_s": t2 - t1}))
"""


def run_case(argv: list[str], stdin: bytes | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    if stdin is not None:
        with contextlib.suppress(BrokenPipeError):  # it stopped reading at its size limit: the point
            proc.stdin.write(stdin)
    proc.stdin.close()
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    try:
        data = json.loads(out)
    except ValueError:
        data = {"rc": os.waitstatus_to_exitcode(status), "import_s": float("nan"), "command_s": float("nan")}
    return {**data, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="how many of the slowest cases to list")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in SPEC_CASES:
            for command in ("check", "render"):
                folder = Path(tmp) / f"{case.kind}-{case.name}-{command}"
                folder.mkdir()
                spec, _line = case.build(folder)
                argv = [command, spec] + (["-o", str(folder / "out")] if command == "render" else [])
                r = run_case(argv, case.stdin() if case.stdin else None)
                rows.append({"case": case.id, "command": command, **r})
    rows.sort(key=lambda r: r["wall_s"], reverse=True)
    print(f"{len(rows)} runs ({len(SPEC_CASES)} hostile specs x check, render); each a fresh interpreter\n")
    print(f"{'case':44} {'command':8} {'exit':>4} {'wall s':>7} {'cpu s':>6} {'after import s':>14} {'peak MB':>8}")
    for r in rows[: args.top]:
        print(f"{r['case']:44} {r['command']:8} {r['rc']:>4} {r['wall_s']:7.2f} {r['cpu_s']:6.2f} "
              f"{r['command_s']:14.3f} {r['rss_mb']:8.1f}")
    slow = max(rows, key=lambda r: r["wall_s"])
    busy = max(rows, key=lambda r: r["cpu_s"])
    fat = max(rows, key=lambda r: r["rss_mb"])
    own = max(rows, key=lambda r: r["command_s"] if r["command_s"] == r["command_s"] else 0)
    print(f"\nworst wall time:       {slow['wall_s']:.2f} s  ({slow['case']}, {slow['command']}); limit {LIMIT_S} s")
    print(f"worst CPU time:        {busy['cpu_s']:.2f} s  ({busy['case']}, {busy['command']}): the steadier "
          "figure on a shared machine")
    print(f"worst after imports:   {own['command_s']:.3f} s  ({own['case']}, {own['command']})")
    print(f"worst peak memory:     {fat['rss_mb']:.1f} MB ({fat['case']}, {fat['command']}); limit {LIMIT_MB:.0f} MB")
    over = [r for r in rows if r["wall_s"] > LIMIT_S or r["rss_mb"] > LIMIT_MB]
    print(f"over a limit:          {len(over)} " + ", ".join(f"{r['case']} {r['command']}" for r in over))
    not_two = [r for r in rows if r["rc"] != 2]
    print(f"exit other than 2:     {len(not_two)} "
          + ", ".join(f"{r['case']} {r['command']}={r['rc']}" for r in not_two))


if __name__ == "__main__":
    main()
