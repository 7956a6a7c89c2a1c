"""The discovered fabric as one neutral graph, whatever tool saw it (ibnetdiscover, LLDP).

Sized for a 25,000-node dump: a node is a slotted object, and its ports are two flat arrays (peer as
one int, rate as one byte) rather than an object per port, so 1.2 million port ends cost ~12 MB.
A peer is encoded as `node_index * PORT_SPAN + port`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpucluster.fabric.asbuilt.findings import Finding

PORT_SPAN = 1024  # IB port numbers are 8-bit; Ethernet switch ports are numbered 1..radix
NO_PEER = -1

# Node kinds. An HCA is one channel adapter (one RDMA device); a host owns one or more.
SWITCH, HCA, ROUTER, AGGREGATION = "switch", "hca", "router", "aggregation"

# Per-lane signalling rates in Gb/s, by the names ibnetdiscover prints (libibmad's *_compat strings).
LANE_GBPS = {"SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0, "HDR": 50.0,
             "NDR": 100.0, "XDR": 200.0}
WIDTHS = {"1x": 1, "2x": 2, "4x": 4, "8x": 8, "12x": 12}


def rate_gbps(rate: str) -> float | None:
    """'4xNDR' -> 400.0, '400G' -> 400.0; None when the text names no rate we know."""
    width, x, lane = rate.partition("x")
    if x and width + "x" in WIDTHS and lane in LANE_GBPS:
        return WIDTHS[width + "x"] * LANE_GBPS[lane]
    if rate.endswith("G") and rate[:-1].isdigit():
        return float(rate[:-1])
    return None


def ib_rate_name(gbps: int) -> str:
    """The 4-lane IB name of a planned speed: 400 -> '4xNDR'; '<n>G' where no IB generation fits."""
    for lane, per in LANE_GBPS.items():
        if lane != "FDR10" and per * 4 == gbps:
            return f"4x{lane}"
    return f"{gbps}G"


class Node:
    """A switch, an HCA (channel adapter), a router or a SHARP aggregation node, as discovered."""

    __slots__ = ("desc", "key", "kind", "line", "nports", "peers", "rates")

    def __init__(self, key: object, kind: str, desc: str | None = None, nports: int = 0, line: int = 0):
        self.key = key  # node GUID (int) for IB, chassis name/id for LLDP
        self.kind = kind
        self.desc = desc  # node description / system name; None when the dump gave none
        self.nports = nports
        self.line = line  # where the node's own block starts (0: only seen as a peer)
        self.peers = array("i", [NO_PEER]) * (nports + 1)
        self.rates = bytearray(nports + 1)

    def grow(self, port: int) -> None:
        if port >= len(self.peers):
            more = max(port + 1, 2 * len(self.peers)) - len(self.peers)
            self.peers.extend(array("i", [NO_PEER]) * more)
            self.rates.extend(bytes(more))

    def ports(self) -> Iterator[tuple[int, int]]:
        """(port, peer code) for every connected port."""
        for port, peer in enumerate(self.peers):
            if peer != NO_PEER:
                yield port, peer


@dataclass
class Fabric:
    """Nodes and links as one tool reported them, plus the lines it could not read (findings)."""

    source: str = ""
    nodes: list[Node] = field(default_factory=list)
    by_key: dict[object, int] = field(default_factory=dict)
    rate_names: list[str] = field(default_factory=lambda: [""])
    rate_codes: dict[str, int] = field(default_factory=lambda: {"": 0})
    findings: list[Finding] = field(default_factory=list)

    def node(self, key: object, kind: str, desc: str | None = None, nports: int = 0, line: int = 0) -> int:
        """The index of the node with this key, created on first sight (as a peer or as a block)."""
        i = self.by_key.get(key)
        if i is None:
            i = self.by_key[key] = len(self.nodes)
            self.nodes.append(Node(key, kind, desc, nports, line))
            return i
        n = self.nodes[i]
        if desc is not None and n.desc is None:
            n.desc = desc
        if line and not n.line:
            n.line = line
            n.kind = kind
        if nports > n.nports:
            n.nports = nports
            n.grow(nports)
        return i

    def rate_code(self, rate: str) -> int:
        code = self.rate_codes.get(rate)
        if code is None:
            if len(self.rate_names) >= 255:
                return 0
            code = self.rate_codes[rate] = len(self.rate_names)
            self.rate_names.append(rate)
        return code

    def connect(self, a: int, pa: int, b: int, pb: int, rate: int, line: int = 0) -> None:
        """Record a link seen from a's side. The other side's own line only confirms it; a side that
        already points elsewhere is a contradiction in the dump, reported as a finding."""
        na, nb = self.nodes[a], self.nodes[b]
        if pa >= len(na.peers):
            na.grow(pa)
        if pb >= len(nb.peers):
            nb.grow(pb)
        want_b, want_a = b * PORT_SPAN + pb, a * PORT_SPAN + pa
        for node, port, want, old in ((a, pa, want_b, na.peers[pa]), (b, pb, want_a, nb.peers[pb])):
            if old != NO_PEER and old != want:
                self.findings.append(Finding(
                    "dump-conflict", f"{self.label(node)} port {port} is listed as linked to {self.end_label(old)} "
                    f"and to {self.end_label(want)}", fix="take a fresh dump; the fabric changed while it ran",
                    where=f"{self.source}:{line}" if line else self.source))
        na.peers[pa] = want_b
        nb.peers[pb] = want_a
        if rate:
            na.rates[pa] = rate
            nb.rates[pb] = rate

    # ---- reading ------------------------------------------------------------------------------
    def label(self, i: int) -> str:
        n = self.nodes[i]
        if n.desc:
            return n.desc
        key = n.key.decode() if isinstance(n.key, bytes) else n.key
        return f"{n.kind} {key}"

    def end_label(self, code: int) -> str:
        return f"{self.label(code // PORT_SPAN)} port {code % PORT_SPAN}"

    def peer(self, i: int, port: int) -> int:
        peers = self.nodes[i].peers
        return peers[port] if port < len(peers) else NO_PEER

    def rate(self, i: int, port: int) -> str:
        rates = self.nodes[i].rates
        return self.rate_names[rates[port]] if port < len(rates) else ""

    def links(self) -> Iterator[tuple[int, int, int, int, str]]:
        """Each link once: (a, port a, b, port b, rate name), from the side with the lower end code."""
        names = self.rate_names
        for a, node in enumerate(self.nodes):
            base = a * PORT_SPAN
            for pa, code in enumerate(node.peers):
                if code > base + pa:
                    yield a, pa, code // PORT_SPAN, code % PORT_SPAN, names[node.rates[pa]]

    def link_count(self) -> int:
        """Links in the graph (each counted once), without walking them in Python."""
        ends = sum(len(n.peers) - n.peers.count(NO_PEER) for n in self.nodes)
        return ends // 2
