"""`fabric test`, the pure part: which nodes to pair, what each result must reach, and who is to blame.

Pair selection by tier, thresholds from the plan, localisation of slow results, and the loop that drives
them (`run_test`) through a `Runner`; slurmrun.SlurmRunner submits the cases as Slurm jobs
(all_reduce_perf or ib_write_bw on real nodes; iperf3 over the container network on staged nodes, the
staging stand-in for the transport).

Threshold of a case = link speed x lanes (the node's rails, or 1 for a single-rail case) x efficiency
/ the oversubscription the case crosses (1 under one leaf, the leaf's ratio across the spine, leaf x
spine across the core, all tiers for the whole cluster), in the transport's unit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _string  # what json.dumps uses (ensure_ascii)
from typing import Protocol, TextIO

from gpucluster.errors import UsageError
from gpucluster.fabric.cabling import leaf_name
from gpucluster.fabric.plan import Plan, Unit
from gpucluster.spec.model import parse_ratio

TIERS = ("leaf", "spine", "core", "rail", "all")
MAX_EVIDENCE = 12  # results quoted per suspect


@dataclass(frozen=True)
class Transport:
    name: str
    tool: str
    unit: str  # what the tool reports: GB/s (all_reduce busbw) or Gb/s
    per_byte: bool  # True: the figure is bytes/s, so Gb/s / 8
    efficiency: float  # default fraction of the line rate a healthy pair reaches
    source: str  # where the default comes from
    stand_in: bool = False


# Defaults, each below the range healthy hardware reaches, never in its middle (a bar in the middle fails
# half the healthy pairs). nccl: 8 x 400G H100 nodes reach 350-390 GB/s all_reduce bus bandwidth across
# nodes in public write-ups, ~370 typical (network bound); 0.85 x 400 = 340 GB/s sits 10 GB/s (3 %) under
# the low end, so a healthy pair at 350 passes and a node with one of eight rails gone (~7/8 x 370 = 324)
# fails (docs/fabric.md). perftest: ib_write_bw reaches ~96% of
# the line rate on an idle link. iperf3: the staging stand-in; the container network's nominal 10 Gb/s
# is no hardware limit, and a veth pair gives what the CPU can copy. Calibrated on this project's shared
# 2-core build machine, two streams per pair at once (docs/fabric.md): healthy pairs measured 0.64-10.9
# Gb/s (0.64 under a load of 16 from other staged clusters), a node throttled to 10 Mbit/s (tc tbf on its
# host veth) 0.009. A bar of 0.02 x 10 Gb/s = 0.2 Gb/s is 3x under the worst healthy pair and 20x over
# the throttled one.
TRANSPORTS = {
    "nccl": Transport("nccl", "all_reduce_perf (nccl-tests / rccl-tests)", "GB/s", True, 0.85,
                      "8 x 400G H100: 350-390 GB/s all_reduce busbw across nodes published; the bar sits "
                      "below that range"),
    "perftest": Transport("perftest", "ib_write_bw (perftest)", "Gb/s", False, 0.96,
                          "ib_write_bw on an idle link: ~96% of the line rate"),
    "iperf3": Transport("iperf3", "iperf3 over the container network (staging stand-in for the transport)",
                        "Gb/s", False, 0.02, "staging: calibrated on loaded veth pairs (docs/fabric.md)",
                        stand_in=True),
}


@dataclass(frozen=True)
class Case:
    """One measurement: two nodes (or the whole cluster), optionally one rail, with its bar."""

    tier: str
    nodes: tuple[str, ...]
    threshold: float
    unit: str
    rail: int | None = None
    round: int = 0  # cases of one round share no node: they run at the same time
    where: tuple[str, ...] = ()  # the logical leaves (units) the nodes sit under

    @property
    def label(self) -> str:
        rail = f" rail {self.rail}" if self.rail is not None else ""
        nodes = " - ".join(self.nodes) if len(self.nodes) <= 2 else f"{len(self.nodes)} nodes"
        return f"{self.tier}{rail}: {nodes}"


@dataclass(frozen=True)
class Outcome:
    case: Case
    value: float
    job: str = ""  # the Slurm job that measured it
    detail: str = ""  # per direction or per link, as the tool reported it

    @property
    def slow(self) -> bool:
        return self.value < self.case.threshold

    def evidence(self) -> str:
        verdict = "<" if self.slow else ">="
        job = f" (job {self.job})" if self.job else ""
        return (f"{self.case.label}: {self.value:.3g} {self.case.unit} {verdict} {self.case.threshold:g} "
                f"{self.case.unit}{job}")


@dataclass(frozen=True)
class Suspect:
    kind: str  # node | uplink | pair
    name: str
    evidence: tuple[str, ...]
    fix: str

    def render(self) -> str:
        lines = [f"suspect {self.kind} {self.name}: {self.fix}"]
        lines += [f"    {e}" for e in self.evidence]
        return "\n".join(lines)


# ---- thresholds -------------------------------------------------------------------------------------

def oversubscription(plan: Plan, tier: str) -> float:
    """The oversubscription a case crosses: 1 under one leaf, the leaf's ratio across the spine, leaf x
    spine across the core; the whole cluster crosses every tier."""
    def ratio(name: str) -> float:
        t = plan.tier(name)
        return parse_ratio(t.ratio) if t is not None and t.up else 1.0

    leaf, spine = ratio("leaf"), ratio("spine")
    if tier == "leaf":
        return 1.0
    if tier in ("spine", "rail"):
        return leaf
    return leaf * spine  # core, all


def threshold(plan: Plan, tier: str, transport: Transport, efficiency: float | None = None,
              lanes: int | None = None) -> float:
    eff = transport.efficiency if efficiency is None else efficiency
    if not 0 < eff <= 1:
        raise UsageError(f"--efficiency {eff}: must be a fraction of the line rate, 0 < F <= 1 (e.g. 0.9)")
    if lanes is None:
        lanes = 1 if tier == "rail" else plan.rails  # a rail case runs one NIC per node
    gbps = plan.speed_gbps * lanes * eff / oversubscription(plan, tier)
    return round(gbps / 8 if transport.per_byte else gbps, 1)


# ---- pairs ------------------------------------------------------------------------------------------

def unit_hosts(plan: Plan, unit: Unit) -> list[str]:
    return plan.spec.group(unit.group).hosts[unit.first:unit.first + unit.count]


def _pair_units(a: list[str], b: list[str]) -> list[tuple[str, str]]:
    return list(zip(a, b, strict=False))


def _rounds_of(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Split pairs into rounds in which no node appears twice."""
    rounds: list[tuple[set[str], list[tuple[str, str]]]] = []
    for p in pairs:
        for used, members in rounds:
            if p[0] not in used and p[1] not in used:
                used.update(p)
                members.append(p)
                break
        else:
            rounds.append(({p[0], p[1]}, [p]))
    return [members for _, members in rounds]


