"""The NVLink domain guard (node/domainguard.py) without daemons: its decision, one parametrized case per rule; its
changes in Slurm through a stand-in Session (the breaker's hold, a tray changed between read and update, one update
for the whole domain); the node runner's side (a tray drained with its domain is never resumed by its own passing
runs, and has no lifecycle state); the spec field (refused out of range with file:line and a fix) and what renders.
The same decision on a real slurmctld: tests/test_domain_guard_emulated.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import compiled, example_data, example_text, line_of, spec_from_data

from gpucluster.node import breaker, decide, domainguard, nodestate, runner
from gpucluster.render.health import domainconf, rolefiles

D = "nvl0001"
TRAYS = [f"gb{i:04d}" for i in range(1, 19)]
PCT = 25.0
OURS = f"gpc:domain:{D} 5 of 18 trays out of service (more than 25%)"
IMEX = "gpc:nvlink-fabric: nvidia-imex.service is failed"


def slurm(**states: tuple[str, str]) -> dict[str, dict[str, str]]:
    """Slurm's view: every tray IDLE with no reason, except those given as tray=(State, reason)."""
    out = {t: {"NodeName": t, "State": "IDLE", "reason": ""} for t in TRAYS}
    for tray, (state, reason) in states.items():
        out[tray] = {"NodeName": tray, "State": state, "reason": reason}
    return out


def drained(trays: list[str], reason: str, state: str = "IDLE+DRAIN") -> dict[str, tuple[str, str]]:
    return {t: (state, reason) for t in trays}


CASES = {
    "all in service": (slurm(), PCT, "none", []),
    "one tray drained by its check: the domain keeps taking jobs": (
        slurm(**drained(TRAYS[:1], "gpc:nvlink-fabric: GPU 1: 17 of 18 NVLinks up")), PCT, "none", []),
    "4 of 18 out (22 %): not more than 25 %": (
        slurm(**drained(TRAYS[:4], "gpc:gpu-count: 3 of 4 GPUs")), PCT, "none", []),
    "5 of 18 out (28 %): the other 13 drain": (
        slurm(**drained(TRAYS[:5], "gpc:gpu-count: 3 of 4 GPUs")), PCT, "drain", TRAYS[5:]),
    "out by anyone: by hand, down, failed, draining": (
        slurm(**{TRAYS[0]: ("IDLE+DRAIN", "RMA 4711"), TRAYS[1]: ("DOWN+NOT_RESPONDING", "Not responding"),
                 TRAYS[2]: ("FAIL", "bad board"), TRAYS[3]: ("MIXED+DRAIN", "gpc:disk-tmp: full"),
                 TRAYS[4]: ("DOWN", "")}), PCT, "drain", TRAYS[5:]),
    "a running tray is drained too (drain: its job keeps running)": (
        slurm(**drained(TRAYS[:5], "RMA"), **{TRAYS[9]: ("ALLOCATED", "")}), PCT, "drain", TRAYS[5:]),
    "a tray Slurm does not list counts as out": (
        {t: i for t, i in slurm(**drained(TRAYS[:4], "RMA")).items() if t != TRAYS[17]}, PCT, "drain",
        TRAYS[4:17]),
    "its own drains do not count: healthy again, exactly its trays resume": (
        slurm(**drained(TRAYS[:4], "RMA"), **drained(TRAYS[4:17], OURS), **{TRAYS[17]: ("IDLE", "")}), PCT,
        "resume", TRAYS[4:17]),
    "another domain's reason is neither ours nor resumed": (
        slurm(**drained(TRAYS[:5], "gpc:domain:nvl0002 9 of 18 trays out of service"),
              **drained(TRAYS[5:7], OURS)), PCT, "drain", TRAYS[7:]),
    "still degraded: our drained trays stay, nothing left to drain": (
        slurm(**drained(TRAYS[:5], "RMA"), **drained(TRAYS[5:], OURS)), PCT, "none", []),
    "our tray that went DOWN counts as out": (
        slurm(**drained(TRAYS[:4], "RMA"), **drained(TRAYS[4:5], OURS, "DOWN+DRAIN"),
              **drained(TRAYS[5:], OURS)), PCT, "none", []),
    "IMEX quorum lost: 9 of 18 without IMEX, share not passed (60 %)": (
        slurm(**drained(TRAYS[:5], IMEX), **drained(TRAYS[5:9], "", "DOWN+NOT_RESPONDING")), 60.0, "drain",
        TRAYS[9:]),
    "IMEX quorum held: 8 of 18 without IMEX (60 %)": (
        slurm(**drained(TRAYS[:4], IMEX), **drained(TRAYS[4:8], "", "DOWN")), 60.0, "none", []),
    "drained for another nvlink-fabric fault is not IMEX (60 %)": (
        slurm(**drained(TRAYS[:9], "gpc:nvlink-fabric: GPU 0: CliqueId 0 (in no clique)")), 60.0, "none", []),
    "hand-drained and other gpc: trays never resumed": (
        slurm(**drained(TRAYS[:2], "RMA 4711"), **drained(TRAYS[2:4], "gpc:gpu-ecc: GPU 3"),
              **drained(TRAYS[4:10], OURS)), PCT, "resume", TRAYS[4:10]),
}


