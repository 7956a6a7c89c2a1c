"""discover: what a dump says about itself, without a plan.

Tiers are inferred from where the hosts are: a switch with host ports is a leaf, a switch reached only
through leaves is a spine, one reached only through spines a core, and so on up (breadth first from the
leaves over switch-to-switch links). Bundles are switch pairs with their link counts; a bundle with
fewer links than the most common count between the same two tiers is degraded.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from gpucluster.fabric.asbuilt.findings import Finding, by_kind, ordered
from gpucluster.fabric.asbuilt.graph import AGGREGATION, HCA, PORT_SPAN, ROUTER, SWITCH, Fabric, rate_gbps
from gpucluster.fabric.asbuilt.names import host_and_device, why_unidentified

TIER_NAMES = {1: "leaf", 2: "spine", 3: "core"}


def tier_name(level: int) -> str:
    return TIER_NAMES.get(level, f"tier{level}" if level else "isolated")


def switch_levels(fab: Fabric) -> dict[int, int]:
    """Switch node -> level (1 leaf, 2 spine, ...; 0 when no host is reachable from it)."""
    nodes = fab.nodes
    level: dict[int, int] = {}
    frontier = []
    for i, node in enumerate(nodes):
        if node.kind != SWITCH:
            continue
        level[i] = 0
        if any(nodes[peer // PORT_SPAN].kind == HCA for _, peer in node.ports()):
            level[i] = 1
            frontier.append(i)
    depth = 1
    while frontier:
        depth += 1
        nxt = []
        for i in frontier:
            for _, peer in nodes[i].ports():
                j = peer // PORT_SPAN
                if level.get(j) == 0:
                    level[j] = depth
                    nxt.append(j)
        frontier = nxt
    return level


def _switch_names(fab: Fabric, switches: list[int]) -> dict[int, str]:
    """A switch's description, or its GUID where the description is empty or shared by several."""
    counts = Counter(fab.nodes[i].desc for i in switches)
    out = {}
    for i in switches:
        desc = fab.nodes[i].desc
        key = fab.nodes[i].key
        key = key.decode() if isinstance(key, bytes) else str(key)
        out[i] = desc if desc and counts[desc] == 1 else f"{desc or 'switch'} [{key}]"
    return out


