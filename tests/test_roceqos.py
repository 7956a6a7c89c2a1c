"""gpucluster-roce-qos (gpucluster.node.roceqos): the rendered roce-qos.conf of a RoCE example, read by the node
program against a fake sysfs/configfs tree and fake ip/dcb/mlnx_qos commands on PATH, so nothing touches this
machine's NICs. Expected values come from the spec's compiled RoCE settings, not from copies here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpucluster.node import roceqos

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rendered() -> tuple[str, object]:
    """The roce-qos.conf text render_all writes for meta-24k-roce, and the spec's RoCE settings."""
    from gpucluster.cluster import load_cluster
    from gpucluster.render import render_all

    cluster = load_cluster(ROOT / "examples" / "meta-24k-roce.yaml")
    files = render_all(cluster, cabling=False)
    (text,) = [t for name, t in files.items() if name.startswith("roce-qos")]
    return text, cluster.spec.fabric.roce


@pytest.fixture
def node(tmp_path, monkeypatch, rendered):
    """A fake node: one RoCE port (mlx5_0 port 1, ens1), one InfiniBand port, a device whose port has no
    network interface, ECN knobs for the RoCE priority only, rdma_cm configfs without the device yet; fake
    ip and dcb that log their arguments."""
    text, roce = rendered
    conf = tmp_path / "roce-qos.conf"
    conf.write_text(text)
    ib, net, cm, bin_ = tmp_path / "ib", tmp_path / "net", tmp_path / "cm", tmp_path / "bin"
    for dev, port, layer, ndev in (("mlx5_0", "1", "Ethernet", "ens1"), ("mlx5_1", "1", "InfiniBand", ""),
                                   ("mlx5_2", "1", "Ethernet", "")):
        p = ib / dev / "ports" / port
        (p / "gid_attrs" / "ndevs").mkdir(parents=True)
        (p / "link_layer").write_text(layer + "\n")
        if ndev:
            (p / "gid_attrs" / "ndevs" / "0").write_text(ndev + "\n")
    for sub in ("roce_np/enable", "roce_rp/enable"):
        (net / "ens1" / "ecn" / sub).mkdir(parents=True)
        (net / "ens1" / "ecn" / sub / str(roce.pfc_priority)).write_text("0\n")
    (net / "ens1" / "ecn" / "roce_np" / "cnp_dscp").write_text("0\n")
    cm.mkdir()
    bin_.mkdir()
    log = tmp_path / "commands.log"
    for tool in ("ip", "dcb"):
        (bin_ / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
        (bin_ / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_))
    monkeypatch.setenv("ROCE_SYSFS", str(ib))
    monkeypatch.setenv("ROCE_NET_SYSFS", str(net))
    monkeypatch.setenv("ROCE_CM_CONFIGFS", str(cm))
    return {"conf": conf, "roce": roce, "net": net, "cm": cm, "bin": bin_, "log": log}


def _pfc_map(roce) -> str:
    """PFC on the RoCE priority alone, as the renderer writes it (eight flags)."""
    return ",".join("1" if p == roce.pfc_priority else "0" for p in range(8))


def _pfc(roce) -> str:
    return " ".join(f"{p}:{'on' if p == roce.pfc_priority else 'off'}" for p in range(8))


def test_the_rendered_file_reads_back_as_the_specs_settings(rendered):
    text, roce = rendered
    conf = roceqos.read_conf(text)
    assert conf["ROCE_DSCP"] == str(roce.dscp) and conf["ROCE_PFC_PRIORITY"] == str(roce.pfc_priority)
    assert conf["ROCE_PFC_MAP"] == _pfc_map(roce) and conf["ROCE_TRUST"] == "dscp"
    assert conf["ROCE_LINK_MTU"] == str(roce.link_mtu)


@pytest.mark.parametrize("text, says", [("ROCE_DSCP\n", "not KEY=VALUE"), ("ROCE_DSCP=26\n", "not set"),
                                        ('ROCE_DEVICES="a\n', "No closing quotation")])
def test_a_broken_settings_file_applies_nothing(text, says):
    with pytest.raises(roceqos.ConfError, match=says):
        roceqos.read_conf(text)


