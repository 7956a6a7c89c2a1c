"""The operator's rollout actions, each one function (`gpucluster rollout` parses, calls one, prints):

    target(path)        what a rollout acts on: an INVENTORY (Slurm reached over SSH, converges through it) or
                        a SPEC (the Slurm clients of this machine, the operator's commands)
    plan(target)        the waves, touching nothing (--dry-run)
    start(target)       a new rollout: the state file written, the waves run
    resume(target)      the last rollout, continued from its state file
    status(target)      where the last rollout stands (its state file, checked)
    resize_to(target)   grow or shrink to a new spec's node counts (resize.py)

They own the spec loading (one load_cluster per target), the wave planning, the state file and the choice of
hooks (the operator's commands, else the inventory's converge and checks, live.py). A failure Slurm reports is
an OperationError (exit 1) naming what to do; bad input a UsageError (exit 2)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpucluster.cluster import Cluster, load_cluster
from gpucluster.errors import OperationError, UsageError
from gpucluster.paths import state_dir as state_folder
from gpucluster.rollout import engine, hooks, slurmops, state
from gpucluster.rollout.waves import Wave, WaveError, parse_max_unavailable, plan_waves, topology_units
from gpucluster.slurmclient import SlurmError

Say = Callable[[str], None]


@dataclass
class Target:
    """A cluster a rollout acts on: its Cluster (one load), and with an inventory its path, the loaded inventory,
    the inventory's state folder and the hooks that converge and check through it (rollout/live.py)."""

    cluster: Cluster
    name: str  # the target as the operator gave it: errors name it so
    inventory: Path | None = None
    inv: object | None = None  # inventory.reader.Inventory
    state_dir: str | None = None
    live: object | None = None  # live.LiveCluster

    def slurm(self) -> slurmops.Slurm:
        """Slurm's clients: on the inventory's first controller, else on this machine."""
        return self.live.slurm() if self.live else slurmops.Slurm()

    def folder(self, given: str | os.PathLike | None) -> Path:
        """The cluster's state folder: `given`, else the inventory's, else the operator's default."""
        return state_folder(self.cluster.name, given or self.state_dir)


@dataclass
class WavePlan:
    """The waves a rollout would run now (--dry-run), before the nodes out of service are known."""

    cluster: str
    change: str
    by: str
    max_unavailable: int
    nodes: int
    waves: list[Wave]

    def as_json(self) -> dict:
        return {"cluster": self.cluster, "change": self.change, "by": self.by, "max_unavailable": self.max_unavailable,
                "nodes": self.nodes, "waves": [w.as_json() for w in self.waves]}

    def lines(self) -> list[str]:
        return [f"{self.cluster}: {self.change} in {len(self.waves)} waves by {self.by}, at most "
                f"{self.max_unavailable} of {self.nodes} nodes out at once (nodes drained by hand are left out when "
                "the rollout starts, and units running jobs then go last)",
                *(f"  wave {w.index:>3}: {len(w.nodes):>4} nodes  {', '.join(w.units)}" for w in self.waves)]


@dataclass
class Outcome:
    """Where a rollout stands after start, resume or status: its state and its file; `halted` says why it
    stopped on purpose (exit 1), `already_finished` that a resume found nothing to do."""

    state: dict
    path: Path
    halted: str | None = None
    already_finished: bool = False

    def lines(self) -> list[str]:
        """The text form of --status."""
        s = self.state
        done = sum(1 for w in s["waves"] if w["status"] == "done")
        where = "finished" if s.get("finished") else f"halted: {s['halted']}" if s.get("halted") else "under way"
        out = [f"rollout {s['id']} ({s['change']} by {s['by']}, at most {s['max_unavailable']} out): {where}; "
               f"{done}/{len(s['waves'])} waves done; controller: "
               f"{', '.join(f'{k} {v}' for k, v in s['controller'].items())}  [{self.path}]"]
        running = [w for w in s["waves"] if w["status"] == "running"]
        if running:
            out.append(f"  wave {running[0]['index']} in progress: {', '.join(running[0]['units'])}")
        return out + engine.summary(s)

    def as_json(self) -> dict:
        return {"state_file": str(self.path), **self.state}


