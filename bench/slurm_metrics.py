"""What the controller's Slurm metrics cost: one run of gpucluster-slurm-metrics against real slurmctld node tables of
three sizes on every Slurm line, and the render of its plan file (slurm-metrics.json) at three cluster sizes.
Prints and writes, never asserts.

    .venv/bin/python bench/slurm_metrics.py                       # -> bench/slurm-metrics.json
    .venv/bin/python bench/slurm_metrics.py --lines 22.05 --sizes 512 4096 --runs 3 --json /tmp/x.json
    .venv/bin/python bench/slurm_metrics.py --before REV     # also the program as it was at REV, same clusters

The exporter: a controller-only emulated cluster (gpucluster.emulate; no slurmd) of SIZE nodes State=CLOUD, shown
with PrivateData=cloud, 1 % of them drained with a reason, and a held job array of 1,000 tasks (squeue --array lists
each); the plan file cuts the nodes into units of 32. The program runs as the timer runs it (python3 in isolated
mode, Slurm's commands from PATH), RUNS times after a warm-up: wall time from a monotonic clock; CPU of the program
and its commands, and the peak RSS of the largest of them, from the kernel's accounting of the reaped child
(os.wait4); each source's seconds as the file reports them; slurmctld's own CPU during the run (/proc/PID/stat); the
node table's JSON bytes and the time the program's parser takes on it in process; the file's bytes. Medians, with
min and max.

The renderer: `render.slurmunits.slurm_units_text(cluster)` in process on staging, meta-24k-ib and colossus-200k,
loaded once, RUNS times after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "src" / "gpucluster" / "node" / "slurmmetrics.py"
SPECS = ("staging", "meta-24k-ib", "colossus-200k")
LINES = ("22.05", "24.11", "26.05")
SIZES = (512, 4096, 16384)
UNIT = 32


def spread(values: list[float], digits: int = 4) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def render_figures(runs: int) -> dict:
    from gpucluster.cluster import load_cluster
    from gpucluster.render.slurmunits import slurm_units_text

    out = {}
    for name in SPECS:
        cluster = load_cluster(ROOT / "examples" / f"{name}.yaml")
        text = slurm_units_text(cluster)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            text = slurm_units_text(cluster)
            times.append(time.perf_counter() - t0)
        out[name] = {"nodes": cluster.plan.nodes, "units": len(cluster.plan.units),
                     "nvlink_domains": len(cluster.plan.domains), "bytes": len(text.encode()),
                     "seconds": spread(times, 5)}
        print(f"render {name}: {cluster.plan.nodes} nodes, {len(cluster.plan.units)} units, {len(text)} bytes, "
              f"{statistics.median(times) * 1e3:.2f} ms")
    return out


def slurm_conf(size: int) -> str:
    return "\n".join([
        "ClusterName=bench", "SlurmctldHost=ctl01", "AuthType=auth/munge", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "PrivateData=cloud", "MaxJobCount=100000", "MaxArraySize=100001",
        f"NodeName=gpu[00001-{size:05d}] CPUs=2 RealMemory=500 State=UNKNOWN",
        f"PartitionName=batch Nodes=gpu[00001-{size:05d}] Default=YES MaxTime=INFINITE State=UP"]) + "\n"


def plan_file(size: int) -> str:
    units = [{"unit": f"su{i + 1:04d}", "group": "gpu", "pod": "",
              "hosts": f"gpu[{i * UNIT + 1:05d}-{min(size, (i + 1) * UNIT):05d}]"} for i in range(-(-size // UNIT))]
    return json.dumps({"cluster": "bench", "units": units, "nvlink_domains": []})


def wrappers(c, folder: Path) -> dict[str, str]:
    folder.mkdir()
    for tool in ("scontrol", "sinfo", "squeue", "sdiag"):
        argv = " ".join(f"'{a}'" for a in c.runtime.argv([tool]))
        (folder / tool).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (folder / tool).chmod(0o755)
    return {**c.env, "PATH": f"{folder}:{c.env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}


def ctld_cpu(pid: int) -> float:
    """slurmctld's CPU seconds so far (utime + stime of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(env: dict, out: Path, plan: Path, ctld: int, script: Path = SCRIPT) -> tuple[float, float, float, dict]:
    before = ctld_cpu(ctld)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-I", str(script), "--output", str(out), "--plan", str(plan),
                             "--timeout", "60"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0 or err:
        sys.exit(f"gpucluster-slurm-metrics failed: {err[-2000:]}")
    sources = {"slurmctld_cpu": ctld_cpu(ctld) - before}
    for line in out.read_text().splitlines():
        if line.startswith("gpucluster_slurm_source_duration_seconds{"):
            sources[line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith('gpucluster_slurm_jobs{state="pending"}'):
            sources["pending_jobs"] = float(line.split()[-1])
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, sources


def exporter_figures(line: str, size: int, runs: int, work: Path, before: Path | None = None) -> dict:
    from gpucluster.emulate import SlurmCluster
    from gpucluster.node import slurmmetrics as sm

    base = work / f"{line}-{size}"
    (base / "conf").mkdir(parents=True)
    base.chmod(0o755)
    (base / "conf" / "slurm.conf").write_text(slurm_conf(size))
    (base / "plan.json").write_text(plan_file(size))
    t0 = time.monotonic()
    with SlurmCluster(base / "conf", slurmd_nodes=[], absent_state="CLOUD", line=line, start_timeout=600) as c:
        started = time.monotonic() - t0
        env = wrappers(c, base / "bin")
        drained = [f"gpu{i:05d}" for i in range(1, size + 1, 100)]
        c.scontrol("update", f"nodename={','.join(drained)}", "state=drain", "reason=bench: drained by hand")
        c.run(["sbatch", "--hold", "--array=1-1000", "-N1", "--wrap", "sleep 1"], check=True)
        table = c.run(["scontrol", "--json", "show", "node"])
        if table.returncode != 0:
            table = c.run(["sinfo", "--json"])
        out = base / "gpucluster_slurm.prom"
        one_run(env, out, base / "plan.json", c.ctld_pid)  # warm-up
        rows = [one_run(env, out, base / "plan.json", c.ctld_pid) for _ in range(runs)]
        old = [one_run(env, out, base / "plan.json", c.ctld_pid, before)[:3] for _ in range(runs)] if before else []
        c.cancel_all()
    walls, cpus, peaks, sources = zip(*rows, strict=True)
    parse = []
    for _ in range(runs):
        t1 = time.perf_counter()
        sm.parse_nodes(table.stdout)
        parse.append(time.perf_counter() - t1)
    got = {"nodes": size, "ctld_start_s": round(started, 1), "node_json_bytes": len(table.stdout.encode()),
           "file_bytes": out.stat().st_size, "wall_s": spread(list(walls)), "cpu_s": spread(list(cpus)),
           "peak_mb": spread(list(peaks), 1),
           "pending_jobs": int(sources[0].pop("pending_jobs")), "node_json_parse_s": spread(parse),
           "slurmctld_cpu_s": spread([s.pop("slurmctld_cpu") for s in sources]),
           "source_s": {k: spread([s[k] for s in sources]) for k in sources[0]}}
    if old:  # the program of --before REV, in the same cluster, right after
        got["before"] = {k: spread([r[i] for r in old], 4 if i < 2 else 1)
                         for i, k in enumerate(("wall_s", "cpu_s", "peak_mb"))}
        print(f"  before: {got['before']['wall_s']['median']:.3f} s wall, {got['before']['cpu_s']['median']:.3f} s "
              f"CPU, peak {got['before']['peak_mb']['median']:.0f} MB")
    print(f"Slurm {line}, {size} nodes: {got['wall_s']['median']:.3f} s wall (min {got['wall_s']['min']:.3f}, "
          f"max {got['wall_s']['max']:.3f}), {got['cpu_s']['median']:.3f} s CPU, "
          f"peak {got['peak_mb']['median']:.0f} MB; nodes "
          f"{got['source_s']['nodes']['median']:.3f} s of {got['node_json_bytes'] / 1e6:.1f} MB JSON, "
          f"{got['pending_jobs']} jobs "
          f"{got['source_s']['jobs']['median']:.3f} s, sdiag {got['source_s']['sdiag']['median']:.3f} s; "
          f"file {got['file_bytes']} bytes; parse of the JSON {got['node_json_parse_s']['median']:.3f} s, "
          f"slurmctld's CPU {got['slurmctld_cpu_s']['median']:.3f} s a run")
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", nargs="*", default=list(LINES))
    ap.add_argument("--sizes", nargs="*", type=int, default=list(SIZES))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=str(ROOT / "bench" / "slurm-metrics.json"))
    ap.add_argument("--before", metavar="REV", help="also run the program as it was at REV, in the same clusters")
    args = ap.parse_args(argv)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=False).stdout.strip()
    figures: dict = {"runs": args.runs, "revision": rev, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                     "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "load_before": [round(x, 2) for x in os.getloadavg()]},
                     "render": render_figures(max(args.runs, 7)), "exporter": {}}
    work = Path(tempfile.mkdtemp(prefix="gpc-slurm-metrics-"))
    before = None
    if args.before:
        before = work / "slurmmetrics-before.py"
        before.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{args.before}:{SCRIPT.relative_to(ROOT)}"],
                                         capture_output=True, text=True, check=True).stdout)
        figures["before"] = args.before
    try:
        for line in args.lines:
            figures["exporter"][line] = {str(size): exporter_figures(line, size, args.runs, work, before)
                                         for size in args.sizes}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
