"""The node lifecycle on a real slurmctld of 512 nodes (22.05, the host's packages): 507 of them State=CLOUD, as the
breaker's emulated test has them, and five with a `slurmd -N` each, whose reboot is the emulator's RebootProgram
(slurmd stopped, started again with a new boot time). Through runner.run() on each node:

- three nodes log XID 79 (GPU fallen off the bus): rebooted (a breaker token each), back IDLE, and the run after
  the boot passes: production -> rebooting -> production, without a person;
- one node logs XID 79 again after its reboot: service-required (`gpc:service: ...`), which passing runs never
  lift; its repair ticket names its rack, U position and cables from the plan, and the evidence;
- that node, repaired, goes through `health accept` (health/accept.py): its own MAINT reservation, resumed into
  it, a health run and a DCGM job (a stand-in job script that reports a pass, as the real one does) submitted into
  the reservation; back to production, the reservation gone;
- a node drained by hand with the same XID is never touched.
The figures (seconds from each run to IDLE again, the acceptance's length) are printed for docs/health.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import health_slurm_conf, root_scontrol_env, wait_for
from test_health_reboot_emulated import boot, in_service, node_config, slurm_node
from test_health_xid import X79

from gpucluster.cluster import load_cluster
from gpucluster.emulate import SlurmCluster
from gpucluster.health import accept, ticket
from gpucluster.node import decide, nodestate, runner, slurmctl
from gpucluster.render.health.breakerconf import limit
from gpucluster.spec.model import HealthBreaker

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]

SIZE = 512
NODES = [f"gpu{i:03d}" for i in range(1, SIZE + 1)]
LIVE = NODES[:5]  # the nodes with a slurmd
FALLEN = LIVE[:3]  # XID 79 once
RECUR = LIVE[3]  # XID 79 again after its reboot
HAND = LIVE[4]  # drained by an operator, the same XID logged
BY_HAND = "RMA 4711: GPU 0 to be replaced"
SPEC = HealthBreaker()
BREAKER = {"enabled": True, "group": "gpu", "nodes": f"gpu[001-{SIZE:03d}]", "size": SIZE,
           "drains": limit(SIZE, SPEC.drains_pct, SPEC.min_nodes),
           "out_of_service": limit(SIZE, SPEC.out_of_service_pct, SPEC.min_nodes), "window_minutes": 60}
SLURM_CONF = health_slurm_conf("lifecycle", f"gpu[001-{SIZE:03d}]", "PrivateData=cloud",
                               f"Licenses=gpc_drain_gpu:{BREAKER['drains']},gpc_breaker_gpu:1")
STAGING = Path(__file__).resolve().parent.parent / "examples" / "staging.yaml"


def spec_of_512(folder: Path) -> Path:
    """examples/staging.yaml with its GPU group at 512 nodes named as the emulated ones (the ticket's plan)."""
    text = STAGING.read_text().replace('    count: 4\n    hostname: "gpu##"',
                                       f'    count: {SIZE}\n    hostname: "gpu###"')
    text = text.replace("nodes_per_leaf: 2 ", "nodes_per_leaf: 32 ").replace("nodes_per_rack: 2", "nodes_per_rack: 4")
    path = folder / "spec.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def cluster():
    base = Path(tempfile.mkdtemp(prefix="gpucluster-lifecycle-"))
    base.chmod(0o755)  # munged refuses a socket under a folder others cannot search
    (base / "conf").mkdir()
    (base / "conf" / "slurm.conf").write_text(SLURM_CONF)
    t0 = time.monotonic()
    try:
        with SlurmCluster(base / "conf", slurmd_nodes=LIVE, absent_state="CLOUD", line="22.05", start_timeout=120,
                          reboot_delay=0.5) as c:
            c.base = base
            c.session_env = root_scontrol_env(c, base / "bin")
            yield c
    finally:
        print(f"\nthe file's cluster: {time.monotonic() - t0:.1f} s")
        shutil.rmtree(base, ignore_errors=True)


def state_of(c: SlurmCluster, node: str) -> dict:
    return json.loads((c.base / "nodes" / node / "state" / "state.json").read_text())


@pytest.fixture(scope="module")
def story(cluster):
    """Every node's first run, the reboots, the runs after the boot (RECUR's XID again), and the figures."""
    c = cluster
    configs = {n: node_config(c, n, BREAKER, lifecycle={"triages": 3, "window_s": 7 * 86400}) for n in LIVE}
    c.scontrol("update", f"nodename={HAND}", "state=drain", f"reason={BY_HAND}")
    first, ended = {}, {}
    for n in LIVE:
        first[n] = runner.run(str(configs[n]), node=n)
        ended[n] = time.monotonic()
    back = {}
    for n in (*FALLEN, RECUR):
        wait_for(f"{n} IDLE after its reboot", lambda n=n: in_service(slurm_node(c, n)), timeout=60, every=0.1)
        back[n] = time.monotonic() - ended[n]
    for n in (*FALLEN, RECUR):
        boot(c, n, f"{n}-boot-2")
    with (c.base / "nodes" / RECUR / "kern.log").open("a") as fh:
        fh.write(X79.replace("8734.123456", "31.000000") + "\n")  # the GPU falls off the bus again
    after = {n: runner.run(str(configs[n]), node=n) for n in (*FALLEN, RECUR, HAND)}
    print("\n" + "\n".join(f"{n}: IDLE {back[n]:.1f} s after the run that asked for its reboot" for n in back))
    return {"configs": configs, "first": first, "after": after, "back": back}


def test_three_nodes_with_xid_79_reboot_and_come_back_without_a_person(cluster, story) -> None:
    for n in FALLEN:
        assert (story["first"][n]["action"], story["first"][n]["applied"]) == ("reboot", True), story["first"][n]
        again = story["after"][n]
        assert again["action"] == "none" and again["why"] == "all checks pass", again
        assert in_service(slurm_node(cluster, n))
        moves = [(h["from"], h["to"]) for h in again["lifecycle"]["history"]]
        assert moves == [(None, "production"), ("production", "rebooting"), ("rebooting", "production")], moves
        assert again["lifecycle"]["history"][1]["gpu_errors"][0]["class"] == "xid79"
        assert again["lifecycle"]["history"][2]["why"] == "back in service after its reboot"
    assert sorted(n for n, *_ in cluster.reboots) == sorted((*FALLEN, RECUR))


def test_a_node_whose_xid_recurs_is_service_required_and_stays_drained(cluster, story) -> None:
    s = story["after"][RECUR]
    assert s["action"] == "drain" and s["applied"] is True, s
    info = slurm_node(cluster, RECUR)
    assert decide.is_drained(info["State"]) and info["reason"].startswith("gpc:service: gpu-xid again "), info
    assert s["lifecycle"]["state"] == "service-required"
    boot(cluster, RECUR, f"{RECUR}-boot-3")  # a reboot by hand clears the GPU error: the checks pass
    for _ in range(3):
        quiet = runner.run(str(story["configs"][RECUR]), node=RECUR)
    assert quiet["checks"]["gpu-xid"]["ok"] is True and quiet["action"] == "none", quiet
    assert slurm_node(cluster, RECUR)["reason"] == info["reason"]  # only acceptance brings it back


def test_its_ticket_names_its_rack_u_position_cables_and_evidence(cluster, story, tmp_path) -> None:
    plan = ticket.node_plan(load_cluster(str(spec_of_512(tmp_path))), RECUR)
    info = slurm_node(cluster, RECUR)
    doc = ticket.build(plan, {"made": time.time(), "slurm": {"state": info["State"], "reason": info["reason"]},
                              "health": state_of(cluster, RECUR)})
    text = ticket.markdown(doc)
    assert plan["rack"] in text and plan["cables"] and plan["cables"][0]["b_device"] in text
    assert "u" in plan and str(plan["u"]) in text
    assert "gpc:service: gpu-xid again" in text and "XID 79" in text
    assert "## Lifecycle: `service-required`" in text
    assert [(e["from"], e["to"]) for e in doc["health"]["history"]][-2:] == [("rebooting", "production"),
                                                                               ("production", "service-required")]


def test_acceptance_brings_the_repaired_node_back_to_production(cluster, story) -> None:
    c = cluster
    config = story["configs"][RECUR]
    program = "gpucluster-health"
    job = c.base / "accept-dcgm.sh"  # the DCGM job's report, as templates/health/active-job.sh.j2 makes it
    job.write_text(f"#!/bin/sh\nexec {sys.executable} {runner.__file__} --config {config} --node {RECUR} "
                   "--report dcgm-diag --passed 'dcgmi diag -r 1 passed (stand-in: no GPU here)'\n")
    job.chmod(0o755)

    def on_node(argv: list[str]) -> subprocess.CompletedProcess:
        if argv[0] == program:
            argv = [sys.executable, runner.__file__, "--config", str(config), "--node", RECUR, *argv[1:]]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    def show() -> tuple[str, str]:
        info = slurm_node(c, RECUR)
        return info["State"], info["reason"]

    boot(c, RECUR, f"{RECUR}-boot-3")  # repaired: a new boot, the GPU error closed
    t0 = time.monotonic()
    out = accept.accept(RECUR, lambda argv: c.run(argv, timeout=120), on_node, show, program,
                        [("dcgm-diag", str(job))], str(c.base / "nodes" / RECUR / "state" / "state.json"),
                        "GPU 0 reseated")
    print(f"\nacceptance of {RECUR}: {time.monotonic() - t0:.1f} s; " + "; ".join(out.steps))
    assert out.passed, (out.why, out.steps)
    assert set(out.checks) == {"gpu-xid", "dcgm-diag"}
    assert in_service(slurm_node(c, RECUR))
    assert not [r for r in slurmctl.parse_reservations(c.scontrol("show", "reservation", "-o"))
                if r["ReservationName"] == accept.reservation(RECUR)]
    moves = [h["to"] for h in state_of(c, RECUR)["lifecycle"]["history"]]
    assert moves[-3:] == ["service-required", "acceptance", "production"], moves
    # the next passive run keeps it in production
    assert runner.run(str(config), node=RECUR)["lifecycle"]["state"] == nodestate.PRODUCTION


def test_a_node_drained_by_hand_is_never_touched(cluster, story) -> None:
    for s in (story["first"][HAND], story["after"][HAND]):
        assert s["action"] == "none" and s["why"] == "drained by hand: left as the operator set it", s
    info = slurm_node(cluster, HAND)
    assert decide.is_drained(info["State"]) and info["reason"] == BY_HAND
    assert HAND not in {n for n, *_ in cluster.reboots}
    assert story["after"][HAND]["lifecycle"]["state"] is None  # not gpucluster's: no state recorded
