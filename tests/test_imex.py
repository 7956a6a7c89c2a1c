"""IMEX on NVLink-domain trays: the rendered nodes_config per domain (render/imex.py), the
nvidia_gpu role's filters (plugins/filter/gpucluster_imex.py), and the role's own discovery tasks run by a
real ansible-playbook on this machine (tasks/imex_domain.yml: which domain a tray is in, and the addresses
its nodes_config.cfg gets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, compiled, example_data, load_file, spec_from_data

from gpucluster.render import render_all
from gpucluster.render.imex import domain_hosts, imex_file_name

imex = load_file(ROOT / "plugins" / "filter" / "gpucluster_imex.py", "gpucluster_imex")


def gb200(racks: int = 2):
    data = example_data("gb200-superpod")
    next(g for g in data["node_groups"] if g["name"] == "gb200")["count"] = 18 * racks
    return compiled(spec_from_data(data))


# ---- render ---------------------------------------------------------------------------------------

def test_one_file_per_domain_listing_its_trays_in_order() -> None:
    cluster = gb200(racks=3)
    out = render_all(cluster, cabling=False)
    files = sorted(n for n in out if n.startswith("imex-domain."))
    assert files == [imex_file_name(d.name) for d in cluster.plan.domains]
    g = cluster.spec.group("gb200")
    for d in cluster.plan.domains:
        assert out[imex_file_name(d.name)] == "".join(f"{g.host(i)}\n" for i in range(d.first, d.first + d.count))
    assert out["imex-domain.nvl0002.hosts"].splitlines()[0] == "gb0019"


def test_no_imex_files_without_nvlink_domains() -> None:
    cluster = compiled(spec_from_data(example_data("b300-xdr-superpod")))
    assert not [n for n in render_all(cluster, cabling=False) if n.startswith("imex-")]
    assert domain_hosts(cluster) == {}


# ---- filters --------------------------------------------------------------------------------------

TEXTS = {"/r/imex-domain.nvl0001.hosts": "gb0001\ngb0002\n", "/r/imex-domain.nvl0002.hosts": "gb0003\ngb0004\n",
         "/r/slurm.conf": "gb0003\n"}


def test_domain_of_a_tray_and_of_a_node_outside_every_domain() -> None:
    assert imex.imex_domain(TEXTS, "gb0004") == {"name": "nvl0002", "hosts": ["gb0003", "gb0004"]}
    assert imex.imex_domain(TEXTS, "login01") == {"name": "", "hosts": []}


def test_a_tray_in_two_domain_files_is_refused() -> None:
    with pytest.raises(ValueError, match="2 NVLink domains"):
        imex.imex_domain({**TEXTS, "/r/imex-domain.nvl0003.hosts": "gb0004\n"}, "gb0004")


def test_nodes_config_in_rendered_order_and_nothing_while_a_tray_has_no_address() -> None:
    hv = {"b": {"gpucluster_address": "10.0.0.2"}, "a": {"ansible_facts": {"default_ipv4": {"address": "10.0.0.1"}}},
          "c": {"ansible_facts": {"eth1": {"ipv4": {"address": "10.1.0.3"}}}}, "d": {"gpucluster_address": "gb0004"}}
    assert imex.imex_nodes_config(["b", "a"], hv) == {"text": "10.0.0.2\n10.0.0.1\n", "missing": []}
    assert imex.imex_nodes_config(["c"], hv, "eth1")["text"] == "10.1.0.3\n"
    # a name is not an address (IMEX wants addresses), and a partial list is never written
    assert imex.imex_nodes_config(["a", "d", "c"], hv) == {"text": "", "missing": ["d", "c"]}


@pytest.mark.parametrize(("branch", "want"), [("570", "nvidia-imex-570"), ("580", "nvidia-imex"),
                                              ("590", "nvidia-imex")])
def test_imex_package_at_the_driver_version(branch: str, want: str) -> None:
    names = yaml.safe_load((ROOT / "roles/nvidia_gpu/vars/Debian.yml").read_text())["__nvidia_gpu_names"]
    stack = {"vendor": "nvidia", "branch": branch, "pins": {"driver": {"version": f"{branch}.1.2-1"}}}
    assert imex.imex_package(stack, names) == {want: f"{branch}.1.2-1"}
    assert imex.imex_package({"vendor": "amd", "pins": {}}, names) == {}


# ---- the role's discovery tasks, by a real ansible-playbook ------------------------------------------

def test_role_finds_each_trays_domain_and_writes_the_same_list_on_each(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "ansible-playbook"
    if not exe.exists():
        pytest.skip("ansible-playbook is not installed in this environment (pip install -e '.[ops]')")
    rendered = tmp_path / "rendered"
    rendered.mkdir()
    for name, text in render_all(gb200(racks=2), cabling=False).items():
        if name.startswith("imex-domain."):
            (rendered / name).write_text(text)
    hosts = {f"gb{i:04d}": {"gpucluster_address": f"10.0.{i // 256}.{i % 256}"} for i in range(1, 37)}
    hosts["login01"] = {"gpucluster_address": "10.9.0.1"}
    inventory = {"all": {"hosts": {h: {**v, "ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                                   for h, v in hosts.items()}}}
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inventory))
    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "hosts": "gb0001,gb0018,gb0019,login01", "gather_facts": False,
        "tasks": [
            {"ansible.builtin.include_role": {"name": "nvidia_gpu", "tasks_from": "imex_domain.yml"},
             "vars": {"nvidia_gpu_rendered_dir": str(rendered)}},
            {"ansible.builtin.copy": {"dest": f"{results}/{{{{ inventory_hostname }}}}.json",
                                      "content": "{{ {'domain': __nvidia_gpu_imex_domain.name, "
                                                 "'config': __nvidia_gpu_imex_config} | to_json }}",
                                      "mode": "0600"}, "delegate_to": "localhost"},
        ]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    res = subprocess.run([str(exe), "-i", str(tmp_path / "inv.yml"), str(tmp_path / "play.yml")], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    got = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    assert {h: g["domain"] for h, g in got.items()} == {"gb0001": "nvl0001", "gb0018": "nvl0001",
                                                        "gb0019": "nvl0002", "login01": ""}
    first = "".join(f"10.0.0.{i}\n" for i in range(1, 19))
    assert got["gb0001"]["config"]["text"] == got["gb0018"]["config"]["text"] == first
    assert got["gb0019"]["config"]["text"] == "".join(f"10.0.0.{i}\n" for i in range(19, 37))
    assert got["login01"]["config"] == {"text": "", "missing": []}


def test_role_on_a_cluster_without_domains_finds_none(tmp_path: Path) -> None:
    """An H100 or B200 cluster renders no domain file: the discovery tasks find no domain, and no error."""
    exe = Path(sys.executable).parent / "ansible-playbook"
    if not exe.exists():
        pytest.skip("ansible-playbook is not installed in this environment (pip install -e '.[ops]')")
    (tmp_path / "rendered").mkdir()
    out = tmp_path / "got.json"
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "nvidia_gpu", "tasks_from": "imex_domain.yml"},
         "vars": {"nvidia_gpu_rendered_dir": str(tmp_path / "rendered")}},
        {"ansible.builtin.copy": {"dest": str(out), "mode": "0600", "content": "{{ {'domain': __nvidia_gpu_imex_domain,"
                                  " 'config': __nvidia_gpu_imex_config} | to_json }}"}}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    argv = [str(exe), "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
            str(tmp_path / "play.yml")]
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert json.loads(out.read_text()) == {"domain": {"name": "", "hosts": []}, "config": {"text": "", "missing": []}}
