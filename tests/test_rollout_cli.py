"""`gpucluster rollout` without a cluster: --dry-run prints the planner's waves, bad input exits 2 with a
located message and writes nothing, and the state file is all or nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucluster.cli import main
from gpucluster.cluster import load_cluster
from gpucluster.errors import UsageError
from gpucluster.paths import examples_dir
from gpucluster.rollout import state as st
from gpucluster.rollout.engine import Rollout, new_state
from gpucluster.rollout.slurmops import NodeState, Slurm
from gpucluster.rollout.waves import parse_max_unavailable, plan_waves, topology_units

STAGING = examples_dir() / "staging.yaml"


def test_dry_run_prints_the_planners_waves(capsys) -> None:
    assert main(["rollout", str(STAGING), "--dry-run", "--max-unavailable", "2"]) == 0
    out = capsys.readouterr().out
    c = load_cluster(STAGING)
    units = topology_units(c.plan, "leaf", c.contract_groups["slurm_compute"])
    waves = plan_waves(units, parse_max_unavailable("2", len(c.contract_groups["slurm_compute"]), 2))
    assert f"in {len(waves)} waves" in out
    for w in waves:
        assert f"wave {w.index:>3}: {len(w.nodes):>4} nodes  {', '.join(w.units)}" in out


@pytest.mark.parametrize(("args", "words"), [
    (["--max-unavailable", "1"], "allow at least 2, or roll out --by node"),
    (["--max-unavailable", "lots"], "give a node count"),
])
def test_bad_input_exits_2_with_the_fix(args, words, capsys) -> None:
    assert main(["rollout", str(STAGING), "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert str(STAGING) in err and words in err and "Traceback" not in err


def test_missing_target_and_missing_state_exit_2(tmp_path, capsys) -> None:
    assert main(["rollout", str(tmp_path / "nope.yaml"), "--dry-run"]) == 2
    assert main(["rollout", str(STAGING), "--status", "--state-dir", str(tmp_path / "s")]) == 2
    assert "no rollout state here" in capsys.readouterr().err


def _state() -> dict:
    c = load_cluster(STAGING)
    waves = plan_waves(topology_units(c.plan, "leaf", c.contract_groups["slurm_compute"]), 2)
    return new_state("staging-1", cluster="staging", source=str(STAGING), change="drain", by="leaf",
                     max_unavailable=2, waves=waves, skipped=[], halt_share=0.1)


def test_state_file_is_atomic_and_checked(tmp_path) -> None:
    path = st.state_path(tmp_path / "s")
    s = _state()
    st.save(path, s)
    assert json.loads(path.read_text()) == s == st.load(path)
    with pytest.raises(TypeError):
        st.save(path, {**s, "source": object()})
    assert st.load(path) == s  # the failed write left the last state whole
    assert [p.name for p in Path(path.parent).iterdir()] == [st.NAME]
    path.write_text("{not json")
    with pytest.raises(UsageError, match="not a rollout state file"):
        st.load(path)


@pytest.mark.parametrize(("version", "how"), [("22.05", "restart"), ("24.11", "reconfigure")])
def test_resize_dry_run_names_hosts_and_how_the_release_learns_them(version, how, tmp_path, capsys) -> None:
    from gpucluster.emulate.specs import scaled_spec

    for name, n in (("old", 12), ("new", 16)):
        (tmp_path / f"{name}.yaml").write_text(scaled_spec("meta-24k-ib", {"h100": n}, name="rs",
                                                           fabric={"scalable_unit_nodes": 4},
                                                           slurm={"version": version}))
    old, new = str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml")
    assert main(["rollout", old, "--resize", new, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"4 nodes added, 0 removed, 12 kept; Slurm {version} learns a node list by {how}" in out
    assert "enroll gti[0013-0016]" in out and "drain them at once (reason gpc:grow ID)" in out
    assert main(["rollout", new, "--resize", old, "--dry-run"]) == 0
    assert "drain gti[0013-0016] (reason gpc:shrink ID)" in capsys.readouterr().out
    assert main(["rollout", old, "--resize", new]) == 2  # a SPEC target: only the plan; changing needs an inventory


# ------------------------------------------------------------------------------------------------ whose node
# A rollout acts only on nodes whose reason is its own ("gpc:rollout ID"). Every other reason, those gpucluster
# itself writes included (a health check's, another rollout's, a grow's), is someone else's: such a node is in
# no wave, never drained over, never resumed, never counted done.
OTHERS = {
    "health": "gpc:mount-flash: /mnt/flash is not mounted",
    "another-rollout": "gpc:rollout staging-20250101T000000",
    "same-prefix": "gpc:rollout staging-10",  # this rollout is staging-1
    "another-rollout-failed": "gpc:rollout staging-0 failed: checks: gpu burn",
    "grow": "gpc:grow staging-1",
    "by-hand": "fan replaced, by hand",
}


class FakeSlurm(Slurm):
    """Slurm's node table in memory, as the rollout drives it: drain, resume, reboot (the node is back at the
    next poll, as `after_reboot` says, else idle with no reason), jobs that end on a poll, and `on_poll`:
    what happens on the cluster at each poll (a health check draining a node). Records every call."""

    def __init__(self, hosts, *, busy=(), on_poll=None, after_reboot=None):
        super().__init__(run=lambda cmd: (_ for _ in ()).throw(AssertionError(f"no client may run: {cmd}")))
        self.node = {h: [{"ALLOCATED"} if h in busy else {"IDLE"}, ""] for h in hosts}
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.polls, self.on_poll, self.after_reboot, self.rebooting = 0, on_poll, after_reboot or {}, set()

    def set(self, node: str, states: set[str], reason: str) -> None:
        self.node[node] = [set(states), reason]

    def nodes(self, names=None):
        self.polls += 1
        for n in list(self.rebooting):
            self.set(n, *self.after_reboot.get(n, ({"IDLE"}, "")))
            self.rebooting.discard(n)
        if self.on_poll:
            self.on_poll(self, self.polls)
        return {n: NodeState(n, frozenset(s), r) for n, (s, r) in self.node.items() if names is None or n in names}

    def drain(self, nodes, reason):
        self.calls.append(("drain", tuple(nodes)))
        for n in nodes:
            self.node[n][0].add("DRAIN")
            self.node[n][1] = reason

    def resume(self, nodes):
        self.calls.append(("resume", tuple(nodes)))
        for n in nodes:
            self.node[n][0].discard("DRAIN")
            self.node[n][1] = ""

    def reboot(self, nodes, reason):
        self.calls.append(("reboot", tuple(nodes)))
        for n in nodes:
            self.set(n, {"IDLE", "DRAIN", "REBOOT_REQUESTED"}, reason)
        self.rebooting.update(nodes)

    def reserve(self, name, nodes):
        self.calls.append(("reserve", tuple(nodes)))

    def release(self, name):
        self.calls.append(("release", ()))

    def reconfigure(self):
        self.calls.append(("reconfigure", ()))

    def touched(self, node: str) -> list[str]:
        return [what for what, nodes in self.calls if node in nodes]


def _engine(change: str, fake: FakeSlurm, tmp_path, **hooks) -> dict:
    s = _state()
    s.update(change=change)
    path = st.state_path(tmp_path / "state")
    st.save(path, s)
    Rollout(fake, path, s, poll=0.0, wait_timeout=5.0, reboot_timeout=5.0, say=lambda _: None, live=False,
            **hooks).run()
    return st.load(path)


@pytest.mark.parametrize("reason", OTHERS.values(), ids=OTHERS.keys())
def test_a_new_rollout_puts_a_node_out_for_another_reason_in_no_wave(reason, monkeypatch, tmp_path, capsys) -> None:
    c = load_cluster(STAGING)
    hosts = c.contract_groups["slurm_compute"]
    fake = FakeSlurm(hosts)
    fake.set(hosts[1], {"IDLE", "DRAIN"}, reason)
    monkeypatch.setattr("gpucluster.rollout.slurmops.Slurm", lambda *a, **k: fake)
    assert main(["rollout", str(STAGING), "--change", "drain", "--by", "node", "--max-unavailable", "1",
                 "--state-dir", str(tmp_path / "state"), "--poll", "0"]) == 0, capsys.readouterr()
    s = st.load(tmp_path / "state" / st.NAME)
    assert hosts[1] not in {n for w in s["waves"] for n in w["nodes"]}
    assert s["nodes"][hosts[1]]["outcome"] == "by-hand" and s["nodes"][hosts[1]]["wave"] == 0
    assert fake.touched(hosts[1]) == [] and fake.node[hosts[1]] == [{"IDLE", "DRAIN"}, reason]
    assert {s["nodes"][n]["outcome"] for n in hosts if n != hosts[1]} == {"done"}


@pytest.mark.parametrize("change", ["drain", "reboot"])
@pytest.mark.parametrize("reason", OTHERS.values(), ids=OTHERS.keys())
def test_a_wave_leaves_a_node_drained_for_another_reason_before_it(reason, change, tmp_path) -> None:
    """Drained after the waves were planned (or in a state resumed later): in its wave, and still left alone."""
    hosts = load_cluster(STAGING).contract_groups["slurm_compute"]
    fake = FakeSlurm(hosts)
    fake.set(hosts[2], {"IDLE", "DRAIN"}, reason)
    s = _engine(change, fake, tmp_path)
    assert s["nodes"][hosts[2]]["outcome"] == "by-hand" and reason in s["nodes"][hosts[2]]["detail"]
    assert fake.touched(hosts[2]) == [] and fake.node[hosts[2]] == [{"IDLE", "DRAIN"}, reason]
    assert {s["nodes"][n]["outcome"] for n in hosts if n != hosts[2]} == {"done"}


@pytest.mark.parametrize("reason", [OTHERS["health"], OTHERS["another-rollout"], OTHERS["same-prefix"]],
                         ids=["health", "another-rollout", "same-prefix"])
def test_a_node_drained_for_another_reason_during_the_wave_is_never_resumed(reason, tmp_path) -> None:
    """Drain class: the node runs a job when the wave drains it; as the job ends, a health check drains it with
    its own reason (Slurm keeps the last reason): the rollout no longer owns it."""
    hosts = load_cluster(STAGING).contract_groups["slurm_compute"]
    node = hosts[0]

    def health(fake: FakeSlurm, poll: int) -> None:
        if poll == 3:
            fake.set(node, {"IDLE", "DRAIN"}, reason)

    fake = FakeSlurm(hosts, busy={node}, on_poll=health)
    s = _engine("drain", fake, tmp_path)
    assert s["nodes"][node]["outcome"] == "by-hand" and reason in s["nodes"][node]["detail"]
    assert fake.touched(node) == ["drain"] and fake.node[node] == [{"IDLE", "DRAIN"}, reason]


@pytest.mark.parametrize("change", ["drain", "reboot"])
def test_a_node_drained_for_another_reason_during_its_checks_is_not_done(change, tmp_path) -> None:
    """The health check drains the node while the rollout's checks run (after its reboot, or its apply): the
    rollout neither resumes it nor counts it done."""
    hosts = load_cluster(STAGING).contract_groups["slurm_compute"]
    node = hosts[3]
    fake = FakeSlurm(hosts)

    def check(nodes):
        if node in nodes:
            fake.set(node, {"IDLE", "DRAIN"}, OTHERS["health"])
        return {}

    s = _engine(change, fake, tmp_path, check=check)
    assert s["nodes"][node]["outcome"] == "by-hand", s["nodes"][node]
    assert "resume" not in fake.touched(node) and fake.node[node] == [{"IDLE", "DRAIN"}, OTHERS["health"]]


def test_a_node_back_from_its_reboot_drained_for_another_reason_is_not_done(tmp_path) -> None:
    """Reboot class: the node comes back drained by its health check at boot: not ours, not done."""
    hosts = load_cluster(STAGING).contract_groups["slurm_compute"]
    node = hosts[1]
    fake = FakeSlurm(hosts, after_reboot={node: ({"IDLE", "DRAIN"}, OTHERS["health"])})
    s = _engine("reboot", fake, tmp_path)
    assert s["nodes"][node]["outcome"] == "by-hand" and fake.node[node] == [{"IDLE", "DRAIN"}, OTHERS["health"]]
    assert {s["nodes"][n]["outcome"] for n in hosts if n != node} == {"done"}


class _NoDaemons:
    """resize.Controller that does nothing: the grow's Slurm side is the fake's."""

    def load_config(self, nodes): ...
    def restart_slurmctld(self): ...
    def restart_slurmd(self, nodes): ...
    def start_slurmd(self, nodes): ...
    def stop_slurmd(self, nodes): ...


@pytest.mark.parametrize("reason", [OTHERS["health"], "gpc:grow rs-10"], ids=["health", "same-prefix"])
def test_a_grow_resumes_only_new_nodes_with_its_own_reason(reason) -> None:
    """A new node drained for another reason while it is checked (a health check; a grow whose id this one's
    prefixes) stays out of service: the grow resumes only nodes whose reason is still its own."""
    from gpucluster.rollout.resize import Resize, grow

    new = ["gti0013", "gti0014"]
    fake = FakeSlurm(new)

    def check(nodes):
        fake.set(new[1], {"IDLE", "DRAIN"}, reason)
        return {}

    assert grow(Resize(tuple(new), (), (), "24.11", "reconfigure"), _NoDaemons(), fake, "rs-1", check=check,
                say=lambda _: None) == {}
    assert fake.touched(new[0]) == ["drain", "resume"] and fake.node[new[0]] == [{"IDLE"}, ""]
    assert "resume" not in fake.touched(new[1]) and fake.node[new[1]] == [{"IDLE", "DRAIN"}, reason]


def test_the_library_entry_plans_what_the_dry_run_prints(capsys) -> None:
    """rollout.actions.plan is what --dry-run prints: the command adds nothing of its own."""
    from gpucluster.rollout import actions

    assert main(["rollout", str(STAGING), "--dry-run", "--by", "node", "--max-unavailable", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == \
        actions.plan(actions.target(STAGING), change="reboot", by="node", max_unavailable="2").as_json()
