"""Planner invariants, over every example and over generated specs.

The cabling map is the ground truth here: it is parsed row by row and checked independently of the
planner's own counts (ports per switch, even uplink spread, every NIC cabled once). The Slurm tree
is checked after hostlist expansion. Published figures come from reference/seed-clusters.md.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import hostlist
import pytest
from conftest import EXAMPLES, generic_spec, loaded_example, spec_from_data
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from gpucluster.cluster import check_meaning
from gpucluster.errors import Finding
from gpucluster.fabric import Plan, PlanError, plan_cluster
from gpucluster.fabric.cabling import CABLING_HEADER, cabling_rows
from gpucluster.fabric.explain import explain
from gpucluster.render.topology import slurm_switches
from gpucluster.spec.model import LoadedSpec, parse_ratio

TIER_OF_LINK = {"node-leaf": ("node", "leaf"), "leaf-spine": ("leaf", "spine"), "spine-core": ("spine", "core")}


@dataclass
class Cabling:
    """What the cabling map says, gathered in one pass."""

    nics: Counter = field(default_factory=Counter)  # (host, hca) -> times cabled
    ports: dict = field(default_factory=lambda: defaultdict(Counter))  # tier -> Counter((switch, port))
    devices: dict = field(default_factory=lambda: defaultdict(set))  # tier -> switch names
    up: dict = field(default_factory=lambda: defaultdict(Counter))  # lower switch -> Counter(upper switch)
    down_ports: Counter = field(default_factory=Counter)  # switch -> ports facing down
    up_ports: Counter = field(default_factory=Counter)  # switch -> ports facing up
    host_leaf: dict = field(default_factory=lambda: defaultdict(set))  # host -> leaves it is cabled to


def read_cabling(plan: Plan) -> Cabling:
    """One pass over the streamed map. Colossus 200k has 600k rows, so the loop only splits and
    appends; the counting is done by Counter over whole lists (C speed)."""
    nic_keys: list[tuple[str, str]] = []
    host_leaf: list[tuple[str, str]] = []
    port_keys: dict[str, list[tuple[str, str]]] = {"leaf": [], "spine": [], "core": []}
    up_pairs: list[tuple[str, str]] = []
    for chunk in cabling_rows(plan):  # chunks of whole lines
        assert chunk.endswith("\n")
        for row in chunk.splitlines():
            a, ap, b, bp, link, _media = row.split(",")
            if link == "node-leaf":
                nic_keys.append((a, ap))
                host_leaf.append((a, b))
                port_keys["leaf"].append((b, bp))
            else:
                lower, upper = TIER_OF_LINK[link]
                port_keys[lower].append((a, ap))
                port_keys[upper].append((b, bp))
                up_pairs.append((a, b))
    c = Cabling(nics=Counter(nic_keys))
    for a, b in host_leaf:
        c.host_leaf[a].add(b)
    for tier, keys in port_keys.items():
        if keys:
            c.ports[tier] = Counter(keys)
            c.devices[tier] = {sw for sw, _p in c.ports[tier]}
    c.down_ports.update(b for _a, b in host_leaf)
    c.down_ports.update(b for _a, b in up_pairs)
    for (a, b), n in Counter(up_pairs).items():
        c.up[a][b] = n
        c.up_ports[a] += n
    return c


def check_cabling(plan: Plan) -> Cabling:
    """Every invariant the cabling map must satisfy; returns it for further checks."""
    c = read_cabling(plan)
    spec = plan.spec
    # every NIC of every fabric node is cabled exactly once, and nothing else is
    expected = {(g.host(i), hca) for g in spec.fabric_groups for i in range(g.count) for hca in plan.hcas(g)}
    assert set(c.nics) == expected
    assert max(c.nics.values()) == 1
    for tp in plan.tier_plans:
        used = c.ports[tp.tier]
        # switch counts agree with the plan, and no port is used twice
        assert len(c.devices[tp.tier]) == tp.count, tp
        assert max(used.values()) == 1, f"{tp.tier}: a port is cabled twice"
        # port numbers stay within the radix, on every switch of the tier
        assert max(int(port) for _sw, port in used) <= tp.radix, tp
        per_switch = Counter(sw for sw, _port in used)
        assert max(per_switch.values()) <= tp.radix
        ratio = spec.fabric.ratio(tp.tier) if tp.up else None
        for sw in c.devices[tp.tier]:
            assert c.down_ports[sw] <= tp.down, (sw, tp)
            assert c.up_ports[sw] <= tp.up, (sw, tp)
            if ratio is None:
                continue
            # enough uplinks for the declared oversubscription, and no more than spreading them evenly
            # over the switches above costs (a partial unit or pod gets only what it needs)
            need = max(1, math.ceil(c.down_ports[sw] / ratio - 1e-9))
            assert need <= c.up_ports[sw] < need + len(c.up[sw]), (sw, c.down_ports[sw], c.up_ports[sw])
    # uplinks spread evenly: each lower switch has the same number of links to each upper switch it uses
    for sw, peers in c.up.items():
        assert len(set(peers.values())) == 1, f"{sw} spreads its uplinks unevenly: {dict(peers)}"
    check_clos_shape(plan, c)
    # one connected fabric per rail group (rail groups are separate planes by design)
    parent = {sw: sw for tier in c.devices.values() for sw in tier}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for lower, peers in c.up.items():
        for upper in peers:
            parent[find(lower)] = find(upper)
    assert len({find(sw) for sw in parent}) == plan.rail_groups
    return c


def check_clos_shape(plan: Plan, c: Cabling) -> None:
    """The shape that lets every leaf reach every other over any uplink, read from the cabling alone:
    the leaves that share a spine reach exactly the same spines (a pod, per rail group), and each core
    takes links from exactly one spine of every pod of its rail group (a core plane reaches every pod).
    Downward the path is unique, so a partial pod may send fewer links to a core than a full one."""
    pod_of: dict[str, int] = {}
    spine_sets: dict[frozenset, int] = {}
    for leaf in c.devices["leaf"]:
        spines = frozenset(c.up[leaf])
        pod = spine_sets.setdefault(spines, len(spine_sets))
        for s in spines:
            assert pod_of.setdefault(s, pod) == pod, f"{s} serves leaves of two different spine sets"
    assert set(pod_of) == c.devices["spine"]
    if plan.tiers == 2:
        assert len(spine_sets) == plan.rail_groups
        return
    assert len(spine_sets) == plan.pods * plan.rail_groups
    below: dict = defaultdict(list)
    for s in c.devices["spine"]:
        for core in c.up[s]:
            below[core].append(pod_of[s])
    for core in c.devices["core"]:
        assert len(below[core]) == len(set(below[core])) == plan.pods, f"{core} reaches pods {below[core]}"


def check_slurm_tree(plan: Plan) -> None:
    """topology.conf's tree: every fabric node under exactly one leaf, one root reaching everything."""
    spec = plan.spec
    switches = {s.name: s for s in slurm_switches(plan)}
    assert len(switches) == len(slurm_switches(plan)), "duplicate switch names"
    leaf_of: dict[str, str] = {}
    for s in slurm_switches(plan):
        assert not (s.nodes and s.switches), f"{s.name} has both Nodes and Switches"
        assert len(s.name) <= 64
        for node in hostlist.expand_hostlist(",".join(s.nodes)) if s.nodes else []:
            assert node not in leaf_of, f"{node} under {leaf_of.get(node)} and {s.name}"
            leaf_of[node] = s.name
    fabric_hosts = {h for g in spec.fabric_groups for h in g.hosts}
    assert set(leaf_of) == fabric_hosts
    children = {c for s in slurm_switches(plan) for c in s.switches}
    assert children <= set(switches)
    roots = [n for n in switches if n not in children]
    assert roots == [plan.root_name]
    # reachable from the root, levels as slurmctld computes them
    seen: set[str] = set()

    def walk(name: str) -> int:
        assert name not in seen, f"{name} reached twice"
        seen.add(name)
        s = switches[name]
        level = 0 if s.nodes else 1 + max(walk(c) for c in hostlist.expand_hostlist(",".join(s.switches)))
        assert level == s.level, f"{name}: level {s.level}, computed {level}"
        return level

    walk(plan.root_name)
    assert seen == set(switches)
    # a unit's nodes are what the leaf holds
    for u in plan.units:
        assert set(hostlist.expand_hostlist(plan.unit_hostlist(u))) == {
            spec.group(u.group).host(i) for i in range(u.first, u.first + u.count)}


