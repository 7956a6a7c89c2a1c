"""The reboot rung of the GPU error ladder through the runner: a reboot-class error (XID 79) asks Slurm once for
`scontrol reboot ASAP nextstate=RESUME reason="gpc:gpu-xid: ..."`, through the circuit breaker like a drain; record,
drain and service classes never do; a pending reboot is not asked again; a node drained by hand, or by another
check, is never rebooted; a reboot Slurm refuses falls back to the drain.

The scontrol here is tests/test_health_runner.py's stand-in, taught `reboot` (the node becomes
<base>+DRAIN+REBOOT_REQUESTED with the reason, as slurmctld shows an ASAP reboot) and the reservations the breaker
reads and makes. tests/test_health_reboot_emulated.py asks the real slurmctld and watches the node reboot.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_health_runner import FAKE_SCONTROL, node  # noqa: F401 - the runner fixture, shared
from test_health_xid import X13, X79

from gpucluster.node import breaker, runner

REASON_79 = "gpc:gpu-xid: XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): reboot"
# The stand-in's other calls: `reboot` (refused when scontrol.noreboot exists, as slurmctld refuses a cluster
# without RebootProgram), and reservations kept one line each in scontrol.res (the breaker's tokens and latch).
REBOOT_SCONTROL = FAKE_SCONTROL.replace(  # a drain keeps the state's other flags (REBOOT_REQUESTED, FAIL)
    'node = {"state": base + "+DRAIN", "reason": kv["reason"]}',
    'node = {"state": node["state"] + ("" if "DRAIN" in node["state"] else "+DRAIN"), "reason": kv["reason"]}',
) + r'''
elif args[0] == "reboot":
    import os
    if os.path.exists(sys.argv[0] + ".noreboot"):
        print("slurm_reboot error: Unexpected message received", file=sys.stderr)
        sys.exit(1)
    kv = dict(a.split("=", 1) for a in args[1:-1] if "=" in a)
    node = {"state": node["state"].split("+")[0] + "+DRAIN+REBOOT_REQUESTED", "reason": kv.get("reason", "")}
    json.dump(node, open(db, "w"))
elif args[:2] == ["show", "reservation"]:
    import os
    res = sys.argv[0] + ".res"
    print(open(res).read() if os.path.exists(res) else "No reservations in the system")
elif args[:2] == ["create", "reservation"]:
    kv = dict(a.split("=", 1) for a in args[2:])
    open(sys.argv[0] + ".res", "a").write("ReservationName=" + kv["ReservationName"] + " StartTime=2026-11-28T13:22:03"
                                          + " Licenses=" + kv["Licenses"] + " State=ACTIVE\n")
'''
BREAKER = {"enabled": True, "group": "gpu", "nodes": "gpu07", "size": 64, "drains": 3, "out_of_service": 6,
           "window_minutes": 60}
LATCH = ("ReservationName=gpc_breaker_gpu.3_drains_in_60_min.gpu-xid_on_4_nodes StartTime=2026-11-28T13:22:07 "
         "Licenses=gpc_breaker_gpu:1 State=ACTIVE\n")


@pytest.fixture
def gpu(node):  # noqa: F811 - node is the shared fixture
    """The runner's node with a gpu-xid check on a kernel log file, and the stand-in that knows `reboot`."""
    scontrol = node.tmp / "bin" / "scontrol"
    scontrol.write_text(REBOOT_SCONTROL.replace("{line}", str(Path(__file__).parent / "data" / "health"
                                                              / "scontrol-show-node-o.txt")))
    node.log = node.tmp / "kern.log"
    node.log.write_text("")

    def configure(xid_actions: dict | None = None, **extra) -> None:
        node.write_config(checks=[{"name": "gpu-xid", "kind": "gpu-xid", "kernel_log": str(node.log), "timeout": 5,
                                   "xid_actions": xid_actions or {}}], check_timeout=5, run_budget=10, **extra)

    def logged(*lines: str) -> None:
        with node.log.open("a") as fh:
            fh.write("".join(f"{line}\n" for line in lines))

    def calls(verb: str) -> list[str]:
        log = node.tmp / "bin" / "scontrol.log"
        words = verb.split(" ")
        return [x for x in log.read_text().splitlines() if x.split(" ")[:len(words)] == words] if log.exists() else []

    node.configure, node.logged, node.calls = configure, logged, calls
    node.reservations = node.tmp / "bin" / "scontrol.res"
    configure()
    return node


