"""`gpucluster health status`: parsing Slurm's own output (captured from Slurm 22.05.8, tests/data/health/)
and the nodes' state files, and the report: drained nodes by reason, by whom, since when, last checks."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import ClassVar

import pytest

from gpucluster.health import status
from gpucluster.node.slurmctl import parse_node, parse_nodes

DATA = Path(__file__).resolve().parent / "data" / "health"
SHOW = (DATA / "scontrol-show-node-o.txt").read_text()
SINFO = (DATA / "sinfo-R-format.txt").read_text()


def node_table(show_o: str) -> str:
    """The node table the controller sends (22.05's `sinfo --json` shape) for the nodes of a captured
    `scontrol show node -o`: the same states, reasons, users and times."""
    nodes = []
    for n in parse_nodes(show_o).values():
        base, *flags = n["State"].split("+")
        when = int(time.mktime(time.strptime(n["reason_time"], "%Y-%m-%dT%H:%M:%S"))) if n["reason_time"] else 0
        nodes.append({"name": n["NodeName"], "state": base.lower(), "state_flags": flags, "reason": n["reason"],
                      "reason_set_by_user": n["reason_user"], "reason_changed_at": when})
    return json.dumps({"meta": {}, "errors": [], "nodes": nodes})


SHOW_JSON = node_table(SHOW)


def test_scontrol_lines_keep_reasons_whole() -> None:
    nodes = parse_nodes(SHOW)
    assert sorted(nodes) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert (nodes["gpu01"]["State"], nodes["gpu01"]["reason"]) == ("IDLE+DRAIN", "gpc:gpu-count: 3 of 4 GPUs")
    assert (nodes["gpu01"]["reason_user"], nodes["gpu01"]["reason_time"]) == ("root", "2026-11-23T01:23:51")
    assert nodes["gpu02"]["reason"] == "maintenance by hand"
    assert nodes["gpu03"]["State"] == "MIXED+DRAIN"
    assert nodes["gpu03"]["reason"] == "gpc:mount-flash: /mnt/flash not mounted (+1 more)"
    assert nodes["gpu04"]["State"] == "DOWN+DRAIN"
    # Fields before Reason are intact, values with spaces (OS=Linux 6.x #1 SMP ...) included.
    assert nodes["gpu01"]["Partitions"] == "batch" and nodes["gpu01"]["CPUTot"] == "2"


def test_a_reason_holding_equals_signs_and_brackets() -> None:
    line = ("NodeName=gpu09 State=IDLE+DRAIN Partitions=p Reason=gpc:disk-spool: free=3% [of 2 GiB] < 5% "
            "[root@2026-11-23T01:23:51] Comment=(null)")
    node = parse_node(line)
    assert node["reason"] == "gpc:disk-spool: free=3% [of 2 GiB] < 5%"
    assert node["reason_user"] == "root" and node["Comment"] == "(null)" and node["State"] == "IDLE+DRAIN"
    assert parse_node("NodeName=gpu10 State=IDLE Partitions=p")["reason"] == ""


def test_sinfo_reasons_expand_hostlists() -> None:
    got = status.parse_sinfo_reasons(SINFO)
    assert got["gpu02"] == {"time": "2026-11-23T01:23:51", "user": "root", "state": "drained",
                            "reason": "maintenance by hand"}
    assert got["gpu03"]["state"] == "draining"
    grouped = status.parse_sinfo_reasons("2026-11-23T01:23:51|root|gpu[05-07,09]|drained|gpc:munge: x|y\n")
    assert sorted(grouped) == ["gpu05", "gpu06", "gpu07", "gpu09"]
    assert grouped["gpu09"]["reason"] == "gpc:munge: x|y"


def state_file(action: str, checks: dict, started: float = 1795397421.0) -> dict:
    return {"node": "x", "started": started, "action": action, "why": "w",
            "checks": {n: {"ok": ok, "message": m, "since": started - 600, "last": started}
                       for n, (ok, m) in checks.items()}}


@pytest.fixture
def rows() -> list[status.NodeStatus]:
    states = {"gpu01": state_file("drain", {"gpu-count": (False, "3 of 4 GPUs"), "munge": (True, "ok")}),
              "gpu02": state_file("none", {"gpu-count": (True, "4 of 4"), "munge": (True, "ok")})}
    return status.merge(SHOW_JSON, SINFO, states, {"gpu04": "ssh: connect to host gpu04 port 22: No route to host"},
                        ["gpu01", "gpu02", "gpu03", "gpu04"])


def test_merge_says_who_drained_each_node(rows) -> None:
    by = {r.name: (r.drained, r.by) for r in rows}
    assert by == {"gpu01": (True, "gpucluster"), "gpu02": (True, "operator"), "gpu03": (True, "gpucluster"),
                  "gpu04": (True, "gpucluster")}
    assert rows[0].checks["gpu-count"]["message"] == "3 of 4 GPUs"


def test_report_groups_drained_nodes_by_reason(rows) -> None:
    text = status.format_status(rows, now=1795397421.0 + 30)
    assert text.startswith("drained: 4 of 4 nodes\n")
    assert "  maintenance by hand\n    gpu02: since 2026-11-23T01:23:51 by root (drained by hand: never resumed" in text
    assert "  gpc:gpu-count: 3 of 4 GPUs\n    gpu01: since 2026-11-23T01:23:51 by root (resumed by gpucluster" in text
    assert "  gpu01 [IDLE+DRAIN] 30s ago: drain (w)\n    FAIL gpu-count: 3 of 4 GPUs (since " in text
    assert "    ok: munge\n" in text
    assert "  gpu03: no health run recorded\n" in text
    assert "  gpu04: state file not read: ssh: connect to host gpu04" in text


def test_json_output_is_one_record_per_node(rows) -> None:
    records = json.loads(status.as_json(rows))
    assert [r["name"] for r in records] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert records[1]["by"] == "operator" and records[0]["drained"] is True


def test_broken_state_file_reads_as_no_run() -> None:
    assert status.parse_state_file("{truncated") == {} and status.parse_state_file("[1]") == {}


def test_an_active_check_that_could_not_run_reads_not_run(rows) -> None:
    rows[1].checks["dcgm-diag"] = {"ok": False, "not_run": True, "active": True, "since": 1795397421.0,
                                   "message": "not run: dcgmi is not installed (no DCGM on this node)"}
    text = status.format_status(rows, now=1795397421.0 + 30)
    assert "    NOT RUN dcgm-diag: not run: dcgmi is not installed (no DCGM on this node) (since " in text
    assert "dcgm-diag" not in text.split("NOT RUN dcgm-diag")[1].split("\n")[1]  # never listed as ok


def test_the_node_table_is_what_status_asks_for_and_anything_else_is_refused() -> None:
    from gpucluster import slurmtext

    assert status.SHOW_NODES[:2] == ["sh", "-c"] and "scontrol --json show node" in status.SHOW_NODES[2]
    with pytest.raises(slurmtext.SlurmOutputError, match=r"^scontrol --json show node .*: not JSON"):
        status.merge(SHOW, SINFO, {})
    with pytest.raises(slurmtext.SlurmOutputError, match=r"line 1: .* is not TIME\|USER"):
        status.parse_sinfo_reasons("a\n" + SINFO)


# ---------------------------------------------------------------- the circuit breaker in status and reset-breaker

BREAKER_RES = (
    "ReservationName=gpc_drain_gpu01 StartTime=2026-11-28T13:00:00 Flags=ANY_NODES Users=root "
    "Licenses=gpc_drain_gpu:1 State=ACTIVE\n"
    "ReservationName=gpc_breaker_gpu.2_drains_in_60_min.mount-flash_on_3_nodes StartTime=2026-11-28T13:01:00 "
    "Flags=ANY_NODES Users=root Licenses=gpc_breaker_gpu:1 State=ACTIVE\n"
    "ReservationName=maint StartTime=2026-11-28T13:00:00 Flags=MAINT Users=root Licenses=(null) State=ACTIVE\n")
BREAKER_LIC = ("LicenseName=gpc_breaker_gpu Total=1 Used=0 Free=1 Reserved=1 Remote=no\n"
               "LicenseName=gpc_drain_gpu Total=2 Used=0 Free=2 Reserved=1 Remote=no\n")


def test_the_report_shows_each_groups_breaker(rows) -> None:
    from gpucluster.health import breakerstate

    breakers = breakerstate.breakers(BREAKER_RES, BREAKER_LIC)
    text = status.format_breakers(breakers)
    assert text == ("circuit breaker:\n  gpu: OPEN since 2026-11-28T13:01:00: 2 drains in 60 min; mount-flash on 3 "
                    "nodes (drain tokens 1 of 2 used in this window; gpucluster health reset-breaker INVENTORY "
                    "--group gpu)\n")
    doc = status.report_json(rows, breakers)
    assert [r["name"] for r in doc["nodes"]] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert doc["breakers"][0]["state"] == "open" and doc["breakers"][0]["tokens_used"] == 1


class FakeSlurm:
    """slurmclient.Client on the controller: answers scontrol from BREAKER_RES; refuses to delete `refuse`."""

    calls: ClassVar[list] = []
    refuse = ""

    def __init__(self, host, timeout=0):
        self.where = "ctl01"

    def check(self, argv):
        FakeSlurm.calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, BREAKER_RES, "")

    def __call__(self, argv):
        FakeSlurm.calls.append(list(argv))
        rc = 1 if argv[-1] == FakeSlurm.refuse else 0
        return subprocess.CompletedProcess(argv, rc, "", "Requested reservation is invalid" * rc)


@pytest.mark.parametrize("refuse", ["", "gpc_drain_gpu01"])
def test_reset_breaker_deletes_the_latch_and_the_tokens_on_the_controller(monkeypatch, refuse) -> None:
    from gpucluster.health import remote
    from gpucluster.inventory import reader
    from gpucluster.slurmclient import SlurmError

    monkeypatch.setattr(reader, "load_inventory", lambda path: object())
    monkeypatch.setattr(remote, "slurm_host", lambda inv, purpose, groups=(): groups)
    monkeypatch.setattr(remote, "Client", FakeSlurm)
    FakeSlurm.calls, FakeSlurm.refuse = [], refuse
    latch = "gpc_breaker_gpu.2_drains_in_60_min.mount-flash_on_3_nodes"
    if refuse:
        with pytest.raises(SlurmError, match="gpc_drain_gpu01 on ctl01 failed"):
            remote.reset_breaker("inv", "gpu")
    else:
        assert remote.reset_breaker("inv", "gpu") == ["gpc_drain_gpu01", latch]
    assert FakeSlurm.calls == [["scontrol", "show", "reservation", "-o"],
                               ["scontrol", "delete", "reservation", "gpc_drain_gpu01"],
                               ["scontrol", "delete", "reservation", latch]]  # the rest is still tried
    FakeSlurm.calls = []
    assert remote.reset_breaker("inv", "h100") == [] and len(FakeSlurm.calls) == 1


def test_fleet_report_reads_the_breakers_from_the_same_host(monkeypatch) -> None:
    from gpucluster.health import breakerstate, remote
    from gpucluster.inventory import reader

    answers = {tuple(status.SHOW_NODES): SHOW_JSON, tuple(status.SINFO_REASONS): SINFO,
               tuple(breakerstate.RESERVATIONS): BREAKER_RES, tuple(breakerstate.LICENSES): BREAKER_LIC}

    class Answering(FakeSlurm):
        def check(self, argv):
            FakeSlurm.calls.append(list(argv))
            return subprocess.CompletedProcess(argv, 0, answers[tuple(argv)], "")

    class Inventory:
        hosts: ClassVar[dict] = {}

        def select(self, limit):
            return []

        def group(self, name):
            return []

    monkeypatch.setattr(reader, "load_inventory", lambda path: Inventory())
    monkeypatch.setattr(remote, "slurm_host", lambda inv, purpose, groups=(): None)
    monkeypatch.setattr(remote, "Client", Answering)
    FakeSlurm.calls = []
    rows, breakers = remote.fleet_report("inv")
    assert rows == [] and [b.group for b in breakers] == ["gpu"] and breakers[0].open
    assert sorted(map(tuple, FakeSlurm.calls)) == sorted(answers)
