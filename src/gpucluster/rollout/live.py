"""A rollout on a cluster gpucluster configures (an inventory): where the engine's steps come from when the
operator gives no command of their own.

    Slurm       the clients on the inventory's first controller, over SSH as Ansible reaches it (slurmclient.Client)
    controller  slurmdbd, then slurmctld: `configure --limit` their hosts (each host once; a host that is both
                takes both roles in one run, slurmdbd's first, as the Slurm play orders them)
    apply       `configure --limit` the wave's nodes, while they are out of service
    check       before a node goes back: its own health checks (the HealthCheckProgram the slurm_health role
                installs, run with --no-act: it records, changes nothing in Slurm), then a validate subset
                (RESUME_CHECKS: services, Slurm's view of the node, mounts, config files)
    resize      the same converge through resize.Controller: the controllers learn the new node list, new nodes
                are configured while drained

Every converge runs in this process (gpucluster.configure), with the operator's --secrets and --tags.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from gpucluster.render.health.config import STATE_DIR as HEALTH_STATE_DIR
from gpucluster.render.health.slurmconf import PROGRAM as HEALTH_PROGRAM
from gpucluster.rollout.slurmops import Slurm
from gpucluster.slurmclient import Client, SlurmError, slurm_host

# The validate checks that say a node may take jobs again, and hold while it is drained or reserved (a check that
# needs the node in service, such as test_node_known_and_usable, is left out): its daemons, what slurmctld knows of
# it, its mounts and its config files.
RESUME_CHECKS = ("service_active or slurmd_answers or munge_key or node_gres or flash_mounted or nfs_client_mounted "
                 "or nccl_config_file or gpu_count_and_model")


class LiveCluster:
    """The hooks of a rollout on the inventory at `path` (loaded: `inv`, an inventory.reader.Inventory)."""

    def __init__(self, path: Path, inv, *, secrets: str | None = None, tags: str | None = None,
                 health: bool = True, say: Callable[[str], None] = print):
        self.path, self.inv, self.secrets, self.tags, self.health, self.say = path, inv, secrets, tags, health, say
        self._converged: set[str] = set()  # hosts the controller steps already converged in this run

    # ---------------------------------------------------------------------------------------------- Slurm
    def slurm(self) -> Slurm:
        return Slurm(Client(slurm_host(self.inv, "to reach Slurm through (the rollout runs scontrol there)",
                                       ("slurm_controller",))))

    # ---------------------------------------------------------------------------------------------- converge
    def converge(self, hosts: Sequence[str], what: str, *, whole: bool = False) -> dict[str, str]:
        """`configure --limit hosts` (with --tags, unless `whole`): {host: why it failed} (every host when the
        run failed as a whole)."""
        from gpucluster.configure import configure

        if not hosts:
            return {}
        tags = None if whole else self.tags
        self.say(f"{what}: configure --limit {','.join(hosts)}" + (f" --tags {tags}" if tags else ""))
        result = configure(self.path, limit=",".join(hosts), tags=tags, secrets=self.secrets,
                           log=lambda _line: None)
        failed = {h: "; ".join(result.failures.get(h, [])[:2]) or "failed or unreachable"
                  for h in result.failed_hosts if h in hosts}
        if not result.ok and not failed:
            failed = dict.fromkeys(hosts, f"configure ended {result.status} (exit {result.rc})")
        self.say(f"{what}: {len(hosts) - len(failed)} of {len(hosts)} converged, {result.changed} changes, "
                 f"{result.elapsed:.0f} s")
        return failed

    def apply(self, nodes: Sequence[str]) -> dict[str, str]:
        return self.converge(list(nodes), "apply")

    def controller(self, daemon: str) -> None:
        """slurmdbd's hosts, then slurmctld's (and the login nodes', which hold the same files): each host once."""
        groups = ("slurm_dbd",) if daemon == "slurmdbd" else ("slurm_controller", "slurm_login")
        hosts = [h for g in groups for h in self.inv.group(g) if h not in self._converged]
        hosts = list(dict.fromkeys(hosts))
        failed = self.converge(hosts, daemon)
        self._converged.update(hosts)
        if failed:
            raise SlurmError(f"{daemon}: the converge failed on {', '.join(f'{h} ({w})' for h, w in failed.items())}")

    # ---------------------------------------------------------------------------------------------- checks
    def _ssh(self, host: str, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = self.inv.hosts[host].ssh_argv(shlex.join(argv), "ConnectTimeout=15")
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, "", f"no answer within {timeout:g} s")

    def health_checks(self, nodes: Sequence[str]) -> dict[str, str]:
        """Each node's own checks, run now (--no-act: nothing changes in Slurm); {node: the failing checks}."""
        failed = {}
        for n in nodes:
            script = (f"{HEALTH_PROGRAM} --no-act --node {shlex.quote(n)} >/dev/null && "
                      f"cat {HEALTH_STATE_DIR}/state.json")
            res = self._ssh(n, ["sh", "-c", script])
            if res.returncode != 0:
                failed[n] = f"health checks did not run: {(res.stderr or res.stdout).strip()[-200:]}"
                continue
            try:
                checks = json.loads(res.stdout).get("checks", {})
            except ValueError:
                failed[n] = "health checks: unreadable state.json"
                continue
            bad = [f"{name}: {c.get('message', '')}" for name, c in sorted(checks.items())
                   if not c.get("ok") and not c.get("not_run") and not c.get("active")]
            if bad:
                failed[n] = "health: " + "; ".join(bad)[:300]
        return failed

    def validate(self, nodes: Sequence[str]) -> dict[str, str]:
        """`gpucluster validate --limit nodes -k RESUME_CHECKS`: {node: its first failing check}."""
        from gpucluster.validate.report import parse_junit

        with tempfile.TemporaryDirectory(prefix="gpucluster-rollout-") as tmp:
            junit = Path(tmp) / "validate.xml"
            res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "validate", str(self.path), "--limit",
                                  ",".join(nodes), "-k", RESUME_CHECKS, "--junit", str(junit), "--no-color"],
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800, check=False)
            if not junit.exists():
                tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.returncode}"]
                return dict.fromkeys(nodes, f"validate did not run: {tail[0][:200]}")
            failed: dict[str, str] = {}
            for r in parse_junit(junit):
                if r.outcome == "failed" and r.host in nodes and r.host not in failed:
                    failed[r.host] = f"validate {r.name}: {r.message[:200]}"
            if res.returncode != 0 and not failed:
                return dict.fromkeys(nodes, f"validate exited {res.returncode} with no failed check named")
            return failed

    def check(self, nodes: Sequence[str]) -> dict[str, str]:
        failed = self.health_checks(nodes) if self.health else {}
        rest = [n for n in nodes if n not in failed]
        if rest:
            failed.update(self.validate(rest))
        return failed


