"""validate's block checks (validate/checks/test_slurm.py) on recorded `scontrol show topology` text: slurmctld's
blocks against the expectations validate builds from the rendered topology file (validate/expect.py). The healthy
outputs were recorded from the emulator (24.11.5 from the trixie root, 26.05 from the sid root) on the GB200
example's block topology; each fault is one of them edited, so every message is checked against the text Slurm
writes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import compiled, example_data, spec_from_data, validate_checks

from gpucluster.render.topology import topology_files
from gpucluster.validate.expect import _blocks

checks = validate_checks("test_slurm.py", "gpc_checks_slurm")

# 2 racks (36 trays), 24.11.5 and 26.05 print the same.
TWO_RACKS = """\
BlockName=nvl0001 BlockIndex=0 Nodes=gb[0001-0018] BlockSize=18
BlockName=nvl0002 BlockIndex=1 Nodes=gb[0019-0036] BlockSize=18
AggregatedBlock=nvl[0001-0002] BlockIndex=2 Nodes=gb[0001-0036] BlockSize=36
"""
# 5 racks (90 trays) on 24.11.5, BlockSizes=18,36,72: the fifth block is aggregated into nothing.
FIVE_RACKS = """\
BlockName=nvl0001 BlockIndex=0 Nodes=gb[0001-0018] BlockSize=18
BlockName=nvl0002 BlockIndex=1 Nodes=gb[0019-0036] BlockSize=18
BlockName=nvl0003 BlockIndex=2 Nodes=gb[0037-0054] BlockSize=18
BlockName=nvl0004 BlockIndex=3 Nodes=gb[0055-0072] BlockSize=18
BlockName=nvl0005 BlockIndex=4 Nodes=gb[0073-0090] BlockSize=18
AggregatedBlock=nvl[0001-0002] BlockIndex=5 Nodes=gb[0001-0036] BlockSize=36
AggregatedBlock=nvl[0003-0004] BlockIndex=7 Nodes=gb[0037-0072] BlockSize=36
AggregatedBlock=nvl[0001-0004] BlockIndex=6 Nodes=gb[0001-0072] BlockSize=72
"""
# 100 trays on 26.05 (topology.yaml): a partial sixth rack of 10 is a block of its own, and aggregated.
SIX_RACKS = """\
BlockName=nvl0001 BlockIndex=0 Nodes=gb[0001-0018] BlockSize=18
BlockName=nvl0002 BlockIndex=1 Nodes=gb[0019-0036] BlockSize=18
BlockName=nvl0003 BlockIndex=2 Nodes=gb[0037-0054] BlockSize=18
BlockName=nvl0004 BlockIndex=3 Nodes=gb[0055-0072] BlockSize=18
BlockName=nvl0005 BlockIndex=4 Nodes=gb[0073-0090] BlockSize=18
BlockName=nvl0006 BlockIndex=5 Nodes=gb[0091-0100] BlockSize=18
AggregatedBlock=nvl[0001-0002] BlockIndex=6 Nodes=gb[0001-0036] BlockSize=36
AggregatedBlock=nvl[0003-0004] BlockIndex=8 Nodes=gb[0037-0072] BlockSize=36
AggregatedBlock=nvl[0005-0006] BlockIndex=9 Nodes=gb[0073-0100] BlockSize=36
AggregatedBlock=nvl[0001-0004] BlockIndex=7 Nodes=gb[0001-0072] BlockSize=72
"""


def _plan(trays: int = 36, line: str = "24.11", topology: str = "block") -> dict | None:
    """validate's expectations from the GB200 example's rendered topology file."""
    data = example_data("gb200-superpod")
    next(g for g in data["node_groups"] if g["name"] == "gb200")["count"] = trays
    data["slurm"].update(version=line, topology=topology)
    cluster = compiled(spec_from_data(data))
    return _blocks(topology_files(cluster.spec, cluster.plan), topology)


def problems(plan: dict, text: str) -> list[str]:
    got = checks.parse_blocks(text)
    found = [f"{b['name']}: {p}" for b in plan["blocks"] for p in checks.block_problems(b, plan["blocks"], got)]
    found += [f"extra block {e}" for e in checks.extra_blocks(plan["blocks"], got)]
    return found + checks.aggregation_problems(plan, got)


@pytest.mark.parametrize(("trays", "line", "text", "file"), [
    (36, "24.11", TWO_RACKS, "topology.conf"), (36, "26.05", TWO_RACKS, "topology.yaml"),
    (90, "24.11", FIVE_RACKS, "topology.conf"), (100, "26.05", SIX_RACKS, "topology.yaml")])
def test_what_slurmctld_loaded_agrees_with_the_plan(trays, line, text, file):
    plan = _plan(trays, line)
    assert plan["file"] == file
    assert problems(plan, text) == []


def test_the_expected_aggregation_is_slurmctlds():
    """A complete run of 2^k base blocks per size, from the first; a lone fifth block aggregates into nothing."""
    plan = _plan(90)
    assert plan["sizes"] == [18, 36, 72]
    assert [(a["name"], a["size"]) for a in plan["aggregated"]] == [
        ("nvl[0001-0002]", 36), ("nvl[0003-0004]", 36), ("nvl[0001-0004]", 72)]


def test_a_tray_in_the_other_block_is_named_with_both_blocks():
    text = TWO_RACKS.replace("gb[0001-0018]", "gb[0001-0017]").replace("gb[0019-0036]", "gb[0018-0036]", 1)
    assert problems(_plan(), text) == ["nvl0001: missing gb0018 (slurmctld has it in nvl0002)",
                                       "nvl0002: extra gb0018 (the plan has it in nvl0001)"]


def test_a_tray_in_no_block_is_named():
    text = TWO_RACKS.replace("gb[0019-0036] BlockSize=18", "gb[0019-0035] BlockSize=18")
    assert problems(_plan(), text) == ["nvl0002: missing gb0036 (slurmctld has it in no block)"]


def test_a_node_the_plan_lacks_is_named():
    text = TWO_RACKS.replace("gb[0019-0036] BlockSize=18", "gb[0019-0037] BlockSize=18")
    assert problems(_plan(), text) == ["nvl0002: extra gb0037 (the plan has it in no block)"]


def test_a_block_slurmctld_lacks_is_named():
    text = "\n".join(li for li in TWO_RACKS.splitlines() if not li.startswith("BlockName=nvl0002"))
    found = problems(_plan(), text)
    assert found[0].startswith("nvl0002: slurmctld has no block nvl0002 (the plan has it, with gb0019, ")
    assert found[1:] == []


def test_an_aggregated_block_is_no_base_block():
    """A base block's name only as an aggregated block: slurmctld has no such base block."""
    text = TWO_RACKS.replace("BlockName=nvl0002", "AggregatedBlock=nvl0002")
    assert problems(_plan(), text)[0].startswith("nvl0002: slurmctld has no block nvl0002")


