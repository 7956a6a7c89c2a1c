"""Enrollment of a batch of nodes: the work behind the dynamic provider's create, read, update, delete.

A node is enrolled when SSH reached it with its known host key, its facts match its node group, and
it carries the enrollment marker (/etc/gpucluster/enrollment.json, naming project, stack and cluster).
The marker is the only thing enrollment writes on a machine; it stops one machine from being enrolled
into two stacks, and release (delete) removes it again when it is ours. Nothing else on the node is
touched, ever.

Properties are plain data (see `provider.py` for their shape). Everything here raises `EnrollError`
with one readable message covering every node of the batch, never the first failure only.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import hostlist

from gpucluster.deploy import ssh
from gpucluster.deploy.facts import FACTS_SCRIPT, Expectation, Facts, FactsError, compare, drift, parse_facts

MARKER = "/etc/gpucluster/enrollment.json"
MAX_LISTED = 20  # nodes listed in one error message; the rest are counted


class EnrollError(Exception):
    """Enrollment failed for at least one node of a batch; the message lists each node and why."""


@dataclass
class NodeResult:
    host: str
    target: ssh.SshTarget
    facts: Facts | None = None
    marker: dict | None = None
    problems: list[str] | None = None
    notes: list[str] | None = None
    error: str | None = None


def node_entry(host: str, address: str, port: int) -> str:
    """One node of a batch as one string, 'gtt0001 gtt0001.dc1.example:22' (one value per node in state)."""
    return f"{host} {address}:{port}"


def parse_entry(entry: str) -> tuple[str, str, int]:
    host, _, where = entry.partition(" ")
    address, _, port = where.rpartition(":")
    return host, address.strip("[]"), int(port)


def targets(props: dict) -> list[ssh.SshTarget]:
    s = props["ssh"]
    out = []
    for entry in props["nodes"]:
        h, a, p = parse_entry(entry)
        out.append(ssh.SshTarget(host=h, address=a, port=p, user=s["user"], known_hosts=s["known_hosts"],
                                 key_path=s.get("key_path"), key_text=s.get("key_text"),
                                 timeout=float(s.get("timeout", 15))))
    return out


def owner(props: dict) -> dict:
    return {"project": props["owner"]["project"], "stack": props["owner"]["stack"], "cluster": props["cluster"]}


def _sudo(target: ssh.SshTarget) -> str:
    return "" if target.user == "root" else "sudo -n "


def _marker_script() -> str:
    return f"echo '@marker'; cat {MARKER} 2>/dev/null; echo; echo '@marker-end'"


def _split_marker(text: str) -> tuple[str, dict | None]:
    head, sep, tail = text.partition("@marker\n")
    if not sep:
        return text, None
    body = tail.partition("@marker-end")[0].strip()
    try:
        marker = json.loads(body) if body else None
    except ValueError:
        marker = {"unreadable": body[:200]}
    return head, marker if isinstance(marker, dict) else None


def probe(target: ssh.SshTarget, pkey=None) -> NodeResult:
    """Connect (strict host keys), run the facts script, read the marker. Errors land in .error."""
    result = NodeResult(target.host, target)
    try:
        client = ssh.connect(target, pkey)
    except ssh.NodeError as exc:
        result.error = str(exc)
        return result
    try:
        code, out, err = ssh.run(client, f"/bin/sh -c {shlex.quote(FACTS_SCRIPT + _marker_script())}", target)
        if code != 0:
            result.error = f"the facts script exited {code}: {err.strip()[-300:]}"
            return result
        text, result.marker = _split_marker(out)
        result.facts = parse_facts(text)
    except (ssh.NodeError, FactsError) as exc:
        result.error = str(exc)
    finally:
        client.close()
    return result


def _key(props: dict):
    """Load the private key once per batch (not once per node): paramiko's parsing is not free."""
    t = targets(props)
    return ssh.load_key(t[0]) if t else None


