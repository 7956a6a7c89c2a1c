"""NVLink domains: planned one per NVL72 rack, rendered as Slurm blocks, read back by the real
slurmctld, and checked as built against what each node's `nvidia-smi -q` reports.

The nvidia-smi fixtures follow the published output format: each GPU's `Fabric` section with State,
Status, CliqueId and ClusterUUID (N/A on a GPU outside a multi-node NVLink fabric); written per test
into tmp_path, one file per node, named after it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import compiled, example_data, example_path, skip_or_fail, spec_from_data

from gpucluster.cli import main
from gpucluster.cluster import check_meaning, load_cluster
from gpucluster.fabric import plan_cluster
from gpucluster.fabric.asbuilt import nvlink
from gpucluster.render.topology import blocks, named_topologies
from gpucluster.spec.model import LoadedSpec


def gb200_data(racks: int = 2) -> dict:
    data = example_data("gb200-superpod")
    next(g for g in data["node_groups"] if g["name"] == "gb200")["count"] = 18 * racks
    return data


def rules(data: dict) -> list[tuple[str, str]]:
    spec = spec_from_data(data)
    return [(f.rule, f.level) for f in check_meaning(LoadedSpec(spec=spec, source=Path("x.yaml"), lines={}))
            if f.rule == "nvlink-domain"]


# ---- the plan ------------------------------------------------------------------------------------

def test_gb200_superpod_published_counts() -> None:
    """DGX SuperPOD GB200 RA: SUs of 8 racks; a rack = 18 compute trays of 4 GPUs (72 GPUs, one NVLink
    domain) and 9 NVLink switch trays. The example's 8 SUs: 64 racks, 1,152 trays, 4,608 GPUs."""
    cluster = load_cluster(example_path("gb200-superpod"))
    plan, spec = cluster.plan, cluster.spec
    rack = spec.parts.gpus["gb200"].nvlink_domain
    assert len(plan.domains) == 64 == 8 * 8
    assert {d.count for d in plan.domains} == {18} and {d.gpus for d in plan.domains} == {72}
    assert plan.gpus == 4_608 and spec.group("gb200").count == 1_152
    assert len(plan.domains) * rack.switch_trays == 576
    # one domain per rack, every tray in the rack the plan gives it
    assert len({d.rack for d in plan.domains}) == 64
    g = spec.group("gb200")
    for d in plan.domains:
        assert {plan.rack_of(g, i) for i in range(d.first, d.first + d.count)} == {d.rack}
    # the scale-out fabric never splits a domain: each domain's trays share their units' leaves
    for d in plan.domains:
        assert len({plan.unit_of_host[g.host(i)].name for i in range(d.first, d.first + d.count)}) == 1


@pytest.mark.parametrize(("su", "leaf", "spine"), [(1, 8, 4), (2, 16, 8), (4, 32, 18), (8, 64, 36), (18, 144, 72)])
def test_b300_xdr_superpod_table_3(su: int, leaf: int, spine: int) -> None:
    """DGX SuperPOD B300 (XDR) RA, Table 3: per SU count, nodes (72 a SU), GPUs, leaf and spine Q3400s,
    node-leaf and leaf-spine cables. Every row matches the planner exactly."""
    data = example_data("b300-xdr-superpod")
    next(g for g in data["node_groups"] if g["name"] == "b300")["count"] = 72 * su
    plan = plan_cluster(spec_from_data(data))
    assert plan.gpus == 576 * su
    assert plan.switches == {"leaf": leaf, "spine": spine}
    assert plan.links == {"node-leaf": 576 * su, "leaf-spine": 576 * su}


def test_mi355x_example_brings_its_own_lock() -> None:
    cluster = load_cluster(example_path("mi355x-800g-roce"))
    assert cluster.plan.gpus == 4_096 and cluster.spec.parts.gpus["mi355x"].memory_gb == 288
    from gpucluster.spec.stacks import driver_stack
    assert driver_stack(cluster.spec, "mi355x")["branch"] == "7.2.2"


def test_rack_of_other_than_a_domain_is_refused() -> None:
    data = gb200_data()
    next(g for g in data["node_groups"] if g["name"] == "gb200")["nodes_per_rack"] = 16
    assert ("nvlink-domain", "error") in rules(data)


def test_scalable_unit_splitting_a_domain_is_refused() -> None:
    data = gb200_data()
    data["fabric"]["scalable_unit_nodes"] = 16
    assert rules(data) == [("nvlink-domain", "error")]


def test_partial_domain_is_a_warning() -> None:
    data = gb200_data()
    next(g for g in data["node_groups"] if g["name"] == "gb200")["count"] = 35
    assert rules(data) == [("nvlink-domain", "warning")]