def test_a_reboot_class_error_asks_slurm_for_one_reboot_asap(gpu) -> None:
    gpu.logged(X79)
    res = gpu.run()
    assert res.returncode == 0, res.stderr
    assert gpu.calls("reboot") == [f"reboot ASAP nextstate=RESUME reason={REASON_79} {gpu.name}"]
    assert gpu.updates == []  # ASAP drains the node itself: no separate drain
    assert gpu.in_slurm == {"state": "IDLE+DRAIN+REBOOT_REQUESTED", "reason": REASON_79}
    state = gpu.state
    assert (state["action"], state["applied"], state["ladder"], state["reason"]) == ("reboot", True, "reboot",
                                                                                      REASON_79)
    assert state["why"].startswith("gpu-xid asks for a reboot")


@pytest.mark.parametrize("state", ["IDLE+DRAIN+REBOOT_REQUESTED", "MIXED+DRAIN+REBOOT_REQUESTED",
                                   "DOWN+DRAIN+REBOOT_ISSUED", "IDLE+REBOOT"])
def test_a_pending_reboot_is_not_asked_again(gpu, state: str) -> None:
    gpu.logged(X79)
    gpu.slurm(state, REASON_79)
    gpu.run()
    gpu.run()
    assert gpu.calls("reboot") == [] and gpu.state["ladder"] == "reboot"
    assert gpu.in_slurm["reason"] == REASON_79


def test_the_run_after_the_request_leaves_the_pending_reboot_alone(gpu) -> None:
    gpu.logged(X79)
    gpu.run()
    gpu.run()  # the error stays open until the boot; the reboot is pending: once is enough
    gpu.run()
    assert len(gpu.calls("reboot")) == 1 and gpu.updates == []
    assert gpu.state["action"] == "none" and gpu.state["checks"]["gpu-xid"]["ok"] is False


@pytest.mark.parametrize(("line", "overrides", "slurm"), [
    (X13, {}, {"state": "IDLE", "reason": ""}),  # record: stays in service
    (X13, {"13": "drain"}, {"state": "IDLE+DRAIN",
                            "reason": "gpc:gpu-xid: XID 13 on 0000:cb:00.0 (Graphics Engine Exception): drain"}),
    (X79, {"79": "service"}, {"state": "IDLE+DRAIN",  # service-required: a reason no passing run lifts
                              "reason": "gpc:service: gpu-xid: XID 79 on 0000:3b:00.0 (GPU has fallen off the bus): "
                                        "service"}),
], ids=["record", "drain", "service"])
def test_record_drain_and_service_classes_never_reboot(gpu, line: str, overrides: dict, slurm: dict) -> None:
    gpu.configure(overrides)
    gpu.logged(line)
    gpu.run()
    assert gpu.calls("reboot") == []
    assert gpu.in_slurm == slurm


@pytest.mark.parametrize(("state", "reason"), [
    ("IDLE+DRAIN", "RMA 4711: GPU 3 to be replaced"),
    ("MIXED+DRAIN", "RMA 4711: GPU 3 to be replaced"),
], ids=["drained", "draining"])
def test_a_node_taken_out_by_hand_is_never_rebooted(gpu, state: str, reason: str) -> None:
    gpu.logged(X79)
    gpu.slurm(state, reason)
    gpu.run()
    gpu.run()
    assert gpu.calls("reboot") == [] and gpu.updates == []
    assert gpu.in_slurm == {"state": state, "reason": reason}


@pytest.mark.parametrize(("state", "reason"), [
    ("DOWN", "Not responding"),  # Slurm's own
    ("IDLE+DRAIN", "gpc:disk-tmp: /tmp 1.0% free"),  # another check's drain: RESUME would lift it
    ("IDLE+DRAIN", "gpc:dcgm-diag: Fail"),  # an active check's: only a person resumes it
], ids=["down", "another-check", "active-check"])
def test_a_node_out_of_service_for_another_reason_is_not_rebooted(gpu, state: str, reason: str) -> None:
    """Not on this run (the drain decision stands: decide.py rewrites a gpc: reason for the check now failing)."""
    gpu.logged(X79)
    gpu.slurm(state, reason)
    gpu.run()
    assert gpu.calls("reboot") == [] and gpu.state["action"] == "drain"


def test_a_node_drained_by_gpu_xid_is_rebooted_once_a_reboot_class_error_follows(gpu) -> None:
    gpu.configure({"13": "drain"})
    gpu.logged(X13)
    gpu.run()
    assert gpu.in_slurm["state"] == "IDLE+DRAIN" and gpu.calls("reboot") == []
    gpu.logged(X79)
    gpu.run()
    assert gpu.calls("reboot") == [f"reboot ASAP nextstate=RESUME reason={REASON_79} {gpu.name}"]