def _parallel(props: dict, fn: Callable[[ssh.SshTarget, object], NodeResult], pkey=None) -> list[NodeResult]:
    """fn(target, key) for every node of the batch, `parallel` at a time, results in batch order."""
    ts = targets(props)
    if not ts:
        return []
    if pkey is None:
        try:
            pkey = _key(props)
        except ssh.NodeError as exc:
            raise EnrollError(f"node group '{props['group']}': {exc}") from None
    workers = max(1, min(int(props.get("parallel", 32)), len(ts)))
    if workers == 1:
        return [fn(t, pkey) for t in ts]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="enroll") as pool:
        return list(pool.map(lambda t: fn(t, pkey), ts))


def _marker_problem(marker: dict | None, ours: dict) -> str | None:
    if not marker:
        return None
    theirs = {k: marker.get(k) for k in ("project", "stack", "cluster")}
    if theirs == ours:
        return None
    return (f"already enrolled by project {theirs['project']}, stack {theirs['stack']} (cluster "
            f"{theirs['cluster']}), says {MARKER}; release it there (pulumi destroy, or remove the node "
            "from that spec) or delete the file if that stack is gone")


def check(props: dict, results: Iterable[NodeResult]) -> None:
    """Fill problems and notes of each result from its facts and the batch's expectation."""
    expect = Expectation.from_dict(props["expect"])
    ours = owner(props)
    for r in results:
        if r.error:
            r.problems = [r.error]
            continue
        assert r.facts is not None
        bad, notes = compare(expect, r.facts, r.host)
        r.problems = [m.render(expect.where.get(_rule(expect, m.field), "")) for m in bad]
        marker = _marker_problem(r.marker, ours)
        if marker:
            r.problems.append(marker)
        r.notes = notes


def _rule(expect: Expectation, field: str) -> str:
    return next((k for k, v in expect.fields.items() if v == field), field)


def failure_message(props: dict, results: list[NodeResult], action: str) -> str:
    failed = [r for r in results if r.problems]
    batch = results[0].host if len(results) == 1 else f"{results[0].host} … {results[-1].host}"
    lines = [f"node group '{props['group']}' ({props['target']}): {len(failed)} of {len(results)} node(s) "
             f"cannot be {action}; this batch ({batch}) was not {action}:"]
    for r in failed[:MAX_LISTED]:
        lines.append(f"  {r.host} ({r.target.where}):")
        lines += [f"    {p}" for p in r.problems or []]
    if len(failed) > MAX_LISTED:
        lines.append(f"  … and {len(failed) - MAX_LISTED} more: {', '.join(r.host for r in failed[MAX_LISTED:])}")
    lines.append(f"fix the machines, or the spec ({props.get('spec', 'the spec')}) if it is wrong, and run "
                 "pulumi up again")
    return "\n".join(lines)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def _write_marker(target: ssh.SshTarget, pkey, content: dict) -> str | None:
    text = json.dumps(content, sort_keys=True) + "\n"
    script = (f"umask 022; mkdir -p {shlex.quote(MARKER.rsplit('/', 1)[0])} && cat > {MARKER}.tmp "
              f"&& mv {MARKER}.tmp {MARKER}")
    try:
        client = ssh.connect(target, pkey)
    except ssh.NodeError as exc:
        return str(exc)
    try:
        code, _out, err = ssh.run(client, f"{_sudo(target)}/bin/sh -c {shlex.quote(script)}", target, stdin=text)
    except ssh.NodeError as exc:
        return str(exc)
    finally:
        client.close()
    if code != 0:
        return (f"cannot write {MARKER} ({err.strip()[-200:] or f'exit {code}'}): enrollment needs root, "
                "or passwordless sudo for the SSH user")
    return None


def _remove_marker(target: ssh.SshTarget, pkey, ours: dict) -> str | None:
    """Remove the marker when it is ours. Returns why not, or None."""
    script = f"cat {MARKER} 2>/dev/null"
    try:
        client = ssh.connect(target, pkey)
    except ssh.NodeError as exc:
        return str(exc)
    try:
        _code, out, _err = ssh.run(client, script, target)
        try:
            marker = json.loads(out) if out.strip() else None
        except ValueError:
            marker = None
        if not marker or {k: marker.get(k) for k in ours} != ours:
            return None  # not ours (or gone): leave it alone
        code, _out, err = ssh.run(client, f"{_sudo(target)}rm -f {MARKER}", target)
        return None if code == 0 else f"cannot remove {MARKER}: {err.strip()[-200:]}"
    except ssh.NodeError as exc:
        return str(exc)
    finally:
        client.close()