@dataclass
class ResizeOutcome:
    """A resize's plan, the new nodes that stay drained ({node: why}), and why it halted, if it did."""

    plan: object  # resize.Resize
    errors: dict[str, str]
    halted: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors and not self.halted


def target(path: str | os.PathLike, *, secrets: str | None = None, tags: str | None = None,
           say: Say = print) -> Target:
    """The cluster of an inventory folder (or its hosts.yml), whose all.vars.gpucluster_spec names the spec, or
    of a spec file. `secrets` and `tags` go to the inventory's converges (as configure's), so only with one."""
    p = Path(path)
    if p.is_dir() or p.name in ("hosts.yml", "hosts.yaml"):
        from gpucluster.inventory.reader import load_inventory
        from gpucluster.rollout.live import LiveCluster

        inv = load_inventory(p)
        spec = inv.vars.get("gpucluster_spec")
        if not spec or not Path(spec).is_file():
            raise UsageError(f"{inv.path}: all.vars.gpucluster_spec is {spec or 'missing'}, not a spec file here; "
                             "rewrite the inventory with `gpucluster inventory SPEC`, or give the SPEC")
        cluster = load_cluster(spec)
        if secrets and not Path(secrets).is_file():
            raise UsageError(f"--secrets {secrets}: no such file; write one with `gpucluster secrets --generate -o "
                             "FILE`, or leave it out to use the cluster's own")
        live = LiveCluster(p, inv, secrets=secrets, tags=tags, health=cluster.spec.health.enabled, say=say)
        return Target(cluster, str(path), p, inv, inv.vars.get("gpucluster_state_dir"), live)
    if not p.is_file():
        raise UsageError(f"{path}: no such inventory folder or spec file; give one (e.g. inventories/prod)")
    cluster = load_cluster(p)
    for flag, value in (("secrets", secrets), ("tags", tags)):
        if value:
            raise UsageError(f"--{flag}: only with an INVENTORY (the rollout converges through it)")
    return Target(cluster, str(path))


def _target(where: Target | str | os.PathLike) -> Target:
    return where if isinstance(where, Target) else target(where)


def _units(t: Target, by: str, max_unavailable: str | None) -> tuple[list, list[str], int]:
    """(topology units, compute hosts, the cap on nodes out at once); a bad --by or cap is a UsageError."""
    hosts = t.cluster.contract_groups["slurm_compute"]
    try:
        units = topology_units(t.cluster.plan, by, hosts)
        largest = max((len(n) for _, n in units), default=1)
        return units, hosts, parse_max_unavailable(max_unavailable, len(hosts), largest)
    except WaveError as exc:
        raise UsageError(f"{t.name}: {exc}") from None


def plan(where: Target | str | os.PathLike, *, change: str = "reboot", by: str = "leaf",
         max_unavailable: str | None = None) -> WavePlan:
    """The waves of a rollout, from the plan alone (nothing is read from Slurm, nothing written)."""
    t = _target(where)
    units, hosts, cap = _units(t, by, max_unavailable)
    try:
        waves = plan_waves(units, cap, by=by)
    except WaveError as exc:
        raise UsageError(f"{t.name}: {exc}") from None
    return WavePlan(t.cluster.name, change, by, cap, len(hosts), waves)


def _load(path: Path, cluster: str) -> dict:
    """The state file, checked (state.load), and of this cluster."""
    s = state.load(path)
    if s["cluster"] != cluster:
        raise UsageError(f"{path}: cluster: the rollout of '{s['cluster']}', not of '{cluster}'; give that "
                         "cluster's inventory or spec, or this cluster's --state-dir")
    return s


