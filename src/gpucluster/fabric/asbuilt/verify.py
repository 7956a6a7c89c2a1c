"""verify: the discovered fabric against the plan's cabling, one finding per fault.

1. match discovered nodes to plan devices (match.resolve: descriptions, --sites, --switch-pattern);
2. stream the planned cables once: a cable whose two ends meet in the dump is matched (and its rate
   checked); the rest are kept, with what each end reaches instead. Switches and NIC names nothing
   matched get votes from the matched ends around them; if any is inferred, the pass runs again;
3. explain what is left, most specific first: unidentified HCAs where a planned cable ends, unknown
   switches, two cables swapped (name the two ports to swap), a NIC on another rail's leaf, a cable on
   the wrong port, a missing cable or a bundle with fewer links than planned, and at last the cables
   the plan does not have.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from gpucluster.fabric.asbuilt.findings import Finding, by_kind, ordered
from gpucluster.fabric.asbuilt.graph import (
    AGGREGATION,
    NO_PEER,
    PORT_SPAN,
    ROUTER,
    Fabric,
    ib_rate_name,
    rate_gbps,
)
from gpucluster.fabric.asbuilt.match import Match, resolve
from gpucluster.fabric.asbuilt.names import SiteNames, why_unidentified
from gpucluster.fabric.asbuilt.planned import PlanIndex
from gpucluster.fabric.cabling import cabling_rows, endpoint_media
from gpucluster.fabric.plan import Plan

End = tuple  # (device, port): port an int on a switch, the HCA name on a host
MAX_LISTED = 8  # ends listed in one finding's message; the rest are counted


@dataclass
class Pass:
    """The planned cables against the dump: what matched, and what did not on either side."""

    planned: int = 0
    matched: int = 0
    unmatched: list[tuple[End, End, str]] = field(default_factory=list)  # planned, not found: (a, b, link kind)
    leftover: list[tuple[End, End, str]] = field(default_factory=list)  # found between matched nodes, not planned
    odd: list[tuple[int, int]] = field(default_factory=list)  # found, an end not matched: (end code, peer code)
    slow: list[tuple[End, End, str]] = field(default_factory=list)  # matched, below the planned rate


@dataclass
class Result:
    findings: list[Finding]
    summary: dict
    match: Match | None = None  # which discovered node is which planned device

    @property
    def ok(self) -> bool:
        return not self.findings


def label(end: End) -> str:
    dev, port = end
    return f"{dev} port {port}" if isinstance(port, int) else f"{dev} {port}"


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    return shown + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")


def _ends(row: str) -> tuple[End, End, str]:
    a, pa, b, pb, kind = row.split(",")[:5]
    return (a, pa if kind.startswith("node-") else int(pa)), (b, int(pb)), kind


_RANK = {"leaf": 1, "spine": 2, "core": 3}


def found_rows(plan: Plan, idx: PlanIndex, fab: Fabric, m: Match) -> tuple[set[str], dict[str, int], list]:
    """Every discovered link between matched ends, written as cabling.csv writes the plan's; those of
    them below the planned rate ({row: rate code}); and the links with an unmatched end
    ([(end, peer)]). Rows as text make the plan's side a set difference in C: a 600,000-cable plan
    costs no Python per cable."""
    nodes, span = fab.nodes, PORT_SPAN
    hca_key, tier = m.hca_key, idx.switch_tier
    node_tail = f",node-leaf,{endpoint_media(plan)}"
    ok = _rate_ok(fab, plan)
    name_of: list[str | None] = [None] * len(nodes)  # list lookups: 1.2 million of them
    rank_of = bytearray(len(nodes))
    for i, name in m.sw_name.items():
        name_of[i] = name
        rank_of[i] = _RANK[tier[name]]
    rows: set[str] = set()
    add = rows.add
    slow: dict[str, int] = {}
    odd: list[tuple[int, int]] = []
    for i, name in m.sw_name.items():
        t = tier[name]
        rank = rank_of[i]
        peers, rates = nodes[i].peers, nodes[i].rates
        base = i * span
        for port, peer in enumerate(peers):
            if peer == NO_PEER:
                continue
            j = peer // span
            other = name_of[j]
            if other is not None:
                ro = rank_of[j]
                if rank > ro or (rank == ro and base + port > peer):
                    continue  # written from the other end
                row = f"{name},{port},{other},{peer % span},{t}-{tier[other]},fiber"
            else:
                key = hca_key.get(peer)
                if key is None:
                    odd.append((base + port, peer))
                    continue
                row = f"{key},{name},{port}{node_tail}"
            add(row)
            if rates[port] not in ok:
                slow[row] = rates[port]
    for i in m.unplanned_hosts:
        odd.extend((i * span + port, peer) for port, peer in nodes[i].ports() if name_of[peer // span] is None)
    return rows, slow, odd


def compare(plan: Plan, idx: PlanIndex, fab: Fabric, m: Match, advance: Callable[[int], None] | None = None) -> Pass:
    """The planned cables (streamed) against the discovered rows; `advance(n)` is told each chunk's cables."""
    out = Pass()
    found, slow, out.odd = found_rows(plan, idx, fab, m)
    unmatched: list[str] = []
    for chunk in cabling_rows(plan):
        keys = chunk.splitlines()
        out.planned += len(keys)
        if advance is not None:
            advance(len(keys))
        unmatched.extend([k for k in keys if k not in found])
        found.difference_update(keys)
    out.matched = out.planned - len(unmatched)
    out.unmatched = [_ends(r) for r in unmatched]
    out.leftover = [_ends(r) for r in sorted(found)]
    out.slow = [(*_ends(r)[:2], fab.rate_names[code]) for r, code in sorted(slow.items()) if r not in found]
    return out


