"""Hostile inputs beyond the spec: the inventory sources, the state folder, the secrets file, a
Pulumi stack's export and a hand-written inventory, each case named by kind and source.

Kinds: jinja (a template where a value goes: `{{ }}`, `{% %}`, `{# #}`), smuggle (an option where a value goes:
`-oProxyCommand=...`, a leading '-', a space), bounded (a file that is not a regular file, or too big).
Sources: ssh-config, hosts (a hosts.csv), spec (a string that reaches the inventory or a rendered file),
state-dir (--state-dir), spec-path (the spec's own path), secrets, pulumi (a stack's config, through
inventory_args), pulumi-export (a stack's inventory output, tampered), ssh-argv (an inventory written by
hand, read by inventory.Host.ssh_argv). tests/test_hostile_inputs.py runs each case through the real
reader or command: exit 2 (or the documented error), the message naming the file (and line where there
is one), no traceback, nothing written, and nothing run.

Built here rather than kept as files: several are not files at all (FIFOs, devices), or are 64 MiB.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conftest import cluster_example, example_text

HOSTS = cluster_example("staging").hosts  # ctl01 gpu01..gpu04 flash01 nfs01
J1, J2, J3 = "{{7*191}}", "{% if true %}x{% endif %}", "{#x#}"
SMUGGLE = "-oProxyCommand=touch${IFS}/tmp/gpc-smuggled"
BLOCK = f"Host {' '.join(HOSTS)}\n  HostName %h.example\n"

Build = Callable[[Path], str]  # folder -> the argument (a path, or a value) the source takes


@dataclass(frozen=True)
class InputCase:
    kind: str  # jinja, smuggle, bounded
    source: str  # ssh-config, hosts, spec, state-dir, spec-path, secrets, pulumi, pulumi-export, ssh-argv
    name: str
    build: Build
    line: int | None = None  # the line the message names, where the file has lines
    says: str = ""  # a piece of the message

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.source}/{self.name}"


def text(name: str, body: str) -> Build:
    def build(folder: Path) -> str:
        (folder / name).write_text(body)
        return str(folder / name)

    return build


def ssh_option(option: str, value: str) -> Build:
    """A config whose one Host block gives `option` on line 2 (before its HostName: the first value wins)."""
    return text("ssh_config", f"Host {' '.join(HOSTS)}\n  {option} {value}\n  HostName %h.example\n")


def csv_line(line: str) -> Build:
    rows = [f"{h},10.0.0.{i + 1},22,ops" for i, h in enumerate(HOSTS) if h != "gpu01"]
    return text("hosts.csv", "hostname,address,port,user\n" + "\n".join(rows) + "\n" + line + "\n")


def spec_edit(old: str, new: str) -> Build:
    base = example_text("staging")
    assert base.count(old) == 1, old
    return text("spec.yaml", base.replace(old, new))


def value(v: str) -> Build:
    return lambda _folder: v


def fifo(name: str) -> Build:
    def build(folder: Path) -> str:
        os.mkfifo(folder / name)
        return str(folder / name)

    return build


def sparse(name: str, size: int) -> Build:
    def build(folder: Path) -> str:
        with open(folder / name, "wb") as fh:
            fh.truncate(size)  # takes no disk: the size check must refuse it unread
        return str(folder / name)

    return build


def including(target: Build) -> Build:
    """An ssh_config whose third line includes what `target` makes."""
    def build(folder: Path) -> str:
        inc = target(folder)
        (folder / "ssh_config").write_text(f"{BLOCK}Include {inc}\n")
        return str(folder / "ssh_config")

    return build


def folder_of(name: str) -> Build:
    def build(folder: Path) -> str:
        (folder / name).mkdir()
        return str(folder / name)

    return build


INPUT_CASES = [
    # ---- Jinja in every inventory source
    InputCase("jinja", "ssh-config", "hostname", ssh_option("HostName", J1), 2),
    InputCase("jinja", "ssh-config", "user-statement", ssh_option("User", J2), 2, "login name"),
    InputCase("jinja", "ssh-config", "identityfile-comment", ssh_option("IdentityFile", f"~/.ssh/{J3}"), 2),
    InputCase("jinja", "ssh-config", "knownhosts", ssh_option("UserKnownHostsFile", f"~/{J1}"), 2),
    InputCase("jinja", "ssh-config", "proxyjump", ssh_option("ProxyJump", J1), 2, "jump host list"),
    InputCase("jinja", "ssh-config", "port", ssh_option("Port", J1), 2, "TCP port"),
    InputCase("jinja", "hosts", "address", csv_line(f"gpu01,{J1},22,ops"), 8),
    InputCase("jinja", "hosts", "scope-id", csv_line(f"gpu01,fe80::1%{J3},22,ops"), 8, "interface name"),
    InputCase("jinja", "hosts", "user", csv_line(f"gpu01,10.0.0.2,22,{J1}"), 8, "user name"),
    InputCase("jinja", "hosts", "port", csv_line(f"gpu01,10.0.0.2,{J1},ops"), 8, "TCP port"),
    InputCase("jinja", "hosts", "hostname", csv_line(f"{J2},10.0.0.2,22,ops"), 8),
    InputCase("jinja", "state-dir", "state-dir", value(f"/tmp/{J1}"), None, "--state-dir"),
    InputCase("jinja", "spec-path", "file-name", text(f"spec{J1}.yaml", example_text("staging")), None,
              "the spec's path"),
    InputCase("jinja", "pulumi", "ssh-user", value(f"user={J1}"), None, "sshUser"),
    InputCase("jinja", "pulumi", "known-hosts", value(f"known_hosts=/tmp/{J1}"), None, "knownHosts"),
    InputCase("jinja", "pulumi", "key-path", value(f"key=~/.ssh/{J2}"), None, "sshKeyPath"),
    InputCase("jinja", "pulumi", "address", value(f"address=gpu01.{J1}"), None, "hostDomain"),
    InputCase("jinja", "pulumi-export", "group-var", value(f"gpucluster_spec={J1}")),
    InputCase("jinja", "pulumi-export", "host-var", value(f"ansible_user={J2}")),
    InputCase("jinja", "pulumi-export", "state-dir", value(f"gpucluster_state_dir=/x/{J1}")),
    # spec strings that reach the inventory (names, hosts) or a rendered file (paths, mount options)
    InputCase("jinja", "spec", "cluster-name", spec_edit("name: staging\n", f'name: "{J1}"\n')),
    InputCase("jinja", "spec", "hostname", spec_edit('hostname: "gpu##"', f'hostname: "gpu{J1}##"')),
    InputCase("jinja", "spec", "flash-mount", spec_edit("    mount: /mnt/flash\n", f'    mount: "/mnt/{J1}"\n')),
    InputCase("jinja", "spec", "nfs-export", spec_edit("- path: /export/home\n", f'- path: "/export/{J3}"\n')),
    InputCase("jinja", "spec", "moosefs-mount-option", spec_edit(
        "    mount: /mnt/flash\n", f'    mount: /mnt/flash\n    moosefs: {{mount_options: ["{J2}"]}}\n')),
    InputCase("jinja", "spec", "management-interface", spec_edit(
        "management_interface: eth0\n", f'management_interface: "{J1}"\n')),
    # ---- options smuggled where a value goes
    InputCase("smuggle", "ssh-config", "hostname", ssh_option("HostName", SMUGGLE), 2),
    InputCase("smuggle", "ssh-config", "user", ssh_option("User", SMUGGLE), 2, "login name"),
    InputCase("smuggle", "ssh-config", "identityfile", ssh_option("IdentityFile", SMUGGLE), 2),
    InputCase("smuggle", "ssh-config", "knownhosts", ssh_option("UserKnownHostsFile", SMUGGLE), 2),
    InputCase("smuggle", "ssh-config", "proxyjump", ssh_option("ProxyJump", SMUGGLE), 2),
    InputCase("smuggle", "ssh-config", "proxyjump-second-hop", ssh_option("ProxyJump", f"bastion,{SMUGGLE}"), 2),
    InputCase("smuggle", "ssh-config", "proxyjump-space",
              ssh_option("ProxyJump", '"bastion -oStrictHostKeyChecking=no"'), 2),
    InputCase("smuggle", "hosts", "address", csv_line(f"gpu01,{SMUGGLE},22,ops"), 8),
    InputCase("smuggle", "hosts", "user", csv_line(f"gpu01,10.0.0.2,22,{SMUGGLE}"), 8),
    InputCase("smuggle", "hosts", "leading-dash-host", csv_line("gpu01,-gpu01,22,ops"), 8),
    InputCase("smuggle", "pulumi", "ssh-user", value(f"user={SMUGGLE}"), None, "sshUser"),
    InputCase("smuggle", "pulumi", "known-hosts", value("known_hosts=-oUserKnownHostsFile=/dev/null"), None,
              "knownHosts"),
    InputCase("smuggle", "ssh-argv", "ansible-host", value(f"ansible_host={SMUGGLE}")),
    InputCase("smuggle", "ssh-argv", "ansible-user", value(f"ansible_user={SMUGGLE}")),
    InputCase("smuggle", "ssh-argv", "common-args-lax", value("ansible_ssh_common_args=-o StrictHostKeyChecking=no "
                                                              "-o UserKnownHostsFile=/dev/null")),
    # ---- every file read bounded, regular files only
    InputCase("bounded", "ssh-config", "include-dir", including(folder_of("conf.d")), 3),
    InputCase("bounded", "ssh-config", "include-65m", including(sparse("big", 65 << 20)), 3),
    InputCase("bounded", "ssh-config", "include-fifo", including(fifo("pipe")), 3),
    InputCase("bounded", "ssh-config", "main-is-a-fifo", fifo("ssh_config")),
    InputCase("bounded", "ssh-config", "main-is-dev-zero", value("/dev/zero")),
    InputCase("bounded", "hosts", "fifo", fifo("hosts.csv")),
    InputCase("bounded", "hosts", "dev-zero", value("/dev/zero")),
    InputCase("bounded", "hosts", "65m", sparse("hosts.csv", 65 << 20)),
    InputCase("bounded", "hosts", "nul-byte", csv_line("gpu01,10.0.0.2\x00,22,ops"), 8),
    InputCase("bounded", "hosts", "128k-field", csv_line("gpu01," + "a" * ((128 << 10) + 64) + ",22,ops"), 8),
    InputCase("bounded", "secrets", "fifo", fifo("secrets.json")),
    InputCase("bounded", "secrets", "dev-zero", value("/dev/zero")),
    InputCase("bounded", "secrets", "2m", sparse("secrets.json", 2 << 20)),
]

INPUT_KINDS = sorted({c.kind for c in INPUT_CASES})
