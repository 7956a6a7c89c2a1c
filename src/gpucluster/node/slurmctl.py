"""The node's state in Slurm, read and changed with scontrol: the thin layer under decide.py.

Parsing is pure (`parse_node`, on `scontrol show node -o` lines, the one output every supported line
prints for a single node at the cost of one node; this file stands alone on nodes, so it reads that text
itself rather than through gpucluster.slurmtext). A reason is free text: the fields are read from before
`Reason=` only, the reason runs to Slurm's `[user@time]` stamp, and after it only the keys Slurm prints
there are read, never over a field read before. The calls have short timeouts so a slow slurmctld costs seconds of the
runner's budget, never a hung HealthCheckProgram. A run's calls go through a `Session`, which falls back
to a private munged (privmunge.py) when scontrol cannot get a credential from the node's own.
"""

from __future__ import annotations

import re
import subprocess
import time

try:
    from . import privmunge
except ImportError:  # run as a script on a node: the files sit side by side
    import privmunge

_STAMP = re.compile(r" \[(?P<user>[^\]@\s]+)@(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|Unknown)\]")
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w/:.]*)=(\S*)")
_REASON = re.compile(r"(?:^|\s)Reason=")
# What scontrol prints after a node's reason (22.05 to 26.05), each only when set.
AFTER_REASON = frozenset(("Comment", "Extra", "ResumeAfterTime", "InstanceId", "InstanceType", "Topology"))
REBOOTING = frozenset(("REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"))  # the words of a reboot pending
MIN_CALL_S = 0.2  # less time than this left in the run: the call is not made (it could not finish)


def parse_node(line: str) -> dict[str, str]:
    """One `scontrol show node -o` line: every simple Key=value before Reason, plus Reason (free text: spaces,
    '=', ` State=IDLE`) split into reason, reason_user and reason_time ('' when the node has no reason), and
    the keys Slurm prints after a reason (AFTER_REASON) where they do not repeat one read before."""
    line = line.strip()
    at = _REASON.search(line)  # the first: every field before it is Slurm's own
    out = dict(_FIELD.findall(line[:at.start()] if at else line))
    out["reason"] = out["reason_user"] = out["reason_time"] = ""
    if at is None:
        return out
    rest = line[at.end():]
    stamp = _STAMP.search(rest)
    if stamp is None:
        out["reason"] = rest.strip()
        return out
    out["reason"] = rest[:stamp.start()].strip()
    out["reason_user"], out["reason_time"] = stamp.group("user"), stamp.group("time")
    for key, value in _FIELD.findall(rest[stamp.end():]):
        if key in AFTER_REASON:
            out.setdefault(key, value)
    return out