def status(where: Target | str | os.PathLike, *, state_dir: str | os.PathLike | None = None) -> Outcome:
    """The last rollout of this cluster, from its state file (read only)."""
    t = _target(where)
    path = t.folder(state_dir) / state.NAME
    return Outcome(_load(path, t.cluster.name), path)


def _busy_last(units: list, nodes: dict) -> list:
    """Units with a job running on any of their nodes go last (stable): the idle ones are rolled while those jobs
    run, and a wave that must wait for a job waits as late as it can."""
    return sorted(units, key=lambda u: any(nodes[n].busy for n in u[1] if n in nodes))


def _hooks(t: Target, change: str, apply_command: str | None, check_command: str | None):
    """(apply, check): the operator's commands, else the inventory's converge (drain and reboot classes) and
    checks, else none."""
    live = t.live
    apply = (hooks.command_hook(apply_command, "--apply-command") if apply_command
             else live.apply if live and change in ("drain", "reboot") else None)
    check = (hooks.command_hook(check_command, "--check-command") if check_command
             else live.check if live else None)
    return apply, check


def _run(t: Target, slurm, path: Path, s: dict, *, apply_command: str | None, check_command: str | None,
         poll: float, say: Say) -> Outcome:
    apply, check = _hooks(t, s["change"], apply_command, check_command)
    run = engine.Rollout(slurm, path, s, apply=apply, check=check,
                         controller=t.live.controller if t.live else None, poll=poll, say=say)
    try:
        run.run()
    except engine.Halted as exc:
        return Outcome(run.state, path, halted=str(exc))
    except SlurmError as exc:
        raise OperationError(f"{exc} (state kept in {path}: --resume continues)") from None
    return Outcome(run.state, path)


def start(where: Target | str | os.PathLike, *, change: str = "reboot", by: str = "leaf",
          max_unavailable: str | None = None, halt_share: float = 0.1, apply_command: str | None = None,
          check_command: str | None = None, state_dir: str | os.PathLike | None = None, poll: float = 5.0,
          say: Say = print) -> Outcome:
    """A new rollout of `change` in waves of `by` units, at most `max_unavailable` nodes out at once (N or P%);
    it halts once more than `halt_share` (0-1) of a wave fails. Nodes out of service when it starts are left
    alone; units running jobs go last. Refused while the last rollout of this cluster is unfinished."""
    t = _target(where)
    units, hosts, cap = _units(t, by, max_unavailable)
    path = state.state_path(t.folder(state_dir))
    if os.path.lexists(path):  # a link, even a dangling one, is refused by load, never written through
        old = state.load(path)
        if not old["finished"]:
            raise UsageError(f"{path}: rollout {old['id']} is not finished; continue it with --resume, see "
                             "it with --status, or move the file aside to abandon it")
    try:
        slurm = t.slurm()
        now = slurm.nodes(hosts)
    except SlurmError as exc:
        raise OperationError(str(exc)) from None
    skip = engine.out_for_others(now)
    try:
        waves = plan_waves(_busy_last(units, now), cap, by=by, skip=set(skip))
    except WaveError as exc:
        raise UsageError(f"{t.name}: {exc}") from None
    rid = f"{t.cluster.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    s = engine.new_state(rid, cluster=t.cluster.name, source=str(t.cluster.source), change=change, by=by,
                         max_unavailable=cap, waves=waves, skipped=skip, halt_share=halt_share)
    state.save(path, s)
    say(f"rollout {rid}: {change} on {len(hosts) - len(skip)} nodes in {len(waves)} waves by {by}, at most {cap} "
        f"out at once; {len(skip)} out of service for other reasons left alone; state in {path}")
    return _run(t, slurm, path, s, apply_command=apply_command, check_command=check_command, poll=poll, say=say)


