"""gpucluster_prefork (plugins/callback/): the Jinja filter and test plugins are loaded in Ansible's controller
process before the first task, so the worker forked for each task inherits them instead of loading them again.

A real ansible-playbook run on localhost: a probe action plugin reports, from inside a task's worker, how many
filter plugins that worker already holds before anything is templated. With the callback enabled the worker
inherits them; without it the worker starts with none."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.configure.playbook import callback_env

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import filter_loader, test_loader


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        return {"changed": False, "filters": len(filter_loader._cached_non_collection_wrappers),
                "tests": len(test_loader._cached_non_collection_wrappers)}
'''

PLAY = '''
- hosts: localhost
  gather_facts: false
  tasks:
    - name: What this worker inherited
      probe_loaded: {}
      register: probe
    - name: Print it
      ansible.builtin.debug:
        msg: "PROBE {{ probe.filters }} {{ probe.tests }}"
'''


def _run(tmp: Path, enabled: str) -> tuple[int, int]:
    (tmp / "action").mkdir(exist_ok=True)
    (tmp / "action" / "probe_loaded.py").write_text(PROBE)
    (tmp / "play.yml").write_text(PLAY)
    (tmp / "ansible.cfg").write_text("[defaults]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update({
        "ANSIBLE_CONFIG": str(tmp / "ansible.cfg"), "ANSIBLE_ACTION_PLUGINS": str(tmp / "action"),
        "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "plugins" / "callback"), "ANSIBLE_CALLBACKS_ENABLED": enabled,
        "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
    })
    res = subprocess.run([sys.executable, "-m", "ansible.cli.playbook", "-i", "localhost,", "-c", "local",
                          str(tmp / "play.yml")], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    found = re.search(r"PROBE (\d+) (\d+)", res.stdout)
    assert found, res.stdout
    return int(found.group(1)), int(found.group(2))


@pytest.mark.parametrize("enabled", ["gpucluster_prefork", "ansible.posix.profile_roles"])
def test_a_worker_inherits_the_filters_only_with_the_callback(tmp_path: Path, enabled: str) -> None:
    filters, tests = _run(tmp_path, enabled)
    if enabled == "gpucluster_prefork":
        assert filters > 50 and tests > 20, (filters, tests)
    else:
        assert (filters, tests) == (0, 0), "without the callback a worker starts with no filter loaded"


def test_configure_enables_it_where_the_project_has_it(tmp_path: Path) -> None:
    env = callback_env(ROOT)
    assert env == {"ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "plugins" / "callback"),
                   "ANSIBLE_CALLBACKS_ENABLED": "gpucluster_prefork"}
    assert callback_env(tmp_path) == {}, "a checkout without it keeps its own ansible.cfg's callbacks"


def test_ansible_cfg_enables_it() -> None:
    cfg = (ROOT / "ansible.cfg").read_text()
    assert "callback_plugins = plugins/callback" in cfg
    assert any(line.startswith("callbacks_enabled") and "gpucluster_prefork" in line for line in cfg.splitlines())