def check_ratios(plan: Plan, warnings: list[Finding]) -> None:
    """Declared oversubscription realised exactly, or no worse than declared with a rounding warning."""
    fab = plan.spec.fabric
    rounded = {f.path[-1] for f in warnings if f.rule == "ratio-rounded"}
    for tp in plan.tier_plans:
        if not tp.up:
            continue
        declared = fab.ratio(tp.tier)
        assert tp.down + tp.up <= tp.radix
        assert tp.down / tp.up <= declared + 1e-9, f"{tp.tier} more oversubscribed than declared"
        if declared == 1:
            assert tp.down == tp.up, f"non-blocking {tp.tier} with {tp.down} down, {tp.up} up"
        elif not math.isclose(tp.down / tp.up, declared):
            assert tp.tier in rounded, f"{tp.tier}: {tp.down}/{tp.up} != {declared} and no warning"


def check_bisection(plan: Plan) -> None:
    """Non-blocking everywhere: half the endpoints' bandwidth crosses the worst even cut."""
    if all(plan.spec.fabric.ratio(t.tier) == 1 for t in plan.tier_plans if t.up):
        assert plan.bisection_tbps == round(plan.endpoints * plan.speed_gbps / 2 / 1000, 3)
    else:
        assert plan.bisection_tbps <= plan.endpoints * plan.speed_gbps / 2 / 1000


