"""Drain or resume: the decision of one health run, as a pure function of what Slurm says about the node,
which checks failed, and how many runs in a row have passed.

Why the `gpc:` prefix carries the policy: Slurm keeps one reason per node, and it is the only mark that
survives a slurmctld restart. A reason gpucluster wrote starts with `gpc:<check>:`; anything else was
written by an operator (or by Slurm itself) and is never touched: gpucluster neither resumes such a node
nor overwrites its reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PREFIX = "gpc:"
# The active checks (the spec's health.active.checks): they run as Slurm jobs, which a drained node does not
# get, so the passive runs cannot show their fault gone and never lift their drain.
ACTIVE = ("dcgm-diag", "nccl-allreduce", "ib-bandwidth")
# Slurm stores any length, but `sinfo -R` and dashboards show the start: keep a reason short and one line.
MAX_REASON = 128


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


def decide(state: str, reason: str, failures: list[tuple[str, str]], passes: int, resume_after: int,
           resumable: Iterable[str] | None = None) -> Decision:
    """What this run does. `failures`: [(check, message)] in the configured order; `passes`: passing runs
    in a row so far of a node gpucluster drained (any failure resets it). `resumable`: the checks whose
    passing proves a drain's cause gone (this run's own); a drain by another gpucluster check (an active
    one, which cannot run on a drained node) is left for that check or an operator. None: any gpc: check."""
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