def test_a_block_the_plan_lacks_is_named():
    text = TWO_RACKS + "BlockName=nvl0003 BlockIndex=3 Nodes=gb[0037-0038] BlockSize=18\n"
    assert problems(_plan(), text) == ["extra block nvl0003 (gb0037, gb0038)"]


def test_a_missing_aggregated_block_is_named():
    text = "\n".join(li for li in TWO_RACKS.splitlines() if not li.startswith("AggregatedBlock"))
    assert problems(_plan(), text) == ["no aggregated block nvl[0001-0002] of size 36"]


def test_an_aggregated_block_the_plan_lacks_is_named():
    text = FIVE_RACKS + "AggregatedBlock=nvl[0005-0006] BlockIndex=8 Nodes=gb[0073-0108] BlockSize=36\n"
    assert problems(_plan(90), text) == ["aggregated block nvl[0005-0006] (BlockSize=36) the plan lacks"]


def test_an_aggregated_block_of_another_size_or_nodes_is_named():
    text = TWO_RACKS.replace("Nodes=gb[0001-0036] BlockSize=36", "Nodes=gb[0001-0035] BlockSize=72")
    assert problems(_plan(), text) == ["aggregated block nvl[0001-0002]: BlockSize=72, plan 36",
                                       "aggregated block nvl[0001-0002]: missing gb0036, extra none"]


def test_a_base_block_of_another_size_is_named():
    text = TWO_RACKS.replace("gb[0001-0018] BlockSize=18", "gb[0001-0018] BlockSize=9")
    assert problems(_plan(), text) == ["base blocks not of the plan's base size 18: nvl0001 BlockSize=9"]


def test_aggregated_blocks_are_matched_by_members_not_spelling():
    text = TWO_RACKS.replace("AggregatedBlock=nvl[0001-0002]", "AggregatedBlock=nvl0001,nvl0002")
    assert problems(_plan(), text) == []


def test_parse_blocks_reads_slurm_output_as_data():
    got = checks.parse_blocks("BlockName=b1 BlockIndex=0 Nodes=(null) BlockSize=18\nSwitchName=s1 Nodes=x1\n"
                              "AggregatedBlock=b[1-2] Nodes=gb0001 BlockSize=n/a\n")
    assert got == {"b1": {"nodes": [], "size": 18, "aggregated": False},
                   "b[1-2]": {"nodes": ["gb0001"], "size": None, "aggregated": True}}


