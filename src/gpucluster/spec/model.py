"""Typed cluster spec: the syntax layer (types, ranges, required and unknown keys).

Meaning (radix, rails, collisions, versions) is checked in `gpucluster.spec.checks`, after this
layer accepted the document. Field names here are the YAML keys; docs/spec.md documents them.
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator

from gpucluster.catalog import Catalog

NAME = r"^[a-z][a-z0-9-]*$"
Role = Literal["compute", "controller", "login", "storage"]
Tier = Literal["leaf", "spine", "core"]
# Words that land unquoted in slurm.conf (Feature=) and in the sourced nccl-env.sh (NCCL_IB_HCA=)
Word = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]+$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_ratio(text: str) -> float:
    down, up = text.split(":")
    return float(down) / float(up)


class CpuLayout(Strict):
    sockets: int = Field(ge=1, le=16)
    cores_per_socket: int = Field(ge=1, le=512)
    threads_per_core: int = Field(default=2, ge=1, le=8)

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core


class NodeGroup(Strict):
    name: str = Field(pattern=NAME, max_length=32)
    role: Role
    count: int = Field(ge=1, le=65536)
    hostname: str = Field(
        pattern=r"^[a-z][a-z0-9-]*#+[a-z0-9-]*$", max_length=48,
        description="one run of '#' is the zero-padded index: 'gpu####' -> gpu0001",
    )
    first_index: int = Field(default=1, ge=0)
    cpu: CpuLayout
    memory_gb: int = Field(ge=1, le=65536, description="memory Slurm may schedule (RealMemory)")
    gpu: str | None = None
    gpus_per_node: int = Field(default=0, ge=0, le=16)
    gres_detect: Literal["auto", "nvml", "rsmi", "nvidia", "off"] = Field(
        default="auto", description="auto: nvml for NVIDIA, rsmi for AMD; off: explicit device files"
    )
    nic: str | None = None
    nics_per_node: int = Field(default=0, ge=0, le=16)
    hcas: tuple[Word, ...] | None = Field(default=None, description="HCA names per rail; default <prefix>0..N-1")
    nodes_per_rack: int = Field(default=1, ge=1, le=256)
    features: tuple[Word, ...] = ()

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
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    groups: tuple[str, ...] = Field(min_length=1)
    default: bool = False
    max_time: str = Field(default="INFINITE", pattern=r"^(INFINITE|UNLIMITED|(\d+-)?\d+(:\d\d){0,2})$")
    max_nodes: int | None = Field(default=None, ge=1)
    priority_tier: int = Field(default=1, ge=0, le=65533)
    topology: Literal["tree", "block", "none"] | None = Field(
        default=None, description="this partition's own topology (Slurm 25.05+, topology.yaml); default slurm.topology",
    )


NODE_PATH = r"^/[A-Za-z0-9._/-]+$"


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


def _release(value: object) -> object:
    """An unquoted `version: 24.11` reaches here as the float 24.11; a release is written with two digits
    after the dot, so that float means "24.11". Which releases exist is a rule of meaning (spec/versions.py),
    so the error lists them."""
    if isinstance(value, float):
        return f"{value:.2f}"
    return value


class HealthCheck(Strict):
    program: str = Field(pattern=NODE_PATH, description="HealthCheckProgram: a path on the compute nodes")
    interval: int = Field(default=300, ge=1, le=86400, description="HealthCheckInterval in seconds")
    node_state: str = Field(default="ANY",
                            pattern=r"^(ALLOC|ANY|CYCLE|IDLE|MIXED|NONDRAINED_IDLE|START_ONLY|REBOOT_ONLY)(,[A-Z_]+)*$",
                            description="HealthCheckNodeState")


class Slurm(Strict):
    version: Annotated[str, BeforeValidator(_release)] = Field(
        default="22.05", max_length=16,
        description="the Slurm release to render for: 22.05 .. 26.05 (spec/slurm_versions.py, checked with meaning)",
    )
    topology: Literal["tree", "block", "none"] = "tree"
    accounting: bool = True
    profile: Literal["production", "staging"] = Field(
        default="production",
        description="staging swaps the cgroup plugins for ones that run in unprivileged containers",
    )
    partitions: tuple[Partition, ...] = Field(min_length=1)
    prolog: str | None = Field(default=None, pattern=NODE_PATH, description="Prolog: a path on the compute nodes")
    epilog: str | None = Field(default=None, pattern=NODE_PATH, description="Epilog: a path on the compute nodes")
    health_check: HealthCheck | None = None
    tree_merge_leaves: int = Field(
        default=1, ge=1, le=4096,
        description="topology/tree: consecutive leaves (units) of one pod listed as one logical leaf; only "
                    "where the leaf tier is non-blocking. Fewer switches: slurmctld's tree cost grows with their cube",
    )
    parameters: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9]*$", max_length=64)],
                     ConfValue] = Field(
        default_factory=dict,
        description="extra slurm.conf keys merged over gpucluster's computed defaults (StackHPC openhpc_config)",
    )

    @property
    def version_tuple(self) -> tuple[int, int]:
        major, minor = self.version.split(".")
        return int(major), int(minor)


class Roce(Strict):
    dscp: int = Field(default=26, ge=0, le=63)
    pfc_priority: int = Field(default=3, ge=0, le=7)
    cnp_dscp: int = Field(default=48, ge=0, le=63)
    cnp_priority: int = Field(default=6, ge=0, le=7)
    ecn: bool = True
    mtu: Literal[1024, 2048, 4096] = 4096
    link_mtu: int = Field(default=9000, ge=1500, le=9216)
    gid_index: int | None = Field(default=3, ge=0, le=255)


class Infiniband(Strict):
    subnet_manager: Literal["opensm", "ufm", "none"] = "opensm"
    sharp: bool = False
    service_level: int = Field(default=0, ge=0, le=15)


RATIO = r"^\d+(\.\d+)?:\d+(\.\d+)?$"


class Fabric(Strict):
    type: Literal["infiniband", "roce"]
    design: Literal["fat-tree", "rail-optimized"]
    tiers: Literal["auto", 2, 3] = "auto"
    link_speed_gbps: int | None = Field(default=None, gt=0, description="default: the NIC speed")
    switches: dict[Tier, str] = Field(min_length=1)
    oversubscription: dict[Tier, str] = Field(default_factory=dict)
    nodes_per_leaf: int | None = Field(default=None, ge=1, description="fat-tree: nodes under one leaf switch")
    rails: int | None = Field(default=None, ge=1, le=16, description="NICs per node on the fabric; checked")
    scalable_unit_nodes: int | None = Field(default=None, ge=1, description="rail-optimized: nodes per unit")
    rail_groups: int = Field(default=1, ge=1, description="rail-optimized: spine groups the rails split into")
    nodes_per_pod: int | None = Field(default=None, ge=1, description="3 tiers: nodes per pod (zone)")
    qps_per_connection: int | None = Field(default=None, ge=1, le=128)
    management_interface: str = Field(default="eth0", pattern=r"^[=^]?[A-Za-z0-9_.,-]+$")
    roce: Roce = Field(default_factory=Roce)
    infiniband: Infiniband = Field(default_factory=Infiniband)

    @field_validator("oversubscription")
    @classmethod
    def _ratios(cls, value: dict[str, str]) -> dict[str, str]:
        for tier, ratio in value.items():
            if not re.match(RATIO, str(ratio)):
                raise ValueError(f"{tier}: '{ratio}' is not a ratio; write it like '1:1' or '7:1' (quoted in YAML)")
            if parse_ratio(ratio) < 1:
                raise ValueError(f"{tier}: '{ratio}' has more uplinks than downlinks; write it as N:1 with N >= 1")
        return value

    def ratio(self, tier: str) -> float:
        return parse_ratio(self.oversubscription.get(tier, "1:1"))


DEFAULT_NFS_OPTIONS = "vers=4.2,nconnect=16,hard,rsize=1048576,wsize=1048576,noatime"
ABSPATH = r"^/[A-Za-z0-9._/-]*$"


class Flash(Strict):
    name: str = Field(default="flash", pattern=NAME)
    metadata_group: str
    chunk_group: str
    nvme_per_server: int = Field(ge=1, le=64)
    nvme_tb: float = Field(gt=0)
    nvme_gbps: float = Field(default=6.0, gt=0, description="sustained GB/s per drive")
    target_bandwidth_gbps: float | None = Field(default=None, gt=0, description="GB/s the tier must sustain")
    replicas: int = Field(default=2, ge=1, le=9)
    mount: str = Field(default="/mnt/flash", pattern=ABSPATH)
    client_groups: tuple[str, ...] | None = Field(default=None, description="default: compute and login")


class NfsExport(Strict):
    path: str = Field(pattern=ABSPATH)
    mount: str = Field(pattern=ABSPATH)
    options: str = Field(default=DEFAULT_NFS_OPTIONS, pattern=r"^[a-z0-9_=,.]+$")


class Nfs(Strict):
    name: str = Field(pattern=NAME)
    server_group: str
    exports: tuple[NfsExport, ...] = Field(min_length=1)
    client_groups: tuple[str, ...] | None = None


class Storage(Strict):
    flash: Flash | None = None
    nfs: tuple[Nfs, ...] = ()


class ClusterSpec(Strict):
    name: str = Field(pattern=NAME, max_length=40)
    slurm: Slurm
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1)
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

    def line(self, path: tuple) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)
