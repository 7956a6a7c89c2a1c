"""The ibnetdiscover reader: real-format dumps written by hand (tests/fixtures/asbuilt/*.ibnet, after
rdma-core's ibnetdiscover.c), dumps generated from a plan, and input it must survive."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from gpucluster.errors import UsageError
from gpucluster.fabric.asbuilt import ibnetdiscover
from gpucluster.fabric.asbuilt.graph import AGGREGATION, HCA, PORT_SPAN, ROUTER, SWITCH, rate_gbps

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "asbuilt"
sys.path.insert(0, str(FIXTURES.parent.parent))
from fixtures.asbuilt.fabricgen import build  # noqa: E402


def by_desc(fab, desc):
    hits = [i for i, n in enumerate(fab.nodes) if n.desc == desc]
    assert len(hits) == 1, (desc, hits)
    return hits[0]


def link_of(fab, node, port):
    code = fab.peer(node, port)
    return fab.label(code // PORT_SPAN), code % PORT_SPAN, fab.rate(node, port)


def test_hand_written_hdr_fabric():
    fab = ibnetdiscover.read(FIXTURES / "hdr-two-tier.ibnet")
    assert fab.findings == []
    kinds = [n.kind for n in fab.nodes]
    assert kinds.count(SWITCH) == 4 and kinds.count(HCA) == 6 and kinds.count(AGGREGATION) == 1
    spine = by_desc(fab, "MF0;spine01:MQM8700/U1")
    assert link_of(fab, spine, 1) == ("MF0;leaf01:MQM8700/U1", 39, "4xHDR")
    assert link_of(fab, spine, 41) == ("Mellanox Technologies Aggregation Node", 1, "4xHDR")
    leaf02 = by_desc(fab, "MF0;leaf02:MQM8700/U1")
    assert link_of(fab, leaf02, 1) == ("node003 mlx5_0", 1, "4xEDR")
    assert fab.nodes[by_desc(fab, "")].kind == HCA  # the HCA whose description is empty
    assert fab.link_count() == 12
    assert sum(1 for _ in fab.links()) == 12
    # every node that printed a block knows its line
    assert all(n.line for n in fab.nodes)
    assert fab.nodes[spine].line == 14


def test_grouped_full_output_with_router_and_ext_ports():
    fab = ibnetdiscover.read(FIXTURES / "grouped-full.ibnet")
    assert fab.findings == []
    line = by_desc(fab, "MF0;core-ch1:SX6536/L01/U1")
    assert link_of(fab, line, 1) == ("cn001 HCA-1", 1, "4xFDR")
    assert link_of(fab, line, 19) == ("MF0;core-ch1:SX6536/S01/U1", 1, "4xFDR")
    router = by_desc(fab, "ib-router-1")
    assert fab.nodes[router].kind == ROUTER
    assert link_of(fab, router, 1) == ("MF0;core-ch1:SX6536/L01/U1", 20, "4xFDR")
    hca = by_desc(fab, "cn001 HCA-1")
    assert fab.nodes[hca].nports == 2 and fab.peer(hca, 2) == -1


def test_broken_lines_are_findings_with_line_numbers():
    fab = ibnetdiscover.read(FIXTURES / "broken-lines.ibnet")
    where = sorted(f.where for f in fab.findings)
    assert where == [f"{FIXTURES / 'broken-lines.ibnet'}:12", f"{FIXTURES / 'broken-lines.ibnet'}:13"]
    assert all(f.kind == "unparsed-line" for f in fab.findings)
    leaf = by_desc(fab, "leaf01")
    assert link_of(fab, leaf, 3) == ("gpu03 mlx5_0", 1, "2xNDR")  # the lines after the bad ones still count
    assert rate_gbps("2xNDR") == 200


@pytest.mark.parametrize("name", ["hdr-two-tier.ibnet", "grouped-full.ibnet", "broken-lines.ibnet"])
def test_line_reader_and_file_reader_agree(name):
    """parse() over text lines and read() over the file's bytes take different batches, same graph."""
    a = ibnetdiscover.read(FIXTURES / name)
    b = ibnetdiscover.parse((FIXTURES / name).read_text().splitlines(keepends=True), str(FIXTURES / name))
    assert sorted((fab_link(a, x)) for x in a.links()) == sorted(fab_link(b, x) for x in b.links())
    assert [f.where for f in a.findings] == [f.where for f in b.findings]


