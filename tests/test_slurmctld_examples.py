"""The real consumer, on every Slurm line gpucluster claims: every example rendered for that line, loaded
by that line's own slurmctld (with munge) on loopback, and read back. What slurmctld understood must be
exactly the plan: the planned switches with their levels and node sets, or the planned blocks and block
sizes, every compute node placed once, the planned GRES per group, and (25.05+) every partition on the
named topology its spec asks for.

Lines (gpucluster.emulate.roots.LINES): 22.05 from the host's Debian 12 packages, 24.11 from a Debian
trixie root, 26.05 from a sid root (both built once, cached by recipe hash). Each case renders with
`load_cluster(path, slurm_version=V)`, the path `gpucluster render --slurm-version V` takes; block cases
switch the spec to topology: block in memory. 22.05 has no topology/block, so it runs tree only.
23.11 and 25.05 renders run on the next line up (24.11, 26.05): a slurmctld reads the configs of the
releases before it; test_slurm_versions.py shows the 25.05/25.11/26.05 renders of every example are the
same files apart from their "Rendered for" comments, so the 26.05 cases stand for all three.

Start-up cost on a 2-core machine is dominated by the node count (Colossus 200k: 25,000 compute nodes)
and the switch count (topology/tree computes switch distances in O(switches^3); meta-24k-roce has
1,545). Cases marked slow (colossus-200k: over a minute each on the shared 2-core machine) stay out of a
developer's default run; they run in CI, with GPUCLUSTER_SLOW=1 or with `-m slow` (conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from dataclasses import dataclass

import hostlist
import pytest
from conftest import EXAMPLES, compiled, example_data, example_path, skip_or_fail, slurmctld_available, spec_from_data

from gpucluster.cluster import Cluster, load_cluster
from gpucluster.emulate.roots import RootError, runtime
from gpucluster.render import render_all, write_outputs
from gpucluster.render.topology import blocks, named_topologies, partition_kinds, slurm_switches
from gpucluster.spec.slurm_versions import has

SLOW = {"colossus-200k"}
START_TIMEOUT = 600.0

pytestmark = pytest.mark.slurm


@dataclass(frozen=True)
class Case:
    example: str
    line: str  # the slurmctld that reads the files
    render: str  # the release the files are rendered for
    kind: str  # tree | block
    merge: int = 1  # slurm.tree_merge_leaves

    @property
    def id(self) -> str:
        extra = "" if self.render == self.line else f"-render{self.render}"
        merged = f"-merge{self.merge}" if self.merge > 1 else ""
        return f"{self.example}-{self.line}{extra}-{self.kind}{merged}"


def cases() -> list[Case]:
    out = []
    for name in EXAMPLES:
        out.append(Case(name, "22.05", "22.05", "tree"))
        for line in ("24.11", "26.05"):
            out += [Case(name, line, line, "tree"), Case(name, line, line, "block")]
    # renders for releases between the lines, on the line above them
    out += [Case("staging", "24.11", "23.11", "block"), Case("staging", "26.05", "25.05", "tree"),
            Case("staging", "26.05", "25.11", "block")]
    # the coarser logical tree (4 rack leaves of a non-blocking pod per logical leaf), on every line
    out += [Case("meta-24k-roce", line, line, "tree", merge=4) for line in ("22.05", "24.11", "26.05")]
    return out


CASES = cases()


@dataclass
class Running:
    case: Case
    cluster: Cluster
    version: str  # what slurmctld -V reported
    tree: dict | None
    blocks: dict | None
    nodes: dict  # the sampled compute nodes (sample()), as slurmctld reports them
    node_count: int
    partitions: dict
    ready_s: float
    log_tail: str


def compile_case(case: Case) -> Cluster:
    """The example at the case's release, on the case's topology: the spec on disk where it says that one, else
    switched in memory (most examples say tree; the GB200/GB300 ones say block)."""
    if case.kind == example_data(case.example)["slurm"].get("topology", "tree") and case.merge == 1:
        return load_cluster(example_path(case.example), slurm_version=case.render)
    data = example_data(case.example)
    data["slurm"].update(version=case.render, topology=case.kind, tree_merge_leaves=case.merge)
    return compiled(spec_from_data(data), f"{case.example}.yaml (topology: {case.kind}, merge {case.merge})")


def need(case: Case) -> None:
    if case.line == "22.05":
        if not slurmctld_available():
            skip_or_fail("slurmctld/munged/scontrol not installed (apt-get install slurmctld slurm-client munge)")
    elif os.geteuid() != 0:
        skip_or_fail(f"Slurm {case.line} runs from a Debian root through chroot, which needs root")


def sample(hosts: list[str], k: int = 12) -> list[str]:
    """First, last and a fixed-seed sample in between: big groups are not read node by node."""
    if len(hosts) <= k:
        return hosts
    return [hosts[0], hosts[-1], *random.Random(len(hosts)).sample(hosts[1:-1], k - 2)]


_RUNS: dict[Case, Running] = {}


def run(case: Case, tmp_path_factory) -> Running:
    """Render the case, start its line's slurmctld on the files, read topology, nodes and partitions
    once per case (the tree, block and common tests share the run; what is kept is small: sampled
    nodes, switches and blocks)."""
    if case in _RUNS:
        return _RUNS[case]
    from gpucluster.emulate import SlurmCluster

    need(case)
    cluster = compile_case(case)
    out = tmp_path_factory.mktemp(case.id)
    write_outputs(render_all(cluster, cabling=False), out)
    try:
        runtime(case.line)  # builds the line's Debian root once (cached), or says why it cannot
    except RootError as exc:
        skip_or_fail(f"Slurm {case.line}: {exc}")
    t0 = time.monotonic()
    with SlurmCluster(out, start_timeout=START_TIMEOUT, line=case.line) as sc:
        ready = time.monotonic() - t0
        name = case.kind if has(case.render, "topology-yaml") else None
        tree = sc.topology(name) if case.kind == "tree" else None
        found_blocks = sc.blocks(name) if case.kind == "block" else None
        nodes = sc.nodes()
        parts = sc.partitions()
        version = sc.runtime.version()
        log = sc.log_tail(60)
    wanted = {h for g in cluster.spec.groups_with_role("compute") for h in sample(g.hosts)}
    print(f"\n{case.id}: slurmctld {version} answered after {ready:.1f} s ({len(nodes)} nodes)")
    _RUNS[case] = Running(case, cluster, version, tree, found_blocks, {n: nodes[n] for n in wanted if n in nodes},
                          len(nodes), parts, ready, log)
    return _RUNS[case]


def _params(kind: str | None) -> list:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.example in SLOW else [])
            for c in CASES if kind in (None, c.kind)]


@pytest.fixture(scope="module", params=_params(None))
def running(request, tmp_path_factory) -> Running:
    return run(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=_params("tree"))
def tree_run(request, tmp_path_factory) -> Running:
    return run(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=_params("block"))
def block_run(request, tmp_path_factory) -> Running:
    return run(request.param, tmp_path_factory)


def fail_with_log(r: Running, message: str) -> None:
    """Print slurmctld's log before failing, as a service check should."""
    pytest.fail(f"{message}\n--- slurmctld log ({r.case.id}), last lines:\n{r.log_tail}")


