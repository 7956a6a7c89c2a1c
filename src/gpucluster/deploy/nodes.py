"""From the spec to what enrollment needs: per-group expectations, batches of nodes, addresses.

No Pulumi here: the program (`program.py`) and the tests both call these with the loaded spec.

Granularity: a node group is enrolled in batches of up to `enroll_batch` nodes, each batch one
dynamic resource whose create() checks its nodes in parallel over SSH. One resource per node does not
scale (docs/pulumi.md has the measurements): the Python dynamic-provider server runs 4 operations at
a time, so 3,189 single-node resources for Meta's 24k cluster serialise into ~800 rounds of SSH, the
state carries the pickled provider 3,189 times, and the program registers 3,189 resources. Batches
keep one bad node's failure local (its batch fails, the rest enroll) and make a batch boundary
stable: batches start at fixed node indices, so growing a group adds batches or extends the last one
and never moves a node between resources. Batches hold whole racks where a batch is at least a rack.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpucluster.cluster import Cluster
from gpucluster.deploy.facts import Expectation
from gpucluster.errors import UsageError, dotted
from gpucluster.spec.model import NodeGroup

TARGETS = ("on-prem", "staging")


@dataclass(frozen=True)
class Batch:
    group: str
    index: int  # batch number within the group
    first: int  # index of the first node within its group
    hosts: tuple[str, ...]

    @property
    def name(self) -> str:
        """Resource name: stable for the life of the batch (it starts at a fixed node index)."""
        return f"{self.group}-{self.index:04d}"


def batch_size(group: NodeGroup, nodes_per_batch: int) -> int:
    """Nodes per batch: the requested size, rounded down to whole racks when it is at least a rack."""
    if nodes_per_batch < 1:
        raise UsageError(f"gpucluster:enrollBatch is {nodes_per_batch}; use 1 (one resource per node) or more")
    rack = group.nodes_per_rack
    if nodes_per_batch >= rack:
        return nodes_per_batch // rack * rack
    return nodes_per_batch


def batches(group: NodeGroup, nodes_per_batch: int) -> list[Batch]:
    size = batch_size(group, nodes_per_batch)
    hosts = group.hosts
    return [Batch(group.name, i, first, tuple(hosts[first:first + size]))
            for i, first in enumerate(range(0, group.count, size))]


def expectation(cluster: Cluster, group: NodeGroup, target: str) -> Expectation:
    loaded, spec = cluster.loaded, cluster.spec
    gi = spec.node_groups.index(group)
    base = ("node_groups", gi)
    gpu = spec.parts.gpus.get(group.gpu) if group.gpu and group.gpus_per_node else None
    on_fabric = group in spec.fabric_groups
    staged = target == "staging"
    keys = {
        "cpu.sockets": base + ("cpu", "sockets"),
        "cpu.cores_per_socket": base + ("cpu", "cores_per_socket"),
        "cpu.threads_per_core": base + ("cpu", "threads_per_core"),
        "memory_gb": base + ("memory_gb",),
        "gpus_per_node": base + ("gpus_per_node",),
        "gpu": base + ("gpu",),
        "nics_per_node": base + ("nics_per_node",),
        "hcas": base + ("hcas",) if group.hcas else base + ("nic",),
    }
    fields = {k: dotted(p) for k, p in keys.items()}
    where = {}
    for k, p in keys.items():
        line = loaded.line(p)
        where[k] = f"{loaded.source}:{line}" if line else str(loaded.source)
    return Expectation(
        group=group.name,
        hostname_check=True,
        sockets=group.cpu.sockets,
        cores_per_socket=group.cpu.cores_per_socket,
        threads_per_core=group.cpu.threads_per_core,
        memory_gb=group.memory_gb,
        gpus=group.gpus_per_node if gpu else 0,
        gpu_vendor=gpu.vendor if gpu else None,
        gpu_type=gpu.slurm_type if gpu else None,
        hcas=tuple(cluster.hcas(group)) if on_fabric else (),
        link_layer=("InfiniBand" if spec.fabric.type == "infiniband" else "Ethernet") if on_fabric else None,
        stand_in_nics=staged,
        nics=group.nics_per_node if on_fabric else 0,
        fields=fields,
        where=where,
    )


def staged_ports(stage_dir: Path) -> dict[str, int]:
    """Ports a `gpucluster stage up` published, from its state directory."""
    path = Path(stage_dir) / "ports.json"
    try:
        return {k: int(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist: stage the cluster first (gpucluster stage up SPEC), "
                         "or point gpucluster:stageDir at its state directory") from None
    except (OSError, ValueError, AttributeError) as exc:
        raise UsageError(f"{path}: not a stage state file ({exc})") from None


def addresses(cluster: Cluster, target: str, *, host_domain: str | None = None, ssh_port: int = 22,
              stage_dir: Path | None = None) -> dict[str, tuple[str, int]]:
    """host -> (address, port) for every node of the spec."""
    spec = cluster.spec
    hosts = cluster.hosts
    if target == "staging":
        if stage_dir is None:
            raise UsageError("target staging needs gpucluster:stageDir")
        ports = staged_ports(stage_dir)
        missing = [h for h in hosts if h not in ports]
        if missing:
            raise UsageError(f"{len(missing)} node(s) of {spec.name} are not staged in {stage_dir} "
                             f"({', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}); "
                             f"run gpucluster stage up {cluster.source}")
        return {h: ("127.0.0.1", ports[h]) for h in hosts}
    if target != "on-prem":
        raise UsageError(f"gpucluster:target is {target!r}; use one of {', '.join(TARGETS)}")
    suffix = f".{host_domain.strip('.')}" if host_domain else ""
    return {h: (h + suffix, ssh_port) for h in hosts}