@pytest.mark.parametrize(("version", "want"), [("22.05", [("nvlink-imex", "error")]),
                                               ("23.11", [("nvlink-imex", "warning")]), ("24.11", [])])
def test_imex_switch_only_where_the_plugin_is(version: str, want: list) -> None:
    data = gb200_data()
    data["slurm"].update(version=version, parameters={"SwitchType": "switch/nvidia_imex"})
    spec = spec_from_data(data)
    found = check_meaning(LoadedSpec(spec=spec, source=Path("x.yaml"), lines={}))
    assert [(f.rule, f.level) for f in found if f.rule == "nvlink-imex"] == want


def test_whole_domains_raise_nothing() -> None:
    assert rules(gb200_data()) == []


# ---- Slurm ------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_blocks_are_the_domains(version: str) -> None:
    plan = load_cluster(example_path("gb200-superpod"), slurm_version=version).plan
    found = blocks(plan, version)
    assert [b.name for b in found.units] == [d.name for d in plan.domains]
    assert found.sizes == (18, 36, 72, 144)  # a domain, doubling up to the 8 domains of one SU (one pod)


def mixed_data() -> dict:
    """NVL72 racks beside classic 8-GPU nodes (4 rails, like the trays): block for the NVLink partition,
    tree for the classic one, in one topology.yaml (26.05)."""
    data = gb200_data(racks=4)
    data["slurm"]["version"] = "26.05"
    classic = copy.deepcopy(next(g for g in data["node_groups"] if g["name"] == "gb200"))
    classic.update(name="b200", count=36, hostname="hgx####", gpu="b200-sxm-180g", gpus_per_node=8,
                   nodes_per_rack=4)
    classic["cpu"] = {"sockets": 2, "cores_per_socket": 56}
    data["node_groups"].insert(3, classic)
    data["slurm"]["partitions"] = [{"name": "nvl72", "groups": ["gb200"], "default": True, "topology": "block"},
                                   {"name": "classic", "groups": ["b200"], "topology": "tree"}]
    return data


def test_mixed_cluster_topology_yaml_per_partition() -> None:
    spec = spec_from_data(mixed_data())
    plan = plan_cluster(spec)
    tops = {t.name: t for t in named_topologies(spec, plan, "26.05")}
    assert set(tops) == {"block", "tree"}
    names = [b.name for b in tops["block"].blocks.units]
    assert names[:4] == ["nvl0001", "nvl0002", "nvl0003", "nvl0004"]
    assert all(not n.startswith("nvl") for n in names[4:])  # the classic nodes keep their units


def _run_slurmctld(data: dict, line: str, tmp_path_factory, overrides: dict | None = None):
    """Render, start the line's real slurmctld on the files, return (blocks, tree, partitions, config)."""
    import os

    from gpucluster.emulate import SlurmCluster
    from gpucluster.emulate.roots import RootError, runtime
    from gpucluster.render import render_all, write_outputs

    if os.geteuid() != 0:
        skip_or_fail(f"Slurm {line} runs from a Debian root through chroot, which needs root")
    try:
        runtime(line)
    except RootError as exc:
        skip_or_fail(f"Slurm {line}: {exc}")
    cluster = compiled(spec_from_data(data))
    out = tmp_path_factory.mktemp(f"nvl-{line}")
    write_outputs(render_all(cluster, cabling=False), out)
    with SlurmCluster(out, line=line, overrides=overrides, start_timeout=300) as sc:
        yaml_file = (out / "topology.yaml").exists()
        found_blocks = sc.blocks("block" if yaml_file else None)
        tree = sc.topology("tree") if yaml_file and "tree" in (out / "topology.yaml").read_text() else None
        return cluster, found_blocks, tree, sc.partitions(), sc.scontrol("show", "config")


@pytest.mark.slurm
@pytest.mark.parametrize("line", ["24.11", "26.05"])
def test_slurmctld_reads_back_the_domains_with_imex(line: str, tmp_path_factory) -> None:
    """The GB200 example's block topology on the real slurmctld, with SwitchType=switch/nvidia_imex (the
    Debian 13 and sid builds carry switch_nvidia_imex.so): `scontrol show topology` lists each domain as a
    base block of its 18 trays, and the aggregated sizes up to one SU."""
    data = gb200_data(racks=8)
    data["slurm"].update(version=line, topology="block", parameters={"SwitchType": "switch/nvidia_imex"})
    cluster, found, _tree, _parts, config = _run_slurmctld(data, line, tmp_path_factory)
    base = {n: b for n, b in found.items() if not b["aggregated"]}
    plan = cluster.plan
    assert sorted(base) == [d.name for d in plan.domains]
    g = cluster.spec.group("gb200")
    for d in plan.domains:
        assert base[d.name]["nodes"] == {g.host(i) for i in range(d.first, d.first + d.count)}
        assert base[d.name]["size"] == 18
    assert {b["size"] for b in found.values() if b["aggregated"]} == {36, 72, 144}
    assert "switch/nvidia_imex" in config


