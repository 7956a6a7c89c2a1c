"""The HTML plan without a browser: self-contained, escaped, and built from the plan's own figures."""

from __future__ import annotations

import re
import shutil

import hostlist
import pytest
from conftest import EXAMPLES, example_path, generic_spec, spec_from_data

from gpucluster.cluster import cluster_of, load_cluster
from gpucluster.fabric.summary import plan_summary
from gpucluster.report.html import plan_html
from gpucluster.report.racks import build_racks
from gpucluster.spec.model import LoadedSpec

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed "
                                "(scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def staging():
    cluster = load_cluster(example_path("staging"))
    return cluster, plan_html(cluster)


def test_the_page_fetches_nothing(staging):
    """No script, stylesheet, font, image or frame from anywhere: the page is read offline, as a file."""
    _cluster, page = staging
    assert not re.search(r"<(script|link|iframe|img|object|embed)\b", page, re.I)
    assert not re.search(r"\b(src|href)\s*=", page, re.I)
    assert not re.search(r"url\(|@import", page, re.I)
    # the only URIs are the SVG's XML namespaces, which a browser never fetches
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg",
                                                               "http://www.w3.org/1999/xlink"}


def test_the_page_holds_every_section(staging):
    cluster, page = staging
    summary = plan_summary(cluster.plan)
    for heading in ("Tiers", "Why these counts", "Warnings", "Fabric", "Bill of materials", "Racks", "Storage"):
        assert f"<h2>{heading}</h2>" in page
    assert f'id="rack-count" data-value="{summary["racks"]}"' in page
    assert page.count("<svg") == 2 and "<?xml" not in page and "<!DOCTYPE svg" not in page  # summary and full
    for e in summary["explanations"]:
        assert e["fix"] in page


def test_text_from_the_spec_is_escaped():
    """A user catalog is free text: a switch description with markup must reach the page as text."""
    data = generic_spec(16)
    data["catalog"]["switches"]["gen-leaf"]["name"] = '<script>alert("x")</script> & co'
    cluster = cluster_of(LoadedSpec(spec=spec_from_data(data), source="gen.yaml", lines={}))
    page = plan_html(cluster)
    assert "<script" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; co" in page


def straddling(design: str) -> LoadedSpec:
    """Racks of 3 nodes over units of 4: racks that straddle two units."""
    data = generic_spec(22, rails=2, design=design, unit=4)
    data["node_groups"][1]["nodes_per_rack"] = 3
    return LoadedSpec(spec=spec_from_data(data), source="gen.yaml", lines={})


@pytest.mark.parametrize("name", [*EXAMPLES, "straddling fat-tree", "straddling rail-optimized"])
def test_every_rack_lands_on_the_leaves_of_its_nodes(name):
    """Rack by rack, the leaves listed are those the plan puts its nodes' NICs on (read host by host)."""
    if name.startswith("straddling"):
        cluster = cluster_of(straddling(name.split()[1]))
    else:
        cluster = load_cluster(example_path(name))
    plan = cluster.plan
    racks = build_racks(plan)
    assert len(racks) == plan.rack_count
    by_name = {r.name: r for r in racks.racks}
    units_of: dict[str, set[str]] = {r.name: set() for r in racks.racks}
    for g in plan.spec.node_groups:
        for i in range(g.count):
            rack = by_name[plan.rack_of(g, i)]
            assert rack.first <= g.host(i) <= rack.last
            unit = plan.unit_of_host.get(g.host(i))
            if unit is None:
                assert rack.leaves == ()
                continue
            units_of[rack.name].add(unit.name)
            rails = len(unit.leaves)
            expected = [f"{unit.name}-r{r}" for r in range(rails)] if plan.design == "rail-optimized" else [unit.name]
            assert set(expected) <= set(rack.leaves)
    for rack in racks.racks:  # and nothing more: no leaf that the rack's nodes do not use
        assert {leaf.split("-r")[0] for leaf in rack.leaves} == units_of[rack.name]
        assert hostlist.expand_hostlist(rack.leaf_list) == list(rack.leaves)  # as the page lists them
