"""Slurm's upgrade order in a rollout and in a reconfigure: slurmdbd's hosts converge before slurmctld's, and
both before any wave of slurmd nodes (or `scontrol reconfigure`). Three places decide it, each tested as the
code runs it: the engine's controller steps (rollout/engine.py), which hosts each step converges on an
inventory (rollout/live.py: `configure --limit`), and, for a host that is both, the order of the roles in
playbooks/site.yml's Slurm play (read from the playbook itself).

The expected order is the rule (slurmdbd, then slurmctld), written here on purpose: taking it from the
code under test would let a swapped order pass."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from gpucluster.cluster import load_cluster
from gpucluster.configure.playbook import ConfigureResult
from gpucluster.inventory.reader import Inventory, load_inventory
from gpucluster.paths import examples_dir, home
from gpucluster.rollout import state as st
from gpucluster.rollout.engine import Rollout, new_state
from gpucluster.rollout.live import LiveCluster
from gpucluster.rollout.slurmops import NodeState, Slurm
from gpucluster.rollout.waves import plan_waves, topology_units
from gpucluster.slurmclient import SlurmError

STAGING = examples_dir() / "staging.yaml"
RULE = ("slurmdbd", "slurmctld")


class RecordingSlurm(Slurm):
    """Slurm as a rollout drives it, in memory: every node idle; each call recorded in `events`."""

    def __init__(self, hosts: Sequence[str], events: list):
        super().__init__(run=lambda cmd: (_ for _ in ()).throw(AssertionError(f"no client may run: {cmd}")))
        self.events = events
        self.node = {h: ({"IDLE"}, "") for h in hosts}

    def nodes(self, names=None):
        return {n: NodeState(n, frozenset(s), r) for n, (s, r) in self.node.items() if names is None or n in names}

    def drain(self, nodes, reason):
        if nodes:
            self.events.append(("drain", tuple(nodes)))
            for n in nodes:
                self.node[n] = ({"IDLE", "DRAIN"}, reason)

    def resume(self, nodes):
        if nodes:
            self.events.append(("resume", tuple(nodes)))
            for n in nodes:
                self.node[n] = ({"IDLE"}, "")

    def reboot(self, nodes, reason):
        if nodes:
            self.events.append(("reboot", tuple(nodes)))  # back at once, as nextstate=RESUME brings it

    def reserve(self, name, nodes):
        self.events.append(("reserve", tuple(nodes)))

    def release(self, name):
        self.events.append(("release", name))

    def reconfigure(self):
        self.events.append(("reconfigure",))


def _state(change: str, **kw) -> tuple[dict, list[str]]:
    c = load_cluster(STAGING)
    hosts = c.contract_groups["slurm_compute"]
    waves = plan_waves(topology_units(c.plan, "leaf", hosts), 2)
    s = new_state("staging-1", cluster=c.name, source=str(STAGING), change=change, by="leaf", max_unavailable=2,
                  waves=waves, skipped=[], halt_share=0.5)
    s.update(kw)
    return s, hosts


def _run(s: dict, hosts: list[str], tmp_path: Path, events: list, **hooks) -> None:
    slurm = RecordingSlurm(hosts, events)
    path = st.state_path(tmp_path / "state")
    st.save(path, s)  # as the command does before the first step
    Rollout(slurm, path, s, poll=0.0, say=lambda _: None, live=False, **hooks).run()


@pytest.mark.parametrize("change", ["reboot", "drain", "reconfigure"])
def test_the_engine_converges_slurmdbd_then_slurmctld_before_anything_else(change, tmp_path) -> None:
    events: list = []
    s, hosts = _state(change)
    _run(s, hosts, tmp_path, events, controller=lambda daemon: events.append(("controller", daemon)),
         apply=lambda nodes: events.append(("apply", tuple(nodes))) or {})
    assert events[:2] == [("controller", d) for d in RULE], events
    if change == "reconfigure":  # no waves: scontrol reconfigure once slurmctld's hosts have the new files
        assert events[2:] == [("reconfigure",)], events
    else:
        assert ("reconfigure",) not in events
        assert {e[0] for e in events[2:]} >= {"apply"}, events  # the waves, after both
    assert st.load(tmp_path / "state" / st.NAME)["controller"] == dict.fromkeys(RULE, "done")


def test_a_failed_slurmdbd_step_stops_before_slurmctld(tmp_path) -> None:
    events: list = []
    s, hosts = _state("reconfigure")

    def controller(daemon: str) -> None:
        events.append(("controller", daemon))
        if daemon == "slurmdbd":
            raise SlurmError("slurmdbd: the converge failed on ctl01")

    with pytest.raises(SlurmError):
        _run(s, hosts, tmp_path, events, controller=controller)
    assert events == [("controller", "slurmdbd")]
    assert st.load(tmp_path / "state" / st.NAME)["controller"] == dict.fromkeys(RULE, "pending")


def test_a_resumed_rollout_takes_up_at_slurmctld(tmp_path) -> None:
    events: list = []
    s, hosts = _state("reconfigure", controller={"slurmdbd": "done", "slurmctld": "pending"})
    _run(s, hosts, tmp_path, events, controller=lambda daemon: events.append(("controller", daemon)))
    assert events == [("controller", "slurmctld"), ("reconfigure",)]


@pytest.fixture
def converges(monkeypatch) -> list:
    """Every `configure --limit` a LiveCluster runs, in order, as ("configure", limit); none runs Ansible."""
    events: list = []

    def configure(path, *, limit=None, tags=None, secrets=None, log=None, **_kw):
        events.append(("configure", limit))
        return ConfigureResult(rc=0, status="successful", hosts={}, failures={}, role_times={}, elapsed=0.0,
                               artifacts=None)

    monkeypatch.setattr("gpucluster.configure.configure", configure)
    return events


def _separate(tmp_path: Path, compute: list[str]) -> Inventory:
    """An inventory whose slurmdbd, slurmctld and login nodes are three hosts, listed controller first (so
    neither inventory order nor group order can hide a swapped step)."""
    groups = {"slurm_controller": ["ctl01"], "slurm_login": ["login01"], "slurm_dbd": ["dbd01"],
              "slurm_compute": compute}
    return Inventory(path=tmp_path / "inv", hosts={}, groups=groups, vars={})


@pytest.mark.parametrize("change", ["reconfigure", "drain"])
def test_on_an_inventory_slurmdbds_hosts_converge_before_slurmctlds(change, converges, tmp_path) -> None:
    s, hosts = _state(change)
    live = LiveCluster(tmp_path / "inv", _separate(tmp_path, hosts), health=False, say=lambda _: None)
    _run(s, hosts, tmp_path, converges, controller=live.controller, apply=live.apply)
    assert converges[:2] == [("configure", "dbd01"), ("configure", "ctl01,login01")], converges
    if change == "reconfigure":
        assert converges[2:] == [("reconfigure",)]
    else:  # then the waves: drained, converged (their own --limit), resumed
        first = s["waves"][0]["nodes"]
        assert converges[2:5] == [("drain", tuple(first)), ("configure", ",".join(first)),
                                  ("resume", tuple(first))], converges


def test_a_host_that_is_both_converges_once_in_the_slurmdbd_step(converges, tmp_path) -> None:
    """staging's ctl01 runs slurmdbd and slurmctld: it converges once, in the slurmdbd step; the order inside
    that converge is the playbook's (next test)."""
    from gpucluster.inventory import write_inventory

    spec = load_cluster(STAGING)
    folder = tmp_path / "inv"
    write_inventory(folder, spec, extra_vars={"gpucluster_spec": str(STAGING)})
    inv = load_inventory(folder)
    assert inv.group("slurm_dbd") == inv.group("slurm_controller") == ["ctl01"]
    s, hosts = _state("reconfigure")
    live = LiveCluster(folder, inv, health=False, say=lambda _: None)
    _run(s, hosts, tmp_path, converges, controller=live.controller)
    assert converges == [("configure", "ctl01"), ("reconfigure",)]


def _slurm_play_roles() -> list[str]:
    """The roles playbooks/site.yml's Slurm play includes, in the order it runs them."""
    site = yaml.safe_load((home() / "playbooks" / "site.yml").read_text())
    plays = [p for p in site if "slurm_dbd" in str(p.get("hosts", "")) and p.get("tasks")]
    roles = [t["ansible.builtin.include_role"]["name"] for p in plays for t in p["tasks"]
             if "ansible.builtin.include_role" in t]
    assert roles, "no Slurm play with include_role tasks in playbooks/site.yml"
    return roles


def test_the_slurm_play_runs_slurmdbds_role_before_slurmctlds() -> None:
    roles = _slurm_play_roles()
    assert "slurm_dbd" in roles and "slurm_controller" in roles, roles
    assert roles.index("slurm_dbd") < roles.index("slurm_controller"), roles
    assert roles.index("slurm_controller") < roles.index("slurm_compute"), roles