class LiveController:
    """resize.Controller for an inventory: the new config reaches Slurm by converging the controllers (their
    handlers restart or reconfigure as the release needs); new nodes' slurmd starts with their converge."""

    def __init__(self, live: LiveCluster):
        self.live = live

    def _systemctl(self, hosts: Sequence[str], *argv: str) -> None:
        for h in hosts:
            if h not in self.live.inv.hosts:
                self.live.say(f"{h}: not in the inventory any more; `systemctl {' '.join(argv)}` left to you")
                continue
            res = self.live._ssh(h, ["systemctl", *argv])
            if res.returncode not in (0, 5):  # 5: no such unit (a node whose slurmd was never installed)
                raise SlurmError(f"{h}: systemctl {' '.join(argv)} failed: {(res.stderr or '').strip()[-200:]}")

    def load_config(self, nodes: Sequence[str]) -> None:
        hosts = [h for g in ("slurm_dbd", "slurm_controller", "slurm_login") for h in self.live.inv.group(g)]
        failed = self.live.converge(list(dict.fromkeys(hosts)), "controllers")
        if failed:
            raise SlurmError(f"the controllers' converge failed: {failed}")

    def restart_slurmctld(self) -> None:
        self._systemctl(self.live.inv.group("slurm_controller"), "restart", "slurmctld")

    def restart_slurmd(self, nodes: Sequence[str]) -> None:
        self._systemctl(list(nodes), "try-restart", "slurmd")

    def start_slurmd(self, nodes: Sequence[str]) -> None:
        # a new node takes every role, whatever --tags says (--tags narrows what the controllers' converge does)
        failed = self.live.converge(list(nodes), "new nodes", whole=True)
        if failed:
            raise SlurmError(f"the new nodes' converge failed: {failed}")

    def stop_slurmd(self, nodes: Sequence[str]) -> None:
        self._systemctl(list(nodes), "disable", "--now", "slurmd")