def test_truncated_lists_say_how_many_more():
    text = TWO_RACKS.replace("gb[0001-0018]", "gb0001")
    found = problems(_plan(), text)
    assert found[0].endswith("gb0009 (slurmctld has it in no block) and 9 more")


def test_tree_topology_has_no_block_expectations():
    """On topology/tree validate's block checks skip with the reason; the per-block check keeps one item for it."""
    assert _plan(topology="tree") is None
    assert _plan(line="23.11")["sizes"] == []  # BlockSizes from 24.05
    ctx = type("Ctx", (), {"doc": {"slurm": {"blocks": None, "topology": "tree"}}})()
    assert list(checks._planned_blocks(ctx, "ctl01")) == [("tree", None)]
    with pytest.raises(pytest.skip.Exception, match="topology tree: no blocks to compare"):
        checks._skip_unless_blocks(ctx.doc)


class _Ctx:
    """What the checks read of their context: the expectations, and one cached `scontrol show topology`."""

    def __init__(self, doc: dict):
        self.doc, self.asked = doc, []

    def slurm_host(self):
        return "ctl01"

    def cached(self, key, fetch):
        self.asked.append(key)
        return fetch()


def _doc(plan: dict | None, topology: str = "block") -> dict:
    return {"slurm": {"blocks": plan, "topology": topology, "version": "24.11"}}


def _run_with(monkeypatch, text: str, rc: int = 0):
    out = SimpleNamespace(rc=rc, stdout=text, stderr="slurm_load_topo error: Unable to contact slurm controller")
    monkeypatch.setattr(checks, "run", lambda host, cmd, timeout=None: out)


def test_the_check_names_host_block_and_tray(monkeypatch):
    plan = _plan()
    _run_with(monkeypatch, TWO_RACKS.replace("gb[0001-0018]", "gb[0001-0017]").replace("gb[0019-0036]",
                                                                                     "gb[0018-0036]", 1))
    ctx, target = _Ctx(_doc(plan)), SimpleNamespace(host="ctl01")
    items = dict(checks._planned_blocks(ctx, "ctl01"))
    assert list(items) == ["nvl0001", "nvl0002"]
    with pytest.raises(AssertionError, match=r"^ctl01: block nvl0001: missing gb0018 \(slurmctld has it in nvl0002\)"):
        checks.test_topology_block(ctx, target, ctx.doc, items["nvl0001"])
    with pytest.raises(AssertionError, match=r"^ctl01: block nvl0002: extra gb0018 \(the plan has it in nvl0001\)"):
        checks.test_topology_block(ctx, target, ctx.doc, items["nvl0002"])
    checks.test_topology_has_no_extra_block(ctx, target, ctx.doc)
    checks.test_topology_block_sizes(ctx, target, ctx.doc)
    assert set(ctx.asked) == {"blocks"}


def test_the_checks_pass_on_what_slurmctld_loaded(monkeypatch):
    plan = _plan()
    _run_with(monkeypatch, TWO_RACKS)
    ctx, target = _Ctx(_doc(plan)), SimpleNamespace(host="ctl01")
    for _name, item in checks._planned_blocks(ctx, "ctl01"):
        checks.test_topology_block(ctx, target, ctx.doc, item)
    checks.test_topology_has_no_extra_block(ctx, target, ctx.doc)
    checks.test_topology_block_sizes(ctx, target, ctx.doc)


def test_the_checks_report_an_extra_block_and_the_sizes(monkeypatch):
    _run_with(monkeypatch, TWO_RACKS.replace("BlockSize=36", "BlockSize=72")
              + "BlockName=nvl0009 BlockIndex=3 Nodes=gb0099 BlockSize=18\n")
    ctx, target = _Ctx(_doc(_plan())), SimpleNamespace(host="ctl01")
    with pytest.raises(AssertionError, match=r"^ctl01: slurmctld has blocks the plan lacks: nvl0009 \(gb0099\)$"):
        checks.test_topology_has_no_extra_block(ctx, target, ctx.doc)
    with pytest.raises(AssertionError, match=r"^ctl01: BlockSizes 18,36 \(topology.conf\): aggregated block "
                       r"nvl\[0001-0002\]: BlockSize=72, plan 36$"):
        checks.test_topology_block_sizes(ctx, target, ctx.doc)


def test_a_failed_scontrol_fails_with_its_message(monkeypatch):
    _run_with(monkeypatch, "", rc=1)
    ctx, target = _Ctx(_doc(_plan())), SimpleNamespace(host="ctl01")
    with pytest.raises(pytest.fail.Exception, match="ctl01: scontrol show topology failed: slurm_load_topo error"):
        checks.test_topology_has_no_extra_block(ctx, target, ctx.doc)


