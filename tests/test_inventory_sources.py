"""`gpucluster inventory --ssh-config/--hosts`: connection details for every spec host, or a located error
(exit 2, file:line, field, rule, fix) and nothing written. Read the way ssh(1) reads its config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import cluster_example, example_path

from gpucluster.cli import main
from gpucluster.errors import SpecError
from gpucluster.inventory.reader import load_inventory
from gpucluster.inventory.sources import from_hosts_file, from_ssh_config

HOSTS = cluster_example("staging").hosts  # ctl01 gpu01..gpu04 flash01 nfs01


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def findings(fn, *args) -> list:
    with pytest.raises(SpecError) as err:
        fn(*args)
    return err.value.findings


# ---- ssh_config ------------------------------------------------------------------------------------

def test_ssh_config_first_value_wins_and_tokens_expand(tmp_path):
    cfg = write(tmp_path, "config", """\
# site config
Host gpu03
  Port 2222
Host gpu* !gpu04
  HostName %h.cluster.example
  User ops
Host gpu04
  HostName 10.0.0.4
  User admin
Host ctl* flash* nfs*
  HostName %h.mgmt.example
Host *
  User root
  Port 22
  IdentityFile ~/.ssh/id_cluster
  UserKnownHostsFile ~/.ssh/known_cluster
  ProxyJump bastion