def most_down(radix: int, ratio: float) -> int:
    """The most downlinks a switch takes at this oversubscription, by search (independent of the planner)."""
    return max(d for d in range(radix + 1) if d + max(1, math.ceil(d / ratio - 1e-9)) <= radix)


def check_explanations(plan: Plan, c: Cabling) -> None:
    """A count gets an explanation exactly when it is above its arithmetic minimum, and says by how much.
    Minimums come from the cabling map and the spec's ratios, not from the planner's figures."""
    fab = plan.spec.fabric
    got = {e.subject: e for e in explain(plan)}
    leaf, spine = plan.tier("leaf"), plan.tier("spine")
    r1 = fab.ratio("leaf")
    need = lambda down, ratio: max(1, math.ceil(down / ratio - 1e-9))  # noqa: E731
    leaf_links = sum(c.up_ports[sw] for sw in c.devices["leaf"])
    counted = {
        "leaf switches": (len(c.devices["leaf"]), math.ceil(plan.endpoints / most_down(leaf.radix, r1))),
        "leaf-spine links": (leaf_links, sum(need(c.down_ports[sw], r1) for sw in c.devices["leaf"])),
        "spine switches": (len(c.devices["spine"]), math.ceil(
            leaf_links / (spine.radix if plan.tiers == 2 else most_down(spine.radix, fab.ratio("spine"))))),
    }
    if plan.tiers == 3:
        r2 = fab.ratio("spine")
        spine_links = sum(c.up_ports[sw] for sw in c.devices["spine"])
        counted["spine-core links"] = (spine_links, sum(need(c.down_ports[sw], r2) for sw in c.devices["spine"]))
        counted["core switches"] = (len(c.devices["core"]), math.ceil(spine_links / plan.tier("core").radix))
    for subject, (count, minimum) in counted.items():
        assert count >= minimum, (subject, count, minimum)
        if count == minimum:
            assert subject not in got, got[subject].render()
        else:
            e = got.get(subject)
            assert e is not None, f"{subject}: {count} > {minimum} and no explanation"
            assert (e.count, e.minimum, e.excess) == (count, minimum, count - minimum)
            assert e.why and e.fix and f"{count:,}" in e.render()
    assert set(got) <= set(counted)