def notes_by_text(results: list[NodeResult]) -> dict[str, str]:
    """{note: hostlist of the nodes it applies to}: a note shared by 3,000 nodes is one entry."""
    by_note: dict[str, list[str]] = {}
    for r in results:
        for n in r.notes or []:
            by_note.setdefault(n, []).append(r.host)
    return {n: hostlist.collect_hostlist(hosts) for n, hosts in by_note.items()}


def summary(results: list[NodeResult]) -> dict:
    return {
        "facts": {r.host: r.facts.to_text() for r in results if r.facts is not None},
        "notes": notes_by_text(results),
    }


def enroll(props: dict) -> dict:
    """create/update: probe every node, compare, then mark all of them; all or nothing per batch."""
    try:
        pkey = _key(props)
    except ssh.NodeError as exc:
        raise EnrollError(f"node group '{props['group']}': {exc}") from None
    results = _parallel(props, probe, pkey)
    check(props, results)
    if any(r.problems for r in results):
        raise EnrollError(failure_message(props, results, "enrolled"))
    ours = owner(props)
    stamp = _now()
    content = {**ours, "group": props["group"], "enrolled_at": stamp}
    marked = _parallel(props, lambda t, k: NodeResult(t.host, t, error=_write_marker(t, k, content)), pkey)
    if any(m.error for m in marked):
        for r, m in zip(results, marked, strict=True):
            r.problems = [m.error] if m.error else []
        # undo the markers this attempt wrote, so a failed batch leaves the machines as they were
        written = {m.host for m in marked if not m.error}
        _parallel({**props, "nodes": [n for n in props["nodes"] if parse_entry(n)[0] in written]},
                  lambda t, k: NodeResult(t.host, t, error=_remove_marker(t, k, ours)), pkey)
        raise EnrollError(failure_message(props, results, "enrolled"))
    return {**props, **summary(results), "drift": {}, "enrolled": len(results), "enrolled_at": stamp}


def refresh(props: dict) -> dict:
    """read: probe again and report drift against what was enrolled. An unreachable node is drift,
    not an error, so one dead node does not stop `pulumi refresh` of the other few thousand."""
    results = _parallel(props, probe)
    check(props, results)
    before = props.get("facts") or {}
    ours = owner(props)
    facts, drifts = {}, {}
    for r in results:
        lines: list[str] = []
        if r.facts is None:
            lines.append(f"unreachable: {r.error}")
            if r.host in before:
                facts[r.host] = before[r.host]  # keep the last known facts
        else:
            facts[r.host] = r.facts.to_text()
            lines += drift(_facts_dict(before.get(r.host)), r.facts.as_dict())
            if r.marker is None or {k: r.marker.get(k) for k in ours} != ours:
                lines.append(f"{MARKER}: {'missing' if r.marker is None else 'names another stack'}")
            lines += [f"no longer matches the spec: {p}" for p in r.problems or []]
        if lines:
            drifts[r.host] = sorted(set(lines), key=lines.index)
    return {**props, "facts": facts, "drift": drifts, "notes": notes_by_text(results) or props.get("notes", {})}


def _facts_dict(text) -> dict:
    if not text:
        return {}
    try:
        return json.loads(text) if isinstance(text, str) else dict(text)
    except ValueError:
        return {}


def release(props: dict) -> list[str]:
    """delete: remove our marker from reachable nodes; never fail (a node may be gone for good).
    Returns the nodes it could not reach, for the log."""
    ours = owner(props)
    try:
        results = _parallel(props, lambda t, k: NodeResult(t.host, t, error=_remove_marker(t, k, ours)))
    except EnrollError as exc:
        return [str(exc)]
    return [f"{r.host}: {r.error}" for r in results if r.error]
