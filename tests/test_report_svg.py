"""The fabric diagram, read back from the SVG Graphviz wrote: what it holds must add up to the plan.

Every figure expected here comes from the plan (switch and link counts, pods, units, nodes); the golden
file per example (tests/golden/diagram/<example>.json) pins the folded structure, its box titles and
bundle labels, and is regenerated with GPUCLUSTER_UPDATE_GOLDEN=1. Geometry is checked from the SVG's own
coordinates: no two boxes overlap, pods hold their boxes, tiers are rows.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import pytest
from conftest import GOLDEN_DIR, example_path, loaded_example

from gpucluster.report.diagram import fabric_svg, inline_svg, to_dot
from gpucluster.report.view import build_view

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed "
                                "(scripts/setup.sh installs it)")

NS = {"s": "http://www.w3.org/2000/svg"}
DIAGRAMS = ["staging", "meta-24k-roce", "colossus-200k"]
NUMBER = r"\d[\d,]*"
GAP = 3  # points between a bundle label and anything beside it


@dataclass
class Shape:
    id: str
    title: str  # Graphviz's <title>: a box's name, or "lower->upper" for a bundle
    classes: set[str]
    texts: list[str]
    box: tuple[float, float, float, float]  # x0, y0, x1, y1


@dataclass
class Diagram:
    title: str
    nodes: list[Shape] = field(default_factory=list)
    clusters: list[Shape] = field(default_factory=list)
    edges: list[Shape] = field(default_factory=list)

    def tier(self, name: str) -> list[Shape]:
        return [n for n in self.nodes if f"tier-{name}" in n.classes]

    def box(self, name: str) -> Shape:
        return next(n for n in self.nodes if n.title == name)

    def pod_of(self, box: Shape) -> Shape | None:
        return next((c for c in self.clusters if inside(box.box, c.box)), None)

    def connected(self, lower: Shape, upper: Shape) -> bool:
        return any(e.title == f"{lower.title}->{upper.title}" for e in self.edges)


def _coords(el: ET.Element) -> list[tuple[float, float]]:
    out = []
    for shape in el.iter():
        tag = shape.tag.split("}")[-1]
        if tag == "polygon":
            nums = [float(v) for v in re.findall(r"-?[\d.]+", shape.get("points", ""))]
        elif tag == "path":
            nums = [float(v) for v in re.findall(r"-?[\d.]+", shape.get("d", ""))]
        else:
            continue
        out += list(zip(nums[0::2], nums[1::2], strict=True))
    return out


def _shape(g: ET.Element, outline_only: bool) -> Shape:
    first = [c for c in g if c.tag.split("}")[-1] in ("path", "polygon")][:1] if outline_only else [g]
    pts = [p for el in first for p in _coords(el)]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    texts = [t.text or "" for t in g.iter(f"{{{NS['s']}}}text")]
    return Shape(g.get("id", ""), g.find("s:title", NS).text, set(g.get("class", "").split()), texts,
                 (min(xs), min(ys), max(xs), max(ys)))


def read_svg(svg: str) -> Diagram:
    root = ET.fromstring(inline_svg(svg))
    graph = root.find("s:g", NS)
    d = Diagram(graph.find("s:text", NS).text)
    for g in graph.findall("s:g", NS):
        cls = g.get("class", "").split()
        if "node" in cls:
            d.nodes.append(_shape(g, outline_only=True))
        elif "cluster" in cls:
            d.clusters.append(_shape(g, outline_only=True))
        elif "edge" in cls:
            d.edges.append(_shape(g, outline_only=False))
    return d


def overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(a: tuple, b: tuple) -> bool:
    return b[0] <= a[0] and b[1] <= a[1] and a[2] <= b[2] and a[3] <= b[3]


def times(label: str) -> int:
    """'× 36 pods (1-36)' -> 36, 'pod 37' -> 1."""
    m = re.match(r"× (\d+) pods", label)
    return int(m[1]) if m else 1


def count_in(title: str) -> int:
    m = re.search(r"× (\d[\d,]*)", title)
    return int(m[1].replace(",", "")) if m else 1


def num(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
def diagrams() -> dict:
    return {name: (loaded_example(name)[1], read_svg(fabric_svg(loaded_example(name)[1]))) for name in DIAGRAMS}


# ---- what the boxes add up to -----------------------------------------------------------------------

@pytest.mark.parametrize("name", DIAGRAMS)
def test_boxes_add_up_to_the_plan(diagrams, name):
    """Core and spine titles carry the switch counts; pods, units and nodes, multiplied out, are the plan's."""
    plan, d = diagrams[name]
    mult = {n.id: times(d.pod_of(n).texts[0]) if d.pod_of(n) else 1 for n in d.nodes}
    if plan.tiers == 3:
        assert [n.texts[0] for n in d.tier("core")] == [f"core × {plan.switches['core']:,}"]
        assert sum(times(c.texts[0]) for c in d.clusters) == plan.pods
    else:
        assert d.clusters == [] and d.tier("core") == []
    spines = sum(mult[n.id] * count_in(n.texts[0]) * plan.rail_groups for n in d.tier("spine"))
    assert spines == plan.switches["spine"]
    units = sum(mult[n.id] * count_in(n.texts[0]) for n in d.tier("leaf"))
    assert units == len(plan.units)
    assert units * max(1, plan.rails if plan.design == "rail-optimized" else 1) == plan.switches["leaf"]
    # nodes: "64 nodes × 8 ... under each SU" below an "SU × 8" box, or one box per unit (or rack)
    fabric_nodes = sum(g.count for g in plan.spec.fabric_groups)
    per_box = []
    for n in d.tier("nodes"):
        m = re.search(rf"({NUMBER}) nodes?", " ".join(n.texts))
        per_box.append((n, num(m[1])))
    total = 0
    for n, count in per_box:
        under = [u for u in d.tier("leaf") if d.connected(n, u)]
        assert len(under) == 1, n.texts
        total += mult[n.id] * count * (count_in(under[0].texts[0]) if "under each" in " ".join(n.texts) else 1)
    assert total == fabric_nodes