def fab_link(fab, link):
    a, pa, b, pb, rate = link
    return tuple(sorted([(fab.label(a), pa), (fab.label(b), pb)])) + (rate,)


def test_windows_line_ends_and_indented_copies():
    text = (FIXTURES / "hdr-two-tier.ibnet").read_text()
    crlf = ibnetdiscover.parse(io.StringIO(text.replace("\n", "\r\n")), "crlf")
    indented = ibnetdiscover.parse(io.StringIO("".join("    " + line for line in text.splitlines(True))), "ind")
    plain = ibnetdiscover.read(FIXTURES / "hdr-two-tier.ibnet")
    want = sorted(fab_link(plain, x) for x in plain.links())
    assert crlf.findings == [] and indented.findings == []
    assert sorted(fab_link(crlf, x) for x in crlf.links()) == want
    assert sorted(fab_link(indented, x) for x in indented.links()) == want


def test_a_dump_that_contradicts_itself():
    text = (FIXTURES / "hdr-two-tier.ibnet").read_text()
    # leaf01's port 2 claims node003's HCA, which leaf02's port 1 already holds
    bad = text.replace('[2]\t"H-0c42a10300a1b2d0"[1](0c42a10300a1b2d1) \t\t# "node002 mlx5_0"',
                       '[2]\t"H-0c42a10300a1b300"[1](0c42a10300a1b301) \t\t# "node003 mlx5_0"')
    assert bad != text
    fab = ibnetdiscover.parse(io.StringIO(bad), "x")
    # two contradictions: leaf02 port 1 and node002's own block each claim a port already taken
    assert [f.kind for f in fab.findings] == ["dump-conflict", "dump-conflict"]
    assert "node003 mlx5_0" in fab.findings[0].message and "node002 mlx5_0" in fab.findings[1].message
    assert all(f.where.startswith("x:") for f in fab.findings)


@pytest.mark.parametrize("text", ["", "hello\nworld\n", "Hca1\n[1] x\n", '{"lldp": {}}\n'])
def test_not_a_dump_is_refused_with_a_location(tmp_path, text):
    p = tmp_path / "dump.txt"
    p.write_text(text)
    with pytest.raises(UsageError) as err:
        ibnetdiscover.read(p)
    assert f"{p}:" in str(err.value) and "ibnetdiscover > FILE" in str(err.value)


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        ibnetdiscover.read(tmp_path / "nope.txt")


def test_binary_garbage_does_not_raise(tmp_path):
    p = tmp_path / "dump.txt"
    p.write_bytes((FIXTURES / "hdr-two-tier.ibnet").read_bytes() + b"\xff\xfe\x00garbage\n[\xff]\n")
    fab = ibnetdiscover.read(p)
    assert {f.kind for f in fab.findings} == {"unparsed-line"}
    assert fab.link_count() == 12


def test_generated_dump_of_meta_24k_ib_round_trips(meta_ib):
    """Every planned cable comes back as one link between the right nodes at the planned rate."""
    plan, built = meta_ib
    fab = ibnetdiscover.parse(built.ibnetdiscover(), "gen")
    assert fab.findings == []
    sizes = plan.links
    aggregation = sum(1 for n in fab.nodes if n.kind == AGGREGATION)
    assert aggregation == sum(t.count for t in plan.tier_plans)  # sharp: true puts one behind every switch
    assert fab.link_count() == sum(sizes.values()) + aggregation
    assert set(fab.rate_names) == {"", "4xNDR"}


@pytest.fixture(scope="module")
def meta_ib():
    from gpucluster.cluster import load_cluster

    plan = load_cluster(Path(__file__).resolve().parent.parent / "examples" / "meta-24k-ib.yaml").plan
    return plan, build(plan)
