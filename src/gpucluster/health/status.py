"""`gpucluster health status`: drained nodes by reason, who drained them and since when, and each node's
last check results. Pure functions over Slurm's own output and the nodes' state files; the SSH that
fetches them is remote.py; each group's circuit breaker is breakerstate.py's. The node table is read as JSON
(slurmtext): a reason is data, whatever it holds (a newline, ` State=IDLE`, `|`), and its user and time come
with it.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import hostlist

from gpucluster import slurmtext
from gpucluster.node import nodestate
from gpucluster.node.decide import PREFIX, is_drained
from gpucluster.words import plural

# What the controller is asked: the node table as JSON (scontrol's, else 22.05's sinfo's), and sinfo's
# reasons (read only by parse_sinfo_reasons: the node table already has each reason, its user and time).
SINFO_REASONS = ["sinfo", "-R", "-h", "-o", "%H|%u|%N|%T|%E"]
SHOW_NODES = ["sh", "-c", slurmtext.NODES_SH]
_WHEN = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|Unknown")


@dataclass
class NodeStatus:
    name: str
    state: str = ""
    reason: str = ""
    reason_user: str = ""
    reason_time: str = ""
    checks: dict = field(default_factory=dict)  # the node's state.json "checks"
    last_run: float | None = None
    action: str = ""
    why: str = ""
    fetch_error: str = ""
    lifecycle: dict = field(default_factory=dict)  # the node's state.json "lifecycle" (node/nodestate.py)
    ladder: str = ""  # the GPU error ladder's highest rung the last run read (record, drain, reboot, service)

    @property
    def drained(self) -> bool:
        return is_drained(self.state)

    @property
    def by(self) -> str:
        """gpucluster (a gpc: reason, resumed by itself) or an operator (never resumed by gpucluster)."""
        if not self.reason:
            return ""
        return "gpucluster" if self.reason.startswith(PREFIX) else "operator"


def parse_sinfo_reasons(text: str) -> dict[str, dict[str, str]]:
    """`sinfo -R -h -o '%H|%u|%N|%T|%E'` -> node -> {time, user, state, reason}; a line's nodes are a
    hostlist (sinfo groups the nodes that share a reason). The reason is last: it may hold '|'. A reason
    holding a newline cannot be told from a record here, which is why `merge` reads the JSON node table;
    a line that is not a record is an error (slurmtext.SlurmOutputError), never skipped."""
    command = " ".join(SINFO_REASONS)
    out: dict[str, dict[str, str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|", 4)
        if len(parts) != 5 or not _WHEN.fullmatch(parts[0].strip()):
            raise slurmtext.SlurmOutputError(command, f"line {n}: {line[:80]!r} is not TIME|USER|NODES|STATE|REASON")
        when, user, nodes, state, reason = (p.strip() for p in parts)
        try:
            names = hostlist.expand_hostlist(nodes)
        except hostlist.BadHostlist:
            raise slurmtext.SlurmOutputError(command, f"line {n}: {nodes[:80]!r} is not a hostlist") from None
        for node in names:
            out[node] = {"time": when, "user": user, "state": state, "reason": reason}
    return out


def parse_state_file(text: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def merge(show_nodes: str, sinfo_reasons: str, states: dict[str, dict], errors: dict[str, str] | None = None,
          nodes: list[str] | None = None) -> list[NodeStatus]:
    """One row per node (those `nodes` names, else every node Slurm lists): Slurm's state, reason, the
    reason's user and time, from `show_nodes` (the output of SHOW_NODES: the JSON node table), and the
    node's own last run. `sinfo_reasons` is not read: everything it says, the node table says whole.
    Raises slurmtext.SlurmOutputError when `show_nodes` is not the node table."""
    del sinfo_reasons
    shown = slurmtext.parse_nodes_json(show_nodes, slurmtext.NODES_LABEL)
    rows = []
    for name in nodes if nodes is not None else sorted(shown):
        info = shown.get(name)
        st = states.get(name, {})
        rows.append(NodeStatus(
            name=name, state=info.state if info else "?", reason=info.reason if info else "",
            reason_user=info.reason_user if info else "", reason_time=info.reason_time if info else "",
            checks=st.get("checks", {}), last_run=st.get("started"), action=st.get("action", ""),
            why=st.get("why", ""), fetch_error=(errors or {}).get(name, ""),
            lifecycle=nodestate.load(st.get("lifecycle")), ladder=str(st.get("ladder") or "")))
    return rows


def _ago(then: float | None, now: float) -> str:
    if not then:
        return "never"
    s = max(0, int(now - then))
    return f"{s}s ago" if s < 120 else f"{s // 60}min ago" if s < 7200 else f"{s // 3600}h ago"


def _when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch)) if epoch else "-"


def format_status(rows: list[NodeStatus], now: float | None = None) -> str:
    now = time.time() if now is None else now
    lines = []
    drained = [r for r in rows if r.drained]
    by_reason: dict[str, list[NodeStatus]] = {}
    for r in drained:
        by_reason.setdefault(slurmtext.printable(r.reason) or "(no reason)", []).append(r)
    lines.append(f"drained: {len(drained)} of {plural(len(rows), 'node')}")
    for reason, group in sorted(by_reason.items()):
        first = group[0]
        note = "resumed by gpucluster when its checks pass" if first.by == "gpucluster" else \
            "drained by hand: never resumed by gpucluster"
        lines.append(f"  {reason}")
        lines.append(f"    {hostlist.collect_hostlist([r.name for r in group])}: since {first.reason_time or '-'} "
                     f"by {slurmtext.printable(first.reason_user) or '?'} ({note})")
    states: dict[str, list[str]] = {}
    for r in rows:
        states.setdefault(nodestate.load(r.lifecycle)["state"] or "not recorded", []).append(r.name)
    lines.append("lifecycle: " + ", ".join(f"{s} {len(states[s])}" for s in (*nodestate.STATES, "not recorded")
                                           if s in states))
    for s in (nodestate.SERVICE, nodestate.ACCEPTANCE, nodestate.REBOOTING, nodestate.TRIAGE):
        if s in states:
            lines.append(f"  {s}: {hostlist.collect_hostlist(states[s])}")
    lines.append("last checks:")
    for r in rows:
        if r.fetch_error:
            lines.append(f"  {r.name}: state file not read: {r.fetch_error}")
            continue
        if not r.checks:
            lines.append(f"  {r.name}: no health run recorded")
            continue
        failed = {n: c for n, c in r.checks.items() if not c.get("ok")}
        head = f"  {r.name} [{r.state}] {_ago(r.last_run, now)}: {r.action or 'none'} ({r.why})"
        lines.append(head)
        rec = nodestate.load(r.lifecycle)
        if rec["state"]:
            ladder = f"; GPU error ladder: {r.ladder}" if r.ladder else ""
            lines.append(f"    lifecycle: {rec['state']} since {_when(rec['since'])}{ladder}"
                         f" ({len(rec['triages'])} triage entries recorded)")
        for name, c in failed.items():
            word = "NOT RUN" if c.get("not_run") else "FAIL"  # an active check whose tool is missing
            lines.append(f"    {word} {name}: {c.get('message', '')} (since {_when(c.get('since'))})")
        passing = sorted(n for n in r.checks if n not in failed)
        if passing:
            lines.append(f"    ok: {', '.join(passing)}")
    return "\n".join(lines) + "\n"


def format_breakers(breakers: list) -> str:
    """Each compute group's circuit breaker (health.breakerstate.GroupBreaker): closed, or open since when and why,
    and the drain tokens used of the window's count."""
    from gpucluster.health.breakerstate import format_breakers

    return format_breakers(breakers)


def report_json(rows: list[NodeStatus], breakers: list) -> dict:
    """`health status --json`: {"nodes": as_json's records, "breakers": one record per compute group}."""
    return {"nodes": json.loads(as_json(rows)), "breakers": [b.as_json() for b in breakers]}


def as_json(rows: list[NodeStatus]) -> str:
    return json.dumps([{**r.__dict__, "drained": r.drained, "by": r.by} for r in rows], indent=1, sort_keys=True)
