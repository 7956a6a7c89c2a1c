"""The fabric diagram as SVG, laid out by Graphviz (dot) through its Python binding.

Why Graphviz: a layered (Sugiyama) layout is exactly "tiers as rows", and dot keeps boxes, clusters
and edge labels from overlapping by construction, so the diagram stays readable whatever the folded
view holds. The `graphviz` package only writes DOT and runs `dot`; `dot` comes from Debian's
graphviz package (scripts/setup.sh installs it). Both are long-lived and maintained.
"""

from __future__ import annotations

import html
import itertools
import re

from gpucluster.errors import OperationError
from gpucluster.fabric import Plan
from gpucluster.report.view import TIERS, Box, View, build_view, summary_view

FONT = "DejaVu Sans,Helvetica,Arial,sans-serif"
FILL = {"core": "#e8eefc", "spine": "#e6f4ea", "leaf": "#fff4e0", "nodes": "#f3f3f3"}
EDGE = {"core": "#3b5bdb", "spine": "#2b8a3e", "leaf": "#e67700"}


def _label(box: Box) -> str:
    """An HTML-like label: bold title, detail lines, and a row of rail cells on rail-optimised SUs."""
    width = max(1, len(box.rails))
    rows = [f'<TR><TD COLSPAN="{width}"><B>{html.escape(box.title)}</B></TD></TR>']
    rows += [f'<TR><TD COLSPAN="{width}">{html.escape(line)}</TD></TR>' for line in box.lines]
    if box.rails:
        cells = "".join(f'<TD BORDER="1" BGCOLOR="white">{html.escape(r)}</TD>' for r in box.rails)
        rows.append(f"<TR>{cells}</TR>")
    return f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2" CELLPADDING="2">{"".join(rows)}</TABLE>>'


LABEL_GAP = 8  # points kept clear between a bundle label and its edge
LABEL_PAD = 2  # and around the rest of it (other lines route around the label's box)


def _edge_label(lines: list[str]) -> str:
    """A bundle label as a borderless table with an empty first cell. dot sets an edge's label to the right
    of the edge, the label's left side on the edge's route, so a plain label's first character sat on the
    line ("8 × 400G" read "3 × 400G"); the empty cell is part of the label's size, so the line runs
    LABEL_GAP points clear of the text, whatever font the reader's browser measures it with."""
    text = "<BR/>".join(html.escape(line) for line in lines)
    table = f'<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="{LABEL_PAD}">'
    return f'<{table}<TR><TD WIDTH="{LABEL_GAP}"></TD><TD>{text}</TD></TR></TABLE>>'


FULL = (16, 11, 10)  # font sizes in points: title, boxes, bundle labels
SUMMARY = (18, 15, 14)  # the README's diagram: shown at 800 px, so its text stays 10 px or more


def to_dot(view: View, sizes: tuple[int, int, int] = FULL):
    import graphviz

    title, box, edge = sizes
    g = graphviz.Digraph("fabric", graph_attr={
        "rankdir": "BT", "newrank": "true", "nodesep": "0.6", "ranksep": "0.9", "fontname": FONT,
        "fontsize": str(title), "label": view.title, "labelloc": "t", "splines": "spline", "bgcolor": "white",
    }, node_attr={"shape": "box", "style": "rounded,filled", "fontname": FONT, "fontsize": str(box),
                  "margin": "0.08,0.04"},
        edge_attr={"fontname": FONT, "fontsize": str(edge), "arrowhead": "none", "penwidth": "1.6"})
    by_group: dict[str, list[Box]] = {}
    for box in view.boxes:
        by_group.setdefault(box.group, []).append(box)

    def add(target, box: Box) -> None:
        target.node(box.id, _label(box), fillcolor=FILL[box.tier], id=f"box-{box.id}", **{"class": f"tier-{box.tier}"})

    for box in by_group.get("", []):
        add(g, box)
    for group in view.groups:
        with g.subgraph(name=f"cluster_{group.id}") as c:
            c.attr(label=group.label, style="rounded,dashed", color="#888888", fontsize="13", id=f"group-{group.id}")
            for box in by_group.get(group.id, []):
                add(c, box)
    for tier in TIERS:  # tiers as rows, across pods
        members = view.tier(tier)
        if members:
            with g.subgraph() as row:
                row.attr(rank="same")
                for box in members:
                    row.node(box.id)
                # left to right in the view's order (pods by number, a pod's units as the plan lists them):
                # dot orders a row to cross fewer lines, which put pod 37's units out of order; an invisible
                # edge inside a row (a flat edge) always runs left to right
                for a, b in itertools.pairwise(members):
                    row.edge(a.id, b.id, style="invis")
    tier_of = {b.id: b.tier for b in view.boxes}
    for bundle in view.bundles:
        colour = EDGE.get(tier_of[bundle.dst], "#555555")
        g.edge(bundle.src, bundle.dst, label=_edge_label(bundle.label), color=colour, fontcolor=colour,
               **{"class": f"bundle to-{tier_of[bundle.dst]}"})
    return g


def fabric_svg(plan: Plan, expand: int | None = None) -> str:
    """The diagram as SVG text. Raises OperationError when Graphviz's dot is not installed."""
    import graphviz

    try:
        svg = to_dot(build_view(plan, expand)).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise OperationError("Graphviz's dot is not installed: run scripts/setup.sh "
                             "(or apt-get install graphviz)") from None
    return svg


def summary_svg(plan: Plan) -> str:
    """The README-sized diagram: one box a tier (view.summary_view), in larger type."""
    import graphviz

    try:
        return to_dot(summary_view(plan), SUMMARY).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise OperationError("Graphviz's dot is not installed: run scripts/setup.sh "
                             "(or apt-get install graphviz)") from None


def inline_svg(svg: str) -> str:
    """The <svg> element alone (no XML prolog or DOCTYPE), to sit inside an HTML page, sized in CSS pixels
    rather than points (a quarter smaller: Colossus 200k's diagram fits a wide screen, its 11 px text stays
    legible). The viewBox keeps every coordinate as Graphviz wrote it."""
    start = svg.find("<svg")
    element = svg[start:] if start >= 0 else svg
    head, sep, rest = element.partition(">")
    return re.sub(r'(width|height)="([\d.]+)pt"', r'\1="\2px"', head) + sep + rest