@contextlib.contextmanager
def journal_on_failure(r: Running):
    try:
        yield
    except AssertionError as exc:
        fail_with_log(r, str(exc))


def expand(exprs) -> set[str]:
    return set(hostlist.expand_hostlist(",".join(exprs))) if exprs else set()


def compute_hosts(r: Running) -> set[str]:
    return {h for g in r.cluster.spec.groups_with_role("compute") for h in g.hosts}


def test_slurmctld_is_the_claimed_line(running):
    assert running.version.startswith(running.case.line + ".")


def test_tree_has_exactly_the_planned_switches(tree_run):
    r = tree_run
    with journal_on_failure(r):
        planned = {s.name: s for s in slurm_switches(r.cluster.plan)}
        if set(r.tree) != set(planned):
            fail_with_log(r, f"switches differ: missing {sorted(set(planned) - set(r.tree))[:5]}, "
                             f"unexpected {sorted(set(r.tree) - set(planned))[:5]}")
        below: dict[str, set[str]] = {}

        def nodes_below(name: str) -> set[str]:
            if name not in below:
                s = planned[name]
                below[name] = expand(s.nodes) | set().union(*(nodes_below(c) for c in s.switches))
            return below[name]

        for name, s in planned.items():
            got = r.tree[name]
            assert got["level"] == s.level, f"{name}: level {got['level']}, planned {s.level}"
            assert got["switches"] == set(s.switches), name
            assert got["nodes"] == nodes_below(name), f"{name}: slurmctld sees other nodes than planned"


def test_tree_places_every_compute_node_once_under_the_root(tree_run):
    r = tree_run
    with journal_on_failure(r):
        root = r.tree.get(r.cluster.plan.root_name)
        if root is None:
            fail_with_log(r, f"no root switch '{r.cluster.plan.root_name}'")
        assert root["level"] == max(s["level"] for s in r.tree.values())
        compute = compute_hosts(r)
        assert root["nodes"] == compute
        seen = [n for s in r.tree.values() if s["level"] == 0 for n in s["nodes"]]
        assert len(seen) == len(set(seen)) == len(compute), "a node under two leaves, or under none"