def parse_nodes(text: str) -> dict[str, dict[str, str]]:
    """Every node's first line: a comment holding a newline cannot replace a node read before it."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if line.startswith("NodeName="):
            node = parse_node(line)
            out.setdefault(node["NodeName"], node)
    return out


def _scontrol(args: list[str], env: dict, timeout: float) -> tuple[int, str]:
    try:
        res = subprocess.run(["scontrol", *args], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"scontrol {args[0]} did not answer within {timeout:g}s"
    except OSError as exc:
        return 127, f"scontrol: {exc.strerror or exc}"
    if res.returncode == 0:
        return 0, res.stdout.strip()
    return res.returncode, " ".join((res.stderr or res.stdout).split())  # one line for the state file


class Session:
    """The scontrol calls of one run, each within `call_timeout` and all before `deadline` (monotonic).

    When a call fails because this node cannot get a munge credential (its munged is down), the session
    starts a private munged with the node's own key (privmunge.py), repeats the call through it, and keeps
    it for the run's other calls; `close()` (or leaving the `with`) stops it. `auth` then says so, for the
    state file: a node whose munged died drains itself (`gpc:munge: ...`) instead of only going silent."""

    def __init__(self, env: dict, munge_key: str | None = privmunge.KEY, run_dir: str = privmunge.BASE,
                 deadline: float | None = None, call_timeout: float = 5) -> None:
        self.env, self.munge_key, self.run_dir = dict(env), munge_key, run_dir
        self.deadline, self.call_timeout = deadline, call_timeout
        self.private: privmunge.PrivateMunged | None = None
        self.auth = ""  # "" (the node's munged), or how the private munged went

    def _timeout(self) -> float | None:
        """Seconds the next call may take: call_timeout, cut to what is left before the deadline; None when
        too little is left to be worth a call (the run must end before slurmd's 60 s kill)."""
        if self.deadline is None:
            return self.call_timeout
        left = min(self.call_timeout, self.deadline - time.monotonic())
        return left if left >= MIN_CALL_S else None

    def _start_private(self, why: str) -> bool:
        """True when the private munged runs and self.env points scontrol at it; else self.auth says why not."""
        if self.private is not None or not self.munge_key:
            return False
        left = self._timeout()
        if left is None:
            self.auth = "private munged not tried: no time left in the run's budget"
            return False
        self.private = privmunge.PrivateMunged(self.munge_key, privmunge.node_slurm_conf(self.env), self.run_dir,
                                               timeout=min(3.0, left))
        try:
            self.env.update(self.private.start())
        except (privmunge.PrivateMungeError, OSError) as exc:
            self.auth = f"private munged failed: {exc}"
            return False
        self.auth = f"private munged (the node's did not answer: {why[:160]})"
        return True

    def call(self, args: list[str]) -> tuple[int, str]:
        rc, text = self._once(args)
        if rc != 0 and privmunge.munge_failure(text) and self._start_private(_munge_line(text)):
            rc, text = self._once(args)
        return rc, text

    def _once(self, args: list[str]) -> tuple[int, str]:
        timeout = self._timeout()
        if timeout is None:
            return 124, f"scontrol {args[0]} not run: no time left in the run's budget"
        return _scontrol(args, self.env, timeout)

    def show(self, node: str) -> tuple[dict[str, str] | None, str]:
        rc, text = self.call(["show", "node", "-o", node])
        if rc != 0:
            return None, text
        nodes = parse_nodes(text)
        return (nodes[node], "") if node in nodes else (None, f"scontrol does not know node {node}")

    def update_if(self, node: str, seen: dict[str, str] | None, changes: list[str]) -> tuple[bool, str]:
        """`scontrol update nodename=NODE CHANGES`, only if Slurm's reason and drain flag are still those of
        `seen` (the `show` the decision was made on; None: unconditionally).

        Slurm has no compare-and-swap for a node's state or reason (scontrol update takes no condition), so
        the node is read again right before the update: the window in which an operator's drain or reason
        could be overwritten shrinks from the whole run (the checks: up to check_timeout) to the time
        between two scontrol calls. (False, why) when it changed or cannot be read."""
        changed = self._changed(node, seen, "update")
        if changed:
            return False, changed
        rc, text = self.call(["update", f"nodename={node}", *changes])
        return rc == 0, (text if rc == 0 else f"scontrol update failed: {text}")

    def _changed(self, node: str, seen: dict[str, str] | None, what: str) -> str:
        """Why the node is no longer as `seen` (its reason, its drain flag, a reboot pending), read again now;
        "" when it is the same (or `seen` is None)."""
        if seen is None:
            return ""
        now, why_not = self.show(node)
        if now is None:
            return f"not changed: cannot read the node again right before the {what}: {why_not}"
        before = (seen.get("reason", ""), _drained(seen.get("State", "")), rebooting(seen.get("State", "")))
        after = (now.get("reason", ""), _drained(now.get("State", "")), rebooting(now.get("State", "")))
        if before != after:
            return (f"not changed: the node changed since this run read it (reason {before[0]!r} -> {after[0]!r}, "
                    f"drained {before[1]} -> {after[1]}" + (f", rebooting {before[2]} -> {after[2]})"
                                                             if before[2] != after[2] else ")"))
        return ""

    def reboot(self, node: str, reason: str, seen: dict[str, str] | None = None) -> tuple[bool, str]:
        """`scontrol reboot ASAP nextstate=RESUME reason=REASON NODE`, only if the node is still as `seen`.

        ASAP drains the node at once (no new job lands) and reboots it once its running jobs have ended; Slurm
        runs RebootProgram, and when slurmd registers with a boot time after the request, nextstate=RESUME
        takes the drain off and the node returns to service (22.05 to 26.05 take these words: scontrol(1),
        "reboot"). The reason shows while the reboot is pending."""
        changed = self._changed(node, seen, "reboot")
        if changed:
            return False, changed
        rc, text = self.call(["reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node])
        return rc == 0, (text if rc == 0 else f"scontrol reboot failed: {text}")

    def drain(self, node: str, reason: str, seen: dict[str, str] | None = None) -> tuple[bool, str]:
        return self.update_if(node, seen, ["state=drain", f"reason={reason}"])

    def resume(self, node: str, seen: dict[str, str] | None = None) -> tuple[bool, str]:
        """UNDRAIN, not RESUME: it clears the drain flag (and gpucluster's reason) and nothing else; a node
        that went DOWN meanwhile stays DOWN (RESUME would mark it up). Slurm 20.11 and later have it."""
        return self.update_if(node, seen, ["state=undrain"])

    def show_nodes(self, hostlist: str) -> tuple[dict[str, dict[str, str]] | None, str]:
        """Every node of a hostlist (`gpu[001-512]`), read at once: Slurm expands the list."""
        rc, text = self.call(["show", "node", "-o", hostlist])
        return (parse_nodes(text), "") if rc == 0 else (None, text)

    def reservations(self) -> tuple[list[dict[str, str]] | None, str]:
        rc, text = self.call(["show", "reservation", "-o"])
        return (parse_reservations(text), "") if rc == 0 else (None, text)

    def license_total(self, name: str) -> tuple[int | None, str]:
        rc, text = self.call(["show", "license", "-o", name])
        return (parse_license_total(text, name), "") if rc == 0 else (None, text)

    def reserve(self, name: str, license: str, duration: str, comment: str = "") -> tuple[int, str]:
        """A reservation of one `license` and no nodes (Flags=ANY_NODES: Slurm 22.05 to 26.05 refuse a
        reservation of licenses alone without it), from now for `duration` (minutes, or UNLIMITED). slurmctld
        refuses it when the license's count is all reserved ("Invalid license specification") or the name is
        taken ("Duplicate reservation name"), each atomically. `comment` where the line has Comment= (24.11
        and 26.05 do; 22.05's scontrol refuses the key before asking slurmctld, and the call is made without it)."""
        args = ["create", "reservation", f"ReservationName={name}", f"Licenses={license}:1", "StartTime=now",
                f"Duration={duration}", "Users=root", "Flags=ANY_NODES"]
        if comment:
            rc, text = self.call([*args, f"Comment={comment}"])
            if not (rc != 0 and "Unknown parameter Comment" in text):
                return rc, text
        return self.call(args)

    def close(self) -> None:
        if self.private is not None:
            self.private.stop()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def _drained(state: str) -> bool:
    """IDLE+DRAIN, MIXED+DRAIN, DOWN+DRAIN (decide.is_drained, kept here so this file stands alone)."""
    return "DRAIN" in str(state).upper().split("+")


def rebooting(state: str) -> bool:
    """A reboot is pending or under way: REBOOT_REQUESTED (asked, jobs still running), REBOOT_ISSUED (RebootProgram
    run, the node not back yet), or sinfo's REBOOT, as whole words of Slurm's BASE+FLAG state."""
    return not REBOOTING.isdisjoint(str(state).upper().split("+"))


def _munge_line(text: str) -> str:
    """The part of scontrol's message that says what munge lacked."""
    m = re.search(r"munge encode failed: ([^(]*)", text, re.IGNORECASE)
    return m.group(1).strip() if m else text


# ---------------------------------------------------------------- reservations (the circuit breaker's tokens)

_COMMENT = re.compile(r"\sComment=")


def parse_reservations(text: str) -> list[dict[str, str]]:
    """`scontrol show reservation -o`: one dict per line that starts with ReservationName=. Comment (24.11 and
    26.05 print it last, when set) is free text: everything after the first ` Comment=`, never read for fields;
    a comment holding a newline cannot add a record that a line of its own starts (an admin could still forge
    one: that needs the rights to create reservations anyway)."""
    out = []
    for line in text.splitlines():
        if not line.startswith("ReservationName="):
            continue
        at = _COMMENT.search(line)
        fields = dict(_FIELD.findall(line[:at.start()] if at else line))
        fields["Comment"] = line[at.end():].strip() if at else ""
        out.append(fields)
    return out


def licenses_of(reservation: dict[str, str]) -> dict[str, int]:
    """A reservation's Licenses=a:1,b:2 (or a*1 on older output) as {name: count}; (null) is none."""
    out: dict[str, int] = {}
    for item in reservation.get("Licenses", "").split(","):
        name, _sep, count = item.replace("*", ":").partition(":")
        if name and name != "(null)":
            out[name] = int(count) if count.isdigit() else 1
    return out


def parse_license_total(text: str, name: str) -> int | None:
    """`scontrol show license -o NAME` -> its Total, None when Slurm does not list that license."""
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line))
        if fields.get("LicenseName") == name and fields.get("Total", "").isdigit():
            return int(fields["Total"])
    return None
