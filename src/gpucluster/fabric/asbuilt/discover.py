"""discover: what a dump says about itself, without a plan.

Tiers are inferred from where the hosts are: a switch with host ports is a leaf, a switch reached only
through leaves is a spine, one reached only through spines a core, and so on up (breadth first from the
leaves over switch-to-switch links). Bundles are switch pairs with their link counts; a bundle with
fewer links than the most common count between the same two tiers is degraded.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

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


@dataclass
class _Links:
    """The dump's links by class: per pair of tiers (host and tier for a host's link) how many run at each
    rate and which they are, and per switch pair (the lower switch first) the links bundled between them."""

    bundles: Counter = field(default_factory=Counter)
    rates: dict[tuple[str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    by_pair: dict[tuple[str, str], list] = field(default_factory=lambda: defaultdict(list))


@dataclass
class _Endpoints:
    """What the nodes other than switches are: the hosts named, the HCA ports on a switch, the HCAs whose
    description names no host (each with its finding), and the SHARP aggregation nodes and routers."""

    hosts: set[str]
    ports: int
    unidentified: list[dict]
    findings: list[Finding]
    aggregation: int
    routers: int


def discover(fab: Fabric, advance: Callable[[int], None] | None = None) -> dict:
    """The `fabric discover --json` document. Contract keys: switches, tiers, hosts, host_ports,
    unidentified, bundles, degraded_bundles, findings (more may be added; none removed or renamed)."""
    level = switch_levels(fab)
    names = _switch_names(fab, sorted(level))
    links = _classify_links(fab, level, names, advance)
    ends = _endpoints(fab, names)
    bundles, degraded, bundle_findings = _bundles(level, names, links.bundles)
    findings = ordered([*fab.findings, *ends.findings, *bundle_findings, *_wrong_speeds(fab, names, links)])
    tiers = Counter(tier_name(lv) for lv in level.values())
    return {
        "source": fab.source,
        "switches": len(level),
        "tiers": dict(sorted(tiers.items(), key=lambda kv: _tier_order(kv[0]))),
        "hosts": len(ends.hosts),
        "host_ports": ends.ports,
        "unidentified": ends.unidentified,
        "aggregation_nodes": ends.aggregation,
        "routers": ends.routers,
        "links": sum(links.rates[p].total() for p in links.rates),
        "rates": {"-".join(p): dict(c) for p, c in sorted(links.rates.items())},
        "bundles": bundles,
        "degraded_bundles": degraded,
        "findings": [f.as_dict() for f in findings],
        "findings_by_kind": by_kind(findings),
    }


def _classify_links(fab: Fabric, level: dict[int, int], names: dict[int, str],
                    advance: Callable[[int], None] | None) -> _Links:
    """Every link by the tiers it joins (a link to an aggregation node left out), telling `advance` each
    10,000 links."""
    nodes = fab.nodes
    out = _Links()
    bundle, rates_by_pair, links_by_pair = out.bundles, out.rates, out.by_pair
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
    return out


def _endpoints(fab: Fabric, names: dict[int, str]) -> _Endpoints:
    """The nodes other than switches, in the dump's order: an HCA counts a host when its description names
    one, else it is unidentified, once per port on a switch."""
    nodes = fab.nodes
    hosts: set[str] = set()
    host_ports = 0
    unidentified: list[dict] = []
    findings: list[Finding] = []
    aggregation = routers = 0
    for node in nodes:
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
    return _Endpoints(hosts, host_ports, unidentified, findings, aggregation, routers)


def _bundles(level: dict[int, int], names: dict[int, str],
             bundle: Counter) -> tuple[list[dict], list[dict], list[Finding]]:
    """The bundles in tier and name order, the degraded ones and their findings: bundles between the same
    two tiers should carry the same number of links, the most common one."""
    by_tiers: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for (x, y), n in bundle.items():
        by_tiers[(tier_name(level[x]), tier_name(level[y]))][n] += 1
    usual = {tiers: counts.most_common(1)[0][0] for tiers, counts in by_tiers.items()}
    bundles, degraded, findings = [], [], []
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
    return bundles, degraded, findings


def _wrong_speeds(fab: Fabric, names: dict[int, str], links: _Links) -> list[Finding]:
    """A finding per link slower than the most common rate between the same two tiers."""
    findings = []
    for pair, counts in sorted(links.rates.items()):
        common = counts.most_common(1)[0][0]
        common_gbps = rate_gbps(common) or 0
        for a, pa, b, pb, rate in links.by_pair[pair]:
            if rate != common and (rate_gbps(rate) or 0) < common_gbps:
                what = f"{_end(fab, names, a, pa)} - {_end(fab, names, b, pb)}"
                findings.append(Finding("wrong-speed", f"{what} is up at {rate}; most {'-'.join(pair)} links run "
                                        f"{common}", "reseat or replace the cable/transceiver",
                                        detail={"a": _end(fab, names, a, pa), "b": _end(fab, names, b, pb),
                                                "rate": rate, "usual": common}))
    return findings


def _tier_order(name: str) -> int:
    order = {"leaf": 1, "spine": 2, "core": 3, "isolated": 99}
    return order.get(name, int(name[4:]) if name.startswith("tier") and name[4:].isdigit() else 50)


def _key(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def _end(fab: Fabric, names: dict[int, str], node: int, port: int) -> str:
    if node in names:
        return f"{names[node]} port {port}"
    return f"{fab.label(node)}" + (f" port {port}" if port != 1 else "")