def test_without_block_sizes_the_sizes_check_skips(monkeypatch):
    ctx, target = _Ctx(_doc(_plan(line="23.11"))), SimpleNamespace(host="ctl01")
    with pytest.raises(pytest.skip.Exception, match=r"no BlockSizes in the rendered topology.conf"):
        checks.test_topology_block_sizes(ctx, target, ctx.doc)


# ---- fabric verify --nvlink: the as-built cliques against the plan's domains, a difference named per domain ----

@pytest.fixture
def racks(tmp_path):
    """Two NVL72 racks as built, every tray in its rack's clique (tests/test_nvlink.py's fixtures)."""
    from test_nvlink import UUID, gb200_data, smi_text

    from gpucluster.fabric import plan_cluster

    plan = plan_cluster(spec_from_data(gb200_data(racks=2)))
    folder = tmp_path / "smi"
    folder.mkdir()
    g = plan.spec.group("gb200")
    for d in plan.domains:
        for i in range(d.first, d.first + d.count):
            (folder / f"{g.host(i)}.txt").write_text(smi_text(4, str(32766 + d.index), UUID.format(d.index)))
    return plan, folder, smi_text, UUID


def _verify(plan, folder):
    from gpucluster.fabric.asbuilt import nvlink

    return nvlink.verify(plan, nvlink.discover(folder))


def test_a_split_domain_is_one_finding_naming_its_trays_and_both_cliques(racks):
    plan, folder, smi_text, uuid = racks
    for tray in ("gb0017", "gb0018"):
        (folder / f"{tray}.txt").write_text(smi_text(4, "40000", uuid.format(0)))
    found = _verify(plan, folder)
    assert [(f.kind, f.detail["domain"]) for f in found] == [("nvlink-domain-split", "nvl0001")]
    assert found[0].message == (f"domain nvl0001 (rack0007) is split: gb0017, gb0018 formed clique "
                                f"{uuid.format(0)}.40000, apart from the domain's {uuid.format(0)}.32766")


def test_a_tray_in_the_other_racks_clique_names_both_domains(racks):
    plan, folder, smi_text, uuid = racks
    (folder / "gb0018.txt").write_text(smi_text(4, "32767", uuid.format(1)))
    found = _verify(plan, folder)
    assert [(f.kind, f.detail["node"]) for f in found] == [("nvlink-wrong-domain", "gb0018")]
    assert "planned in rack0007 (domain nvl0001) but its GPUs are in the domain of nvl0002" in found[0].message


def test_domains_in_one_clique_are_named_merged(racks):
    plan, folder, smi_text, uuid = racks
    for i in range(19, 37):
        (folder / f"gb{i:04d}.txt").write_text(smi_text(4, "32766", uuid.format(0)))
    found = _verify(plan, folder)
    assert [(f.kind, f.detail["domains"]) for f in found] == [("nvlink-domains-merged", ["nvl0001", "nvl0002"])]


def test_a_tray_whose_gpus_disagree_is_named(racks):
    plan, folder, smi_text, uuid = racks
    text = smi_text(4, "32766", uuid.format(0))
    (folder / "gb0003.txt").write_text(text.replace("32766", "32799", 1))
    found = _verify(plan, folder)
    assert [(f.kind, f.detail["node"]) for f in found] == [("nvlink-no-clique", "gb0003")]
    assert "its GPUs disagree on the NVLink clique" in found[0].message


def test_a_tray_missing_is_named_with_its_domain(racks):
    plan, folder, _smi, _uuid = racks
    (folder / "gb0036.txt").unlink()
    found = _verify(plan, folder)
    assert [(f.kind, f.detail["domain"], f.detail["missing"]) for f in found] == [
        ("nvlink-domain-short", "nvl0002", ["gb0036"])]


def test_the_expectations_carry_the_blocks_on_block_topology_only():
    """expect.py hands the checks the blocks of the rendered file of the compiled facts, on block topology."""
    from gpucluster.compiled import facts
    from gpucluster.render import render_all
    from gpucluster.validate import expect

    for topology in ("block", "tree"):
        data = example_data("gb200-superpod")
        next(g for g in data["node_groups"] if g["name"] == "gb200")["count"] = 36
        data["slurm"].update(topology=topology)
        cluster = compiled(spec_from_data(data))
        rendered = {k: v if isinstance(v, str) else "".join(v())
                    for k, v in render_all(cluster, cabling=False).items()}
        slurm = expect._slurm(facts(cluster, rendered)["slurm"], {}, [], rendered)
        if topology == "block":
            assert [b["name"] for b in slurm["blocks"]["blocks"]] == ["nvl0001", "nvl0002"]
        else:
            assert slurm["blocks"] is None