@pytest.mark.slurm
def test_slurmctld_2605_takes_the_mixed_topology_yaml(tmp_path_factory) -> None:
    _cluster, found, tree, parts, _config = _run_slurmctld(mixed_data(), "26.05", tmp_path_factory)
    base = {n: b for n, b in found.items() if not b["aggregated"]}
    assert [n for n in sorted(base) if n.startswith("nvl")] == ["nvl0001", "nvl0002", "nvl0003", "nvl0004"]
    assert tree, "the tree topology was not read back"
    assert parts["nvl72"].get("Topology") == "block" and parts["classic"].get("Topology") == "tree"


# ---- as built ---------------------------------------------------------------------------------

UUID = "5a1e0c8d-3f2b-4c6e-9d7a-{:012x}"


def smi_text(gpus: int, clique: str | None, cluster: str | None, state: str = "Completed") -> str:
    """`nvidia-smi -q` of one node, trimmed to the parts around each GPU's Fabric section."""
    out = ["", "==============NVSMI LOG==============", "", "Timestamp                                 : x",
           "Driver Version                            : 570.172.08",
           f"Attached GPUs                             : {gpus}"]
    for i in range(gpus):
        out += [f"GPU 00000009:0{i}:00.0", "    Product Name                          : NVIDIA GB200",
                "    Fabric",
                f"        State                             : {state if clique else 'N/A'}",
                f"        Status                            : {'Success' if clique else 'N/A'}",
                f"        CliqueId                          : {clique or 'N/A'}",
                f"        ClusterUUID                       : {cluster or 'N/A'}",
                "        Health", "            Bandwidth                     : Full",
                "    Processes                             : None", ""]
    return "\n".join(out)


def smi_xml(gpus: int, clique: str, cluster: str) -> str:
    body = "".join(f"<gpu id=\"00000009:0{i}:00.0\"><product_name>NVIDIA GB200</product_name><fabric>"
                   f"<state>Completed</state><status>Success</status><cliqueId>{clique}</cliqueId>"
                   f"<clusterUuid>{cluster}</clusterUuid></fabric></gpu>" for i in range(gpus))
    return ('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
            f"<nvidia_smi_log><attached_gpus>{gpus}</attached_gpus>{body}</nvidia_smi_log>")


@pytest.fixture
def healthy(tmp_path):
    """Two NVL72 racks as built: every tray's 4 GPUs in its rack's clique (rack r: CliqueId 32766+r)."""
    plan = plan_cluster(spec_from_data(gb200_data(racks=2)))
    folder = tmp_path / "smi"
    folder.mkdir()
    g = plan.spec.group("gb200")
    for d in plan.domains:
        for i in range(d.first, d.first + d.count):
            (folder / f"{g.host(i)}.txt").write_text(smi_text(4, str(32766 + d.index), UUID.format(d.index)))
    return plan, folder


def kinds(findings) -> list[tuple[str, str]]:
    return [(f.kind, f.detail.get("node") or f.detail.get("domain")) for f in findings]


def test_discover_groups_by_cluster_uuid_and_clique(healthy) -> None:
    _plan, folder = healthy
    found = nvlink.discover(folder)
    assert sorted(len(v) for v in found.cliques.values()) == [18, 18]
    assert f"{UUID.format(0)}.32766" in found.cliques and found.no_clique == []


def test_xml_output_is_read_the_same(healthy, tmp_path) -> None:
    _plan, folder = healthy
    (folder / "gb0001.txt").unlink()
    (folder / "gb0001.xml").write_text(smi_xml(4, "32766", UUID.format(0)))
    assert nvlink.discover(folder).nodes["gb0001"].clique == f"{UUID.format(0)}.32766"


def test_healthy_racks_have_no_findings(healthy) -> None:
    plan, folder = healthy
    assert nvlink.verify(plan, nvlink.discover(folder)) == []


def test_tray_in_the_wrong_domain_is_found_and_only_it(healthy) -> None:
    plan, folder = healthy
    (folder / "gb0005.txt").write_text(smi_text(4, "32767", UUID.format(1)))  # rack 2's clique
    assert kinds(nvlink.verify(plan, nvlink.discover(folder))) == [("nvlink-wrong-domain", "gb0005")]