def leaf_pairs(plan: Plan) -> list[tuple[str, str]]:
    """Neighbours under one (logical) leaf: (n0, n1), (n2, n3), ...; an odd last node with the first."""
    out = []
    for unit in plan.units:
        hosts = unit_hosts(plan, unit)
        out += list(zip(hosts[0::2], hosts[1::2], strict=False))
        if len(hosts) % 2 and len(hosts) > 1:
            out.append((hosts[-1], hosts[0]))
    return out


def _paired_groups(groups: list[list[Unit]]) -> list[tuple[Unit, Unit]]:
    """Units of group 0 with group 1, 2 with 3, ...; an odd last group with group 0."""
    out = []
    order = list(range(len(groups)))
    if len(order) % 2 and len(order) > 1:
        order.append(0)
    for i in range(0, len(order) - 1, 2):
        for ua, ub in zip(groups[order[i]], groups[order[i + 1]], strict=False):
            out.append((ua, ub))
    return out


def spine_pairs(plan: Plan) -> list[tuple[str, str]]:
    """Node k of a leaf with node k of the next leaf, inside a pod (through the spine, not the core)."""
    out = []
    for pod in range(plan.pods if plan.tiers == 3 else 1):
        units = [u for u in plan.units if plan.tiers != 3 or u.pod == pod]
        for ua, ub in _paired_groups([[u] for u in units]):
            out += _pair_units(unit_hosts(plan, ua), unit_hosts(plan, ub))
    return out


