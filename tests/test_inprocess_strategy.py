"""gpucluster_linear (plugins/strategy/): the tasks that never reach a host run in Ansible's controller process, not
in a worker forked for each, and give the same results.

Real ansible-playbook runs on three local hosts. Which process ran a task shows in `lookup('pipe', 'echo $PPID')`:
the shell a lookup starts is a child of the process that templates the task. Under linear every host-task has a
worker of its own, so three hosts give three parents; under gpucluster_linear the controller-only tasks all give
the controller's, and a module task, or one with `until`, still gets a worker per host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.configure import playbook

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["h1", "h2", "h3"]

PLAY = '''
- hosts: all
  gather_facts: false
  tasks:
    - name: set_fact
      ansible.builtin.set_fact:
        by_set_fact: "{{ lookup('pipe', 'echo $PPID') }}"
        doubled: "{{ (inventory_hostname[-1] | int) * 2 }}"
    - name: assert, templated per host
      ansible.builtin.assert:
        that: "doubled | int == (inventory_hostname[-1] | int) * 2"
        quiet: true
    - name: include_vars, a loop (each item's result goes through the queue while the task runs)
      ansible.builtin.include_vars: "{{ item }}"
      loop: [vars.yml, more.yml]
    - name: include_tasks
      ansible.builtin.include_tasks: inc.yml
    - name: a module, in a worker
      ansible.builtin.command: sh -c 'echo $PPID'
      register: by_module
      changed_when: false
    - name: until, in a worker
      ansible.builtin.set_fact:
        by_until: "{{ lookup('pipe', 'echo $PPID') }}"
      until: true
      retries: 1
      delay: 0
    - name: a skipped module task, decided in the controller
      ansible.builtin.command: "true"
      when: lookup('pipe', 'echo $PPID >> ' ~ out ~ '/when-' ~ inventory_hostname) == 'never'
    - name: a when only the worker's variables make true (the -u user), run in a worker
      ansible.builtin.command: touch {{ out }}/guarded-{{ inventory_hostname }}
      when: ansible_user is defined and lookup('pipe', 'echo $PPID >> ' ~ out ~ '/guard-' ~ inventory_hostname) == ''
      changed_when: false
    - name: a failing assert fails only its host
      ansible.builtin.assert:
        that: inventory_hostname != "h3"
        fail_msg: "h3 refused"
    - name: what each host ended with
      ansible.builtin.copy:
        content: "{{ {'set_fact': by_set_fact, 'included': by_include, 'module': by_module.stdout, 'until': by_until,
                     'from_vars': from_vars, 'more': more_vars, 'doubled': doubled} | to_json }}"
        dest: "{{ out }}/{{ inventory_hostname }}.json"
        mode: "0600"
'''
INC = '''
- name: inside an include
  ansible.builtin.set_fact:
    by_include: "{{ lookup('pipe', 'echo $PPID') }}"
'''


def _play(tmp: Path, strategy: str) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """The run, and per host what it ended with: the parents its probes saw, and the files its tasks wrote."""
    out = tmp / strategy
    out.mkdir()
    (tmp / "play.yml").write_text(PLAY)
    (tmp / "inc.yml").write_text(INC)
    (tmp / "vars.yml").write_text("from_vars: read\n")
    (tmp / "more.yml").write_text("more_vars: also\n")
    (tmp / "ansible.cfg").write_text("[defaults]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != playbook.STRATEGY_BASE_ENV}
    env.update({
        "ANSIBLE_CONFIG": str(tmp / "ansible.cfg"), "ANSIBLE_STRATEGY": strategy,
        "ANSIBLE_STRATEGY_PLUGINS": str(ROOT / "plugins" / "strategy"), "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False", "ANSIBLE_LOCALHOST_WARNING": "False",
    })
    res = subprocess.run([sys.executable, "-m", "ansible.cli.playbook", "-i", ",".join(HOSTS) + ",", "-c", "local",
                          "-f", "3", "-u", "root", "-e", f"out={out} ansible_python_interpreter={sys.executable}",
                          str(tmp / "play.yml")], capture_output=True, text=True, env=env, timeout=90, check=False)
    hosts = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    for p in out.iterdir():  # what the `when` probe wrote (one line per evaluation), and the guarded task's marks
        if p.name.startswith(("when-", "guard-", "guarded-")):
            kind, _, host = p.name.partition("-")
            hosts.setdefault(host, {})[kind] = p.read_text().split()
    return res, hosts


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, dict[str, dict]]]:
    """Both strategies' runs, side by side (each waits on its hosts' local processes much of the time)."""
    from concurrent.futures import ThreadPoolExecutor

    strategies = ("linear", playbook.INPROCESS_STRATEGY)
    with ThreadPoolExecutor(len(strategies)) as pool:
        done = {s: pool.submit(_play, tmp_path_factory.mktemp(s), s) for s in strategies}
    return {s: future.result() for s, future in done.items()}


def test_the_same_results_and_the_same_failure(runs):
    recaps = set()
    for strategy, (res, _hosts) in runs.items():
        assert res.returncode == 2, (strategy, res.stdout[-3000:], res.stderr[-3000:])
        assert "h3 refused" in res.stdout, strategy
        recaps.add(" ".join(res.stdout.split("PLAY RECAP")[1].split()))
    assert len(recaps) == 1, recaps  # every host: the same ok, changed, failed and skipped counts
    assert "h3 : ok=8 changed=0 unreachable=0 failed=1 skipped=1" in recaps.pop()
    plain, ours = (runs[s][1] for s in ("linear", playbook.INPROCESS_STRATEGY))
    assert sorted(plain) == sorted(ours) == HOSTS
    assert [h for h in HOSTS if "set_fact" in ours[h]] == ["h1", "h2"]  # h3 stopped at its failed assert
    assert [h for h in HOSTS if "set_fact" in plain[h]] == ["h1", "h2"]
    for host in HOSTS:  # the task whose `when` only a worker's variables make true ran on every host, both ways
        assert ours[host]["guarded"] == plain[host]["guarded"] == [], host
    for host in ("h1", "h2"):
        assert int(ours[host]["doubled"]) == int(plain[host]["doubled"]) == int(host[-1]) * 2
        assert ours[host]["from_vars"] == plain[host]["from_vars"] == "read"
        assert ours[host]["more"] == plain[host]["more"] == "also"


def test_controller_only_tasks_run_in_the_controller_process(runs):
    _res, hosts = runs[playbook.INPROCESS_STRATEGY]
    done = [hosts[h] for h in ("h1", "h2")]
    parents = {h["set_fact"] for h in done} | {h["included"] for h in done}
    assert len(parents) == 1, parents  # set_fact and a task inside an include_tasks, both hosts: one process


def test_a_skipped_module_task_is_decided_in_the_controller_process(runs):
    _res, hosts = runs[playbook.INPROCESS_STRATEGY]
    controller = hosts["h1"]["set_fact"]
    for host in HOSTS:  # its `when` was read twice (the prediction, then the executor), both by the controller
        assert hosts[host]["when"] == [controller, controller], host
    _res, plain = runs["linear"]
    assert len({p for h in HOSTS for p in plain[h]["when"]}) == 3  # linear: each host's own worker, once


def test_a_task_the_prediction_got_wrong_goes_to_a_worker(runs):
    """`ansible_user` (from -u) is among the variables TaskExecutor adds, not the strategy's: predicted skipped,
    then found true in the controller before any connection, then run by a worker."""
    _res, hosts = runs[playbook.INPROCESS_STRATEGY]
    controller = hosts["h1"]["set_fact"]
    for host in HOSTS:
        here, worker = hosts[host]["guard"]
        assert here == controller and worker != controller, host


def test_linear_forks_a_worker_for_each(runs):
    _res, hosts = runs["linear"]
    assert len({hosts[h]["set_fact"] for h in ("h1", "h2")}) == 2  # the control: the probe tells them apart


def test_module_and_until_tasks_still_get_a_worker(runs):
    _res, hosts = runs[playbook.INPROCESS_STRATEGY]
    controller = hosts["h1"]["set_fact"]
    assert len({hosts[h]["until"] for h in ("h1", "h2")} | {controller}) == 3
    assert controller not in {hosts[h]["module"] for h in ("h1", "h2")}


def test_configure_runs_it_over_the_chosen_strategy(tmp_path):
    plain = playbook.strategy_env({playbook.STRATEGY_ENV: "linear"}, proj=ROOT)
    assert plain == {"ANSIBLE_STRATEGY": playbook.INPROCESS_STRATEGY, playbook.STRATEGY_BASE_ENV: "linear",
                     "ANSIBLE_STRATEGY_PLUGINS": str(ROOT / "plugins" / "strategy")}
    # a project without the plugin (an older checkout a bench runs) keeps the chosen strategy as it is
    assert playbook.strategy_env({playbook.STRATEGY_ENV: "linear"}, proj=tmp_path) == {"ANSIBLE_STRATEGY": "linear"}
    if playbook.mitogen_strategy_dir() is not None:
        mitogen = playbook.strategy_env({}, proj=ROOT)
        assert mitogen[playbook.STRATEGY_BASE_ENV] == "mitogen_linear"
        assert mitogen["ANSIBLE_STRATEGY_PLUGINS"].split(os.pathsep) == [
            str(ROOT / "plugins" / "strategy"), str(playbook.mitogen_strategy_dir())]
