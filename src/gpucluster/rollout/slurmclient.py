"""The rollout's view of Slurm: scontrol, squeue and sinfo through one `run` function, so the same class
drives a real cluster (the clients on a controller or login node) and the emulator (its clients and
SLURM_CONF). Only what a rollout needs: node states and reasons, drain, resume, reboot, reconfigure."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import hostlist

from gpucluster import slurmtext

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]
OURS = "gpc:"  # every reason gpucluster writes starts so; any other reason is a person's (or another tool's)
_STAMP = re.compile(r"\s*\[[^\]@]*@[^\]]*\]\s*$")  # scontrol appends " [user@time]" to a reason
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


@dataclass(frozen=True)
class NodeState:
    name: str
    states: frozenset[str]
    reason: str  # without scontrol's " [user@time]" stamp; "" when none

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
    def rebooting(self) -> bool:
        return bool(self.states & REBOOTING)


def parse_nodes(text: str) -> dict[str, NodeState]:
    """`scontrol show node -o` -> name -> NodeState (State=IDLE+DRAIN, Reason=... [user@time])."""
    out = {}
    for line in text.splitlines():
        if line.startswith("NodeName="):
            raw = slurmtext.record(line)
            state = raw.get("State", "")
            reason = _STAMP.sub("", raw.get("Reason", "")).strip()
            out[raw["NodeName"]] = NodeState(raw["NodeName"], frozenset(filter(None, state.split("+"))),
                                             "" if reason in ("(null)", "None") else reason)
    return out


class Slurm:
    def __init__(self, run: Runner = local_runner):
        self._run = run

    def _ok(self, *cmd: str) -> str:
        res = self._run(list(cmd))
        if res.returncode != 0:
            raise SlurmError(f"{' '.join(cmd)} failed ({res.returncode}): {(res.stderr or '').strip()[-400:]}")
        return res.stdout or ""

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, NodeState]:
        found = parse_nodes(self._ok("scontrol", "show", "node", "-o"))
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

    def reconfigure(self) -> None:
        self._ok("scontrol", "reconfigure")

    def running_jobs(self, nodes: Sequence[str]) -> list[str]:
        if not nodes:
            return []
        out = self._ok("squeue", "-h", "-t", "RUNNING,COMPLETING,CONFIGURING", "-w",
                       hostlist.collect_hostlist(list(nodes)), "-o", "%i")
        return out.split()