def core_pairs(plan: Plan) -> list[tuple[str, str]]:
    """Node k of unit i in pod p with node k of unit i in pod p+1: every pair crosses the core."""
    if plan.tiers != 3:
        return []
    pods = [[u for u in plan.units if u.pod == p] for p in range(plan.pods)]
    out = []
    for ua, ub in _paired_groups([p for p in pods if p]):
        out += _pair_units(unit_hosts(plan, ua), unit_hosts(plan, ub))
    return out


def cases(plan: Plan, tiers: Iterable[str] = TIERS, transport: str = "nccl",
          efficiency: float | None = None) -> list[Case]:
    """Every case of the chosen tiers, with its round and threshold."""
    return list(iter_cases(plan, tiers, transport, efficiency))


def iter_cases(plan: Plan, tiers: Iterable[str] = TIERS, transport: str = "nccl",
               efficiency: float | None = None) -> Iterator[Case]:
    """The cases one at a time, in `cases`' order: Colossus 200k has 137,893 of them, and a writer that
    streams them (`fabric test-plan --json`) then holds one case, not all of them."""
    tr = TRANSPORTS.get(transport)
    if tr is None:
        raise UsageError(f"transport '{transport}': choose one of {', '.join(TRANSPORTS)}")
    tiers = list(tiers)
    for tier in tiers:  # refuse a bad tier before the first case is written
        if tier not in TIERS:
            raise UsageError(f"tier '{tier}': choose from {', '.join(TIERS)}")
    unit_of = {h: u.name for u in plan.units for h in unit_hosts(plan, u)}
    first = 0  # rounds are numbered across tiers and rails: one round, one set of disjoint pairs
    for tier in tiers:
        if tier == "all":
            yield Case("all", tuple(unit_of), threshold(plan, "all", tr, efficiency), tr.unit, None, first)
            first += 1
            continue
        rails, rounds = _tier_rounds(plan, tier)
        bar = threshold(plan, tier, tr, efficiency)
        for rail in rails:
            for n, members in enumerate(rounds):
                for p in members:
                    yield Case(tier, p, bar, tr.unit, rail, first + n, (unit_of[p[0]], unit_of[p[1]]))
            first += len(rounds)


def _tier_rounds(plan: Plan, tier: str) -> tuple[list[int | None], list[list[tuple[str, str]]]]:
    """A pair tier's rails (None: every rail at once) and its pairs in rounds; every rail runs the same
    pairs, so they are split once. No rails: the tier does not apply (rail on a fabric not rail-optimised)."""
    if tier == "rail":
        if plan.design != "rail-optimized":
            return [], []
        return list(range(plan.rails)), _rounds_of(spine_pairs(plan) or leaf_pairs(plan))
    pairs = {"leaf": leaf_pairs, "spine": spine_pairs, "core": core_pairs}[tier](plan)
    return [None], _rounds_of(pairs)


