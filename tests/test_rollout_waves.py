"""The wave planner (pure): whole topology units, a ceiling on nodes out, hand-drained nodes skipped.
Expected values come from the plan (its units), never from copies."""

from __future__ import annotations

from pathlib import Path

import hostlist
import pytest

from gpucluster.cluster import load_cluster
from gpucluster.emulate.specs import scaled_spec
from gpucluster.render.topology import logical_leaves
from gpucluster.rollout import WaveError, parse_max_unavailable, plan_waves, topology_units


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    path = Path(tmp_path_factory.mktemp("waves")) / "w64.yaml"
    path.write_text(scaled_spec("meta-24k-ib", {"h100": 64}, name="w64", fabric={"scalable_unit_nodes": 8}))
    return load_cluster(path)


def _hosts(c) -> list[str]:
    return c.contract_groups["slurm_compute"]


def test_leaf_units_are_the_plans_logical_leaves(cluster) -> None:
    units = topology_units(cluster.plan, "leaf", _hosts(cluster))
    leaves = logical_leaves(cluster.plan)
    assert [name for name, _ in units] == [g[0].name for g in leaves]
    for (_, nodes), g in zip(units, leaves, strict=True):
        assert list(nodes) == hostlist.expand_hostlist(cluster.plan.unit_hostlist(g[0]))


def test_waves_are_whole_units_under_the_ceiling(cluster) -> None:
    units = topology_units(cluster.plan, "leaf", _hosts(cluster))
    size = len(units[0][1])
    waves = plan_waves(units, 2 * size + 1)
    by_unit = dict(units)
    assert all(len(w.nodes) <= 2 * size + 1 for w in waves)
    assert all(len(w.units) == 2 for w in waves)  # two whole leaves fit, a third does not
    for w in waves:
        assert list(w.nodes) == [n for u in w.units for n in by_unit[u]]
    assert [n for w in waves for n in w.nodes] == [n for _, ns in units for n in ns]  # every node once, in order
    assert waves == plan_waves(units, 2 * size + 1)  # deterministic


def test_a_unit_larger_than_the_ceiling_is_refused_with_the_fix(cluster) -> None:
    units = topology_units(cluster.plan, "su", _hosts(cluster))
    with pytest.raises(WaveError, match="--by node"):
        plan_waves(units, len(units[0][1]) - 1, by="su")


def test_hand_drained_nodes_are_in_no_wave_and_take_no_room(cluster) -> None:
    units = topology_units(cluster.plan, "leaf", _hosts(cluster))
    size = len(units[0][1])
    drained = {units[0][1][0], units[1][1][3]}
    waves = plan_waves(units, size, skip=drained)
    assert not drained & {n for w in waves for n in w.nodes}
    assert len(waves) == len(units)


def test_by_node_and_block(cluster) -> None:
    hosts = _hosts(cluster)
    assert len(plan_waves(topology_units(cluster.plan, "node", hosts), 3)) == -(-len(hosts) // 3)
    pods = topology_units(cluster.plan, "block", hosts)
    assert sorted(n for _, ns in pods for n in ns) == sorted(hosts)
    assert {u.pod for u in cluster.plan.units} == set(range(len(pods)))


@pytest.mark.parametrize(("text", "want"), [("5%", 4), ("10%", 7), ("3", 3), (None, 8)])
def test_max_unavailable(text, want) -> None:
    assert parse_max_unavailable(text, 64, 8) == want


@pytest.mark.parametrize("text", ["0", "five", "101%", "2.5", "-1"])
def test_max_unavailable_refused(text) -> None:
    with pytest.raises(WaveError, match="--max-unavailable"):
        parse_max_unavailable(text, 64, 8)
