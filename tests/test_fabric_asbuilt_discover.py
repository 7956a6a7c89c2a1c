"""discover without a spec: what a dump says about itself (tiers from where the hosts are, bundles,
anomalies), on the hand-written HDR dump and on a dump generated from meta-24k-ib's plan."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.fabric.asbuilt import ibnetdiscover
from gpucluster.fabric.asbuilt.discover import discover

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "asbuilt"
sys.path.insert(0, str(ROOT / "tests"))
from fixtures.asbuilt.fabricgen import build  # noqa: E402

CONTRACT = ("switches", "tiers", "hosts", "host_ports", "unidentified", "bundles", "degraded_bundles", "findings")


@pytest.fixture(scope="module")
def hdr():
    return discover(ibnetdiscover.read(FIXTURES / "hdr-two-tier.ibnet"))


def test_contract_keys(hdr):
    assert set(CONTRACT) <= set(hdr)


def test_hand_written_dump_summary(hdr):
    assert hdr["switches"] == 4
    assert hdr["tiers"] == {"leaf": 3, "spine": 1}  # the spine's aggregation node does not make it a leaf
    assert hdr["hosts"] == 4  # node001..node004; the nameless HCA and "localhost" are not hosts
    assert hdr["host_ports"] == 6  # every HCA port on a leaf; the aggregation node is not one
    assert hdr["aggregation_nodes"] == 1
    assert sorted(u["description"] for u in hdr["unidentified"]) == ["", "localhost mlx5_0"]
    assert {(u["switch"], u["switch_port"]) for u in hdr["unidentified"]} == {
        ("MF0;leaf01:MQM8700/U1", 3), ("MF0;leaf02:MQM8700/U1", 2)}
    assert sorted((b["a"], b["b"], b["links"]) for b in hdr["bundles"]) == [
        ("MF0;leaf01:MQM8700/U1", "MF0;spine01:MQM8700/U1", 2),
        ("MF0;leaf02:MQM8700/U1", "MF0;spine01:MQM8700/U1", 1),
        ("MF0;leaf03:MQM8700/U1", "MF0;spine01:MQM8700/U1", 2)]
    assert [(d["a"], d["links"], d["usual"]) for d in hdr["degraded_bundles"]] == [("MF0;leaf02:MQM8700/U1", 1, 2)]


def test_hand_written_dump_findings(hdr):
    kinds = sorted(f["kind"] for f in hdr["findings"])
    assert kinds == ["degraded-bundle", "unidentified-endpoint", "unidentified-endpoint", "wrong-speed"]
    slow = next(f for f in hdr["findings"] if f["kind"] == "wrong-speed")
    assert slow["detail"]["rate"] == "4xEDR" and slow["detail"]["usual"] == "4xHDR"
    assert "node003 mlx5_0" in slow["message"]


def test_router_and_chassis_dump():
    doc = discover(ibnetdiscover.read(FIXTURES / "grouped-full.ibnet"))
    assert doc["routers"] == 1 and doc["hosts"] == 1 and doc["switches"] == 2
    assert doc["tiers"] == {"leaf": 1, "spine": 1}
    assert doc["findings"] == []


@pytest.fixture(scope="module")
def meta():
    plan = load_cluster(ROOT / "examples" / "meta-24k-ib.yaml").plan
    return plan, build(plan)


def test_generated_meta_24k_ib_matches_its_plan(meta):
    plan, built = meta
    doc = discover(ibnetdiscover.parse(built.ibnetdiscover(), "gen"))
    assert doc["tiers"] == {t.tier: t.count for t in plan.tier_plans}
    assert doc["switches"] == sum(t.count for t in plan.tier_plans)
    assert doc["hosts"] == sum(g.count for g in plan.spec.fabric_groups)
    assert doc["host_ports"] == plan.endpoints
    assert doc["unidentified"] == [] and doc["degraded_bundles"] == [] and doc["findings"] == []
    per_tiers = {}
    for b in doc["bundles"]:
        per_tiers[b["tiers"]] = per_tiers.get(b["tiers"], 0) + b["links"]
    assert per_tiers == {k: v for k, v in plan.links.items() if k != "node-leaf"}
    assert {b["links"] for b in doc["bundles"] if b["tiers"] == "spine-core"} == {plan.tier("core").links_per_peer}


def test_generated_dump_with_a_halved_bundle_and_an_unnamed_hca(meta):
    plan, built = meta
    b = built.copy()
    bundle = b.bundle("spine00001", b.peer(("S", "spine00001", plan.tier("spine").down + 1))[1])
    b.unlink(bundle[0])
    host = plan.spec.group("h100").hosts[0]
    b.hcas[(host, "mlx5_0")] = "MT4129 ConnectX7   Mellanox Technologies"
    doc = discover(ibnetdiscover.parse(b.ibnetdiscover(), "gen"))
    assert len(doc["degraded_bundles"]) == 1
    assert doc["degraded_bundles"][0]["usual"] == plan.tier("core").links_per_peer
    assert [u["switch"] for u in doc["unidentified"]] == [f"{plan.units[0].name}-r0"]
    assert doc["hosts"] == sum(g.count for g in plan.spec.fabric_groups)  # the host still has 7 named HCAs
