"""Values the Slurm templates need that are computed, not copied, from the spec and the plan."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpucluster import slurmkeys
from gpucluster.cluster import Cluster
from gpucluster.render.health.slurmconf import slurm_conf_lines
from gpucluster.render.topology import blocks, named_topologies, partition_kinds, slurm_switches
from gpucluster.spec.slurm_versions import has

# The daemons' folders are fixed settings of slurm.conf's key table (gpucluster.slurmkeys).
STATE_DIR = slurmkeys.key("StateSaveLocation").value
# slurmdbd on the first controller (the accounting port is one gpucluster owns: slurm.conf names it too).
DBD = {"port": 6819, "storage_user": "slurm", "storage_db": "slurm_acct_db",
       "log_file": "/var/log/slurm/slurmdbd.log", "pid_file": "/run/slurmdbd.pid"}
SPOOL_DIR = slurmkeys.key("SlurmdSpoolDir").value
LOG_DIR = "/var/log/slurm"
# Slurm's RebootProgram: the script roles/slurm_compute installs there (facts.json slurm.reboot_program)
REBOOT_PROGRAM = "/usr/local/sbin/gpucluster-reboot"


@dataclass(frozen=True)
class Scale:
    """Large-cluster settings (Slurm's big_sys guide), scaled to the node count."""

    tree_width: int
    slurmd_timeout: int
    slurmctld_timeout: int
    message_timeout: int
    tcp_timeout: int
    max_job_count: int
    default_queue_depth: int
    bf_max_job_test: int
    max_rpc_cnt: int


def scale_for(nodes: int) -> Scale:
    big = nodes >= 1024
    return Scale(
        tree_width=max(2, math.ceil(nodes ** (1 / 3) - 1e-9)),
        slurmd_timeout=300 if big else 120,
        slurmctld_timeout=120,
        message_timeout=60 if big else 30 if nodes >= 128 else 10,
        tcp_timeout=10 if big else 5 if nodes >= 128 else 2,
        max_job_count=max(10000, nodes * 20),
        default_queue_depth=1000 if big else 100,
        bf_max_job_test=2000 if big else 500,
        max_rpc_cnt=150 if big else 0,
    )


class Parameters:
    """slurm.parameters merged over the template's computed defaults (StackHPC openhpc's way): the
    template asks param(KEY, default) where it writes a key, which takes the spec's value when there is
    one (Slurm reads keys case-insensitively); the keys it never asked for are written at the end by
    rest(). One object per render."""

    def __init__(self, given: dict[str, str | int]):
        self._given = {k.lower(): (k, str(v)) for k, v in given.items()}
        self._asked: set[str] = set()

    def __call__(self, key: str, default) -> str:
        self._asked.add(key.lower())
        given = self._given.get(key.lower())
        return given[1] if given else str(default)

    def take(self, key: str) -> str | None:
        """The spec's value for a key the template merges itself (and so never writes at the end), or None."""
        self._asked.add(key.lower())
        given = self._given.get(key.lower())
        return given[1] if given else None

    def rest(self) -> list[tuple[str, str]]:
        return [kv for low, kv in self._given.items() if low not in self._asked]


def scheduler_parameters(scale: Scale) -> str:
    out = f"bf_continue,bf_max_job_test={scale.bf_max_job_test},default_queue_depth={scale.default_queue_depth}"
    return out + (f",max_rpc_cnt={scale.max_rpc_cnt}" if scale.max_rpc_cnt else "")


def _health_lines(cluster: Cluster, params: Parameters) -> list[str]:
    """The health checks' lines; their license joins any Licenses slurm.parameters gives (one Licenses=)."""
    lines = slurm_conf_lines(cluster)
    site = params.take("Licenses")
    if site:
        lines = [f"{line},{site}" if line.startswith("Licenses=") else line for line in lines]
        if not any(line.startswith("Licenses=") for line in lines):
            lines.append(f"Licenses={site}")
    return lines


def slurm_context(cluster: Cluster) -> dict:
    spec, plan = cluster.spec, cluster.plan
    params = Parameters(spec.slurm.parameters)
    compute = spec.groups_with_role("compute")
    nodes = sum(g.count for g in compute)
    staging = spec.slurm.profile == "staging"
    node_lines = []
    for g in compute:
        node_lines.append({
            "hosts": g.hostlist, "group": g, "gres": cluster.gres(g),
            "real_memory": g.memory_gb * 1024,
            # a group named after its GPU (h100) would otherwise list the feature twice
            "features": ",".join(dict.fromkeys([g.name, *([cluster.gres_type(g)] if g.gpu else []), *g.features])),
        })
    version = spec.slurm.version
    # 25.05+: topology.yaml (named topologies, Topology= per partition) replaces topology.conf, and
    # slurm.conf(5) says TopologyPlugin is then ignored, so it is not written
    topologies = named_topologies(spec, plan, version) if has(version, "topology-yaml") else []
    kinds = partition_kinds(spec)
    partitions = [
        {"p": p, "nodes": ",".join(spec.group(name).hostlist for name in p.groups),
         "topology": kinds[p.name] if topologies else None}
        for p in spec.slurm.partitions
    ]
    if topologies:
        topology_files = {"topology.yaml": "slurm/topology.yaml.j2"}
    elif spec.slurm.topology != "none":
        topology_files = {"topology.conf": "slurm/topology.conf.j2"}
    else:
        topology_files = {}
    return {
        "spec": spec,
        "plan": plan,
        "controllers": cluster.controllers,
        "scale": scale_for(nodes),
        "node_lines": node_lines,
        "partitions": partitions,
        "staging": staging,
        "gpus": bool(spec.gpu_groups),
        "topology_plugin": "" if topologies else
                           {"tree": "topology/tree", "block": "topology/block", "none": ""}[spec.slurm.topology],
        "topologies": topologies,
        "topology_files": topology_files,
        "block_sizes": has(version, "block-sizes"),
        "fixed_settings": slurmkeys.fixed_settings(),
        "state_dir": STATE_DIR,
        "spool_dir": SPOOL_DIR,
        "log_dir": LOG_DIR,
        "reboot_program": REBOOT_PROGRAM,
        "version": spec.slurm.version_tuple,
        "gres_groups": [
            {"group": g, "type": cluster.gres_type(g), "detect": cluster.gres_detect(g), "files": cluster.gpu_files(g)}
            for g in compute if g.gpu
        ],
        "switches": slurm_switches(plan) if spec.slurm.topology == "tree" else None,
        "param": params,
        "health_lines": _health_lines(cluster, params),
        "dbd": {"host": cluster.dbd_host, **DBD},
        "scheduler_parameters": scheduler_parameters(scale_for(nodes)),
        "blocks": blocks(plan, version) if spec.slurm.topology == "block" else None,
    }
