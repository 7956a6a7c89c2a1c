"""The plan as one self-contained HTML page: summary, tiers, explanations, warnings, the diagram inline,
the bill of materials, the racks and the storage tiers. No script, no stylesheet or font fetched: the
page is read as a file, offline. Jinja autoescapes everything but the SVG, which Graphviz escaped."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from markupsafe import Markup

from gpucluster import __version__
from gpucluster.cluster import Cluster
from gpucluster.fabric.plan import u_text
from gpucluster.fabric.summary import plan_summary
from gpucluster.report.bom import build_bom
from gpucluster.report.diagram import fabric_svg, inline_svg, summary_svg
from gpucluster.report.racks import Rack, build_racks
from gpucluster.words import number, plural

U_PX = 13  # one rack unit drawn, in px: a 1U row holds a line of the elevation's 11px text


@dataclass(frozen=True)
class Slot:
    """One row of an elevation: what stands from U `lo` to U `hi` (gpu: a node, empty: a node's place the
    rack's group leaves empty, tor: a leaf, mgmt, nvswitch, kept: below the nodes, free)."""

    kind: str
    text: str
    lo: int
    hi: int

    @property
    def u(self) -> str:
        return u_text(self.lo, self.hi)

    @property
    def px(self) -> int:
        return (self.hi - self.lo + 1) * U_PX


def elevation(rack: Rack, host: Callable[[int], str]) -> list[Slot]:
    """The rack from its top U down, a row for each thing in it at its U (`host`: the rack's group's hostnames,
    by index): the management switches, the rack's own leaves, free U, the nodes and an NVLink rack's switch
    trays, and what the rack keeps below its nodes. Every U of the rack is in exactly one row."""
    lay = rack.layout
    if lay is None:
        return []
    rows = [Slot("gpu", host(rack.index + i), *lay.node(i)) if i < rack.nodes else
            Slot("empty", "empty", *lay.node(i)) for i in range(rack.capacity)]
    rows += [Slot("tor", f"leaf {leaf}", *lay.leaf(k)) for k, leaf in enumerate(rack.housed)]
    if lay.management:
        rows.append(Slot("mgmt", "management switch", *lay.management))
    if lay.trays:
        rows.append(Slot("nvswitch", f"{lay.switch_trays} NVLink switch trays", *lay.trays))
    if lay.first_u > 1:
        rows.append(Slot("kept", "kept (rack_first_u)", 1, lay.first_u - 1))
    out: list[Slot] = []
    top = lay.height
    for row in sorted(rows, key=lambda r: -r.hi):
        if row.hi < top:
            out.append(Slot("free", "", row.hi + 1, top))
        out.append(row)
        top = row.lo - 1
    if top >= 1:
        out.append(Slot("free", "", 1, top))
    return out


@cache
def _environment():
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    from gpucluster.render.templating import _bytecode_cache, templates_dir

    env = Environment(loader=FileSystemLoader(str(templates_dir() / "report")), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      bytecode_cache=_bytecode_cache())
    return env


def plan_html(cluster: Cluster, pod: int | None = None) -> str:
    plan = cluster.plan
    summary = plan_summary(plan)
    bom = build_bom(plan)
    racks = build_racks(plan)
    links = plan.links
    uplinks = {"leaf": links.get("leaf-spine", 0), "spine": links.get("spine-core", 0)}
    tiers = [{"tier": t.tier, "model": t.model, "count": t.count, "down": t.down, "up": t.up, "radix": t.radix,
              "ratio": t.ratio, "links_up": uplinks.get(t.tier, 0)} for t in plan.tier_plans]
    fab = summary["fabric"]
    units = summary["units"]
    kind = "scalable unit" if units["kind"] == "scalable unit" else "leaf"
    pods = f", {plural(summary['pods'], 'pod')}" if summary["pods"] else ""
    headline = (f"{fab['type']} {fab['design']}, {plural(plan.tiers, 'tier')}, {plural(fab['endpoints'], 'endpoint')} "
                f"at {fab['link_gbps']} Gb/s, {plural(fab['rails'], 'rail')}; {plural(units['count'], kind)} of "
                f"{plural(units['nodes_per_unit'], 'node')}{pods}")
    summary_line = ("links: " + ", ".join(f"{k} {v:,}" for k, v in links.items())
                    + f"; bisection bandwidth {number(summary['bisection_tbps'])} Tb/s")
    warnings = [{"level": w.level, "where": f"{w.file}:{w.line}" if w.line else (w.file or "<spec>"),
                 "field": w.field or "<top>", "message": w.message, "fix": w.fix, "rule": w.rule}
                for w in cluster.warnings]
    return _environment().get_template("plan.html.j2").render(
        name=cluster.name, version=__version__, source=str(cluster.source), summary=summary, headline=headline,
        summary_line=summary_line, tiers=tiers, tiers_word=plural(plan.tiers, "tier"),
        explanations=summary["explanations"], warnings=warnings,
        svg=Markup(inline_svg(fabric_svg(plan, pod))), summary_svg=Markup(inline_svg(summary_svg(plan))), bom=bom,
        racks=racks.racks, rack_sample=racks.sample(),
        elevation=lambda r: elevation(r, plan.spec.group(r.group).host),
        storage=summary["storage"], number=number)
