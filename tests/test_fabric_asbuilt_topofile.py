"""`fabric topofile`: the plan of meta-24k-ib as an IBDM topology file, checked against the rules of
ibutils' documentation (ibdm-topo-file(1)) and the patterns its parser applies (Fabric.cpp
parseTopology), which topofile.py quotes."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.render.ibtopo import MAX_LINE, hca_system, topofile

ROOT = Path(__file__).resolve().parent.parent
# ibdm's own patterns (IBFabric::parseTopology)
SYS_LINE = re.compile(r"^[ \t]*([^/ \t]+)[ \t]+([^/ \t]+)[ \t]*( CFG:(.*))?$")
PORT_LINE = re.compile(r"^[ \t]+([^ \t]+)[ \t]+-((1|4|8|12)[xX]-)?((2.5|5|10)G-)?[>]"
                       r"[ \t]+([^ \t]+)[ \t]+([^ \t]+)[ \t]+([^ \t]+)[ \t]*$")
IGNORE = re.compile(r"^[ \t]*#")
EMPTY = re.compile(r"^[ \t]*$")


@pytest.fixture(scope="module")
def meta():
    plan = load_cluster(ROOT / "examples" / "meta-24k-ib.yaml").plan
    return plan, "".join(topofile(plan))


def test_every_line_is_one_the_parser_accepts(meta):
    _plan, text = meta
    system = None
    for n, line in enumerate(text.split("\n"), 1):
        assert len(line.encode()) <= MAX_LINE, f"line {n} is longer than ibdm's 1024-byte buffer"
        if IGNORE.match(line):
            continue
        if EMPTY.match(line):
            system = None  # "The lines to follow until the next empty line" belong to the section
            continue
        port = PORT_LINE.match(line)
        if port:
            assert system is not None, f"line {n}: a port line outside a system section"
            continue
        sys_line = SYS_LINE.match(line)
        assert sys_line, f"line {n} matches no pattern: {line!r}"
        assert system is None, f"line {n}: a system line inside a section (no empty line before it)"
        system = sys_line.group(2)


def test_sections_cables_and_names_follow_the_plan(meta):
    plan, text = meta
    sections = Counter(m.group(2) for line in text.split("\n") if not line.startswith((" ", "#"))
                       and (m := SYS_LINE.match(line)))
    switches = sum(t.count for t in plan.tier_plans)
    # a section per switch with cables below it: every leaf and spine; a core only appears as a remote
    assert len(sections) == switches - plan.tier("core").count and max(sections.values()) == 1
    cables = [PORT_LINE.match(line) for line in text.split("\n") if PORT_LINE.match(line)]
    assert len(cables) == sum(plan.links.values())  # each cable once
    ends = Counter((m.group(7), m.group(8)) for m in cables)
    assert max(ends.values()) == 1  # no remote port twice
    host = plan.spec.group("h100").hosts[0]
    assert (hca_system(host, "mlx5_0"), "P1") in ends
    assert all(m.group(1).startswith("P") and m.group(8).startswith("P") for m in cables)
    assert {m.group(6) for m in cables} == {"MQM9700", "MT4129"}
