"""verify against the plan of examples/meta-24k-ib.yaml: a dump written from the plan in the real
ibnetdiscover format (tests/fixtures/asbuilt/fabricgen.py), with one fault injected at a time. Each fault
is found, and only it; the fault-free dump gives no findings. Names in the expectations come from the
plan (the generator's model of it), never from the finding text alone."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.fabric.asbuilt import ibnetdiscover
from gpucluster.fabric.asbuilt.names import SiteNames, load_hosts, switch_pattern
from gpucluster.fabric.asbuilt.verify import label, verify

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fixtures.asbuilt.fabricgen import MODEL_DESC, build  # noqa: E402


@pytest.mark.parametrize("name", ["meta-24k-ib", "meta-24k-roce", "colossus-200k", "frontier-mi250x-roce",
                                  "meta-rsc-phase1", "staging"])
def test_plan_index_names_every_switch_the_cabling_names(name):
    """verify matches switches by the names PlanIndex derives; cabling_rows is the truth for them."""
    from gpucluster.fabric.asbuilt.planned import PlanIndex
    from gpucluster.fabric.cabling import cabling_rows

    plan = load_cluster(ROOT / "examples" / f"{name}.yaml").plan
    idx = PlanIndex.of(plan)
    tiers: dict[str, str] = {}
    for chunk in cabling_rows(plan):
        for row in chunk.splitlines():
            a, _, b, _, link, _ = row.split(",")
            lower, upper = link.split("-")
            if lower != "node":
                tiers[a] = lower
            tiers[b] = upper
    assert idx.switch_tier == tiers


@pytest.fixture(scope="module")
def meta():
    plan = load_cluster(ROOT / "examples" / "meta-24k-ib.yaml").plan
    return plan, build(plan)


def run(plan, built, site=None):
    fab = ibnetdiscover.parse(built.ibnetdiscover(), "dump")
    return verify(plan, fab, site)


def kinds(result) -> Counter:
    return Counter(f.kind for f in result.findings)


def end_label(end) -> str:
    """The generator's end as verify names it."""
    return label((end[1], end[2]))


def test_fault_free_dump_matches(meta):
    plan, built = meta
    r = run(plan, built)
    assert r.findings == [] and r.ok
    assert r.summary["planned_links"] == sum(plan.links.values()) == r.summary["matched_links"]
    assert r.summary["inferred"] is False


def test_swapped_uplinks_name_the_two_ports(meta):
    plan, built = meta
    b = built.copy()
    leaf1, leaf2 = ("S", plan.units[0].name + "-r0", plan.tier("leaf").down + 1), \
        ("S", plan.units[1].name + "-r0", plan.tier("leaf").down + 1)
    far1, far2 = b.peer(leaf1), b.peer(leaf2)
    assert far1[1] == far2[1]  # both first uplinks land on the same spine: a swap there is one fix
    b.swap_far_ends(leaf1, leaf2)
    r = run(plan, b)
    assert kinds(r) == Counter({"miscabled": 1})
    assert r.findings[0].detail["swap"] == [end_label(far1), end_label(far2)]


def test_swapped_host_cables(meta):
    plan, built = meta
    b = built.copy()
    h1, h2 = plan.spec.group("h100").hosts[:2]
    b.swap_far_ends(("H", h1, "mlx5_0"), ("H", h2, "mlx5_0"))
    r = run(plan, b)
    assert kinds(r) == Counter({"miscabled": 1})
    assert "swap" in r.findings[0].detail


def test_missing_cable(meta):
    plan, built = meta
    b = built.copy()
    host = plan.spec.group("h100").hosts[2]
    leaf_end = b.unlink(("H", host, "mlx5_2"))
    r = run(plan, b)
    assert kinds(r) == Counter({"missing-link": 1})
    assert r.findings[0].detail == {"a": f"{host} mlx5_2", "b": end_label(leaf_end)}
    # both ports of the host-switch cable empty: the HCA drops out of the dump, the leaf port is empty
    assert r.findings[0].message == (f"{host} mlx5_2 - {end_label(leaf_end)}: planned cable not seen (the HCA is "
                                     "not in the dump and the switch port is empty)")


def test_missing_single_uplink_both_ports_empty(meta):
    """A leaf-spine link is a bundle of one in this plan: a missing one is a missing link, both ports empty."""
    plan, built = meta
    assert plan.tier("spine").links_per_peer == 1
    b = built.copy()
    leaf_end = ("S", plan.units[1].name + "-r4", plan.tier("leaf").down + 3)
    spine_end = b.unlink(leaf_end)
    r = run(plan, b)
    assert kinds(r) == Counter({"missing-link": 1})
    f = r.findings[0]
    assert f.message == f"{end_label(leaf_end)} - {end_label(spine_end)}: planned cable not seen (both ports empty)"
    assert f.detail == {"a": end_label(leaf_end), "b": end_label(spine_end)}