def check_counts(plan: Plan) -> None:
    spec = plan.spec
    assert plan.nodes == sum(g.count for g in spec.node_groups)
    assert plan.gpus == sum(g.count * g.gpus_per_node for g in spec.node_groups if g.gpu)
    assert plan.endpoints == sum(g.count * g.nics_per_node for g in spec.fabric_groups)
    assert sum(u.count for u in plan.units) == sum(g.count for g in spec.fabric_groups)
    assert all(1 <= u.count <= plan.unit_nodes for u in plan.units)
    assert plan.links["node-leaf"] == plan.endpoints
    racks = sum(math.ceil(g.count / g.nodes_per_rack) for g in spec.node_groups)
    assert plan.rack_count == racks
    assert plan.tiers == len(plan.tier_plans)


# ---- the examples ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_example_cabling(name):
    _loaded, plan = loaded_example(name)
    c = check_cabling(plan)
    check_explanations(plan, c)
    # no node sits under two Slurm leaves, though rail-optimised nodes reach several physical leaves
    for host, leaves in c.host_leaf.items():
        unit = plan.unit_of_host[host]
        assert len(leaves) == (plan.rails if plan.design == "rail-optimized" else 1)
        assert all(leaf.startswith(unit.name) for leaf in leaves)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_slurm_tree(name):
    check_slurm_tree(loaded_example(name)[1])


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_ratios_and_counts(name):
    loaded, plan = loaded_example(name)
    check_ratios(plan, [f for f in check_meaning(loaded) if f.level == "warning"])
    check_counts(plan)
    check_bisection(plan)


def test_meta_24k_figures():
    """24,576 H100 in 3,072 nodes of 8, 2 nodes a rack, 8 AI zones of 384 nodes; 7:1 aggregation."""
    for name in ("meta-24k-roce", "meta-24k-ib"):
        loaded, plan = loaded_example(name)
        assert plan.gpus == 24_576
        assert plan.gpus_by_type == {"h100-sxm5-80g": 24_576}
        assert loaded.spec.group("h100").count == 3_072
        assert plan.endpoints == 24_576  # a 400G RDMA endpoint per GPU
        # 24,576 endpoints exceed 64^2/2 = 2,048, so radix 64 needs three tiers
        assert plan.tiers == 3
        assert math.ceil(3_072 / loaded.spec.group("h100").nodes_per_rack) == 1_536
    _loaded, plan = loaded_example("meta-24k-roce")
    assert plan.pods == 8 and plan.units_per_pod * plan.unit_nodes == 384
    assert plan.oversubscription["leaf"] == "1:1"
    assert 6.5 < plan.tier("spine").down / plan.tier("spine").up <= 7


def test_colossus_figures():
    _loaded, plan = loaded_example("colossus-200k")
    assert plan.gpus == 200_000
    assert plan.gpus_by_type == {"h100-sxm5-80g": 150_000, "h200-sxm-141g": 50_000}
    assert plan.tiers == 3
    assert loaded_example("colossus-100k")[1].gpus == 100_000


def full_pod_spine_core_links(plan: Plan) -> int:
    """What spine-core cabling would be if every pod had the designed spines with their designed uplinks."""
    return plan.pods * plan.rail_groups * plan.spines_per_group * plan.tier("spine").up


