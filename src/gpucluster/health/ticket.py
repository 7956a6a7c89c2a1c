"""`gpucluster health ticket`: a repair ticket for one node, for the technician who walks to it (docs/health.md,
"Repair ticket").

Pure functions: `node_plan` reads the compiled cluster (where the node stands and what is cabled to it), `build`
joins that with the evidence gathered from the node and Slurm (remote.ticket_evidence), `markdown` writes the
technician's page. Nothing here reads a file or the network, so each piece is tested on its own.

Text from the node and from Slurm (a drain reason, a check's message, a node name) is data: in the Markdown it is
written inside code spans, its control characters escaped, so it can neither start a heading, a link or HTML, nor
break the page's structure.
"""

from __future__ import annotations

import time
from itertools import islice
from urllib.parse import urlsplit

from gpucluster.errors import UsageError, did_you_mean, shown
from gpucluster.fabric.cabling import cabling_rows
from gpucluster.fabric.plan import u_text
from gpucluster.node import nodestate

TICKET_VERSION = 1
SERIAL_VARS = ("gpucluster_serial", "ansible_product_serial")  # inventory host variables, the first one set wins
CABLE_KEYS = ("a_device", "a_port", "b_device", "b_port", "link", "media")
MEDIA = {"DAC": "copper (DAC): the leaf sits in this rack", "AOC": "active optical cable: the leaf is at the end of "
         "the row"}
EVENT_KEYS = ("kind", "code", "device", "class", "action", "what")
HISTORY = 10  # lifecycle transitions a ticket lists, the most recent
KINDS = {"xid": "XID", "sxid": "SXid", "amdgpu": "amdgpu"}  # as node/xid.py's describe names them


def _position(plan, group, index: int) -> tuple[str, int]:
    """(rack, slot): the plan's rack of the group's node `index`, and its slot there: its place among the
    rack's nodes, counted from 1 at the lowest (the plan's rack layout puts them from the bottom up)."""
    for number, first in plan.racks[group.name]:
        if first <= index < first + group.nodes_per_rack:
            return f"rack{number:04d}", index - first + 1
    raise ValueError(f"{group.host(index)} is in no rack of the plan")


def node_cables(plan, host: str) -> list[dict]:
    """The cables of `host` as the plan's cabling map (cabling.csv) has them, both ends each: the map's rows
    whose first or second device is the host. Only the chunk of its unit is read (one per unit, in order)."""
    unit = plan.unit_of_host.get(host)
    if unit is None:
        return []
    chunk = next(islice(cabling_rows(plan), unit.index, None), "")
    out = []
    for line in chunk.splitlines():
        row = dict(zip(CABLE_KEYS, line.split(","), strict=True))
        if host in (row["a_device"], row["b_device"]):
            out.append(row)
    return out


def node_plan(cluster, node: str, host_vars: dict | None = None) -> dict:
    """Where `node` stands and what is cabled to it, from the compiled cluster (`host_vars`: the inventory's
    variables of the node, for a serial). UsageError for a name the cluster does not have."""
    group = cluster.group_of_host.get(node)
    if group is None:
        hint = did_you_mean(node, cluster.hosts)
        raise UsageError(f"NODE {shown(node)}: not a node of the cluster {cluster.name} ({cluster.source}); "
                         f"{hint or 'give a hostname the spec plans, e.g. ' + (cluster.hosts or ['?'])[0]}")
    plan = cluster.plan
    index = group.hosts.index(node)
    rack, slot = _position(plan, group, index)
    lowest, highest = plan.u_of(group, index)
    unit = plan.unit_of_host.get(node)
    domain = plan.domain_of_host.get(node)
    serial = next((str(host_vars[k]) for k in SERIAL_VARS if (host_vars or {}).get(k)), None)
    gpu = cluster.spec.parts.gpus[group.gpu].name if group.gpu else None
    return {"node": node, "cluster": cluster.name, "group": group.name, "role": group.role, "rack": rack,
            "u": u_text(lowest, highest), "u_lowest": lowest, "u_highest": highest,
            "rack_height_u": plan.layouts[group.name].height,
            "slot": slot, "slots": group.nodes_per_rack, "serial": serial,
            "leaf": unit.name if unit else None,
            "pod": f"pod{unit.pod + 1:03d}" if unit is not None and plan.tiers == 3 else None,
            "nvlink_domain": domain.name if domain else None,
            "gpus": {"model": gpu, "count": group.gpus_per_node} if gpu else None,
            "cables": node_cables(plan, node)}


