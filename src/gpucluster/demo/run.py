"""The whole chain on one machine, as a new user first runs it (`gpucluster demo [SPEC]`).

stage up -> configure -> validate -> a Slurm job placed by topology, then a summary. Each step is
the same command a user would type; the demo only sequences them and reads their results.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hostlist

from gpucluster.words import plural


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpucluster.cli", *args]


def _step(title: str, n: int, total: int) -> None:
    print(f"\n[{n}/{total}] {title}", flush=True)


def _run(cmd: list[str]) -> int:
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, check=False).returncode


def _ssh(config: Path, host: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", host, command],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, check=False)


def slurm_versions(config: Path, ctl: str, hosts: list[str]) -> str:
    """The Slurm that ran a job, read from the running daemons: slurmctld's own version (`scontrol show
    config`, SLURM_VERSION) and each node's slurmd (`sinfo %v`). The spec says which release the files
    were rendered for; this says what the cluster actually runs, so a summary on Debian 13 nodes names
    24.11.x, not what the spec hoped for."""
    conf = _ssh(config, ctl, "scontrol show config")
    ctld = next((line.split("=", 1)[1].strip() for line in conf.stdout.splitlines()
                 if line.split("=", 1)[0].strip() == "SLURM_VERSION"), "")
    nodes: dict[str, str] = {}
    if hosts:
        res = _ssh(config, ctl, f"sinfo -h -N -o '%N|%v' -n {hostlist.collect_hostlist(hosts)}")
        nodes = dict(line.split("|", 1) for line in res.stdout.split() if "|" in line)
    seen = {v for v in [ctld, *nodes.values()] if v}
    if not seen:
        return "Slurm version unknown (scontrol show config and sinfo %v answered nothing)"
    if len(seen) == 1:
        return f"Slurm {seen.pop()} (slurmctld on {ctl}, slurmd on {', '.join(sorted(nodes)) or '?'})"
    return f"slurmctld {ctld or '?'} on {ctl}; " + ", ".join(f"slurmd {v} on {h}" for h, v in sorted(nodes.items()))


def run_job(staged, spec, plan) -> tuple[bool, str]:
    """Submit a 2-node job asking for one leaf switch and report where Slurm put it, and which Slurm ran it."""
    ctl = spec.groups_with_role("controller")[0].hosts[0]
    cmd = ("sbatch --parsable --wait -N2 --switches=1 --gres=gpu:1 -o /tmp/demo-%j.out "
           "--wrap 'srun hostname; echo SLURM_TOPOLOGY_ADDR=$SLURM_TOPOLOGY_ADDR'")
    res = _ssh(staged.ssh_config, ctl, cmd)
    if res.returncode != 0:
        return False, f"sbatch failed on {ctl}: {(res.stderr or res.stdout).strip()[-400:]}"
    job = res.stdout.strip().splitlines()[-1].split(";")[0]
    # slurmdbd gets the job's records asynchronously: right after the job ends, sacct was seen to show
    # one node of the two. Wait (up to a minute) until the record is final and names both.
    deadline = time.monotonic() + 60
    while True:
        acct = _ssh(staged.ssh_config, ctl, f"sacct -j {job} -X -n -P -o JobID,State,NNodes,NodeList,ExitCode")
        fields = acct.stdout.strip().split("|") if acct.stdout.strip() else []
        hosts = hostlist.expand_hostlist(fields[3]) if len(fields) >= 5 and fields[3] else []
        settled = len(fields) >= 5 and fields[1] not in ("PENDING", "RUNNING") and len(hosts) == 2
        if settled or time.monotonic() > deadline:
            break
        time.sleep(2)
    if len(fields) < 5:
        return False, f"job {job}: sacct has no record ({acct.stderr.strip()})"
    state, nodelist = fields[1], fields[3]
    leaves = sorted({plan.unit_of_host[h].name for h in hosts if h in plan.unit_of_host})
    ok = state == "COMPLETED" and len(hosts) == 2 and len(leaves) == 1
    return ok, (f"job {job} {state} on {nodelist} ({plural(len(hosts), 'node')}) under leaf {', '.join(leaves) or '?'} "
                f"(asked -N2 --switches=1); {slurm_versions(staged.ssh_config, ctl, hosts)}")


def demo(spec_path: str) -> int:
    """The whole chain; prints each step and a summary. Exit status: 0 when every step passed."""
    from gpucluster import trace
    from gpucluster.cluster import load_cluster
    from gpucluster.stage.lifecycle import stage_up

    # Count the spec parses and plans of the whole run, in this process and the ones it starts (configure's
    # Ansible controller, validate): one compiled load means one of each.
    trace_dir = Path(tempfile.mkdtemp(prefix="gpucluster-demo-"))  # 0700, unique
    os.environ[trace.SETTING] = str(trace_dir / "trace")
    cluster = load_cluster(spec_path)
    spec, plan = cluster.spec, cluster.plan
    results: list[tuple[str, bool, float, str]] = []
    total = 4

    def record(name: str, t0: float, ok: bool, detail: str) -> None:
        results.append((name, ok, time.perf_counter() - t0, detail))
        print(("  ok: " if ok else "  FAILED: ") + detail, flush=True)

    _step(f"stage up {spec_path}: {plan.nodes} nodes as podman containers", 1, total)
    t0 = time.perf_counter()
    staged, inventory = stage_up(spec_path, log=lambda msg: print(f"  {msg}", flush=True), cluster=cluster)
    record("stage up", t0, True, f"{plural(len(staged.nodes), 'node')}; inventory {inventory}")

    inv_dir = str(inventory.parent)
    _step(f"configure {inv_dir}: Ansible roles through ansible-runner", 2, total)
    t0 = time.perf_counter()
    rc = _run(_cli("configure", inv_dir))
    record("configure", t0, rc == 0, "converged" if rc == 0 else f"configure exited {rc}")

    if rc == 0:
        _step(f"validate {inv_dir}: testinfra checks on every node", 3, total)
        t0 = time.perf_counter()
        rc = _run(_cli("validate", inv_dir, "-n", "4", "--html", str(Path(inv_dir) / "validate.html")))
        record("validate", t0, rc == 0, f"report {Path(inv_dir) / 'validate.html'}" if rc == 0
               else f"validate exited {rc} (report {Path(inv_dir) / 'validate.html'})")

        _step("a Slurm job: 2 nodes under one leaf (--switches=1)", 4, total)
        t0 = time.perf_counter()
        ok, detail = run_job(staged, spec, plan)
        record("slurm job", t0, ok, detail)

    loads = trace.counts(trace_dir / "trace")
    shutil.rmtree(trace_dir, ignore_errors=True)
    print("\nsummary")
    width = max(len(r[0]) for r in results)
    for name, ok, took, detail in results:
        print(f"  {name:{width}s}  {'ok    ' if ok else 'FAILED'}  {took:7.1f} s  {detail}")
    print(f"  spec parses: {loads.get('parse', 0)}, plans: {loads.get('plan', 0)} (one compiled load for the whole "
          "run: stage up compiled it; configure and validate read the compiled state)")
    ok = all(r[1] for r in results) and len(results) == total
    ctl = spec.groups_with_role("controller")[0].hosts[0]
    print(f"\nthe staged cluster stays up: ssh -F {staged.ssh_config} {ctl} sinfo")
    print(f"remove it with: gpucluster stage down {spec_path}")
    return 0 if ok else 1
