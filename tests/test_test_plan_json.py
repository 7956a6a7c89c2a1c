"""`fabric test-plan --json`: the full form is streamed case by case yet byte-identical to the json.dump of one
big object it replaced, and `--summary` gives the per-tier counts alone, equal to counting the cases."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gpucluster.cli import main
from gpucluster.cluster import load_cluster
from gpucluster.fabric.asbuilt import fabrictest
from gpucluster.fabric.asbuilt.fabrictest import Case

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["staging", "meta-24k-roce", "gb200-superpod"]


def old_json(doc: dict, cases: list[Case]) -> str:
    """What `fabric test-plan --json` wrote before streaming (2451b17): one object, json.dump, indent=1."""
    whole = dict(doc, cases=[{"tier": c.tier, "nodes": list(c.nodes), "rail": c.rail, "round": c.round,
                              "threshold": c.threshold, "unit": c.unit} for c in cases])
    return json.dumps(whole, indent=1)


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("transport", ["nccl", "iperf3"])
def test_streamed_json_is_byte_identical_to_the_one_big_dump(name, transport):
    plan = load_cluster(ROOT / "examples" / f"{name}.yaml").plan
    doc = fabrictest.summary(plan, transport)
    out = io.StringIO()
    fabrictest.write_json(doc, fabrictest.iter_cases(plan, fabrictest.TIERS, transport), out)
    assert out.getvalue() == old_json(doc, fabrictest.cases(plan, fabrictest.TIERS, transport))


@pytest.mark.parametrize("doc, cases", [
    ({}, []),
    ({"a": 1}, []),
    ({"a": [], "b": {"c": None}}, [Case("all", (), 1.5, "GB/s")]),
    ({"x": "é"}, [Case("rail", ("n\"1", "ü2"), 42.5, "Gb/s", 7, 3), Case("leaf", ("a",), 1e-07, "GB/s")]),
])
def test_streamed_json_matches_json_dump_at_the_edges(doc, cases):
    out = io.StringIO()
    fabrictest.write_json(doc, iter(cases), out)
    assert out.getvalue() == old_json(doc, cases)


class Writes(io.StringIO):
    """Counts the cases taken from the generator at each write."""

    def __init__(self, taken: list[int]) -> None:
        super().__init__()
        self.taken, self.at = taken, []

    def write(self, s: str) -> int:
        self.at.append(self.taken[0])
        return super().write(s)


def test_the_full_form_is_written_while_the_cases_are_still_being_made():
    plan = load_cluster(ROOT / "examples" / "meta-24k-roce.yaml").plan
    taken = [0]

    def counted():
        for c in fabrictest.iter_cases(plan):
            taken[0] += 1
            yield c

    out = Writes(taken)
    fabrictest.write_json({"k": 1}, counted(), out)
    total = taken[0]
    assert total > 4000
    written_early = [n for n in out.at if 0 < n < total]
    assert len(written_early) >= total // 2048, (total, out.at[:10])  # a write every 1,024 cases, not one at the end


@pytest.mark.parametrize("name", SMALL + ["meta-24k-ib"])
def test_the_summary_counts_what_the_cases_are(name):
    plan = load_cluster(ROOT / "examples" / f"{name}.yaml").plan
    counted: dict[str, dict] = {}
    for c in fabrictest.cases(plan):
        t = counted.setdefault(c.tier, {"threshold": c.threshold, "cases": 0, "rounds": set()})
        t["cases"] += 1
        t["rounds"].add(c.round)
    tiers = fabrictest.summary(plan)["tiers"]
    assert list(tiers) == list(counted)
    for tier, t in counted.items():
        assert (tiers[tier]["threshold"], tiers[tier]["cases"], tiers[tier]["rounds"]) == (
            t["threshold"], t["cases"], len(t["rounds"]))


def test_summary_flag_prints_the_tiers_without_the_cases(capsys):
    spec = str(ROOT / "examples" / "meta-24k-roce.yaml")
    assert main(["fabric", "test-plan", spec, "--tier", "spine", "--json", "--summary"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert main(["fabric", "test-plan", spec, "--tier", "spine", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert "cases" not in short and list(short["tiers"]) == ["spine"]
    assert short == {k: v for k, v in full.items() if k != "cases"}
    assert len(full["cases"]) == short["tiers"]["spine"]["cases"]