def _utc(epoch) -> str | None:
    if not isinstance(epoch, int | float) or isinstance(epoch, bool) or epoch <= 0:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _events(data, key: str) -> list[dict]:
    items = data.get(key) if isinstance(data, dict) else None
    return [{k: e.get(k) for k in EVENT_KEYS} for e in items or [] if isinstance(e, dict)]


def health_evidence(state: dict) -> dict:
    """The ticket's part of the node's state file (/var/lib/gpucluster/health/state.json, as `health status` reads
    it): the last run, the checks failing now with their messages and since when, the GPU errors (XID) still
    open and the recent ones, and the ladder's rung."""
    checks = state.get("checks") if isinstance(state.get("checks"), dict) else {}
    failing = [{"check": name, "message": str(c.get("message", "")), "since": _utc(c.get("since")),
                "not_run": bool(c.get("not_run"))}
               for name, c in checks.items() if isinstance(c, dict) and not c.get("ok")]
    xid = checks.get("gpu-xid", {}).get("data") if isinstance(checks.get("gpu-xid"), dict) else None
    record = nodestate.load(state.get("lifecycle"))
    history = [{"at": _utc(h.get("at")), "from": h.get("from"), "to": h.get("to"), "why": str(h.get("why", "")),
                "failed": {str(k): str(v) for k, v in h["failed"].items()} if isinstance(h.get("failed"), dict)
                else {}} for h in record["history"][-HISTORY:]]
    return {"last_run": _utc(state.get("started")), "action": state.get("action") or None,
            "lifecycle": record["state"], "history": history,
            "why": state.get("why") or None, "ladder": state.get("ladder") or None, "failing": failing,
            "passing": sorted(n for n, c in checks.items() if isinstance(c, dict) and c.get("ok")),
            "xid_open": _events(xid, "open"), "xid_recent": _events(xid, "recent")}


def build(plan: dict, evidence: dict) -> dict:
    """The ticket: `plan` (node_plan's) and `evidence` ({"slurm": {state, reason, reason_user, reason_time,
    error}, "health": the node's state file as a dict, "health_error": why it could not be read, "made": epoch})
    joined under stable keys."""
    slurm = evidence.get("slurm") or {}
    health = health_evidence(evidence.get("health") or {})
    health["error"] = evidence.get("health_error") or None
    return {
        "ticket": TICKET_VERSION,
        "made": _utc(evidence.get("made")),
        "node": plan["node"],
        "cluster": plan["cluster"],
        "where": {k: plan[k] for k in ("group", "role", "rack", "u", "u_lowest", "u_highest", "rack_height_u",
                                       "slot", "slots", "serial", "leaf", "pod", "nvlink_domain", "gpus")},
        "cables": [{k: c[k] for k in CABLE_KEYS} for c in plan["cables"]],
        "slurm": {k: slurm.get(k) or None for k in ("state", "reason", "reason_user", "reason_time", "error")},
        "health": health,
    }


def code(text) -> str:
    """`text` as one inert Markdown code span: control characters escaped (no new line, so no new block), a fence
    longer than any run of backticks inside (the text cannot close it). Inside a code span nothing is markup."""
    body = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    run = longest = 0
    for c in body:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    if not body:
        return "` `"  # CommonMark has no empty code span
    edges = body.startswith(("`", " ")) or body.endswith(("`", " "))
    pad = " " if edges and body.strip(" ") else ""  # one space each side is stripped, but not from only spaces
    return f"{fence}{pad}{body}{pad}{fence}"


