"""Hysteresis: a check whose cause can be shared by many nodes or gone by the next run (decide.HYSTERESIS: munge,
mount-*) drains only after health.fail_after failing runs in a row; every other check drains on the first. A node
gpucluster already drained is decided as before. Pure cases first (decide.decide with streaks), then the runner as
slurmd runs it (tests/test_health_runner.py's node: a config, a stand-in scontrol), counting in state.json."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, example_path
from test_health_runner import node  # noqa: F401 - the runner fixture, shared

from gpucluster.cluster import load_cluster
from gpucluster.node import decide as policy
from gpucluster.node import runner
from gpucluster.render.health.config import node_configs

MOUNT = [("mount-flash", "/mnt/flash not mounted")]
MUNGE = [("munge", "munge -n failed: Failed to access the socket")]
GPU = [("gpu-count", "7 of 8 GPUs (nvidia-smi)")]
OURS = "gpc:gpu-count: 7 of 8 GPUs (nvidia-smi)"

# state, reason, failures, streaks, fail_after -> action, the reason's check (drain) , words in why
CASES = {
    "a mount failing its 1st run of 3: held, and said": ("IDLE", "", MOUNT, {"mount-flash": 1}, 3, "none", None,
                                                         "mount-flash failed 1 of 3 runs before draining"),
    "a mount failing its 2nd run of 3: held": ("IDLE", "", MOUNT, {"mount-flash": 2}, 3, "none", None,
                                               "mount-flash failed 2 of 3 runs before draining"),
    "a mount failing its 3rd run in a row: drains": ("MIXED", "", MOUNT, {"mount-flash": 3}, 3, "drain", "mount-flash",
                                                     "mount-flash failed"),
    "munge failing its 1st run of 3: held": ("IDLE", "", MUNGE, {"munge": 1}, 3, "none", None,
                                             "munge failed 1 of 3 runs before draining"),
    "a GPU check drains on its first failing run": ("IDLE", "", GPU, {"gpu-count": 1}, 3, "drain", "gpu-count",
                                                    "gpu-count failed"),
    "gpu-xid drains on its first": ("IDLE", "", [("gpu-xid", "XID 79 ...")], {"gpu-xid": 1}, 3, "drain", "gpu-xid",
                                    "gpu-xid failed"),
    "a site check drains on its first": ("IDLE", "", [("lustre", "EIO")], {"lustre": 1}, 5, "drain", "lustre", ""),
    "hardware drains, the held mount is not in the reason": (
        "IDLE", "", MOUNT + GPU, {"mount-flash": 1, "gpu-count": 1}, 3, "drain", "gpu-count",
        "mount-flash failed 1 of 3 runs before draining"),
    "fail_after 1: a mount drains on its first": ("IDLE", "", MOUNT, {"mount-flash": 1}, 1, "drain", "mount-flash",
                                                  ""),
    "drained by gpucluster: a failing mount keeps it drained, as before": (
        "IDLE+DRAIN", OURS, MOUNT, {"mount-flash": 1}, 3, "drain", "mount-flash", "still drained, now for mount-flash"),
    "drained by hand: left alone": ("IDLE+DRAIN", "RMA 4711", MOUNT, {"mount-flash": 1}, 3, "none", None, "by hand"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_decision_with_streaks(case) -> None:
    state, reason, failures, streaks, fail_after, action, check, words = case
    d = policy.decide(state, reason, failures, 0, 3, None, streaks, fail_after)
    assert d.action == action, d.why
    assert words in d.why
    if check:
        assert policy.check_of(d.reason) == check
        assert d.reason == policy.reason_for([f for f in failures if f[0] == check])  # no "(+1 more)" for the held


def test_a_drained_node_counts_no_pass_while_a_held_check_fails() -> None:
    """Held or not, a failure on a node gpucluster drained starts resume_after over."""
    d = policy.decide("IDLE+DRAIN", OURS, MOUNT, 2, 3, None, {"mount-flash": 1}, 3)
    assert d.passes == 0 and d.action != "resume"


def test_without_streaks_every_failure_drains_as_before() -> None:
    assert policy.decide("IDLE", "", MOUNT, 0, 3).action == "drain"


def _names(name: str) -> list[str]:
    return sorted({c["name"] for config in node_configs(load_cluster(example_path(name))).values()
                   for c in config["checks"]})


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_table_holds_back_mounts_and_munge_only(name: str) -> None:
    """Of every check the examples render, the mounts and munge are of a shared cause; none else is."""
    for check in _names(name):
        assert policy.shared_cause(check) == (check == "munge" or check.startswith("mount-")), check


def test_every_row_of_the_table_says_why() -> None:
    assert set(policy.HYSTERESIS) == {"munge", "mount-*"}
    assert all(len(why) > 40 for why in policy.HYSTERESIS.values())


def test_the_runner_counts_failing_runs_in_a_row() -> None:
    state: dict = {}
    for ok, want in ((False, 1), (False, 2), (True, 0), (False, 1)):
        state = {"checks": runner.record(state, [{"name": "munge", "ok": ok, "message": "m"}], 1.0)}
        assert state["checks"]["munge"]["fails"] == want


# ---------------------------------------------------------------- the runner, end to end


def _mount(node, path: str) -> None:  # noqa: F811 - node is the shared fixture
    node.write_config(fail_after=3, checks=[{"name": "mount-flash", "kind": "mount", "path": path, "timeout": 2}])


def test_a_mount_drains_on_its_third_failing_run(node) -> None:  # noqa: F811
    _mount(node, "/mnt/gpc-no-such-flash")
    for run in (1, 2):
        node.run()
        assert node.in_slurm == {"state": "IDLE", "reason": ""}, run
        assert node.state["why"] == f"mount-flash failed {run} of 3 runs before draining"
        assert node.state["checks"]["mount-flash"]["fails"] == run
    node.run()
    assert node.in_slurm == {"state": "IDLE+DRAIN", "reason": "gpc:mount-flash: /mnt/gpc-no-such-flash not mounted"}


def test_a_mount_back_before_fail_after_starts_the_count_over(node) -> None:  # noqa: F811
    _mount(node, "/mnt/gpc-no-such-flash")
    node.run()
    node.run()
    _mount(node, "/")  # mounted again (the root is always mounted)
    node.run()
    assert node.state["checks"]["mount-flash"]["fails"] == 0 and node.state["why"] == "all checks pass"
    _mount(node, "/mnt/gpc-no-such-flash")
    node.run()
    node.run()
    assert node.in_slurm["state"] == "IDLE"
    assert node.state["why"] == "mount-flash failed 2 of 3 runs before draining"


def test_a_hardware_check_drains_on_its_first_failing_run(node) -> None:  # noqa: F811
    _mount(node, "/")
    node.site_check("10-flag", "echo 'GPU 3 fell off the bus'; exit 1\n")
    node.run()
    assert node.in_slurm == {"state": "IDLE+DRAIN", "reason": "gpc:flag: GPU 3 fell off the bus"}


def test_no_act_records_the_hold_and_changes_nothing(node) -> None:  # noqa: F811
    _mount(node, "/mnt/gpc-no-such-flash")
    for _ in range(3):
        node.run("--no-act")
    assert node.state["action"] == "drain" and node.state["checks"]["mount-flash"]["fails"] == 3
    assert node.updates == [] and node.in_slurm["state"] == "IDLE"


def test_a_config_without_fail_after_drains_on_the_first(node) -> None:  # noqa: F811
    node.write_config(checks=[{"name": "mount-flash", "kind": "mount", "path": "/mnt/gpc-nope", "timeout": 2}])
    node.run()
    assert node.in_slurm["reason"] == "gpc:mount-flash: /mnt/gpc-nope not mounted"
