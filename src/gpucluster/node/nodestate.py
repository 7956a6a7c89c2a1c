"""A node's lifecycle, and its record: each state it passed through, when, why, and the evidence.

    production -> triage            a check failed: the node is drained (resumed once its checks pass again)
    production -> rebooting         a GPU error asked for a reboot (scontrol reboot ASAP nextstate=RESUME)
    rebooting  -> production        the node booted, its checks ran, slurmctld resumed it
    triage     -> production        resume_after passing runs in a row
    any        -> service-required  the GPU error ladder says a repair (xid.py: service), a second reboot-class
                                    fault within REBOOT_AGAIN_AFTER_S of the last reboot, or the node entered
                                    triage `triages` times within the window: a person repairs it
    service-required -> acceptance  an operator says it is repaired (`gpucluster health accept`): the node runs
                                    the active checks inside a maintenance reservation of its own
    acceptance -> production        every acceptance check passed; the reservation is deleted
    acceptance -> triage            an acceptance check failed (its job's report drained the node)

The state is read from Slurm first, the record second. Slurm keeps one reason per node and it survives a slurmctld
restart, so the reason carries the state: `gpc:service: ...` is service-required, `gpc:<check>: ...` with a
reboot pending is rebooting, any other `gpc:` drain is triage. Acceptance has no reason (its node is resumed into
a MAINT reservation); it is the record's state while Slurm shows the node MAINT. A node drained by hand is none of
these: the record keeps its last state and says so; gpucluster never acts on it.

The record lives in the node's state.json (`lifecycle`), written by the runner under its lock; `gpucluster health
status` reads it. Standard library only, like every file beside it.
"""

from __future__ import annotations

try:
    from . import decide, slurmctl
except ImportError:  # run as a script on a node: the files sit side by side
    import decide
    import slurmctl

PRODUCTION, TRIAGE, REBOOTING, SERVICE, ACCEPTANCE = (
    "production", "triage", "rebooting", "service-required", "acceptance")
STATES = (PRODUCTION, TRIAGE, REBOOTING, SERVICE, ACCEPTANCE)
# The reason names (gpc:<name>: ...) of the states a reason carries and no check's pass may lift.
SERVICE_REASON = "service"
ACCEPTANCE_REASON = "acceptance"
HELD = frozenset((SERVICE_REASON, ACCEPTANCE_REASON))
# The controller's domain guard (domainguard.py) drains a degraded NVLink domain's healthy trays with
# gpc:domain:<domain> and resumes them with the domain: not the tray's fault, so no lifecycle state, and no pass of
# the tray lifts it.
DOMAIN_REASON = "domain"
HISTORY = 40  # transitions kept in the record (the most recent)
EVIDENCE_CHARS = 300  # of one check's message kept as evidence
# Defaults of the spec's health.lifecycle (render/health/config.py writes the node's values).
TRIAGES = 3
WINDOW_S = 7 * 86400


def current(slurm_state: str, reason: str, before: str | None = None) -> str | None:
    """The lifecycle state Slurm shows; None for a node drained or downed by hand (not gpucluster's to move).
    `before`: the record's state, which alone tells acceptance (a MAINT node gpucluster resumed for it)."""
    by = decide.check_of(reason)
    words = str(slurm_state).upper().split("+")
    if by is not None and slurmctl.rebooting(slurm_state):
        return REBOOTING
    if by == DOMAIN_REASON and decide.is_drained(slurm_state):
        return None  # drained with its domain, not for a fault of its own: the record keeps its state
    if by == SERVICE_REASON:
        return SERVICE
    if by is not None and decide.is_drained(slurm_state):
        return TRIAGE
    if decide.is_drained(slurm_state) or "DOWN" in words or "FAIL" in words:
        return None
    if before == ACCEPTANCE and "MAINT" in words:
        return ACCEPTANCE
    return PRODUCTION


def load(record) -> dict:
    """The record as state.json holds it, checked: {"state", "since", "history", "triages"} (a hand-edited or older
    file gives what it can)."""
    record = record if isinstance(record, dict) else {}
    state = record.get("state") if record.get("state") in STATES else None
    since = record.get("since") if isinstance(record.get("since"), (int, float)) else None
    history = [h for h in record.get("history", []) if isinstance(h, dict)] if isinstance(
        record.get("history"), list) else []
    triages = [t for t in record.get("triages", []) if isinstance(t, (int, float))] if isinstance(
        record.get("triages"), list) else []
    return {"state": state, "since": since, "history": history[-HISTORY:], "triages": triages}