def test_check_prints_the_plan_and_changes_nothing(node, capsys):
    roce = node["roce"]
    assert roceqos.main(["--check", str(node["conf"])]) == 0
    out, err = capsys.readouterr()
    assert f"+ ip link set dev ens1 mtu {roce.link_mtu}" in out
    assert f"+ dcb pfc set dev ens1 prio-pfc {_pfc(roce)}" in out
    assert (f"+ dcb app replace dev ens1 dscp-prio {roce.dscp}:{roce.pfc_priority} "
            f"{roce.cnp_dscp}:{roce.cnp_priority}") in out
    assert f"+ echo 1 > {node['net']}/ens1/ecn/roce_np/enable/{roce.pfc_priority}" in out
    assert f"({node['net']}/ens1/ecn/roce_np/cnp_802p_prio not present: skipped)" in out
    assert f"+ mkdir {node['cm']}/mlx5_0" in out
    assert "RoCE settings would be applied to 1 port(s)" in out
    assert "mlx5_2 port 1: no network interface behind it, skipped" in err and "mlx5_1" not in out + err
    assert node["log"].read_text() == "dcb apptrust help\n", "--check ran more than the probe of dcb's apptrust"
    assert (node["net"] / "ens1/ecn/roce_np/enable" / str(roce.pfc_priority)).read_text() == "0\n"
    assert not (node["cm"] / "mlx5_0").exists()


def test_apply_runs_the_commands_and_writes_the_settings(node, capsys):
    roce = node["roce"]
    assert roceqos.main([str(node["conf"])]) == 0
    assert node["log"].read_text().splitlines() == [
        "dcb apptrust help",  # the probe: this dcb knows apptrust (it exits 0)
        f"ip link set dev ens1 mtu {roce.link_mtu}",
        f"dcb pfc set dev ens1 prio-pfc {_pfc(roce)}",
        f"dcb app replace dev ens1 dscp-prio {roce.dscp}:{roce.pfc_priority} {roce.cnp_dscp}:{roce.cnp_priority}",
        "dcb apptrust set dev ens1 order dscp"]
    ecn = node["net"] / "ens1" / "ecn"
    assert (ecn / "roce_rp/enable" / str(roce.pfc_priority)).read_text() == "1\n"
    assert (ecn / "roce_np/cnp_dscp").read_text() == f"{roce.cnp_dscp}\n"
    assert (node["cm"] / "mlx5_0").is_dir()
    assert "RoCE settings applied to 1 port(s)" in capsys.readouterr().out


def test_the_vendor_tool_sets_trust_and_pfc_where_it_is_present(node, capsys):
    roce = node["roce"]
    (node["bin"] / "mlnx_qos").write_text(f'#!/bin/sh\necho "mlnx_qos $*" >> {node["log"]}\n')
    (node["bin"] / "mlnx_qos").chmod(0o755)
    assert roceqos.main([str(node["conf"])]) == 0
    log = node["log"].read_text().splitlines()
    assert f"mlnx_qos -i ens1 --trust dscp --pfc {_pfc_map(roce)}" in log
    assert not any(line.startswith("dcb") for line in log)


def test_a_failing_command_stops_and_says_which(node, capsys):
    (node["bin"] / "ip").write_text("#!/bin/sh\nexit 3\n")
    assert roceqos.main([str(node["conf"])]) == 3
    out, err = capsys.readouterr()
    assert "ip link set dev ens1" in err and "exited 3" in err and "RoCE settings applied" not in out


def test_no_rdma_device_is_nothing_to_apply(node, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROCE_SYSFS", str(tmp_path / "none"))
    assert roceqos.main([str(node["conf"])]) == 0
    assert "nothing to apply" in capsys.readouterr().out


def test_a_missing_settings_file_is_an_error(tmp_path, capsys):
    assert roceqos.main([str(tmp_path / "absent.conf")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_rdma_role_installs_the_node_module_under_its_name():
    import yaml

    tasks = yaml.safe_load((ROOT / "roles/rdma/tasks/roce.yml").read_text())
    (copy,) = [t for t in tasks if str(t.get("ansible.builtin.copy", {}).get("src", "")).endswith("/roceqos.py")]
    assert copy["ansible.builtin.copy"]["dest"] == "{{ rdma_roce_qos_script }}"
    assert copy["ansible.builtin.copy"]["mode"] == "0755"
    assert os.access(roceqos.__file__, os.R_OK) and Path(roceqos.__file__).read_text().startswith("#!/usr/bin/python3")
