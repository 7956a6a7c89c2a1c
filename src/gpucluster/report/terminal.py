"""What check, plan and render print: rich on a terminal, plain and full-width through a pipe.

Two rules hold in both modes: no value is ever cut (a table too wide for the terminal is printed as
one record per row instead, and plain output is never wrapped or truncated, whatever COLUMNS says),
and numbers are never split by highlighting (rich's number highlighter is off; styles go on words).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO

from gpucluster.errors import Finding
from gpucluster.fabric import Plan
from gpucluster.words import number, plural


def colour_wanted(stream: TextIO, no_color: bool = False) -> bool:
    """Rich output only for a person at a terminal: never through a pipe, with --no-color or NO_COLOR."""
    if no_color or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Screen:
    """One output stream, rich or plain. `rich=None` decides from the stream."""

    def __init__(self, stream: TextIO | None = None, *, rich: bool | None = None, width: int | None = None):
        self.stream = stream or sys.stdout
        self.rich = colour_wanted(self.stream) if rich is None else rich
        self.console = None
        if self.rich:
            from rich.console import Console

            self.console = Console(file=self.stream, highlight=False, width=width, force_terminal=True,
                                   emoji=False, markup=False)

    # ---- lines ------------------------------------------------------------------------------------
    def line(self, *parts: str | tuple[str, str]) -> None:
        """Print a line of pieces; a (text, style) piece is styled on a terminal, plain otherwise."""
        if self.console is None:
            print("".join(p if isinstance(p, str) else p[0] for p in parts), file=self.stream)
            return
        from rich.text import Text

        text = Text()
        for p in parts:
            if isinstance(p, str):
                text.append(p)
            else:
                text.append(p[0], style=p[1])
        self.console.print(text)

    def finding(self, f: Finding) -> None:
        colour = "red" if f.level == "error" else "yellow"
        self.line((f.level, f"bold {colour}"), ": ", f.render())

    # ---- tables -----------------------------------------------------------------------------------
    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> None:
        """Columns as wide as their widest cell. On a terminal too narrow for them, one record per row."""
        if self.console is None:
            widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

            def fmt(row: Sequence[str]) -> str:
                cells = [str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True))]
                return "  ".join(cells).rstrip()

            print(fmt(headers), file=self.stream)
            print("  ".join("-" * w for w in widths), file=self.stream)
            for row in rows:
                print(fmt(row), file=self.stream)
            return
        from rich.table import Table

        table = Table(header_style="bold")
        for i, header in enumerate(headers):
            table.add_column(header, no_wrap=True, justify="right" if i in right else "left")
        for row in rows:
            table.add_row(*map(str, row))
        width = self.console.measure(table, options=self.console.options.update_width(10**6)).maximum
        if width <= self.console.width:
            self.console.print(table)
            return
        for row in rows:  # records: every value whole, however narrow the terminal
            self.line((str(row[0]), "bold"))
            for header, cell in zip(headers[1:], row[1:], strict=True):
                self.line(f"  {header}: ", (str(cell), ""))


# ---- check ----------------------------------------------------------------------------------------

def print_check(out: Screen, err: Screen, path: str, node_groups: int, nodes: int,
                findings: Sequence[Finding]) -> None:
    for f in findings:
        err.finding(f)
    warnings = sum(1 for f in findings if f.level == "warning")
    out.line(f"{path}: ", ("ok", "bold green"),
             f" ({plural(node_groups, 'node group')}, {plural(nodes, 'node')}, {plural(warnings, 'warning')})")


# ---- plan -----------------------------------------------------------------------------------------

def print_plan(out: Screen, plan: Plan, summary: dict, warnings: Sequence[Finding]) -> None:
    gpus = ", ".join(f"{n:,} {k}" for k, n in summary["gpus_by_type"].items())
    out.line((plan.spec.name, "bold"), f": {plural(summary['nodes'], 'node')}, {plural(summary['gpus'], 'GPU')}"
             + (f" ({gpus})" if gpus else ""))
    fab = summary["fabric"]
    units = summary["units"]
    kind = "scalable unit" if units["kind"] == "scalable unit" else "leaf"
    pods = f", {plural(summary['pods'], 'pod')}" if summary["pods"] else ""
    out.line(f"fabric: {fab['type']} {fab['design']}, {plural(plan.tiers, 'tier')}, "
             f"{plural(fab['endpoints'], 'endpoint')} at {fab['link_gbps']} Gb/s, {plural(fab['rails'], 'rail')}; "
             f"{plural(units['count'], kind)} of {plural(units['nodes_per_unit'], 'node')}{pods}")
    out.line("")
    rows = [[t.tier, t.model, f"{t.count:,}", f"{t.down}/{t.up}", str(t.radix), t.ratio] for t in plan.tier_plans]
    out.table(["tier", "model", "switches", "down/up per switch", "radix", "oversubscription"], rows, right=(2, 4))
    out.line("")
    out.line("links: " + ", ".join(f"{k} {v:,}" for k, v in summary["links"].items()))
    out.line(f"bisection bandwidth: {number(summary['bisection_tbps'])} Tb/s; racks: {summary['racks']:,}")
    domains = summary.get("nvlink_domains")
    if domains:
        sizes = sorted({(d["trays"], d["gpus"]) for d in domains}, reverse=True)
        shape = ", ".join(f"{t} trays / {g} GPUs" for t, g in sizes)
        out.line(f"NVLink: {plural(len(domains), 'domain')} ({shape}), one per rack "
                 f"({domains[0]['rack']} .. {domains[-1]['rack']})")
    flash = summary["storage"].get("flash")
    if flash:
        out.line(f"flash tier '{flash['name']}': {plural(flash['chunk_servers'], 'chunk server')}, "
                 f"{number(flash['usable_tb'])} TB usable, {number(flash['write_gbps'])} GB/s write, "
                 f"mounted at {flash['mount']}")
    for n in summary["storage"]["nfs"]:
        out.line(f"nfs tier '{n['name']}': {plural(n['servers'], 'server')}, "
                 f"{plural(len(n['exports']), 'export')} ({', '.join(n['exports'])})")
    if summary.get("explanations"):
        out.line("")
        out.line(("why these counts", "bold"), " (above the arithmetic minimum):")
        for e in summary["explanations"]:
            out.line("  ", (e["subject"], "bold"), f": {e['count']:,}, {e['excess']:,} above the "
                     f"{e['minimum']:,} the arithmetic needs: {e['why']}; ", (e["fix"], "cyan"))
    for w in warnings:
        out.finding(w)


# ---- render ---------------------------------------------------------------------------------------

def print_render(out: Screen, folder: str, name: str, sizes: dict[str, int], took: float) -> None:
    base = folder.rstrip("/") or "/"
    for file, size in sizes.items():  # one line a file, whole: scripts read "  PATH  SIZE bytes"
        out.line(f"  {base}/{file}  ", (f"{size:,}", "bold"), " bytes")
    out.line(f"rendered {plural(len(sizes), 'file')} for {name} in {took:.2f} s")
