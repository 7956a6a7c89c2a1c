"""The node lifecycle (node/nodestate.py) and its record: the state Slurm shows, each transition with its evidence,
service-required after `triages` entries into triage in the window or when the GPU error ladder asks for a repair,
a service-required drain no passing run lifts; its metrics for node_exporter (node/promtext.py); acceptance's
refusals and verdict (health/accept.py). Through the runner with tests/test_health_runner.py's stand-in scontrol.
tests/test_health_lifecycle_emulated.py takes nodes through the whole lifecycle on a real slurmctld.
"""

from __future__ import annotations

import json
import re
import sys
import time

import pytest
from test_health_reboot import gpu  # noqa: F401 - the runner's node with gpu-xid, shared
from test_health_runner import node  # noqa: F401 - the runner fixture, shared
from test_health_xid import X13

from gpucluster.health import accept
from gpucluster.node import decide, nodestate, promtext, runner


@pytest.mark.parametrize(("state", "reason", "before", "want"), [
    ("IDLE", "", None, "production"),
    ("MIXED", "", "triage", "production"),
    ("IDLE+DRAIN", "gpc:disk-tmp: /tmp 2% free", "production", "triage"),
    ("DOWN+DRAIN", "gpc:munge: munged does not answer", None, "triage"),
    ("MIXED+DRAIN+REBOOT_REQUESTED", "gpc:gpu-xid: XID 79 on 0000:3b:00.0", "production", "rebooting"),
    ("IDLE+DRAIN", "gpc:service: gpu-xid again 2.0 h after its reboot", "rebooting", "service-required"),
    ("IDLE+MAINT", "", "acceptance", "acceptance"),
    ("IDLE+MAINT", "", "production", "production"),  # someone else's maintenance reservation
    ("IDLE", "", "acceptance", "production"),  # the acceptance reservation deleted
    ("IDLE+DRAIN", "RMA 4711: GPU 3 to be replaced", "production", None),  # by hand: not gpucluster's
    ("DOWN+NOT_RESPONDING", "Not responding", "production", None),
], ids=lambda v: str(v))
def test_the_state_is_read_from_slurm_first(state: str, reason: str, before, want) -> None:
    assert nodestate.current(state, reason, before) == want


def test_a_transition_keeps_its_why_and_evidence_and_counts_new_faults() -> None:
    checks = {"disk-tmp": {"ok": False, "message": "/tmp 2% free"}, "munge": {"ok": True, "message": "ok"}}
    rec = nodestate.advance({}, 100.0, "production", "first run")
    rec = nodestate.advance(rec, 200.0, "triage", "disk-tmp failed", checks)
    assert rec["state"] == "triage" and rec["since"] == 200.0 and rec["triages"] == [200.0]
    assert rec["history"][-1] == {"from": "production", "to": "triage", "at": 200.0, "why": "disk-tmp failed",
                                  "failed": {"disk-tmp": "/tmp 2% free"}}
    same = nodestate.advance(rec, 300.0, "triage", "still")
    assert same == rec  # no move, no entry
    assert nodestate.advance(rec, 300.0, None, "drained by hand") == rec
    back = nodestate.advance(rec, 400.0, "production", "all checks passed")
    assert back["triages"] == [200.0]  # leaving triage is no new fault
    rebooting = nodestate.advance(back, 500.0, "rebooting", "gpu-xid asks for a reboot")
    assert rebooting["triages"] == [200.0, 500.0]  # a reboot for a fault is one
    assert nodestate.triages_within(rebooting, 500.0 + 250, 300) == [500.0]


def test_a_record_from_a_hand_edited_file_gives_what_it_can() -> None:
    rec = nodestate.load({"state": "lost", "since": "x", "history": [1, {"to": "triage"}], "triages": ["a", 5]})
    assert rec == {"state": None, "since": None, "history": [{"to": "triage"}], "triages": [5]}
    assert nodestate.load("nonsense") == {"state": None, "since": None, "history": [], "triages": []}


