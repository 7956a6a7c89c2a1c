"""The drain/resume policy as a pure function: one row per case of the decision table, and the reason's
shape (prefix, one line, within MAX_REASON). Node states are the strings Slurm 22.05 prints
(tests/data/health/scontrol-show-node-o.txt)."""

from __future__ import annotations

import pytest

from gpucluster.node.decide import MAX_REASON, PREFIX, check_of, clean, decide, is_drained, reason_for

FAIL = [("gpu-count", "7 of 8 GPUs (nvidia-smi)")]
OURS = "gpc:gpu-count: 7 of 8 GPUs (nvidia-smi)"
HAND = "maintenance by hand"

# state, reason, failures, passes before, resume_after -> action, passes after
TABLE = {
    "healthy node, all pass: nothing": ("IDLE", "", [], 0, 3, "none", 0),
    "healthy node, a check fails: drain with its reason": ("IDLE", "", FAIL, 0, 3, "drain", 0),
    "a running node fails: drain (Slurm lets the job finish)": ("MIXED", "", FAIL, 0, 3, "drain", 0),
    "gpc-drained, passes once of 3: wait": ("IDLE+DRAIN", OURS, [], 0, 3, "none", 1),
    "gpc-drained, passes the 2nd time of 3: wait": ("IDLE+DRAIN", OURS, [], 1, 3, "none", 2),
    "gpc-drained, passes the 3rd time in a row: resume": ("IDLE+DRAIN", OURS, [], 2, 3, "resume", 0),
    "gpc-drained, fails again: the count starts over": ("IDLE+DRAIN", OURS, FAIL, 2, 3, "none", 0),
    "gpc-draining (job still on it), passes 3 in a row: resume": ("MIXED+DRAIN", OURS, [], 2, 3, "resume", 0),
    "hand-drained, all pass for ever: never resumed": ("IDLE+DRAIN", HAND, [], 99, 3, "none", 0),
    "hand-drained, a check fails: the operator's reason stays": ("IDLE+DRAIN", HAND, FAIL, 0, 3, "none", 0),
    "drained with no reason: treated as by hand": ("IDLE+DRAIN", "", [], 5, 1, "none", 0),
    "gpc-drained for another check, now this one fails: reason rewritten": (
        "IDLE+DRAIN", "gpc:munge: munge -n failed", FAIL, 0, 3, "drain", 0),
    "down+drain by gpucluster, passes enough: resume": ("DOWN+DRAIN", OURS, [], 0, 1, "resume", 0),
}


@pytest.mark.parametrize("case", TABLE.values(), ids=TABLE.keys())
def test_decision_table(case) -> None:
    state, reason, failures, passes, resume_after, action, after = case
    d = decide(state, reason, failures, passes, resume_after)
    assert (d.action, d.passes) == (action, after), d.why
    if action == "drain":
        assert d.reason == reason_for(failures) and d.reason.startswith(f"{PREFIX}{failures[0][0]}: ")
    else:
        assert d.reason == reason


def test_a_drain_by_an_active_check_is_not_resumed_by_passive_passes() -> None:
    """dcgm-diag cannot run on a drained node, so passing passive checks prove nothing about its fault."""
    reason = "gpc:dcgm-diag: dcgmi diag -r 1: Memory test failed"
    d = decide("IDLE+DRAIN", reason, [], 10, 3, resumable={"gpu-count", "munge"})
    assert d.action == "none" and d.passes == 0 and "resume by hand" in d.why
    assert decide("IDLE+DRAIN", OURS, [], 2, 3, resumable={"gpu-count"}).action == "resume"


@pytest.mark.parametrize(("state", "drained"), [
    ("IDLE", False), ("MIXED", False), ("ALLOCATED", False), ("IDLE+DRAIN", True), ("MIXED+DRAIN", True),
    ("DOWN+DRAIN", True), ("DOWN+NOT_RESPONDING", False), ("IDLE+DRAIN+NOT_RESPONDING", True),
])
def test_drained_from_slurms_state_string(state: str, drained: bool) -> None:
    assert is_drained(state) is drained


def test_reason_names_the_first_failure_and_counts_the_rest() -> None:
    failures = [("mount-flash", "/mnt/flash not mounted"), ("munge", "x"), ("disk-tmp", "y")]
    assert reason_for(failures) == "gpc:mount-flash: /mnt/flash not mounted (+2 more)"
    assert check_of(reason_for(failures)) == "mount-flash"
    assert check_of(HAND) is None and check_of("gpc:") is None


def test_reason_fits_and_stays_one_line() -> None:
    long = [("site-lustre", "line one\nline two\t" + "x" * 400), ("munge", "m")]
    reason = reason_for(long)
    assert len(reason) <= MAX_REASON
    assert reason.startswith("gpc:site-lustre: line one line two ")
    assert reason.endswith("... (+1 more)")
    assert "\n" not in reason and "\t" not in reason


def test_clean_keeps_printable_ascii_only() -> None:
    assert clean("GPU 3 é\x00 fell  off\n") == "GPU 3 fell off"


def test_the_node_side_knows_the_specs_active_checks() -> None:
    """decide.ACTIVE (standalone on the nodes) names exactly the checks health.active.checks accepts."""
    import typing

    from gpucluster.node.decide import ACTIVE
    from gpucluster.spec.model import HealthActive

    literal = typing.get_args(HealthActive.model_fields["checks"].annotation)[0]
    assert set(typing.get_args(literal)) == set(ACTIVE)
