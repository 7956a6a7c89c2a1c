"""What each compute group checks, from the spec and the plan (expected values read from them here too),
the slurm.conf lines, and the active checks' jobs and scripts (which the shell must parse)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, example_path, example_text

from gpucluster.cluster import load_cluster
from gpucluster.render.health import active, breakerconf, slurmconf
from gpucluster.render.health import rolefiles as files
from gpucluster.render.health.config import node_configs
from gpucluster.spec.stacks import needs_fabric_manager


def staging_with_health(section: str) -> str:
    """examples/staging.yaml with its own health: section (its last block) replaced by `section`."""
    head, sep, _own = example_text("staging").rpartition("\nhealth:\n")
    assert sep, "examples/staging.yaml has no health: section"
    return head + "\n" + section


@pytest.fixture(scope="module")
def clusters() -> dict:
    return {name: load_cluster(example_path(name)) for name in EXAMPLES}


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_compute_group_checks_what_the_spec_and_plan_say(clusters, name: str) -> None:
    cluster = clusters[name]
    spec, plan = cluster.spec, cluster.plan
    configs = node_configs(cluster)
    assert set(configs) == {g.name for g in spec.groups_with_role("compute")}
    for group_name, config in configs.items():
        group = spec.group(group_name)
        by_name = {c["name"]: c for c in config["checks"]}
        assert config["run_budget"] < 60, "slurmd kills its HealthCheckProgram at 60 s"
        assert config["run_budget"] <= spec.health.interval
        assert {"munge", "disk-tmp", "disk-spool"} <= set(by_name)
        if group.gpu and group.gpus_per_node:
            model = spec.parts.gpus[group.gpu]
            assert (by_name["gpu-count"]["count"], by_name["gpu-count"]["model"]) == (group.gpus_per_node,
                                                                                        model.slurm_type)
            assert by_name["gpu-ecc"]["vendor"] == model.vendor
        assert ("fabric-manager" in by_name) == needs_fabric_manager(spec, group)
        rdma = group in spec.fabric_groups and spec.parts.nics[group.nic].rdma
        assert ("hca-ports" in by_name) == rdma
        if rdma:
            assert by_name["hca-ports"]["hcas"] == plan.hcas(group)
            assert by_name["hca-ports"]["rate_gbps"] == plan.speed_gbps


def test_staging_checks_the_stand_in_gpus_and_both_storage_tiers(clusters) -> None:
    config = node_configs(clusters["staging"])["gpu"]
    names = [c["name"] for c in config["checks"]]
    assert names == ["munge", "gpu-count", "gpu-ecc", "gpu-xid", "mount-flash", "mount-home", "disk-tmp",
                     "disk-spool"]
    home = next(c for c in config["checks"] if c["name"] == "mount-home")
    assert home["skip_record"] == "/var/lib/gpucluster/skipped/nfs-mount-home-shared.mount"


def test_skip_and_thresholds_come_from_the_spec(tmp_path: Path) -> None:
    text = staging_with_health("health:\n  skip: [mount-home, gpu-ecc]\n  interval: 60\n  check_timeout: 7\n"
                               "  min_free_pct: 12.5\n  resume_after: 2\n")
    (tmp_path / "s.yaml").write_text(text)
    config = node_configs(load_cluster(tmp_path / "s.yaml"))["gpu"]
    names = [c["name"] for c in config["checks"]]
    assert "mount-home" not in names and "gpu-ecc" not in names
    assert {c["timeout"] for c in config["checks"]} == {7} and config["run_budget"] == 17
    assert next(c for c in config["checks"] if c["name"] == "disk-spool")["min_free_pct"] == 12.5
    assert config["resume_after"] == 2 and config["interval"] == 60


def test_fail_after_and_the_xid_overrides_come_from_the_spec(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(staging_with_health("health:\n  fail_after: 5\n  xid_actions: {13: drain, "
                                                         "79: service}\n"))
    config = node_configs(load_cluster(tmp_path / "s.yaml"))["gpu"]
    assert config["fail_after"] == 5
    xid = next(c for c in config["checks"] if c["name"] == "gpu-xid")
    assert xid["xid_actions"] == {"13": "drain", "79": "service"} and xid["kernel_log"] == "kmsg"


def test_gpu_xid_runs_on_gpu_groups_only(clusters) -> None:
    for name, cluster in clusters.items():
        for group_name, config in node_configs(cluster).items():
            group = cluster.spec.group(group_name)
            has = any(c["name"] == "gpu-xid" for c in config["checks"])
            assert has == bool(group.gpu and group.gpus_per_node), f"{name}/{group_name}"
            assert config["fail_after"] == cluster.spec.health.fail_after


def test_slurm_conf_lines_and_the_license_cap(tmp_path: Path) -> None:
    text = example_text("meta-24k-ib").replace("fabric:\n", "health:\n  interval: 120\n  node_state: IDLE,CYCLE\n"
                                               "  active: {checks: [dcgm-diag, ib-bandwidth], share_pct: 2.5}\n"
                                               "fabric:\n", 1)
    (tmp_path / "s.yaml").write_text(text)
    cluster = load_cluster(tmp_path / "s.yaml")
    nodes = slurmconf.active_nodes(cluster)
    assert nodes == sum(cluster.spec.group(g).count for g in cluster.spec.slurm.partitions[0].groups)
    assert slurmconf.slurm_conf_lines(cluster) == [
        "HealthCheckProgram=/usr/local/sbin/gpucluster-health", "HealthCheckInterval=120",
        "HealthCheckNodeState=IDLE,CYCLE",
        "Licenses=" + ",".join([f"gpc_active:{math.floor(nodes * 2.5 / 100)}", *breakerconf.license_entries(cluster)])]


def test_no_active_checks_no_license(clusters) -> None:
    """No active check: no gpc_active license (the circuit breaker's licenses, render/health/breakerconf.py, stay)."""
    lines = [line for line in slurmconf.slurm_conf_lines(clusters["staging"]) if line.startswith("Licenses=")]
    assert all("gpc_active" not in line for line in lines)
    breaker = breakerconf.license_entries(clusters["staging"])
    assert lines == ([f"Licenses={','.join(breaker)}"] if breaker else [])
    assert active.files(clusters["staging"]) == {}


@pytest.fixture(scope="module")
def active_cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("active")
    section = ("health:\n  active:\n    checks: [dcgm-diag, nccl-allreduce, ib-bandwidth]\n"
               "    nccl_min_busbw_gbps: 350\n")
    text = example_text("meta-24k-ib").replace("fabric:\n", section + "fabric:\n", 1)
    (d / "s.yaml").write_text(text)
    return load_cluster(d / "s.yaml")


def test_ib_bandwidth_pairs_nodes_under_one_leaf(active_cluster) -> None:
    plan, spec = active_cluster.plan, active_cluster.spec
    job = next(j for j in active.jobs(active_cluster) if j["check"] == "ib-bandwidth")
    unit_of = plan.unit_of_host
    paired = [h for pair in job["node_sets"] for h in pair.split(",")]
    assert len(paired) == len(set(paired))
    for pair in job["node_sets"]:
        a, b = pair.split(",")
        assert unit_of[a].name == unit_of[b].name
    assert job["hcas"] == plan.hcas(spec.group(job["group"]))


def test_every_gpu_node_gets_its_single_node_checks(active_cluster) -> None:
    spec = active_cluster.spec
    for check in ("dcgm-diag", "nccl-allreduce"):
        hosts = [h for j in active.jobs(active_cluster) if j["check"] == check for h in j["node_sets"]]
        assert hosts == [h for g in spec.gpu_groups if g.role == "compute" for h in g.hosts]


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_rendered_scripts_parse(active_cluster, tmp_path: Path, shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    scripts = {p: t for p, t in active.files(active_cluster).items() if p.endswith(".sh")}
    scripts["gpucluster-health"] = files.generated(active_cluster)[files.WRAPPER]
    assert len(scripts) == 5  # three checks of the one GPU group, the submitter, the wrapper
    for path, text in scripts.items():
        f = tmp_path / Path(path).name
        f.write_text(text)
        res = subprocess.run([shell, "-n", str(f)], capture_output=True, text=True, check=False)
        assert res.returncode == 0, f"{path}: {res.stderr}"


def test_job_scripts_carry_the_cap_and_the_floor(active_cluster) -> None:
    texts = active.files(active_cluster)
    nccl = next(t for p, t in texts.items() if "nccl-allreduce" in p)
    lic = slurmconf.license_count(active_cluster)
    assert "#SBATCH --licenses=gpc_active:1\n" in nccl and f"{lic} 'gpc_active' licenses" in nccl
    assert "b < 350.0" in nccl or "b < 350" in nccl
    ib = next(t for p, t in texts.items() if "ib-bandwidth" in p)
    assert "#SBATCH --licenses=gpc_active:2\n" in ib
    assert f"{round(active_cluster.plan.speed_gbps * 0.9, 1)}" in ib
    submit = texts[active.SUBMIT]
    first = active_cluster.spec.gpu_groups[0].hosts[0]
    assert f"submit dcgm-diag {active.LIB_DIR}/active-dcgm-diag-h100.sh {first}\n" in submit


def test_role_data_ships_the_node_scripts_as_they_are(clusters) -> None:
    """The role copies the node scripts from the package folder the facts name, and the generated files from
    the compiled rendered/ folder by the names the facts give."""
    from gpucluster import node

    data = files.facts(clusters["staging"])
    generated = files.generated(clusters["staging"])
    node_dir = Path(node.__file__).parent
    assert Path(data["scripts_dir"]) == node_dir
    assert sorted(data["scripts"]) == sorted(p.name for p in node_dir.glob("*.py")
                                             if p.name != "__init__.py" and p.name not in node.PROGRAMS)
    assert json.loads(generated[data["configs"]["gpu"]])["group"] == "gpu"
    assert data["paths"]["program"] == slurmconf.PROGRAM
    assert f"{data['paths']['lib_dir']}/runner.py --config {data['paths']['config']}" in generated[data["wrapper"]]


def test_slurm_time_format() -> None:
    assert [active.slurm_seconds(t) for t in ("15", "15:30", "1:00:00", "2-00:00:00", "1-2", "0:15:00")] == [
        900, 930, 3600, 172800, 93600, 900]


def test_cli_render_writes_the_files_and_prints_the_slurm_conf_lines(tmp_path: Path) -> None:
    import sys

    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "health", "render", str(example_path("staging")),
                          "-o", str(out)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "HealthCheckProgram=/usr/local/sbin/gpucluster-health" in res.stdout
    assert json.loads((out / files.config_name("gpu")).read_text())["group"] == "gpu"
    assert (out / "runner.py").read_text() == (files.NODE_DIR / "runner.py").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(staging_with_health("health:\n  skip: [gpu-cnt]\n"))
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "health", "render", str(bad), "-o", str(out)],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 2 and f"{bad}:" in res.stderr and "[health]" in res.stderr
    assert "Traceback" not in res.stderr
