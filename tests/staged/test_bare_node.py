"""The roles' install path, once per Debian release: a compute node without the packages the node image brings is
converged by push alone, and comes back with every package at the version its role pins, slurmd running and the
node idle in Slurm again.

The staged-node image installs Slurm, munge, MooseFS, NFS and RDMA user space before any role runs
(gpucluster.stage.image.PREBAKED_PACKAGES: seven nodes need not each download them), and the package tasks
(gpucluster_apt) then find them installed and leave apt alone. So every other staged test runs the roles on nodes
that already have their packages. Here one compute node loses them: `apt-get purge --autoremove` removes them,
their configuration and the libraries only they pulled in, as on a node that never had them. `gpucluster
configure --limit NODE` must then download and install them from the Debian mirror at the pinned versions.

Disruptive (rank 1): slurmd and munged stop on that node for about a minute, after every other test of its cluster.
"""

from __future__ import annotations

import fnmatch
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# (package, the role whose vars/Debian-<major>.yml pins it, that variable); the rest of what is purged is unpinned
# What the roles install on a compute node of examples/staging*.yaml (Slurm, munge, the flash and NFS clients, RDMA
# user space and the fabric test, the pull runner's Python packages); the image also brings the servers' packages
# (slurmctld, MariaDB, the MooseFS master, Ganesha), which a compute node's roles must not install.
ON_A_COMPUTE_NODE = {"slurmd", "slurm-client", "munge", "moosefs-client", "nfs-common", "rdma-core", "ibverbs-utils",
                     "infiniband-diags", "perftest", "iperf3", "python3-jinja2", "python3-yaml", "python3-packaging",
                     "libnfs-utils"}
PINNED = [("slurmd", "slurm_common", "__slurm_common_default_version"),
          ("munge", "munge", "__munge_default_version"),
          ("moosefs-client", "flash_storage", "__flash_storage_default_moosefs_version")]


def _release_var(role: str, var: str, major: str) -> str:
    return str(yaml.safe_load((ROOT / "roles" / role / "vars" / f"Debian-{major}.yml").read_text())[var])


def _installed(c, host: str, packages: list[str]) -> dict[str, str]:
    """package -> version, for those dpkg has installed (not merely config files left)."""
    res = c.exec(host, "dpkg-query", "-W", "-f", "${Package} ${Status} ${Version}\n", *packages)
    out = {}
    for line in res.stdout.splitlines():
        name, *status, version = line.split()
        if " ".join(status).endswith("ok installed"):
            out[name] = version
    return out


def _bare_node_converges(c, major: str) -> None:
    from gpucluster.stage.image import PREBAKED_PACKAGES

    if not c.first_configure.ok:
        pytest.fail(f"the cluster did not converge (log {c.first_configure.log_path}): see "
                    "test_first_configure_converged", pytrace=False)
    host = c.hosts("slurm_compute")[-1]
    controller = c.hosts("slurm_controller")[0]
    had = _installed(c, host, list(PREBAKED_PACKAGES))
    assert set(had) >= ON_A_COMPUTE_NODE, f"{host}: the image lacks {sorted(ON_A_COMPUTE_NODE - set(had))}"

    purge = c.exec(host, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "purge", "-y", "-q", "--autoremove",
                   *sorted(had), timeout=300)
    assert purge.returncode == 0, f"{host}: apt-get purge: {purge.stderr[-1500:]}"
    assert _installed(c, host, sorted(had)) == {}, f"{host}: still installed after the purge"

    result = c.configure(limit=host)
    assert result.ok, f"configure --limit {host} on a bare node failed: {result.failures} (log {result.log_path})"
    installs = [t for t in result.changes.get(host, []) if "install" in t.lower()]
    assert len(installs) >= 3, f"{host}: the package tasks that installed something: {installs}"

    back = _installed(c, host, sorted(had))
    assert set(back) >= ON_A_COMPUTE_NODE, f"{host}: not installed again: {sorted(ON_A_COMPUTE_NODE - set(back))}"
    assert set(back) == ON_A_COMPUTE_NODE, f"{host}: installed though no role of a compute node asks: " \
                                           f"{sorted(set(back) - ON_A_COMPUTE_NODE)}"
    for package, role, var in PINNED:
        want = _release_var(role, var, major)
        assert fnmatch.fnmatchcase(back[package], want), f"{host}: {package} {back[package]}, {role} pins {want}"
    assert c.exec(host, "systemctl", "is-active", "slurmd", "munge").stdout.split() == ["active", "active"]

    deadline, state = time.monotonic() + 180, "?"
    while time.monotonic() < deadline:  # slurmd registers; ReturnToService=2 brings the node back by itself
        state = c.ssh(controller, f"sinfo -h -N -n {host} -o %t").stdout.strip()
        if state == "idle":
            return
        time.sleep(3)
    raise AssertionError(f"{host}: Slurm state {state!r} 180 s after its converge, not idle (slurmd log: "
                         f"{c.exec(host, 'journalctl', '-u', 'slurmd', '-n', '20', '--no-pager').stdout[-1500:]})")


@pytest.mark.staged
@pytest.mark.disruptive
def test_a_bare_debian_12_node_gets_its_packages_from_the_roles(staged_cluster):
    _bare_node_converges(staged_cluster, "12")


@pytest.mark.staged
@pytest.mark.disruptive
def test_a_bare_debian_13_node_gets_its_packages_from_the_roles(staged_trixie):
    _bare_node_converges(staged_trixie, "13")
