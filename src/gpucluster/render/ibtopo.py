"""The plan as an IBDM topology file, for `ibdiagnet -t FILE` (ibdiagnet compares the live fabric with it).

The format rules, as ibutils documents them (ibdm-topo-file(1), ibdm/doc/topofile.txt) and as its
parser applies them (IBFabric::parseTopology in ibdm/datamodel/Fabric.cpp):

  "The topology file is composed "system" sections. Each such section describes the connectivity of
   one system to other systems in the network. The first line of each section is a declaration of
   the system composed of a system-type, its system-name section, and optional configuration details.
   The lines to follow until the next empty line describe the connections between this system ports
   to the other systems."

      SYSTEM-TYPE SYSTEM-NAME [CFG: <b1>=<modifier>, [<b2>=<modifier>]...]
              LOCAL-PORT-PANEL-NAME -> REM-SYS-TYPE REM-SYS-NAME REM-PORT-PANEL-NAME

  "SYSTEM-TYPE and REM-SYS-TYPE: Any system that has a corresponding IBNL definition."
  "LOCAL-PORT-PANEL-NAME: The name of the local system port. The numbers printed on the front panel
   are used together with Ln for Leaf no. N or Sn for Spine no. N."   (the example: P1, P2, P24)

  The parser's patterns (a line that matches none is ignored with a warning):
      comment      ^[ \\t]*#
      system line  ^[ \\t]*([^/ \\t]+)[ \\t]+([^/ \\t]+)[ \\t]*( CFG:(.*))?$      no '/' in type or name
      port line    ^[ \\t]+([^ \\t]+)[ \\t]+-((1|4|8|12)[xX]-)?((2.5|5|10)G-)?[>]
                   [ \\t]+([^ \\t]+)[ \\t]+([^ \\t]+)[ \\t]+([^ \\t]+)[ \\t]*$     indented; 5 fields
      empty line   ^[ \\t]*$   ends the system section
  and it reads lines into a 1024-byte buffer (f.getline(sLine, 1024)).

What this writer does with them: one section per switch (its host cables and its uplinks, each cable
once: a remote system needs no section of its own), a blank line after each, ports "P<n>" by the
switch's port number, HCAs as systems of their own named "<host>_<hca>" (a host name has no '_', so
the name splits back; '/' is forbidden). The link-width/speed annotation is left out: the parser only
knows speeds up to 10G, and without it ibdm assumes 4x (the parser's default). The system types are
the IBNL names below; ibdiagnet needs an IBNL file for each (ship one beside the topology file if
your ibdiagnet lacks it).
"""

from __future__ import annotations

from collections.abc import Iterator

from gpucluster.fabric.cabling import cabling_rows
from gpucluster.fabric.plan import Plan

# IBNL system type by catalog key: switch model names and HCA device IDs (MT4123 = ConnectX-6, MT4129 =
# ConnectX-7) as ibdiagnet's IBNL files call them. A catalog key not listed is written upper-cased.
IBNL_TYPES = {
    "qm8700": "MQM8700",
    "qm9700": "MQM9700",
    "cx6-hdr-200g": "MT4123",
    "cx7-ndr-400g": "MT4129",
}
MAX_LINE = 1023  # the parser's getline buffer is 1024 bytes, the terminating NUL included


def ibnl_type(catalog_key: str | None) -> str:
    if not catalog_key:
        return "HCA"
    return IBNL_TYPES.get(catalog_key, catalog_key.upper().replace("/", "-"))


def hca_system(host: str, hca: str) -> str:
    return f"{host}_{hca}"


def topofile(plan: Plan) -> Iterator[str]:
    """The topology file, one switch section at a time (a Colossus-size plan is ~600k cables)."""
    spec = plan.spec
    fab = spec.fabric
    sw_type = {t.tier: ibnl_type(t.model) for t in plan.tier_plans}
    hca_type: dict[str, str] = {}
    for g in spec.fabric_groups:
        for host in g.hosts:
            hca_type[host] = ibnl_type(g.nic)
    yield (f"# IBDM topology of {spec.name}: rendered by gpucluster from the plan ({fab.design}, {plan.tiers} tiers, "
           f"{plan.speed_gbps} Gb/s).\n# Check the live fabric with: ibdiagnet -t <this file>\n\n")
    for chunk in cabling_rows(plan):
        sections: dict[str, list[str]] = {}
        types: dict[str, str] = {}
        for row in chunk.splitlines():
            a, pa, b, pb, link, _media = row.split(",")
            lower, upper = link.split("-")
            if lower == "node":  # a host's HCA: the leaf's section lists it
                sections.setdefault(b, []).append(f"   P{pb} -> {hca_type[a]} {hca_system(a, pa)} P1")
                types[b] = sw_type[upper]
            else:
                sections.setdefault(a, []).append(f"   P{pa} -> {sw_type[upper]} {b} P{pb}")
                types[a] = sw_type[lower]
        yield "".join(f"{types[name]} {name}\n" + "\n".join(lines) + "\n\n" for name, lines in sections.items())