def test_colossus_100k_partial_pod_gets_only_the_spines_it_needs():
    """12,500 nodes = 195 full SUs of 64 + one of 20; 196 SUs in pods of 8 leave pod 25 with 4 SUs (32 rail
    leaves, one SU partial). Its leaves need half the designed spines, so 32 spines take 2 links from each
    full leaf and 1 from each leaf of the 20-node SU; their uplinks cover two core planes each."""
    _loaded, plan = loaded_example("colossus-100k")
    assert (plan.pods, plan.units_per_pod, plan.spines_per_group) == (25, 8, 64)
    c = check_cabling(plan)
    spines = c.devices["spine"]
    assert len(spines) == 24 * 64 + 32 == 1_568 <= len(c.devices["leaf"])
    leaf_spine = sum(c.up_ports[leaf] for leaf in c.devices["leaf"])
    spine_core = sum(c.up_ports[s] for s in spines)
    assert (leaf_spine, spine_core) == (plan.links["leaf-spine"], plan.links["spine-core"])
    # 1,560 full leaves x 64 uplinks + 8 partial leaves x 32 (20 needed, spread evenly over 32 spines)
    assert leaf_spine == 1_560 * 64 + 8 * 32
    # a full pod's spine-core links would be 102,400; they drop to the 100,352 of the designed leaf uplinks
    assert full_pod_spine_core_links(plan) == 102_400
    assert spine_core == 1_568 * 64 == 100_352
    # what remains above the leaves' links is only the even-spreading rounding of pod 25's spines (56 -> 64)
    last = [s for s in spines if c.down_ports[s] < plan.tier("spine").down]
    assert len(last) == 32 and {c.down_ports[s] for s in last} == {3 * 8 * 2 + 8}
    assert spine_core - leaf_spine == sum(c.up_ports[s] - c.down_ports[s] for s in last) == 32 * 8
    # and nothing is lost: non-blocking bisection, every core taking 24 x 4 + 2 links
    assert plan.bisection_tbps == 100_000 * 400 / 2 / 1000
    assert {c.down_ports[core] for core in c.devices["core"]} == {24 * 4 + 2} == {plan.tier("core").down}


def test_colossus_200k_keeps_its_spines_where_fewer_would_spread_unevenly():
    """Pod 49 holds 6 full SUs and one of 42 nodes (56 leaves): 32 spines would need 112 ports each, so it
    keeps 64; their 56 downlinks need 56 uplinks, rounded to 64 to spread over 32 cores evenly."""
    _loaded, plan = loaded_example("colossus-200k")
    last = plan.pod_plans[-1]
    assert (last.units, last.leaves, last.spines, last.spine_down, last.spine_up) == (7, 56, 64, 56, 64)
    assert plan.links["spine-core"] == full_pod_spine_core_links(plan) == 49 * 64 * 64
    assert plan.switches == {"leaf": 391 * 8, "spine": 49 * 64, "core": 64 * 32}


def test_frontier_mi250x_figures():
    """4 MI250X cards, 2 GCDs each: Slurm sees 8 GPUs a node; 384 nodes = 3,072 GCDs."""
    loaded, plan = loaded_example("frontier-mi250x-roce")
    g = loaded.spec.group("mi250x")
    assert g.gpus_per_node == 8 == 4 * loaded.spec.parts.gpus["mi250x"].devices_per_card
    assert plan.gpus == 3_072 and g.count == 384


def test_rsc_figures():
    """760 DGX A100 = 6,080 GPUs, 8 x 200G HDR per node, two-level non-blocking Clos."""
    loaded, plan = loaded_example("meta-rsc-phase1")
    assert plan.gpus == 6_080 and loaded.spec.group("dgx").count == 760
    assert plan.speed_gbps == 200 and plan.rails == 8
    assert plan.tiers == 2
    assert set(plan.oversubscription.values()) == {"1:1"}


# ---- fat-tree capacity -------------------------------------------------------------------------

