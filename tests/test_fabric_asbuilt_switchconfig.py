"""RoCE: the switches' lossless QoS comes from the same spec fields as the hosts' and NCCL's. One test
proves the three agree: the DSCP NCCL marks (NCCL_IB_TC = DSCP x 4 in the rendered nccl.conf and
nccl-env.sh), the DSCP the host trusts (the rdma role's roce-qos.conf, rendered as the role renders it),
and the DSCP the switch maps to the lossless priority (SONiC config_db fragment, Arista EOS snippet)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import load_file

from gpucluster.cluster import cluster_of, load_cluster
from gpucluster.errors import UsageError
from gpucluster.node import roceqos
from gpucluster.render import render_all
from gpucluster.render.switch import sonic_lanes, switch_configs
from gpucluster.spec.loader import validate_data

ROOT = Path(__file__).resolve().parent.parent


def role_filters():
    """The Ansible filter module the rdma role renders roce-qos.conf with (plugins/filter)."""
    return load_file(ROOT / "plugins/filter/gpucluster_facts.py", "gpucluster_facts_filter")


def roce_spec(tmp_path, **roce) -> Path:
    """meta-24k-roce with other RoCE values, so no default can make the three agree by accident."""
    data = yaml.safe_load((ROOT / "examples" / "meta-24k-roce.yaml").read_text())
    data["fabric"]["roce"] = {**data["fabric"]["roce"], **roce}
    p = tmp_path / "roce.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def shell_vars(text: str) -> dict[str, str]:
    return dict(re.findall(r"^(?:export )?([A-Z_]+)=\"?([^\"\n]*)\"?$", text, re.M))


@pytest.mark.parametrize("roce", [{}, {"dscp": 30, "pfc_priority": 4, "cnp_dscp": 46, "cnp_priority": 7}])
def test_nccl_host_and_switch_agree(tmp_path, roce):
    path = roce_spec(tmp_path, **roce)
    cluster = load_cluster(path)
    want = cluster.spec.fabric.roce
    # 1. NCCL: the ToS byte NCCL sets carries the DSCP in its top six bits
    rendered = render_all(cluster, cabling=False)
    for name in ("nccl.conf", "nccl-env.sh"):
        tc = int(shell_vars(rendered[name])["NCCL_IB_TC"])
        assert tc % 4 == 0 and tc // 4 == want.dscp, name
    # 2. the host: what the rdma role installs (the rendered roce-qos file it copies from the compiled folder)
    (conf,) = [text for name, text in rendered.items() if name.startswith("roce-qos")]
    host = shell_vars(conf)
    assert host["ROCE_TRUST"] == "dscp"
    assert int(host["ROCE_DSCP"]) == want.dscp and int(host["ROCE_PFC_PRIORITY"]) == want.pfc_priority
    assert host["ROCE_PFC_MAP"].split(",")[want.pfc_priority] == "1" and host["ROCE_PFC_MAP"].count("1") == 1
    steps = roceqos.port_steps(roceqos.read_conf(conf), "mlx5_0", "1", "ens1", mlnx_qos=False, apptrust=True)
    (mapped,) = [argv[6:] for kind, argv, *_ in steps if kind == "run" and argv[:3] == ["dcb", "app", "replace"]]
    assert mapped == [f"{want.dscp}:{want.pfc_priority}", f"{want.cnp_dscp}:{want.cnp_priority}"]  # exactly that pair
    # 3. the switches: every tier maps the same DSCP to the lossless priority, PFC on it alone
    files = switch_configs(cluster.spec, cluster.plan)
    assert {n.split("-")[1] for n in files} == {"sonic", "eos"}  # wedge400 (ocp) leaves, Arista spine/core
    for name, text in files.items():
        if name.endswith(".json"):
            db = json.loads(text)
            assert db["DSCP_TO_TC_MAP"]["ROCE"][str(want.dscp)] == str(want.pfc_priority)
            assert db["DSCP_TO_TC_MAP"]["ROCE"][str(want.cnp_dscp)] == str(want.cnp_priority)
            assert db["TC_TO_PRIORITY_GROUP_MAP"]["ROCE"][str(want.pfc_priority)] == str(want.pfc_priority)
            assert {q["pfc_enable"] for q in db["PORT_QOS_MAP"].values()} == {str(want.pfc_priority)}
            assert {q["mtu"] for q in db["PORT"].values()} == {str(want.link_mtu)}
            lossless = [k for k in db["QUEUE"] if k.endswith(f"|{want.pfc_priority}")]
            assert all(db["QUEUE"][k]["wred_profile"] == "ROCE_LOSSLESS" for k in lossless)
            assert db["WRED_PROFILE"]["ROCE_LOSSLESS"]["ecn"] == "ecn_all"
            assert set(db["PFC_WD"]) - {"GLOBAL"} == set(db["PORT_QOS_MAP"])
        else:
            maps = dict(re.findall(r"^qos map dscp (\d+) to traffic-class (\d+)$", text, re.M))
            assert maps == {str(want.dscp): str(want.pfc_priority), str(want.cnp_dscp): str(want.cnp_priority)}
            assert re.findall(r"priority-flow-control priority (\d+) no-drop", text) == [str(want.pfc_priority)]
            assert f"mtu {want.link_mtu}" in text and "qos trust dscp" in text
            assert re.search(rf"tx-queue {want.pfc_priority}\n\s+random-detect ecn", text)


def test_ports_cover_every_planned_port():
    cluster = load_cluster(ROOT / "examples" / "meta-24k-roce.yaml")
    files = switch_configs(cluster.spec, cluster.plan)
    leaf = cluster.plan.tier("leaf")
    db = json.loads(files["leaf-sonic-qos.json"])
    lanes = sonic_lanes(cluster.spec.parts.switches[leaf.model].ports, cluster.plan.speed_gbps)
    assert list(db["PORT"]) == [f"Ethernet{i * lanes}" for i in range(leaf.down + leaf.up)]
    spine = cluster.plan.tier("spine")
    assert f"interface Ethernet1-{spine.down + spine.up}" in files["spine-eos-qos.cfg"]


def test_sonic_lane_arithmetic():
    assert sonic_lanes({800: 64, 400: 128}, 400) == 4  # SN5600: 512 lanes, 128 ports at 400G
    assert sonic_lanes({400: 32}, 400) == 8  # Wedge400: QSFP-DD, 8 lanes per 400G port
    assert sonic_lanes({200: 128, 400: 64}, 200) == 4


def test_ecn_off_leaves_no_wred(tmp_path):
    cluster = load_cluster(roce_spec(tmp_path, ecn=False))
    files = switch_configs(cluster.spec, cluster.plan)
    db = json.loads(files["leaf-sonic-qos.json"])
    assert "WRED_PROFILE" not in db and not any("wred_profile" in q for q in db["QUEUE"].values())
    assert "random-detect" not in files["spine-eos-qos.cfg"]


def test_infiniband_is_refused():
    cluster = load_cluster(ROOT / "examples" / "meta-24k-ib.yaml")
    with pytest.raises(UsageError, match="this fabric is infiniband"):
        switch_configs(cluster.spec, cluster.plan)


def test_vendor_picks_the_flavour():
    data = yaml.safe_load((ROOT / "examples" / "meta-24k-roce.yaml").read_text())
    data = copy.deepcopy(data)
    data["catalog"] = {"switches": {"my-leaf": {"name": "site leaf", "vendor": "arista", "ports": {400: 32},
                                                "fabrics": ["roce"]}}}
    data["fabric"]["switches"]["leaf"] = "my-leaf"
    cluster = cluster_of(validate_data(data, {}, Path("x.yaml")))
    assert "leaf-eos-qos.cfg" in switch_configs(cluster.spec, cluster.plan)