@pytest.mark.parametrize("case", CASES.values(), ids=[n.replace(" ", "-") for n in CASES])
def test_the_domain_verdict(case) -> None:
    nodes, pct, action, changed = case
    v = domainguard.decide_domain(D, TRAYS, nodes, pct)
    assert (v.action, list(v.nodes)) == (action, changed), v
    if action == "drain":
        assert v.reason.startswith(f"gpc:domain:{D} ") and decide.check_of(v.reason) == "domain"
        assert len(v.reason) <= decide.MAX_REASON and "\n" not in v.reason
    if action == "resume":
        assert all(nodes[t]["reason"] == OURS for t in changed)


def test_the_reason_says_why() -> None:
    v = domainguard.decide_domain(D, TRAYS, slurm(**drained(TRAYS[:5], "RMA")), PCT)
    assert v.reason == f"gpc:domain:{D} 5 of 18 trays out of service (more than 25%)"
    v = domainguard.decide_domain(D, TRAYS, slurm(**drained(TRAYS[:9], "", "DOWN")), 60.0)
    assert v.reason == f"gpc:domain:{D} IMEX quorum lost (9 of 18 trays without IMEX)"


@pytest.mark.parametrize(("out", "trays", "pct", "over"), [
    (4, 18, 25.0, False), (5, 18, 25.0, True), (1, 4, 25.0, False), (2, 4, 25.0, True), (9, 18, 50.0, False),
    (10, 18, 50.0, True), (0, 18, 0.1, False), (1, 18, 0.1, True)])
def test_more_than_the_share(out, trays, pct, over) -> None:
    assert domainguard.over_share(out, trays, pct) is over


@pytest.mark.parametrize(("without", "trays", "lost"), [(8, 18, False), (9, 18, True), (1, 3, False),
                                                         (2, 3, True), (0, 0, False)])
def test_imex_quorum(without, trays, lost) -> None:
    assert domainguard.imex_lost(without, trays) is lost


# ---------------------------------------------------------------- in Slurm, through a stand-in Session


class FakeCtl:
    """scontrol as the guard calls it: show node (the trays, then again right before the change), show
    reservation, update. `after` is what the re-read sees (an operator's change in between)."""

    def __init__(self, nodes, after=None, latch=False, group_out=0):
        self.nodes, self.after, self.latch, self.calls = nodes, after, latch, []
        self.group = {**nodes, **{f"gbx{i}": {"NodeName": f"gbx{i}", "State": "IDLE+DRAIN", "reason": "RMA"}
                                  for i in range(group_out)}}
        self.reads = 0

    def reservations(self):
        latch = [{"ReservationName": "gpc_breaker_gb200.x", "Licenses": "gpc_breaker_gb200:1"}] if self.latch else []
        return latch, ""

    def show_nodes(self, hostlist):
        if hostlist == "gb[0001-0036]":
            return self.group, ""
        self.reads += 1
        return {t: i for t, i in (self.after or self.nodes).items() if t in hostlist.split(",")}, ""

    def call(self, args):
        self.calls.append(args)
        return 0, ""


SETTINGS = breaker.Settings(group="gb200", nodes="gb[0001-0036]", size=36, drains=2, out_of_service=18,
                            window_minutes=60)


def test_a_drain_is_one_update_of_the_domain_with_its_reason() -> None:
    nodes = slurm(**drained(TRAYS[:5], "RMA"))
    ctl = FakeCtl(nodes)
    v = domainguard.decide_domain(D, TRAYS, nodes, PCT)
    out = domainguard.apply(ctl, v, nodes, SETTINGS)
    assert out["applied"] is True and out["breaker"].startswith("within the breaker's limit: 18 of 36"), out
    assert ctl.calls == [["update", f"nodename={','.join(TRAYS[5:])}", "state=drain", f"reason={v.reason}"]]


def test_a_resume_is_one_undrain_of_exactly_its_trays() -> None:
    nodes = slurm(**drained(TRAYS[:2], "RMA"), **drained(TRAYS[2:], OURS))
    ctl = FakeCtl(nodes)
    out = domainguard.apply(ctl, domainguard.decide_domain(D, TRAYS, nodes, PCT), nodes, SETTINGS)
    assert out["applied"] is True and ctl.calls == [["update", f"nodename={','.join(TRAYS[2:])}", "state=undrain"]]


@pytest.mark.parametrize(("latch", "group_out", "why"), [
    (True, 0, "held by the breaker: open since"),
    (False, 1, "held by the breaker: draining 13 more would put 19 of 36 nodes out of service (limit 18)")])
def test_the_breaker_holds_a_domain_drain_whole(latch, group_out, why) -> None:
    nodes = slurm(**drained(TRAYS[:5], "RMA"))
    ctl = FakeCtl(nodes, latch=latch, group_out=group_out)
    out = domainguard.apply(ctl, domainguard.decide_domain(D, TRAYS, nodes, PCT), nodes, SETTINGS)
    assert out["action"] == "held" and out["breaker"].startswith(why), out
    assert ctl.calls == []  # nothing changed in Slurm; no token, no latch