def _rate_ok(fab: Fabric, plan: Plan) -> set[int]:
    need = plan.speed_gbps
    return {code for code, name in enumerate(fab.rate_names) if not name or (rate_gbps(name) or need) >= need}


def vote(plan: Plan, fab: Fabric, m: Match) -> tuple[dict[int, Counter], dict[str, Counter]]:
    """For switches and NIC names nothing matched: what the matched ends around them say they are.
    A planned cable with one end matched votes for its other end being whatever that end reaches."""
    span = PORT_SPAN
    votes: dict[int, Counter] = defaultdict(Counter)
    device_votes: dict[str, Counter] = defaultdict(Counter)
    for chunk in cabling_rows(plan):
        for row in chunk.splitlines():
            a, pa, b, pb, kind = row.split(",")[:5]
            cb = m.discovered_end((b, int(pb)))
            ca = m.discovered_end((a, pa if kind[0] == "n" else int(pa)))
            for known, want in ((ca, b), (cb, a)):
                if known is None:
                    continue
                peer = fab.peer(known // span, known % span)
                if peer == NO_PEER:
                    continue
                if peer // span in m.unresolved:
                    votes[peer // span][want] += 1
                elif peer in m.pending and kind[0] == "n" and want == a and m.pending[peer][0] == a:
                    device_votes[m.pending[peer][1]][pa] += 1
    return votes, device_votes


def infer(fab: Fabric, m: Match, votes: dict[int, Counter], device_votes: dict[str, Counter]) -> bool:
    """Give unmatched switches and NIC names the plan name most of their matched neighbours vote for.
    True when anything new was inferred (votes must be taken again: a spine is found from its leaves)."""
    changed = False
    for node, counts in sorted(votes.items()):
        if node not in m.unresolved:
            continue
        (name, n), = counts.most_common(1)
        if name in m.sw_node or n * 2 < sum(counts.values()):
            continue
        m.set_switch(node, name)
        m.inferred_switches[name] = fab.label(node)
        m.how["switches by position"] += 1
        changed = True
    for word, counts in sorted(device_votes.items()):
        (hca, n), = counts.most_common(1)
        if n * 2 < sum(counts.values()):
            continue
        m.inferred_devices[word] = hca
        for end, (host, w) in list(m.pending.items()):
            if w == word and f"{host},{hca}" not in m.hca_node:
                m.set_hca(end, host, hca)
                m.how["HCAs by position"] += 1
                changed = True
    return changed


def verify(plan: Plan, fab: Fabric, site: SiteNames | None = None, *, idx: PlanIndex | None = None,
           advance: Callable[[int], None] | None = None) -> Result:
    """The dump against the plan: findings and a summary (and the match, for the discovered Slurm topology).
    `advance(n)` is told the planned cables compared so far (the CLI's progress bar)."""
    idx = idx or PlanIndex.of(plan)
    site = site or SiteNames()
    m = resolve(fab, idx, site)
    for _ in range(4):  # leaves from hosts, spines from leaves, cores from spines
        if not (m.unresolved or m.pending) or not infer(fab, m, *vote(plan, fab, m)):
            break
    p = compare(plan, idx, fab, m, advance)
    findings = ordered(list(fab.findings) + _explain(plan, idx, fab, m, p))
    summary = {
        "planned_links": p.planned,
        "matched_links": p.matched,
        "discovered_links": fab.link_count(),
        "matching": dict(sorted(m.how.items())),
        "inferred": bool(m.inferred_switches or m.inferred_devices),
        "inferred_switches": m.inferred_switches,
        "inferred_nic_names": m.inferred_devices,
        "unplanned_hosts": len({h for h in m.unplanned_hosts.values()}),
        "findings_by_kind": by_kind(findings),
    }
    return Result(findings, summary, m)


# ---- explaining what disagrees -------------------------------------------------------------------

class _Explainer:
    def __init__(self, plan: Plan, idx: PlanIndex, fab: Fabric, m: Match, p: Pass):
        self.plan, self.idx, self.fab, self.m, self.p = plan, idx, fab, m, p
        self.findings: list[Finding] = []
        self.planned_at: dict[End, End] = {}
        for a, b, _kind in p.unmatched:
            self.planned_at[a] = b
            self.planned_at[b] = a
        self.done_planned: set[End] = set()  # ends of planned cables already explained
        self.done_found: set[int] = set()  # discovered port ends already explained

    # discovered side
    def found_at(self, end: End) -> int | None:
        """The discovered port end of a planned end; None when its device is not in the dump."""
        return self.m.discovered_end(end)

    def peer_of(self, code: int | None) -> int:
        if code is None:
            return NO_PEER
        return self.fab.peer(code // PORT_SPAN, code % PORT_SPAN)

    def name(self, code: int) -> str:
        end = self.m.planned_end(code)
        return label(end) if end else self.fab.end_label(code)

    def consume_found(self, *codes: int) -> None:
        for c in codes:
            if c is not None and c != NO_PEER:
                self.done_found.add(c)
                peer = self.peer_of(c)
                if peer != NO_PEER:
                    self.done_found.add(peer)

    def consume_planned(self, *ends: End) -> None:
        for e in ends:
            if e is not None:
                self.done_planned.add(e)
                other = self.planned_at.get(e)
                if other is not None:
                    self.done_planned.add(other)

    def add(self, kind: str, message: str, fix: str, **detail) -> None:
        self.findings.append(Finding(kind, message, fix, detail=detail))

    def rail_of(self, end: End | None) -> int | None:
        if end is None or not isinstance(end[1], int):
            return None
        return self.idx.leaf_rail.get(end[0])

    def link_rail(self, e1: End, e2: End) -> int | None:
        """The rail of a host-to-leaf cable (the leaf's rail); None for a switch-to-switch one."""
        if isinstance(e1[1], int) == isinstance(e2[1], int):
            return None
        return self.rail_of(e1 if isinstance(e1[1], int) else e2)

    # the steps, most specific first
    def unidentified(self) -> None:
        fab, m = self.fab, self.m
        for node in m.unidentified:
            for port, peer in fab.nodes[node].ports():
                at = m.planned_end(peer)
                planned = self.planned_at.get(at) if at else None
                where = label(at) if at else fab.end_label(peer)
                why = why_unidentified(fab.nodes[node].desc)
                if planned and not isinstance(planned[1], int):
                    msg = f"{where}: an HCA with {why}; the plan puts {label(planned)} here"
                    fix = (f"set the node description on {planned[0]} (rdma-ndd writes '<hostname> <device>' to "
                           f"/sys/class/infiniband/{planned[1]}/node_desc) and check its hostname")
                else:
                    msg = f"{where}: an HCA with {why}"
                    fix = "set the host's name and its HCAs' node descriptions (rdma-ndd), then verify again"
                self.add("unidentified-endpoint", msg, fix, at=where, description=fab.nodes[node].desc or "",
                         expected=label(planned) if planned else None)
                self.consume_found(node * PORT_SPAN + port)
                if planned:
                    self.consume_planned(at)

    def unknown_switches(self) -> None:
        fab, m = self.fab, self.m
        for node in sorted(m.unresolved | set(m.duplicate)):
            ends = [(port, peer) for port, peer in fab.nodes[node].ports()
                    if fab.nodes[peer // PORT_SPAN].kind not in (AGGREGATION, ROUTER)]
            links = [f"port {port} - {self.name(peer)}" for port, peer in ends]
            dup = m.duplicate.get(node)
            what = f"'{fab.label(node)}'" + (f" (a second switch described as {dup})" if dup else "")
            self.add("unknown-switch", f"switch {what} is not in the plan; {len(links)} link(s): {_listing(links)}",
                     "name it as the plan does (its node description), give --switch-pattern, or remove it",
                     switch=fab.label(node), links=len(links))
            self.consume_found(*(node * PORT_SPAN + port for port, _ in ends))

    def swaps(self) -> None:
        """Cables A-B and C-D found as A-D and C-B: one finding naming the two ports to swap."""
        for a, b, _kind in self.p.unmatched:
            if a in self.done_planned:
                continue
            for x, y in ((a, b), (b, a)):
                fx = self.found_at(x)
                seen_x = self.peer_of(fx)
                if seen_x == NO_PEER:
                    continue
                d = self.m.planned_end(seen_x)
                c = self.planned_at.get(d) if d else None
                if c is None or d in self.done_planned or c == x:
                    continue
                fc = self.found_at(c)
                if fc is None or self.peer_of(fc) != self.found_at(y):
                    continue
                self._swap(x, y, c, d)
                break

    def _swap(self, x: End, y: End, c: End, d: End) -> None:
        # planned x-y and c-d, found x-d and c-y: swapping the cables at x and c (or at y and d) fixes both
        pair = (x, c) if x[0] == c[0] else (y, d) if y[0] == d[0] else (x, c)
        rails = (self.link_rail(x, y), self.link_rail(c, d))
        wrong_rail = None not in rails and rails[0] != rails[1]
        kind = "wrong-rail" if wrong_rail else "miscabled"
        msg = (f"{label(x)} reaches {label(d)} and {label(c)} reaches {label(y)}; "
               f"the plan has {label(x)} - {label(y)} and {label(c)} - {label(d)}")
        if wrong_rail:
            msg += f" (rails {rails[0]} and {rails[1]} crossed)"
        self.add(kind, msg, f"swap the cables at {label(pair[0])} and {label(pair[1])}",
                 swap=[label(pair[0]), label(pair[1])], planned=[[label(x), label(y)], [label(c), label(d)]])
        self.consume_planned(x, c)
        self.consume_found(self.found_at(x), self.found_at(c))

    def misplaced(self) -> None:
        """A planned end that reaches something else: wrong port, wrong switch, or another rail's leaf."""
        for a, b, _kind in self.p.unmatched:
            if a in self.done_planned:
                continue
            for x, y in ((a, b), (b, a)):
                fx = self.found_at(x)
                seen = self.peer_of(fx)
                if seen == NO_PEER or fx in self.done_found:
                    continue
                other = self.m.planned_end(seen)
                other_plan = self.planned_at.get(other) if other else None
                host_end = not isinstance(x[1], int)
                rail_x = self.rail_of(y) if host_end else None
                rail_seen = self.rail_of(other) if host_end else None
                wrong_rail = host_end and rail_x is not None and rail_seen is not None and rail_x != rail_seen
                if wrong_rail:
                    msg = (f"{label(x)} (rail {rail_x}) reaches {self.name(seen)}, on a rail {rail_seen} leaf; "
                           f"the plan has {label(x)} - {label(y)}")
                else:
                    msg = f"{label(x)} reaches {self.name(seen)}; the plan has {label(x)} - {label(y)}"
                if other and other_plan is None and other not in self.planned_at:
                    msg += f"; {label(other)} has no planned cable"
                elif other_plan is not None and other_plan != x:
                    msg += f" and {label(other)} - {label(other_plan)}"
                    if self.peer_of(self.found_at(other_plan)) == NO_PEER:
                        msg += f" ({label(other_plan)} is empty)"
                        self.consume_planned(other)
                stranger = self.m.unplanned_hosts.get(seen // PORT_SPAN)
                if stranger:
                    msg += f"; host '{stranger}' is not in the plan (map it with --sites)"
                fix = (f"move the cable from {self.name(seen)} to {label(y)}" if isinstance(y[1], int)
                       else f"move the cable at {label(x)} to {label(y)}")
                self.add("wrong-rail" if wrong_rail else "miscabled", msg, fix,
                         end=label(x), reaches=self.name(seen), planned=label(y))
                self.consume_planned(x)
                self.consume_found(fx)
                break

    def missing(self) -> None:
        absent: dict[str, list[End]] = defaultdict(list)
        bundle_missing: dict[tuple[str, str], list[tuple[End, End]]] = defaultdict(list)
        for a, b, _kind in self.p.unmatched:
            if a in self.done_planned:
                continue
            fa, fb = self.found_at(a), self.found_at(b)
            if fa is None or fb is None:
                for end, f in ((a, fa), (b, fb)):
                    if f is None:
                        absent[end[0]].append(end)
                self.consume_planned(a)
                continue
            if self.peer_of(fa) != NO_PEER or self.peer_of(fb) != NO_PEER:
                continue  # left for the extra-link step
            # Both ends seen, both ports empty. A host's HCA is matched only through a connected port
            # (match.resolve), so a host-switch cable with both ports empty never gets here: its HCA is not
            # in the dump, and the `absent` step below names it. Here: switch to switch, one bundle's link.
            bundle_missing[(a[0], b[0])].append((a, b))
            self.consume_planned(a)
        for (s1, s2), lost in sorted(bundle_missing.items()):
            planned = self.bundle_size(s1, s2)
            listed = [f"{label(a)} - {label(b)}" for a, b in lost]
            if planned > 1 and len(lost) < planned:
                self.add("degraded-bundle", f"{s1} - {s2}: {planned - len(lost)} of {planned} planned links; "
                         f"missing {_listing(listed)}", f"connect the missing cable(s): {_listing(listed)}",
                         a=s1, b=s2, planned=planned, found=planned - len(lost), missing=listed)
            else:
                for (a, b), text in zip(lost, listed, strict=True):
                    self.add("missing-link", f"{text}: planned cable not seen (both ports empty)",
                             f"connect {label(a)} to {label(b)}", a=label(a), b=label(b))
        for dev, ends in sorted(absent.items()):
            tier = self.idx.switch_tier.get(dev)
            if tier is None and dev in self.m.hosts_seen:  # the host is there, these HCAs are not
                for end in ends:
                    planned = self.planned_at[end]
                    empty = self.peer_of(self.found_at(planned)) == NO_PEER
                    self.add("missing-link", f"{label(end)} - {label(planned)}: planned cable not seen (the HCA is "
                             f"not in the dump{' and the switch port is empty' if empty else ''})",
                             f"connect {label(end)} to {label(planned)}, or reseat the cable and check the HCA "
                             "(ibstat: a port with no link is not discovered)", a=label(end), b=label(planned))
                continue
            what = f"{tier} switch {dev}" if tier else f"host {dev}"
            self.add("missing-link", f"{what} is not in the dump: its {len(ends)} planned link(s) are not seen",
                     f"power it on and check its cables{'' if tier else ' and its HCAs'}; if it is there under "
                     "another name, give --sites / --switch-pattern",
                     device=dev, links=len(ends))

    def bundle_size(self, s1: str, s2: str) -> int:
        """Planned links between two switches: those found as planned plus those not found."""
        a, b = self.m.sw_node.get(s1), self.m.sw_node.get(s2)
        unplanned = {(x, y) for x, y, _ in self.p.leftover}
        found = 0
        if a is not None and b is not None:
            for port, peer in self.fab.nodes[a].ports():
                if peer // PORT_SPAN == b and ((s1, port), (s2, peer % PORT_SPAN)) not in unplanned:
                    found += 1
        return found + sum(1 for x, y, _ in self.p.unmatched if x[0] == s1 and y[0] == s2)

    def extra(self) -> None:
        fab, m = self.fab, self.m
        for a, b, _kind in self.p.leftover:
            fa = self.found_at(a)
            if fa in self.done_found:
                continue
            self.add("extra-link", f"{label(a)} - {label(b)} is not in the plan",
                     "remove the cable, or add it to the plan if it is meant to be there", a=label(a), b=label(b))
            self.consume_found(fa)
        for code, peer in self.p.odd:
            if code in self.done_found or peer in self.done_found:
                continue
            kinds = {fab.nodes[code // PORT_SPAN].kind, fab.nodes[peer // PORT_SPAN].kind}
            if kinds & {AGGREGATION, ROUTER}:
                continue  # SHARP aggregation nodes and routers are not in the plan's cabling
            note = ""
            for c in (code, peer):
                node = c // PORT_SPAN
                if node in m.unplanned_hosts:
                    note = f"; host '{m.unplanned_hosts[node]}' is not in the plan (map it with --sites)"
                elif c in m.pending:
                    host, word = m.pending[c]
                    note = f"; '{word}' is not one of {host}'s planned HCAs ({', '.join(self.idx.hcas_of(host))})"
            self.add("extra-link", f"{self.name(code)} - {self.name(peer)} is not in the plan{note}",
                     "remove the cable, or name it as the plan does (--sites, node descriptions)",
                     a=self.name(code), b=self.name(peer))
            self.consume_found(code)
        for a, b, kind in self.p.unmatched:
            if a not in self.done_planned:  # anything still unexplained is at least a planned cable not seen
                self.add("missing-link", f"{label(a)} - {label(b)}: planned cable not seen as planned",
                         f"check the {kind} cable between {label(a)} and {label(b)}", a=label(a), b=label(b))
                self.consume_planned(a)

    def slow(self) -> None:
        want = ib_rate_name(self.plan.speed_gbps) if self.plan.spec.fabric.type == "infiniband" \
            else f"{self.plan.speed_gbps}G"
        for a, b, rate in self.p.slow:
            gbps = rate_gbps(rate)
            self.add("wrong-speed", f"{label(a)} - {label(b)} is up at {rate} ({gbps:g} Gb/s); "
                     f"{want} ({self.plan.speed_gbps} Gb/s) was planned",
                     "reseat or replace the cable/transceiver; check both ports' configured speed and width",
                     a=label(a), b=label(b), rate=rate, planned=want)


def _explain(plan: Plan, idx: PlanIndex, fab: Fabric, m: Match, p: Pass) -> list[Finding]:
    x = _Explainer(plan, idx, fab, m, p)
    x.unidentified()
    x.unknown_switches()
    x.swaps()
    x.misplaced()
    x.missing()
    x.extra()
    x.slow()
    return x.findings