def triages_within(record: dict, now: float, window_s: float) -> list[float]:
    """When the node entered triage (or a reboot for a fault) within the window before `now`."""
    return [t for t in load(record)["triages"] if 0 <= now - t < window_s]


def entering(before: str | None, after: str | None) -> bool:
    """Whether this move is a new fault: from production or acceptance to triage, rebooting or service-required."""
    return before in (None, PRODUCTION, ACCEPTANCE) and after in (TRIAGE, REBOOTING, SERVICE)


def evidence(checks: dict) -> dict:
    """What a transition keeps as evidence: each failing check's message, and the GPU errors gpu-xid read (the
    table's words, the XID number, the device: never a raw log line)."""
    out: dict = {}
    failing = {name: str(c.get("message", ""))[:EVIDENCE_CHARS] for name, c in checks.items()
               if isinstance(c, dict) and c.get("ok") is False}
    if failing:
        out["failed"] = failing
    data = checks.get("gpu-xid", {}).get("data") if isinstance(checks.get("gpu-xid"), dict) else None
    if isinstance(data, dict):
        events: dict[tuple, dict] = {}
        for e in data.get("open", []) + data.get("recent", [])[-5:]:
            if isinstance(e, dict):
                events.setdefault((e.get("class"), e.get("device")), e)  # open ones are in recent too
        if events:
            out["gpu_errors"] = list(events.values())[:10]
    return out


def advance(record, now: float, state: str | None, why: str, checks: dict | None = None) -> dict:
    """The record after this run: the same when the state did not change (or is None: drained by hand);
    otherwise the transition appended, with its why and evidence, and a new fault counted in `triages`."""
    rec = load(record)
    if state is None or state == rec["state"]:
        return rec
    entry = {"from": rec["state"], "to": state, "at": now, "why": decide.clean(why)[:300], **evidence(checks or {})}
    triages = rec["triages"] + ([now] if entering(rec["state"], state) else [])
    return {"state": state, "since": now, "history": (rec["history"] + [entry])[-HISTORY:], "triages": triages[-50:]}


def service_reason(what: str) -> str:
    """The drain reason of service-required: `gpc:service: <what>`, one line, at most decide.MAX_REASON."""
    return decide.reason_for([(SERVICE_REASON, what)])


def escalation(record, now: float, state: str | None, d: decide.Decision, asked: str | None, config: dict,
               failing: str) -> decide.Decision | None:
    """Service-required instead of `d`, or None. Three causes: the GPU error ladder asks for a repair (`asked` is
    service); or `d` is a new fault (a drain or a reboot of a node in production or acceptance) and the node has
    entered triage `triages` times within the window, this one included. `failing`: the first failing check and
    its message, for the reason. A node drained by hand (state None): None. A node already service-required
    keeps its reason whatever fails now (a rewritten reason would let its next passing runs resume it)."""
    if state == SERVICE and d.action in ("drain", "reboot"):
        return decide.Decision("none", d.reason, 0, f"service required, still failing: {failing}; repair it, then "
                               "`gpucluster health accept`")
    if state == SERVICE and d.action == "none" and not failing:
        return decide.Decision("none", d.reason, 0, "service required: repair it, then `gpucluster health accept`")
    if state in (None, SERVICE):
        return None
    if asked == "service" and (d.action in ("drain", "reboot") or state in (TRIAGE, REBOOTING)):
        return decide.Decision("drain", service_reason(failing), 0,
                               "service required: the GPU error ladder asks for a repair")
    limits = config.get("lifecycle") if isinstance(config.get("lifecycle"), dict) else {}
    most, window = int(limits.get("triages", TRIAGES)), float(limits.get("window_s", WINDOW_S))
    if d.action not in ("drain", "reboot") or state not in (PRODUCTION, ACCEPTANCE):
        return None
    count = len(triages_within(record, now, window)) + 1
    if count < most:
        return None
    days = f"{window / 86400:g} d" if window >= 86400 else f"{window / 3600:g} h"
    return decide.Decision("drain", service_reason(f"in triage {count} times in {days}; now {failing}"), 0,
                           f"service required: entered triage {count} times within {days} (limit {most})")


def describe(record) -> str:
    """`health status`'s line: the state, since when, and the last transition's why."""
    rec = load(record)
    if rec["state"] is None:
        return "no lifecycle recorded"
    last = rec["history"][-1] if rec["history"] else {}
    return f"{rec['state']}" + (f" ({last.get('why')})" if last.get("why") else "")
