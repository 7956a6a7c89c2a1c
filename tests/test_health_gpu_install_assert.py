"""The nvidia_gpu role's last word on a node: nvidia-smi must list as many GPUs as the PCI scan found, on
the locked driver. That assert task, taken from the role as it is (found by what it compares, not by its
name), is run by the real ansible-playbook on localhost with the two registered results as variables:
this machine has no GPU, so nvidia-smi's and the PCI scan's lines are stand-ins in their real formats
(nvidia-smi's CSV as captured on an H100, tests/data/health/; the role's PCI scan prints
"<bus id> <class>"). A GPU fallen off the bus, or a driver other than the locked one, must fail it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "roles" / "nvidia_gpu" / "tasks" / "install.yml"
ANSIBLE = ROOT / ".venv" / "bin" / "ansible-playbook"
DRIVER = "550.127.08"
BUS = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
       "0000:ba:00.0", "0000:db:00.0"]


def _tasks(items):
    for t in items or []:
        if isinstance(t, dict):
            yield t
            for key in ("block", "rescue", "always"):
                yield from _tasks(t.get(key))


def count_assert() -> dict:
    tasks = [t for t in _tasks(yaml.safe_load(INSTALL.read_text()))
             if "__nvidia_gpu_pci.stdout_lines" in json.dumps(t.get("ansible.builtin.assert", {}).get("that", ""))]
    assert len(tasks) == 1, f"{INSTALL}: no single assert comparing nvidia-smi's GPUs with the PCI scan's"
    return tasks[0]


def smi(n: int, driver: str = DRIVER) -> list[str]:
    line = (ROOT / "tests" / "data" / "health" / "nvidia-smi-gpus-h100.csv").read_text().splitlines()[0]
    name = [f.strip() for f in line.split(",")][1]
    return [f"{i}, {name}, 0000000{BUS[i][:-1].upper()}0, {driver}" for i in range(n)]


def pci(n: int) -> list[str]:
    return [f"{BUS[i]} 0x030200" for i in range(n)]


CASES = {
    "8 of 8": (smi(8), pci(8)),
    "7 of 8: one fell off the bus": (smi(7), pci(8)),
    "none listed": ([], pci(8)),
    "another driver loaded": (smi(8, "535.183.01"), pci(8)),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, bool]:
    if not ANSIBLE.exists():
        pytest.skip(f"{ANSIBLE} missing: run scripts/setup.sh")
    d = tmp_path_factory.mktemp("gpu-assert")
    task = count_assert()
    blocks = []
    for case, (smi_lines, pci_lines) in CASES.items():
        name = json.dumps(case)
        blocks.append({
            "vars": {"__nvidia_gpu_smi": {"stdout_lines": smi_lines}, "__nvidia_gpu_pci": {"stdout_lines": pci_lines}},
            "block": [task, {"ansible.builtin.set_fact": {"passed": "{{ passed + [" + name + "] }}"}}],
            "rescue": [{"ansible.builtin.set_fact": {"failed_": "{{ failed_ + [" + name + "] }}"}}],
        })
    out = d / "out.json"
    stack = {"pins": {"driver": {"version": f"{DRIVER}-1"}}}
    write = {"ansible.builtin.copy": {"dest": str(out), "mode": "0644",
                                      "content": "{{ {'passed': passed, 'failed': failed_} | to_json }}"}}
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"passed": [], "failed_": [], "__nvidia_gpu_stack": stack}, "tasks": [*blocks, write]}]
    (d / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "0",
           "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"}
    res = subprocess.run([str(ANSIBLE), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                          str(d / "play.yml")], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert res.returncode == 0 and out.exists(), res.stdout[-3000:] + res.stderr[-2000:]
    doc = json.loads(out.read_text())
    return {**{c: True for c in doc["passed"]}, **{c: False for c in doc["failed"]}}


@pytest.mark.parametrize("case", list(CASES))
def test_nvidia_smi_must_see_what_the_pci_scan_found(outcomes, case: str) -> None:
    assert outcomes[case] is (case == "8 of 8"), f"{case}: the assert {'passed' if outcomes[case] else 'failed'}"
