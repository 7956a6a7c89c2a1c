"""The circuit breaker without a slurmctld: its limits from the spec, the parsing of scontrol's reservation,
license and node output (lines as Slurm 22.05, 24.11 and 26.05 printed them on the emulator), the decision
of node/breaker.admit against a stand-in session that keeps a license count the way slurmctld does, and
the controller side (health status rows, reset-breaker's commands). The real slurmctld runs in
tests/test_health_breaker_emulated.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.health import breakerstate as fleet
from gpucluster.node import breaker, slurmctl
from gpucluster.render.health import breakerconf as render
from gpucluster.render.health import slurmconf

ROOT = Path(__file__).resolve().parent.parent
# `scontrol show reservation -o` and `show license -o` lines as the emulator's 24.11 printed them
TOKEN_LINE = ("ReservationName=gpc_drain_gpu001 StartTime=2026-11-28T13:22:03 EndTime=2026-11-28T14:22:03 "
              "Duration=01:00:00 Nodes=(null) NodeCnt=0 CoreCnt=0 Features=(null) PartitionName=(null) "
              "Flags=ANY_NODES TRES=(null) Users=root Groups=(null) Accounts=(null) Licenses=gpc_drain_gpu:1 "
              "State=ACTIVE BurstBuffer=(null) MaxStartDelay=(null)")
LATCH = "gpc_breaker_gpu.25_drains_in_60_min.mount-flash_on_26_nodes"
LATCH_LINE = (f"ReservationName={LATCH} StartTime=2026-11-28T13:22:07 "
              "EndTime=2027-11-28T13:22:07 Duration=365-00:00:00 Nodes=(null) NodeCnt=0 CoreCnt=0 Features=(null) "
              "PartitionName=(null) Flags=ANY_NODES TRES=(null) Users=root Groups=(null) Accounts=(null) "
              "Licenses=gpc_breaker_gpu:1 State=ACTIVE BurstBuffer=(null) MaxStartDelay=(null) "
              "Comment=drain budget spent (25 drains in 60 min); shared cause: mount-flash on 26 nodes")
LICENSES = ("LicenseName=gpc_breaker_gpu Total=1 Used=0 Free=1 Reserved=1 Remote=no\n"
            "LicenseName=gpc_drain_gpu Total=25 Used=0 Free=25 Reserved=1 Remote=no\n"
            "LicenseName=gpc_active Total=4 Used=0 Free=4 Reserved=0 Remote=no\n")


# ---------------------------------------------------------------- limits from the spec


@pytest.mark.parametrize(("nodes", "pct", "floor", "want"), [
    (512, 5.0, 2, 25),  # 25.6 rounded down
    (512, 10.0, 2, 51),
    (30, 10.0, 2, 3),  # exactly 3, not 2.9999...
    (1000, 0.3, 2, 3),
    (4, 5.0, 2, 2),  # 0.2: the floor
    (20, 5.0, 1, 1),
    (2048, 5.0, 2, 102),
    (3000, 2.3, 2, 69),  # 3000 * 2.3 / 100 in floats is 68.99999999999999
])
def test_a_limit_is_the_share_rounded_down_and_at_least_the_floor(nodes, pct, floor, want) -> None:
    assert render.limit(nodes, pct, floor) == want


def _cluster(tmp_path: Path, breaker_yaml: str = ""):
    text = (ROOT / "examples" / "meta-24k-roce.yaml").read_text()
    if breaker_yaml:
        text = text.replace("fabric:\n", f"health:\n  breaker: {breaker_yaml}\nfabric:\n", 1)
    (tmp_path / "s.yaml").write_text(text)
    return load_cluster(tmp_path / "s.yaml")


def test_the_config_keys_and_licenses_come_from_the_spec(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, "{drains_pct: 2.5, out_of_service_pct: 7, min_nodes: 3, window_minutes: 30}")
    group = cluster.spec.groups_with_role("compute")[0]
    keys = render.config_keys(cluster, group.name)["breaker"]
    drains, oos = int(group.count * 2.5 // 100), int(group.count * 7 // 100)
    assert keys == {"enabled": True, "group": group.name, "nodes": group.hostlist, "size": group.count,
                    "drains": drains, "out_of_service": oos, "window_minutes": 30}
    assert f"gpc_drain_{group.name}:{drains}" in render.license_entries(cluster)
    assert f"gpc_breaker_{group.name}:1" in render.license_entries(cluster)
    # one Licenses= line in slurm.conf's health lines, holding the breaker's licenses
    lines = [ln for ln in slurmconf.slurm_conf_lines(cluster) if ln.startswith("Licenses=")]
    assert lines == [f"Licenses={','.join(render.license_entries(cluster))}"]
    assert breaker.settings(render.config_keys(cluster, group.name)).drains == drains


def test_a_breaker_switched_off_renders_no_license_and_admits_every_drain(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, "{enabled: false}")
    group = cluster.spec.groups_with_role("compute")[0].name
    assert render.license_entries(cluster) == []
    assert not any(ln.startswith("Licenses=") for ln in slurmconf.slurm_conf_lines(cluster))
    assert breaker.admit(FakeCtl({}), render.config_keys(cluster, group), "n1", "x") == (
        True, "no circuit breaker configured")


# ---------------------------------------------------------------- parsing scontrol's output


def test_reservations_parse_and_a_hostile_comment_is_data() -> None:
    evil = LATCH_LINE.replace("Licenses=gpc_breaker_gpu:1", "Licenses=other:1").replace(
        "Comment=drain", "Comment=x Licenses=gpc_breaker_gpu:1 ReservationName=fake Users=evil drain")
    got = slurmctl.parse_reservations("\n".join([TOKEN_LINE, evil, "ReservationName=fake Licenses=(null)",
                                                 " Licenses=gpc_breaker_gpu:1 continued"]))
    assert [r["ReservationName"] for r in got] == ["gpc_drain_gpu001", LATCH, "fake"]
    assert slurmctl.licenses_of(got[0]) == {"gpc_drain_gpu": 1}
    assert slurmctl.licenses_of(got[1]) == {"other": 1}  # the comment's Licenses= is not read
    assert got[1]["Users"] == "root" and got[1]["Comment"].startswith("x Licenses=gpc_breaker_gpu:1")
    assert slurmctl.licenses_of(got[2]) == {}
    assert breaker.latch_of(got, "gpu") is None


def test_the_latch_is_found_by_its_license_and_says_why() -> None:
    res = slurmctl.parse_reservations(f"{TOKEN_LINE}\n{LATCH_LINE}\n")
    latch = breaker.latch_of(res, "gpu")
    assert latch is not None and latch["StartTime"] == "2026-11-28T13:22:07"
    assert breaker.latch_why(latch, "gpu").endswith("shared cause: mount-flash on 26 nodes")
    assert breaker.latch_of(res, "gp") is None  # another group's license is not a prefix match
    no_comment = {**latch, "Comment": ""}  # 22.05 has no Comment: the name carries the cause
    assert breaker.latch_why(no_comment, "gpu") == "25 drains in 60 min; mount-flash on 26 nodes"


def test_license_totals() -> None:
    assert slurmctl.parse_license_total(LICENSES, "gpc_drain_gpu") == 25
    assert slurmctl.parse_license_total(LICENSES, "gpc_drain_x") is None
    assert fleet.license_totals(LICENSES) == {"gpc_breaker_gpu": 1, "gpc_drain_gpu": 25, "gpc_active": 4}


@pytest.mark.parametrize(("state", "out"), [
    ("IDLE", False), ("IDLE+CLOUD+POWERED_DOWN", False), ("MIXED", False), ("IDLE+NOT_RESPONDING", False),
    ("IDLE+DRAIN", True), ("MIXED+DRAIN", True), ("DOWN+NOT_RESPONDING", True), ("DOWN+CLOUD+POWERED_DOWN", True),
    ("ALLOCATED+FAIL", True), ("idle+drain", True),
])
def test_out_of_service_is_a_whole_state_word(state, out) -> None:
    assert breaker.out_of_service(state) is out


def test_the_shared_cause_counts_the_groups_gpc_drains_and_this_check() -> None:
    nodes = {f"n{i}": {"State": "IDLE+DRAIN", "reason": "gpc:mount-flash: /mnt/flash did not answer"}
             for i in range(5)}
    nodes.update({"h1": {"State": "DOWN", "reason": "gpc:mount-flash: hand-written down, not drained"},
                  "h2": {"State": "IDLE+DRAIN", "reason": "RMA 4711"},
                  "g1": {"State": "IDLE+DRAIN", "reason": "gpc:gpu-count: 7 of 8"},
                  "me": {"State": "IDLE", "reason": ""}})
    assert breaker.shared_cause(nodes, "mount-flash", "me") == ("mount-flash", 6)
    assert breaker.shared_cause(nodes, "disk-tmp", "me") == ("mount-flash", 5)
    assert breaker.shared_cause({"a": {"State": "IDLE+DRAIN", "reason": "gpc:b: x"}}, "c", "me") == ("c", 1)


# ---------------------------------------------------------------- admit() against a stand-in slurmctld


class FakeCtl:
    """The Session calls admit() makes, over an in-memory slurmctld: licenses with a count, reservations that
    take one each, refused past the count ("Invalid license specification") or by name; nodes by name."""

    def __init__(self, nodes: dict, licenses: dict | None = None, comment: bool = True) -> None:
        self.nodes, self.licenses, self.comment = nodes, dict(licenses or {}), comment
        self.res: dict[str, dict[str, str]] = {}
        self.calls: list[str] = []
        self.broken: set[str] = set()

    def reservations(self):
        self.calls.append("reservations")
        return (None, "slurm_load_reservations error") if "reservations" in self.broken else \
            (list(self.res.values()), "")

    def show_nodes(self, hostlist):
        self.calls.append(f"show_nodes {hostlist}")
        return (None, "timed out") if "show_nodes" in self.broken else (dict(self.nodes), "")

    def license_total(self, name):
        return self.licenses.get(name), ""

    def reserve(self, name, license, duration, comment=""):
        self.calls.append(f"reserve {name}")
        if name in self.res:
            return 1, "Error creating the reservation: Duplicate reservation name"
        held = sum(1 for r in self.res.values() if r["Licenses"] == f"{license}:1")
        if held >= self.licenses.get(license, 0):
            return 1, "Error creating the reservation: Invalid license specification"
        self.res[name] = {"ReservationName": name, "Licenses": f"{license}:1", "StartTime": "2026-11-28T13:00:00",
                          "Duration": duration, "Comment": comment if self.comment else ""}
        return 0, f"Reservation created: {name}"


def config(size: int = 20, drains: int = 2, oos: int = 3) -> dict:
    return {"breaker": {"enabled": True, "group": "gpu", "nodes": f"gpu[01-{size:02d}]", "size": size,
                        "drains": drains, "out_of_service": oos, "window_minutes": 60}}


def group(size: int = 20, **states: str) -> dict:
    return {f"gpu{i:02d}": {"State": "IDLE", "reason": ""} for i in range(1, size + 1)} | {
        n: {"State": s.split("|")[0], "reason": s.partition("|")[2]} for n, s in states.items()}


LIC = {"gpc_drain_gpu": 2, "gpc_breaker_gpu": 1}


def test_drains_take_tokens_until_the_budget_is_spent_then_the_latch_holds_the_rest() -> None:
    ctl = FakeCtl(group(), LIC)
    assert breaker.admit(ctl, config(), "gpu01", "mount-flash")[0]
    assert breaker.admit(ctl, config(), "gpu02", "mount-flash")[0]
    ctl.nodes.update({n: {"State": "IDLE+DRAIN", "reason": "gpc:mount-flash: slow"} for n in ("gpu01", "gpu02")})
    ok, why = breaker.admit(ctl, config(), "gpu03", "mount-flash")
    assert not ok and "opened it" in why and "drain budget spent (2 drains in 60 min)" in why
    assert "shared cause: mount-flash on 3 nodes" in why
    latch = breaker.latch_of(list(ctl.res.values()), "gpu")
    assert latch["ReservationName"] == "gpc_breaker_gpu.2_drains_in_60_min.mount-flash_on_3_nodes"
    assert latch["Duration"] == "UNLIMITED"
    # open: every later drain is held after one read, nothing else asked
    ctl.calls.clear()
    ok, why = breaker.admit(ctl, config(), "gpu04", "gpu-count")
    assert not ok and why.startswith("held by the breaker: open since 2026-11-28T13:00:00: drain budget spent")
    assert ctl.calls == ["reservations"]
    # a node holding its token of the window is not held by the budget (it counts once)
    del ctl.res[latch["ReservationName"]]
    assert breaker.admit(ctl, config(), "gpu01", "mount-flash") == (
        True, "this node's drain token of the window (gpc_drain_gpu01) is still held")


def test_out_of_service_share_opens_it_before_any_token_and_hand_drains_count() -> None:
    ctl = FakeCtl(group(gpu05="IDLE+DRAIN|RMA 4711", gpu06="DOWN+NOT_RESPONDING|Not responding",
                        gpu07="IDLE+CLOUD+POWERED_DOWN|"), {"gpc_drain_gpu": 10, "gpc_breaker_gpu": 1})
    assert breaker.admit(ctl, config(oos=3), "gpu01", "disk-tmp")[0]  # 2 out of service: under 3
    ctl.nodes["gpu08"] = {"State": "MIXED+DRAIN", "reason": "gpc:disk-tmp: full"}
    ok, why = breaker.admit(ctl, config(oos=3), "gpu02", "disk-tmp")
    assert not ok and "3 of 20 nodes out of service (limit 3)" in why and "disk-tmp on 2 nodes" in why
    assert "reserve gpc_drain_gpu02" not in ctl.calls


def test_the_node_itself_is_not_counted_out_of_service() -> None:
    ctl = FakeCtl(group(gpu01="DOWN|x", gpu02="IDLE+DRAIN|y"), LIC)
    assert breaker.admit(ctl, config(oos=2), "gpu01", "munge")[0]


def test_a_second_opener_finds_the_latch_taken_and_slurm_conf_without_licenses_holds() -> None:
    ctl = FakeCtl(group(), {"gpc_drain_gpu": 0, "gpc_breaker_gpu": 1})
    assert "opened it" in breaker.admit(ctl, config(), "gpu01", "x")[1]
    # a race: this node read no latch, and another node's latch took the only license before it asked
    ctl.res.clear()
    ctl.licenses["gpc_breaker_gpu"] = 0
    ok, why = breaker.admit(ctl, config(), "gpu02", "x")
    assert not ok and "another node opened it first" in why
    ok, why = breaker.admit(FakeCtl(group(), {}), config(), "gpu01", "x")
    assert not ok and "slurm.conf has no license gpc_drain_gpu" in why


@pytest.mark.parametrize("broken", ["reservations", "show_nodes"])
def test_a_breaker_that_cannot_be_read_holds(broken) -> None:
    ctl = FakeCtl(group(), LIC)
    ctl.broken.add(broken)
    ok, why = breaker.admit(ctl, config(), "gpu01", "x")
    assert not ok and why.startswith("held by the breaker:") and not ctl.res


def test_hostile_reasons_are_data_in_the_latch() -> None:
    bad = "gpc:x; rm -rf /$(id) `reboot`\n=Licenses=gpc_breaker_gpu:9: boom"
    ctl = FakeCtl(group(**{f"gpu{i:02d}": f"IDLE+DRAIN|{bad}" for i in range(2, 6)}),
                  {"gpc_drain_gpu": 0, "gpc_breaker_gpu": 1})
    ok, why = breaker.admit(ctl, config(oos=10), "gpu01", "x; rm -rf /$(id) `reboot`\n=Licenses=gpc_breaker_gpu")
    (latch,) = ctl.res.values()
    assert not ok and all(ch.isalnum() or ch in "._-" for ch in latch["ReservationName"])
    assert "\n" not in why and "`reboot`" in why  # the summary keeps the text, on one line
    assert "\n" not in latch["Comment"] and len(latch["Comment"]) <= breaker.MAX_COMMENT


# ---------------------------------------------------------------- the scontrol calls (a stand-in scontrol)


def test_reserve_asks_for_a_licenses_only_reservation_and_drops_comment_where_unknown(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n"
                    f'printf "%s\\n" "$*" >> {log}\n'
                    'case "$*" in *Comment=*) echo "scontrol: error: Unknown parameter Comment=x" >&2; exit 1;; esac\n'
                    'echo "Reservation created: $3"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    ctl = slurmctl.Session({"PATH": f"{tmp_path}:{os.environ['PATH']}"}, munge_key=None)
    rc, text = ctl.reserve("gpc_breaker_gpu.x", "gpc_breaker_gpu", "UNLIMITED", comment="why it opened")
    assert rc == 0, text
    first, second = log.read_text().splitlines()
    assert second == ("create reservation ReservationName=gpc_breaker_gpu.x Licenses=gpc_breaker_gpu:1 "
                      "StartTime=now Duration=UNLIMITED Users=root Flags=ANY_NODES")
    assert first == f"{second} Comment=why it opened"


# ---------------------------------------------------------------- the controller side


def test_status_rows_and_reset_commands() -> None:
    reservations = f"{TOKEN_LINE}\n{LATCH_LINE}\n" + TOKEN_LINE.replace("gpc_drain_gpu001", "gpc_drain_gpu002")
    rows = fleet.breakers(reservations, LICENSES)
    assert [r.as_json() for r in rows] == [{
        "group": "gpu", "state": "open", "since": "2026-11-28T13:22:07",
        "why": "drain budget spent (25 drains in 60 min); shared cause: mount-flash on 26 nodes",
        "latch": LATCH, "tokens_used": 2, "tokens": 25,
        "token_reservations": ["gpc_drain_gpu001", "gpc_drain_gpu002"]}]
    text = fleet.format_breakers(rows)
    assert "  gpu: OPEN since 2026-11-28T13:22:07: drain budget spent" in text and "2 of 25 used" in text
    assert fleet.format_breakers(fleet.breakers(TOKEN_LINE, LICENSES)) == (
        "circuit breaker:\n  gpu: closed (drain tokens 1 of 25 used in this window)\n")
    assert fleet.reset_commands(reservations, "gpu") == [
        ["scontrol", "delete", "reservation", n] for n in
        ("gpc_drain_gpu001", LATCH, "gpc_drain_gpu002")]
    assert fleet.reset_commands(reservations, "h100") == []
    assert len(fleet.reset_commands(reservations)) == 3
    assert json.dumps(rows[0].as_json())