@pytest.mark.parametrize("name", DIAGRAMS)
def test_bundles_add_up_to_the_links(diagrams, name):
    """Bundle labels: links a pod (spine-core) and links per unit class (leaf-spine), times their pods."""
    plan, d = diagrams[name]
    pods = {c.id: times(c.texts[0]) for c in d.clusters}
    totals = {"leaf-spine": 0, "spine-core": 0}
    for e in d.edges:
        label = " ".join(e.texts)
        if "to-core" in e.classes:
            link = "spine-core"
            m = re.search(rf"({NUMBER}) links a pod", label)
        elif "to-spine" in e.classes:
            link = "leaf-spine"
            m = re.search(rf"({NUMBER}) links ·", label)
        else:
            assert "to-leaf" in e.classes and f"{plan.speed_gbps}G a node" in label
            continue
        assert m, label
        assert f"{plan.speed_gbps}G" in label and re.search(r"· \d+(\.\d+)?:1", label), label
        pod = d.pod_of(d.box(e.title.split("->")[0]))
        totals[link] += num(m[1]) * (pods[pod.id] if pod else 1)
    assert totals["leaf-spine"] == plan.links["leaf-spine"]
    assert totals["spine-core"] == plan.links.get("spine-core", 0)


@pytest.mark.parametrize("name", DIAGRAMS)
def test_rails_are_shown_on_rail_optimised_designs(diagrams, name):
    plan, d = diagrams[name]
    rails = [f"r{r}" for r in range(plan.rails)]
    for unit in d.tier("leaf"):
        if plan.design == "rail-optimized":
            assert unit.texts[-plan.rails:] == rails, unit.texts
        else:
            assert not set(unit.texts) & {"r0", "r1"}


# ---- geometry ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DIAGRAMS)
def test_no_boxes_overlap_and_tiers_are_rows(diagrams, name):
    _plan, d = diagrams[name]
    boxes = d.nodes
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not overlap(a.box, b.box), (a.texts[0], b.texts[0])
    for i, a in enumerate(d.clusters):
        for b in d.clusters[i + 1:]:
            assert not overlap(a.box, b.box), (a.texts[0], b.texts[0])
    rows = [t for t in ("core", "spine", "leaf", "nodes") if d.tier(t)]
    for upper, lower in itertools.pairwise(rows):
        assert max(n.box[3] for n in d.tier(upper)) < min(n.box[1] for n in d.tier(lower)), (upper, lower)


def label_layout(plan) -> tuple[list[tuple[int, str, tuple]], list[tuple]]:
    """Bundle label lines and boxes as Graphviz measured them (its JSON output holds each text line's
    width in the font it used; the SVG does not): [(bundle, text, box)], [box]. Same input, same layout."""
    layout = json.loads(to_dot(build_view(plan)).pipe(format="json"))
    labels = []
    for n, edge in enumerate(layout.get("edges", [])):
        size = 0.0
        for op in edge.get("_ldraw_", []):
            if op["op"] == "F":
                size = op["size"]
            elif op["op"] == "T":
                (x, y), half = op["pt"], op["width"] / 2 + GAP  # a visible gap, not just no overlap
                labels.append((n, op["text"], (x - half, y - 0.2 * size, x + half, y + 0.8 * size)))
    boxes = []
    for obj in layout["objects"]:
        points = [p for op in obj.get("_draw_", []) for p in op.get("points", [])]
        if points and "nodes" not in obj:  # a box, not a cluster
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            boxes.append((min(xs), min(ys), max(xs), max(ys)))
    return labels, boxes


