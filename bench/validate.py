"""Wall time of `gpucluster validate` on a staged cluster: -n 1 against -n 4 (and --via-slurm).

    .venv/bin/python bench/validate.py                 # stages + configures examples/staging.yaml, then removes it
    .venv/bin/python bench/validate.py /tmp/val/inv    # an inventory that is already staged and configured
    .venv/bin/python bench/validate.py INV --runs 3 --via-slurm

Prints figures, asserts nothing (bench/ convention). The checks are I/O bound (SSH round trips, Slurm
RPCs), so workers scale past the core count; on a 2-core machine the staged nodes compete with the
validator for CPU, which caps the speed-up a real fleet would see.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "gpucluster.cli"]


def validate(inv: str, *args: str) -> tuple[float, int, dict]:
    with tempfile.TemporaryDirectory() as d:
        junit = Path(d) / "v.xml"
        t0 = time.perf_counter()
        rc = subprocess.run([*CLI, "validate", inv, "--junit", str(junit), *args], capture_output=True, text=True,
                            check=False).returncode
        took = time.perf_counter() - t0
        counts = {"checks": 0, "failed": 0, "skipped": 0}
        if junit.exists():
            root = ET.parse(junit).getroot()
            counts = {"checks": int(root.get("tests", 0)), "failed": int(root.get("failures", 0))
                      + int(root.get("errors", 0)), "skipped": int(root.get("skipped", 0))}
    return took, rc, counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inventory", nargs="?", help="staged and configured inventory (default: stage one)")
    ap.add_argument("--runs", type=int, default=1, help="repeat each measurement (median is printed)")
    ap.add_argument("--via-slurm", action="store_true", help="also time --via-slurm")
    ap.add_argument("--workers", default="1,4", help="comma-separated -n values (default 1,4)")
    args = ap.parse_args()

    staged_here = None
    inv = args.inventory
    if not inv:
        staged_here = Path(tempfile.mkdtemp(prefix="bench-validate-"))
        inv = str(staged_here / "inv")
        spec = str(ROOT / "examples" / "staging.yaml")
        print(f"staging and configuring {spec} (state {staged_here})", flush=True)
        for cmd in ([*CLI, "stage", "up", spec, "--state-dir", str(staged_here / "state"), "--inventory", inv],
                    [*CLI, "configure", inv]):
            if subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL).returncode != 0:
                print(f"failed: {' '.join(cmd)}", file=sys.stderr)
                return 1
    try:
        hosts = None
        rows = []
        from gpucluster.inventory.reader import load_inventory

        inventory = load_inventory(inv)
        one = (inventory.groups.get("slurm_compute") or list(inventory.hosts))[0]
        plans = [("-n", n) for n in args.workers.split(",")]
        # The fleet-scale question: N hosts must not cost N x one host. One compute host alone first.
        took_one = statistics.median(validate(inv, "--limit", one, "-n", "1")[0] for _ in range(args.runs))
        print(f"  validate --limit {one} -n 1: {took_one:.1f} s (one host of {len(inventory.hosts)})", flush=True)
        if args.via_slurm:
            plans.append(("--via-slurm", ""))
        for flag, value in plans:
            times = []
            for _ in range(args.runs):
                extra = [flag, value] if value else [flag]
                took, rc, counts = validate(inv, *extra)
                times.append(took)
            label = f"{flag} {value}".strip()
            rows.append((label, statistics.median(times), rc, counts))
            hosts = hosts or counts
            print(f"  validate {label:12s} {statistics.median(times):7.1f} s  (exit {rc}; {counts['checks']} checks, "
                  f"{counts['failed']} failed, {counts['skipped']} skipped; runs {len(times)})", flush=True)
        for label, t, _rc, _c in rows:
            print(f"  {len(inventory.hosts)} hosts with {label}: {t / took_one:.1f} x one host "
                  f"(serial would be about {len(inventory.hosts)} x)")
        if len(rows) >= 2 and rows[0][1] > 0:
            base = rows[0][1]
            for label, t, _rc, _c in rows[1:]:
                print(f"  speed-up {label} vs {rows[0][0]}: {base / t:.2f}x")
        print(json.dumps({label: round(t, 2) for label, t, _rc, _c in rows}))
    finally:
        if staged_here:
            subprocess.run([*CLI, "stage", "down", str(ROOT / "examples" / "staging.yaml"), "--state-dir",
                            str(staged_here / "state"), "--inventory", inv], check=False, stdout=subprocess.DEVNULL)
            shutil.rmtree(staged_here, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
