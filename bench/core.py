"""Speed and memory of the core path: load + check, plan, render each file, write. Prints, never asserts.

    .venv/bin/python bench/core.py                 # colossus-200k and meta-24k-roce, plus size scaling
    .venv/bin/python bench/core.py --profile SPEC  # cProfile of one spec's pipeline (top functions)
    .venv/bin/python bench/core.py --repeat 3      # best of 3 runs per spec

Each spec runs in a fresh interpreter so import time counts, as it does for `gpucluster render`.
Targets: check+plan+render of Colossus 200k under 1 s wall and 300 MB peak RSS;
Meta 24k under 0.5 s. "Total" below is import + load/check + plan + render of every file (cabling
map included) + write; the CLI's own wall time (`gpucluster render`) is measured separately.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T_START = time.perf_counter()  # before any gpucluster import: the child's import time counts
C_START = time.process_time()

ROOT = Path(__file__).resolve().parent.parent
SPECS = ["colossus-200k", "meta-24k-roce"]
TARGETS = {"colossus-200k": (1.0, 300), "meta-24k-roce": (0.5, None)}  # seconds, MB


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class Stages:
    """Wall and CPU time per stage: on a shared 2-core machine the CPU figure is the steadier one."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._t, self._c = time.perf_counter(), time.process_time()

    def mark(self, name: str) -> None:
        t, c = time.perf_counter(), time.process_time()
        self.wall[name], self.cpu[name] = t - self._t, c - self._c
        self._t, self._c = t, c


def one(spec_path: str) -> dict:
    """The pipeline, stage by stage, in this (fresh) process."""
    st = Stages()
    st.wall["python start -> bench main"], st.cpu["python start -> bench main"] = (
        st._t - T_START, st._c - C_START)
    from gpucluster.cluster import cluster_of
    from gpucluster.render import render_all, write_outputs
    from gpucluster.spec.loader import load_spec

    st.mark("import gpucluster")
    loaded = load_spec(spec_path)  # the syntax layer
    st.mark("load (syntax)")
    cluster = cluster_of(loaded)  # meaning checks and the one plan (gpucluster.cluster.load_cluster does both)
    st.mark("check + plan")
    plan = cluster.plan
    outputs = render_all(cluster)
    st.mark("render (templates, bom, plan.json)")
    sizes: dict[str, int] = {}
    for name, value in outputs.items():
        if isinstance(value, str):
            sizes[name] = len(value.encode())
        else:
            sizes[name] = sum(len(chunk.encode()) for chunk in value())
            st.mark(f"render {name} (streamed)")
    before_write = (time.perf_counter() - T_START, time.process_time() - C_START)
    with tempfile.TemporaryDirectory(prefix="bench-") as d:
        st.mark("(bench bookkeeping)")
        write_outputs(outputs, Path(d) / "out")  # streams cabling.csv again, as the CLI does
        st.mark("write (all files, cabling streamed again)")
    cabling = (st.wall.get("render cabling.csv (streamed)", 0), st.cpu.get("render cabling.csv (streamed)", 0))
    return {"spec": Path(spec_path).stem, "wall": st.wall, "cpu": st.cpu, "sizes": sizes,
            # what `gpucluster render` does: everything up to and including the write, each file made once
            "total_s": before_write[0] - cabling[0] + st.wall["write (all files, cabling streamed again)"],
            "total_cpu_s": before_write[1] - cabling[1] + st.cpu["write (all files, cabling streamed again)"],
            "no_cabling_s": before_write[0] - cabling[0], "no_cabling_cpu_s": before_write[1] - cabling[1],
            "peak_rss_mb": peak_rss_mb(), "nodes": plan.nodes, "gpus": plan.gpus,
            "switches": sum(plan.switches.values())}


def child(spec: str) -> dict:
    t = time.perf_counter()
    res = subprocess.run([sys.executable, __file__, "--one", str(ROOT / "examples" / f"{spec}.yaml")],
                         capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.splitlines()[-1])
    out["process_wall_s"] = time.perf_counter() - t
    return out


