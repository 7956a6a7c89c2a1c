"""Drain or resume: the decision of one health run, as a pure function of what Slurm says about the node,
which checks failed, how many runs in a row have passed, and (for the checks of a shared or transient cause,
HYSTERESIS) how many runs in a row each has failed.

Why the `gpc:` prefix carries the policy: Slurm keeps one reason per node, and it is the only mark that
survives a slurmctld restart. A reason gpucluster wrote starts with `gpc:<check>:`; anything else was
written by an operator (or by Slurm itself) and is never touched: gpucluster neither resumes such a node
nor overwrites its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

PREFIX = "gpc:"
# The active checks (the spec's health.active.checks): they run as Slurm jobs, which a drained node does not
# get, so the passive runs cannot show their fault gone and never lift their drain.
ACTIVE = ("dcgm-diag", "nccl-allreduce", "ib-bandwidth")
# Slurm stores any length, but `sinfo -R` and dashboards show the start: keep a reason short and one line.
MAX_REASON = 128
# The checks whose failure can have a cause shared by many nodes, or gone by the next run: they drain only after
# `fail_after` (health.fail_after) failing runs in a row. Every other check (gpu-count, gpu-ecc, gpu-xid, the fabric
# checks, hca-ports, link-flap, disk-*, site checks) looks at the node's own hardware or disk and drains on the first.
# Patterns as fnmatch; why each is here, for the reader who wants to add a row.
HYSTERESIS: dict[str, str] = {
    "munge": "munged answers for the cluster's key: a munged restart or a key rotation pushed to every node fails "
             "every node's check for a run at once",
    "mount-*": "a storage server or its network: one server restart or failover fails the mount on every client at "
               "once, and draining them all would empty the cluster for a blip",
}


@dataclass(frozen=True)
class Decision:
    action: str  # "none", "drain" (also: rewrite our reason) or "resume"
    reason: str  # the reason to set (drain), or the node's current one
    passes: int  # passing runs in a row of a node gpucluster drained, after this run
    why: str  # one sentence for the log and the state file


def clean(text: str) -> str:
    """One line of printable ASCII: scontrol takes the reason as one argument, sinfo prints it as is."""
    out = "".join(ch if 32 <= ord(ch) < 127 else " " for ch in str(text))
    return " ".join(out.split())


def reason_for(failures: list[tuple[str, str]]) -> str:
    """`gpc:<first failing check>: <its message>`, plus how many others failed; at most MAX_REASON."""
    name, message = failures[0]
    more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
    head = clean(f"{PREFIX}{name}: {message}")
    if len(head) + len(more) > MAX_REASON:
        head = head[: MAX_REASON - len(more) - 3].rstrip() + "..."
    return head + more


def check_of(reason: str) -> str | None:
    """The check named in a reason gpucluster wrote (`gpc:<check>: ...`), else None."""
    if not reason.startswith(PREFIX):
        return None
    name, sep, _rest = reason[len(PREFIX):].partition(":")
    return name if sep else None


def is_drained(state: str) -> bool:
    """Slurm's node state is BASE+FLAG+...: IDLE+DRAIN (drained), MIXED+DRAIN (draining), DOWN+DRAIN."""
    return "DRAIN" in str(state).upper().split("+")


def shared_cause(check: str) -> bool:
    """Whether `check` is in HYSTERESIS (drains after fail_after failing runs in a row, not on the first)."""
    return any(fnmatchcase(check, pattern) for pattern in HYSTERESIS)


def held(failures: list[tuple[str, str]], streaks: Mapping[str, int], fail_after: int) -> list[tuple[str, int]]:
    """The failing checks this run does not drain for yet: [(check, failing runs in a row, this one included)]
    for each HYSTERESIS check that has failed fewer than fail_after runs in a row."""
    out = []
    for name, _message in failures:
        count = int(streaks.get(name, 1))
        if shared_cause(name) and count < fail_after:
            out.append((name, count))
    return out


def decide(state: str, reason: str, failures: list[tuple[str, str]], passes: int, resume_after: int,
           resumable: Iterable[str] | None = None, streaks: Mapping[str, int] | None = None,
           fail_after: int = 1) -> Decision:
    """What this run does. `failures`: [(check, message)] in the configured order; `passes`: passing runs
    in a row so far of a node gpucluster drained (any failure resets it). `resumable`: the checks whose
    passing proves a drain's cause gone (this run's own); a drain by another gpucluster check (an active
    one, which cannot run on a drained node) is left for that check or an operator. None: any gpc: check.
    `streaks`: failing runs in a row per check, this run included; a HYSTERESIS check below `fail_after` of them
    does not drain a node in service (a drained node is decided on every failure, as without streaks)."""
    holding = held(failures, streaks, fail_after) if streaks is not None and not is_drained(state) else []
    if holding:
        names = {name for name, _count in holding}
        d = decide(state, reason, [f for f in failures if f[0] not in names], passes, resume_after, resumable)
        note = "; ".join(f"{name} failed {count} of {fail_after} runs before draining" for name, count in holding)
        why = note if d.why == "all checks pass" else f"{d.why}; {note}"
        return Decision(d.action, d.reason, d.passes, why)
    drained, ours = is_drained(state), check_of(reason) is not None
    if failures:
        new = reason_for(failures)
        if not drained:
            return Decision("drain", new, 0, f"{failures[0][0]} failed")
        if not ours:
            return Decision("none", reason, 0, "drained by hand: left as the operator set it")
        if check_of(new) != check_of(reason):
            return Decision("drain", new, 0, f"still drained, now for {failures[0][0]}")
        return Decision("none", reason, 0, f"still drained for {failures[0][0]}")
    if not drained:
        return Decision("none", reason, 0, "all checks pass")
    if not ours:
        return Decision("none", reason, 0, "drained by hand: never resumed by gpucluster")
    if resumable is not None and check_of(reason) not in set(resumable):
        return Decision("none", reason, 0, f"drained by {check_of(reason)}, which this run does not repeat: "
                        "resume by hand once repaired")
    passes += 1
    if passes >= resume_after:
        return Decision("resume", reason, 0, f"all checks passed {passes} runs in a row")
    return Decision("none", reason, passes, f"all checks pass ({passes} of {resume_after} before resuming)")
