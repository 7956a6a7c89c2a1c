"""The pictures' order and names, read back from what was drawn: every row of the fabric diagram keeps the
view's left-to-right order (pods by number, a pod's units as the plan lists them: pod 37's came out of
order when dot was free to reorder a row), the summary diagram adds up to the plan, and every node slot of
a rack elevation carries that node's hostname."""

from __future__ import annotations

import re
import shutil

import pytest
from conftest import ROOT, cluster_example
from test_report_svg import read_svg

from gpucluster.report.diagram import fabric_svg, summary_svg
from gpucluster.report.html import plan_html
from gpucluster.report.view import TIERS, build_view

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="not run: Graphviz's dot is not installed")


@pytest.mark.parametrize("name, pod", [("colossus-200k", None), ("colossus-200k", 37), ("meta-24k-roce", None),
                                       ("meta-24k-ib", 2), ("gb200-superpod", None)])
def test_every_row_keeps_the_views_order(name, pod):
    plan = cluster_example(name).plan
    view = build_view(plan, pod)
    drawn = read_svg(fabric_svg(plan, pod))
    x = {n.id.removeprefix("box-"): (n.box[0] + n.box[2]) / 2 for n in drawn.nodes}
    for tier in TIERS:
        order = [b.id for b in view.tier(tier)]
        assert sorted(order, key=x.__getitem__) == order, (tier, order)


@pytest.mark.parametrize("name", ["colossus-200k", "meta-24k-roce", "staging"])
def test_the_summary_diagram_adds_up_to_the_plan(name):
    plan = cluster_example(name).plan
    drawn = read_svg(summary_svg(plan))
    titles = {n.title: " ".join(n.texts) for n in drawn.nodes}
    for t in plan.tier_plans:
        assert f"{t.tier} × {t.count:,}" in titles[t.tier], titles
    assert f"{plan.nodes:,} node" in titles["nodes"]
    labels = " ".join(" ".join(e.texts) for e in drawn.edges)
    for n in plan.links.values():
        assert f"{n:,} links" in labels
    assert len(drawn.edges) == plan.tiers


@pytest.mark.parametrize("name", ["meta-24k-ib", "colossus-200k", "frontier-mi250x-roce"])
def test_rack_slots_name_their_hosts(name):
    cluster = cluster_example(name)
    page = plan_html(cluster)
    hosts = {h for g in cluster.spec.node_groups for h in g.hosts}
    slots = re.findall(r'<div class="slot gpu">([^<]*)</div>', page)
    assert len(slots) > 4
    assert all(s in hosts for s in slots), [s for s in slots if s not in hosts][:5]
    for rack in re.findall(r'<div class="rack" data-rack=.*?\n    </div>', page, re.S):
        names = re.findall(r'<div class="slot gpu">([^<]*)</div>', rack)
        assert len(names) == len(set(names)), names


def test_the_readme_shows_the_summary_diagram():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/fabric-colossus-200k-summary.svg)" in readme
