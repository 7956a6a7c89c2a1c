"""validate's block checks on a real slurmctld: the emulator (docs/slurm-versions.md) loads the GB200 example's
rendered block topology, 2 racks of 18 trays (tests/test_nvlink_blocks_emulated.py's cluster), on each line with
topology/block (24.11 from the trixie root, 26.05 from the sid root). What slurmctld reports agrees with the
expectations validate builds from the plan; then a topology file with one tray moved to the other rack's block is
loaded (slurmctld restarted on it) and the checks name the tray and both blocks. Before 25.05 slurmctld refuses a
block smaller than the base size ('fatal: Block configuration (nvl0001) children count lower than
bblock_node_cnt'), so on 24.11 the moved tray's place is taken by the first tray of the other block: two trays
crossed, both named."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import hostlist
import pytest
from test_blocks_compare import checks  # validate's Slurm checks, loaded as a module once
from test_nvlink_blocks_emulated import two_racks

from gpucluster.validate.expect import _blocks

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]


def _rendered(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in out.iterdir() if p.name in ("topology.conf", "topology.yaml")}


@pytest.fixture(scope="module", params=["24.11", "26.05"])
def emulated(request, tmp_path_factory) -> Iterator:
    line = request.param
    out = tmp_path_factory.mktemp(f"vblocks-{line}")
    with two_racks(line, out) as (_cluster, trays, sc):
        yield out, trays, sc, line


def _problems(plan: dict, text: str) -> list[str]:
    got = checks.parse_blocks(text)
    found = [f"block {b['name']}: {p}" for b in plan["blocks"] for p in checks.block_problems(b, plan["blocks"], got)]
    found += [f"extra block {e}" for e in checks.extra_blocks(plan["blocks"], got)]
    return found + checks.aggregation_problems(plan, got)


def test_the_rendered_blocks_load_and_agree(emulated) -> None:
    out, _trays, sc, _line = emulated
    plan = _blocks(_rendered(out), "block")
    assert [b["name"] for b in plan["blocks"]] == ["nvl0001", "nvl0002"] and plan["sizes"] == [18, 36]
    assert _problems(plan, sc.scontrol("show", "topology")) == []


def test_a_tray_moved_to_the_other_block_is_named(emulated, tmp_path) -> None:
    """The last tray of nvl0001 written into nvl0002 (on 24.11 crossed with nvl0002's first): slurmctld loads it
    (restarted on the file), and the checks say nvl0001 misses the tray, which slurmctld has in nvl0002, and
    nvl0002 has it extra, which the plan has in nvl0001."""
    from gpucluster.spec.slurm_versions import has

    out, trays, sc, line = emulated
    plan = _blocks(_rendered(out), "block")
    one, two = (b["nodes"] for b in plan["blocks"])
    tray, back = one[-1], ([] if has(line, "block-below-base") else [two[0]])
    new_one, new_two = [*one[:-1], *back], [tray, *(n for n in two if n not in back)]
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    for name, text in _rendered(out).items():
        text = text.replace(hostlist.collect_hostlist(two), hostlist.collect_hostlist(new_two))
        (moved / name).write_text(text.replace(hostlist.collect_hostlist(one), hostlist.collect_hostlist(new_one)))
    try:
        sc.load_config(moved, trays)
        sc.restart_slurmctld()
        problems = _problems(plan, sc.scontrol("show", "topology"))
    finally:
        sc.load_config(out, trays)
        sc.restart_slurmctld()
    want = [f"block nvl0001: missing {tray} (slurmctld has it in nvl0002)"]
    want += [f"block nvl0001: extra {n} (the plan has it in nvl0002)" for n in back]
    want += [f"block nvl0002: missing {n} (slurmctld has it in nvl0001)" for n in back]
    want += [f"block nvl0002: extra {tray} (the plan has it in nvl0001)"]
    assert problems == want
    assert _problems(plan, sc.scontrol("show", "topology")) == []
