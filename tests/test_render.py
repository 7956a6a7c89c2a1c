"""Rendered files: golden copies, sizes that grow with groups and switches (not nodes), hostlists
that expand to exactly the planned hosts, NCCL/RCCL settings derived from the fabric, and atomic writes.

Golden files live in tests/golden/<example>/; after an intended change, regenerate them with
GPUCLUSTER_UPDATE_GOLDEN=1 pytest tests/test_render.py and review the diff.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from functools import cache
from pathlib import Path

import hostlist
import pytest
from conftest import (
    EXAMPLES,
    GOLDEN_DIR,
    ROOT,
    cluster_example,
    compiled,
    dump_spec,
    example_data,
    example_path,
    generic_spec,
    loaded_example,
    spec_from_data,
)

from gpucluster.cluster import Cluster
from gpucluster.errors import UsageError
from gpucluster.outputs import MANIFEST
from gpucluster.render import render_all, write_outputs
from gpucluster.render.slurm import scale_for
from gpucluster.render.topology import block_members, slurm_switches
from gpucluster.spec.model import ClusterSpec

# example -> include cabling.csv (2 MB for Meta: not kept). colossus-200k: several node groups (h100, h200).
# example[@slurm version] -> with cabling.csv. Colossus 200k on 26.05 covers topology.yaml (25.05+): its
# H100 and H200 partitions on their own named topologies.
GOLDEN = {"staging": True, "meta-24k-roce": False, "colossus-200k": False, "colossus-200k@26.05": False}


@cache
def golden_cluster(name: str):
    from gpucluster.cluster import load_cluster

    example, _, version = name.partition("@")
    return load_cluster(example_path(example), slurm_version=version or None) if version else cluster_example(name)


def text_of(value) -> str:
    return value if isinstance(value, str) else "".join(value())


def render_spec(spec: ClusterSpec, *, cabling: bool = False) -> dict[str, str]:
    return {k: text_of(v) for k, v in render_all(compiled(spec), cabling=cabling).items()}


@cache
def rendered(name: str) -> dict[str, str]:
    return {k: text_of(v) for k, v in render_all(golden_cluster(name), cabling=GOLDEN.get(name, False)).items()}


def records(text: str, kind: str) -> list[dict[str, str]]:
    """Key=Value records of a slurm.conf-style file whose first key is `kind` (NodeName, SwitchName...)."""
    out = []
    for line in text.splitlines():
        if line.startswith(f"{kind}="):
            out.append(dict(tok.split("=", 1) for tok in line.split()))
    return out


def params(text: str) -> dict[str, str]:
    """Single Key=Value lines (no records)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and " " not in line.strip() and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def expand(expr: str) -> list[str]:
    return hostlist.expand_hostlist(expr)


# ---- golden files ------------------------------------------------------------------------------

# Every file render_all writes for these examples (Slurm, NCCL, RoCE, MooseFS, Ganesha, mount units, bom, plan):
# a new output needs its golden, and test_every_template_is_rendered_for_the_golden_examples sees that they
# cover every template.
GOLDEN_CASES = [(name, f) for name in GOLDEN for f in rendered(name)]


