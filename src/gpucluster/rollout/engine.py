"""Run a rollout: controller-side steps first (slurmdbd, then slurmctld: Slurm's upgrade order), then the
waves of slurmd nodes, one at a time, the state saved after every step.

Per wave, by change class:
    reboot   a maintenance reservation over the wave ("gpc-ID-wN": no new job starts there, running jobs go on),
             then `scontrol reboot ASAP nextstate=RESUME reason="gpc:rollout ID"`: Slurm lets the running jobs
             finish, runs RebootProgram, and puts the node back when its slurmd registers again; the node is
             still in the reservation then, so no job lands on it before its checks pass; then the reservation
             goes. With an apply step (a driver or kernel change to install first), the wave waits under the
             reservation for its jobs to end, applies, then reboots.
    drain    drain (reason "gpc:rollout ID"), wait until no job is left, apply, check, then resume, and only
             where the node's reason is still ours
Why the reservation: nextstate=RESUME clears every DRAIN when the node registers after its reboot, a health
check's drain set during the boot included (seen on 22.05's daemons), so a drain cannot hold a rebooted node
until it is checked; a reservation can, and `scontrol reboot ASAP nextstate=RESUME` stays as Slurm documents it.
A node that fails apply or its checks stays drained, reason "gpc:rollout ID failed: ...". Once more than
`halt_share` of a wave fails, the rollout halts (exit 1) before the next wave.

Which nodes are ours: only those whose reason is this rollout's own ("gpc:rollout ID", or that followed by a
space and more: "... failed: WHY", slurmctld's " : reboot issued"). Every other reason is someone else's,
whether a person's or another gpucluster action's that also starts "gpc:" (a health check's drain
"gpc:mount-flash: ...", another rollout's, a grow's): such a node is never taken into a wave, never drained
over, never resumed and never counted done (outcome "by-hand", with the reason).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import hostlist

from gpucluster.errors import shown
from gpucluster.progress import status_line
from gpucluster.rollout import state as st
from gpucluster.rollout.slurmops import NodeState, Slurm
from gpucluster.rollout.waves import Wave

CHANGES = st.CHANGES
CONTROLLER_ORDER = st.CONTROLLER_ORDER  # slurmdbd, then slurmctld; then slurmd, wave by wave
FINAL = ("done", "failed", "by-hand")
# A hook takes the nodes and returns {node: why it failed}; nodes not named succeeded.
Hook = Callable[[Sequence[str]], dict[str, str]]


class Halted(RuntimeError):
    """The rollout stopped on purpose (too many failures in a wave, or a wait ran out); state is saved."""


def is_ours(node: NodeState, reason: str) -> bool:
    """The node's reason is `reason` (one rollout's own), alone or followed by a space and more. Starting
    with "gpc:" is not enough: a health check's drain and another rollout's start so too."""
    return node.reason == reason or node.reason.startswith(reason + " ")


def out_for_others(nodes: dict[str, NodeState]) -> list[str]:
    """The nodes a new rollout leaves alone: out of service (drained, down, failed) or rebooting, whatever the
    reason, since no reason is a new rollout's yet: a person's, a health check's "gpc:" drain, another
    rollout's. They go in no wave and take no room in one."""
    return sorted(n for n, s in nodes.items() if s.out or s.rebooting)


def new_state(rid: str, *, cluster: str, source: str, change: str, by: str, max_unavailable: int,
              waves: list[Wave], skipped: Sequence[str], halt_share: float) -> dict:
    nodes = {n: {"outcome": "pending", "wave": w.index, "detail": ""} for w in waves for n in w.nodes}
    for n in skipped:
        nodes[n] = {"outcome": "by-hand", "wave": 0, "detail": "out of service for another reason before the start"}
    return {"version": st.VERSION, "id": rid, "cluster": cluster, "source": source, "change": change, "by": by,
            "max_unavailable": max_unavailable, "halt_share": halt_share,
            "controller": dict.fromkeys(CONTROLLER_ORDER, "pending"),
            "waves": [{**w.as_json(), "status": "pending"} for w in waves], "nodes": nodes,
            "started": time.time(), "updated": time.time(), "finished": False, "halted": None}