def test_halved_bundle(meta):
    plan, built = meta
    b = built.copy()
    spine, core = "spine00001", b.peer(("S", "spine00001", plan.tier("spine").down + 1))[1]
    bundle = b.bundle(spine, core)
    planned = plan.tier("core").links_per_peer
    assert len(bundle) == planned >= 2
    for end in bundle[: planned // 2]:
        b.unlink(end)
    r = run(plan, b)
    assert kinds(r) == Counter({"degraded-bundle": 1})
    d = r.findings[0].detail
    assert (d["a"], d["b"], d["planned"], d["found"]) == (spine, core, planned, planned - planned // 2)


def test_rail_swap(meta):
    plan, built = meta
    b = built.copy()
    host = plan.spec.group("h100").hosts[4]
    b.swap_far_ends(("H", host, "mlx5_3"), ("H", host, "mlx5_5"))
    r = run(plan, b)
    assert kinds(r) == Counter({"wrong-rail": 1})
    assert r.findings[0].detail["swap"] == [f"{host} mlx5_3", f"{host} mlx5_5"]
    assert "rails 3 and 5" in r.findings[0].message


def test_one_nic_on_another_rails_leaf(meta):
    plan, built = meta
    b = built.copy()
    host = plan.spec.group("h100").hosts[0]
    target = b.unlink(("H", host, "mlx5_5"))  # free rail 5's port, then plug rail 2's NIC into it
    b.unlink(("H", host, "mlx5_2"))
    b.link(("H", host, "mlx5_2"), target)
    r = run(plan, b)
    assert kinds(r) == Counter({"wrong-rail": 1})  # one cable moved: one finding (rail 2's port is named in it)
    wrong = next(f for f in r.findings if f.kind == "wrong-rail")
    assert wrong.detail == {"end": f"{host} mlx5_2", "reaches": end_label(target),
                            "planned": wrong.detail["planned"]}
    assert "(rail 2) reaches" in wrong.message and "on a rail 5 leaf" in wrong.message


def test_down_rated_link(meta):
    plan, built = meta
    b = built.copy()
    end = ("S", plan.units[2].name + "-r1", plan.tier("leaf").down + 8)
    b.downrate(end, "4xHDR")
    r = run(plan, b)
    assert kinds(r) == Counter({"wrong-speed": 1})
    d = r.findings[0].detail
    assert {d["a"], d["b"]} == {end_label(end), end_label(b.peer(end))}
    assert (d["rate"], d["planned"]) == ("4xHDR", "4xNDR")


@pytest.mark.parametrize("desc", [MODEL_DESC, "", "localhost mlx5_1", "ubuntu"])
def test_unnamed_hca(meta, desc):
    plan, built = meta
    b = built.copy()
    host = plan.spec.group("h100").hosts[6]
    b.hcas[(host, "mlx5_1")] = desc
    r = run(plan, b)
    assert kinds(r) == Counter({"unidentified-endpoint": 1})
    assert r.findings[0].detail["expected"] == f"{host} mlx5_1"
    assert r.findings[0].detail["at"] == end_label(b.peer(("H", host, "mlx5_1")))


def test_unknown_switch_on_a_spare_port(meta):
    plan, built = meta
    b = built.copy()
    core = plan.tier("core")
    assert core.down < core.radix  # the core has spare ports
    b.extra_switches["lab-sw-01"] = 8
    b.link(("S", "core00001", core.radix - 1), ("S", "lab-sw-01", 1))
    r = run(plan, b)
    assert kinds(r) == Counter({"unknown-switch": 1})
    assert r.findings[0].detail == {"switch": "lab-sw-01", "links": 1}


def test_extra_cable_between_spare_ports(meta):
    plan, built = meta
    b = built.copy()
    spare = plan.tier("core").radix - 2
    b.link(("S", "core00001", spare), ("S", "core00002", spare))
    r = run(plan, b)
    assert kinds(r) == Counter({"extra-link": 1})


def test_host_missing_from_the_dump(meta):
    plan, built = meta
    b = built.copy()
    host = plan.spec.group("h100").hosts[9]
    b.remove_host(host)
    r = run(plan, b)
    assert kinds(r) == Counter({"missing-link": 1})
    assert r.findings[0].detail == {"device": host, "links": plan.rails}


def test_many_faults_at_once_each_found(meta):
    plan, built = meta
    b = built.copy()
    hosts = plan.spec.group("h100").hosts
    b.swap_far_ends(("H", hosts[100], "mlx5_1"), ("H", hosts[100], "mlx5_6"))
    b.unlink(("H", hosts[200], "mlx5_0"))
    b.downrate(("H", hosts[300], "mlx5_7"), "4xHDR")
    b.hcas[(hosts[400], "mlx5_4")] = "localhost mlx5_4"
    r = run(plan, b)
    assert kinds(r) == Counter({"wrong-rail": 1, "missing-link": 1, "wrong-speed": 1, "unidentified-endpoint": 1})


def test_site_names_through_hosts_file_and_switch_pattern(meta, tmp_path):
    plan, built = meta
    b = built.copy()
    hosts = plan.spec.group("h100").hosts
    site = {h: f"node-{i:05d}.dc1.example" for i, h in enumerate(hosts)}
    for key in list(b.hcas):
        b.hcas[key] = f"{site[key[0]]} {key[1]}"
    for name in b.switches:
        b.switch_desc[name] = f"ib-{name}-qm9700"
    csv = tmp_path / "hosts.csv"
    csv.write_text("hostname,address\n" + "".join(f"{h},{s}\n" for h, s in site.items()))
    names = SiteNames(hosts=load_hosts(csv, hosts), switch_pattern=switch_pattern("ib-{name}-qm9700"))
    r = run(plan, b, names)
    assert r.findings == []
    assert r.summary["matching"]["HCAs by --sites"] == plan.endpoints
    assert r.summary["matching"]["switches by pattern"] == sum(t.count for t in plan.tier_plans)
    # the map may give short names while the wire says the fully qualified one
    short = tmp_path / "short.csv"
    short.write_text("hostname,address,port,user\n"
                     + "".join(f"{h},{s.split('.')[0]},22,root\n" for h, s in site.items()))
    r = run(plan, b, SiteNames(hosts=load_hosts(short, hosts), switch_pattern=names.switch_pattern))
    assert r.findings == [] and r.summary["matching"]["HCAs by --sites"] == plan.endpoints
    # without the map no host is in the plan: every leaf port reaches a stranger, and says so
    bare = run(plan, b, SiteNames(switch_pattern=names.switch_pattern))
    assert kinds(bare) == Counter({"miscabled": plan.endpoints})
    assert bare.summary["unplanned_hosts"] == len(hosts)
    assert "is not in the plan (map it with --sites)" in bare.findings[0].message


def test_ufm_style_switch_names_match_without_a_pattern(meta):
    plan, built = meta
    b = built.copy()
    for name in b.switches:
        b.switch_desc[name] = f"MF0;{name}:MQM9700/U1"
    assert run(plan, b).findings == []


def test_inferred_by_position_when_no_switch_name_matches(meta):
    plan, built = meta
    b = built.copy()
    for name in b.switches:
        b.switch_desc[name] = "Quantum-2 Mellanox Technologies"
    host = plan.spec.group("h100").hosts[4]
    b.swap_far_ends(("H", host, "mlx5_3"), ("H", host, "mlx5_5"))
    r = run(plan, b)
    assert r.summary["inferred"] is True
    assert len(r.summary["inferred_switches"]) == sum(t.count for t in plan.tier_plans)
    assert kinds(r) == Counter({"wrong-rail": 1})


def test_hosts_file_is_read_by_the_inventory_reader_and_may_be_partial(meta, tmp_path):
    """--sites takes the inventory's CSV form; for verify it maps only the hosts the site renamed."""
    from gpucluster.errors import SpecError

    plan, _built = meta
    hosts = plan.spec.group("h100").hosts
    part = tmp_path / "part.csv"
    part.write_text(f"# renamed at the site\nhostname,address\n{hosts[3]},node-a17.dc1\n")
    assert load_hosts(part, hosts) == {"node-a17.dc1": hosts[3]}
    dup = tmp_path / "dup.csv"
    dup.write_text(f"hostname,address\n{hosts[0]},node-a1\n{hosts[1]},node-a1\n")
    with pytest.raises(Exception, match="node-a1' is given to"):
        load_hosts(dup, hosts)
    bad = tmp_path / "bad.csv"
    bad.write_text(f"hostname,address\n{hosts[0]},not_a_name!\n")
    with pytest.raises(SpecError) as exc:
        load_hosts(bad, hosts)
    f = exc.value.findings[0]
    assert (f.file, f.line, f.field) == (str(bad), 2, "address")


def test_a_host_not_in_the_plan_on_a_spare_port(meta):
    """A cable whose far end matches nothing planned (an HCA of a host the plan does not have)."""
    plan, built = meta
    b = built.copy()
    core = plan.tier("core")
    b.hcas[("stranger01", "mlx5_0")] = "stranger01 mlx5_0"
    b.link(("H", "stranger01", "mlx5_0"), ("S", "core00001", core.radix - 1))
    r = run(plan, b)
    assert kinds(r) == Counter({"extra-link": 1})
    assert r.findings[0].message.endswith("is not in the plan; host 'stranger01' is not in the plan (map it with "
                                          "--sites)")


def test_an_uplink_moved_onto_an_unknown_switch(meta):
    """The leaf's port is taken (by a switch the plan does not have), the spine's is empty: the planned
    cable is not seen as planned, beside the unknown switch."""
    plan, built = meta
    b = built.copy()
    leaf_end = ("S", plan.units[2].name + "-r1", plan.tier("leaf").down + 5)
    spine_end = b.unlink(leaf_end)
    b.extra_switches["lab-sw-02"] = 8
    b.link(leaf_end, ("S", "lab-sw-02", 1))
    r = run(plan, b)
    assert kinds(r) == Counter({"unknown-switch": 1, "missing-link": 1})
    miss = next(f for f in r.findings if f.kind == "missing-link")
    assert miss.message == f"{end_label(leaf_end)} - {end_label(spine_end)}: planned cable not seen as planned"
