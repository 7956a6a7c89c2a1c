"""Slurm 24.11 on Debian 13 staged nodes: examples/staging-trixie.yaml (the module's staged_trixie fixture).

The chain: stage up -> configure -> validate -> a `--switches=1` job lands under one leaf. Then what
differs on Debian 13, each from the roles' own vars/Debian-13.yml (never a copy): the nodes run trixie,
its Slurm, munge, MooseFS 4 and NFS-Ganesha 6.5 at the pinned versions; MooseFS 4 keeps the replicas as
a storage class; MariaDB 11.8 takes the job's accounting record. And the production cgroup profile
(proctrack/cgroup, task/cgroup with ConstrainDevices): a job that asked for N GPUs can open exactly its
own N device files. A second configure changes nothing.

The GPU device files are STAGING STAND-INS (character devices 120:N, no driver): the device cgroup
decides first, so a GPU the job was given opens up to the missing driver ("No such device or address")
and one it was not given is refused ("Operation not permitted"). examples/staging.yaml keeps the staging
profile (proctrack/linuxproc, task/none), so its cluster cannot show this; docs/staging.md says why.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpucluster.cluster import load_cluster
from gpucluster.render import render_all
from gpucluster.stage.image import SUITES
from gpucluster.validate.report import parse_junit

pytestmark = pytest.mark.staged

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "staging-trixie.yaml"
_CLUSTER = load_cluster(SPEC)
_SPEC, _PLAN = _CLUSTER.spec, _CLUSTER.plan
ALL_HOSTS = sorted(h for g in _SPEC.node_groups for h in g.hosts)
CONTROLLER = _SPEC.groups_with_role("controller")[0].hosts[0]
GPU_GROUP = _SPEC.groups_with_role("compute")[0]
COMPUTE = sorted(_CLUSTER.contract_groups["slurm_compute"])


def _group(name: str) -> list[str]:
    return sorted(_CLUSTER.contract_groups.get(name, []))


def _release_vars(role: str) -> dict:
    """What the role takes on a Debian 13 node (its vars/Debian-13.yml)."""
    return yaml.safe_load((ROOT / "roles" / role / "vars" / "Debian-13.yml").read_text())


def _need_converged(cluster) -> None:
    if not cluster.first_configure.ok:
        pytest.fail(f"the Debian 13 cluster did not converge (failed hosts {cluster.first_configure.failed_hosts}; "
                    f"log {cluster.first_configure.log_path}): see test_first_configure_converged", pytrace=False)


def _rendered(name: str) -> dict[str, str]:
    """key -> value of one rendered Slurm file (the renderer's, so expected values are never copies)."""
    text = render_all(_CLUSTER, cabling=False)[name]
    return {k.strip().lower(): v.strip() for k, v in (line.split("=", 1) for line in text.splitlines()
                                                       if "=" in line and not line.lstrip().startswith("#"))}


def test_first_configure_converged(staged_trixie):
    from gpucluster.configure import summary

    result = staged_trixie.first_configure
    assert result.ok, f"configure failed; log {result.log_path}\n{summary(result)}"


@pytest.mark.parametrize("host", ALL_HOSTS)
def test_node_runs_the_debian_release_that_ships_the_specs_slurm(staged_trixie, host):
    res = staged_trixie.exec(host, "sh", "-c", ". /etc/os-release; echo $VERSION_CODENAME", check=True)
    assert res.stdout.strip() == SUITES[_SPEC.slurm.version], f"{host} runs {res.stdout.strip()}"


def test_the_daemons_are_the_specs_slurm_release(staged_trixie):
    _need_converged(staged_trixie)
    conf = staged_trixie.ssh(CONTROLLER, "scontrol show config", check=True).stdout
    ctld = re.search(r"^SLURM_VERSION\s*=\s*(\S+)", conf, re.M)
    assert ctld and ctld.group(1).startswith(_SPEC.slurm.version + "."), f"slurmctld reports {ctld}"
    nodes = staged_trixie.ssh(CONTROLLER, "sinfo -h -N -o '%N %v'", check=True).stdout.split("\n")
    versions = dict(line.split() for line in nodes if len(line.split()) == 2)
    assert versions == {h: ctld.group(1) for h in COMPUTE}, f"slurmd versions: {versions}"


# (role, its version default in vars/Debian-13.yml, package, inventory group whose first host has it)
PINS = [
    ("munge", "__munge_default_version", "munge", "slurm_compute"),
    ("slurm_common", "__slurm_common_default_version", "slurmd", "slurm_compute"),
    ("slurm_common", "__slurm_common_default_version", "slurmctld", "slurm_controller"),
    ("flash_storage", "__flash_storage_default_moosefs_version", "moosefs-master", "flash_meta"),
    ("flash_storage", "__flash_storage_default_moosefs_version", "moosefs-client", "flash_client"),
    ("nfs", "__nfs_default_ganesha_version", "nfs-ganesha", "nfs_server"),
]


@pytest.mark.parametrize(("role", "var", "package", "group"), PINS, ids=[p[2] for p in PINS])
def test_packages_are_the_debian_13_versions_the_roles_pin(staged_trixie, role, var, package, group):
    _need_converged(staged_trixie)
    want = _release_vars(role)[var]
    host = _group(group)[0]
    got = staged_trixie.exec(host, "dpkg-query", "-W", "-f", "${Version}", package, check=True).stdout.strip()
    assert fnmatch.fnmatchcase(got, want), f"{host}: {package} {got}, {role}'s vars/Debian-13.yml pins {want}"


def test_slurm_packages_are_held_at_that_version(staged_trixie):
    """The pin names trixie's renamed libraries (libslurm42t64, libpmi0t64): every installed Slurm package is
    held at the version, not only the ones Debian 12 had."""
    _need_converged(staged_trixie)
    want = _release_vars("slurm_common")["__slurm_common_default_version"]
    host = COMPUTE[0]
    # apt-cache policy reads the package index, which a node that had every package never fetched (gpucluster_apt
    # refreshes it only to install): fetch it here, as an operator would before asking apt.
    staged_trixie.exec(host, "apt-get", "-q", "update", check=True, timeout=300)
    held = staged_trixie.exec(host, "apt-cache", "policy", "libslurm42t64", check=True).stdout
    assert f"Candidate: {want}" in held, f"{host}: libslurm42t64 is not held at {want}:\n{held}"


def test_flash_replicas_are_a_storage_class_on_moosefs_4(staged_trixie):
    _need_converged(staged_trixie)
    flash, client = _SPEC.storage.flash, _group("flash_client")[0]
    want = f"{flash.replicas}CP"
    got = staged_trixie.exec(client, "mfsgetsclass", flash.mount, check=True).stdout
    assert got.split(":")[-1].strip() == want, f"{client}: {flash.mount} has storage class {got.strip()!r}"
    classes = staged_trixie.exec(client, "sh", "-c", f"cd {flash.mount} && mfsscadmin list -l", check=True).stdout
    block = classes.split(f"name: {want}\n", 1)[-1].split("name: ", 1)[0]
    # MooseFS 4 prints a label expression without a count of 1: the role's `-K 1*` lists as `*`, `-K 2*` as `2*`
    labels = "*" if flash.replicas == 1 else f"{flash.replicas}*"
    assert f"keep_labels: {labels}\n" in block, f"class {want} does not keep {flash.replicas} copies:\n{classes}"


# ---------------------------------------------------------------- validate, and a job placed by topology


def test_validate_passes(staged_trixie, tmp_path):
    _need_converged(staged_trixie)
    junit = tmp_path / "validate.xml"
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "validate", str(staged_trixie.inventory.parent),
                          "-n", "4", "--junit", str(junit)], capture_output=True, text=True, timeout=900,
                         stdin=subprocess.DEVNULL, check=False)
    results = parse_junit(junit) if junit.exists() else []
    failed = {(r.name, r.host): r.message[:600] for r in results if r.outcome == "failed"}
    assert res.returncode == 0 and not failed and results, (
        f"validate exited {res.returncode}; failed: {failed}\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
    assert sorted({r.host for r in results}) == ALL_HOSTS
    # the production profile: nothing differs from production, so no check is an expected failure
    assert not [r for r in results if r.outcome == "xfailed"], "a staging-profile difference on a production spec"


def test_switches_job_lands_under_one_leaf_and_the_summary_names_its_slurm(staged_trixie):
    """The demo's own job step: -N2 --switches=1, recorded by slurmdbd in MariaDB 11.8, and the Slurm that
    ran it read from the daemons."""
    from gpucluster.demo.run import run_job

    _need_converged(staged_trixie)
    ok, detail = run_job(staged_trixie.staged, _SPEC, _PLAN)
    assert ok, detail
    assert re.search(rf"Slurm {re.escape(_SPEC.slurm.version)}\.\d+ \(slurmctld on {CONTROLLER}", detail), detail


# ---------------------------------------------------------------- the production cgroup profile


def test_slurm_runs_the_production_cgroup_plugins(staged_trixie):
    _need_converged(staged_trixie)
    conf = dict(re.findall(r"^(\S+)\s*=\s*(.*?)\s*$", staged_trixie.ssh(CONTROLLER, "scontrol show config",
                                                                     check=True).stdout, re.M))
    rendered = _rendered("slurm.conf")
    assert conf["ProctrackType"] == rendered["proctracktype"] == "proctrack/cgroup"
    assert conf["TaskPlugin"] == rendered["taskplugin"] and "task/cgroup" in conf["TaskPlugin"]
    assert _rendered("cgroup.conf")["constraindevices"] == "yes"


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_job_opens_only_the_gpus_it_asked_for(staged_trixie, gpus):
    """ConstrainDevices: the job's own stand-ins pass the device cgroup (then find no driver), the others are
    refused by it."""
    _need_converged(staged_trixie)
    host = COMPUTE[0]
    devices = _CLUSTER.gpu_devices(GPU_GROUP)
    probe = "; ".join(f"head -c1 {d} >/dev/null 2>/tmp/gpu.err; echo \"{d}|$(sed 's/.*: //' /tmp/gpu.err)\""
                      for d in devices)
    cmd = f"srun -w {host} -N1 --gres=gpu:{gpus} sh -c {shlex.quote('echo STEP_GPUS=$SLURM_STEP_GPUS; ' + probe)}"
    deadline = time.monotonic() + 60
    while True:  # a node can still be 'completing' the previous test's job
        res = staged_trixie.ssh(CONTROLLER, cmd, timeout=120)
        if res.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert res.returncode == 0, f"srun failed: {(res.stderr or res.stdout)[-800:]}"
    lines = res.stdout.splitlines()
    step = next(line.split("=", 1)[1] for line in lines if line.startswith("STEP_GPUS="))
    mine = {devices[int(i)] for i in step.split(",") if i}
    seen = dict(line.split("|", 1) for line in lines if "|" in line)
    assert len(mine) == gpus, f"the job was given {step!r}, asked for {gpus}"
    want = {d: "No such device or address" if d in mine else "Operation not permitted" for d in devices}
    assert seen == want, f"{host}: job with GPUs {sorted(mine)} opened {seen}"


def test_second_configure_changes_nothing(staged_trixie):
    """Idempotence on Debian 13 where its task paths differ from Debian 12's (storage classes, Ganesha 6.5, the
    t64 pin, munge): --tags storage,munge,slurm. The whole second converge is shown on Debian 12
    (tests/staged/test_cluster.py); here it would add ~3 minutes to CI for plays that are the same on both."""
    _need_converged(staged_trixie)
    result = staged_trixie.configure(tags="storage,munge,slurm")
    assert result.ok, f"second configure failed: {result.failures} (log {result.log_path})"
    changed = {h: tasks for h, tasks in result.changes.items() if tasks}
    assert result.changed == 0, f"second configure changed {result.changed} things: {changed} (log {result.log_path})"


# ---------------------------------------------------------------- a job in an OCI container (test_containers_job.py)
# The 22.05 module's job and checks, on 24.11: its oci.conf keeps runc's state in /run/slurm-oci/<uid>, and the
# production cgroup profile puts the step, runtime and container in the job's cgroup.


CAP_SYS_NICE = 23  # linux/capability.h


@pytest.fixture(scope="module")
def container_job_2411(staged_trixie, tmp_path_factory):
    from test_containers_job import run_container_job

    _need_converged(staged_trixie)
    # task/affinity (production profile) sets the CPU mask of the job's user's tasks from root's slurmstepd, which
    # takes CAP_SYS_NICE: every job of a user other than root fails without it ("task_g_set_affinity: Operation not
    # permitted"). Root on a real node has it; a staged node has it only if stage up gives it.
    for host in COMPUTE[:2]:
        eff = staged_trixie.exec(host, "sh", "-c", "sed -n 's/^CapEff:\\t//p' /proc/1/status", check=True).stdout
        if not int(eff, 16) >> CAP_SYS_NICE & 1:
            pytest.fail(f"{host}: root lacks CAP_SYS_NICE (CapEff {eff.strip()}), so task/affinity refuses every "
                        "non-root job step: stage up must add SYS_NICE to compute nodes on the production profile",
                        pytrace=False)
    return run_container_job(staged_trixie, tmp_path_factory)


def _container_checks() -> list[str]:
    from test_containers_job import CHECKS

    return list(CHECKS)


@pytest.mark.parametrize("check", _container_checks())
def test_container_job(container_job_2411, staged_trixie, check):
    from test_containers_job import CHECKS

    CHECKS[check](container_job_2411, staged_trixie)


# ---------------------------------------------------------------- configless Slurm 24.11 (test_configless.py)


def test_configless_no_slurm_config_on_any_compute_node(staged_trixie):
    from test_configless import check_no_slurm_config_on_any_compute_node

    _need_converged(staged_trixie)
    check_no_slurm_config_on_any_compute_node(staged_trixie)


def test_configless_scontrol_on_a_compute_node_answers_from_the_controller(staged_trixie):
    from test_configless import check_scontrol_on_a_compute_node_answers_from_the_controller

    _need_converged(staged_trixie)
    check_scontrol_on_a_compute_node_answers_from_the_controller(staged_trixie)


# Last in the file, not marked disruptive: staged_trixie is module-scoped, and a disruptive test is moved to the
# session's end, after this module's cluster is gone. It restores the spec before it returns.
def test_configless_slurm_conf_change_visits_only_the_controllers(staged_trixie, tmp_path):
    from test_configless import check_a_slurm_conf_change_visits_only_the_controllers

    _need_converged(staged_trixie)
    check_a_slurm_conf_change_visits_only_the_controllers(staged_trixie, tmp_path)