class Rollout:
    def __init__(self, slurm: Slurm, path: Path, state: dict, *, apply: Hook | None = None,
                 check: Hook | None = None, controller: Callable[[str], None] | None = None,
                 poll: float = 2.0, wait_timeout: float = 24 * 3600.0, reboot_timeout: float = 1800.0,
                 say: Callable[[str], None] = print, live: bool | None = None):
        self.slurm, self.path, self.state = slurm, path, state
        self.apply, self.check, self.controller = apply, check, controller
        self.poll, self.wait_timeout, self.reboot_timeout = poll, wait_timeout, reboot_timeout
        self.say, self.live = say, live
        self.reason = f"gpc:rollout {state['id']}"

    # ------------------------------------------------------------------------------ bookkeeping
    def save(self) -> None:
        self.state["updated"] = time.time()
        st.save(self.path, self.state)

    def mark(self, node: str, outcome: str, detail: str = "") -> None:
        self.state["nodes"][node].update(outcome=outcome, detail=detail[:st.DETAIL_CHARS])

    def ours(self, node: NodeState) -> bool:
        return is_ours(node, self.reason)

    # ------------------------------------------------------------------------------ the run
    def run(self) -> dict:
        """Run (or continue) the rollout to its end; raises Halted when it stops on purpose."""
        self._controller_steps()
        if self.state["change"] == "reconfigure":
            self.state["finished"] = True
            self.save()
            return self.state
        waves = self.state["waves"]
        with status_line(live=self.live, every=10.0, write=self.say if self.live is False else None) as update:
            for w in waves:
                if w["status"] == "done":
                    continue
                w["status"] = "running"
                self.save()
                wave = Wave.from_json(w)
                label = f"wave {wave.index}/{len(waves)} ({', '.join(wave.units[:4])}" \
                        f"{' ...' if len(wave.units) > 4 else ''}; {len(wave.nodes)} nodes)"
                self.say(f"{label}: {self.state['change']}")
                if self.state["change"] == "reboot":
                    self._reboot_wave(wave, label, update)
                else:
                    self._drain_wave(wave, label, update)
                w["status"] = "done"
                self.save()
                failed = [n for n in wave.nodes if self.state["nodes"][n]["outcome"] == "failed"]
                self.say(f"{label}: {self._counts(wave.nodes)}")
                if len(failed) > self.state["halt_share"] * len(wave.nodes):
                    self.state["halted"] = (f"wave {wave.index}: {len(failed)} of {len(wave.nodes)} nodes failed "
                                            f"(more than {self.state['halt_share']:.0%}): "
                                            f"{hostlist.collect_hostlist(failed)}")[:st.DETAIL_CHARS]
                    self.save()
                    raise Halted(self.state["halted"])
        self.state["finished"] = True
        self.save()
        return self.state

    def _counts(self, nodes: Sequence[str]) -> str:
        counts: dict[str, int] = {}
        for n in nodes:
            o = self.state["nodes"][n]["outcome"]
            counts[o] = counts.get(o, 0) + 1
        return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))

    def _controller_steps(self) -> None:
        for daemon in CONTROLLER_ORDER:
            if self.state["controller"].get(daemon) == "done":
                continue
            if self.controller is not None:
                self.controller(daemon)
                self.say(f"{daemon}: applied")
            else:
                self.say(f"{daemon}: no controller step given; nothing applied there")
            if self.state["change"] == "reconfigure" and daemon == "slurmctld":
                self.slurm.reconfigure()
                self.say("slurmctld: scontrol reconfigure")
            self.state["controller"][daemon] = "done"
            self.save()

    def _take(self, wave: Wave) -> tuple[list[str], dict[str, NodeState]]:
        """The wave's nodes still to do, less those out of service for any reason but ours (a person's, a
        health check's "gpc:" drain, another rollout's); with the states they were read in."""
        todo = [n for n in wave.nodes if self.state["nodes"][n]["outcome"] not in FINAL]
        now = self.slurm.nodes(todo)
        active = []
        for n in todo:
            node = now.get(n)
            if node is None:
                self.mark(n, "failed", "Slurm does not know this node")
            elif node.out and not self.ours(node):
                self.mark(n, "by-hand", f"out of service: {node.reason or ','.join(sorted(node.states))}")
            else:
                active.append(n)
        self.save()
        return active, now

    def _wait(self, nodes: list[str], ready: Callable[[NodeState], bool], timeout: float, what: str,
              label: str, update: Callable[[str], None]) -> list[str]:
        """Wait until every node is ready; returns those that are. Nodes taken by hand meanwhile are marked
        and dropped; those still not ready at the timeout fail."""
        deadline = time.monotonic() + timeout
        pending = list(nodes)
        ok: list[str] = []
        while pending:
            now = self.slurm.nodes(pending)
            for n in list(pending):
                node = now.get(n)
                if node is not None and "DOWN" in node.states and not node.rebooting and \
                        "reboot" in node.reason.lower():
                    # slurmctld's "reboot timed out"; while the reboot runs the node is DOWN+REBOOT_ISSUED with
                    # "reboot issued" appended to our reason, which is no failure (seen on 22.05's daemons)
                    self.mark(n, "failed", f"{what}: {node.reason}")
                    pending.remove(n)
                elif node is not None and node.out and not self.ours(node) and not node.rebooting:
                    self.mark(n, "by-hand", f"taken out of service during the rollout: {node.reason}")
                    pending.remove(n)
                elif node is not None and ready(node):
                    ok.append(n)
                    pending.remove(n)
            update(f"{label}: {what}: {len(ok)}/{len(nodes)} ready")
            if not pending:
                break
            if time.monotonic() > deadline:
                for n in pending:
                    self.mark(n, "failed", f"{what}: not ready after {timeout:.0f} s")
                self.slurm.drain(pending, f"{self.reason} failed: {what} timed out")
                self.save()
                break
            time.sleep(self.poll)
        return ok

    def _finish(self, nodes: list[str], *, resume: bool) -> None:
        """Checks, then resume (drain class) where the reason is still ours; failures stay drained."""
        errors = self.check(nodes) if (self.check and nodes) else {}
        now = self.slurm.nodes(nodes)
        good = []
        for n in nodes:
            node = now.get(n)
            if n in errors:
                self.slurm.drain([n], f"{self.reason} failed: {errors[n][:120]}")
                self.mark(n, "failed", f"checks: {errors[n]}")
            elif node is None:
                self.mark(n, "failed", "Slurm does not know this node any more")
            elif (resume or node.out) and not self.ours(node):
                # drain class: a node we drained whose reason is no longer ours; reboot class: a node back
                # from its reboot that someone (a health check) took out of service meanwhile
                self.mark(n, "by-hand", f"reason changed during the rollout: {node.reason}")
            else:
                good.append(n)
        if resume:
            self.slurm.resume(good)
        for n in good:
            self.mark(n, "done")
        self.save()

    def _drain_wave(self, wave: Wave, label: str, update: Callable[[str], None]) -> None:
        active, now = self._take(wave)
        self.slurm.drain([n for n in active if not self.ours(now[n])], self.reason)
        for n in active:
            self.mark(n, "draining")
        self.save()
        drained = self._wait(active, lambda s: s.drained and self.ours(s), self.wait_timeout,
                             "jobs ending", label, update)
        errors = self.apply(drained) if (self.apply and drained) else {}
        for n, why in errors.items():
            self.slurm.drain([n], f"{self.reason} failed: {why[:120]}")
            self.mark(n, "failed", f"apply: {why}")
        for n in drained:
            if n not in errors:
                self.mark(n, "applied")
        self.save()
        self._finish([n for n in drained if n not in errors], resume=True)

    def _reboot_wave(self, wave: Wave, label: str, update: Callable[[str], None]) -> None:
        active, _ = self._take(wave)
        resv = f"gpc-{self.state['id']}-w{wave.index}"
        self.slurm.reserve(resv, active)
        todo = active
        if self.apply:
            fresh = [n for n in active if self.state["nodes"][n]["outcome"] not in ("applied", "rebooting")]
            for n in fresh:
                self.mark(n, "waiting")
            self.save()
            idle = self._wait(fresh, lambda s: not s.busy, self.wait_timeout, "jobs ending", label, update)
            errors = self.apply(idle) if idle else {}
            for n, why in errors.items():
                self.slurm.drain([n], f"{self.reason} failed: {why[:120]}")
                self.mark(n, "failed", f"apply: {why}")
            for n in idle:
                if n not in errors:
                    self.mark(n, "applied")
            self.save()
            todo = [n for n in active if self.state["nodes"][n]["outcome"] in ("applied", "rebooting")]
        fresh = [n for n in todo if self.state["nodes"][n]["outcome"] != "rebooting"]
        self.slurm.reboot(fresh, self.reason)
        for n in fresh:
            self.mark(n, "rebooting")
        self.save()
        back = self._wait(todo, lambda s: not s.rebooting and not s.out and "NOT_RESPONDING" not in s.states,
                          self.wait_timeout + self.reboot_timeout, "reboots", label, update)
        self._finish(back, resume=False)
        self.slurm.release(resv)  # checked nodes go back in service; failed ones stay drained


def summary(state: dict) -> list[str]:
    """Every node's outcome, grouped: one line per outcome, hostlists, with the details that differ."""
    lines = []
    by: dict[str, list[str]] = {}
    for n, rec in state["nodes"].items():
        by.setdefault(rec["outcome"], []).append(n)
    for outcome in sorted(by):
        lines.append(f"  {outcome:<10} {len(by[outcome]):>5}  {hostlist.collect_hostlist(sorted(by[outcome]))}")
        for n in sorted(by[outcome]):
            if state["nodes"][n]["detail"] and outcome != "done":
                lines.append(f"{'':19}{n}: {shown(state['nodes'][n]['detail'], 300)}")
    return lines