def round_robin(nodes: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Every pair of `nodes` (a pairwise matrix), in rounds of disjoint pairs (the circle method)."""
    ring = list(nodes) + ([None] if len(nodes) % 2 else [])
    n = len(ring)
    rounds = []
    for _ in range(n - 1):
        rounds.append([(a, b) for a, b in zip(ring[: n // 2], reversed(ring[n // 2:]), strict=True)
                       if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


# ---- localisation -----------------------------------------------------------------------------------

@dataclass
class Verdict:
    outcomes: list[Outcome]
    suspects: list[Suspect] = field(default_factory=list)
    followups: list[Case] = field(default_factory=list)  # cases that would split what is still ambiguous
    unmeasured: list[Case] = field(default_factory=list)  # cases run_test asked for that gave no figure

    @property
    def ok(self) -> bool:
        """Every case measured, none slow: a case with no figure (a node down, a job that printed none)
        proves nothing about its links, so it can never count as passed."""
        return not self.unmeasured and not any(o.slow for o in self.outcomes)


def localise(plan: Plan, outcomes: list[Outcome]) -> Verdict:
    """Name the likely fault behind slow results, with the results that point at it:
    - a node slow with every partner (two or more) is a bad node; its partners are cleared;
    - slow results across the spine/core that all touch one leaf, while that leaf's own pairs are
      fine, point at that leaf's uplinks (for a single-rail case: that rail's leaf);
    - a slow pair nothing else explains is ambiguous: follow-up cases pair each side with a node that
      tested fine (a bisection), and the next round settles it."""
    verdict = Verdict(outcomes)
    by_node: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if len(o.case.nodes) == 2:
            for n in o.case.nodes:
                by_node.setdefault(n, []).append(o)
    bad_nodes = set()
    for node, mine in sorted(by_node.items()):
        partners = {p for o in mine for p in o.case.nodes if p != node}
        if len(partners) >= 2 and all(o.slow for o in mine):
            bad_nodes.add(node)
            verdict.suspects.append(Suspect("node", node, tuple(o.evidence() for o in mine[:MAX_EVIDENCE]),
                                            f"{node} is slow with every partner ({len(partners)}): check its NICs, "
                                            "PCIe link, GPU-NIC affinity and cables"))
    unexplained = [o for o in outcomes if o.slow and len(o.case.nodes) == 2 and not bad_nodes & set(o.case.nodes)]
    # a leaf whose results across the spine/core are slow while its own pairs are fine, and whose
    # partners in those results are fine elsewhere: its uplinks (one rail's, for single-rail cases)
    leaf_ok: dict[str, bool] = {}
    crossing_ok: dict[tuple[str, int | None], int] = {}
    touching: dict[tuple[str, int | None], list[Outcome]] = {}
    for o in outcomes:
        if len(o.case.nodes) != 2:
            continue
        for u in set(o.case.where):
            if o.case.tier == "leaf":
                leaf_ok[u] = leaf_ok.get(u, True) and not o.slow
            elif not o.slow:
                crossing_ok[(u, o.case.rail)] = crossing_ok.get((u, o.case.rail), 0) + 1
    for o in unexplained:
        if o.case.tier in ("spine", "core", "rail"):
            for u in set(o.case.where):
                touching.setdefault((u, o.case.rail), []).append(o)
    blamed: set[Outcome] = set()
    blamed_units: set[str] = set()
    # single-rail keys first: a bad rail's uplink also slows that leaf's all-rail results
    for (unit, rail), slow in sorted(touching.items(), key=lambda kv: (kv[0][1] is None, -len(kv[1]), kv[0][0])):
        if crossing_ok.get((unit, rail)) or not leaf_ok.get(unit, True):
            continue
        if rail is None and unit in blamed_units:
            blamed.update(slow)
            continue
        if not all(any(crossing_ok.get((u, rail)) for u in o.case.where if u != unit) for o in slow):
            continue  # the other side is not known to be fine: still ambiguous
        name = _leaf(plan, unit, rail)
        verdict.suspects.append(Suspect("uplink", name, tuple(o.evidence() for o in slow[:MAX_EVIDENCE]),
                                        f"every result across the spine/core through {name} is slow while its "
                                        "own pairs and its partners elsewhere are fine: check its uplink "
                                        "cables and optics"))
        blamed.update(slow)
        blamed_units.add(unit)
    _merge_rails(plan, verdict)
    ambiguous = [o for o in unexplained if o not in blamed]
    for o in ambiguous:
        a, b = o.case.nodes
        verdict.suspects.append(Suspect("pair", f"{a} / {b}", (o.evidence(),),
                                        "one slow result cannot tell the two apart: run the follow-up cases"))
    verdict.followups = _followups(plan, ambiguous, outcomes, bad_nodes)
    return verdict


def _merge_rails(plan: Plan, verdict: Verdict) -> None:
    """Every rail leaf of one unit slow across the spine: one suspect, the unit, not one per rail."""
    if plan.design != "rail-optimized":
        return
    by_unit: dict[str, list[Suspect]] = {}
    for s in verdict.suspects:
        if s.kind == "uplink":
            by_unit.setdefault(s.name.rsplit("-r", 1)[0], []).append(s)
    for unit, mine in by_unit.items():
        if len(mine) == plan.rails and all(s.name != unit for s in mine):
            verdict.suspects = [s for s in verdict.suspects if s not in mine]
            evidence = tuple(e for s in mine for e in s.evidence)[:MAX_EVIDENCE]
            verdict.suspects.append(Suspect("uplink", unit, evidence,
                                            f"every rail's leaf of {unit} is slow across the spine while its own "
                                            "pairs are fine: check what those leaves share (their spines' side, "
                                            "the optics batch, the rack)"))


def _leaf(plan: Plan, unit_name: str, rail: int | None) -> str:
    if rail is None or plan.design != "rail-optimized":
        return unit_name
    unit = next(u for u in plan.units if u.name == unit_name)
    return leaf_name(plan, unit, rail)


def _followups(plan: Plan, ambiguous: list[Outcome], outcomes: list[Outcome], bad: set[str]) -> list[Case]:
    """Pair each node of an ambiguous slow result with a different node that tested fine in the same
    tier (a bisection: the next round shows which side is slow), in rounds of disjoint pairs."""
    unit_of = {h: u.name for u in plan.units for h in unit_hosts(plan, u)}
    suspects = {n for o in ambiguous for n in o.case.nodes}
    fine: dict[tuple[str, int | None], list[str]] = {}
    for x in outcomes:
        if not x.slow and len(x.case.nodes) == 2:
            pool = fine.setdefault((x.case.tier, x.case.rail), [])
            pool += [n for n in x.case.nodes if n not in bad and n not in suspects and n not in pool]
    wanted: list[tuple[Outcome, str, str]] = []
    taken: dict[tuple[str, int | None], int] = {}
    for o in ambiguous:
        key = (o.case.tier, o.case.rail)
        pool = fine.get(key, [])
        for node in o.case.nodes:
            if not pool:
                break
            partner = pool[taken.get(key, 0) % len(pool)]
            taken[key] = taken.get(key, 0) + 1
            wanted.append((o, node, partner))
    first = max((o.case.round for o in outcomes), default=0) + 1
    out: list[Case] = []
    groups: dict[tuple[str, int | None], dict[tuple[str, str], Outcome]] = {}
    for o, node, partner in wanted:
        groups.setdefault((o.case.tier, o.case.rail), {})[(node, partner)] = o
    for by_pair in groups.values():
        rounds = _rounds_of(list(by_pair))
        for n, members in enumerate(rounds):
            for node, partner in members:
                o = by_pair[(node, partner)]
                out.append(Case(o.case.tier, (node, partner), o.case.threshold, o.case.unit, o.case.rail,
                                first + n, (unit_of[node], unit_of[partner])))
        first += len(rounds)
    return out


# ---- the loop, with the runner as a seam ------------------------------------------------------------

class Runner(Protocol):
    """Runs one round's cases and returns an outcome per case it measured (slurmrun.SlurmRunner: a Slurm
    job per case running all_reduce_perf or ib_write_bw on real nodes, iperf3 on staged ones; the cases it
    could not measure it keeps, with why, as its own failures)."""

    def run(self, cases: list[Case]) -> list[Outcome]: ...


def run_test(plan: Plan, runner: Runner, tiers: Iterable[str] = TIERS, transport: str = "nccl",
             efficiency: float | None = None, max_followups: int = 2) -> Verdict:
    """Run the cases round by round, localise, and run follow-ups until nothing is ambiguous."""
    todo = cases(plan, tiers, transport, efficiency)
    asked = list(todo)
    outcomes: list[Outcome] = []
    for n in sorted({c.round for c in todo}):
        outcomes += runner.run([c for c in todo if c.round == n])
    verdict = localise(plan, outcomes)
    for _ in range(max_followups):
        if not verdict.followups:
            break
        asked += verdict.followups
        for n in sorted({c.round for c in verdict.followups}):
            outcomes += runner.run([c for c in verdict.followups if c.round == n])
        verdict = localise(plan, outcomes)
    measured = {o.case for o in outcomes}
    verdict.unmeasured = [c for c in dict.fromkeys(asked) if c not in measured]
    return verdict


def summary(plan: Plan, transport: str = "nccl", efficiency: float | None = None) -> dict:
    """Thresholds and case counts per tier (`fabric test-plan --json --summary`), counted from the pairs
    without making a case (Colossus 200k has 137,893)."""
    tr = TRANSPORTS[transport]
    out = {"transport": tr.name, "tool": tr.tool, "unit": tr.unit, "stand_in": tr.stand_in,
           "efficiency": tr.efficiency if efficiency is None else efficiency, "efficiency_source": tr.source,
           "link_gbps": plan.speed_gbps, "rails": plan.rails, "tiers": {}}
    for tier in TIERS:  # counted from the rounds, as iter_cases would make them, without making them
        if tier == "all":
            count, rounds = 1, 1
        else:
            rails, split = _tier_rounds(plan, tier)
            count, rounds = len(rails) * sum(map(len, split)), len(rails) * len(split)
        if count:
            out["tiers"][tier] = {"threshold": threshold(plan, tier, tr, efficiency), "cases": count,
                                  "rounds": rounds, "oversubscription": round(oversubscription(plan, tier), 3)}
    return out


# ---- the full plan as JSON, streamed ------------------------------------------------------------------

def write_json(doc: dict, cases: Iterable[Case], out: TextIO) -> None:
    """`doc` with a "cases" list added last, written exactly as `json.dump(doc | {"cases": [...]}, out,
    indent=1)` writes it, but one case at a time: Colossus 200k's list is 21.6 MB of text, and building it
    for json.dump (whose indenting encoder is pure Python) took 17 s and 123 MB."""
    head = json.dumps(doc, indent=1)
    out.write(head[:-2] + ',\n "cases": [' if doc else '{\n "cases": [')
    chunk: list[str] = []
    sep = "\n"
    for c in cases:
        chunk.append(sep + _case_json(c))
        sep = ",\n"
        if len(chunk) >= 1024:  # a write per case costs more than the formatting
            out.write("".join(chunk))
            chunk.clear()
    out.write("".join(chunk))
    out.write("]\n}" if sep == "\n" else "\n ]\n}")


def _case_json(c: Case) -> str:
    """One case as an element of the top-level "cases" list at indent=1 (two levels deep)."""
    nodes = "[\n    " + ",\n    ".join(map(_string, c.nodes)) + "\n   ]" if c.nodes else "[]"
    rail = "null" if c.rail is None else int.__repr__(c.rail)
    return (f'  {{\n   "tier": {_string(c.tier)},\n   "nodes": {nodes},\n   "rail": {rail},\n'
            f'   "round": {int.__repr__(c.round)},\n   "threshold": {json.dumps(c.threshold)},\n'
            f'   "unit": {_string(c.unit)}\n  }}')