def test_a_tray_changed_since_the_read_is_left_as_the_operator_set_it() -> None:
    nodes = slurm(**drained(TRAYS[:2], "RMA"), **drained(TRAYS[2:], OURS))
    after = {**nodes, TRAYS[3]: {"NodeName": TRAYS[3], "State": "IDLE+DRAIN", "reason": "RMA 4712"}}
    ctl = FakeCtl(nodes, after=after)
    out = domainguard.apply(ctl, domainguard.decide_domain(D, TRAYS, nodes, PCT), nodes, SETTINGS)
    kept = [t for t in TRAYS[2:] if t != TRAYS[3]]
    assert out["nodes"] == kept and ctl.calls == [["update", f"nodename={','.join(kept)}", "state=undrain"]]


# ---------------------------------------------------------------- the tray's own runs


def test_a_trays_passing_runs_never_lift_its_domain_drain() -> None:
    assert "domain" not in runner.resumable([{"name": "nvlink-fabric"}], OURS)
    d = decide.decide("IDLE+DRAIN", OURS, [], 5, 3, runner.resumable([{"name": "nvlink-fabric"}], OURS))
    assert d.action == "none"
    d = runner.with_domain(OURS, d, [])
    assert d is not None and d.action == "none" and "domain guard" in d.why


def test_a_domain_drained_tray_that_fails_is_drained_for_its_own_check() -> None:
    d = decide.decide("IDLE+DRAIN", OURS, [("gpu-count", "3 of 4 GPUs")], 0, 3, {"gpu-count"})
    assert d.action == "drain" and d.reason.startswith("gpc:gpu-count: ")
    assert runner.with_domain(OURS, d, [("gpu-count", "3 of 4 GPUs")]) is None


def test_a_domain_drain_is_no_lifecycle_state() -> None:
    assert nodestate.current("IDLE+DRAIN", OURS, nodestate.PRODUCTION) is None
    assert nodestate.current("IDLE+DRAIN", "gpc:gpu-count: 3 of 4", nodestate.PRODUCTION) == nodestate.TRIAGE


# ---------------------------------------------------------------- the spec and what renders


def _gb200(count: int = 36, **health):
    data = example_data("gb200-superpod")
    next(g for g in data["node_groups"] if g["name"] == "gb200")["count"] = count
    if health:
        data["health"] = health
    return compiled(spec_from_data(data))


def test_the_rendered_config_names_every_domain_and_its_trays() -> None:
    cluster = _gb200(nvlink_domain={"out_of_service_pct": 30})
    files = domainconf.files(cluster)
    assert set(files) == {"domains.json", *domainconf.UNITS}
    config = json.loads(files["domains.json"])
    g = cluster.spec.group("gb200")
    assert config["out_of_service_pct"] == 30 and config["groups"] == {"gb200": g.hostlist}
    assert [(d["name"], d["trays"]) for d in config["domains"]] == [
        (d.name, [g.host(i) for i in range(d.first, d.first + d.count)]) for d in cluster.plan.domains]
    assert config["breakers"]["gb200"]["size"] == 36
    assert f"{domainconf.LIB_DIR}/domainguard.py --config {domainconf.CONFIG}" in files[domainconf.UNITS[0]]
    assert rolefiles.facts(cluster)["domain_guard"][domainconf.CONFIG] == "domains.json"


@pytest.mark.parametrize("health", [{"nvlink_domain": {"enabled": False}}, {"enabled": False}])
def test_nothing_renders_with_the_guard_or_health_off(health) -> None:
    cluster = _gb200(**health)
    assert domainconf.files(cluster) == {} and rolefiles.facts(cluster)["domain_guard"] == {}


def test_a_cluster_without_nvlink_domains_ignores_the_field() -> None:
    data = example_data("staging")
    data["health"] = {**data.get("health", {}), "nvlink_domain": {"out_of_service_pct": 40}}
    cluster = compiled(spec_from_data(data))
    assert not cluster.plan.domains and domainconf.files(cluster) == {}


@pytest.mark.parametrize(("value", "rule", "fix"), [("0", "[greater_than]", "more than 0"),
                                                     ("100", "[less_than]", "less than 100"),
                                                     ("25%", "[float_parsing]", "write a number")])
def test_a_share_out_of_range_is_refused_with_file_line_and_a_fix(value, rule, fix, tmp_path) -> None:
    text = example_text("gb200-superpod")
    assert "\nhealth:" not in text
    line = f"  nvlink_domain: {{out_of_service_pct: {value}}}"
    text += f"health:\n{line}\n"
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "check", str(path)], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [e for e in res.stderr.splitlines() if e.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    assert errors[0].startswith(f"error: {path}:{line_of(text, line)}: health.nvlink_domain.out_of_service_pct: ")
    assert rule in errors[0] and fix in errors[0], errors[0]
