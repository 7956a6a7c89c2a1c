"""The push with Ansible's own strategy against the push with Mitogen's, on one staged cluster, in one run
(docs/roles.md, "Controller cost": the cheaper push measured).

    .venv/bin/python bench/converge_mitogen.py --inventory DIR [--strategies linear,mitogen_linear]
        [--rounds 2] [--run-timeout 900] [--budget 3600] [--project DIR] [--json bench/converge-mitogen.json]
    .venv/bin/python bench/converge_mitogen.py --inventory DIR --strategies mitogen_linear,mitogen_linear
        --projects BEFORE,AFTER --json bench/converge-apt.json    # one strategy, two snapshots of the roles

The cluster must be staged and converged once (`gpucluster stage up SPEC --state-dir S --inventory DIR`, then
`gpucluster configure DIR`). Every measurement is a whole process (this script with --child), so nothing one
strategy loaded or cached is left for the other; it ends by itself (--run-timeout kills its process group, and
no run starts once --budget is spent). --project runs another checkout's ansible.cfg, playbooks and roles
(`git archive HEAD | tar -x -C DIR`: a snapshot no edit to this checkout reaches while the bench runs). In order:

0. a converge with B, not compared: the cluster as the roles measured leave it;
1. drift: one comment line appended to files the roles manage (/etc/gpucluster/allowed_signers on every node,
   /etc/nccl.conf on the GPU nodes), the same on every step below that drifts;
2. a --check run of each strategy on that drift: ok, and the same set of would-change tasks per host;
3. a converge of each strategy, each after the same drift: the same set of changed tasks per host;
4. --rounds no-op converges of each strategy, interleaved (A B A B): every one 0 changes, the first of each right
   after its converge (the second run).

This machine's CPU for a run is the child's rusage (os.wait4: it and every process it waited for) plus the
processes it left behind and this script adopted as their subreaper (ssh ControlPersist masters, anything else),
ended and reaped after the run; the nodes' CPU is their containers' cgroups (bench/converge_cost.py). CPU-seconds
hold on a shared machine, wall time does not, so the load average is kept beside every run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIFT_LINE = "# gpucluster bench drift"
DRIFT_ALL = "/etc/gpucluster/allowed_signers"
DRIFT_GPU = "/etc/nccl.conf"


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def child(args: argparse.Namespace) -> int:
    """One converge in this process; what it did as JSON in --out."""
    os.environ["GPUCLUSTER_ANSIBLE_STRATEGY"] = args.child
    from gpucluster.configure import configure

    r = configure(args.inventory, check=args.check, project=args.project, log=lambda _line: None)
    Path(args.out).write_text(json.dumps({
        "rc": r.rc, "ok": r.ok, "changed": r.changed, "elapsed_s": round(r.elapsed, 1),
        "changes": {h: sorted(t) for h, t in r.changes.items()},
        "hosts": {h: vars(s) for h, s in r.hosts.items()},
        "failures": r.failures, "warnings": r.warnings[:20], "role_times": r.role_times,
        "artifacts": str(r.artifacts)}))
    return 0


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                out.append(int(entry.name))
    return out


def _reap_left(keep: set[int]) -> float:
    """End and reap what a run left behind (adopted: this process is their subreaper); their CPU-seconds."""
    total = 0.0
    for pid in _children():
        if pid in keep:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
            _pid, _status, usage = os.wait4(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            continue
        total += usage.ru_utime + usage.ru_stime
    return total


def _drift(containers: dict[str, str], gpu_nodes: set[str]) -> None:
    """The same change on every node, through podman (not ssh: nothing here costs the measured runs)."""
    for node, name in containers.items():
        files = [DRIFT_ALL] + ([DRIFT_GPU] if node in gpu_nodes else [])
        script = "; ".join(f"echo '{DRIFT_LINE}' >> {f}" for f in files)
        subprocess.run(["podman", "exec", name, "sh", "-c", script], check=True, capture_output=True, timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--strategies", default="linear,mitogen_linear", help="A,B: Ansible's own, then the other")
    parser.add_argument("--rounds", type=int, default=2, help="no-op converges of each strategy, interleaved")
    parser.add_argument("--run-timeout", type=int, default=900, help="seconds one run may take before it is killed")
    parser.add_argument("--budget", type=int, default=3600, help="seconds after which no further run starts")
    parser.add_argument("--project", help="the checkout whose ansible.cfg, playbooks and roles run (default: this)")
    parser.add_argument("--projects", help="A,B: one checkout per side (before and after a change to the roles), "
                                           "instead of --project; with one strategy named twice")
    parser.add_argument("--stage-state", help="the stage's state folder, where the inventory names another (a staged "
                                             "test's cluster kept with GPUCLUSTER_STAGED_KEEP: DIR/staged/stage)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "converge-mitogen.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    sys.path.insert(0, str(ROOT / "bench"))
    from converge_cost import _usage, become_subreaper, container_cgroups
    from converge_slope import _staged_containers

    from gpucluster.inventory.reader import inventory_file, load_inventory

    subreaper = become_subreaper()
    inventory = inventory_file(args.inventory)
    inv = load_inventory(inventory)
    nodes = sorted(inv.hosts)
    gpu_nodes = set(inv.group("slurm_compute"))
    containers = _staged_containers(inventory, Path(args.stage_state) if args.stage_state else None)
    cgroups = container_cgroups(containers)
    a, b = [s.strip() for s in args.strategies.split(",")]
    # Each side is a label: the strategy, or with --projects the strategy and its checkout's folder name.
    projects = {}
    if args.projects:
        pa, pb = [p.strip() for p in args.projects.split(",")]
        sa, sb = a, b
        a, b = f"{sa}@{Path(pa).name}", f"{sb}@{Path(pb).name}"
        projects = {a: (sa, pa), b: (sb, pb)}
    started = time.monotonic()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"converge-mitogen-{os.getpid()}"
    work.mkdir(mode=0o700)
    numbers: dict = {"inventory": str(inventory), "project": args.projects or args.project or str(ROOT),
                     "nodes": len(nodes),
                     "cpus": os.cpu_count(),
                     "strategies": [a, b], "subreaper": subreaper, "load_before": _load(),
                     "date": time.strftime("%Y-%m-%d"), "runs": []}

    def save() -> None:
        Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n")

    def run(strategy: str, step: str, check: bool = False) -> dict:
        _reap_left(set())  # what came before (the drift's podman conmon processes) is not this run's
        out = work / f"{len(numbers['runs'])}.json"
        label = strategy
        strategy, project = projects.get(label, (label, args.project))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--inventory", str(inventory), "--child", strategy,
               "--out", str(out)] + (["--check"] if check else [])
        cmd += ["--project", project] if project else []
        n0, t0 = _usage(cgroups), time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
        deadline = t0 + args.run_timeout
        usage = None
        while usage is None:
            pid, _status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                usage = ru
            elif time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                time.sleep(0.5)
        proc.returncode = 0  # reaped above; keep Popen from waiting again
        wall = time.monotonic() - t0
        left = _reap_left(set())
        cpu = usage.ru_utime + usage.ru_stime + left
        n1 = _usage(cgroups)
        result = json.loads(out.read_text()) if out.is_file() else {"ok": False, "changed": -1, "changes": {},
                                                                      "failures": {"bench": ["timed out or died"]}}
        row = {"step": step, "strategy": label, "check": check, "hosts": len(nodes), "wall_s": round(wall, 1),
               "controller_cpu_s": round(cpu, 2), "controller_cpu_per_host_s": round(cpu / len(nodes), 2),
               "left_behind_cpu_s": round(left, 2),
               "nodes_cpu_s": round(sum(n1.get(k, 0.0) - n0.get(k, 0.0) for k in n1), 1),
               "load_after": _load(), **result}
        numbers["runs"].append(row)
        save()
        print(f"{step:10s} {label:15s} {'check' if check else '':5s} wall {wall:6.1f} s  ctl CPU {cpu:7.2f} s "
              f"({cpu / len(nodes):5.2f}/host)  nodes {row['nodes_cpu_s']:7.1f} s  changed {row['changed']:3d}  "
              f"{'ok' if row['ok'] else 'FAILED'}  load {row['load_after']}", flush=True)
        return row

    plan: list[tuple[str, str, bool, bool]] = [  # (step, strategy, check, drift first)
        ("baseline", b, False, False), ("check", a, True, True), ("check", b, True, False),
        ("converge", a, False, False), ("second", a, False, False),
        ("converge", b, False, True), ("second", b, False, False)]
    for i in range(1, max(1, args.rounds)):
        plan += [(f"noop-{i + 1}", a, False, False), (f"noop-{i + 1}", b, False, False)]
    try:
        for step, strategy, check, drift in plan:
            if time.monotonic() - started > args.budget:
                numbers["stopped"] = f"budget of {args.budget} s spent before {step} {strategy}"
                print(numbers["stopped"], flush=True)
                break
            if drift:
                _drift(containers, gpu_nodes)
            run(strategy, step, check)
    finally:
        _reap_left(set())
        runs = numbers["runs"]

        def changes(step: str, strategy: str) -> dict | None:
            """The changed tasks per node: localhost's compile is this machine's cache of the spec, which changes
            when gpucluster's own code does, not a change to the cluster."""
            got = [r for r in runs if r["step"] == step and r["strategy"] == strategy]
            return {h: t for h, t in got[0]["changes"].items() if h != "localhost"} if got else None

        numbers["verdict"] = {
            "check_changes_identical": changes("check", a) == changes("check", b) and changes("check", a) is not None,
            "converge_changes_identical": (changes("converge", a) == changes("converge", b)
                                           and changes("converge", a) is not None),
            "noops_zero": all(r["changed"] == 0 for r in runs if r["step"] not in ("baseline", "check", "converge")),
            "all_ok": all(r["ok"] for r in runs),
        }
        for s in (a, b):
            noop = [r for r in runs if r["strategy"] == s and r["step"] not in ("baseline", "check", "converge")
                    and r["ok"]]
            if noop:
                numbers["verdict"][f"noop_{s}"] = {
                    "runs": len(noop), "wall_s": [r["wall_s"] for r in noop],
                    "controller_cpu_per_host_s": [r["controller_cpu_per_host_s"] for r in noop]}
        save()
        print(json.dumps(numbers["verdict"], indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