@pytest.mark.parametrize("name, filename", GOLDEN_CASES, ids=[f"{n}/{f}" for n, f in GOLDEN_CASES])
def test_golden(name, filename):
    got = rendered(name)[filename]
    path = GOLDEN_DIR / name / filename
    if os.environ.get("GPUCLUSTER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"{path} missing: run with GPUCLUSTER_UPDATE_GOLDEN=1 to create it"
    assert got == path.read_text(), f"{filename} differs from {path}; if intended, GPUCLUSTER_UPDATE_GOLDEN=1"


def test_golden_set_is_complete():
    """Every golden file is still rendered (a renamed output must not leave a stale golden behind)."""
    for name in GOLDEN:
        on_disk = {p.name for p in (GOLDEN_DIR / name).iterdir()}
        assert on_disk == {f for n, f in GOLDEN_CASES if n == name}


# ---- slurm.conf and friends --------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_one_nodename_line_per_compute_group(name):
    spec = loaded_example(name)[0].spec
    nodes = records(rendered(name)["slurm.conf"], "NodeName")
    compute = spec.groups_with_role("compute")
    assert len(nodes) == len(compute)
    for rec, g in zip(nodes, compute, strict=True):
        assert expand(rec["NodeName"]) == g.hosts
        assert int(rec["CPUs"]) == g.cpu.sockets * g.cpu.cores_per_socket * g.cpu.threads_per_core
        assert int(rec["RealMemory"]) == g.memory_gb * 1024
        features = rec["Feature"].split(",")
        assert len(features) == len(set(features)), f"duplicate features {features}"
        assert g.name in features and set(g.features) <= set(features)
        if g.gpu:
            assert rec["Gres"] == f"gpu:{spec.parts.gpus[g.gpu].slurm_type}:{g.gpus_per_node}"
            assert spec.parts.gpus[g.gpu].slurm_type in features
        else:
            assert "Gres" not in rec


@pytest.mark.parametrize("name", EXAMPLES)
def test_partitions_expand_to_their_groups(name):
    spec = loaded_example(name)[0].spec
    parts = records(rendered(name)["slurm.conf"], "PartitionName")
    assert [p["PartitionName"] for p in parts] == [p.name for p in spec.slurm.partitions]
    for rec, p in zip(parts, spec.slurm.partitions, strict=True):
        assert expand(rec["Nodes"]) == [h for g in p.groups for h in spec.group(g).hosts]
        assert rec["Default"] == ("YES" if p.default else "NO")


@pytest.mark.parametrize("name", EXAMPLES)
def test_topology_conf_is_the_planned_tree(name):
    """Every SwitchName line is a planned switch; node and switch hostlists expand to exactly the plan's. An
    example on topology/block (GB200/GB300: a block per NVLink domain) has the planned blocks instead."""
    spec, plan = loaded_example(name)[0].spec, loaded_example(name)[1]
    if spec.slurm.topology == "block":
        blocks = records(rendered(name)["topology.conf"], "BlockName")
        assert [b["BlockName"] for b in blocks] == [m.name for m in block_members(plan)]
        members = [h for b in blocks for h in expand(b["Nodes"])]
        assert sorted(members) == sorted(h for g in spec.fabric_groups for h in g.hosts)
        assert len(members) == len(set(members))
        return
    lines = records(rendered(name)["topology.conf"], "SwitchName")
    assert [r["SwitchName"] for r in lines] == [s.name for s in slurm_switches(plan)]
    names = {s.name for s in slurm_switches(plan)}
    under_leaves: list[str] = []
    for rec, sw in zip(lines, slurm_switches(plan), strict=True):
        assert ("Nodes" in rec) != ("Switches" in rec)
        if sw.nodes:
            assert expand(rec["Nodes"]) == expand(",".join(sw.nodes))
            under_leaves += expand(rec["Nodes"])
        else:
            assert expand(rec["Switches"]) == list(sw.switches)
            assert set(sw.switches) <= names
    assert sorted(under_leaves) == sorted(h for g in spec.fabric_groups for h in g.hosts)
    assert len(under_leaves) == len(set(under_leaves))


@pytest.mark.parametrize("name", EXAMPLES)
def test_gres_conf_matches_the_groups(name):
    spec = loaded_example(name)[0].spec
    recs = records(rendered(name)["gres.conf"], "NodeName")
    gpu_groups = [g for g in spec.groups_with_role("compute") if g.gpu]
    assert [expand(r["NodeName"]) for r in recs] == [g.hosts for g in gpu_groups]
    for rec, g in zip(recs, gpu_groups, strict=True):
        model = spec.parts.gpus[g.gpu]
        files = expand(rec["File"])
        assert len(files) == g.gpus_per_node
        assert rec["Type"] == model.slurm_type
        if model.vendor == "amd":
            assert files == [f"/dev/dri/renderD{128 + i}" for i in range(g.gpus_per_node)]
            assert rec["AutoDetect"] in ("rsmi", "off")
        else:
            assert files == [f"/dev/nvidia{i}" for i in range(g.gpus_per_node)]
            assert rec["AutoDetect"] in ("nvml", "nvidia", "off")


def test_mi250x_gres_has_eight_render_devices():
    rec = records(rendered("frontier-mi250x-roce")["gres.conf"], "NodeName")[0]
    assert expand(rec["File"]) == [f"/dev/dri/renderD{n}" for n in range(128, 136)]
    assert rec["AutoDetect"] == "rsmi"
    node = records(rendered("frontier-mi250x-roce")["slurm.conf"], "NodeName")[0]
    assert node["Gres"] == "gpu:mi250x:8"


@pytest.mark.parametrize("name", EXAMPLES)
def test_scale_settings_follow_the_node_count(name):
    """Slurm's big_sys guide: TreeWidth about the cube root of the node count, SlurmdTimeout >= 120 s."""
    spec = loaded_example(name)[0].spec
    n = sum(g.count for g in spec.groups_with_role("compute"))
    p = params(rendered(name)["slurm.conf"])
    width = int(p["TreeWidth"])
    assert (width - 1) ** 3 < n <= width**3 or (width == 2 and n <= 8)
    assert int(p["SlurmdTimeout"]) >= 120
    assert p["GresTypes"] == "gpu"
    assert p["SelectType"] == "select/cons_tres"
    assert p["TopologyPlugin"] == f"topology/{spec.slurm.topology}"
    assert p["ClusterName"] == spec.name
    assert scale_for(n).tree_width == width


def test_cgroup_conf_fences_devices():
    assert params(rendered("meta-24k-roce")["cgroup.conf"])["ConstrainDevices"] == "yes"


def test_block_topology_per_version():
    """topology/block: a block per unit; BlockSizes only from Slurm 24.05."""
    data = example_data("staging")
    data["slurm"].update(topology="block", version="23.11")
    spec = spec_from_data(data)
    out = render_spec(spec)
    plan = compiled(spec).plan
    blocks = records(out["topology.conf"], "BlockName")
    assert [b["BlockName"] for b in blocks] == [u.name for u in plan.units]
    assert [expand(b["Nodes"]) for b in blocks] == [expand(plan.unit_hostlist(u)) for u in plan.units]
    assert "BlockSizes" not in out["topology.conf"]
    assert params(out["slurm.conf"])["TopologyPlugin"] == "topology/block"
    data["slurm"]["version"] = "24.05"
    assert "\nBlockSizes=" in render_spec(spec_from_data(data))["topology.conf"]


# ---- sizes grow with groups and switches, not nodes --------------------------------------------

def sizes(spec: ClusterSpec) -> tuple[int, int, int]:
    out = render_spec(spec)
    return len(out["slurm.conf"]), len(out["topology.conf"]), len(records(out["topology.conf"], "SwitchName"))


def test_slurm_conf_size_does_not_grow_with_nodes():
    """Twice the nodes in the same units (twice the units): slurm.conf keeps its size, give or take digits."""
    base = sizes(spec_from_data(generic_spec([1000, 600], radix=64, rails=8, design="rail-optimized", unit=32)))
    double = sizes(spec_from_data(generic_spec([2000, 1200], radix=64, rails=8, design="rail-optimized", unit=32)))
    assert abs(double[0] - base[0]) <= 32  # a few more digits in counts (MaxJobCount, comments)
    # topology.conf grows with units (switch lines), roughly doubling here
    assert double[2] > base[2] * 1.8
    assert double[1] / double[2] == pytest.approx(base[1] / base[2], rel=0.15)


def test_topology_conf_grows_only_with_units():
    """Twice the nodes in twice-as-large units: the same number of switches, so about the same bytes."""
    small = sizes(spec_from_data(generic_spec([512, 256], radix=64, rails=2, unit=8)))
    large = sizes(spec_from_data(generic_spec([1024, 512], radix=64, rails=2, unit=16)))
    assert large[2] == small[2]
    assert abs(large[1] - small[1]) <= 2 * large[2]  # at most a digit or two per line
    assert abs(large[0] - small[0]) <= 32


@pytest.mark.parametrize("name", EXAMPLES)
def test_config_sizes_are_bounded_by_groups_and_switches(name):
    """No file lists nodes one by one: a generous bytes-per-line bound times the groups/switches."""
    spec, plan = loaded_example(name)[0].spec, loaded_example(name)[1]
    out = rendered(name)
    assert len(out["slurm.conf"]) < 4000 + 400 * len(spec.node_groups) + 200 * len(spec.slurm.partitions)
    assert len(out["topology.conf"]) < 400 + 120 * len(slurm_switches(plan))
    assert len(out["gres.conf"]) < 200 + 250 * len(spec.node_groups)


# ---- NCCL / RCCL -------------------------------------------------------------------------------

def nccl_files(name: str) -> list[tuple[str, str]]:
    out = rendered(name)
    confs = sorted(k for k in out if k.startswith("nccl") and k.endswith(".conf"))
    return [(out[c], out[c.replace("nccl", "nccl-env", 1).replace(".conf", ".sh")]) for c in confs]


@pytest.mark.parametrize("name", EXAMPLES)
def test_nccl_settings_follow_the_fabric(name):
    spec, plan = loaded_example(name)[0].spec, loaded_example(name)[1]
    fab = spec.fabric
    files = nccl_files(name)
    assert files
    groups = [g for g in spec.gpu_groups if g.role == "compute"]
    for conf_text, env_text in files:
        conf = params(conf_text)
        # the env script exports the same settings
        exported = {line.removeprefix("export ").split("=", 1)[0]: line.split("=", 1)[1]
                    for line in env_text.splitlines() if line.startswith("export ")}
        for k, v in conf.items():
            assert exported[k] == v
        assert conf["NCCL_IB_HCA"].startswith("=")  # exact names: mlx5_1 must not match mlx5_10
        assert conf["NCCL_IB_HCA"][1:].split(",") in [plan.hcas(g) for g in groups]
        assert conf["NCCL_SOCKET_IFNAME"] == fab.management_interface
        if fab.type == "roce":
            assert int(conf["NCCL_IB_TC"]) == fab.roce.dscp * 4
            assert conf["NCCL_IB_GID_INDEX"] == str(fab.roce.gid_index)
            assert "NCCL_IB_SL" not in conf
        else:
            assert "NCCL_IB_TC" not in conf and "NCCL_IB_GID_INDEX" not in conf
            assert conf["NCCL_IB_SL"] == str(fab.infiniband.service_level)
        assert conf["NCCL_CROSS_NIC"] == ("0" if fab.design == "rail-optimized" else "1")
        if fab.qps_per_connection:
            assert conf["NCCL_IB_QPS_PER_CONNECTION"] == str(fab.qps_per_connection)
        vendors = {spec.parts.gpus[g.gpu].vendor for g in groups}
        if vendors == {"amd"}:
            assert conf_text.startswith("# RCCL")
            assert "export HSA_FORCE_FINE_GRAIN_PCIE=1" in env_text.splitlines()
            assert conf["NCCL_NET_GDR_LEVEL"] == "3"
            assert "CUDA_DEVICE_ORDER" not in env_text
        else:
            assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in env_text.splitlines()
            assert "HSA_FORCE_FINE_GRAIN_PCIE" not in env_text


@pytest.mark.parametrize("dscp", [0, 24, 26, 46, 63])
def test_roce_traffic_class_is_dscp_times_four(dscp):
    data = example_data("staging")
    data["fabric"]["roce"] = {"dscp": dscp, "gid_index": 1}
    conf = params(render_spec(spec_from_data(data))["nccl.conf"])
    assert int(conf["NCCL_IB_TC"]) == dscp * 4 and int(conf["NCCL_IB_TC"]) >> 2 == dscp
    assert conf["NCCL_IB_GID_INDEX"] == "1"


def test_roce_without_gid_index_leaves_it_to_nccl():
    data = example_data("staging")
    data["fabric"]["roce"] = {"gid_index": None}
    assert "NCCL_IB_GID_INDEX" not in render_spec(spec_from_data(data))["nccl.conf"]


def test_infiniband_sharp_enables_collnet():
    conf = params(rendered("meta-24k-ib")["nccl.conf"])
    assert loaded_example("meta-24k-ib")[0].spec.fabric.infiniband.sharp
    assert conf["NCCL_COLLNET_ENABLE"] == "1"


def test_groups_with_different_settings_get_their_own_files():
    """Two GPU groups with different HCAs cannot share one nccl.conf."""
    data = example_data("colossus-200k")
    data["node_groups"][2]["hcas"] = [f"mlx5_{i + 10}" for i in range(8)]
    for g in data["node_groups"][1:3]:
        g["count"] = 64
    out = render_spec(spec_from_data(data))
    assert "nccl.conf" not in out
    assert params(out["nccl.h100.conf"])["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(8))
    assert params(out["nccl.h200.conf"])["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i + 10}" for i in range(8))
    assert "nccl-env.h200.sh" in out


# ---- atomic writes -----------------------------------------------------------------------------

def test_write_outputs_writes_every_file(tmp_path):
    files = {"a.conf": "a\n", "b.csv": lambda: iter(["x,", "y\n"])}
    assert write_outputs(files, tmp_path / "out") == {"a.conf": 2, "b.csv": 4}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([MANIFEST, "a.conf", "b.csv"])
    assert (tmp_path / "out" / "b.csv").read_text() == "x,y\n"


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_write_outputs_is_all_or_nothing(tmp_path, fail_at):
    """One output fails part way (disk full while streaming): nothing new lands, no temp dir is left,
    and files from an earlier render are untouched."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "slurm.conf").write_text("old\n")

    def broken():
        yield "half a file\n"
        raise OSError(28, "No space left on device")

    files: dict = {"slurm.conf": "new\n", "gres.conf": "new\n", "cabling.csv": "new\n"}
    name = list(files)[fail_at]
    files[name] = broken
    with pytest.raises(UsageError, match="nothing was changed"):
        write_outputs(files, out)
    assert [p.name for p in out.iterdir()] == ["slurm.conf"]
    assert (out / "slurm.conf").read_text() == "old\n"


def test_write_outputs_fails_cleanly_under_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="cannot create the output folder"):
        write_outputs({"a": "b"}, tmp_path / "file" / "out")


def test_render_all_names_and_no_cabling_switch():
    cluster = cluster_example("staging")
    names = set(render_all(cluster))
    assert names >= {"slurm.conf", "topology.conf", "gres.conf", "cgroup.conf", "nccl.conf", "cabling.csv", "bom.csv"}
    assert "cabling.csv" not in render_all(cluster, cabling=False)


def test_templates_come_from_the_templates_dir():
    """One renderer: every config file has a template under templates/ (the Ansible roles use the same)."""
    from gpucluster.render import templates_dir

    t = Path(templates_dir())
    for f in ("slurm/slurm.conf.j2", "slurm/topology.conf.j2", "slurm/gres.conf.j2", "slurm/cgroup.conf.j2",
              "nccl/nccl.conf.j2", "nccl/nccl-env.sh.j2"):
        assert (t / f).is_file()


def test_topology_none_writes_no_topology_conf():
    data = example_data("staging")
    data["slurm"]["topology"] = "none"
    out = render_spec(spec_from_data(data))
    assert "topology.conf" not in out
    assert "TopologyPlugin" not in params(out["slurm.conf"])


@pytest.mark.parametrize("name", EXAMPLES)
def test_bom_counts_come_from_the_plan(name):
    import csv

    spec, plan = loaded_example(name)[0].spec, loaded_example(name)[1]
    rows = list(csv.reader(rendered(name)["bom.csv"].splitlines()))
    assert rows[0] == ["category", "item", "model", "description", "quantity"]
    qty = {(r[0], r[1]): int(r[4]) for r in rows[1:]}
    for tier, count in plan.switches.items():
        assert qty[("switch", tier)] == count
    for g in spec.node_groups:
        assert qty[("node", g.name)] == g.count
    for key, n in plan.gpus_by_type.items():
        # cards, not GPUs: an MI250X card is two GCDs (two GPUs to Slurm)
        assert qty[("gpu", key)] * spec.parts.gpus[key].devices_per_card == n
    nics: dict[str, int] = {}
    for g in spec.node_groups:
        if g.nic:
            nics[g.nic] = nics.get(g.nic, 0) + g.count * g.nics_per_node
    assert {k[1]: v for k, v in qty.items() if k[0] == "nic"} == nics
    assert {k[1]: v for k, v in qty.items() if k[0] == "cable"} == plan.links
    assert qty[("transceiver", "switch-switch")] == 2 * sum(v for k, v in plan.links.items() if k != "node-leaf")
    assert qty[("rack", "nodes")] == sum(-(-g.count // g.nodes_per_rack) for g in spec.node_groups)


def test_mi250x_bom_counts_cards():
    gpu = next(r.split(",") for r in rendered("frontier-mi250x-roce")["bom.csv"].splitlines() if r.startswith("gpu,"))
    assert gpu[1] == "mi250x" and int(gpu[-1]) == 384 * 4  # 4 cards a node, 8 GCDs


def test_compiled_templates_are_cached_between_runs_and_change_nothing(tmp_path):
    """The Jinja bytecode cache (render/templating.py) fills on the first run and the second run,
    which reads it, writes the same bytes; an unusable cache folder only costs the time."""
    import subprocess
    import sys

    entry = Path(sys.executable).parent / "gpucluster"
    outputs = {}
    for run_name, cache_dir in (("first", tmp_path / "cache"), ("second", tmp_path / "cache"),
                                ("no-cache", Path("/proc/gpucluster-no-cache"))):
        env = {**os.environ, "GPUCLUSTER_CACHE_DIR": str(cache_dir)}
        out = tmp_path / run_name
        res = subprocess.run([str(entry), "render", str(example_path("staging")), "-o", str(out)],
                             capture_output=True, text=True, env=env, check=False)
        assert res.returncode == 0, res.stderr
        outputs[run_name] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
        if run_name == "first":
            assert list((cache_dir / "jinja").glob("*.cache")), "no compiled template was cached"
    assert outputs["first"] == outputs["second"] == outputs["no-cache"]


BASELINE_PATH = GOLDEN_DIR / "baseline-sha256.json"
BASELINE = json.loads(BASELINE_PATH.read_text())


@pytest.mark.parametrize("name", EXAMPLES)
def test_rendered_files_keep_their_recorded_bytes(name):
    """Every file every example renders has its sha256 in tests/golden/baseline-sha256.json, so no rendered
    byte changes unnoticed. The hashes are not a record from any one moment: they were first taken for the
    one-compiled-load refactor and are re-recorded with GPUCLUSTER_UPDATE_GOLDEN=1 at each deliberate change
    (a changed file, or a new one, which is added), each commit saying why (`git log` of the json)."""
    got = {}
    for file, value in render_all(cluster_example(name)).items():
        h = hashlib.sha256()
        for chunk in [value] if isinstance(value, str) else value():
            h.update(chunk.encode())
        got[file] = h.hexdigest()
    if os.environ.get("GPUCLUSTER_UPDATE_GOLDEN") == "1":
        with _BASELINE_LOCK:
            recorded = json.loads(BASELINE_PATH.read_text())
            recorded[name] = {f: got[f] for f in sorted(got)}
            BASELINE_PATH.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")
        return
    want = BASELINE[name]
    assert set(want) <= set(got), f"files no longer rendered: {sorted(set(want) - set(got))}"
    assert {f: got[f] for f in want} == want, "a rendered file changed; if intended, GPUCLUSTER_UPDATE_GOLDEN=1"


_BASELINE_LOCK = threading.Lock()


def test_slurm_parameters_merge_over_the_computed_defaults():
    """A key the template writes takes the spec's value in place (case-insensitive, once); a key it does
    not write goes to a site section at the end; the hooks the spec names are written."""
    data = example_data("staging")
    data["slurm"]["parameters"] = {"treewidth": 7, "MaxArraySize": 10001, "SchedulerParameters": "bf_continue"}
    data["slurm"]["prolog"] = "/etc/slurm/prolog.sh"
    data["health"] = {"interval": 60}
    data["slurm"]["parameters"]["Licenses"] = "matlab:4"
    conf = render_spec(spec_from_data(data))["slurm.conf"]
    keys = [line.split("=", 1)[0].lower() for line in conf.splitlines() if "=" in line and not line.startswith("#")]
    assert keys.count("treewidth") == 1 and params(conf)["TreeWidth"] == "7"
    assert params(conf)["SchedulerParameters"] == "bf_continue"
    tail = conf.split("# Site parameters (slurm.parameters in the spec)\n", 1)[1]
    assert tail == "MaxArraySize=10001\n"
    assert params(conf)["Prolog"] == "/etc/slurm/prolog.sh"
    assert (params(conf)["HealthCheckProgram"], params(conf)["HealthCheckInterval"]) == (
        "/usr/local/sbin/gpucluster-health", "60")
    # merged with the health checks' licenses (the circuit breaker's: staging's one group) into one Licenses=
    assert params(conf)["Licenses"] == "gpc_drain_gpu:2,gpc_breaker_gpu:1,matlab:4"
    assert params(conf)["PropagateResourceLimitsExcept"] == "MEMLOCK"
    assert "Epilog" not in params(conf)


# ---- every template, and the files of node groups (RoCE settings, storage tiers) ----------------

def test_every_template_is_rendered_for_the_golden_examples(monkeypatch):
    """One renderer: rendering the golden examples loads every template under templates/ (the HTML report
    aside, which `gpucluster plan --html` renders), so every template has golden files."""
    from gpucluster.render import environment, templates_dir

    env = environment()
    loaded: set[str] = set()
    real = env.get_template

    def recording(name, *args, **kwargs):
        loaded.add(str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(env, "get_template", recording)
    for name in GOLDEN:
        render_all(golden_cluster(name), cabling=False)
    root = Path(templates_dir())
    # Rendered elsewhere on purpose, each with golden files of its own: the HTML plan (`plan --html`); the
    # driver stacks' sources and pins (per node, with the node's own Debian mirror; tests/golden/drivers per
    # GPU SKU); the active health checks (only when health.active names checks; tests/test_health_config.py); the
    # NVLink domain guard's timer (only for clusters with NVLink domains; tests/test_domain_guard.py).
    elsewhere = {"report/plan.html.j2", *(str(p.relative_to(root)) for p in root.glob("drivers/*.j2")),
                 *(str(p.relative_to(root)) for p in root.glob("health/*active*.j2")),
                 *(str(p.relative_to(root)) for p in root.glob("health/*domain-guard*.j2"))}
    every = {str(p.relative_to(root)) for p in root.rglob("*.j2")} - elsewhere
    assert every - loaded == set(), f"templates no golden example renders: {sorted(every - loaded)}"


def _facts(name_or_cluster) -> dict:
    from gpucluster.compiled import facts

    cluster = cluster_example(name_or_cluster) if isinstance(name_or_cluster, str) else name_or_cluster
    return facts(cluster, {k: text_of(v) for k, v in render_all(cluster, cabling=False).items()})


def _named(entry: dict) -> list[str]:
    return [n for v in entry.values() for n in (v if isinstance(v, list) else [v])]


@pytest.mark.parametrize("name", EXAMPLES)
def test_facts_name_a_rendered_file_for_every_group_that_needs_one(name):
    """The compiled facts say which rendered file each node group takes, for every contract group that
    installs one; every name is a rendered file, and none is left that no group takes."""
    cluster = cluster_example(name)
    out = {k: text_of(v) for k, v in render_all(cluster, cabling=False).items()}
    files = _facts(cluster)["files"]
    assert set(files) == {g.name for g in cluster.spec.node_groups}
    need = {"flash_meta": "moosefs_master", "flash_chunk": "moosefs_chunkserver", "flash_client": "flash_mount",
            "nfs_server": "ganesha", "nfs_client": "nfs_mounts", "fabric_roce": "roce_qos"}
    for g in cluster.spec.node_groups:
        member = cluster.memberships(g)
        for contract, purpose in need.items():
            assert (purpose in files[g.name]) == (contract in member), (g.name, contract, files[g.name])
        for mount in cluster.storage["nfs_mounts"]:
            assert (g.name in mount["client_groups"]) == (mount["unit"] in files[g.name].get("nfs_mounts", []))
        assert set(_named(files[g.name])) <= set(out), f"{g.name}: {files[g.name]} names a file not rendered"
    taken = {n for entry in files.values() for n in _named(entry)}
    host_files = {n for n in out if (n.endswith((".mount", ".cfg")) or n.startswith(("ganesha", "roce-qos")))
                  and not n.endswith(("-qos.cfg", "-qos.json"))}  # a switch tier's QoS file is for switches
    assert host_files == taken, f"rendered but taken by no node group: {sorted(host_files - taken)}"


def test_mount_units_are_named_by_their_systemd_unit_one_per_mount():
    from gpucluster.cluster.unitnames import unit_name

    spec = cluster_example("meta-24k-roce").spec
    out = rendered("meta-24k-roce")
    mounts = [spec.storage.flash.mount] + [e.mount for t in spec.storage.nfs for e in t.exports]
    assert sorted(n for n in out if n.endswith(".mount")) == sorted(unit_name(m) for m in mounts)
    for m in mounts:
        assert f"\nWhere={m}\n" in out[unit_name(m)]


def _roce_devices(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("ROCE_DEVICES="))
    return line.split("=", 1)[1].strip('"').split()


def test_roce_settings_are_one_file_while_the_groups_share_their_hcas():
    spec = cluster_example("colossus-200k").spec
    out = rendered("colossus-200k")
    assert [n for n in out if n.startswith("roce-qos")] == ["roce-qos.conf"]
    assert {tuple(cluster_example("colossus-200k").hcas(g)) for g in spec.fabric_groups} == {
        tuple(_roce_devices(out["roce-qos.conf"]))}
    roce = spec.fabric.roce
    conf = params(out["roce-qos.conf"])
    assert (conf["ROCE_DSCP"], conf["ROCE_TOS"], conf["ROCE_PFC_PRIORITY"]) == (
        str(roce.dscp), str(roce.dscp * 4), str(roce.pfc_priority))
    assert _facts("colossus-200k")["files"]["h200"]["roce_qos"] == "roce-qos.conf"


def test_groups_with_different_hcas_get_their_own_roce_settings():
    data = example_data("colossus-200k")
    data["node_groups"][2]["hcas"] = [f"mlx5_{i + 10}" for i in range(8)]
    for g in data["node_groups"][1:3]:
        g["count"] = 64
    cluster = compiled(spec_from_data(data))
    out = {k: text_of(v) for k, v in render_all(cluster, cabling=False).items()}
    assert "roce-qos.conf" not in out
    assert _roce_devices(out["roce-qos.h100.conf"]) == [f"mlx5_{i}" for i in range(8)]
    assert _roce_devices(out["roce-qos.h200.conf"]) == [f"mlx5_{i + 10}" for i in range(8)]
    files = _facts(cluster)["files"]
    assert (files["h100"]["roce_qos"], files["h200"]["roce_qos"]) == ("roce-qos.h100.conf", "roce-qos.h200.conf")


def test_infiniband_renders_no_roce_settings():
    assert not [n for n in rendered("meta-24k-ib") if n.startswith("roce-qos")]
    assert all("roce_qos" not in entry for entry in _facts("meta-24k-ib")["files"].values())


def _two_nfs_servers() -> ClusterSpec:
    """staging with a second NFS server group serving a second tier to the same clients, NFSv4 only."""
    data = example_data("staging")
    nfs = next(g for g in data["node_groups"] if g["name"] == "nfs")
    data["node_groups"].append({**nfs, "name": "nfs-b", "hostname": "nfsb##"})
    data["storage"]["nfs"].append({"name": "scratch", "server_group": "nfs-b",
                                   "ganesha": {"protocols": [4], "squash": "No_Root_Squash"},
                                   "exports": [{"path": "/export/scratch", "mount": "/scratch"}]})
    return spec_from_data(data)


def test_each_nfs_server_group_gets_its_own_ganesha_conf():
    cluster = compiled(_two_nfs_servers())
    out = {k: text_of(v) for k, v in render_all(cluster, cabling=False).items()}
    assert "ganesha.conf" not in out
    home, scratch = out["ganesha.nfs.conf"], out["ganesha.nfs-b.conf"]
    assert "Path = /export/home;" in home and "/export/scratch" not in home
    assert "Path = /export/scratch;" in scratch and "/export/home" not in scratch
    assert "\tProtocols = 3, 4;\n\tNFS_Port" in home and "\tProtocols = 4;\n\tNFS_Port" in scratch
    assert "Squash = No_Root_Squash;" in scratch and "Squash = Root_Squash;" in home
    files = _facts(cluster)["files"]
    assert (files["nfs"]["ganesha"], files["nfs-b"]["ganesha"]) == ("ganesha.nfs.conf", "ganesha.nfs-b.conf")
    assert files["gpu"]["nfs_mounts"] == ["home-shared.mount", "scratch.mount"]
    assert "\nWhat=nfsb01:/export/scratch\n" in out["scratch.mount"]


def test_one_server_group_speaks_every_protocol_its_tiers_ask_for():
    data = example_data("staging")
    data["storage"]["nfs"][0]["ganesha"] = {"protocols": [4]}
    data["storage"]["nfs"].append({"name": "scratch", "server_group": "nfs", "ganesha": {"protocols": [3]},
                                   "exports": [{"path": "/export/scratch", "mount": "/scratch"}]})
    conf = render_spec(spec_from_data(data))["ganesha.conf"]
    assert "\tProtocols = 3, 4;\n\tNFS_Port" in conf
    exports = conf.split("\nEXPORT {")[1:]
    assert ["Protocols = 4;" in exports[0], "Protocols = 3;" in exports[1]] == [True, True]
    assert [int(e.split("Export_Id = ")[1].split(";")[0]) for e in exports] == [1, 2]


# ---- the roles install exactly the rendered bytes --------------------------------------------------
# The roles' own expressions (preflight set_facts, include conditions, copy src/dest/loop) are evaluated with
# Ansible's templar and the project's filter plugins, for hosts of every node group, against a compiled state
# folder: each copy's src must be a compiled rendered file, and the files a host gets are the ones the facts
# name for its node group, byte for byte what render_all writes.

ROLE_HOSTS = {"flash_storage": ("flash_meta", "flash_chunk", "flash_client"), "nfs": ("nfs_server", "nfs_client"),
              "rdma": ("fabric_roce",)}


def _yaml_file(path: Path):
    import yaml

    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def _trusted(value):
    """Role files are templates to Ansible (2.19 templates only strings it trusts, as it does the role's own)."""
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


class RoleRun:
    """The variable flow of one role on one host, without a node: set_fact, include conditions, copies."""

    def __init__(self, role: str, host_vars: dict):
        from ansible.plugins.loader import filter_loader

        filter_loader.add_directory(str(ROOT / "plugins" / "filter"))
        self.base = ROOT / "roles" / role
        role_vars = {**_yaml_file(self.base / "defaults/main.yml"), **_yaml_file(self.base / "vars/main.yml"),
                     **_yaml_file(self.base / "vars/Debian.yml")}
        self.vars = {**_trusted(role_vars), **host_vars}
        self.copies: list[tuple[str, str]] = []

    def value(self, expr):
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar, trust_as_template

        templar = Templar(loader=DataLoader(), variables=self.vars)
        if isinstance(expr, str):
            return templar.template(trust_as_template(expr))
        return expr

    def true(self, task: dict) -> bool:
        when = task.get("when", [])
        return all(self.value("{{ " + str(c) + " }}") in (True, "True") for c in
                   (when if isinstance(when, list) else [when]))

    def run(self, tasks_file: str, only: str | None = None) -> None:
        from ansible.errors import AnsibleUndefinedVariable

        for task in _yaml_file(self.base / "tasks" / tasks_file):
            copy = task.get("ansible.builtin.copy") or {}
            installs = "rendered" in str(copy.get("src", ""))
            if only and task.get("name") != only:
                continue
            if "ansible.builtin.set_fact" in task:
                saved = dict(self.vars)
                self.vars.update(_trusted(task.get("vars") or {}))  # the task's own vars, templated where read
                try:  # facts from what a node reports (registered results) are not this test's: skipped
                    facts = {k: self.value(v) for k, v in task["ansible.builtin.set_fact"].items()} \
                        if self.true(task) else {}
                except AnsibleUndefinedVariable:
                    facts = {}
                self.vars = {**saved, **facts}
                if not facts:
                    continue
            includes = [task[k] for k in ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks") if k in task]
            if (includes or installs) and not self.true(task):
                continue
            for name in includes:
                self.run(name)
            if installs:
                saved = dict(self.vars)
                self.vars.update({k: self.value(v) for k, v in (task.get("vars") or {}).items()})
                for item in self.value(task["loop"]) if "loop" in task else [None]:
                    self.vars["item"] = item
                    self.copies.append((self.value(copy["src"]), self.value(copy["dest"])))
                self.vars = saved


def _staged_state(tmp_path: Path, data: dict) -> tuple[Cluster, Path]:
    from gpucluster.cluster import load_cluster
    from gpucluster.compiled import compile_to

    spec = tmp_path / "spec.yaml"
    spec.write_text(dump_spec(data))
    cluster = load_cluster(spec)
    return cluster, compile_to(cluster, tmp_path / "state").parent


def _variants() -> dict[str, dict]:
    two_servers = example_data("staging")
    nfs = next(g for g in two_servers["node_groups"] if g["name"] == "nfs")
    two_servers["node_groups"].append({**nfs, "name": "nfs-b", "hostname": "nfsb##"})
    two_servers["storage"]["nfs"].append({"name": "scratch", "server_group": "nfs-b",
                                          "exports": [{"path": "/export/scratch", "mount": "/scratch"}]})
    hcas = example_data("colossus-200k")
    hcas["node_groups"][2]["hcas"] = [f"mlx5_{i + 10}" for i in range(8)]
    for g in hcas["node_groups"]:
        g["count"] = min(g["count"], 64)
    return {"staging": example_data("staging"), "two-nfs-servers": two_servers, "colossus-hcas": hcas}


@pytest.mark.parametrize("variant", ["staging", "two-nfs-servers", "colossus-hcas"])
def test_roles_install_exactly_the_rendered_files(variant, tmp_path):
    cluster, state = _staged_state(tmp_path, _variants()[variant])
    rendered_dir = state / "compiled" / "rendered"
    want_bytes = {k: text_of(v).encode() for k, v in render_all(cluster, cabling=False).items()}
    files = _facts(cluster)["files"]
    groups = {**cluster.contract_groups, "all": cluster.hosts}
    dest_of = {"moosefs_master": "/etc/mfs/{}", "moosefs_metalogger": "/etc/mfs/{}",
               "moosefs_chunkserver": "/etc/mfs/{}", "flash_mount": "/etc/systemd/system/{}",
               "nfs_mounts": "/etc/systemd/system/{}", "ganesha": "/etc/ganesha/ganesha.conf",
               "roce_qos": "/etc/gpucluster/roce-qos.conf"}
    installed_anything = set()
    for g in cluster.spec.node_groups:
        for host in g.hosts[:2]:  # the first host of a group is special (the MooseFS master), the second is not
            host_vars = {"gpucluster_state_dir": str(state), "gpucluster_node_group": g.name,
                         "inventory_hostname": host, "groups": groups, "group_names": list(cluster.memberships(g))}
            got: list[tuple[str, str]] = []
            for role, contracts in ROLE_HOSTS.items():
                if not set(contracts) & set(cluster.memberships(g)):
                    continue
                run = RoleRun(role, host_vars)
                if role == "rdma":  # only its roce-qos task is this test's (the rest needs the node's sysfs)
                    run.run("preflight.yml")
                    run.run("roce.yml", only=next(t["name"] for t in _yaml_file(run.base / "tasks/roce.yml")
                                                  if "rendered" in str(t.get("ansible.builtin.copy", {}))))
                else:
                    run.run("main.yml")
                got += run.copies
            want = []
            for purpose, names in files[g.name].items():
                for name in names if isinstance(names, list) else [names]:
                    if purpose == "moosefs_master" and host != cluster.storage["flash"]["master"]:
                        continue
                    if purpose == "moosefs_metalogger" and host == cluster.storage["flash"]["master"]:
                        continue
                    want.append((str(rendered_dir / name), dest_of[purpose].format(name)))
            assert sorted(got) == sorted(want), f"{host} ({g.name})"
            for src, _dest in got:
                assert Path(src).read_bytes() == want_bytes[Path(src).name], src
                installed_anything.add(Path(src).name)
    assert installed_anything, "no role installed a rendered file"


def test_no_role_renders_a_config_file_itself():
    """The gpucluster_render filter is gone, and the storage roles write no config from inline content (only
    skip records do)."""
    assert "gpucluster_render" not in (ROOT / "plugins/filter/gpucluster_facts.py").read_text()
    for role in ("flash_storage", "nfs", "rdma"):
        for path in (ROOT / "roles" / role).rglob("*.yml"):
            assert "gpucluster_render" not in path.read_text(), path
    for role in ("flash_storage", "nfs"):
        for path in (ROOT / "roles" / role / "tasks").glob("*.yml"):
            for task in _yaml_file(path) or []:
                copy = task.get("ansible.builtin.copy") or {}
                if "content" in copy:
                    assert "skip_dir" in str(copy["dest"]), f"{path}: {task['name']} writes inline content"