def test_the_breaker_gives_a_token_before_the_reboot(gpu) -> None:
    gpu.configure(breaker=BREAKER)
    gpu.logged(X79)
    gpu.run()
    log = (gpu.tmp / "bin" / "scontrol.log").read_text().splitlines()
    create = next(i for i, x in enumerate(log) if x.startswith("create reservation"))
    reboot = next(i for i, x in enumerate(log) if x.startswith("reboot "))
    assert create < reboot and f"ReservationName={breaker.token_name(gpu.name)}" in log[create]
    assert gpu.state["breaker"].startswith(f"drain token {breaker.token_name(gpu.name)} taken")


def test_an_open_breaker_holds_the_reboot_and_changes_nothing(gpu) -> None:
    gpu.configure(breaker=BREAKER)
    gpu.reservations.write_text(LATCH)
    gpu.logged(X79)
    gpu.run()
    assert gpu.calls("reboot") == [] and gpu.updates == [] and gpu.calls("create reservation") == []
    assert gpu.in_slurm == {"state": "IDLE", "reason": ""}
    state = gpu.state
    assert state["action"] == "held" and state["breaker"].startswith("held by the breaker: open since")
    assert state["why"].startswith("gpu-xid asks for a reboot")
    gpu.reservations.unlink()  # reset: the next run asks again
    gpu.run()
    assert len(gpu.calls("reboot")) == 1 and gpu.state["action"] == "reboot"


def test_a_reboot_slurm_refuses_drains_the_node_instead(gpu) -> None:
    (gpu.tmp / "bin" / "scontrol.noreboot").write_text("")
    gpu.logged(X79)
    gpu.run()
    assert len(gpu.calls("reboot")) == 1
    assert gpu.in_slurm == {"state": "IDLE+DRAIN", "reason": REASON_79}
    state = gpu.state
    assert state["action"] == "drain" and state["applied"] is True and "scontrol reboot failed" in state["why"]


def test_no_act_decides_the_reboot_and_asks_nothing(gpu) -> None:
    gpu.logged(X79)
    gpu.run("--no-act")
    assert gpu.calls("reboot") == [] and gpu.updates == []
    assert gpu.state["action"] == "reboot" and "applied" not in gpu.state


def test_an_operator_drain_between_the_read_and_the_reboot_is_kept(gpu) -> None:
    gpu.logged(X79)
    by_hand = {"state": "IDLE+DRAIN", "reason": "RMA 4711"}
    (gpu.tmp / "bin" / "scontrol.json").write_text(json.dumps({"state": "IDLE", "reason": "", "operator": by_hand}))
    gpu.run()
    assert gpu.calls("reboot") == [] and gpu.in_slurm == by_hand
    assert gpu.state["applied"].startswith("not changed: the node changed since this run read it")


def test_reboot_for_reads_the_ladder_of_a_failing_check_only() -> None:
    checks = {"gpu-xid": {"ok": True, "message": "1 recorded", "data": {"ladder": "reboot"}}}
    info = {"State": "IDLE", "reason": ""}
    d = runner.decide.decide("IDLE", "", [], 0, 3)
    assert runner.reboot_for(checks, info, d) is None
    checks["gpu-xid"]["ok"] = False
    assert runner.reboot_for(checks, info, d).action == "reboot"


def test_a_gpu_that_fails_again_after_its_reboot_is_service_required_not_rebooted_again(gpu) -> None:
    gpu.logged(X79)
    gpu.run()
    asked = gpu.state["rebooted"]
    gpu.slurm("IDLE", "")  # back from the reboot (nextstate=RESUME), and the GPU fails again
    gpu.run()
    assert len(gpu.calls("reboot")) == 1
    assert gpu.in_slurm["state"] == "IDLE+DRAIN"
    assert gpu.in_slurm["reason"].startswith("gpc:service: gpu-xid again 0.0 h after its reboot: XID 79 on "), \
        gpu.in_slurm
    state = gpu.state
    assert state["action"] == "drain" and state["rebooted"] == asked
    assert "not rebooted: this node asked for a reboot 0.0 h ago (one in 24 h)" in state["why"]
    assert [h["to"] for h in state["lifecycle"]["history"]] == ["production", "rebooting", "production",
                                                                  "service-required"]
    gpu.run()  # service-required: left drained, its reason kept
    assert len(gpu.calls("reboot")) == 1 and gpu.state["action"] == "none"
    assert gpu.in_slurm["reason"].startswith("gpc:service: ")


def test_a_day_after_its_last_reboot_a_node_is_rebooted_again(gpu) -> None:
    gpu.logged(X79)
    gpu.run()
    state = gpu.state
    state["rebooted"] -= runner.REBOOT_AGAIN_AFTER_S + 60
    (gpu.state_dir / "state.json").write_text(json.dumps(state))
    gpu.slurm("IDLE", "")
    gpu.run()
    assert len(gpu.calls("reboot")) == 2 and gpu.state["rebooted"] > state["rebooted"]