def _drain(check: str = "disk-tmp") -> decide.Decision:
    return decide.Decision("drain", f"gpc:{check}: broken", 0, f"{check} failed")


def test_the_third_fault_in_the_window_is_service_required() -> None:
    day = 86400.0
    config = {"lifecycle": {"triages": 3, "window_s": 3 * day}}
    rec = {"state": "production", "triages": [1 * day, 2 * day]}
    d = nodestate.escalation(rec, 3.5 * day, "production", _drain(), None, config, "disk-tmp: broken")
    assert (d.action, d.reason) == ("drain", "gpc:service: in triage 3 times in 3 d; now disk-tmp: broken")
    assert d.why == "service required: entered triage 3 times within 3 d (limit 3)"
    # the first fault fell out of the window: two in it, no escalation
    assert nodestate.escalation(rec, 4.5 * day, "production", _drain(), None, config, "x") is None
    # a node already in triage is not entering it again; a resume is no fault
    assert nodestate.escalation(rec, 3.5 * day, "triage", _drain(), None, config, "x") is None
    resume = decide.Decision("resume", "gpc:disk-tmp: broken", 0, "all checks passed")
    assert nodestate.escalation(rec, 3.5 * day, "production", resume, None, config, "x") is None


def test_the_ladder_asking_for_a_repair_is_service_required_at_once() -> None:
    d = nodestate.escalation({}, 1.0, "production", _drain("gpu-xid"), "service", {}, "gpu-xid: XID 64")
    assert (d.action, d.reason) == ("drain", "gpc:service: gpu-xid: XID 64")
    assert nodestate.escalation({}, 1.0, None, _drain("gpu-xid"), "service", {}, "x") is None  # by hand


def test_a_service_required_node_keeps_its_reason_whatever_fails_now() -> None:
    d = nodestate.escalation({}, 1.0, "service-required", _drain("gpu-count"), None, {}, "gpu-count: 7 of 8 GPUs")
    assert d.action == "none" and "gpucluster health accept" in d.why


def test_service_and_acceptance_drains_are_never_lifted_by_passing_runs() -> None:
    for reason in ("gpc:service: XID 79 again", "gpc:acceptance: not run: dcgm-diag"):
        assert decide.check_of(reason) not in runner.resumable([{"name": "gpu-xid"}], reason)
        d = decide.decide("IDLE+DRAIN", reason, [], 5, 3, runner.resumable([{"name": "gpu-xid"}], reason))
        assert d.action == "none"
    assert "gone-check" in runner.resumable([], "gpc:gone-check: x")  # an ordinary removed check still is


def _failing_site(node, flag):  # noqa: F811
    node.site_check("10-disk.sh", f'test ! -e {flag} || {{ echo "disk broken"; exit 1; }}\necho ok\n')


def test_through_the_runner_the_third_drain_in_a_week_is_service_required(node) -> None:  # noqa: F811
    flag = node.tmp / "broken"
    _failing_site(node, flag)
    node.write_config(resume_after=1, lifecycle={"triages": 3, "window_s": 7 * 86400})
    node.run()
    for n in (1, 2):
        flag.touch()
        node.run()
        assert node.in_slurm == {"state": "IDLE+DRAIN", "reason": "gpc:disk: disk broken"}, n
        flag.unlink()
        node.run()
        assert node.in_slurm["state"] == "IDLE", n
    flag.touch()
    node.run()
    assert node.in_slurm == {"state": "IDLE+DRAIN",
                             "reason": "gpc:service: in triage 3 times in 7 d; now disk: disk broken"}
    record = node.state["lifecycle"]
    assert [h["to"] for h in record["history"]] == ["production", "triage", "production", "triage", "production",
                                                     "service-required"]
    assert record["history"][-1]["failed"] == {"disk": "disk broken"} and len(record["triages"]) == 3
    flag.unlink()
    for _ in range(3):  # repaired or not: only acceptance brings it back
        node.run()
    assert node.in_slurm["reason"].startswith("gpc:service: ") and node.state["action"] == "none"
    assert node.state["why"] == "service required: repair it, then `gpucluster health accept`"
    assert node.state["lifecycle"]["state"] == "service-required"


