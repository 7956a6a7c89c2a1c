"""RoCE: `lldpctl -f json` output into the graph, and verify against the plan. Hand-written files in
lldpd's shapes (tests/fixtures/asbuilt/lldp/: one interface, several, json0, a chassis without a name),
and per-device files generated from a plan with faults injected: each found, and only it."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from gpucluster.cluster import cluster_of, load_cluster
from gpucluster.errors import UsageError
from gpucluster.fabric.asbuilt import lldp
from gpucluster.fabric.asbuilt.graph import HCA, PORT_SPAN, SWITCH
from gpucluster.fabric.asbuilt.verify import verify
from gpucluster.spec.loader import validate_data

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "asbuilt" / "lldp"
sys.path.insert(0, str(ROOT / "tests"))
from conftest import generic_spec  # noqa: E402
from fixtures.asbuilt.fabricgen import build, write_lldp_dir  # noqa: E402


def links(fab) -> set:
    return {tuple(sorted([(fab.label(a), pa), (fab.label(b), pb)])) for a, pa, b, pb, _ in fab.links()}


def test_hand_written_lldpctl_files():
    fab = lldp.read(FIXTURES, lldp.default_is_host({"gpu001", "gpu002"}))
    assert fab.findings == []
    assert links(fab) == {
        (("gpu001 ens1np0", 1), ("leaf01", 1)),
        (("gpu002 ens1np0", 1), ("leaf01", 2)),
        (("leaf01", 33), ("spine01", 1)),
    }
    kinds = {fab.label(i): n.kind for i, n in enumerate(fab.nodes)}
    assert kinds == {"gpu001 ens1np0": HCA, "gpu002 ens1np0": HCA, "leaf01": SWITCH, "spine01": SWITCH}
    leaf = next(i for i, n in enumerate(fab.nodes) if n.desc == "leaf01")
    assert fab.rate(leaf, 1) == "400G"  # the MAU type lldpd printed


@pytest.mark.parametrize("doc, want", [
    ({"lldp": {}}, []),
    ({"lldp": {"interface": {"eth0": {"chassis": {"sw1": {"id": {"type": "mac", "value": "aa"}}},
                                      "port": {"id": {"type": "ifname", "value": "swp3"}}}}}},
     [("eth0", "sw1", "swp3")]),
    # a neighbour that sends no system name: the chassis ID stands in
    ({"lldp": {"interface": {"eth0": {"chassis": {"id": {"type": "mac", "value": "aa:bb"}},
                                      "port": {"id": {"type": "mac", "value": "cc"}, "descr": "eth7"}}}}},
     [("eth0", "aa:bb", "eth7")]),
    # two neighbours on one interface: the same name twice
    ({"lldp": {"interface": [{"eth0": {"chassis": {"a": {}}, "port": {"id": {"type": "ifname", "value": "p1"}}}},
                             {"eth0": {"chassis": {"b": {}}, "port": {"id": {"type": "ifname", "value": "p2"}}}}]}},
     [("eth0", "a", "p1"), ("eth0", "b", "p2")]),
])
def test_lldpd_json_variants(doc, want):
    got = [(ifname, lldp.chassis_name(e)[0], lldp.port_name(e)) for ifname, e in lldp.interfaces(doc)]
    assert got == want


def test_json0_and_json_read_the_same():
    plain = json.loads((FIXTURES / "gpu001.json").read_text())
    zero = json.loads((FIXTURES / "gpu002.json").read_text())
    (_, e1), = lldp.interfaces(plain)
    (_, e2), = lldp.interfaces(zero)
    assert lldp.chassis_name(e1) == lldp.chassis_name(e2) == ("leaf01", True)
    assert (lldp.port_name(e1), lldp.port_name(e2)) == ("swp1", "swp2")


def test_merged_file_equals_the_folder(tmp_path):
    merged = {p.stem: json.loads(p.read_text()) for p in FIXTURES.glob("*.json")}
    (tmp_path / "all.json").write_text(json.dumps(merged))
    is_host = lldp.default_is_host({"gpu001", "gpu002"})
    assert links(lldp.read(tmp_path / "all.json", is_host)) == links(lldp.read(FIXTURES, is_host))


@pytest.mark.parametrize("text, where", [("{", ":1:2:"), ('{"nodes": []}', "not `lldpctl -f json`"),
                                         ("[]", "expected `lldpctl -f json`")])
def test_bad_lldp_input_is_refused_with_a_location(tmp_path, text, where):
    (tmp_path / "leaf09.json").write_text(text)
    with pytest.raises(UsageError, match=None) as err:
        lldp.read(tmp_path / "leaf09.json", lldp.default_is_host(set()))
    assert str(tmp_path / "leaf09.json") in str(err.value) and where in str(err.value)


def test_empty_folder_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"no <device>\.json files"):
        lldp.read(tmp_path, lldp.default_is_host(set()))


# ---- verify on generated RoCE fabrics --------------------------------------------------------------

def small_roce_rail_plan():
    """A rail-optimised RoCE fabric small enough to write one file per device quickly."""
    data = generic_spec(64, radix=32, rails=4, design="rail-optimized", unit=16)
    data["fabric"]["type"] = "roce"
    return cluster_of(validate_data(data, {}, Path("small-roce.yaml"))).plan


@pytest.fixture(scope="module")
def rail():
    plan = small_roce_rail_plan()
    return plan, build(plan)


@pytest.fixture(scope="module")
def meta_roce():
    plan = load_cluster(ROOT / "examples" / "meta-24k-roce.yaml").plan
    return plan, build(plan)


def run(plan, built, folder, **kw):
    write_lldp_dir(built, folder, **kw)
    hosts = {h for g in plan.spec.fabric_groups for h in g.hosts}
    return verify(plan, lldp.read(folder, lldp.default_is_host(hosts)))


def kinds(r) -> Counter:
    return Counter(f.kind for f in r.findings)


def test_meta_24k_roce_fault_free(meta_roce, tmp_path):
    plan, built = meta_roce
    r = run(plan, built, tmp_path)
    assert r.findings == []
    assert r.summary["matched_links"] == sum(plan.links.values())
    # the hosts' netdevs are no HCA names: their rails come from where they plug in
    hcas = plan.hcas(plan.spec.group("h100"))
    assert r.summary["inferred_nic_names"] == {f"ens{i + 1}np0": h for i, h in enumerate(hcas)}


def test_meta_24k_roce_swapped_host_cables(meta_roce, tmp_path):
    plan, built = meta_roce
    b = built.copy()
    host = plan.spec.group("h100").hosts[4]
    b.swap_far_ends(("H", host, "mlx5_3"), ("H", host, "mlx5_5"))
    r = run(plan, b, tmp_path)
    assert kinds(r) == Counter({"miscabled": 1})  # a fat tree has no rails: a plain swap
    assert r.findings[0].detail["swap"] == [f"{host} mlx5_3", f"{host} mlx5_5"]


# fault -> (expected {kind: count} from the plan, injection)
FAULTS = {
    "rail swap": (lambda p: {"wrong-rail": 1}, lambda p, b: b.swap_far_ends(("H", host(p, 1), p.hcas(grp(p))[0]),
                                                                    ("H", host(p, 1), p.hcas(grp(p))[2]))),
    "swapped uplinks": (lambda p: {"miscabled": 1}, lambda p, b: b.swap_far_ends(("S", f"{p.units[0].name}-r0", 17),
                                                                         ("S", f"{p.units[1].name}-r0", 17))),
    "missing cable": (lambda p: {"missing-link": 1}, lambda p, b: b.unlink(("H", host(p, 2), p.hcas(grp(p))[1]))),
    "down-rated link": (lambda p: {"wrong-speed": 1},
                        lambda p, b: b.downrate(("H", host(p, 3), p.hcas(grp(p))[3]), "4xHDR")),
    "unnamed host": (lambda p: {"unidentified-endpoint": p.rails}, lambda p, b: unname(p, b, host(p, 5))),
}


def unname(plan, b, name):
    """A host that never got its hostname: LLDP (its own and its switches') calls it localhost."""
    for key in [k for k in b.hcas if k[0] == name]:
        b.hcas[key] = f"localhost {key[1]}"


def host(plan, i):
    return grp(plan).hosts[i]


def grp(plan):
    return plan.spec.fabric_groups[0]


@pytest.mark.parametrize("fault", FAULTS)
def test_rail_roce_fault_found_and_only_it(rail, tmp_path, fault):
    plan, built = rail
    want, inject = FAULTS[fault]
    b = built.copy()
    inject(plan, b)
    r = run(plan, b, tmp_path)
    assert kinds(r) == Counter(want(plan)), [f.render() for f in r.findings]


def test_rail_roce_fault_free(rail, tmp_path):
    plan, built = rail
    assert run(plan, built, tmp_path).findings == []


def test_switch_files_alone_still_see_every_cable(rail, tmp_path):
    """Hosts' files missing: the switches' own LLDP tables see the host cables from their side."""
    plan, built = rail
    r = run(plan, built, tmp_path, hosts=False)
    assert r.findings == [] and r.summary["matched_links"] == sum(plan.links.values())


def test_ports_resolve_to_numbers(rail, tmp_path):
    plan, built = rail
    write_lldp_dir(built, tmp_path, port_name=lambda p: f"Ethernet1/{p}")
    fab = lldp.read(tmp_path, lldp.default_is_host({h for g in plan.spec.fabric_groups for h in g.hosts}))
    leaf = next(i for i, n in enumerate(fab.nodes) if n.desc == f"{plan.units[0].name}-r0")
    used = plan.tier("leaf").down + plan.tier("leaf").up
    assert sorted(p for p, _ in fab.nodes[leaf].ports()) == list(range(1, used + 1))
    assert all(code // PORT_SPAN != leaf for _, code in fab.nodes[leaf].ports())
