"""What a converge costs the machine that runs it, apart from what it costs the nodes (bench/converge.py uses it).

Why both: on the staged cluster the controller (this process and the Ansible/ssh processes it starts) and
the nodes (podman containers) share one machine's cores; on a real cluster they do not. The controller's CPU
is the rusage of this process and of every process it started, reaped here with os.wait4: ssh's ControlPersist
masters detach from Ansible, so this process makes itself their subreaper (PR_SET_CHILD_SUBREAPER) and ends
and reaps them when a measured run is over (each run then starts cold, as a converge every few minutes does
once ControlPersist has expired). The nodes' CPU is the cpu.stat usage of each container's cgroup.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of the processes this one starts (ssh ControlPersist masters) become its children."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


def _children() -> list[int]:
    me = str(os.getpid())
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            out.append(int(entry.name))
    return out


def reap_adopted() -> float:
    """End (SIGTERM, by pid) and reap the processes this one adopted; their CPU-seconds (user + system)."""
    total = 0.0
    for pid in _children():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if not cmd.endswith(b"ssh"):
            continue  # only the ssh masters Ansible left behind
        os.kill(pid, signal.SIGTERM)
        try:
            _pid, _status, usage = os.wait4(pid, 0)
        except ChildProcessError:
            continue
        total += usage.ru_utime + usage.ru_stime
    return total


def _own() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def container_cgroups(containers: dict[str, str]) -> dict[str, Path]:
    """node -> the file holding its container's CPU usage: cgroup v2 cpu.stat (usage_usec) or, on a cgroup v1
    host, cpuacct.usage (nanoseconds)."""
    out = {}
    for node, name in containers.items():
        res = subprocess.run(["podman", "inspect", "--format", "{{.State.CgroupPath}}", name], capture_output=True,
                             text=True, check=False)
        rel = res.stdout.strip().lstrip("/")
        for path in (Path("/sys/fs/cgroup") / rel / "cpu.stat", Path("/sys/fs/cgroup/cpuacct") / rel / "cpuacct.usage"):
            if res.returncode == 0 and rel and path.is_file():
                out[node] = path
                break
    return out


def _usage(stats: dict[str, Path]) -> dict[str, float]:
    out = {}
    for node, path in stats.items():
        if path.name == "cpuacct.usage":
            out[node] = int(path.read_text().split()[0]) / 1e9
            continue
        for line in path.read_text().splitlines():
            if line.startswith("usage_usec "):
                out[node] = int(line.split()[1]) / 1e6
    return out


@dataclass
class Cost:
    label: str
    hosts: int
    wall_s: float
    controller_cpu_s: float
    nodes_cpu_s: float
    changed: int
    ok: bool

    @property
    def controller_per_host(self) -> float:
        return self.controller_cpu_s / max(1, self.hosts)

    def row(self) -> dict:
        return {"label": self.label, "hosts": self.hosts, "wall_s": round(self.wall_s, 1),
                "controller_cpu_s": round(self.controller_cpu_s, 2),
                "controller_cpu_per_host_s": round(self.controller_per_host, 3),
                "nodes_cpu_s": round(self.nodes_cpu_s, 1), "changed": self.changed, "ok": self.ok}


def measure(label: str, hosts: int, run: Callable[[], tuple[int, bool]], cgroups: dict[str, Path]) -> Cost:
    """Run `run` (returns (changes, ok)) once and account for it."""
    reap_adopted()
    nodes0, cpu0, t0 = _usage(cgroups), _own(), time.monotonic()
    changed, ok = run()
    wall = time.monotonic() - t0
    reap_adopted()  # reaped here, so their rusage is in RUSAGE_CHILDREN already
    cpu = _own() - cpu0
    nodes1 = _usage(cgroups)
    nodes = sum(nodes1.get(n, 0.0) - nodes0.get(n, 0.0) for n in nodes1)
    return Cost(label, hosts, wall, cpu, nodes, changed, ok)
