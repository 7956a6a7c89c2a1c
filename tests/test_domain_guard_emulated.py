"""An NVLink domain degrades as a unit, on real daemons: the emulator (slurmctld and one `slurmd -N` per tray, Slurm
22.05 from the host's packages and 26.05 from its Debian root) with two GB200 NVL72 racks, 36 trays, as the GB200
example plans them (domains nvl0001 and nvl0002, their trays from the plan through the rendered guard config), the
guard's run as its timer makes it (node/domainguard.py, in-process and, at the end, as the script the timer runs).

1. One tray of nvl0001 out of service (its nvlink-fabric check drained it): the guard leaves the domain alone, and a
   small job sent to nvl0001 runs there.
2. Five trays out (one by hand), more than 25 % of 18: the guard drains the other 13 with `gpc:domain:nvl0001 ...`
   in one update; the job on one of them keeps running (that tray is draining, not killed); nvl0002 is untouched;
   a new small job for nvl0001 now waits.
3. The four trays the checks drained come back (the one drained by hand stays): the guard resumes exactly the 13,
   together, and the waiting job runs in nvl0001.

The spec raises health.breaker.out_of_service_pct to 50 %: with the default 10 % of 36 trays (3) the breaker holds
a domain drain (tests/test_domain_guard.py shows that hold)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import compiled, example_data, health_slurm_conf, root_scontrol_env, spec_from_data, wait_for

from gpucluster import slurmtext
from gpucluster.emulate import SlurmCluster
from gpucluster.node import NODE_DIR, decide, domainguard, slurmctl
from gpucluster.render.health import domainconf

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]

CHECK_REASON = "gpc:nvlink-fabric: GPU 1: 17 of 18 NVLinks up (link 7: <inactive>)"
BY_HAND = "RMA 4711: replace the tray"


def _plan():
    data = example_data("gb200-superpod")
    next(g for g in data["node_groups"] if g["name"] == "gb200")["count"] = 36
    data["health"] = {"breaker": {"out_of_service_pct": 50}}
    return compiled(spec_from_data(data))


@pytest.fixture(scope="module", params=["22.05", "26.05"])
def cluster(request):
    from conftest import need_slurm_line

    line = request.param
    need_slurm_line(line)
    plan = _plan()
    config = domainconf.guard_config(plan)
    trays = [t for d in config["domains"] for t in d["trays"]]
    base = Path(tempfile.mkdtemp(prefix="gpucluster-domain-"))
    base.chmod(0o755)  # munged refuses a socket under a folder others cannot search
    (base / "conf").mkdir()
    (base / "conf" / "slurm.conf").write_text(health_slurm_conf("domains", config["groups"]["gb200"]))
    t0 = time.monotonic()
    try:
        with SlurmCluster(base / "conf", slurmd_nodes=trays, line=line, start_timeout=120) as c:
            c.session_env = root_scontrol_env(c, base / "bin")
            c.guard = {**config, "env": c.session_env}
            c.domains = {d["name"]: d["trays"] for d in config["domains"]}
            c.base = base
            print(f"\nSlurm {line}, {len(trays)} trays: started in {time.monotonic() - t0:.1f} s")
            yield c
    finally:
        print(f"the file's cluster {time.monotonic() - t0:.1f} s")
        shutil.rmtree(base, ignore_errors=True)


def guard(c: SlurmCluster) -> dict[str, dict]:
    t0 = time.monotonic()
    with slurmctl.Session(c.session_env, munge_key=None, deadline=time.monotonic() + 50) as ctl:
        out = {r["domain"]: r for r in domainguard.run(c.guard, ctl)}
    print(f"guard run: {time.monotonic() - t0:.2f} s: {[(d, r['action']) for d, r in out.items()]}")
    return out


def nodes(c: SlurmCluster) -> dict[str, dict[str, str]]:
    return slurmctl.parse_nodes(c.scontrol("show", "node", "-o"))


def sbatch(c: SlurmCluster, domain: str, seconds: int = 300) -> str:
    """A one-tray job that may run only in `domain` (every other domain's trays excluded)."""
    others = [t for d, trays in c.domains.items() if d != domain for t in trays]
    res = c.run(["sbatch", "--parsable", "-N1", "-o", "/dev/null", f"--exclude={','.join(others)}",
                 "--wrap", f"sleep {seconds}"])
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def job(c: SlurmCluster, job_id: str) -> dict[str, str]:
    return slurmtext.record(c.scontrol("show", "job", "-o", job_id).strip())


def running_on(c: SlurmCluster, job_id: str) -> str:
    rec = wait_for(f"job {job_id} running", lambda: (r := job(c, job_id)).get("JobState") == "RUNNING" and r,
                   timeout=20, every=0.2)
    return rec["NodeList"]


@pytest.fixture(scope="module")
def story(cluster):
    """The three steps, in order; what each saw."""
    c = cluster
    d1, d2 = c.domains["nvl0001"], c.domains["nvl0002"]
    out: dict = {}
    c.scontrol("update", f"nodename={d1[0]}", "state=drain", f"reason={CHECK_REASON}")
    out["one"] = guard(c)
    out["small"] = sbatch(c, "nvl0001")
    out["small_on"] = running_on(c, out["small"])
    c.scontrol("update", f"nodename={','.join(d1[1:4])}", "state=drain", f"reason={CHECK_REASON}")
    c.scontrol("update", f"nodename={d1[4]}", "state=drain", f"reason={BY_HAND}")
    out["five"] = guard(c)
    out["after_five"] = nodes(c)
    out["waiting"] = sbatch(c, "nvl0001", 5)
    time.sleep(2)
    out["waiting_state"] = job(c, out["waiting"])["JobState"]
    out["small_state"] = job(c, out["small"])["JobState"]
    out["again"] = guard(c)  # still degraded: nothing more to do
    c.scontrol("update", f"nodename={','.join(d1[:4])}", "state=undrain")
    res = subprocess.run([sys.executable, str(NODE_DIR / "domainguard.py"), "--config", write(c)],
                         capture_output=True, text=True, timeout=60, check=False)
    out["script"] = res
    out["after_restore"] = nodes(c)
    out["waiting_on"] = running_on(c, out["waiting"])
    out["d1"], out["d2"] = d1, d2
    c.cancel_all()
    return out


def write(c: SlurmCluster) -> str:
    path = c.base / "domains.json"
    path.write_text(json.dumps(c.guard))
    return str(path)


def test_one_tray_out_the_domain_keeps_taking_small_jobs(story) -> None:
    assert story["one"]["nvl0001"]["action"] == "none" and story["one"]["nvl0002"]["action"] == "none"
    on = story["small_on"]
    assert on in story["d1"] and on != story["d1"][0], on


def test_past_the_share_the_rest_of_the_domain_drains_and_its_job_keeps_running(story) -> None:
    r = story["five"]["nvl0001"]
    d1, d2, after = story["d1"], story["d2"], story["after_five"]
    assert r["action"] == "drain" and r["applied"] is True, r
    assert r["nodes"] == d1[5:] and r["breaker"].startswith("within the breaker's limit"), r
    reason = "gpc:domain:nvl0001 5 of 18 trays out of service (more than 25%)"
    assert all(after[t]["reason"] == reason and decide.is_drained(after[t]["State"]) for t in d1[5:]), after
    assert after[d1[4]]["reason"] == BY_HAND and after[d1[0]]["reason"] == CHECK_REASON
    assert all(after[t]["State"] == "IDLE" and after[t]["reason"] == "" for t in d2)  # the other rack untouched
    busy = after[story["small_on"]]["State"].split("+")
    assert busy[:2] in (["MIXED", "DRAIN"], ["ALLOCATED", "DRAIN"]), busy  # draining: its job runs on
    assert story["small_state"] == "RUNNING" and story["waiting_state"] == "PENDING"
    assert story["again"]["nvl0001"]["action"] == "none"


def test_restored_the_domain_comes_back_together(story) -> None:
    res = story["script"]
    assert res.returncode == 0, res.stdout + res.stderr
    assert "nvl0001: resume" in res.stdout and "1 changed" in res.stdout, res.stdout
    d1, after = story["d1"], story["after_restore"]
    assert all(after[t]["reason"] == "" and not decide.is_drained(after[t]["State"]) for t in d1[:4] + d1[5:]), after
    assert after[d1[4]]["reason"] == BY_HAND and decide.is_drained(after[d1[4]]["State"])
    assert story["waiting_on"] in d1
