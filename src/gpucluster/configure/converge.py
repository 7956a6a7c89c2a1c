"""Converge a cluster: the one entry of `gpucluster configure` (the command parses, calls `converge`, prints).

`converge` decides how the hosts are reached, then runs it:

    push    Ansible on this machine reaches every host (configure.playbook.configure)
    pull    each fleet node fetches the compiled bundle and converges itself (configure.pull.pull); the Slurm
            controller and slurmdbd hosts never pull
    auto    pull from PULL_ABOVE fleet hosts up, and then the hosts that never pull converge by push first;
            push below it (docs/roles.md, "Converging a fleet")

The inventory is read once here for the choice (auto); playbook.configure and pull.pull each read it again
for their own run."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gpucluster.errors import UsageError

MODES = ("auto", "push", "pull")
WAIT = 1800.0  # seconds --trigger timer waits for every node's result, by default
Log = Callable[[str], None]


@dataclass
class ConvergeResult:
    """What a converge did: `push` is the push run (the whole push, or in auto the controllers' before the
    pull), `pull` the fleet's pull, when there was one."""

    mode: str  # "push" or "pull": how the fleet converged
    push: object | None = None  # playbook.ConfigureResult
    pull: object | None = None  # pull.PullResult

    @property
    def ok(self) -> bool:
        return (self.push is None or self.push.ok) and (self.pull is None or self.pull.ok)

    def summary(self) -> str:
        """The end-of-run report (of the pull, when there was one: the controllers' push was logged)."""
        if self.pull is not None:
            from gpucluster.configure.pull import summary

            return summary(self.pull)
        from gpucluster.configure.playbook import summary

        return summary(self.push)

    def as_json(self) -> dict:
        """configure --json's document: a push's result, or a pull's per host results."""
        if self.pull is None:
            r = self.push
            return {"ok": r.ok, "failed_hosts": r.failed_hosts, **vars(r)}
        r = self.pull
        return {"ok": self.ok, "bundle": r.bundle, "serial": r.serial, "push_hosts": r.push_hosts,
                "seconds": round(r.elapsed, 3), "hosts": {h: asdict(x) for h, x in r.hosts.items()}}


def _pulls(inventory: str | os.PathLike, limit: str | None) -> tuple[bool, list[str]]:
    """auto's choice, from one read of the inventory: (pull?, the hosts that converge by push first)."""
    from gpucluster.configure.pull import PULL_ABOVE, fleet
    from gpucluster.inventory.reader import inventory_file, load_inventory

    pull_hosts, push_hosts = fleet(load_inventory(inventory_file(inventory)), limit)
    return len(pull_hosts) >= PULL_ABOVE, push_hosts


def converge(inventory: str | os.PathLike, *, mode: str = "auto", playbook: str = "site.yml",
             limit: str | None = None, tags: str | None = None, project: str | os.PathLike | None = None,
             secrets: str | os.PathLike | None = None, check: bool = False, diff: bool = False,
             batch: int | None = None, state_dir: str | os.PathLike | None = None, rotate: str | None = None,
             verbose: bool = False, full: bool = False, concurrency: int = 64, trigger: str = "ssh",
             wait: float = WAIT, log: Log = print, live: bool | None = None) -> ConvergeResult:
    """Converge the hosts of `inventory` (`limit` selects) by `mode`; never raises for host failures. The
    options are configure's (playbook.configure) and, for a pull, pull's (`full`, `concurrency`, `trigger`,
    `wait`); a pull-only option with a push is a UsageError. In auto, the controllers' push summary is logged
    before the pull starts."""
    from gpucluster.configure.playbook import configure

    if mode not in MODES:
        raise UsageError(f"converge mode {mode!r}: give one of {', '.join(MODES)}")
    push_first: list[str] | None = None
    if mode == "auto":
        pulls, push_hosts = _pulls(inventory, limit)
        mode, push_first = ("pull", push_hosts) if pulls else ("push", None)
    if mode == "push":
        if full:
            raise UsageError("configure --full: only a pull skips the roles on a verified node, so --full goes with "
                             "--pull (a push always runs every role)")
        if trigger != "ssh" or wait != WAIT:
            raise UsageError("configure --trigger and --wait go with --pull: a push reaches every host over ssh "
                             "itself")
        return ConvergeResult("push", push=configure(
            inventory, playbook=playbook, limit=limit, tags=tags, project=project, secrets=secrets, check=check,
            diff=diff, batch=batch, state_dir=state_dir, rotate=rotate, verbose=verbose, log=log, live=live))
    from gpucluster.configure.pull import pull

    pushed = None
    if push_first is not None:  # auto chose pull: the hosts that never pull converge by push first
        from gpucluster.configure.playbook import summary

        pushed = configure(inventory, playbook=playbook, limit=",".join(push_first), tags=tags, project=project,
                           secrets=secrets, check=check, diff=diff, state_dir=state_dir, rotate=rotate,
                           verbose=verbose, log=log, live=live)
        log(summary(pushed))
    values = None
    if secrets:
        from gpucluster.configure.secrets import checked_secrets

        values, _raw = checked_secrets(secrets)
    result = pull(inventory, limit=limit, tags=tags, check=check, diff=diff, full=full, secrets=values,
                  state_dir=state_dir, project=project, concurrency=concurrency, trigger=trigger, wait=wait, log=log)
    return ConvergeResult("pull", push=pushed, pull=result)
