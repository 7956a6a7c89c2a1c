"""`fabric verify` writes the topology the wires describe for Slurm, with the renderer `gpucluster render`
uses: the fault-free dump gives the plan's own topology.conf, and a fault shows as the lines it changes.
Also: the progress callbacks of the readers and of verify count what they walked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hostlist
import pytest
import yaml

from gpucluster.cli import main
from gpucluster.cluster import cluster_of, load_cluster
from gpucluster.fabric.asbuilt import ibnetdiscover, lldp
from gpucluster.fabric.asbuilt.discover import discover
from gpucluster.fabric.asbuilt.planned import PlanIndex
from gpucluster.fabric.asbuilt.slurmview import compare_topology, found_fabric
from gpucluster.fabric.asbuilt.verify import verify
from gpucluster.render.fileset import render_slurm
from gpucluster.render.topology import topology_files
from gpucluster.spec.loader import validate_data

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fixtures.asbuilt.fabricgen import build, write_lldp_dir  # noqa: E402

META_IB = ROOT / "examples" / "meta-24k-ib.yaml"


def _variant(name: str, **slurm) -> object:
    data = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    data["slurm"].update(slurm)
    return cluster_of(validate_data(data, {}, Path(f"{name}.yaml")))


@pytest.mark.parametrize("name, slurm", [("meta-24k-ib", {}), ("staging", {}), ("colossus-200k", {}),
                                         ("meta-24k-roce", {"topology": "block", "version": "24.05"}),
                                         ("staging", {"version": "25.05"}),
                                         ("meta-24k-ib", {"tree_merge_leaves": 2})])
def test_topology_files_is_what_render_writes(name, slurm):
    cluster = _variant(name, **slurm)
    theirs = {k: v for k, v in render_slurm(cluster).items() if k.startswith("topology")}
    assert topology_files(cluster.spec, cluster.plan) == theirs and theirs


@pytest.fixture(scope="module")
def meta():
    plan = load_cluster(META_IB).plan
    return plan, build(plan)


def _verified(plan, built):
    fab = ibnetdiscover.parse(built.ibnetdiscover(), "dump")
    r = verify(plan, fab)
    return fab, r


def test_fault_free_wires_give_the_plans_topology(meta):
    plan, built = meta
    fab, r = _verified(plan, built)
    found = found_fabric(plan, fab, r.match)
    assert [(u.name, u.pod, u.hosts) for u in found.units] == \
        [(u.name, u.pod, tuple(plan.spec.group(u.group).hosts[u.first:u.first + u.count])) for u in plan.units]
    assert (found.tiers, found.pods) == (plan.tiers, plan.pods)
    topo = compare_topology(plan, fab, r.match)
    assert topo["same_as_plan"] and topo["diff"] == [] and topo["name"] == "topology.conf"


def test_a_missing_host_leaves_its_leaf_line(meta):
    plan, built = meta
    b = built.copy()
    unit = plan.units[3]
    host = plan.spec.group(unit.group).hosts[unit.first + 5]
    b.remove_host(host)
    fab, r = _verified(plan, b)
    topo = compare_topology(plan, fab, r.match)
    assert not topo["same_as_plan"]
    changed = [line for line in topo["diff"] if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(changed) == 2 and all(f"SwitchName={unit.name} " in line for line in changed), changed
    line = next(x for x in topo["text"].splitlines() if x.startswith(f"SwitchName={unit.name} "))
    nodes = hostlist.expand_hostlist(line.split("Nodes=", 1)[1])
    want = plan.spec.group(unit.group).hosts[unit.first:unit.first + unit.count]
    assert nodes == [h for h in want if h != host]


def test_a_cable_into_another_units_leaf_joins_the_two_units(meta):
    plan, built = meta
    b = built.copy()
    u0, u1 = plan.units[0], plan.units[1]
    h0 = plan.spec.group(u0.group).hosts[u0.first]
    h1 = plan.spec.group(u1.group).hosts[u1.first]
    b.swap_far_ends(("H", h0, "mlx5_0"), ("H", h1, "mlx5_0"))
    fab, r = _verified(plan, b)
    found = found_fabric(plan, fab, r.match)
    assert len(found.units) == len(plan.units) - 1  # the wires make one logical leaf of the two units
    joined = next(u for u in found.units if h0 in u.hosts)
    assert h1 in joined.hosts and joined.count == u0.count + u1.count
    assert not compare_topology(plan, fab, r.match)["same_as_plan"]


@pytest.mark.parametrize("name", ["staging", "frontier-mi250x-roce"])
def test_roce_lldp_wires_give_the_plans_topology(tmp_path, name):
    plan = load_cluster(ROOT / "examples" / f"{name}.yaml").plan
    folder = write_lldp_dir(build(plan), tmp_path / "lldp")
    idx = PlanIndex.of(plan)
    fab = lldp.read(folder, lldp.default_is_host(set(idx.host_group)))
    r = verify(plan, fab, idx=idx)
    assert r.ok
    assert compare_topology(plan, fab, r.match)["same_as_plan"]


def test_cli_writes_the_discovered_topology(meta, tmp_path, capsys):
    plan, built = meta
    b = built.copy()
    host = plan.spec.group("h100").hosts[9]
    b.remove_host(host)
    dump = tmp_path / "dump.txt"
    dump.write_text(b.ibnetdiscover())
    out = tmp_path / "wires"
    out.mkdir()
    code = main(["fabric", "verify", str(META_IB), "--ibnetdiscover", str(dump), "--slurm-topology", str(out),
                 "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["slurm_topology"]["written"] == str(out / "topology.conf")
    assert not doc["slurm_topology"]["same_as_plan"] and doc["slurm_topology"]["diff"]
    written = (out / "topology.conf").read_text()
    planned = topology_files(plan.spec, plan)["topology.conf"]
    assert written != planned and len(written.splitlines()) == len(planned.splitlines())
    code = main(["fabric", "verify", str(META_IB), "--ibnetdiscover", str(dump)])
    text = capsys.readouterr().out
    assert "topology.conf from the wires differs from the plan's" in text and "--slurm-topology" in text


# ---- progress --------------------------------------------------------------------------------------

class Counted:
    def __init__(self):
        self.n = 0

    def __call__(self, n: int = 1) -> None:
        self.n += n


def test_progress_callbacks_count_what_was_walked(meta, tmp_path):
    plan, built = meta
    dump = tmp_path / "dump.txt"
    dump.write_text(built.ibnetdiscover())
    mb = Counted()
    fab = ibnetdiscover.read(dump, mb)
    assert mb.n == dump.stat().st_size >> 20 and mb.n > 0
    links = Counted()
    verify(plan, fab, advance=links)
    assert links.n == sum(plan.links.values())
    walked = Counted()
    discover(fab, walked)
    assert walked.n == fab.link_count() // 10000 * 10000
    folder = write_lldp_dir(build(load_cluster(ROOT / "examples" / "staging.yaml").plan), tmp_path / "lldp")
    devices = Counted()
    lldp.read(folder, lambda name: name.startswith("gpu"), devices)
    assert devices.n == len(list(folder.glob("*.json")))