def test_blocks_are_the_planned_units_and_sizes(block_run):
    r = block_run
    with journal_on_failure(r):
        plan = r.cluster.plan
        planned = blocks(plan, r.case.render)
        base = {n: b for n, b in r.blocks.items() if not b["aggregated"]}
        assert sorted(base) == sorted(u.name for u in planned.units)
        for u in planned.units:
            assert base[u.name]["nodes"] == expand([plan.unit_hostlist(u)]), u.name
        if has(r.case.render, "block-sizes"):
            assert {b["size"] for b in base.values()} == {planned.sizes[0]}
            aggregated = {b["size"] for b in r.blocks.values() if b["aggregated"]}
            reachable = {s for s in planned.sizes[1:] if s <= len(planned.units) * planned.sizes[0]}
            assert aggregated == reachable, f"aggregated block sizes {sorted(aggregated)}, planned {sorted(reachable)}"


def test_blocks_place_every_compute_node_once(block_run):
    r = block_run
    with journal_on_failure(r):
        seen = [n for b in r.blocks.values() if not b["aggregated"] for n in b["nodes"]]
        assert len(seen) == len(set(seen)) and set(seen) == compute_hosts(r)


def test_partitions_are_on_their_named_topology(running):
    """25.05+: each partition's Topology= is the one its spec asks for, and that topology exists."""
    r = running
    spec = r.cluster.spec
    if not has(r.case.render, "topology-yaml"):
        assert all("Topology" not in p for p in r.partitions.values()), "Topology= before 25.05"
        return
    with journal_on_failure(r):
        names = {t.name for t in named_topologies(spec, r.cluster.plan, r.case.render)}
        for p, kind in partition_kinds(spec).items():
            assert r.partitions[p].get("Topology") == kind, p
            assert kind in names


def test_nodes_have_the_planned_gres_and_shape(running):
    r = running
    with journal_on_failure(r):
        spec = r.cluster.spec
        compute = spec.groups_with_role("compute")
        assert r.node_count == sum(g.count for g in compute)
        for g in compute:
            gres = r.cluster.gres(g)
            parts = {p.name for p in spec.slurm.partitions if g.name in p.groups}
            for host in sample(g.hosts):
                if host not in r.nodes:
                    fail_with_log(r, f"{host} ({g.name}) unknown to slurmctld")
                n = r.nodes[host]
                assert n["gres"] == gres, f"{host}: Gres={n['gres']}, planned {gres}"
                assert n["cpus"] == g.cpu.cpus
                assert n["memory"] == g.memory_gb * 1024
                assert n["partitions"] == parts
                assert g.name in n.get("AvailableFeatures", "").split(",")


def test_start_up_time_is_reported(running, record_property):
    """Not a threshold: the figure goes into the JUnit report (and -s output) for the docs."""
    record_property(f"slurmctld_ready_s[{running.case.id}]", round(running.ready_s, 1))
    assert running.ready_s < START_TIMEOUT


# ---- hostname shapes that `check` accepts must load too ------------------------------------------

HOST_SHAPES = {
    "index past the padding": {"hostname": "gpu##", "count": 120},  # gpu01 .. gpu99, gpu100 .. gpu120
    "index from zero": {"hostname": "n###", "first_index": 0, "count": 9},
    "hyphen before the index": {"hostname": "h100-#####", "first_index": 7, "count": 5},
    "single node": {"hostname": "solo#", "count": 1},
}


@pytest.mark.parametrize("shape", HOST_SHAPES.values(), ids=HOST_SHAPES.keys())
def test_hostname_shapes_load_in_slurmctld(shape, tmp_path):
    """A spec that passes `check` must give hostlists slurmctld expands to exactly the generated names."""
    if not slurmctld_available():
        skip_or_fail("slurmctld/munged/scontrol not installed (apt-get install slurmctld slurm-client munge)")
    from gpucluster.cluster import check_meaning
    from gpucluster.emulate import SlurmCluster
    from gpucluster.spec.model import LoadedSpec

    data = example_data("staging")
    data["node_groups"][1].update(shape)
    data["fabric"]["nodes_per_leaf"] = 8
    spec = spec_from_data(data)
    assert not [f for f in check_meaning(LoadedSpec(spec=spec, source="x.yaml", lines={})) if f.level == "error"]
    cluster = compiled(spec)
    plan = cluster.plan
    write_outputs(render_all(cluster, cabling=False), tmp_path)
    with SlurmCluster(tmp_path, start_timeout=START_TIMEOUT) as sc:
        nodes, topo = sc.nodes(), sc.topology()
        log = sc.log_tail(40)
    hosts = spec.group("gpu").hosts
    assert set(nodes) == set(hosts), log
    assert topo[plan.root_name]["nodes"] == set(hosts), log
