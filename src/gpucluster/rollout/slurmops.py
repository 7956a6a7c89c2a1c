"""The rollout's view of Slurm: scontrol, squeue and sinfo through one `run` function, so the same class
drives a real cluster (a gpucluster.slurmclient.Client: the clients on this machine, or on the inventory's first
controller over SSH) and the emulator (its clients and SLURM_CONF). Only what a rollout needs: node states and
reasons, drain, resume, reboot, a maintenance reservation, reconfigure. What Slurm says is read by `slurmtext`
(the node table and the queue as --json): a reason or a job name is data, whatever it holds."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import hostlist

from gpucluster import slurmtext
from gpucluster.slurmclient import Client, SlurmError, failed

OURS = "gpc:"  # every reason gpucluster writes starts so; any other reason is a person's (or another tool's)
BUSY = {"ALLOCATED", "MIXED", "COMPLETING"}
REBOOTING = {"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"}
OUT = {"DRAIN", "DOWN", "FAIL", "MAINT"}


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
    def __init__(self, run: slurmtext.Runner | None = None):
        """`run`: how Slurm's clients are reached; the ones on this machine when None."""
        self._run = run = Client() if run is None else run
        self._table = slurmtext.NodeTable(run)

    def _ok(self, *cmd: str) -> str:
        res = self._run(list(cmd))
        if res.returncode != 0:
            raise failed(cmd, res)
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
        cmd = ["scontrol", "create", "reservation", f"reservationname={name}", f"nodes={hl}", "starttime=now",
               "duration=infinite", "flags=maint,ignore_jobs", "users=root"]
        res = self._run(cmd)
        if res.returncode != 0:
            if "uplicate" not in (res.stderr or "") + (res.stdout or ""):
                raise failed(cmd, res)
            self._ok("scontrol", "update", f"reservationname={name}", f"nodes={hl}")

    def release(self, name: str) -> None:
        """Delete the reservation; gone already is no error."""
        cmd = ["scontrol", "delete", f"reservationname={name}"]
        res = self._run(cmd)
        if res.returncode != 0 and "not found" not in ((res.stderr or "") + (res.stdout or "")).lower():
            raise failed(cmd, res)

    def reconfigure(self) -> None:
        self._ok("scontrol", "reconfigure")

    def running_jobs(self, nodes: Sequence[str]) -> list[str]:
        """The ids of the jobs running (or completing, or configuring) on any of `nodes`."""
        try:
            return [j.id for j in slurmtext.read_jobs(self._run, ("RUNNING", "COMPLETING", "CONFIGURING"), nodes)]
        except slurmtext.SlurmOutputError as exc:
            raise SlurmError(str(exc)) from None