def discover(fab: Fabric, advance: Callable[[int], None] | None = None) -> dict:
    """The `fabric discover --json` document. Contract keys: switches, tiers, hosts, host_ports,
    unidentified, bundles, degraded_bundles, findings (more may be added; none removed or renamed)."""
    nodes = fab.nodes
    level = switch_levels(fab)
    names = _switch_names(fab, sorted(level))
    findings: list[Finding] = list(fab.findings)
    hosts: set[str] = set()
    host_ports = 0
    unidentified = []
    aggregation = routers = 0
    bundle: Counter = Counter()
    rates_by_pair: dict[tuple[str, str], Counter] = defaultdict(Counter)
    links_by_pair: dict[tuple[str, str], list] = defaultdict(list)
    for n_link, (a, pa, b, pb, rate) in enumerate(fab.links(), 1):
        if advance is not None and not n_link % 10000:
            advance(10000)
        ka, kb = nodes[a].kind, nodes[b].kind
        if ka == SWITCH and kb == SWITCH:
            x, y = (a, b) if (level[a], names[a]) <= (level[b], names[b]) else (b, a)
            bundle[(x, y)] += 1
            pair = (tier_name(level[x]), tier_name(level[y]))
        elif SWITCH in (ka, kb):
            other = b if ka == SWITCH else a
            pair = ("host", tier_name(level[a if ka == SWITCH else b]))
            if nodes[other].kind == AGGREGATION:
                continue
        else:
            pair = (ka, kb)
        rates_by_pair[pair][rate] += 1
        links_by_pair[pair].append((a, pa, b, pb, rate))
    for _i, node in enumerate(nodes):
        if node.kind == AGGREGATION:
            aggregation += 1
        elif node.kind == ROUTER:
            routers += 1
        elif node.kind == HCA:
            named = host_and_device(node.desc)
            for port, peer in node.ports():
                sw = peer // PORT_SPAN
                if nodes[sw].kind != SWITCH:
                    continue
                host_ports += 1
                if named:
                    hosts.add(named[0])
                    continue
                where = f"{names[sw]} port {peer % PORT_SPAN}"
                unidentified.append({"description": node.desc or "", "guid": _key(node.key), "port": port,
                                     "switch": names[sw], "switch_port": peer % PORT_SPAN})
                findings.append(Finding("unidentified-endpoint",
                                        f"{where}: an HCA with {why_unidentified(node.desc)}",
                                        "set the host's name and its HCAs' node descriptions (rdma-ndd)",
                                        detail={"at": where, "description": node.desc or ""}))
    # bundles between the same two tiers should carry the same number of links
    by_tiers: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for (x, y), n in bundle.items():
        by_tiers[(tier_name(level[x]), tier_name(level[y]))][n] += 1
    usual = {tiers: counts.most_common(1)[0][0] for tiers, counts in by_tiers.items()}
    bundles, degraded = [], []
    for (x, y), n in sorted(bundle.items(), key=lambda kv: (level[kv[0][0]], names[kv[0][0]], names[kv[0][1]])):
        tiers = (tier_name(level[x]), tier_name(level[y]))
        row = {"a": names[x], "b": names[y], "tiers": "-".join(tiers), "links": n}
        bundles.append(row)
        if n < usual[tiers]:
            degraded.append({**row, "usual": usual[tiers]})
            findings.append(Finding("degraded-bundle", f"{names[x]} - {names[y]}: {n} link(s), where most "
                                    f"{'-'.join(tiers)} bundles have {usual[tiers]}",
                                    "find the missing cable(s) between the two switches (ibnetdiscover shows "
                                    "which ports are up)", detail=row))
    # a link slower than the usual rate between the same two tiers
    for pair, counts in sorted(rates_by_pair.items()):
        common = counts.most_common(1)[0][0]
        common_gbps = rate_gbps(common) or 0
        for a, pa, b, pb, rate in links_by_pair[pair]:
            if rate != common and (rate_gbps(rate) or 0) < common_gbps:
                what = f"{_end(fab, names, a, pa)} - {_end(fab, names, b, pb)}"
                findings.append(Finding("wrong-speed", f"{what} is up at {rate}; most {'-'.join(pair)} links run "
                                        f"{common}", "reseat or replace the cable/transceiver",
                                        detail={"a": _end(fab, names, a, pa), "b": _end(fab, names, b, pb),
                                                "rate": rate, "usual": common}))
    tiers = Counter(tier_name(lv) for lv in level.values())
    findings = ordered(findings)
    return {
        "source": fab.source,
        "switches": len(level),
        "tiers": dict(sorted(tiers.items(), key=lambda kv: _tier_order(kv[0]))),
        "hosts": len(hosts),
        "host_ports": host_ports,
        "unidentified": unidentified,
        "aggregation_nodes": aggregation,
        "routers": routers,
        "links": sum(rates_by_pair[p].total() for p in rates_by_pair),
        "rates": {"-".join(p): dict(c) for p, c in sorted(rates_by_pair.items())},
        "bundles": bundles,
        "degraded_bundles": degraded,
        "findings": [f.as_dict() for f in findings],
        "findings_by_kind": by_kind(findings),
    }


def _tier_order(name: str) -> int:
    order = {"leaf": 1, "spine": 2, "core": 3, "isolated": 99}
    return order.get(name, int(name[4:]) if name.startswith("tier") and name[4:].isdigit() else 50)


def _key(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def _end(fab: Fabric, names: dict[int, str], node: int, port: int) -> str:
    if node in names:
        return f"{names[node]} port {port}"
    return f"{fab.label(node)}" + (f" port {port}" if port != 1 else "")