""")
    conn = from_ssh_config(cfg, HOSTS)
    assert conn["gpu03"]["ansible_port"] == 2222 and conn["gpu01"]["ansible_port"] == 22
    assert conn["gpu01"]["ansible_host"] == "gpu01.cluster.example" and conn["gpu01"]["ansible_user"] == "ops"
    assert (conn["gpu04"]["ansible_host"], conn["gpu04"]["ansible_user"]) == ("10.0.0.4", "admin")  # !gpu04
    assert conn["ctl01"]["ansible_user"] == "root" and conn["ctl01"]["ansible_host"] == "ctl01.mgmt.example"
    assert conn["nfs01"]["ansible_ssh_private_key_file"] == os.path.expanduser("~/.ssh/id_cluster")
    args = conn["flash01"]["ansible_ssh_common_args"]
    assert f"UserKnownHostsFile={os.path.expanduser('~/.ssh/known_cluster')}" in args
    assert "ProxyJump=bastion" in args and "StrictHostKeyChecking=yes" in args


def test_ssh_config_include_is_read_relative_to_dot_ssh(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh" / "config.d").mkdir(parents=True)
    write(tmp_path / ".ssh" / "config.d", "cluster", "Host *01 gpu*\n  HostName %h.inc.example\n")
    cfg = write(tmp_path, "config", "Include config.d/*\n")
    assert {h: c["ansible_host"] for h, c in from_ssh_config(cfg, HOSTS).items()} == {
        h: f"{h}.inc.example" for h in HOSTS}


@pytest.mark.parametrize("text, field, rule, line", [
    ("Host gpu*\n  HostName %h\n", "Host", "host-missing", None),  # ctl01, flash01, nfs01 named by no block
    ("Host *\n  HostName %h.x\n", "Host", "host-missing", None),  # `Host *` gives defaults, it names no host
    ("Match host gpu*\n  User x\nHost *01 gpu* nfs01\n  HostName %h\n", "Match", "ssh-config", 1),
    ("Host *01 gpu* nfs01\n  Port 70000\n", "Port", "ssh-config", 2),
    ("Host *01 gpu* nfs01\n  HostName bad_name!\n", "HostName", "ssh-config", 2),
    ("Host\n", "Host", "ssh-config", 1),
])
def test_ssh_config_problems_are_located(tmp_path, text, field, rule, line):
    cfg = write(tmp_path, "config", text)
    fs = findings(from_ssh_config, cfg, HOSTS)
    hit = [f for f in fs if f.rule == rule and f.field == field]
    assert hit, [f.render() for f in fs]
    assert all(f.file == str(cfg) and f.fix for f in hit)
    if line:
        assert hit[0].line == line


# ---- hosts file ------------------------------------------------------------------------------------

GOOD_CSV = "hostname,address,port,user\n" + "".join(
    f"{h},10.0.0.{i + 1},{2200 + i if h == 'gpu02' else ''},{'ops' if h.startswith('gpu') else ''}\n"
    for i, h in enumerate(HOSTS))


def test_hosts_file_gives_address_port_and_user(tmp_path):
    conn = from_hosts_file(write(tmp_path, "h.csv", GOOD_CSV), HOSTS)
    assert conn["gpu02"] == {"ansible_host": "10.0.0.3", "ansible_port": 2202, "ansible_user": "ops"}
    assert conn["ctl01"] == {"ansible_host": "10.0.0.1"}


@pytest.mark.parametrize("mutate, field, rule, line", [
    (lambda t: t.replace("hostname,address,port,user", "host,addr"), "header", "hosts-file", 1),
    (lambda t: t + "bogus01,10.9.9.9,,\n", "hostname", "host-unknown", 9),
    (lambda t: t.replace("gpu03,10.0.0.4,,ops\n", ""), "hostname", "host-missing", None),
    (lambda t: t + "gpu01,10.0.0.99,,\n", "hostname", "duplicate", 9),
    (lambda t: t.replace("gpu01,10.0.0.2,,ops", "gpu01,10.0.0.2,99999,ops"), "port", "hosts-file", 3),
    (lambda t: t.replace("gpu01,10.0.0.2,,ops", "gpu01,10.0.0.2,ops"), "line", "hosts-file", 3),
    (lambda t: t.replace("gpu01,10.0.0.2,,ops", "gpu01,not an address,,ops"), "address", "hosts-file", 3),
    (lambda t: t.replace("gpu01,10.0.0.2,,ops", "gpu01,10.0.0.2,,Bad User"), "user", "hosts-file", 3),
])
def test_hosts_file_problems_are_located(tmp_path, mutate, field, rule, line):
    path = write(tmp_path, "hosts.csv", mutate(GOOD_CSV))
    fs = findings(from_hosts_file, path, HOSTS)
    hit = [f for f in fs if f.rule == rule and f.field == field]
    assert hit, [f.render() for f in fs]
    assert hit[0].file == str(path) and hit[0].fix
    if line:
        assert hit[0].line == line


# ---- the command: exit 2, nothing written ----------------------------------------------------------

def test_a_bad_hosts_file_exits_2_and_leaves_the_inventory_as_it_was(tmp_path, capsys):
    out = tmp_path / "inv"
    good = write(tmp_path, "good.csv", GOOD_CSV)
    assert main(["inventory", str(example_path("staging")), "-o", str(out), "--hosts", str(good)]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    bad = write(tmp_path, "bad.csv", GOOD_CSV + "intruder,10.6.6.6,,\n")
    capsys.readouterr()
    assert main(["inventory", str(example_path("staging")), "-o", str(out), "--hosts", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:9: hostname: 'intruder'" in err and "[host-unknown]" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_inventory_from_a_hosts_file_is_read_back_as_ansible_reads_it(tmp_path):
    out = tmp_path / "inv"
    assert main(["inventory", str(example_path("staging")), "-o", str(out),
                 "--hosts", str(write(tmp_path, "h.csv", GOOD_CSV))]) == 0
    inv = load_inventory(out)
    assert inv.hosts["gpu02"].ssh()["port"] == 2202 and inv.hosts["gpu02"].address == "10.0.0.3"
    assert inv.hosts["gpu01"].vars["gpucluster_leaf"] == cluster_example("staging").plan.unit_of_host["gpu01"].name
    assert inv.hosts["gpu01"].user == "ops" and inv.hosts["ctl01"].user == "root"
    # the state folder is each operator's own unless given: a Jinja default, never someone's home path
    assert "{{" in inv.vars["gpucluster_state_dir"]


@pytest.mark.parametrize("limit, want", [
    ("gpu[01-02]", ["gpu01", "gpu02"]),
    ("gpu[01-02,04],ctl01", ["gpu01", "gpu02", "gpu04", "ctl01"]),
    ("slurm_compute:!gpu[03-04]", ["slurm_compute", "!gpu03", "!gpu04"]),
    ("webservers[0:2],gpu*", ["webservers[0:2]", "gpu*"]),  # Ansible's own slice and glob pass through
])
def test_limit_takes_slurm_hostlists(limit, want):
    from gpucluster.inventory.reader import limit_terms

    assert limit_terms(limit) == want


def test_validate_selects_with_a_slurm_hostlist(tmp_path):
    out = tmp_path / "inv"
    assert main(["inventory", str(example_path("staging")), "-o", str(out)]) == 0
    assert load_inventory(out).select("gpu[02-03],ctl01") == ["gpu02", "gpu03", "ctl01"]
