"""Every node has a U in its rack (docs/plan.md, "Rack elevations"): nodes from `rack_first_u` up, slot 0 lowest,
an NVL72 rack's switch trays between its 8th and 9th compute tray, the fat-tree leaves that stand in a rack and
the management switches at the top; nothing overlaps, nothing leaves the rack. A rack that does not fit is
refused at the group's `nodes_per_rack` line with the rule and a fix that works. The heights the tests name
(8U, 4U, 1U) are the catalog's and the examples' published figures; positions come from the plan."""

from __future__ import annotations

import subprocess
import sys
import time
from itertools import pairwise

import pytest
from conftest import (
    EXAMPLES,
    cluster_example,
    compiled,
    example_data,
    example_text,
    generic_spec,
    line_of,
    loaded_example,
    spec_from_data,
)

from gpucluster.catalog import GPUS
from gpucluster.cli import main
from gpucluster.errors import SpecError
from gpucluster.fabric import PlanError, plan_cluster
from gpucluster.fabric.cabling import endpoint_media
from gpucluster.report.html import elevation
from gpucluster.report.racks import build_racks


def occupied(rack) -> list[tuple[int, int, str]]:
    """(lowest U, highest U, what) of everything the plan puts in a rack, nodes' empty places included."""
    lay = rack.layout
    out = [(*lay.node(s), f"slot {s}") for s in range(rack.capacity)]
    out += [(*lay.leaf(k), f"leaf {leaf}") for k, leaf in enumerate(rack.housed)]
    out += [(*span, what) for span, what in ((lay.trays, "nvlink trays"), (lay.management, "management")) if span]
    return out


@pytest.mark.parametrize("name", EXAMPLES)
def test_nothing_in_a_rack_overlaps_or_leaves_it(name) -> None:
    """In every rack of every example: each U holds at most one thing, all of them between U1 and the top,
    and the nodes rise with their index (slot 0 lowest, from rack_first_u)."""
    for rack in build_racks(loaded_example(name)[1]).racks:
        spans = sorted(occupied(rack))
        assert spans[0][0] >= rack.layout.first_u >= 1 and spans[-1][1] <= rack.height, (rack.name, spans)
        for (_lo, hi, a), (lo2, _hi2, b) in pairwise(spans):
            assert hi < lo2, (rack.name, a, b)
        lows = [rack.node_u(s)[0] for s in range(rack.capacity)]
        assert lows == sorted(lows) and lows[0] == rack.layout.first_u, rack.name


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_node_has_the_u_its_rack_is_drawn_with(name) -> None:
    """The plan's U of a node (Plan.u_of, which the ticket reads) is the U of its row in the HTML elevation,
    for every node of the racks the page draws; and every U of such a rack is drawn exactly once."""
    plan = loaded_example(name)[1]
    for rack in build_racks(plan).sample():
        group = plan.spec.group(rack.group)
        rows = elevation(rack, group.host)
        drawn = {row.text: (row.lo, row.hi) for row in rows if row.kind == "gpu"}
        assert drawn == {group.host(rack.index + s): plan.u_of(group, rack.index + s) for s in range(rack.nodes)}
        units = [u for row in rows for u in range(row.lo, row.hi + 1)]
        assert sorted(units) == list(range(1, rack.height + 1)), rack.name


@pytest.mark.parametrize(("name", "host", "u"), [
    ("staging", "gpu03", (1, 8)),  # DGX H100: 8U, from U1 of its rack
    ("staging", "gpu04", (9, 16)),
    ("colossus-200k", "h100-00001", (5, 8)),  # 4U liquid-cooled servers above the 4U CDU
    ("colossus-200k", "h200-00016", (33, 36)),  # the 8th of its rack, the top one
    ("gb200-superpod", "gb0008", (8, 8)),  # 1U trays: 8 under the switch trays ...
    ("gb200-superpod", "gb0009", (18, 18)),  # ... 9 switch trays at U9-17, the other 10 above
    ("gb200-superpod", "gb0036", (27, 27)),
    ("frontier-mi250x-roce", "frontier00017", (1, 2)),  # the second rack's first 2U node
])
def test_published_heights_place_the_nodes(name, host, u) -> None:
    cluster = cluster_example(name)
    group = cluster.group_of_host[host]
    assert cluster.plan.u_of(group, group.hosts.index(host)) == u


