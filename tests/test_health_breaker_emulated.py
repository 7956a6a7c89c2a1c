"""The circuit breaker on a real slurmctld (22.05 from the host's packages, 24.11 and 26.05 from the emulator's
Debian roots): one group of 512 nodes, a shared-cause failure on 30 % of them, each failing node's run
(show, decide, breaker.admit, drain: what runner.run() does at its drain point) made at once from many
threads. At most the group's token count is drained, the breaker opens once and names the shared cause, the
rest is held; a node drained by hand is never touched and counts as out of service; reset-breaker's scontrol
commands close it; a group with its out-of-service share reached holds the next drain without a token; and
runner.run() itself, with a failing check, is held while the breaker is open and drains once it is reset.

The nodes: slurmctld knows all 512, State=CLOUD (IDLE+CLOUD+POWERED_DOWN, shown with PrivateData=cloud),
with no slurmd behind them. 512 `slurmd -N` take 40-90 s to register on this 2-core machine, and the breaker
reads only what slurmctld says about the nodes (state, reason): drains, reservations and licenses are
slurmctld's alone, the same whether a slurmd answers or not.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import health_slurm_conf, root_scontrol_env

from gpucluster.emulate import SlurmCluster
from gpucluster.health import breakerstate as fleet
from gpucluster.node import breaker, decide, runner, slurmctl
from gpucluster.render.health.breakerconf import limit
from gpucluster.spec.model import HealthBreaker

pytestmark = [pytest.mark.slurm, pytest.mark.emulate]

SIZE = 512
SPEC = HealthBreaker()  # the spec's defaults: 5 % drains per 60 min, 10 % out of service, floor 2
DRAINS = limit(SIZE, SPEC.drains_pct, SPEC.min_nodes)
OUT_OF_SERVICE = limit(SIZE, SPEC.out_of_service_pct, SPEC.min_nodes)
NODES = [f"gpu{i:03d}" for i in range(1, SIZE + 1)]
FAILING = NODES[::3][: int(SIZE * 0.3)]  # 30 % of the group, spread over it
HAND = FAILING[7]  # drained by an operator before the storm: its check fails too
CHECK, MESSAGE = "mount-flash", "/mnt/flash (fuse) did not answer within 15s"
THREADS = 32
CONFIG = {"breaker": {"enabled": True, "group": "gpu", "nodes": f"gpu[001-{SIZE:03d}]", "size": SIZE,
                      "drains": DRAINS, "out_of_service": OUT_OF_SERVICE, "window_minutes": SPEC.window_minutes}}
SLURM_CONF = health_slurm_conf("breaker", f"gpu[001-{SIZE:03d}]", "PrivateData=cloud",
                               f"Licenses=gpc_drain_gpu:{DRAINS},gpc_breaker_gpu:1")


@pytest.fixture(scope="module", params=["22.05", "24.11", "26.05"])
def cluster(request):
    base = Path(tempfile.mkdtemp(prefix="gpucluster-breaker-"))
    base.chmod(0o755)  # munged refuses a socket under a folder others cannot search
    (base / "conf").mkdir()
    (base / "conf" / "slurm.conf").write_text(SLURM_CONF)
    try:
        with SlurmCluster(base / "conf", absent_state="CLOUD", line=request.param, start_timeout=120) as c:
            c.session_env = root_scontrol_env(c, base / "bin")
            yield c
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_node(c: SlurmCluster, node: str) -> tuple[str, str, str]:
    """One failing node's run at its drain point, as runner.run() makes it: (node, outcome, why)."""
    with slurmctl.Session(c.session_env, munge_key=None, deadline=time.monotonic() + 50) as ctl:
        info, why = ctl.show(node)
        if info is None:
            return node, "unread", why
        d = decide.decide(info["State"], info["reason"], [(CHECK, MESSAGE)], 0, 3)
        if d.action != "drain":
            return node, "none", d.why
        if not decide.is_drained(info["State"]):
            admitted, why = breaker.admit(ctl, CONFIG, node, CHECK)
            if not admitted:
                return node, "held", why
        ok, text = ctl.drain(node, d.reason, seen=info)
        return node, "drained" if ok else "failed", text


def storm(c: SlurmCluster, nodes: list[str]) -> tuple[dict[str, tuple[str, str]], float]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        out = {n: (what, why) for n, what, why in pool.map(lambda n: run_node(c, n), nodes)}
    return out, time.monotonic() - t0


def slurm_nodes(c: SlurmCluster) -> dict[str, dict[str, str]]:
    return slurmctl.parse_nodes(c.scontrol("show", "node", "-o"))


def group_breaker(c: SlurmCluster) -> fleet.GroupBreaker:
    (row,) = fleet.breakers(c.scontrol("show", "reservation", "-o"), c.scontrol("show", "license", "-o"))
    return row


def reset(c: SlurmCluster) -> list[str]:
    """What `gpucluster health reset-breaker --group gpu` runs on the controller."""
    commands = fleet.reset_commands(c.scontrol("show", "reservation", "-o"), "gpu")
    for argv in commands:
        c.run(argv, check=True)
    return [argv[-1] for argv in commands]


