"""The running jobs each change would hit (`gpucluster diff --inventory`): one `squeue` over the whole cluster,
through the Slurm clients of the host diff runs on (a controller or login node; SLURM_CONF as the environment
sets it), matched against the hosts each change touches.

A change hits a job when the job runs on a host the change touches. What that means depends on the class:
drain and reboot wait for those jobs to end (the nodes take no new job meanwhile); restart and reconfigure
classes leave them running. The controller not answering is no error of the diff: the result says so. The
queue is read as `squeue --json` (slurmtext): a job's name is data, whatever it holds (a newline, `|`)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import hostlist

from gpucluster import slurmtext
from gpucluster.slurmclient import Client, SlurmError

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]
STATES = "RUNNING,COMPLETING,CONFIGURING,SUSPENDED"


@dataclass(frozen=True)
class Job:
    id: str
    user: str
    name: str
    nodes: frozenset[str]
    nodelist: str

    def as_json(self) -> dict:
        return {"id": self.id, "user": self.user, "name": self.name, "nodes": self.nodelist}


LOCAL = Client(timeout=60)  # the Slurm clients on this machine, through the one Slurm client


def running_jobs(run: Runner = LOCAL) -> tuple[list[Job] | None, str | None]:
    """(jobs, None) when the controller answered; (None, why) when it did not."""
    try:
        found = slurmtext.read_jobs(run, STATES.split(","))
    except SlurmError as exc:
        return None, str(exc)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"squeue: {exc}"
    except slurmtext.SlurmOutputError as exc:
        return None, str(exc)
    return [Job(j.id, j.user, j.name, j.nodes, j.nodelist) for j in found], None


def touched(hosts: Sequence[str]) -> frozenset[str]:
    """A change's hosts (node-group hostlist expressions, or single hosts) as single names."""
    out: set[str] = set()
    for h in hosts:
        try:
            out.update(hostlist.expand_hostlist(h))
        except hostlist.BadHostlist:
            out.add(h)
    return frozenset(out)


def hit(hosts: Sequence[str], jobs: Sequence[Job]) -> list[Job]:
    mine = touched(hosts)
    return [j for j in jobs if j.nodes & mine]
