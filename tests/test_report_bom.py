"""The procurement BOM: its totals are the plan's, bom.csv agrees with it, and Colossus 100k no longer
buys spine-core cables and optics that no leaf can use."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, loaded_example
from test_plan import check_bisection, check_cabling, full_pod_spine_core_links

from gpucluster.fabric.cabling import bom_rows
from gpucluster.fabric.summary import plan_summary
from gpucluster.report.bom import build_bom


@pytest.mark.parametrize("name", EXAMPLES)
def test_bom_totals_are_the_plans(name):
    plan = loaded_example(name)[1]
    summary = plan_summary(plan)
    bom = build_bom(plan)
    assert {s.tier: s.quantity for s in bom.switches} == summary["switches"]
    assert {c.link: c.cables for c in bom.links} == summary["links"]
    assert bom.switch_total == sum(summary["switches"].values())
    assert bom.cable_total == sum(summary["links"].values())
    # optics at both ends of every switch-to-switch fibre; copper and AOC carry their own
    assert bom.transceiver_total == 2 * sum(n for k, n in summary["links"].items() if k != "node-leaf")
    by_class = {c.link: c for c in bom.links}
    media = next(r[2] for r in bom_rows(plan) if r[:2] == ["cable", "node-leaf"])
    assert ("DAC" in by_class["node-leaf"].cable) == (media == "DAC")
    assert by_class["node-leaf"].distance == ("in-rack" if media == "DAC" else "in-row")


@pytest.mark.parametrize("name", EXAMPLES)
def test_bom_csv_says_the_same(name):
    plan = loaded_example(name)[1]
    bom = build_bom(plan)
    csv = {(r[0], r[1]): r[4] for r in bom_rows(plan)[1:]}
    assert {s.tier: s.quantity for s in bom.switches} == {k[1]: v for k, v in csv.items() if k[0] == "switch"}
    assert {c.link: c.cables for c in bom.links} == {k[1]: v for k, v in csv.items() if k[0] == "cable"}
    assert bom.transceiver_total == csv[("transceiver", "switch-switch")]
    assert dict(((c, i), q) for c, i, _d, q in bom.other if c != "node") == {
        k: v for k, v in csv.items() if k[0] in ("gpu", "nic")} | {("rack", "node racks"): csv[("rack", "nodes")]}


def test_colossus_100k_buys_spine_core_links_only_for_what_the_leaves_can_use():
    """Before: every pod had 64 spines x 64 uplinks, 102,400 spine-core links for 100,352 leaf uplinks of
    full SUs, 2,048 cables and 4,096 optics carrying nothing. Now pod 25's 32 spines send up what their
    leaves send down, rounded only to an even spread over their cores; bisection and cabling still hold."""
    plan = loaded_example("colossus-100k")[1]
    c = check_cabling(plan)
    check_bisection(plan)
    bom = {link.link: link for link in build_bom(plan).links}
    before = full_pod_spine_core_links(plan)
    assert before == 102_400
    spine_core = bom["spine-core"]
    assert spine_core.cables == sum(c.up_ports[s] for s in c.devices["spine"]) == 100_352
    assert before - spine_core.cables == 2_048 and spine_core.transceivers == 2 * 100_352
    # what the leaves can use: every spine's uplinks cover its downlinks (1:1), and exceed them only by
    # the rounding that spreads them evenly over the cores it reaches
    for s in c.devices["spine"]:
        assert c.down_ports[s] <= c.up_ports[s] < c.down_ports[s] + len(c.up[s])
    assert plan.bisection_tbps == plan.endpoints * plan.speed_gbps / 2 / 1000
