"""`gpucluster health accept`: a repaired node goes back to production only through acceptance.

The node must be drained by gpucluster (service-required, or a triage an operator wants checked now); a node
drained by hand is refused: its reason is an operator's. Then, in this order:

1. a maintenance reservation of its own, `gpc_accept_<node>` (Flags=MAINT,IGNORE_JOBS, Users=root): once resumed,
   the node takes only the jobs submitted into it, never a user's;
2. the node's record moves to acceptance (`gpucluster-health --lifecycle acceptance`), and the node is resumed;
3. a health run on the node, now (the passive checks, with their drain on failure);
4. each single-node active check of its group (DCGM diag, NCCL all_reduce), its job script submitted into the
   reservation with `sbatch --wait`; each job reports its verdict to the node as the timer's jobs do, and a failure
   drains the node (back to triage);
5. the verdict, read from the node's state file: every check ran after the acceptance began and passed, and Slurm
   has not drained the node. Passed: the reservation is deleted and the record moves to production. Otherwise the
   reservation is deleted too and the node stays drained: by the failing check (triage), or, where a check could
   not run or nothing drained it, with `gpc:acceptance: <why>`, a reason no passing run lifts.

The commands are built here; `run` callables execute them (remote.py: over SSH, as every health command; the
emulated tests: locally). Every command is an argv list; the node's name is checked against Slurm's node table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpucluster.node import decide, nodestate

RESERVATION_PREFIX = "gpc_accept_"
SINGLE_NODE = ("dcgm-diag", "nccl-allreduce")  # ib-bandwidth needs a partner node: not part of acceptance


def reservation(node: str) -> str:
    return f"{RESERVATION_PREFIX}{node}"


def create_reservation(node: str) -> list[str]:
    return ["scontrol", "create", "reservation", f"ReservationName={reservation(node)}", f"Nodes={node}",
            "StartTime=now", "Duration=UNLIMITED", "Users=root", "Flags=MAINT,IGNORE_JOBS"]


def delete_reservation(node: str) -> list[str]:
    return ["scontrol", "delete", f"ReservationName={reservation(node)}"]


def resume(node: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={node}", "State=RESUME"]


def drain(node: str, why: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={node}", "State=DRAIN",
            f"Reason={decide.reason_for([(nodestate.ACCEPTANCE_REASON, why)])}"]


DEADLINE = "now+60minutes"  # a job that cannot end by then is removed by slurmctld: `sbatch --wait` never hangs


def submit(node: str, script: str) -> list[str]:
    return ["sbatch", "--parsable", "--wait", f"--deadline={DEADLINE}", f"--reservation={reservation(node)}",
            "-w", node, script]


def refusal(state: str, reason: str) -> str | None:
    """Why this node cannot enter acceptance (None: it can): it must be drained by gpucluster."""
    if not decide.is_drained(state):
        return f"it is not drained (Slurm: {state or '?'}): acceptance is for a node out of service"
    if decide.check_of(reason) is None:
        return "it was drained by hand: its reason is an operator's; resume it yourself, or let gpucluster's " \
               "checks drain it"
    return None


@dataclass
class Outcome:
    node: str
    passed: bool
    why: str
    checks: dict = field(default_factory=dict)  # check -> (ok, message), as the node recorded them
    steps: list[str] = field(default_factory=list)
    seconds: float = 0.0


def verdict(state_text: str, started: float, wanted: list[str], slurm_state: str) -> tuple[bool, str, dict]:
    """(passed, why, {check: (ok, message)}) from the node's state.json after the acceptance's runs: every check
    of the passive run and each of `wanted` (the active checks) recorded at or after `started`, each passed, and
    Slurm not draining the node."""
    try:
        state = json.loads(state_text)
    except ValueError:
        state = {}
    checks = state.get("checks", {}) if isinstance(state, dict) else {}
    checks = checks if isinstance(checks, dict) else {}
    seen = {n: c for n, c in checks.items() if isinstance(c, dict)}
    got = {n: (c.get("ok") is True and not c.get("not_run"), str(c.get("message", ""))[:200])
           for n, c in seen.items() if float(c.get("last", 0) or 0) >= started}
    missing = [n for n in wanted if n not in got]
    failed = [f"{n}: {m}" for n, (ok, m) in sorted(got.items()) if not ok]
    if not got:
        return False, "no check ran on the node since the acceptance began", got
    if failed:
        return False, f"failed: {'; '.join(failed)}", got
    if missing:
        return False, f"not run since the acceptance began: {', '.join(missing)}", got
    if decide.is_drained(slurm_state):
        return False, f"Slurm drained the node during the acceptance ({slurm_state})", got
    return True, f"{len(got)} checks passed: {', '.join(sorted(got))}", got


def accept(node: str, slurm: Callable, on_node: Callable, show: Callable[[], tuple[str, str]],
           program: str, scripts: list[tuple[str, str]], state_file: str, why: str) -> Outcome:
    """The acceptance of `node`. `slurm(argv)` and `on_node(argv)` run a command on the controller and on the node
    (CompletedProcess-like results); `show()` is the node's (State, Reason) in Slurm now; `program` the node's
    gpucluster-health; `scripts` [(check, job script on the controller)]; `state_file` the node's state.json.
    Raises RuntimeError where a step fails before the node was resumed (nothing changed that is not undone)."""
    t0 = time.time()
    out = Outcome(node, False, "")
    state, reason = show()
    refused = refusal(state, reason)
    if refused:
        raise ValueError(f"{node} cannot enter acceptance: {refused}")

    def step(where: Callable, argv: list[str], what: str) -> None:
        res = where(argv)
        if res.returncode != 0:
            raise RuntimeError(f"{what}: {' '.join(argv[:3])} exited {res.returncode}: "
                               f"{' '.join((res.stderr or res.stdout or '').split())[:300]}")
        out.steps.append(what)

    step(slurm, create_reservation(node), f"reservation {reservation(node)} created")
    try:
        step(on_node, [program, "--lifecycle", nodestate.ACCEPTANCE, "--why", f"repaired: {why}"],
             "record: acceptance")
        step(slurm, resume(node), "resumed into the reservation")
    except RuntimeError:
        slurm(delete_reservation(node))
        raise
    on_node([program])  # the passive checks now: a failure drains the node (triage)
    out.steps.append("passive checks run")
    for check, script in scripts:
        if decide.is_drained(show()[0]):  # a failed check drained it: no job would start there
            out.steps.append(f"{check}: not submitted, the node is drained")
            continue
        res = slurm(submit(node, script))
        out.steps.append(f"{check}: job {(res.stdout or '').strip() or '?'} ended with exit {res.returncode}")
    state, _reason = show()
    text = on_node(["cat", state_file])
    out.passed, out.why, out.checks = verdict(text.stdout if text.returncode == 0 else "", t0,
                                              [c for c, _s in scripts], state)
    slurm(delete_reservation(node))  # passed or not, the node leaves its reservation
    out.steps.append(f"reservation {reservation(node)} deleted")
    if out.passed:
        on_node([program, "--lifecycle", nodestate.PRODUCTION, "--why", f"acceptance passed: {out.why}"])
        out.steps.append("record: production")
    elif not decide.is_drained(state):
        slurm(drain(node, out.why))  # nothing drained it (a check not run): held for a person
        out.steps.append("drained: gpc:acceptance")
    out.seconds = round(time.time() - t0, 1)
    return out