def test_the_lifecycle_flag_records_an_operators_move(node) -> None:  # noqa: F811
    folder = node.tmp / "textfile"
    folder.mkdir()
    node.write_config(textfile_dir=str(folder))
    node.run()
    res = node.run("--lifecycle", "acceptance", "--why", "GPU 3 replaced")
    assert 'gpucluster_health_lifecycle{state="acceptance"} 1.0' in (folder / promtext.FILE).read_text()
    assert res.returncode == 0 and "production -> acceptance" in res.stdout, res.stdout + res.stderr
    last = node.state["lifecycle"]["history"][-1]
    assert (last["from"], last["to"], last["why"]) == ("production", "acceptance", "GPU 3 replaced")


def test_the_run_writes_its_metrics_for_node_exporter(gpu) -> None:  # noqa: F811
    folder = gpu.tmp / "textfile"
    folder.mkdir()
    gpu.configure({"13": "reboot"}, textfile_dir=str(folder))
    gpu.logged(X13)
    gpu.run()
    text = (folder / promtext.FILE).read_text()
    assert 'gpucluster_health_check_ok{check="gpu-xid"} 0.0' in text
    assert 'gpucluster_health_check_fails{check="gpu-xid"} 1.0' in text
    assert 'gpucluster_health_lifecycle{state="rebooting"} 1.0' in text
    assert 'gpucluster_health_lifecycle{state="production"} 0.0' in text
    assert 'gpucluster_health_gpu_errors_open{class="xid13"} 1.0' in text
    assert "gpucluster_health_breaker_held 0.0" in text
    stamp = re.search(r"^gpucluster_health_last_run_timestamp_seconds (\S+)$", text, re.M)
    assert stamp and float(stamp.group(1)) == pytest.approx(gpu.state["started"])
    assert not list(folder.glob("*.tmp*"))


def test_metrics_escape_a_site_checks_name_and_skip_a_missing_folder(tmp_path) -> None:
    text = promtext.render({"checks": {'we"ird\\\nname': {"ok": True}}, "started": 5, "action": "held"})
    assert 'gpucluster_health_check_ok{check="we\\"ird\\\\\\nname"} 1.0' in text
    assert "gpucluster_health_breaker_held 1.0" in text
    assert promtext.write(str(tmp_path / "absent"), {}) is None and not (tmp_path / "absent").exists()


@pytest.mark.parametrize(("state", "reason", "refused"), [
    ("IDLE", "", "not drained"),
    ("IDLE+DRAIN", "RMA 4711", "drained by hand"),
    ("IDLE+DRAIN", "gpc:service: in triage 3 times", None),
    ("DOWN+DRAIN", "gpc:gpu-count: 7 of 8 GPUs", None),
])
def test_acceptance_is_for_a_node_gpucluster_drained(state: str, reason: str, refused) -> None:
    got = accept.refusal(state, reason)
    assert (got is None) if refused is None else (refused in got)


def _state(checks: dict) -> str:
    return json.dumps({"checks": checks})


