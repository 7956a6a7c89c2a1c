"""The SSH part of `gpucluster health status` and its entry points, fleet_status and fleet_report (the parsing is
status.py's and breakerstate.py's), and of `gpucluster health reset-breaker` (reset_breaker).

Hosts are the inventory's (anything with .name and .ssh_argv, as inventory.reader.Host), reached through
gpucluster.slurmclient as Ansible reaches them: batch mode, host keys checked, the inventory's key and options.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpucluster.render.health.config import STATE_DIR
from gpucluster.slurmclient import Client, SlurmError, failed, slurm_host


def state_files(hosts: list, workers: int = 16, timeout: float = 30) -> tuple[dict[str, str], dict[str, str]]:
    """({node: state.json text}, {node: why it could not be read}), fetched in parallel."""
    texts, errors = {}, {}

    def one(host) -> None:
        try:
            res = Client(host, timeout=timeout)(["cat", f"{STATE_DIR}/state.json"])
        except SlurmError as exc:
            errors[host.name] = " ".join(str(exc).split())[:200]
            return
        if res.returncode == 0:
            texts[host.name] = res.stdout
        else:
            errors[host.name] = " ".join((res.stderr or f"exit {res.returncode}").split())[:200]

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(hosts) or 1))) as pool:
        list(pool.map(one, hosts))
    return texts, errors


def fleet_status(inventory, limit: str | None = None) -> list:
    """`gpucluster health status`: the rows of status.merge for the inventory's compute nodes (those of `limit`),
    from Slurm's node table and reasons, asked of the first login node, else the first controller, and each node's
    state file. Refused (UsageError) where the inventory has no host to ask Slurm from; SlurmError (an
    OperationError) where Slurm does not answer."""
    return fleet_report(inventory, limit)[0]


def fleet_report(inventory, limit: str | None = None) -> tuple[list, list]:
    """fleet_status's rows, and each compute group's circuit breaker (health.breakerstate.GroupBreaker), read from
    the same host in the same way."""
    from gpucluster.health import breakerstate, status
    from gpucluster.inventory.reader import load_inventory

    inv = load_inventory(inventory)
    slurm = Client(slurm_host(inv, "to ask Slurm from"), timeout=60)
    asked = (status.SHOW_NODES, status.SINFO_REASONS, breakerstate.RESERVATIONS, breakerstate.LICENSES)
    texts = [slurm.check(argv).stdout for argv in asked]
    nodes = [n for n in inv.select(limit) if n in inv.group("slurm_compute")]
    raw, errors = state_files([inv.hosts[n] for n in nodes])
    states = {n: status.parse_state_file(t) for n, t in raw.items()}
    return status.merge(texts[0], texts[1], states, errors, nodes), breakerstate.breakers(texts[2], texts[3])


def reset_breaker(inventory, group: str | None = None) -> list[str]:
    """`gpucluster health reset-breaker`: delete the latch and the window's drain tokens of `group` (None: every
    group) with scontrol on the first controller; the reservations deleted, by name. SlurmError when scontrol
    refuses one (the rest are still tried first)."""
    from gpucluster.health import breakerstate
    from gpucluster.inventory.reader import load_inventory

    inv = load_inventory(inventory)
    slurm = Client(slurm_host(inv, "to run scontrol on (reset-breaker deletes reservations)",
                              ("slurm_controller",)), timeout=60)
    deleted, errors = [], []
    for argv in breakerstate.reset_commands(slurm.check(breakerstate.RESERVATIONS).stdout, group):
        res = slurm(argv)
        if res.returncode == 0:
            deleted.append(argv[-1])
        else:
            errors.append(failed(argv, res, slurm.where))
    if errors:
        raise errors[0]
    return deleted


def ticket_inputs(inventory, node: str) -> tuple[dict, dict]:
    """`gpucluster health ticket`: (the node's plan, health.ticket.node_plan's, from the spec the inventory names;
    the evidence health.ticket.build takes: Slurm's state and reason of the node, asked as `health status` asks,
    and the node's state file). What cannot be read is recorded in the evidence, not raised: a node that does
    not answer still gets its ticket. UsageError where the inventory names no spec or the node is not in it."""
    import time

    from gpucluster.cluster import load_cluster
    from gpucluster.errors import OperationError, UsageError, shown
    from gpucluster.health import status, ticket
    from gpucluster.inventory.reader import load_inventory

    inv = load_inventory(inventory)
    spec = inv.vars.get("gpucluster_spec")
    if not spec or not Path(str(spec)).is_file():
        raise UsageError(f"{inv.path}: all.vars.gpucluster_spec is {spec or 'missing'}, not a spec file here; "
                         "rewrite the inventory with `gpucluster inventory SPEC`")
    host = inv.hosts.get(node)
    plan = ticket.node_plan(load_cluster(str(spec)), node, host.vars if host else None)
    if host is None:
        raise UsageError(f"NODE {shown(node)}: not a host of the inventory {inv.path}; give one of its compute nodes")
    evidence: dict = {"made": time.time()}
    try:
        text = Client(slurm_host(inv, "to ask Slurm from"), timeout=60).check(status.SHOW_NODES).stdout
        row = status.merge(text, "", {}, None, [node])[0]
        evidence["slurm"] = {"state": row.state, "reason": row.reason, "reason_user": row.reason_user,
                             "reason_time": row.reason_time}
    except OperationError as exc:  # SlurmError, or slurmtext.SlurmOutputError: output not the node table
        evidence["slurm"] = {"error": " ".join(str(exc).split())[:300]}
    texts, errors = state_files([host])
    evidence["health"] = status.parse_state_file(texts[node]) if node in texts else {}
    evidence["health_error"] = errors.get(node)
    return plan, evidence


def post_ticket(url: str, doc: dict, timeout: float = 20) -> int:
    """POST the ticket as JSON to `url` (checked by health.ticket.check_webhook); the HTTP status. OperationError
    when the receiver cannot be reached or answers with an error."""
    import json
    import urllib.error
    import urllib.request

    from gpucluster.errors import OperationError, shown

    body = json.dumps(doc, sort_keys=True).encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "gpucluster"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status
    except urllib.error.HTTPError as exc:
        raise OperationError(f"--webhook {shown(url)}: the receiver answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        raise OperationError(f"--webhook {shown(url)}: not posted: {why}") from None


def accept_node(inventory, node: str, why: str):
    """`gpucluster health accept`: health.accept.accept() with the controller's scontrol and sbatch, the node over
    SSH, and the node group's single-node active job scripts that the controller has (slurm_health installs them
    where health.active is on). UsageError for a node the inventory or Slurm does not know, or one that cannot
    enter acceptance (drained by hand, in service)."""
    from gpucluster.errors import UsageError, shown
    from gpucluster.health import accept, status
    from gpucluster.inventory.reader import load_inventory
    from gpucluster.render.health.slurmconf import LIB_DIR, PROGRAM

    inv = load_inventory(inventory)
    host = inv.hosts.get(node)
    if host is None or node not in inv.group("slurm_compute"):
        raise UsageError(f"NODE {shown(node)}: not a compute node of the inventory {inv.path}; give one of them")
    slurm = Client(slurm_host(inv, "to run scontrol and sbatch on (accept reserves and resumes the node)",
                              ("slurm_controller",)), timeout=3600)
    on_node = Client(host, timeout=120)

    def show() -> tuple[str, str]:
        row = status.merge(slurm.check(status.SHOW_NODES).stdout, "", {}, None, [node])[0]
        return row.state, row.reason

    group = str(host.vars.get("gpucluster_node_group", ""))
    scripts = []
    for check in accept.SINGLE_NODE:
        path = f"{LIB_DIR}/active-{check}-{group}.sh"
        if group and slurm(["test", "-f", path]).returncode == 0:
            scripts.append((check, path))
    try:
        return accept.accept(node, slurm, on_node, show, PROGRAM, scripts, f"{STATE_DIR}/state.json", why)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def service_required(inventory) -> list[tuple[str, float]]:
    """[(node, since when)] for each compute node in service-required: Slurm's reason says so (`gpc:service:`);
    since when, from the node's lifecycle record, else now."""
    import time

    from gpucluster.node import decide, nodestate

    rows, _breakers = fleet_report(inventory)
    out = []
    for r in rows:
        if decide.check_of(r.reason) == nodestate.SERVICE_REASON:
            rec = nodestate.load(r.lifecycle)
            out.append((r.name, rec["since"] if rec["state"] == nodestate.SERVICE and rec["since"] else time.time()))
    return out