@pytest.mark.parametrize("name", EXAMPLES)
def test_leaves_stand_in_the_racks_exactly_when_the_cabling_is_dac(name) -> None:
    """A fabric group's racks hold leaves when the cabling map cables node-leaf with DAC, and then each leaf
    stands in exactly one rack: the one holding its unit's first node."""
    plan = loaded_example(name)[1]
    racks = [r for r in build_racks(plan).racks if r.leaves]
    housed = [leaf for r in racks for leaf in r.housed]
    if endpoint_media(plan) != "DAC":
        assert housed == [] and all(r.layout.leaf_u == 0 for r in racks)
        return
    assert sorted(housed) == sorted(u.name for u in plan.units)
    for r in racks:
        for leaf in r.housed:
            unit = next(u for u in plan.units if u.name == leaf)
            assert r.index <= unit.first < r.index + r.nodes, (r.name, leaf)


def test_a_leaf_of_a_unit_that_straddles_two_racks_stands_in_the_first() -> None:
    """Racks of 3 nodes over units of 2: rack 1 holds the leaves of units 1 and 2 (nodes 1-2 and 3-4 start
    in it), rack 2 the leaf of unit 3; each leaf one U lower than the one before it in the rack."""
    data = generic_spec(6, unit=2)
    data["node_groups"][1]["nodes_per_rack"] = 3
    plan = compiled(spec_from_data(data)).plan
    racks = [r for r in build_racks(plan).racks if r.group == "g0"]
    assert [r.housed for r in racks] == [("leaf00001", "leaf00002"), ("leaf00003",)]
    lay = racks[0].layout
    assert [lay.leaf(k) for k in range(2)] == [(47, 47), (46, 46)] and lay.management == (48, 48)


def test_heights_come_from_the_group_then_the_gpu_then_the_cpu_default() -> None:
    data = generic_spec(8)
    data["node_groups"][1]["nodes_per_rack"] = 4
    plan = compiled(spec_from_data(data)).plan
    assert plan.layouts["g0"].node_u == GPUS["h100-sxm5-80g"].rack_units == 8
    assert plan.layouts["ctl"].node_u == 2  # no GPU: a two-socket 2U server
    data["node_groups"][1]["node_rack_units"] = 4
    data["node_groups"][1]["rack_first_u"] = 3
    data["racks"] = {"height_u": 42, "management_u": 2}
    plan = compiled(spec_from_data(data)).plan
    g0 = plan.spec.group("g0")
    assert [plan.u_of(g0, i) for i in range(5)] == [(3, 6), (7, 10), (11, 14), (15, 18), (3, 6)]
    assert plan.layouts["g0"].management == (41, 42)


def test_a_catalog_gpu_without_a_height_is_8u() -> None:
    data = generic_spec(4)
    data["catalog"]["gpus"] = {"gen-gpu": {"vendor": "nvidia", "name": "generic", "memory_gb": 80,
                                           "slurm_type": "gen", "allowed_per_node": [8]}}
    data["node_groups"][1]["gpu"] = "gen-gpu"
    assert spec_from_data(data).parts.gpus["gen-gpu"].rack_units == 8


# ---- the refusal ---------------------------------------------------------------------------------------------

def without_server_height(name: str) -> str:
    """The Colossus example as if its racks held 8U servers: the lines that set 4U and the CDU removed."""
    lines = example_text(name).splitlines(keepends=True)
    return "".join(line for line in lines if not line.lstrip().startswith(("node_rack_units:", "rack_first_u:")))


