"""`gpucluster configure` sizes Ansible's forks to the hosts the run reaches, so the push that remains is
cheaper: one worker per host up to FORKS_MAX, so a task reaches every host in one batch. Checked on the command
ansible-runner really ran (its artifacts), with the compile play alone (it runs on the controller, no node)."""

from __future__ import annotations

import json

import pytest
from conftest import example_path

from gpucluster.configure.playbook import FORKS_MAX, configure, forks_for
from gpucluster.inventory.build import build_inventory


@pytest.mark.parametrize(("hosts", "environ", "want"), [
    (4, {}, 4),
    (0, {}, 1),
    (FORKS_MAX * 10, {}, FORKS_MAX),
    (4, {"ANSIBLE_FORKS": "9"}, 9),       # the operator's setting wins
    (4, {"ANSIBLE_FORKS": "many"}, 4),    # not a number: ignored
])
def test_forks_follow_the_host_count(hosts, environ, want):
    assert forks_for(hosts, environ) == want


@pytest.mark.parametrize(("limit", "want"), [(None, 7), ("gpu[01-02]", 2)])
def test_configure_runs_ansible_with_one_fork_per_host_it_reaches(tmp_path, monkeypatch, limit, want):
    monkeypatch.delenv("ANSIBLE_FORKS", raising=False)
    inventory = build_inventory(example_path("staging"), tmp_path / "inv").parent
    result = configure(inventory, playbook="compile.yml", limit=limit, state_dir=tmp_path / "state",
                       log=lambda _l: None)
    command = json.loads((result.artifacts / "command").read_text())["command"]
    assert command[command.index("--forks") + 1] == str(want)


# ---------------------------------------------------------------- the push strategy


def test_the_push_runs_mitogen_where_it_is_installed_and_linear_on_request(monkeypatch):
    import pytest

    from gpucluster.configure import playbook
    from gpucluster.errors import UsageError

    folder = playbook.mitogen_strategy_dir()
    assert folder is not None, "the ops extra installs Mitogen"
    env = playbook.strategy_env({})
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear" and str(folder) in env["ANSIBLE_STRATEGY_PLUGINS"]
    assert playbook.strategy_env({"GPUCLUSTER_ANSIBLE_STRATEGY": "linear"}) == {"ANSIBLE_STRATEGY": "linear"}
    assert playbook.strategy_env({"GPUCLUSTER_ANSIBLE_STRATEGY": "linear",
                                  "ANSIBLE_STRATEGY": "mitogen_free"}) == {"ANSIBLE_STRATEGY": "linear"}
    assert playbook.strategy_env({"ANSIBLE_STRATEGY": "free"}) == {"ANSIBLE_STRATEGY": "free"}
    with pytest.raises(UsageError, match="name a strategy plugin"):
        playbook.strategy_env({"GPUCLUSTER_ANSIBLE_STRATEGY": "linear; rm -rf /"})
    monkeypatch.setattr(playbook, "mitogen_strategy_dir", lambda: None)
    assert playbook.strategy_env({}) == {"ANSIBLE_STRATEGY": "linear"}
    with pytest.raises(UsageError, match="Mitogen is not installed"):
        playbook.strategy_env({"GPUCLUSTER_ANSIBLE_STRATEGY": "mitogen_linear"})