def test_the_acceptance_verdict_needs_every_check_run_since_it_began_and_passed() -> None:
    t = time.time()
    fresh = {"gpu-count": {"ok": True, "last": t + 1}, "dcgm-diag": {"ok": True, "last": t + 5, "active": True}}
    assert accept.verdict(_state(fresh), t, ["dcgm-diag"], "IDLE+MAINT")[0] is True
    old = {**fresh, "dcgm-diag": {"ok": True, "last": t - 100, "active": True}}
    assert accept.verdict(_state(old), t, ["dcgm-diag"], "IDLE")[1] == \
        "not run since the acceptance began: dcgm-diag"
    not_run = {**fresh, "dcgm-diag": {"ok": None, "not_run": True, "message": "no dcgmi", "last": t + 5}}
    assert accept.verdict(_state(not_run), t, ["dcgm-diag"], "IDLE")[1] == "failed: dcgm-diag: no dcgmi"
    assert accept.verdict(_state(fresh), t, ["dcgm-diag"], "IDLE+DRAIN")[0] is False
    assert accept.verdict("not json", t, [], "IDLE")[1] == "no check ran on the node since the acceptance began"


class _Done:
    def __init__(self, rc: int = 0, out: str = "") -> None:
        self.returncode, self.stdout, self.stderr = rc, out, ""


def test_an_acceptance_whose_health_run_drains_the_node_submits_no_job_and_fails() -> None:
    """The passive run fails and drains the node: a job would pend for ever there, so none is submitted; the node
    stays drained by its check and leaves its reservation."""
    slurm_calls, node_calls = [], []
    shown = iter([("IDLE+DRAIN", "gpc:service: again"), ("IDLE+DRAIN", "gpc:gpu-count: 7 of 8"),
                  ("IDLE+DRAIN", "gpc:gpu-count: 7 of 8")])
    t = time.time()
    state = _state({"gpu-count": {"ok": False, "message": "7 of 8 GPUs", "last": t + 60}})

    def on_node(argv):
        node_calls.append(argv)
        return _Done(0, state if argv[0] == "cat" else "")

    def slurm(argv):
        slurm_calls.append(argv)
        return _Done()

    out = accept.accept("gpu07", slurm, on_node, lambda: next(shown), "prog", [("dcgm-diag", "/s.sh")], "/st", "fixed")
    assert not out.passed and out.why == "failed: gpu-count: 7 of 8 GPUs"
    assert not [c for c in slurm_calls if c[0] == "sbatch"]
    assert slurm_calls[-1] == accept.delete_reservation("gpu07")
    assert ["prog", "--lifecycle", "production"] not in [c[:3] for c in node_calls]


def test_the_xid_counter_counts_every_error_read_and_survives_a_bad_file(gpu) -> None:  # noqa: F811
    folder = gpu.tmp / "textfile"
    folder.mkdir()
    gpu.configure({"13": "record"}, textfile_dir=str(folder))
    gpu.logged(X13, X13)
    gpu.run()
    gpu.logged(X13)
    gpu.run()
    assert 'gpucluster_health_xid_events_total{class="xid13"} 3.0' in (folder / promtext.FILE).read_text()
    assert "# TYPE gpucluster_health_xid_events_total counter" in (folder / promtext.FILE).read_text()
    state = gpu.state
    state["checks"]["gpu-xid"]["data"]["counts"] = {"xid13": "lots", "x": True, "xid79": 2}
    (gpu.state_dir / "state.json").write_text(json.dumps(state))
    gpu.logged(X13)  # counted from what the file held that is a count: the bad ones start over
    gpu.run()
    text = (folder / promtext.FILE).read_text()
    assert 'class="xid79"} 2.0' in text and 'class="xid13"} 1.0' in text and 'class="x"' not in text
    assert gpu.state["checks"]["gpu-xid"]["ok"] is True, gpu.state["checks"]["gpu-xid"]


def test_metrics_without_the_client_library_say_so_and_write_nothing(tmp_path, monkeypatch) -> None:
    """A node without python3-prometheus-client still runs its checks: the metrics file is not written, and why."""
    for name in ("prometheus_client", "prometheus_client.core", "prometheus_client.exposition"):
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: the import raises ImportError
    why = promtext.write(str(tmp_path), {"checks": {"x": {"ok": True}}})
    assert why and "python3-prometheus-client" in why and not list(tmp_path.iterdir())
