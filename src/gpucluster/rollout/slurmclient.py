"""The rollout's view of Slurm: scontrol, squeue and sinfo through one `run` function, so the same class
drives a real cluster (the clients on this machine, or on the inventory's first controller over SSH) and the
emulator (its clients and SLURM_CONF). Only what a rollout needs: node states and reasons, drain, resume,
reboot, a maintenance reservation, reconfigure. What Slurm says is read by `slurmtext` (the node table and
the queue as --json): a reason or a job name is data, whatever it holds."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import hostlist

from gpucluster import slurmtext

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]
OURS = "gpc:"  # every reason gpucluster writes starts so; any other reason is a person's (or another tool's)
BUSY = {"ALLOCATED", "MIXED", "COMPLETING"}
REBOOTING = {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}
OUT = {"DRAIN", "DOWN", "FAIL", "MAINT"}


class SlurmError(RuntimeError):
    """A Slurm client failed; the message has the command and its stderr."""


def local_runner(cmd: Sequence[str]) -> subprocess.CompletedProcess:
    """The clients on this host, with the environment's SLURM_CONF (a real cluster's login node)."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found: run the rollout on a host with the Slurm clients "
                         "(a controller or login node)") from None


def ssh_runner(host, *, timeout: float = 120) -> Runner:
    """The clients on `host` (an inventory Host: a controller), reached as Ansible reaches it (its address,
    port, user, key; gpucluster's host-key option first, batch mode). Every argument is quoted for the remote
    shell, so a node name or a reason is one word there, never shell syntax."""

    def run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
        argv = host.ssh_argv(shlex.join(cmd), "ConnectTimeout=15", "ServerAliveInterval=15")
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"no answer from {host.name} within {timeout:g} s")
        except FileNotFoundError:
            raise SlurmError("ssh not found: install the OpenSSH client to reach the controller") from None

    return run


@dataclass(frozen=True)
class NodeState:
    name: str
    states: frozenset[str]
    reason: str  # exactly as set (no scontrol stamp); "" when none

    @property
    def out(self) -> bool:
        """Out of service: drained, draining, down or failed."""
        return bool(self.states & OUT)

    @property
    def by_hand(self) -> bool:
        """Out of service for someone else's reason: never resumed, never counted as done."""
        return self.out and not self.reason.startswith(OURS)

    @property
    def drained(self) -> bool:
        """Drained with no job left on it."""
        return "DRAIN" in self.states and not self.states & BUSY

    @property
    def busy(self) -> bool:
        """A job runs (or is completing) on it."""
        return bool(self.states & BUSY)

    @property
    def rebooting(self) -> bool:
        return bool(self.states & REBOOTING)


def parse_nodes(text: str, command: str = " ".join(slurmtext.NODES_JSON)) -> dict[str, NodeState]:
    """The node table (`scontrol --json show node`, or 22.05's `sinfo --json`) -> name -> NodeState. Raises
    slurmtext.SlurmOutputError when it is not that."""
    return {n: _state(node) for n, node in slurmtext.parse_nodes_json(text, command).items()}


def _state(node: slurmtext.SlurmNode) -> NodeState:
    return NodeState(node.name, node.states, node.reason)


class Slurm:
    def __init__(self, run: Runner = local_runner):
        self._run = run
        self._table = slurmtext.NodeTable(run)

    def _ok(self, *cmd: str) -> str:
        res = self._run(list(cmd))
        if res.returncode != 0:
            raise SlurmError(f"{' '.join(cmd)} failed ({res.returncode}): {(res.stderr or '').strip()[-400:]}")
        return res.stdout or ""

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeState]:
        try:
            found = {n: _state(node) for n, node in self._table.read().items()}
        except slurmtext.SlurmOutputError as exc:
            raise SlurmError(str(exc)) from None
        return found if names is None else {n: found[n] for n in names if n in found}

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        if nodes:
            self._ok("scontrol", "update", f"nodename={hostlist.collect_hostlist(list(nodes))}", "state=DRAIN",
                     f"reason={reason}")

    def resume(self, nodes: Sequence[str]) -> None:
        if nodes:
            self._ok("scontrol", "update", f"nodename={hostlist.collect_hostlist(list(nodes))}", "state=RESUME")

    def reboot(self, nodes: Sequence[str], reason: str) -> None:
        """ASAP: Slurm drains the nodes, lets their jobs finish, runs RebootProgram, and with nextstate=RESUME
        puts them back in service once slurmd registers again (scontrol(1), "reboot")."""
        if nodes:
            self._ok("scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}",
                     hostlist.collect_hostlist(list(nodes)))

    def reserve(self, name: str, nodes: Sequence[str]) -> None:
        """A maintenance reservation over `nodes` (root's, from now, no end; running jobs keep running): no new
        job starts there until `release`. Set again if it exists (a resumed rollout)."""
        if not nodes:
            return
        hl = hostlist.collect_hostlist(list(nodes))
        res = self._run(["scontrol", "create", "reservation", f"reservationname={name}", f"nodes={hl}",
                         "starttime=now", "duration=infinite", "flags=maint,ignore_jobs", "users=root"])
        if res.returncode != 0:
            if "uplicate" not in (res.stderr or "") + (res.stdout or ""):
                raise SlurmError(f"scontrol create reservation {name} failed ({res.returncode}): "
                                 f"{(res.stderr or '').strip()[-400:]}")
            self._ok("scontrol", "update", f"reservationname={name}", f"nodes={hl}")

    def release(self, name: str) -> None:
        """Delete the reservation; gone already is no error."""
        res = self._run(["scontrol", "delete", f"reservationname={name}"])
        if res.returncode != 0 and "not found" not in ((res.stderr or "") + (res.stdout or "")).lower():
            raise SlurmError(f"scontrol delete reservation {name} failed ({res.returncode}): "
                             f"{(res.stderr or '').strip()[-400:]}")

    def reconfigure(self) -> None:
        self._ok("scontrol", "reconfigure")

    def running_jobs(self, nodes: Sequence[str]) -> list[str]:
        """The ids of the jobs running (or completing, or configuring) on any of `nodes`."""
        try:
            return [j.id for j in slurmtext.read_jobs(self._run, ("RUNNING", "COMPLETING", "CONFIGURING"), nodes)]
        except slurmtext.SlurmOutputError as exc:
            raise SlurmError(str(exc)) from None