@pytest.mark.parametrize("name", DIAGRAMS)
def test_bundle_labels_sit_on_no_box_and_no_other_label(diagrams, name):
    plan, d = diagrams[name]
    labels, boxes = label_layout(plan)
    assert len(boxes) == len(d.nodes) and len(labels) == sum(len(e.texts) for e in d.edges)
    for _n, text, box in labels:
        assert not any(overlap(box, b) for b in boxes), text
    for i, (n_a, a, box_a) in enumerate(labels):
        for n_b, b, box_b in labels[i + 1:]:
            assert n_a == n_b or not overlap(box_a, box_b), (a, b)


def test_colossus_200k_is_folded_into_a_readable_diagram(diagrams):
    """200,000 GPUs, 8,312 switches: a few dozen boxes, pods grouped by shape with a multiplicity."""
    plan, d = diagrams["colossus-200k"]
    assert len(d.nodes) <= 40
    labels = sorted(c.texts[0] for c in d.clusters)
    assert any(re.match(r"× \d+ pods", label) for label in labels)
    partial = [p.index + 1 for p in plan.pod_plans if p.spine_down < plan.tier("spine").down]
    assert all(f"pod {n}" in labels for n in partial)


def test_an_expanded_pod_shows_its_units_one_by_one():
    plan = loaded_example("colossus-200k")[1]
    last = plan.pod_plans[-1]
    d = read_svg(fabric_svg(plan, expand=last.index + 1))
    expanded = next(c for c in d.clusters if c.texts[0] == f"pod {last.index + 1} (expanded)")
    titles = {n.texts[0] for n in d.tier("leaf") if inside(n.box, expanded.box)}
    assert titles == {u.name for u in plan.units[last.first_unit:last.first_unit + last.units]}


def test_an_expanded_two_tier_unit_shows_its_racks():
    plan = loaded_example("staging")[1]
    d = read_svg(fabric_svg(plan, expand=2))
    unit = plan.units[1]
    group = plan.spec.group(unit.group)
    racks = {plan.rack_of(group, i) for i in range(unit.first, unit.first + unit.count)}
    assert {n.texts[0] for n in d.tier("nodes") if n.texts[0].startswith("rack")} == racks


# ---- golden structure -------------------------------------------------------------------------------

def structure(d: Diagram) -> dict:
    return {
        "title": d.title,
        "groups": sorted(c.texts[0] for c in d.clusters),
        "boxes": {t: sorted(" | ".join(n.texts) for n in d.tier(t)) for t in ("core", "spine", "leaf", "nodes")},
        "bundles": sorted(" | ".join(e.texts) for e in d.edges),
    }


@pytest.mark.parametrize("name", DIAGRAMS)
def test_diagram_structure_matches_golden(diagrams, name):
    got = structure(diagrams[name][1])
    path = GOLDEN_DIR / "diagram" / f"{name}.json"
    if os.environ.get("GPUCLUSTER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert path.exists(), f"{path} missing: run with GPUCLUSTER_UPDATE_GOLDEN=1 to create it"
    assert got == json.loads(path.read_text()), f"{path} differs; if intended, GPUCLUSTER_UPDATE_GOLDEN=1"


def test_a_pod_out_of_range_is_refused_and_nothing_written(tmp_path):
    from gpucluster.cli import main

    out = tmp_path / "fabric.svg"
    assert main(["plan", str(example_path("colossus-200k")), "--svg", str(out), "--pod", "50"]) == 2
    assert not out.exists()


def test_pod_without_a_diagram_is_refused(capsys):
    from gpucluster.cli import main

    assert main(["plan", str(example_path("staging")), "--pod", "1"]) == 2
    assert "--svg FILE or --html FILE" in capsys.readouterr().err


def test_without_graphviz_it_says_what_to_install(tmp_path, monkeypatch, capsys):
    """No dot on PATH: exit 1 with the package to install, and no file half-written."""
    from gpucluster.cli import main

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "plan.html"
    assert main(["plan", str(example_path("staging")), "--html", str(out)]) == 1
    assert "apt-get install graphviz" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