@pytest.mark.parametrize("k", [8, 16, 32, 64])
def test_two_tier_capacity_is_k_squared_over_two(k):
    """Non-blocking, radix k: k^2/2 endpoints fit two tiers; one more needs a third."""
    fits = plan_cluster(spec_from_data(generic_spec(k * k // 2, radix=k)))
    assert (fits.tiers, fits.endpoints) == (2, k * k // 2)
    over = plan_cluster(spec_from_data(generic_spec(k * k // 2 + 1, radix=k)))
    assert over.tiers == 3
    with pytest.raises(PlanError) as err:
        plan_cluster(spec_from_data(generic_spec(k * k // 2 + 1, radix=k, tiers=2)))
    assert [f.rule for f in err.value.findings] == ["radix"]


def test_2049_endpoints_need_three_tiers_at_radix_64():
    assert plan_cluster(spec_from_data(generic_spec(2048))).tiers == 2
    assert plan_cluster(spec_from_data(generic_spec(2049))).tiers == 3


@pytest.mark.parametrize("k", [8, 16, 32, 64])
def test_three_tier_capacity_is_k_cubed_over_four(k):
    """Two NICs a node so k^3/4 + 2 endpoints stay under Slurm's node limit."""
    most = k**3 // 4 // 2
    plan = plan_cluster(spec_from_data(generic_spec(most, radix=k, rails=2)))
    assert (plan.tiers, plan.endpoints) == (3, k**3 // 4)
    # the textbook shape: k^2/4 cores, every tier non-blocking
    assert plan.switches == {"leaf": k * k // 2, "spine": k * k // 2, "core": k * k // 4}
    with pytest.raises(PlanError) as err:
        plan_cluster(spec_from_data(generic_spec(most + 1, radix=k, rails=2)))
    assert [f.rule for f in err.value.findings] == ["radix"]


def test_small_three_tier_fat_tree_is_fully_checked():
    """k=8: 128 endpoints in the textbook 32 leaves, 32 spines, 16 cores; cabling checked port by port."""
    plan = plan_cluster(spec_from_data(generic_spec(128, radix=8)))
    assert plan.switches == {"leaf": 32, "spine": 32, "core": 16}
    c = check_cabling(plan)
    check_slurm_tree(plan)
    assert all(c.down_ports[s] == 4 and c.up_ports[s] == 4 for s in c.devices["spine"])
    assert all(c.down_ports[s] == 8 for s in c.devices["core"])


# ---- generated specs ---------------------------------------------------------------------------

@st.composite
def fabric_specs(draw) -> dict:
    design = draw(st.sampled_from(["fat-tree", "rail-optimized"]))
    rails = draw(st.sampled_from([1, 2, 4, 8]))
    k1 = draw(st.sampled_from([8, 16, 24, 32, 40, 64, 128]))
    k2 = draw(st.sampled_from([8, 16, 32, 64, 128, 576]))
    k3 = draw(st.sampled_from([16, 32, 64, 128, 576]))
    budget = 6000 // rails  # keeps a cabling map near 20k rows
    counts = draw(st.lists(st.integers(1, budget // 2), min_size=1, max_size=2))
    tiers = draw(st.sampled_from(["auto", "auto", 2, 3]))
    leaf_ratio = draw(st.sampled_from(["1:1", "1:1", "2:1", "3:1", "1.5:1", "7:1"]))
    spine_ratio = draw(st.sampled_from([None, "1:1", "2:1", "3:1", "7:1"])) if tiers == 3 else None
    if design == "rail-optimized":
        unit = draw(st.integers(1, max(1, k1 // 2)))
        rail_groups = draw(st.sampled_from([d for d in (1, 2, 4, 8) if rails % d == 0]))
    else:
        unit = draw(st.one_of(st.none(), st.integers(1, max(1, k1 // (2 * rails)))))
        rail_groups = 1
    pod = None
    if tiers == 3 and draw(st.booleans()):
        per_unit = unit or max(1, k1 // 2 // rails)
        pod = per_unit * draw(st.integers(1, 16))
    return generic_spec(counts, rails=rails, design=design, tiers=tiers, leaf_ratio=leaf_ratio,
                        spine_ratio=spine_ratio, unit=unit, rail_groups=rail_groups, pod=pod, radices=(k1, k2, k3))


KNOWN_RULES = {"radix", "ratio-tier", "pod-size", "rail-groups", "design", "required", "fabric-switch", "switch-speed"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric_specs())
def test_generated_plans_hold_every_invariant(data):
    spec = spec_from_data(data)
    findings = check_meaning(LoadedSpec(spec=spec, source="gen.yaml", lines={}))
    errors = [f for f in findings if f.level == "error"]
    if errors:
        # refusing is fine, as long as it says why and what to change
        for f in errors:
            assert f.rule in KNOWN_RULES and f.fix and f.message, f.render()
        event(f"refused: {errors[0].rule}")
        with pytest.raises(PlanError):
            plan_cluster(spec)
        return
    plan = plan_cluster(spec)
    event(f"planned: {plan.design}, {plan.tiers} tiers")
    check_counts(plan)
    check_ratios(plan, findings)
    check_bisection(plan)
    check_slurm_tree(plan)
    check_explanations(plan, check_cabling(plan))
    assert plan.tiers in (2, 3) and (data["fabric"]["tiers"] == "auto" or plan.tiers == data["fabric"]["tiers"])


@st.composite
def partial_pod_specs(draw) -> dict:
    """Three tiers whose last pod, and often the last unit of each group, is partial."""
    design = draw(st.sampled_from(["fat-tree", "rail-optimized"]))
    rails = draw(st.sampled_from([1, 2, 4, 8]))
    k = draw(st.sampled_from([8, 16, 32, 64]))
    unit = draw(st.integers(1, k // 2)) if design == "rail-optimized" else draw(st.integers(1, max(1, k // 2 // rails)))
    per_pod = draw(st.integers(2, 8))
    units = per_pod * draw(st.integers(1, 3)) + draw(st.integers(1, per_pod - 1))
    short = draw(st.integers(0, unit - 1))  # nodes missing from the last unit
    counts = [units * unit - short]
    if draw(st.booleans()):
        counts.append(draw(st.integers(1, 3 * unit)))
    rail_groups = draw(st.sampled_from([d for d in (1, 2) if rails % d == 0])) if design == "rail-optimized" else 1
    spine_ratio = draw(st.sampled_from([None, "2:1", "3:1", "7:1"]))
    leaf_ratio = draw(st.sampled_from(["1:1", "2:1"]))
    core = draw(st.sampled_from([k, 4 * k]))
    return generic_spec(counts, rails=rails, design=design, tiers=3, unit=unit, pod=unit * per_pod,
                        rail_groups=rail_groups, spine_ratio=spine_ratio, leaf_ratio=leaf_ratio, radices=(k, k, core))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partial_pod_specs())
# 2:1 rounds 3 spine downlinks up to 2 uplinks; pod 2's 2 leaves on 1 spine would take 4 > 3 designed ports
@example(generic_spec([10], tiers=3, unit=2, pod=6, spine_ratio="2:1", radices=(8, 8, 32)))
def test_partial_pods_and_units_hold_every_invariant(data):
    """Partial pods get fewer spines and uplinks, never at the cost of a port, an even spread or a NIC."""
    spec = spec_from_data(data)
    findings = check_meaning(LoadedSpec(spec=spec, source="gen.yaml", lines={}))
    errors = [f for f in findings if f.level == "error"]
    if errors:
        event(f"refused: {errors[0].rule}")
        return
    plan = plan_cluster(spec)
    check_counts(plan)
    check_ratios(plan, findings)
    check_bisection(plan)
    check_slurm_tree(plan)
    check_explanations(plan, check_cabling(plan))
    assert plan.links["spine-core"] <= full_pod_spine_core_links(plan)
    assert all(p.spines <= plan.spines_per_group for p in plan.pod_plans)
    fewer = plan.switches["spine"] < plan.pods * plan.rail_groups * plan.spines_per_group
    event("fewer spines" if fewer else "designed spines")
    event("fewer spine uplinks" if plan.links["spine-core"] < full_pod_spine_core_links(plan) else "designed uplinks")


def test_cabling_header_names_the_columns():
    assert CABLING_HEADER.rstrip("\n").split(",") == ["a_device", "a_port", "b_device", "b_port", "link", "media"]


def test_parse_ratio():
    assert parse_ratio("7:1") == 7 and parse_ratio("1.5:1") == 1.5 and parse_ratio("1:1") == 1
