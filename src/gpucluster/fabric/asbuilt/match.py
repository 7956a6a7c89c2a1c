"""Which discovered node is which planned device: by description, by the site's names, or by position.

Switches are matched by their node description (or LLDP system name): the plan's name itself, the
first word of it, the part between ';' and ':' of a UFM-style "MF0;su0001-r3:MQM9700/U1", or what
--switch-pattern extracts. HCAs are matched by "<host> <device>" (rdma-ndd's format), the host through
the --sites map. What stays unmatched is inferred later from graph position (verify's votes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpucluster.fabric.asbuilt.graph import HCA, NO_PEER, PORT_SPAN, SWITCH, Fabric
from gpucluster.fabric.asbuilt.names import DEFAULT_HOSTNAMES, SiteNames, host_and_device
from gpucluster.fabric.asbuilt.planned import PlanIndex


def switch_candidates(desc: str) -> list[str]:
    text = desc.strip()
    out = [text]
    if text.split():
        out.append(text.split()[0])
    if ";" in text:
        out.append(text.split(";", 1)[1].split(":", 1)[0])
    return out


@dataclass
class Match:
    sw_node: dict[str, int] = field(default_factory=dict)  # plan switch -> discovered node
    sw_name: dict[int, str] = field(default_factory=dict)  # discovered node -> plan switch
    hca_node: dict[str, int] = field(default_factory=dict)  # "host,hca" -> discovered port end (node*SPAN+port)
    hca_key: dict[int, str] = field(default_factory=dict)  # port end -> "host,hca"
    hosts_seen: set[str] = field(default_factory=set)  # plan hosts with at least one HCA in the dump
    unidentified: list[int] = field(default_factory=list)  # HCA nodes with no usable name
    unplanned_hosts: dict[int, str] = field(default_factory=dict)  # HCA node -> a host name the plan lacks
    pending: dict[int, tuple[str, str]] = field(default_factory=dict)  # port end -> (plan host, device word)
    unresolved: set[int] = field(default_factory=set)  # switches not (yet) matched
    duplicate: dict[int, str] = field(default_factory=dict)  # a second switch claiming a plan name
    how: Counter = field(default_factory=Counter)
    inferred_switches: dict[str, str] = field(default_factory=dict)  # plan name -> discovered label
    inferred_devices: dict[str, str] = field(default_factory=dict)  # device word -> plan HCA name

    def set_switch(self, node: int, name: str) -> None:
        self.sw_node[name] = node
        self.sw_name[node] = name
        self.unresolved.discard(node)

    def set_hca(self, end: int, host: str, hca: str) -> None:
        key = f"{host},{hca}"
        self.hca_node[key] = end
        self.hca_key[end] = key
        self.pending.pop(end, None)

    def planned_end(self, code: int) -> tuple[str, int | str] | None:
        """The plan's (device, port) for a discovered port end; None for an unmatched node."""
        name = self.sw_name.get(code // PORT_SPAN)
        if name is not None:
            return name, code % PORT_SPAN
        key = self.hca_key.get(code)
        if key is None:
            return None
        host, _, hca = key.partition(",")
        return host, hca

    def discovered_end(self, end: tuple[str, int | str]) -> int | None:
        dev, port = end
        if isinstance(port, int):
            node = self.sw_node.get(dev)
            return None if node is None else node * PORT_SPAN + port
        return self.hca_node.get(f"{dev},{port}")


def resolve(fab: Fabric, idx: PlanIndex, site: SiteNames) -> Match:
    """Match every node the names allow. A host's HCA named "<host> <planned HCA>" takes the fast path
    (200,000 of them in a Colossus-size dump); anything else is read in full."""
    m = Match()
    hca_sets = {g: frozenset(h) for g, h in idx.group_hcas.items()}
    host_group, mapped, defaults = idx.host_group, site.hosts, DEFAULT_HOSTNAMES
    set_hca, seen = m.set_hca, m.hosts_seen.add
    by_desc = by_map = 0
    for i, node in enumerate(fab.nodes):
        kind = node.kind
        if kind == HCA:
            desc = node.desc
            parts = desc.split() if desc else ()
            if len(parts) == 2 and len(node.peers) == 2 and node.peers[1] != NO_PEER \
                    and parts[0].lower() not in defaults:
                site_host, dev = parts
                host = mapped.get(site_host, site_host)
                group = host_group.get(host)
                if group is not None and dev in hca_sets[group]:
                    set_hca(i * PORT_SPAN + 1, host, dev)
                    seen(host)
                    if host is site_host:
                        by_desc += 1
                    else:
                        by_map += 1
                    continue
            named = host_and_device(desc)
            if named is None:
                m.unidentified.append(i)
                continue
            site_host, dev = named
            host = site.host(site_host)
            if host not in host_group:
                m.unplanned_hosts[i] = site_host
                continue
            seen(host)
            hcas = idx.hcas_of(host)
            for port, _peer in node.ports():
                end = i * PORT_SPAN + port
                word = dev if port == 1 else f"{dev}/{port}"
                if word in hcas:
                    set_hca(end, host, word)
                    if host == site_host:
                        by_desc += 1
                    else:
                        by_map += 1
                else:
                    m.pending[end] = (host, word)
        elif kind == SWITCH:
            desc = node.desc or ""
            name, how = None, ""
            if site.switch_pattern is not None:
                name, how = site.switch(desc), "pattern"
            if name is None:
                name = next((c for c in switch_candidates(desc) if c in idx.switch_tier), None)
                how = "description"
            if name is None or name not in idx.switch_tier:
                m.unresolved.add(i)
            elif name in m.sw_node:
                m.duplicate[i] = name
            else:
                m.set_switch(i, name)
                m.how[f"switches by {how}"] += 1
    if by_desc:
        m.how["HCAs by description"] = by_desc
    if by_map:
        m.how["HCAs by --sites"] = by_map
    return m