def _where_lines(t: dict) -> list[str]:
    w = t["where"]
    lines = [f"- **rack** {code(w['rack'])}, **{w['u']}** (a {w['rack_height_u']}U rack), **slot** {w['slot']} of "
             f"{w['slots']} (the plan's rack elevation; U and slots counted from the bottom)",
             f"- **node group** {code(w['group'])} ({w['role']})",
             f"- **serial** {code(w['serial']) if w['serial'] else 'not recorded in the inventory'}"]
    if w["gpus"]:
        lines.append(f"- **GPUs** {w['gpus']['count']} x {code(w['gpus']['model'])}")
    for key, word in (("leaf", "leaf"), ("pod", "pod"), ("nvlink_domain", "NVLink domain")):
        if w[key]:
            lines.append(f"- **{word}** {code(w[key])}")
    return lines


def _event_text(e: dict) -> str:
    """A GPU error as the gpu-xid check says it: `XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot`."""
    kind = KINDS.get(str(e["kind"]), str(e["kind"]))
    name = f"{kind} {e['code']}" if e["code"] else kind
    return f"{name} on {e['device']} ({e['what']}): {e['action']}"


def _evidence_lines(t: dict) -> list[str]:
    s, h = t["slurm"], t["health"]
    out = ["## What failed", ""]
    if s["error"]:
        out.append(f"- **Slurm** could not be asked: {code(s['error'])}")
    else:
        by = f" by {code(s['reason_user'])}" if s["reason_user"] else ""
        since = f" since {code(s['reason_time'])}" if s["reason_time"] else ""
        reason = code(s["reason"]) if s["reason"] else "no reason"
        out.append(f"- **Slurm** state {code(s['state'] or '?')}, reason {reason}{by}{since}")
    if h["error"]:
        out.append(f"- **health checks**: state file not read: {code(h['error'])}")
    elif not h["last_run"]:
        out.append("- **health checks**: no run recorded")
    else:
        why = f" ({code(h['why'])})" if h["why"] else ""
        out.append(f"- **health checks**, last run {code(h['last_run'])}: {code(h['action'] or 'none')}{why}")
    for f in h["failing"]:
        word = "NOT RUN" if f["not_run"] else "FAIL"
        out.append(f"  - {word} {code(f['check'])}: {code(f['message'])} (since {code(f['since'] or '?')})")
    if h["passing"]:
        out.append(f"  - ok: {', '.join(code(n) for n in h['passing'])}")
    if h["ladder"]:
        out.append(f"- **GPU error ladder**: {code(h['ladder'])}")
    for key, word in (("xid_open", "open"), ("xid_recent", "recent")):
        for e in h[key]:
            out.append(f"  - {word}: {code(_event_text(e))}")
    if h.get("history"):
        out += ["", f"## Lifecycle: {code(h['lifecycle'] or '?')}", ""]
        for e in h["history"]:
            failed = "; ".join(f"{k}: {v}" for k, v in e["failed"].items())
            out.append(f"- {code(e['at'] or '?')} {code(e['from'] or '-')} to {code(e['to'] or '?')}: {code(e['why'])}"
                       + (f" (failed: {code(failed)})" if failed else ""))
    return out


def markdown(t: dict) -> str:
    """The technician's page: where the node is, what failed, which cables to check."""
    lines = [f"# Repair ticket: {code(t['node'])} ({code(t['cluster'])})", ""]
    if t["made"]:
        lines += [f"Made {code(t['made'])}.", ""]
    lines += ["## Where", "", *_where_lines(t), ""]
    lines += [*_evidence_lines(t), "", "## Cables to check", ""]
    if not t["cables"]:
        lines.append("No cable of this node in the plan's cabling map (it is not on the fabric).")
    for c in t["cables"]:
        lines.append(f"- {code(c['a_device'])} port {code(c['a_port'])} to {code(c['b_device'])} port "
                     f"{code(c['b_port'])}: {code(c['link'])}, {MEDIA.get(c['media'], code(c['media']))}")
    return "\n".join(lines) + "\n"


def check_webhook(url: str) -> str:
    """The URL `--webhook` posts to: http or https with a host; anything else (file:, ftp:, a bare path) is a
    UsageError naming the flag, the rule and a fix."""
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--webhook {shown(url)}: the URL must be http:// or https:// with a host; give the "
                         "receiver's address, e.g. --webhook https://tickets.example.org/hooks/gpucluster")
    return url