def test_missing_tray_is_found_and_only_it(healthy) -> None:
    plan, folder = healthy
    (folder / "gb0020.txt").unlink()
    found = nvlink.verify(plan, nvlink.discover(folder))
    assert kinds(found) == [("nvlink-domain-short", "nvl0002")]
    assert found[0].detail["missing"] == ["gb0020"] and "17 of 18" in found[0].message


def test_node_without_clique_is_found_and_only_it(healthy) -> None:
    plan, folder = healthy
    (folder / "gb0030.txt").write_text(smi_text(4, None, None))
    assert kinds(nvlink.verify(plan, nvlink.discover(folder))) == [("nvlink-no-clique", "gb0030")]


def test_cli_discover_and_verify(healthy, tmp_path, capsys) -> None:
    _plan, folder = healthy
    spec = tmp_path / "gb200.yaml"
    spec.write_text(json.dumps(gb200_data(racks=2)))
    assert main(["fabric", "discover", "--nvlink", str(folder), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["cliques"]) == 2
    assert main(["fabric", "verify", str(spec), "--nvlink", str(folder)]) == 0
    assert "every one of 2 NVLink domains" in capsys.readouterr().out
    (folder / "gb0005.txt").write_text(smi_text(4, "32767", UUID.format(1)))
    assert main(["fabric", "verify", str(spec), "--nvlink", str(folder), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in doc["findings"]] == ["nvlink-wrong-domain"]


def test_unreadable_input_exits_2(tmp_path, capsys) -> None:
    folder = tmp_path / "smi"
    folder.mkdir()
    (folder / "gb0001.txt").write_text("not nvidia-smi at all\n")
    assert main(["fabric", "discover", "--nvlink", str(folder)]) == 2
    assert "gb0001.txt" in capsys.readouterr().err


def test_plan_json_lists_the_domains_and_only_where_there_are_some() -> None:
    from gpucluster.fabric.summary import plan_summary

    doc = plan_summary(load_cluster(example_path("gb200-superpod")).plan)
    assert len(doc["nvlink_domains"]) == 64
    assert doc["nvlink_domains"][0] == {"name": "nvl0001", "group": "gb200", "rack": "rack0007",
                                            "nodes": "gb[0001-0018]", "trays": 18, "planned_trays": 18, "gpus": 72}
    assert "nvlink_domains" not in plan_summary(load_cluster(example_path("b300-xdr-superpod")).plan)
    # the explanation never suggests a unit that would split a domain
    assert not any("scalable_unit_nodes: 32" in e.get("fix", "") for e in doc["explanations"])


def test_plan_html_shows_the_domains_in_their_racks() -> None:
    from gpucluster.report.html import plan_html

    page = plan_html(load_cluster(example_path("gb200-superpod")))
    assert 'data-rack="rack0007"' in page
    assert "NVLink domain nvl0001: 18 compute trays, 72 GPUs, 9 NVLink switch trays" in page
    assert "<td>nvl0064</td>" in page
    assert '<tr data-nvlink="switch trays"><td>nvlink</td><td>switch trays (gb200)</td>' in page


def test_bom_counts_the_nvlink_switch_trays_in_the_racks() -> None:
    """9 NVLink switch trays a rack (DGX SuperPOD GB200 RA): 576 for 64 racks, in bom.csv and the report."""
    from gpucluster.fabric.cabling import bom_rows
    from gpucluster.report.bom import build_bom

    plan = load_cluster(example_path("gb200-superpod")).plan
    rows = {(r[0], r[1]): r[4] for r in bom_rows(plan)}
    assert rows[("nvlink", "switch trays")] == 576 and rows[("nvlink", "domains")] == 64
    assert ("switch trays", "gb200", 576) in {(o[0], o[1], o[3]) for o in build_bom(plan).nvlink}
    assert not [r for r in bom_rows(load_cluster(example_path("b300-xdr-superpod")).plan) if r[0] == "nvlink"]


@pytest.mark.parametrize("name", ["gb200-superpod", "gb300-nvl72", "b300-xdr-superpod"])
def test_grace_trays_have_an_install_path_and_no_warning(name: str) -> None:
    """The lock has NVIDIA's sbsa repository beside the x86_64 one, so an arm64 (Grace) group is checked
    without a host-arch finding of any level (tests/test_arm64_repo.py holds the install path itself)."""
    from gpucluster.cluster import check_file

    _loaded, found = check_file(example_path(name))
    assert [f for f in found if f.rule == "host-arch" or (f.level != "error" and "arm64" in f.message)] == []


def test_verify_nvlink_on_a_plan_without_domains_exits_2(healthy, capsys) -> None:
    _plan, folder = healthy
    assert main(["fabric", "verify", str(example_path("b300-xdr-superpod")), "--nvlink", str(folder)]) == 2
    assert "no NVLink domains" in capsys.readouterr().err
