"""`gpucluster health status`: drained nodes by reason, who drained them and since when, and each node's
last check results. Pure functions over Slurm's own output and the nodes' state files; the SSH that
fetches them is remote.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import hostlist

from gpucluster.node.decide import PREFIX, is_drained
from gpucluster.node.slurmctl import parse_nodes
from gpucluster.words import plural

# What the controller is asked (full reasons: a -o field without a width is never cut).
SINFO_REASONS = ["sinfo", "-R", "-h", "-o", "%H|%u|%N|%T|%E"]
SHOW_NODES = ["scontrol", "show", "node", "-o"]


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
    hostlist (sinfo groups the nodes that share a reason). The reason is last: it may hold '|'."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        parts = line.split("|", 4)
        if len(parts) != 5:
            continue
        when, user, nodes, state, reason = (p.strip() for p in parts)
        for node in hostlist.expand_hostlist(nodes):
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
    """One row per node (those `nodes` names, else every node scontrol lists): Slurm's state and reason,
    the reason's user and time (sinfo's, else scontrol's), and the node's own last run."""
    shown = parse_nodes(show_nodes)
    reasons = parse_sinfo_reasons(sinfo_reasons)
    rows = []
    for name in nodes if nodes is not None else sorted(shown):
        info = shown.get(name, {})
        why = reasons.get(name, {})
        st = states.get(name, {})
        rows.append(NodeStatus(
            name=name, state=info.get("State", "?"), reason=info.get("reason") or why.get("reason", ""),
            reason_user=info.get("reason_user") or why.get("user", ""),
            reason_time=info.get("reason_time") or why.get("time", ""),
            checks=st.get("checks", {}), last_run=st.get("started"), action=st.get("action", ""),
            why=st.get("why", ""), fetch_error=(errors or {}).get(name, "")))
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
        by_reason.setdefault(r.reason or "(no reason)", []).append(r)
    lines.append(f"drained: {len(drained)} of {plural(len(rows), 'node')}")
    for reason, group in sorted(by_reason.items()):
        first = group[0]
        note = "resumed by gpucluster when its checks pass" if first.by == "gpucluster" else \
            "drained by hand: never resumed by gpucluster"
        lines.append(f"  {reason}")
        lines.append(f"    {hostlist.collect_hostlist([r.name for r in group])}: since {first.reason_time or '-'} "
                     f"by {first.reason_user or '?'} ({note})")
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
        for name, c in failed.items():
            word = "NOT RUN" if c.get("not_run") else "FAIL"  # an active check whose tool is missing
            lines.append(f"    {word} {name}: {c.get('message', '')} (since {_when(c.get('since'))})")
        passing = sorted(n for n in r.checks if n not in failed)
        if passing:
            lines.append(f"    ok: {', '.join(passing)}")
    return "\n".join(lines) + "\n"


def as_json(rows: list[NodeStatus]) -> str:
    return json.dumps([{**r.__dict__, "drained": r.drained, "by": r.by} for r in rows], indent=1, sort_keys=True)