def resume(where: Target | str | os.PathLike, *, by: str = "leaf", max_unavailable: str | None = None,
           apply_command: str | None = None, check_command: str | None = None,
           state_dir: str | os.PathLike | None = None, poll: float = 5.0, say: Say = print) -> Outcome:
    """The last rollout, continued where its state file says (its change, waves and cap are the file's; `by` and
    `max_unavailable` are checked as for a start). The folder is read, never created."""
    t = _target(where)
    _units(t, by, max_unavailable)
    path = t.folder(state_dir) / state.NAME
    s = _load(path, t.cluster.name)
    try:
        slurm = t.slurm()
    except SlurmError as exc:
        raise OperationError(str(exc)) from None
    if s.get("finished"):
        return Outcome(s, path, already_finished=True)
    s["halted"] = None
    return _run(t, slurm, path, s, apply_command=apply_command, check_command=check_command, poll=poll, say=say)


def resize_to(where: Target | str | os.PathLike, new_spec: str | os.PathLike, *, dry_run: bool = False,
              poll: float = 5.0, say: Say = print, show: Say = print) -> ResizeOutcome:
    """Grow or shrink to the node counts of `new_spec` (rollout/resize.py). With an inventory written from
    `new_spec` (the new hosts enrolled) the cluster is changed: the old node list is the one slurmctld has, the
    new one the spec's, and the steps run through the inventory (rollout/live.py). Otherwise, `dry_run` only: the
    plan between two specs. `show` gets the plan's lines before anything changes."""
    from gpucluster import slurmkeys
    from gpucluster.rollout import resize

    t = _target(where)
    cluster, live = t.cluster, t.live
    if not Path(new_spec).is_file():
        raise UsageError(f"--resize {new_spec}: no such spec file; give the spec with the new node counts")
    new = load_cluster(new_spec)
    if new.name != cluster.name:
        raise UsageError(f"--resize {new_spec}: cluster '{new.name}', not '{cluster.name}'; give the same "
                         "cluster's spec with the node counts changed")
    enrolled = live is not None and Path(cluster.source).resolve() == Path(new_spec).resolve()
    if not enrolled and not dry_run:
        raise UsageError(f"--resize {new_spec}: the inventory must be written from this spec first, so the new "
                         "hosts are enrolled and the leaving ones are not: `gpucluster inventory NEW_SPEC -o "
                         "INVENTORY ...` (or `stage up NEW_SPEC`), then `gpucluster rollout INVENTORY --resize "
                         "NEW_SPEC`; with a SPEC, --dry-run prints the plan")
    errors: dict[str, str] = {}
    plan_: resize.Resize | None = None
    try:
        slurm = live.slurm() if enrolled else None
        if enrolled:
            was = set(slurm.nodes())
            now = new.contract_groups["slurm_compute"]
            version = str(new.spec.slurm.version)
            how = "reconfigure" if slurmkeys.change_class("NodeName", version) == "reconfigure" else "restart"
            plan_ = resize.Resize(tuple(h for h in now if h not in was), tuple(sorted(was - set(now))),
                                  tuple(h for h in now if h in was), version, how)
        else:
            plan_ = resize.plan_resize(cluster, new)
        show(f"{cluster.name}: {len(plan_.added)} nodes added, {len(plan_.removed)} removed, {len(plan_.kept)} "
             f"kept; Slurm {plan_.version} learns a node list by {plan_.how}")
        for i, step in enumerate(plan_.steps(), 1):
            show(f"  {i}. {step}")
        if dry_run or not (plan_.added or plan_.removed):
            return ResizeOutcome(plan_, {})
        from gpucluster.rollout.live import LiveController

        rid = f"{cluster.name}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        ctl = LiveController(live)
        resize.shrink(plan_, ctl, slurm, rid, poll=poll, say=say)
        errors = resize.grow(plan_, ctl, slurm, rid, check=live.check, say=say)
    except engine.Halted as exc:
        return ResizeOutcome(plan_, {}, halted=str(exc))
    except SlurmError as exc:
        raise OperationError(f"{exc}; the nodes keep their gpc: reasons: fix it, then run the same command again") \
            from None
    return ResizeOutcome(plan_, errors)
