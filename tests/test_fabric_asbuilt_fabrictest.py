"""`fabric test`, the pure part: pairs by tier, thresholds from the plan, and localisation of slow
results, on synthetic result matrices. The runner here is a model of a fabric with one fault (a test
stand-in for the Slurm jobs of asbuilt/jobs.py): it answers each case with what that fabric would measure."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from gpucluster.cluster import cluster_of, load_cluster
from gpucluster.errors import UsageError
from gpucluster.fabric.asbuilt import fabrictest as ft
from gpucluster.spec.loader import validate_data

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from conftest import generic_spec  # noqa: E402


def example(name):
    return load_cluster(ROOT / "examples" / f"{name}.yaml").plan


def plan_of(data):
    return cluster_of(validate_data(data, {}, Path("gen.yaml"))).plan


@pytest.fixture(scope="module")
def meta_ib():
    return example("meta-24k-ib")


@pytest.fixture(scope="module")
def small_rail():
    """2 tiers, 4 units of 16 nodes, 4 rails: small enough to run every case through a model."""
    return plan_of(generic_spec(64, radix=32, rails=4, design="rail-optimized", unit=16))


@pytest.fixture(scope="module")
def small_3tier():
    return plan_of(generic_spec(96, radix=16, rails=1, tiers=3, unit=8, pod=32))


# ---- thresholds -------------------------------------------------------------------------------------

def test_threshold_is_speed_x_rails_x_efficiency(meta_ib):
    tr = ft.TRANSPORTS["nccl"]
    # 8 x 400G at 0.85: 340 GB/s, under the published 350-390 GB/s all_reduce bus bandwidth across nodes
    assert ft.threshold(meta_ib, "spine", tr) == round(400 * 8 * 0.85 / 8, 1) == 340.0
    assert ft.threshold(meta_ib, "rail", tr) == round(400 * 0.85 / 8, 1)
    assert ft.threshold(meta_ib, "spine", tr, efficiency=0.5) == 200.0


@pytest.mark.parametrize("busbw", [350.0, 355.5, 369.9, 370.0, 390.0])
def test_healthy_8x400g_h100_pairs_pass_the_default_bar(meta_ib, busbw):
    """The published healthy range of 8 x 400G H100 all_reduce busbw across nodes is 350-390 GB/s (~370
    typical): the default bar sits below all of it, so no healthy pair fails."""
    case = next(c for c in ft.cases(meta_ib, ["leaf"]))
    assert not ft.Outcome(case, busbw).slow


def test_a_node_down_one_rail_fails_the_default_bar(meta_ib):
    case = next(c for c in ft.cases(meta_ib, ["leaf"]))
    assert ft.Outcome(case, round(370 * 7 / 8, 1)).slow  # one of eight 400G rails gone: ~324 GB/s


def test_threshold_divides_by_the_oversubscription_crossed():
    plan = example("meta-24k-roce")  # leaf 1:1, spine 7:1 (the zone aggregation layer)
    spine_ratio = plan.tier("spine").down / plan.tier("spine").up
    tr = ft.TRANSPORTS["nccl"]
    assert ft.threshold(plan, "leaf", tr) == ft.threshold(plan, "spine", tr) == 340.0
    assert ft.threshold(plan, "core", tr) == pytest.approx(340.0 / spine_ratio, abs=0.1)
    assert ft.threshold(plan, "all", tr) == ft.threshold(plan, "core", tr)


def test_staging_stand_in_threshold_from_the_staging_nic():
    plan = example("staging")
    tr = ft.TRANSPORTS["iperf3"]
    assert tr.stand_in and tr.unit == "Gb/s"
    assert ft.threshold(plan, "leaf", tr) == plan.speed_gbps * plan.rails * tr.efficiency


def test_efficiency_must_be_a_fraction(meta_ib):
    with pytest.raises(UsageError, match="efficiency"):
        ft.threshold(meta_ib, "leaf", ft.TRANSPORTS["nccl"], efficiency=1.5)


# ---- pairs -------------------------------------------------------------------------------------------

def unit_of(plan):
    return {h: u for u in plan.units for h in ft.unit_hosts(plan, u)}


@pytest.mark.parametrize("tier", ["leaf", "spine", "core"])
def test_pairs_cross_exactly_their_tier(small_3tier, tier):
    plan = small_3tier
    where = unit_of(plan)
    cases = ft.cases(plan, [tier])
    assert cases
    for c in cases:
        a, b = (where[n] for n in c.nodes)
        assert a.name == b.name if tier == "leaf" else a.name != b.name
        if tier == "spine":
            assert a.pod == b.pod
        if tier == "core":
            assert a.pod != b.pod


def test_every_node_is_tested_under_its_leaf(small_3tier):
    plan = small_3tier
    tested = {n for c in ft.cases(plan, ["leaf"]) for n in c.nodes}
    assert tested == set(unit_of(plan))


def test_rounds_share_no_node(meta_ib):
    """Cases of one round run at the same time: across every tier and rail, no node twice in a round."""
    rounds: dict[int, Counter] = {}
    for c in ft.cases(meta_ib):
        rounds.setdefault(c.round, Counter()).update(c.nodes)
    assert all(max(r.values()) == 1 for r in rounds.values())
    assert len(rounds) == sum(t["rounds"] for t in ft.summary(meta_ib)["tiers"].values())


def test_rail_cases_only_on_rail_optimised_fabrics(small_rail, small_3tier):
    rails = ft.cases(small_rail, ["rail"])
    assert {c.rail for c in rails} == set(range(small_rail.rails))
    assert all(c.threshold == ft.threshold(small_rail, "rail", ft.TRANSPORTS["nccl"], lanes=1) for c in rails)
    assert ft.cases(small_3tier, ["rail"]) == []


def test_whole_cluster_case(small_rail):
    (case,) = ft.cases(small_rail, ["all"])
    assert set(case.nodes) == set(unit_of(small_rail))


def test_round_robin_is_every_pair_once():
    nodes = [f"n{i}" for i in range(7)]
    rounds = ft.round_robin(nodes)
    pairs = [frozenset(p) for r in rounds for p in r]
    assert len(pairs) == len(set(pairs)) == 7 * 6 // 2
    assert all(len({n for p in r for n in p}) == 2 * len(r) for r in rounds)


# ---- localisation on synthetic matrices -------------------------------------------------------------

class Model:
    """A fabric with one fault, answering every case like a healthy one would (just above the bar,
    scaled by the efficiency) except where the fault slows it."""

    def __init__(self, plan, bad_node=None, bad_uplink=None, bad_rail=None, factor=0.5):
        self.plan, self.bad_node, self.bad_uplink, self.bad_rail, self.factor = \
            plan, bad_node, bad_uplink, bad_rail, factor
        self.unit = {h: u.name for h, u in unit_of(plan).items()}
        self.calls = 0

    def value(self, case) -> float:
        healthy = case.threshold * 1.04
        if self.bad_node in case.nodes:
            return healthy * self.factor
        crosses = case.tier in ("spine", "core", "rail", "all")
        units = {self.unit[n] for n in case.nodes}
        if crosses and self.bad_uplink in units and (self.bad_rail is None or case.rail in (None, self.bad_rail)):
            return healthy * (self.factor if case.rail is not None or self.bad_rail is None else 7 / 8)
        return healthy

    def run(self, cases):
        self.calls += 1
        return [ft.Outcome(c, round(self.value(c), 1)) for c in cases]


def test_healthy_fabric_passes(small_rail):
    verdict = ft.run_test(small_rail, Model(small_rail))
    assert verdict.ok and verdict.suspects == [] and verdict.followups == []


def test_a_node_slow_with_every_partner_is_named(small_rail):
    node = ft.unit_hosts(small_rail, small_rail.units[1])[5]
    verdict = ft.run_test(small_rail, Model(small_rail, bad_node=node))
    assert [(s.kind, s.name) for s in verdict.suspects] == [("node", node)]
    assert all(node in e for e in verdict.suspects[0].evidence)


def test_a_bad_uplink_is_named_after_a_bisection(small_rail):
    """In 2 tiers unit 0 only meets unit 1 across the spine: one round cannot tell them apart, the
    follow-up cases (each side with a node that tested fine) do."""
    bad = small_rail.units[0].name
    model = Model(small_rail, bad_uplink=bad)
    verdict = ft.run_test(small_rail, model)
    assert [(s.kind, s.name) for s in verdict.suspects] == [("uplink", bad)]
    assert model.calls > len({c.round for c in ft.cases(small_rail)})  # the follow-ups ran


def test_one_rails_uplink_is_named_by_its_rail_leaf(small_rail):
    unit = small_rail.units[2]
    model = Model(small_rail, bad_uplink=unit.name, bad_rail=3)
    verdict = ft.run_test(small_rail, model)
    assert [(s.kind, s.name) for s in verdict.suspects] == [("uplink", f"{unit.name}-r3")]


def test_core_tier_settles_uplinks_without_follow_ups(small_3tier):
    bad = small_3tier.units[0].name
    model = Model(small_3tier, bad_uplink=bad)
    verdict = ft.run_test(small_3tier, model, tiers=("leaf", "spine", "core"))
    assert [(s.kind, s.name) for s in verdict.suspects] == [("uplink", bad)]


def test_single_slow_pair_is_ambiguous_and_gets_follow_ups(small_rail):
    a, b = ft.unit_hosts(small_rail, small_rail.units[0])[:2]
    leaf_case = next(c for c in ft.cases(small_rail, ["leaf"]) if c.nodes == (a, b))
    outcomes = [ft.Outcome(c, c.threshold * (0.3 if c == leaf_case else 1.05)) for c in ft.cases(small_rail, ["leaf"])]
    verdict = ft.localise(small_rail, outcomes)
    assert [(s.kind, s.name) for s in verdict.suspects] == [("pair", f"{a} / {b}")]
    assert sorted(n for c in verdict.followups for n in c.nodes if n in (a, b)) == [a, b]
    assert all(len(set(c.nodes) & {a, b}) == 1 for c in verdict.followups)


def test_pairwise_matrix_finds_the_bad_node():
    nodes = [f"n{i}" for i in range(6)]
    plan = plan_of(generic_spec(8, radix=16, rails=1, unit=8))
    hosts = ft.unit_hosts(plan, plan.units[0])[:6]
    case = ft.Case("leaf", ("x", "y"), 100.0, "GB/s")
    outcomes = [ft.Outcome(ft.Case("leaf", p, case.threshold, case.unit, where=(plan.units[0].name,) * 2),
                           40.0 if hosts[3] in p else 110.0)
                for r in ft.round_robin(hosts) for p in r]
    verdict = ft.localise(plan, outcomes)
    assert [(s.kind, s.name) for s in verdict.suspects] == [("node", hosts[3])]
    assert len(verdict.suspects[0].evidence) == len(nodes) - 1


# ---- cases that gave no figure ----------------------------------------------------------------------

class Lossy(Model):
    """The model fabric, but some cases give no figure (a node down, a job that printed none)."""

    def __init__(self, plan, lost):
        super().__init__(plan)
        self.lost = set(lost)

    def run(self, cases):
        return [o for o in super().run(cases) if o.case not in self.lost]


def test_a_case_that_gave_no_figure_fails_the_verdict(small_rail):
    lost = [c for c in ft.cases(small_rail, ["leaf", "spine"]) if c.tier == "spine"][3]
    verdict = ft.run_test(small_rail, Lossy(small_rail, [lost]), tiers=("leaf", "spine"))
    assert verdict.unmeasured == [lost]
    assert not verdict.ok
    assert verdict.suspects == [] and all(not o.slow for o in verdict.outcomes)  # nothing measured was slow


def test_a_whole_cluster_case_that_gave_no_figure_fails_the_verdict(small_rail):
    lost = [c for c in ft.cases(small_rail, ["leaf", "all"]) if c.tier == "all"]
    verdict = ft.run_test(small_rail, Lossy(small_rail, lost), tiers=("leaf", "all"))
    assert verdict.unmeasured == lost and not verdict.ok


def test_fabric_test_exits_1_and_names_the_cases_it_could_not_measure(tmp_path, monkeypatch, capsys):
    """The CLI end: `fabric test` on an inventory, its Slurm engine replaced by the model fabric (this
    machine has no cluster), one pair's node down: exit 1 and a line naming the pair and why."""
    from gpucluster import cli
    from gpucluster.fabric.asbuilt import slurmrun

    spec = ROOT / "examples" / "staging.yaml"
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  vars:\n    gpucluster_spec: {spec}\n"
                   "  children:\n    slurm_controller:\n      hosts:\n        ctl01: {}\n")
    plan = load_cluster(spec).plan
    lost = ft.cases(plan, ["leaf"], "iperf3")[0]

    class NodeDown(Model):  # as SlurmRunner does for a node sinfo says is down: a failure, no outcome
        def __init__(self, plan):
            super().__init__(plan)
            self.failures = []

        def run(self, cases):
            for c in cases:
                if c == lost:
                    self.failures.append(slurmrun.Failure(c, f"not run: {c.nodes[1]} is down*"))
            return [o for o in super().run(cases) if o.case != lost]

    def engine(plan, inv, settings, *, tiers, wanted, efficiency, log):
        runner = NodeDown(plan)
        verdict = ft.run_test(plan, runner, tiers, "iperf3", efficiency)
        return slurmrun.TestRun(plan.spec.name, "iperf3", "the model fabric", verdict, runner.failures, ["1"],
                                "ctl01", {})

    monkeypatch.setattr(slurmrun, "run_fabric_test", engine)
    rc = cli.main(["fabric", "test", str(inv), "--tier", "leaf"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert f"not measured: leaf {lost.nodes[0]} - {lost.nodes[1]}: not run: {lost.nodes[1]} is down*" in out
    assert "the fabric test failed" in out
    lost = None  # nothing lost: the same run passes
    assert cli.main(["fabric", "test", str(inv), "--tier", "leaf"]) == 0