def cli_wall(spec: str) -> tuple[float, float]:
    """`gpucluster render SPEC -o DIR` end to end: (wall s, peak RSS MB) of the real command."""
    exe = Path(sys.executable).parent / "gpucluster"
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as d:
        t = time.perf_counter()
        subprocess.run([str(exe), "render", str(ROOT / "examples" / f"{spec}.yaml"), "-o", d],
                       capture_output=True, check=True)
        wall = time.perf_counter() - t
    import resource

    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def report(best: dict, runs: list[dict], spec: str) -> None:
    target_s, target_mb = TARGETS.get(spec, (None, None))

    def verdict(value: float, target: float | None) -> str:
        return f"   target < {target:g}: {'met' if value < target else 'MISSED'}" if target else ""

    print(f"\n== {spec}: {best['nodes']:,} nodes, {best['gpus']:,} GPUs, {best['switches']:,} switches "
          f"(best of {len(runs)}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"  {'stage':<44} {'wall ms':>9} {'cpu ms':>9}")
    for stage, s in best["wall"].items():
        print(f"  {stage:<44} {s * 1000:9.1f} {best['cpu'][stage] * 1000:9.1f}")
    print(f"  {'TOTAL check+plan+render+write (s)':<44} {best['total_s']:9.3f} {best['total_cpu_s']:9.3f}"
          + verdict(best["total_s"], target_s))
    print(f"  {'  of which without cabling.csv (s)':<44} {best['no_cabling_s']:9.3f} {best['no_cabling_cpu_s']:9.3f}"
          + verdict(best["no_cabling_s"], target_s))
    print(f"  {'process wall, interpreter start..exit (s)':<44} {best['process_wall_s']:9.3f}")
    print(f"  {'peak RSS (MB)':<44} {best['peak_rss_mb']:9.1f}" + verdict(best["peak_rss_mb"], target_mb))
    print("  outputs:")
    for name, size in sorted(best["sizes"].items(), key=lambda kv: -kv[1]):
        print(f"    {name:<20} {size:>12,} bytes")


def scaling() -> None:
    """slurm.conf and topology.conf bytes as Colossus 200k's node count is scaled (same unit size)."""
    sys.path.insert(0, str(ROOT / "src"))
    import yaml

    from gpucluster.cluster import cluster_of
    from gpucluster.render.fileset import render_slurm
    from gpucluster.spec.loader import parse_yaml, validate_data

    text = (ROOT / "examples" / "colossus-200k.yaml").read_text()
    base, _lines, _f = parse_yaml(text, "colossus-200k")
    print("\n== size vs node count (colossus-200k shape: 2 compute groups, 64-node scalable units)")
    print(f"  {'compute nodes':>13} {'GPUs':>9} {'units':>6} {'slurm.conf':>11} {'topology.conf':>14} "
          f"{'NodeName lines':>15} {'SwitchName lines':>17}")
    for factor in (0.01, 0.1, 0.25, 0.5, 1.0, 2.0):
        data = yaml.safe_load(yaml.safe_dump(base))
        for g in data["node_groups"]:
            if g["role"] == "compute":
                g["count"] = max(1, round(g["count"] * factor))
        cluster = cluster_of(validate_data(data, {}, Path("scaled.yaml")))
        spec, plan = cluster.spec, cluster.plan
        out = render_slurm(cluster)
        compute = sum(g.count for g in spec.groups_with_role("compute"))
        node_lines = sum(line.startswith("NodeName=") for line in out["slurm.conf"].splitlines())
        sw_lines = sum(line.startswith("SwitchName=") for line in out["topology.conf"].splitlines())
        print(f"  {compute:>13,} {plan.gpus:>9,} {len(plan.units):>6,} {len(out['slurm.conf']):>11,} "
              f"{len(out['topology.conf']):>14,} {node_lines:>15} {sw_lines:>17}")


def profile(spec: str) -> None:
    import cProfile
    import pstats

    path = spec if spec.endswith(".yaml") else str(ROOT / "examples" / f"{spec}.yaml")
    prof = cProfile.Profile(time.process_time)  # CPU time: steadier than wall on a shared machine
    prof.enable()
    one(path)
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"\n== cProfile (CPU time) of {Path(path).stem} (import..write), by cumulative time")
    stats.sort_stats("cumulative").print_stats(r"gpucluster|yaml|pydantic|jinja2|hostlist", 25)
    print("== by own time")
    stats.sort_stats("tottime").print_stats(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--profile", metavar="SPEC")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("specs", nargs="*", default=SPECS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    if args.profile:
        profile(args.profile)
        return
    for spec in args.specs:
        runs = [child(spec) for _ in range(args.repeat)]
        report(min(runs, key=lambda r: r["total_cpu_s"]), runs, spec)
        walls = [cli_wall(spec) for _ in range(args.repeat)]
        print(f"  {'gpucluster render SPEC -o DIR, best wall (s)':<44} {min(w for w, _ in walls):9.3f}"
              f"   (largest child peak RSS so far {max(m for _, m in walls):.1f} MB)")
    scaling()


if __name__ == "__main__":
    main()
