"""Typed cluster spec: the syntax layer (types, ranges, required and unknown keys).

Meaning (radix, rails, collisions, versions) is checked in `gpucluster.spec.checks`, after this
layer accepted the document. Field names here are the YAML keys; docs/spec.md documents them.
Numbers, booleans and text are strict and bounded (`gpucluster.fields` says why): a YAML boolean is
never a count, and no value is larger than what consumes it (Slurm, hostnames, the catalog).
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator

from gpucluster.catalog import Catalog
from gpucluster.fields import (
    MAX_GROUPS,
    MAX_INDEX,
    MAX_LIST,
    MAX_PORTS,
    MAX_SPEED_GBPS,
    SLURM_MAX_NODES,
    AbsPath,
    Bool,
    Int,
    NodePath,
    Num,
    PartKey,
    Text,
    WholeLiteral,
    Word,
)

NAME = r"^[a-z][a-z0-9-]*$"
Role = Literal["compute", "controller", "login", "storage"]
Tier = Literal["leaf", "spine", "core"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_ratio(text: str) -> float:
    down, up = text.split(":")
    return float(down) / float(up)


class CpuLayout(Strict):
    sockets: Int = Field(ge=1, le=16)
    cores_per_socket: Int = Field(ge=1, le=512)
    threads_per_core: Int = Field(default=2, ge=1, le=8)

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core


class NodeGroup(Strict):
    name: Text = Field(pattern=NAME, max_length=32)
    role: Role
    count: Int = Field(ge=1, le=SLURM_MAX_NODES, description="a hostlist range holds at most 65,536 hosts")
    hostname: Text = Field(
        pattern=r"^[a-z][a-z0-9-]*#+[a-z0-9-]*$", max_length=48,
        description="one run of '#' is the zero-padded index: 'gpu####' -> gpu0001",
    )
    first_index: Int = Field(default=1, ge=0, le=MAX_INDEX)
    cpu: CpuLayout
    memory_gb: Int = Field(ge=1, le=65536, description="memory Slurm may schedule (RealMemory)")
    gpu: PartKey | None = None
    gpus_per_node: Int = Field(default=0, ge=0, le=16)
    gres_detect: Literal["auto", "nvml", "rsmi", "nvidia", "off"] = Field(
        default="auto", description="auto: nvml for NVIDIA, rsmi for AMD; off: explicit device files"
    )
    nic: PartKey | None = None
    nics_per_node: Int = Field(default=0, ge=0, le=16)
    hcas: tuple[Word, ...] | None = Field(default=None, max_length=16,
                                          description="HCA names per rail; default <prefix>0..N-1")
    nodes_per_rack: Int = Field(default=1, ge=1, le=256)
    features: tuple[Word, ...] = Field(default=(), max_length=64)

    @cached_property
    def digits(self) -> int:
        return self.hostname.count("#")

    def host(self, index: int) -> str:
        """Hostname of the index-th node (0-based) of this group."""
        head, _, tail = self.hostname.partition("#" * self.digits)
        return f"{head}{self.first_index + index:0{self.digits}d}{tail}"

    @cached_property
    def hosts(self) -> list[str]:
        return [self.host(i) for i in range(self.count)]

    @property
    def hostlist(self) -> str:
        """Slurm hostlist of the whole group: hostnames are generated as one numeric range."""
        head, _, tail = self.hostname.partition("#" * self.digits)
        lo, hi = self.first_index, self.first_index + self.count - 1
        if lo == hi:
            return self.host(0)
        return f"{head}[{lo:0{self.digits}d}-{hi:0{self.digits}d}]{tail}"


class Partition(Strict):
    name: Text = Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=64)
    groups: tuple[Text, ...] = Field(min_length=1, max_length=MAX_LIST)
    default: Bool = False
    # Slurm reads a bare number as minutes, days-hours[:minutes[:seconds]] otherwise, into 32 bits
    max_time: Text = Field(default="INFINITE", pattern=r"^(INFINITE|UNLIMITED|(\d{1,5}-)?\d{1,8}(:\d\d){0,2})$")
    max_nodes: Int | None = Field(default=None, ge=1, le=SLURM_MAX_NODES, description="MaxNodes")
    priority_tier: Int = Field(default=1, ge=0, le=65533)


def _conf_value(value: object) -> str:
    """A slurm.conf value written after KEY=: text on one line without '#' (slurm.conf has no escapes),
    or a whole number. A YAML 1.1 boolean (yes, on, true) is refused rather than guessed at."""
    if isinstance(value, bool):
        raise ValueError("a YAML boolean is not a slurm.conf value; quote it ('yes') or write what Slurm expects")
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise ValueError("a slurm.conf value is text or a whole number; write it as one line of text")
    if any(c in value for c in "\n\r#") or len(value) > 1024:
        raise ValueError("a slurm.conf value is one line of at most 1024 characters without '#'; shorten it")
    return value


ConfValue = Annotated[str, BeforeValidator(_conf_value)]


class HealthCheck(Strict):
    program: NodePath = Field(description="HealthCheckProgram: a path on the compute nodes")
    interval: Int = Field(default=300, ge=1, le=86400, description="HealthCheckInterval in seconds")
    node_state: Text = Field(default="ANY", pattern=r"^(ALLOC|ANY|CYCLE|IDLE|MIXED|NONDRAINED_IDLE)(,[A-Z_]+)*$",
                             max_length=128, description="HealthCheckNodeState")


class Slurm(Strict):
    version: Text = Field(default="22.05", pattern=r"^\d{2}\.\d{2}$")
    topology: Literal["tree", "block", "none"] = "tree"
    accounting: Bool = True
    profile: Literal["production", "staging"] = Field(
        default="production",
        description="staging swaps the cgroup plugins for ones that run in unprivileged containers",
    )
    partitions: tuple[Partition, ...] = Field(min_length=1, max_length=MAX_LIST)
    prolog: NodePath | None = Field(default=None, description="Prolog: a path on the compute nodes")
    epilog: NodePath | None = Field(default=None, description="Epilog: a path on the compute nodes")
    health_check: HealthCheck | None = None
    parameters: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9]*$", max_length=64)],
                     ConfValue] = Field(
        default_factory=dict, max_length=MAX_LIST,
        description="extra slurm.conf keys merged over gpucluster's computed defaults (StackHPC openhpc_config)",
    )

    @property
    def version_tuple(self) -> tuple[int, int]:
        major, minor = self.version.split(".")
        return int(major), int(minor)


class Roce(Strict):
    dscp: Int = Field(default=26, ge=0, le=63)
    pfc_priority: Int = Field(default=3, ge=0, le=7)
    cnp_dscp: Int = Field(default=48, ge=0, le=63)
    cnp_priority: Int = Field(default=6, ge=0, le=7)
    ecn: Bool = True
    mtu: Annotated[Literal[1024, 2048, 4096], WholeLiteral] = 4096
    link_mtu: Int = Field(default=9000, ge=1500, le=9216)
    gid_index: Int | None = Field(default=3, ge=0, le=255)


class Infiniband(Strict):
    subnet_manager: Literal["opensm", "ufm", "none"] = "opensm"
    sharp: Bool = False
    service_level: Int = Field(default=0, ge=0, le=15)


# Up to 9999:1 with 3 decimals: the planner divides port counts (<= 4096) by it
RATIO = r"^\d{1,4}(\.\d{1,3})?:\d{1,4}(\.\d{1,3})?$"


class Fabric(Strict):
    type: Literal["infiniband", "roce"]
    design: Literal["fat-tree", "rail-optimized"]
    tiers: Annotated[Literal["auto", 2, 3], WholeLiteral] = "auto"
    link_speed_gbps: Int | None = Field(default=None, ge=1, le=MAX_SPEED_GBPS, description="default: the NIC speed")
    switches: dict[Tier, PartKey] = Field(min_length=1)
    oversubscription: dict[Tier, Text] = Field(default_factory=dict)
    nodes_per_leaf: Int | None = Field(default=None, ge=1, le=MAX_PORTS,
                                       description="fat-tree: nodes under one leaf switch (at most its ports)")
    rails: Int | None = Field(default=None, ge=1, le=16, description="NICs per node on the fabric; checked")
    scalable_unit_nodes: Int | None = Field(default=None, ge=1, le=MAX_PORTS,
                                            description="rail-optimized: nodes per unit (at most a leaf's ports)")
    rail_groups: Int = Field(default=1, ge=1, le=16, description="rail-optimized: spine groups the rails split into")
    nodes_per_pod: Int | None = Field(default=None, ge=1, le=SLURM_MAX_NODES,
                                      description="3 tiers: nodes per pod (zone)")
    qps_per_connection: Int | None = Field(default=None, ge=1, le=128)
    management_interface: Text = Field(default="eth0", pattern=r"^[=^]?[A-Za-z0-9_.,-]+$", max_length=256)
    roce: Roce = Field(default_factory=Roce)
    infiniband: Infiniband = Field(default_factory=Infiniband)

    @field_validator("oversubscription")
    @classmethod
    def _ratios(cls, value: dict[str, str]) -> dict[str, str]:
        for tier, ratio in value.items():
            if not re.match(RATIO, str(ratio)):
                raise ValueError(f"{tier}: '{ratio}' is not a ratio; write it like '1:1' or '7:1' (quoted in YAML)")
            if float(ratio.split(":")[1]) == 0:
                raise ValueError(f"{tier}: '{ratio}' has no uplinks; write it as N:1 with N >= 1")
            if parse_ratio(ratio) < 1:
                raise ValueError(f"{tier}: '{ratio}' has more uplinks than downlinks; write it as N:1 with N >= 1")
        return value

    def ratio(self, tier: str) -> float:
        return parse_ratio(self.oversubscription.get(tier, "1:1"))


DEFAULT_NFS_OPTIONS = "vers=4.2,nconnect=16,hard,rsize=1048576,wsize=1048576,noatime"


class Flash(Strict):
    name: Text = Field(default="flash", pattern=NAME, max_length=32)
    metadata_group: Text = Field(max_length=32)
    chunk_group: Text = Field(max_length=32)
    nvme_per_server: Int = Field(ge=1, le=64)
    nvme_tb: Num = Field(gt=0, le=1024, description="TB per drive")
    nvme_gbps: Num = Field(default=6.0, gt=0, le=100, description="sustained GB/s per drive")
    target_bandwidth_gbps: Num | None = Field(default=None, gt=0, le=10_000_000,
                                              description="GB/s the tier must sustain")
    replicas: Int = Field(default=2, ge=1, le=9)
    mount: AbsPath = "/mnt/flash"
    client_groups: tuple[Text, ...] | None = Field(default=None, max_length=MAX_LIST,
                                                   description="default: compute and login")


class NfsExport(Strict):
    path: AbsPath
    mount: AbsPath
    options: Text = Field(default=DEFAULT_NFS_OPTIONS, pattern=r"^[a-z0-9_=,.]+$", max_length=1024)


class Nfs(Strict):
    name: Text = Field(pattern=NAME, max_length=32)
    server_group: Text = Field(max_length=32)
    exports: tuple[NfsExport, ...] = Field(min_length=1, max_length=64)
    client_groups: tuple[Text, ...] | None = Field(default=None, max_length=MAX_LIST)


class Storage(Strict):
    flash: Flash | None = None
    nfs: tuple[Nfs, ...] = Field(default=(), max_length=64)


class ClusterSpec(Strict):
    name: Text = Field(pattern=NAME, max_length=40)
    slurm: Slurm
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1, max_length=MAX_GROUPS)
    fabric: Fabric
    storage: Storage = Field(default_factory=Storage)
    catalog: Catalog = Field(default_factory=Catalog)

    @cached_property
    def parts(self) -> Catalog:
        return self.catalog.merged()

    def group(self, name: str) -> NodeGroup:
        return next(g for g in self.node_groups if g.name == name)

    def groups_with_role(self, role: str) -> list[NodeGroup]:
        return [g for g in self.node_groups if g.role == role]

    @property
    def gpu_groups(self) -> list[NodeGroup]:
        return [g for g in self.node_groups if g.gpu and g.gpus_per_node]

    @property
    def fabric_groups(self) -> list[NodeGroup]:
        """Groups on the back-end (GPU) fabric: compute groups with NICs."""
        return [g for g in self.node_groups if g.role == "compute" and g.nics_per_node]


class LoadedSpec(BaseModel):
    """A validated spec with where it came from, so later findings can still name file and line."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    spec: ClusterSpec
    source: Path
    lines: dict[tuple, int]
    columns: dict[tuple, int] = Field(default_factory=dict)

    def line(self, path: tuple) -> int | None:
        return self.lines.get(self._nearest(path))

    def column(self, path: tuple) -> int | None:
        """Column of the same key `line` names (1-based), when the loader recorded it."""
        return self.columns.get(self._nearest(path))

    def _nearest(self, path: tuple) -> tuple:
        while path and path not in self.lines:
            path = path[:-1]
        return path