def test_a_shared_cause_on_30_percent_drains_at_most_the_budget_and_opens_the_breaker(cluster) -> None:
    c = cluster
    assert group_breaker(c).as_json()["state"] == "closed" and group_breaker(c).tokens == DRAINS
    c.scontrol("update", f"nodename={HAND}", "state=drain", "reason=RMA 4711: replace the HCA")
    outcome, seconds = storm(c, FAILING)
    print(f"Slurm {c.line}: {len(FAILING)} runs from {THREADS} threads in {seconds:.1f} s")
    nodes = slurm_nodes(c)
    ours = sorted(n for n, i in nodes.items() if decide.is_drained(i["State"]) and i["reason"].startswith("gpc:"))
    held = sorted(n for n, (what, _) in outcome.items() if what == "held")
    assert len(ours) == DRAINS, (len(ours), outcome)
    assert sorted(n for n, (what, _) in outcome.items() if what == "drained") == ours
    assert all(nodes[n]["reason"] == decide.reason_for([(CHECK, MESSAGE)]) for n in ours)
    assert len(held) == len(FAILING) - 1 - DRAINS
    assert not any(decide.is_drained(nodes[n]["State"]) for n in held)
    # the node drained by hand: its runner changed nothing, its reason is the operator's
    assert outcome[HAND][0] == "none" and nodes[HAND]["reason"] == "RMA 4711: replace the HCA"
    # exactly one latch, naming the shared cause; every held run says the breaker held it
    row = group_breaker(c)
    latches = [r for r in slurmctl.parse_reservations(c.scontrol("show", "reservation", "-o"))
               if "gpc_breaker_gpu" in slurmctl.licenses_of(r)]
    assert len(latches) == 1 and row.open and len(row.used) == DRAINS
    assert re.search(rf"{CHECK} on \d+ nodes", row.why), row.why
    assert f"{DRAINS} drains in {SPEC.window_minutes} min" in row.why  # the name's words on 22.05, else its Comment
    assert all(outcome[n][1].startswith("held by the breaker") for n in held)
    # open: a later run is held at once, whatever its check
    again = run_node(c, held[0])
    assert again[1] == "held" and "open since" in again[2] and CHECK in again[2], again


def test_reset_closes_the_breaker_and_the_out_of_service_share_holds_without_a_token(cluster) -> None:
    c = cluster
    deleted = reset(c)
    assert len(deleted) == DRAINS + 1 and not group_breaker(c).open and group_breaker(c).used == []
    out = sum(1 for i in slurm_nodes(c).values() if decide.is_drained(i["State"]))
    assert out == DRAINS + 1  # the gpc: drains and the node drained by hand (no node is down or failed here)
    # an operator drains more by hand until the share is reached (none of these nodes is failing)
    extra = [n for n in NODES if n not in FAILING][: OUT_OF_SERVICE - out]
    c.scontrol("update", f"nodename={','.join(extra)}", "state=drain", "reason=maintenance")
    node = next(n for n in FAILING if not decide.is_drained(slurm_nodes(c)[n]["State"]))
    assert run_node(c, node)[1] == "held"
    row = group_breaker(c)
    assert row.open and row.used == [] and re.search(rf"{OUT_OF_SERVICE} of {SIZE} (nodes )?out of service", row.why)
    assert f"{CHECK} on {DRAINS + 1} nodes" in row.why, row.why
    assert set(reset(c)) == {row.latch} and not group_breaker(c).open


def test_the_runner_asks_the_breaker_before_it_drains(cluster, tmp_path) -> None:
    """runner.run() as slurmd runs it, a check failing: held (nothing changed in Slurm, `held` in its summary)
    while the group's out-of-service share is reached; drained, with a token, once an operator has returned
    their nodes and reset the breaker."""
    c = cluster
    node = next(n for n in NODES if n not in FAILING and not decide.is_drained(slurm_nodes(c)[n]["State"]))
    config = {**CONFIG, "env": c.session_env, "state_dir": str(tmp_path / "state"), "site_dir": str(tmp_path / "no"),
              "run_budget": 40, "resume_after": 3, "fail_after": 1,
              "checks": [{"name": "disk-tmp", "kind": "disk", "path": str(tmp_path), "min_free_pct": 100,
                          "timeout": 10}]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    summary = runner.run(str(path), node=node)  # the last test left the share reached (its maintenance drains)
    assert summary["action"] == "held" and summary["breaker"].startswith("held by the breaker"), summary
    assert not decide.is_drained(slurm_nodes(c)[node]["State"])
    back = [n for n, i in slurm_nodes(c).items() if i["reason"] == "maintenance"]
    c.scontrol("update", f"nodename={','.join(back)}", "state=resume")
    reset(c)
    summary = runner.run(str(path), node=node)
    assert summary["action"] == "drain" and summary["applied"] is True, summary
    assert summary["breaker"].startswith(f"drain token {breaker.token_name(node)} taken"), summary
    assert slurm_nodes(c)[node]["reason"].startswith("gpc:disk-tmp: ")