def test_a_rack_too_full_is_refused_at_its_line_with_every_group(tmp_path, capsys) -> None:
    text = without_server_height("colossus-200k")
    spec = tmp_path / "colossus.yaml"
    spec.write_text(text)
    assert main(["check", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    at = [i for i, line in enumerate(text.splitlines(), 1) if line == "    nodes_per_rack: 8"]
    assert len(at) == 2  # h100 and h200: both reported, in one run
    for group, line in zip(("h100", "h200"), at, strict=True):
        assert (f"{spec}:{line}: node_groups[{1 if group == 'h100' else 2}].nodes_per_rack: a rack of group "
                f"'{group}' needs 65U (8 nodes of 8U, 1U of management switches) but racks are 48U") in err
    assert err.count("[rack-space]") == 2 and "set nodes_per_rack: 5 or fewer" in err
    assert main(["plan", str(spec)]) == 2 and "[rack-space]" in capsys.readouterr().err


def test_the_refusal_from_the_shell_has_no_traceback(tmp_path) -> None:
    spec = tmp_path / "colossus.yaml"
    spec.write_text(without_server_height("colossus-100k"))
    run = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(spec)], capture_output=True,
                         text=True, timeout=120)
    line = line_of(spec.read_text(), "    nodes_per_rack: 8")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"{spec}:{line}: node_groups[1].nodes_per_rack:" in run.stderr and "[rack-space]" in run.stderr


@pytest.mark.parametrize("per_rack", [5, 6])
def test_the_fix_it_names_is_the_most_that_fits(per_rack) -> None:
    """'nodes_per_rack: 5 or fewer' for 8U servers in 48U with a management switch: 5 plans, 6 does not."""
    data = example_data("colossus-100k")
    h100 = data["node_groups"][1]
    del h100["node_rack_units"], h100["rack_first_u"]
    h100["nodes_per_rack"] = per_rack
    spec = spec_from_data(data)
    if per_rack == 5:
        assert plan_cluster(spec).layouts["h100"].needs(5) == 41
    else:
        with pytest.raises(PlanError, match=r"needs 49U .*nodes_per_rack: 5 or fewer"):
            plan_cluster(spec)


def test_an_nvlink_rack_is_never_told_to_hold_fewer_trays() -> None:
    """An NVL72 rack holds its 18 trays whatever the height (rule nvlink-domain): the fix is the height."""
    data = example_data("gb200-superpod")
    data["racks"] = {"height_u": 27}
    with pytest.raises(SpecError) as caught:
        compiled(spec_from_data(data))
    [finding] = [f for f in caught.value.findings if f.rule == "rack-space"]
    assert "needs 28U (18 nodes of 1U, 9 NVLink switch trays of 1U, 1U of management switches)" in finding.message
    assert "nodes_per_rack" not in finding.fix and "racks.height_u: 28" in finding.fix


# ---- speed --------------------------------------------------------------------------------------------------

def test_a_25000_node_spec_plans_its_racks_quickly() -> None:
    """Colossus 200k: 25,000 GPU nodes in 3,126 racks. The layout is a handful of numbers a group, so the plan
    with every rack's U stays well under the 2 s the plan page is held to (docs/plan.md, Speed)."""
    loaded, _plan = loaded_example("colossus-200k")
    assert sum(g.count for g in loaded.spec.gpu_groups) == 25_000
    start = time.perf_counter()
    plan = plan_cluster(loaded.spec)
    racks = build_racks(plan)
    took = time.perf_counter() - start
    assert len(racks) == plan.rack_count == 4_168 and took < 2.0, took
    group = loaded.spec.group("h200")
    rack = next(r for r in reversed(racks.racks) if r.group == "h200")
    # 6,250 h200 nodes leave 2 in their last rack: the second is the rack's slot 1, above the CDU and slot 0
    assert plan.u_of(group, group.count - 1) == rack.node_u(rack.nodes - 1) == (9, 12)
