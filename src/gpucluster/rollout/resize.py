"""Grow and shrink a running cluster (docs/operations.md, "Growing and shrinking").

The plan is pure: the compute hosts the new spec adds and removes, and how the release in the new spec takes
a change of its node list (gpucluster.slurmkeys, NodeName: 22.05 and 23.02 need slurmctld and every slurmd
restarted; from 23.11 `scontrol reconfigure` adds and removes nodes, slurm.conf(5) and scontrol(1)).

The steps, each through a `Controller` (the emulator's daemons in tests; a real cluster's converge):

grow    1. the new hosts are enrolled (the caller: `gpucluster inventory NEW_SPEC`, or the Pulumi stack)
        2. the new config goes to the controller; Slurm learns the nodes (restart, or reconfigure)
        3. before any new slurmd runs, the new nodes are drained, reason "gpc:grow ID": they stay out of
           service while they are configured and checked, and a job never lands on a half-built node
        4. their slurmd starts (the converge of those hosts); the checks run; only then are they resumed.
           A node that fails its checks stays drained with a "gpc:grow ID failed: ..." reason.
shrink  1. the leaving nodes are drained, reason "gpc:shrink ID"
        2. wait until no job is left on them; a node that still runs a job is never removed: at the
           timeout the shrink stops (Halted), the nodes stay drained, nothing is removed
        3. their slurmd stops, and the config without them goes to the controller (restart, or reconfigure)

Running jobs on the other nodes keep running throughout: slurmctld saves and recovers them across its
restart, and a slurmd restart leaves job steps running (slurmctld(8), slurmd(8)).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import hostlist

from gpucluster import slurmkeys
from gpucluster.cluster import Cluster
from gpucluster.rollout.engine import Halted, is_ours
from gpucluster.rollout.slurmops import Slurm


@dataclass(frozen=True)
class Resize:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    version: str
    how: str  # "restart" (slurmctld, then every slurmd) or "reconfigure"

    def steps(self) -> list[str]:
        learn = ("restart slurmctld, then slurmd on every node (the release reads its node list at start)"
                 if self.how != "reconfigure" else "scontrol reconfigure (23.11+: adds and removes nodes)")
        out = []
        if self.removed:
            out += [f"drain {hostlist.collect_hostlist(list(self.removed))} (reason gpc:shrink ID)",
                    "wait until no job is left on them (a node with a running job is never removed)",
                    "stop their slurmd", f"install the config without them; {learn}"]
        if self.added:
            out += [f"enroll {hostlist.collect_hostlist(list(self.added))} (inventory or Pulumi stack)",
                    f"install the config with them; {learn}",
                    "drain them at once (reason gpc:grow ID): out of service until checked",
                    "configure them (start their slurmd), run their checks", "resume those that pass"]
        return out


def plan_resize(old: Cluster, new: Cluster) -> Resize:
    was, now = old.contract_groups["slurm_compute"], new.contract_groups["slurm_compute"]
    version = str(new.spec.slurm.version)
    how = slurmkeys.change_class("NodeName", version)
    return Resize(tuple(h for h in now if h not in set(was)), tuple(h for h in was if h not in set(now)),
                  tuple(h for h in now if h in set(was)), version, "reconfigure" if how == "reconfigure" else "restart")


class Controller(Protocol):
    """What a resize does to the daemons; the emulator's SlurmCluster has these, a real cluster's converge too."""

    def load_config(self, nodes: Sequence[str]) -> None: ...  # the new config on the controller (and nodes)
    def restart_slurmctld(self) -> None: ...
    def restart_slurmd(self, nodes: Sequence[str]) -> None: ...
    def start_slurmd(self, nodes: Sequence[str]) -> None: ...
    def stop_slurmd(self, nodes: Sequence[str]) -> None: ...


def _learn(resize: Resize, ctl: Controller, slurm: Slurm, running: Sequence[str]) -> None:
    if resize.how == "reconfigure":
        slurm.reconfigure()
    else:
        ctl.restart_slurmctld()
        if running:
            ctl.restart_slurmd(running)


def shrink(resize: Resize, ctl: Controller, slurm: Slurm, rid: str, *, poll: float = 1.0,
           timeout: float = 3600.0, say: Callable[[str], None] = print) -> None:
    """Drain, wait for the jobs, then remove; raises Halted (nothing removed) if a job outlives `timeout`."""
    gone = list(resize.removed)
    if not gone:
        return
    reason = f"gpc:shrink {rid}"
    slurm.drain(gone, reason)
    say(f"shrink: drained {hostlist.collect_hostlist(gone)}; waiting for their jobs")
    deadline = time.monotonic() + timeout
    while True:
        now = slurm.nodes(gone)
        busy = [n for n in gone if n in now and not now[n].drained]
        if not busy:
            break
        if time.monotonic() > deadline:
            raise Halted(f"shrink {rid}: {hostlist.collect_hostlist(busy)} still run jobs after {timeout:.0f} s; "
                         "nothing removed, the nodes stay drained")
        time.sleep(poll)
    ctl.stop_slurmd(gone)
    ctl.load_config(list(resize.kept) + list(resize.added))
    _learn(resize, ctl, slurm, resize.kept)
    say(f"shrink: removed {hostlist.collect_hostlist(gone)} ({resize.how})")


def grow(resize: Resize, ctl: Controller, slurm: Slurm, rid: str, *,
         check: Callable[[Sequence[str]], dict[str, str]] | None = None,
         say: Callable[[str], None] = print) -> dict[str, str]:
    """Add the new nodes out of service, bring them up, check them, resume those that pass.
    Returns {node: why} for the nodes that failed their checks (left drained)."""
    new = list(resize.added)
    if not new:
        return {}
    reason = f"gpc:grow {rid}"
    ctl.load_config(list(resize.kept) + new)
    _learn(resize, ctl, slurm, resize.kept)
    slurm.drain(new, reason)  # before any of their slurmd runs: no job can land on them
    say(f"grow: Slurm knows {hostlist.collect_hostlist(new)} ({resize.how}); drained until checked")
    ctl.start_slurmd(new)
    errors = check(new) if check else {}
    for n, why in errors.items():
        slurm.drain([n], f"{reason} failed: {why[:120]}")
    good = [n for n in new if n not in errors]
    now = slurm.nodes(good)
    mine = [n for n in good if n in now and is_ours(now[n], reason)]  # this grow's reason, no other gpc: one
    slurm.resume(mine)
    say(f"grow: {len(mine)} of {len(new)} new nodes in service")
    return errors
