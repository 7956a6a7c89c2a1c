"""The runner as slurmd runs it: a fresh process, almost no environment (SLURMD_NODENAME only), always
exit 0. Budgets kill overrunning checks; the verdict reaches Slurm through scontrol.

Here scontrol is a stand-in (a script keeping one node's State and Reason in a JSON file and printing
them in the `scontrol show node -o` format captured from Slurm 22.05): these tests are about the
runner. tests/test_health_slurm.py runs the same runner under a real slurmd and slurmctld.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucluster.health.node import runner

DATA = Path(__file__).resolve().parent / "data" / "health"
RUNNER = Path(runner.__file__)
FAKE_SCONTROL = r'''#!/usr/bin/env python3
# Stand-in for scontrol (one node's State and Reason in a JSON file), for the runner's unit tests.
import json, sys
db = sys.argv[0] + ".json"
node = json.load(open(db))
args = sys.argv[1:]
open(sys.argv[0] + ".log", "a").write(" ".join(args) + "\n")
if args[:3] == ["show", "node", "-o"]:
    line = open("{line}").read().splitlines()[0]
    head = line.split(" Reason=")[0]
    head = head.replace("State=IDLE+DRAIN", "State=" + node["state"]).replace("NodeName=gpu01", "NodeName=" + args[3])
    print(head + (" Reason=" + node["reason"] + " [root@2026-11-23T01:23:51]" if node["reason"] else ""))
elif args[0] == "update":
    kv = dict(a.split("=", 1) for a in args[1:])
    if kv["state"] == "drain":
        base = node["state"].split("+")[0]
        node = {"state": base + "+DRAIN", "reason": kv["reason"]}
    elif kv["state"] == "resume":
        node = {"state": node["state"].split("+")[0], "reason": ""}
    json.dump(node, open(db, "w"))
'''


@pytest.fixture
def node(tmp_path: Path):
    """A node: config with the given checks, a site folder, a stand-in scontrol; run() as slurmd would."""
    bin_dir, site, state = tmp_path / "bin", tmp_path / "site", tmp_path / "state"
    for d in (bin_dir, site, state):
        d.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(FAKE_SCONTROL.replace("{line}", str(DATA / "scontrol-show-node-o.txt")))
    scontrol.chmod(0o755)

    class Node:
        name = "gpu07"
        config = tmp_path / "config.json"

        def __init__(self) -> None:
            self.site, self.state_dir, self.tmp = site, state, tmp_path
            self.slurm("IDLE", "")
            self.write_config()

        def write_config(self, **extra) -> None:
            data = {"state_dir": str(state), "site_dir": str(site), "check_timeout": 2, "run_budget": 6,
                    "resume_after": 3, "checks": [], "env": {"PATH": f"{bin_dir}:/usr/bin:/bin"}, **extra}
            self.config.write_text(json.dumps(data))

        def slurm(self, state: str, reason: str) -> None:
            (bin_dir / "scontrol.json").write_text(json.dumps({"state": state, "reason": reason}))

        @property
        def in_slurm(self) -> dict:
            return json.loads((bin_dir / "scontrol.json").read_text())

        @property
        def updates(self) -> list[str]:
            log = bin_dir / "scontrol.log"
            return [x for x in log.read_text().splitlines() if x.startswith("update")] if log.exists() else []

        def site_check(self, name: str, body: str) -> Path:
            path = site / name
            path.write_text("#!/bin/sh\n" + body)
            path.chmod(0o755)
            return path

        def run(self, *args: str) -> subprocess.CompletedProcess:
            env = {"SLURMD_NODENAME": self.name}  # what slurmd hands its HealthCheckProgram (no PATH)
            return subprocess.run([sys.executable, str(RUNNER), "--config", str(self.config), *args], env=env,
                                  capture_output=True, text=True, timeout=60, check=False)

        @property
        def state(self) -> dict:
            return json.loads((state / "state.json").read_text())

    return Node()


def test_a_check_that_sleeps_past_its_budget_is_killed_and_drains(node) -> None:
    pid_file = node.tmp / "sleeper.pid"
    # The sleep is a child of the check's shell: only killing the whole process group ends it.
    node.site_check("50-sleepy.sh", f"sleep 30 &\necho $! > {pid_file}\nwait\n")
    t0 = time.monotonic()
    res = node.run()
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert took < 10, f"the run took {took:.1f}s; the check's budget is 2 s"
    assert node.state["checks"]["sleepy"]["message"] == "timed out after 2s"
    assert node.state["checks"]["sleepy"]["timed_out"] is True
    assert node.in_slurm == {"state": "IDLE+DRAIN", "reason": "gpc:sleepy: timed out after 2s"}
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_the_run_stops_at_its_own_budget_whatever_the_checks_ask(tmp_path: Path) -> None:
    checks = [{"name": f"s{i}", "kind": "site", "path": "/bin/sleep", "timeout": 30} for i in range(3)]
    for c in checks:
        c["path"] = str(tmp_path / c["name"])
        Path(c["path"]).write_text("#!/bin/sh\nsleep 30\n")
        Path(c["path"]).chmod(0o755)
    t0 = time.monotonic()
    results = runner.run_checks(checks, "/nonexistent", {"PATH": "/usr/bin:/bin"}, run_budget=1.0)
    assert time.monotonic() - t0 < 5
    assert [r["message"] for r in results] == ["timed out after 1s"] * 3


def test_drained_by_gpucluster_resumes_after_n_passes_in_a_row(node) -> None:
    flag = node.tmp / f"broken-{node.name}"
    flag.write_text("GPU 3 fell off the bus\n")
    # Site checks learn which node they check from SLURMD_NODENAME, as under slurmd.
    node.site_check("10-flag", f'f={node.tmp}/broken-$SLURMD_NODENAME\nif [ -e $f ]; then cat $f; exit 1; fi\n'
                               'echo fine\n')
    node.run()
    assert node.in_slurm == {"state": "IDLE+DRAIN", "reason": "gpc:flag: GPU 3 fell off the bus"}
    since = node.state["checks"]["flag"]["since"]
    node.run()  # still broken: reason kept, since kept, no second update
    assert node.state["checks"]["flag"]["since"] == since
    assert len(node.updates) == 1
    flag.unlink()
    for expect in (1, 2):
        node.run()
        assert (node.state["action"], node.state["passes"]) == ("none", expect)
        assert node.in_slurm["state"] == "IDLE+DRAIN"
    node.run()
    assert node.state["action"] == "resume" and node.in_slurm == {"state": "IDLE", "reason": ""}
    assert node.updates[-1] == f"update nodename={node.name} state=resume"


def test_a_drain_by_a_check_since_removed_resumes_like_any_other(node) -> None:
    """An operator removes a site check that misbehaved (here: it sleeps past its budget): its verdict no
    longer counts, so the nodes it drained come back after resume_after passing runs, not never."""
    sleeper = node.site_check("50-sleepy.sh", "sleep 30\n")
    node.site_check("10-ok", "echo fine\n")
    node.run()
    assert node.in_slurm == {"state": "IDLE+DRAIN", "reason": "gpc:sleepy: timed out after 2s"}
    sleeper.unlink()
    for expect in (1, 2):
        node.run()
        assert (node.state["action"], node.state["passes"]) == ("none", expect), node.state["why"]
    node.run()
    assert node.state["action"] == "resume" and node.in_slurm == {"state": "IDLE", "reason": ""}


def test_a_failure_between_passes_starts_the_count_over(node) -> None:
    flag = node.tmp / "broken"
    node.site_check("10-flag", f'if [ -e {flag} ]; then echo bad; exit 1; fi\n')
    node.slurm("IDLE+DRAIN", "gpc:flag: bad")
    node.run()
    node.run()
    assert node.state["passes"] == 2
    flag.write_text("x")
    node.run()
    assert node.state["passes"] == 0
    flag.unlink()
    node.run()
    assert node.state["passes"] == 1 and node.in_slurm["state"] == "IDLE+DRAIN"


def test_drained_by_hand_is_never_resumed(node) -> None:
    node.site_check("10-ok", "echo fine\n")
    node.slurm("IDLE+DRAIN", "maintenance by hand")
    for _ in range(5):
        node.run()
    assert node.in_slurm == {"state": "IDLE+DRAIN", "reason": "maintenance by hand"}
    assert node.updates == []
    assert "never resumed" in node.state["why"]


def test_unreadable_config_drains_with_its_own_reason_and_exits_0(node) -> None:
    node.config.write_text("{not json")
    res = subprocess.run([sys.executable, str(RUNNER), "--config", str(node.config)],
                         env={"SLURMD_NODENAME": node.name, "PATH": str(Path(node.tmp / "bin")) + ":/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0
    assert node.in_slurm["reason"].startswith(f"gpc:config: cannot read {node.config}: ")


def test_a_second_run_while_one_is_going_exits_at_once(node) -> None:
    with open(node.state_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        res = node.run()
    assert res.returncode == 0 and "a run is still going" in res.stdout
    assert not (node.state_dir / "state.json").exists()


def test_a_crashing_check_fails_with_its_last_words(node, tmp_path: Path) -> None:
    node.write_config(checks=[{"name": "gpu-count", "kind": "gpu-count", "vendor": "nvidia", "timeout": 2}])
    node.run()
    assert node.state["checks"]["gpu-count"]["message"].startswith("check error: KeyError")
    assert node.in_slurm["reason"].startswith("gpc:gpu-count: check error: KeyError")


def test_slurm_unreachable_changes_nothing_and_says_why(node) -> None:
    (node.tmp / "bin" / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm "
                                               "controller (connect failure)' >&2\nexit 1\n")
    node.site_check("10-bad", "echo bad; exit 1\n")
    res = node.run()
    assert res.returncode == 0
    assert node.state["action"] == "none"
    assert "Unable to contact slurm controller" in node.state["why"]


def test_an_active_check_report_drains_and_is_recorded(node) -> None:
    res = node.run("--report", "dcgm-diag", "--failed", "dcgmi diag -r 1: Memory test failed")
    assert res.returncode == 0
    assert node.in_slurm == {"state": "IDLE+DRAIN", "reason": "gpc:dcgm-diag: dcgmi diag -r 1: Memory test failed"}
    assert node.state["checks"]["dcgm-diag"]["active"] is True
    node.site_check("10-ok", "echo fine\n")
    for _ in range(4):  # passive passes do not resume an active check's drain
        node.run()
    assert node.in_slurm["state"] == "IDLE+DRAIN"


def test_environment_has_a_path_even_when_slurmd_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATH", raising=False)
    env = runner.environment({})
    assert "/usr/bin" in env["PATH"].split(":") and "/usr/sbin" in env["PATH"].split(":")
    assert runner.environment({"env": {"SLURM_CONF": "/x"}})["SLURM_CONF"] == "/x"


def test_site_checks_are_named_from_their_files(tmp_path: Path) -> None:
    for name, body in (("10-lustre.sh", "x"), ("20-gpu-count", "x"), (".hidden", "x"), ("README", None)):
        p = tmp_path / name
        p.write_text(body or "")
        if body:
            p.chmod(0o755)
    found = runner.site_checks(str(tmp_path), 5, {"gpu-count"})
    assert [c["name"] for c in found] == ["lustre", "site-gpu-count"]
    assert os.environ.get("SLURMD_NODENAME") is None or True


def test_the_timer_runs_only_when_slurmd_has_not(node) -> None:
    """--if-stale: the node's timer runs the checks only if no run started for stale_after seconds (the
    interval and a quarter: slurmd's own runs come every interval, a second or two late)."""
    node.write_config(interval=300)
    node.site_check("10-bad", "echo bad; exit 1\n")
    node.run("--if-stale")
    assert node.in_slurm["reason"] == "gpc:bad: bad"  # no run yet: stale, so it ran
    started = node.state["started"]
    node.run("--if-stale")
    assert node.state["started"] == started  # ran 0 s ago: skipped
    config = str(node.config)
    assert not runner.stale(config, now=started + 301)  # slurmd's next run is due about now: leave it to slurmd
    assert runner.stale(config, now=started + 375) and not runner.stale(config, now=started + 374)
    node.write_config(interval=300, stale_after=100)  # the rendered config says it (render/health/config.py)
    assert runner.stale(config, now=started + 100) and not runner.stale(config, now=started + 99)


def test_a_relative_config_path_works(node) -> None:
    """Checks run from /, so the runner hands them the config's absolute path."""
    node.write_config(checks=[{"name": "disk-tmp", "kind": "disk", "path": "/tmp", "min_free_pct": 0, "timeout": 2}])
    res = subprocess.run([sys.executable, str(RUNNER), "--config", node.config.name], cwd=node.config.parent,
                         env={"SLURMD_NODENAME": node.name}, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0
    assert node.state["checks"]["disk-tmp"]["ok"], node.state["checks"]["disk-tmp"]["message"]
