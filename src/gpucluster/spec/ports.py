"""The metrics ports against each other and against every port the cluster already listens on (docs/metrics.md),
and Grafana asked for where there is nothing for it to show.

Why cluster-wide and not per host: node_exporter listens on every host, so any port of the cluster clashes with it
wherever it is; dcgm-exporter shares its nodes with slurmd, DCGM's host engine and the bandwidth check's
ib_write_bw; Prometheus and Grafana share the controller with slurmctld, slurmdbd, MariaDB and the pull bundle
server, and a controller may serve NFS or the MooseFS master too. A port free on one host and taken on another buys
nothing a site cannot have by picking another of the 64,512 ports from 1024 up, and one rule for the whole cluster
leaves no host layout to get wrong.

The ports the cluster fixes are each written by one owner: the Slurm daemons' in slurmkeys (read here), slurmdbd's
in render/slurm.py, the bandwidth check's in render/health/active.py, the pull server's in configure/pull.py, NFS's
in the Ganesha template, MooseFS's in the spec. The modules above this floor cannot be imported here, so FIXED copies
them and tests/test_metrics_spec.py holds each copy equal to its owner.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpucluster import slurmkeys
from gpucluster.errors import Finding
from gpucluster.spec.jobcontainers import vendor
from gpucluster.spec.model import ClusterSpec

RULE = "ports"
GRAFANA_RULE = "grafana"
# The metrics ports, in report order: a clash between two of them is reported on the later one.
METRICS_PORTS = {
    "node_exporter_port": "node_exporter",
    "dcgm_exporter_port": "dcgm-exporter",
    "amd_exporter_port": "AMD's device-metrics-exporter",
    "prometheus_port": "Prometheus",
    "grafana_port": "Grafana",
}
# Ports the cluster listens on whatever the spec says (owners above). The bandwidth check's first port is here; its
# range grows with the HCAs a node has (bandwidth_ports).
SLURMDBD_PORT = 6819
MARIADB_PORT = 3306
PULL_PORT = 8079
NFS_PORT = 2049
IB_WRITE_BW_PORT = 18515
# DCGM's host engine (nv-hostengine, the nvidia-dcgm service the nvidia_gpu role runs) listens on its default port.
DCGM_HOSTENGINE_PORT = 5555
# MooseFS's chunk server listens for clients on CSSERV_LISTEN_PORT, 9422 unless chunkserver_extra sets it.
MFS_CSSERV_PORT = 9422


def fixed(spec: ClusterSpec) -> dict[int, str]:
    """{port: what listens there} for the ports the cluster uses that the spec does not write as a field."""
    out = {int(slurmkeys.key("SlurmctldPort").value): "slurmctld's (SlurmctldPort)",
           int(slurmkeys.key("SlurmdPort").value): "slurmd's (SlurmdPort)",
           SLURMDBD_PORT: "slurmdbd's (DbdPort)", MARIADB_PORT: "MariaDB's, slurmdbd's database",
           PULL_PORT: "the pull bundle server's (gpucluster configure --pull)"}
    if spec.gpu_groups:
        hcas = max((len(g.hcas) if g.hcas else g.nics_per_node) for g in spec.node_groups)
        for i in range(max(hcas, 1)):
            out[IB_WRITE_BW_PORT + i] = f"the bandwidth check's ib_write_bw (HCA {i})"
    if any(vendor(spec, g) == "nvidia" for g in spec.gpu_groups):
        out[DCGM_HOSTENGINE_PORT] = "DCGM's host engine (nv-hostengine)"
    if spec.storage.nfs:
        out[NFS_PORT] = "NFS's (NFS-Ganesha)"
    return out


def _spec_ports(spec: ClusterSpec) -> dict[int, str]:
    """{port: the field that sets it} for the ports of other spec sections (MooseFS's, with a flash tier)."""
    flash = spec.storage.flash
    if flash is None:
        return {}
    ports = flash.moosefs.ports
    out = {getattr(ports, name): f"storage.flash.moosefs.ports.{name}'s" for name in ("metalogger", "chunkserver",
                                                                                  "client")}
    csserv = flash.moosefs.chunkserver_extra.get("CSSERV_LISTEN_PORT")
    if csserv is not None and str(csserv).isdigit():
        out[int(csserv)] = "storage.flash.moosefs.chunkserver_extra.CSSERV_LISTEN_PORT's"
    else:
        out[MFS_CSSERV_PORT] = "MooseFS's chunk server's (CSSERV_LISTEN_PORT's default)"
    return out


def check(spec: ClusterSpec) -> Iterator[Finding]:
    """One finding per metrics port that another metrics port, or a port the cluster uses, already holds; and
    Grafana asked for without metrics (nothing to show: no dashboards, no Prometheus)."""
    metrics = spec.metrics
    if not metrics.enabled:
        if metrics.grafana:
            yield Finding(("metrics", "grafana"), "Grafana is asked for with metrics.enabled: false: no dashboards "
                          "and no Prometheus are rendered for it to show", "set metrics.enabled: true, or remove "
                          "metrics.grafana", GRAFANA_RULE)
        return
    taken = fixed(spec) | _spec_ports(spec)
    vendors = {vendor(spec, g) for g in spec.gpu_groups}
    used = {"node_exporter_port": True, "dcgm_exporter_port": "nvidia" in vendors,
            "amd_exporter_port": "amd" in vendors, "prometheus_port": metrics.on_controller,
            "grafana_port": metrics.grafana}
    for field, what in METRICS_PORTS.items():
        if not used[field]:
            continue  # no exporter of that kind, the site's own Prometheus, no Grafana: nothing listens there
        port = getattr(metrics, field)
        holder = taken.get(port)
        if holder is not None:
            yield Finding(("metrics", field), f"port {port} is {holder} already; {what} needs a port no other "
                          "service of the cluster listens on", f"give it a free port, e.g. {_free(port, taken)}",
                          RULE)
        else:
            taken[port] = f"metrics.{field}'s ({what})"


def _free(start: int, taken: dict[int, str]) -> int:
    """The first port from `start` up that nothing holds (wrapping to 1024)."""
    port = start
    while port in taken:
        port = port + 1 if port < 65535 else 1024
    return port
