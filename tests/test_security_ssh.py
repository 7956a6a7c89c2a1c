"""The SSH command Ansible really builds keeps host keys checked, whatever the operator's ~/.ssh/config says
and whichever source wrote the inventory.

A fake `ssh` records its argv and exits 255 (no host is needed, nothing leaves the machine); the real
`ansible` (and `gpucluster configure`'s ansible-runner path) runs against the written inventory; the
captured argv is then given to the real `ssh -G`, which prints the options ssh would use, under a HOME
whose ~/.ssh/config says `StrictHostKeyChecking no` and `UserKnownHostsFile /dev/null`.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cluster_example, example_path

from gpucluster.cli import main

BIN = Path(sys.executable).parent
LAX = "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  ConnectionAttempts 7\n"
SOURCES = ["ssh-config", "hosts", "none", "pulumi"]

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client for ssh -G")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A HOME whose ssh config turns host-key checking off, and a fake ssh on PATH that records its argv."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True, mode=0o700)
    (h / ".ssh" / "config").write_text(LAX)
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "ssh"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"with open({str(tmp_path / 'ssh.log')!r}, 'a') as fh:\n"
                    "    fh.write(json.dumps(sys.argv[1:]) + '\\n')\n"
                    "sys.stderr.write('fake ssh: no connection\\n')\nsys.exit(255)\n")
    fake.chmod(0o755)
    return h


def write_inventory_from(source: str, tmp_path: Path) -> tuple[Path, str | None]:
    """(the inventory folder, the known_hosts the source named: None for each operator's default)."""
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / "inv"
    spec = str(example_path("staging"))
    hosts = cluster_example("staging").hosts
    known = str(tmp_path / "known_cluster")
    if source == "ssh-config":
        cfg = tmp_path / "ssh_config"
        cfg.write_text(f"Host {' '.join(hosts)}\n  HostName 127.0.0.1\n  Port 2222\n  User ops\n"
                       f"  UserKnownHostsFile {known}\n")
        assert main(["inventory", spec, "-o", str(out), "--ssh-config", str(cfg)]) == 0
        return out, known
    if source == "hosts":
        csv = tmp_path / "hosts.csv"
        csv.write_text("hostname,address,port,user\n" + "".join(f"{h},127.0.0.1,2222,ops\n" for h in hosts))
        assert main(["inventory", spec, "-o", str(out), "--hosts", str(csv)]) == 0
        return out, None
    if source == "none":
        assert main(["inventory", spec, "-o", str(out)]) == 0
        return out, None
    # a Pulumi stack's export, read back the way `gpucluster inventory --pulumi-stack` reads it
    from gpucluster.deploy.stackoutputs import inventory_args, inventory_json
    from gpucluster.inventory.writer import write_inventory_data

    cluster = cluster_example("staging")
    connection, extra = inventory_args(cluster, target="on-prem", stack="s", addresses={h: ("127.0.0.1", 2222)
                                                                                         for h in hosts},
                                       ssh_user="ops", ssh_key_path=None, known_hosts=known)
    write_inventory_data(out, json.loads(inventory_json(cluster, connection, extra)))
    return out, known


def captured(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "ssh.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def ssh_g(argv: list[str], home: Path) -> dict[str, str]:
    """What the real ssh makes of the argv Ansible built: `ssh -G` with the same options, the lax config
    read as the user's own (-F: ssh finds ~/.ssh/config through the password database, not $HOME)."""
    res = subprocess.run(["ssh", "-G", "-F", str(home / ".ssh" / "config"), *argv], capture_output=True, text=True,
                         timeout=30, check=False, env={"HOME": str(home), "PATH": os.environ["PATH"]})
    assert res.returncode == 0, res.stderr
    return {k: v for k, _, v in (line.partition(" ") for line in res.stdout.splitlines())}


def assert_strict(argv: list[str], home: Path, known: str | None) -> None:
    opts = ssh_g(argv, home)
    assert opts["stricthostkeychecking"] == "true", argv
    want = known or str(Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts")  # ssh's own '~'
    assert opts["connectionattempts"] == "7", argv  # the lax config was read: what the command line leaves applies
    assert opts["userknownhostsfile"].split()[0] == want, argv


@pytest.mark.parametrize("source", SOURCES)
def test_ansible_builds_a_strict_ssh_command_under_a_lax_ssh_config(source, tmp_path, home):
    inv, known = write_inventory_from(source, tmp_path)
    env = {"HOME": str(home), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{BIN}{os.pathsep}/usr/bin:/bin",
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "LANG": "C.UTF-8"}
    res = subprocess.run([str(BIN / "ansible"), "-i", str(inv), "gpu01", "-m", "ansible.builtin.ping"],
                         capture_output=True, text=True, timeout=180, env=env, check=False)
    calls = [a for a in captured(tmp_path) if "gpu01" in a or "127.0.0.1" in a]
    assert calls, res.stdout + res.stderr
    for argv in calls:
        assert_strict(argv, home, known)


def test_configure_through_ansible_runner_builds_a_strict_ssh_command(tmp_path, home, monkeypatch):
    """The path `gpucluster configure` takes (ansible-runner, the run's private folder, a minimal environment):
    a project whose site.yml pings one host, so the run is short; ssh is the fake one (ANSIBLE_SSH_EXECUTABLE:
    the run's PATH is gpucluster's own, not the caller's)."""
    from gpucluster.configure.playbook import configure

    inv, known = write_inventory_from("hosts", tmp_path)
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    shutil.copy(ROOT / "ansible.cfg", project / "ansible.cfg")
    (project / "playbooks" / "site.yml").write_text(
        "- name: Reach one node\n  hosts: gpu01\n  gather_facts: false\n  tasks:\n"
        "    - name: Ping\n      ansible.builtin.ping:\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANSIBLE_SSH_EXECUTABLE", str(tmp_path / "bin" / "ssh"))
    result = configure(inv, project=project, state_dir=tmp_path / "state", log=lambda _l: None)
    assert not result.ok and result.failed_hosts == ["gpu01"]  # unreachable: the fake ssh refused
    calls = [a for a in captured(tmp_path) if "127.0.0.1" in a]
    assert calls
    for argv in calls:
        assert_strict(argv, home, known)


def test_host_ssh_argv_is_strict_for_every_caller(tmp_path, home):
    """Every caller builds its ssh command with inventory.Host.ssh_argv: configure's pull fan-out and the rollout's
    node checks directly; Slurm's clients for the rollout, validate --via-slurm, health status and fabric test
    through gpucluster.slurmclient.Client."""
    from gpucluster.inventory.reader import load_inventory
    from gpucluster.slurmclient import Client

    for source in SOURCES:
        inv, known = write_inventory_from(source, tmp_path / source)
        host = load_inventory(inv).hosts["gpu01"]
        for argv in (host.ssh_argv("true", "ConnectTimeout=10"), Client(host).argv(["sinfo", "-h"])):
            assert argv[0] == "ssh" and argv[1:3] == ["-o", "StrictHostKeyChecking=yes"]
            assert_strict(argv[1:], home, known)


def test_an_unsafe_value_is_data_to_ansible(tmp_path, home):
    """The writer's one function (inventory_value): a value that slipped past every check still cannot run.
    Ansible's debug module prints the host's ansible_user; were it a template, the lookup would create a file."""
    from gpucluster.inventory.writer import write_inventory

    flag = tmp_path / "PWNED"
    evil = "{{ lookup('ansible.builtin.pipe', 'touch " + str(flag) + "') }}"
    inv = write_inventory(tmp_path / "inv", cluster_example("staging"), {"gpu01": {"ansible_user": evil}},
                          {"gpucluster_spec": evil})
    assert "!unsafe" in inv.read_text()
    env = {"HOME": str(home), "PATH": f"{BIN}{os.pathsep}/usr/bin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "LANG": "C.UTF-8"}
    res = subprocess.run([str(BIN / "ansible"), "-i", str(inv.parent), "gpu01", "-m", "ansible.builtin.debug",
                          "-a", json.dumps({"msg": "{{ ansible_user }} {{ gpucluster_spec }}"})],
                         capture_output=True, text=True, timeout=180, env=env, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "lookup(" in res.stdout and not flag.exists()
