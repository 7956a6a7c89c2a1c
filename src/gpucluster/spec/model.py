"""Typed cluster spec: the syntax layer (types, ranges, required and unknown keys).

Meaning (radix, rails, collisions, versions) is checked in `gpucluster.spec.rules`, after this
layer accepted the document. Field names here are the YAML keys; docs/spec.md documents them.
Numbers, booleans and text are strict and bounded (`gpucluster.fields` says why): a YAML boolean is
never a count, and no value is larger than what consumes it (Slurm, hostnames, the catalog).
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator

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


class GroupContainers(Strict):
    """node_groups[].containers: how this group's jobs run in containers (docs/containers.md). Unset: the group's
    default, which follows from its role and GPU vendor (spec/jobcontainers.py resolves and checks it)."""

    oci: Bool | None = Field(default=None, description="Slurm's own OCI containers (srun --container=BUNDLE, "
                                                       "oci.conf); default: on for compute groups")
    enroot_pyxis: Bool | None = Field(
        default=None, description="pyxis and enroot (srun --container-image=IMAGE); default: on for compute groups "
                                  "with NVIDIA GPUs, and for login groups while a compute group has it")


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
    nodes_per_rack: Int = Field(default=1, ge=1, le=256,
                                description="servers one rack holds: the plan counts racks with it (a group of 32 "
                                            "or more left at 1 warns: rack-default)")
    node_rack_units: Int | None = Field(default=None, ge=1, le=64,
                                        description="height of one node in U; default: its GPU's rack_units in the "
                                                    "catalog, 2 without a GPU (docs/plan.md, Rack elevations)")
    rack_first_u: Int = Field(default=1, ge=1, le=64,
                              description="the U its lowest node starts at: above what the rack keeps at its "
                                          "bottom (a CDU, power shelves)")
    features: tuple[Word, ...] = Field(default=(), max_length=64)
    containers: GroupContainers = Field(default_factory=GroupContainers)

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
    topology: Literal["tree", "block", "none"] | None = Field(
        default=None, description="this partition's own topology (Slurm 25.05+, topology.yaml); default slurm.topology",
    )


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


class Slurm(Strict):
    version: Annotated[str, BeforeValidator(_release)] = Field(
        default="22.05", max_length=16,
        description="the Slurm release to render for: 22.05 .. 26.05 (spec/slurm_versions.py, checked with meaning)",
    )
    topology: Literal["tree", "block", "none"] = "tree"
    accounting: Bool = True
    accounting_purge_after: Text | None = Field(
        default=None, pattern=r"^[1-9][0-9]{0,4}(hours?|days?|months?)$",
        description="slurmdbd.conf Purge*After for every record kind, e.g. 12months; none keeps records forever",
    )
    profile: Literal["production", "staging"] = Field(
        default="production",
        description="staging swaps the cgroup plugins for ones that run in unprivileged containers",
    )
    partitions: tuple[Partition, ...] = Field(min_length=1, max_length=MAX_LIST)
    prolog: NodePath | None = Field(default=None, description="Prolog: a path on the compute nodes")
    epilog: NodePath | None = Field(default=None, description="Epilog: a path on the compute nodes")
    tree_merge_leaves: Int = Field(
        default=1, ge=1, le=4096,
        description="topology/tree: consecutive leaves (units) of one pod listed as one logical leaf; only "
                    "where the leaf tier is non-blocking. Fewer switches: slurmctld's tree cost grows with their cube",
    )
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


# ==== Storage daemon and mount settings (every storage template is rendered from the spec) ====
# What the MooseFS and NFS-Ganesha templates (templates/storage/) consume, with the defaults the
# flash_storage and nfs roles used to carry. Self-contained: the only hooks are `Flash.moosefs` and
# `Nfs.ganesha`. Values land unquoted in daemon config files and systemd units, so every text field
# has a pattern; docs/spec.md ("Storage settings") documents each.

# A directory on a storage node: absolute, no '.'/'..' or hidden components, no trailing '/'.
NODE_DIR = r"^(/[A-Za-z0-9_-][A-Za-z0-9._-]*)+$"
# MooseFS sizes (mfshdd.cfg(5)): a number with a unit, e.g. 256MiB, 3.5TiB, 500GB.
MFS_SIZE = r"^[0-9]{1,6}(\.[0-9]{1,3})?([kMGTPE]|[KMGTPE]i)B$"
# Settings of mfsmaster.cfg / mfschunkserver.cfg the templates write themselves (set them through their field).
MFS_OWNED = {
    "WORKING_USER": None, "WORKING_GROUP": None, "EXPORTS_FILENAME": None, "HDD_CONF_FILENAME": None,
    "DATA_PATH": "moosefs.data_path", "MATOML_LISTEN_PORT": "moosefs.ports.metalogger",
    "MATOCS_LISTEN_PORT": "moosefs.ports.chunkserver", "MATOCL_LISTEN_PORT": "moosefs.ports.client",
    "MASTER_HOST": "metadata_group", "MASTER_PORT": "moosefs.ports", "HDD_LEAVE_SPACE_DEFAULT": "moosefs.leave_space",
}


def _mfs_value(value: object) -> str:
    """A MooseFS cfg value after 'KEY = ': a whole number or one word (no spaces, no '#': MooseFS reads the rest
    of the line, and a YAML boolean would be guessed at)."""
    if isinstance(value, bool):
        raise ValueError("a YAML boolean is not a MooseFS value; write 0 or 1 as MooseFS expects")
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.,:/+@-]{1,256}", value):
        raise ValueError("a MooseFS value is a whole number or one word of letters, digits and _.,:/+@-; "
                         "write it as MooseFS's example config does")
    return value


def _not_empty(value: tuple) -> tuple:
    """An empty list is refused here rather than with min_length, which pydantic also reports (as 'too short')
    when an item was refused: one finding per mistake."""
    if not value:
        raise ValueError("the list is empty; give at least one entry or leave the key out for the default")
    return value


MfsKey = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]*$", max_length=64)]
MfsValue = Annotated[str, BeforeValidator(_mfs_value)]


def _mfs_extra(value: dict[str, str]) -> dict[str, str]:
    """Keys the templates write are refused, naming the field that sets them (as slurm.parameters does)."""
    for key in value:
        if key in MFS_OWNED:
            field = MFS_OWNED[key]
            raise ValueError(f"{key} is written by gpucluster; " + (f"set storage.flash.{field} instead" if field
                                                                     else "remove it (its value is fixed)"))
    return value


def _mfs_network(value: str) -> str:
    """mfsexports.cfg(5) addresses: '*', A.B.C.D, A.B.C.D/BITS, A.B.C.D/NETMASK or A.B.C.D-E.F.G.H."""
    import ipaddress

    if not isinstance(value, str) or value == "*":
        return value  # the str type check reports anything else
    try:
        if "-" in value:
            lo, hi = (ipaddress.IPv4Address(p) for p in value.split("-", 1))
            if lo > hi:
                raise ValueError
        elif "/" in value:
            ipaddress.IPv4Network(value, strict=False)
        else:
            ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"'{value}' is not an mfsexports address; write '*', 10.0.0.0/16, 10.0.0.5 or "
                         "10.0.0.1-10.0.0.99") from None
    return value


MfsNetwork = Annotated[str, StringConstraints(max_length=40), BeforeValidator(_mfs_network)]
# One FUSE option of mfsmount, NAME or NAME=VALUE (no comma: the unit joins them with commas).
MountOption = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*(=[A-Za-z0-9_.:+-]+)?$", max_length=128)]


class MfsPorts(Strict):
    metalogger: Int = Field(default=9419, ge=1024, le=65535, description="MATOML_LISTEN_PORT")
    chunkserver: Int = Field(default=9420, ge=1024, le=65535, description="MATOCS_LISTEN_PORT")
    client: Int = Field(default=9421, ge=1024, le=65535, description="MATOCL_LISTEN_PORT")

    @field_validator("chunkserver", "client")
    @classmethod
    def _distinct(cls, value: int, info: ValidationInfo) -> int:
        if value in info.data.values():
            raise ValueError(f"port {value} is taken by another master port; give each a port of its own")
        return value


class ChunkDir(Strict):
    path: Text = Field(pattern=NODE_DIR, max_length=255, description="an NVMe file system's mount point")
    limit: Text | None = Field(default=None, pattern=MFS_SIZE, description="at most this much is used, e.g. 3.5TiB")


class MooseFs(Strict):
    """storage.flash.moosefs: the MooseFS daemons' config files and the clients' mount unit."""

    ports: MfsPorts = Field(default_factory=MfsPorts)
    data_path: Text = Field(default="/var/lib/mfs", pattern=NODE_DIR, max_length=255)
    chunk_dirs: tuple[ChunkDir, ...] = Field(default=(ChunkDir(path="/srv/mfs/chunks"),), max_length=64)
    leave_space: Text = Field(default="256MiB", pattern=MFS_SIZE, description="HDD_LEAVE_SPACE_DEFAULT")
    client_networks: tuple[MfsNetwork, ...] = Field(default=("*",), max_length=64)
    root_squash: Bool = False
    admin: Bool = Field(default=False, description="MooseFS admin rights on the root export (mfsexports.cfg "
                        "'admin': storage classes, quotas); MooseFS 4 needs them for replicas other than 2 and 3")
    mount_options: tuple[MountOption, ...] = Field(default=(), max_length=32)
    mount_timeout: Int = Field(default=60, ge=1, le=3600, description="TimeoutSec= of the mount unit")
    master_extra: dict[MfsKey, MfsValue] = Field(default_factory=dict, max_length=64)
    chunkserver_extra: dict[MfsKey, MfsValue] = Field(default_factory=dict, max_length=64)

    _chunk_dirs_given = field_validator("chunk_dirs", "client_networks")(_not_empty)

    @field_validator("chunk_dirs")
    @classmethod
    def _dirs_once(cls, value: tuple[ChunkDir, ...]) -> tuple[ChunkDir, ...]:
        paths = [d.path for d in value]
        if len(set(paths)) < len(paths):
            raise ValueError("a chunk directory is listed twice; list each NVMe file system once")
        return value

    @field_validator("mount_options")
    @classmethod
    def _own_options(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for opt in value:
            if opt.split("=", 1)[0] in ("mfsmaster", "mfsport", "_netdev"):
                raise ValueError(f"mount option '{opt}' is written from the spec (metadata_group, moosefs.ports); "
                                 "remove it")
        return value

    @field_validator("master_extra", "chunkserver_extra")
    @classmethod
    def _not_owned(cls, value: dict[str, str]) -> dict[str, str]:
        return _mfs_extra(value)


# Ganesha CLIENT entries: '*', a host name or IP, a network A.B.C.D/BITS, a wildcard host or @netgroup.
GaneshaClient = Annotated[str, StringConstraints(pattern=r"^(\*|@?[A-Za-z0-9*?_.:/-]+)$", max_length=255)]


class Ganesha(Strict):
    """storage.nfs[].ganesha: how NFS-Ganesha serves this tier, and how long its clients wait for a mount."""

    protocols: tuple[Literal[3, 4], ...] = Field(default=(3, 4), max_length=2)
    grace_period: Int = Field(default=90, ge=0, le=180, description="NFSv4 Grace_Period in seconds")
    lease_lifetime: Int = Field(default=60, ge=1, le=120, description="NFSv4 Lease_Lifetime in seconds")
    squash: Literal["Root_Squash", "No_Root_Squash", "All_Squash"] = "Root_Squash"
    clients: tuple[GaneshaClient, ...] = Field(default=("*",), max_length=64)
    mount_timeout: Int = Field(default=60, ge=1, le=3600, description="TimeoutSec= of the clients' mount units")
    allow_set_io_flusher_fail: Bool = Field(
        default=False, description="NFS-Ganesha 5+ (Debian 13: 6.5) starts even where prctl(PR_SET_IO_FLUSHER) is "
                                   "refused (no CAP_SYS_RESOURCE, as in containers); the server's, if any tier asks")

    _lists_given = field_validator("protocols", "clients")(_not_empty)

    @field_validator("protocols")
    @classmethod
    def _once(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(value)) < len(value):
            raise ValueError("a protocol is listed twice; list 3, 4 or both once")
        return value

    @field_validator("lease_lifetime")
    @classmethod
    def _within_grace(cls, value: int, info: ValidationInfo) -> int:
        grace = info.data.get("grace_period")
        if grace and grace < value:
            raise ValueError(f"lease_lifetime {value} is longer than grace_period {grace}, so clients may not "
                             "reclaim their state in time; keep it at most the grace period")
        return value

# ==== end of the storage settings block ==========================================================


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
    moosefs: MooseFs = Field(default_factory=MooseFs, description="MooseFS settings (ports, chunk dirs, mount)")


class NfsExport(Strict):
    path: AbsPath
    mount: AbsPath
    options: Text = Field(default=DEFAULT_NFS_OPTIONS, pattern=r"^[a-z0-9_=,.]+$", max_length=1024)


class Nfs(Strict):
    name: Text = Field(pattern=NAME, max_length=32)
    server_group: Text = Field(max_length=32)
    exports: tuple[NfsExport, ...] = Field(min_length=1, max_length=64)
    client_groups: tuple[Text, ...] | None = Field(default=None, max_length=MAX_LIST)
    ganesha: Ganesha = Field(default_factory=Ganesha, description="NFS-Ganesha settings and the mount timeout")


class Storage(Strict):
    flash: Flash | None = None
    nfs: tuple[Nfs, ...] = Field(default=(), max_length=64)


# ---- driver stacks and node health (docs/drivers.md and docs/health.md) ---------------------------
# Optional: a spec without these sections gets the version lock's stack per GPU SKU and the default
# health checks. Meaning (SKU vs source, branch mixes, check names) is checked in spec/stacks.py.
DriverSource = Literal["cuda-repo", "rocm-repo", "debian", "local-mirror"]
Ofed = Literal["inbox", "mlnx-ofed", "doca"]


def _text(value):
    """YAML reads `branch: 570` as a number; a branch or release is a name."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


class DriverChoice(Strict):
    source: DriverSource | None = Field(default=None, description="default: the vendor repository of the SKU")
    branch: Text | None = Field(default=None, pattern=r"^\d+(\.\d+){0,2}$",
                               description="NVIDIA driver branch or ROCm release; default: the lock's for the SKU")
    fabric_manager_branch: Text | None = Field(default=None, pattern=r"^\d+(\.\d+){0,2}$",
                                              description="default: the driver branch (nothing else works)")
    ofed: Ofed | None = Field(default=None, description="RDMA stack of fabric groups; default inbox")

    @field_validator("branch", "fabric_manager_branch", mode="before")
    @classmethod
    def _branch_text(cls, value):
        return _text(value)


class Drivers(DriverChoice):
    mirror: Text | None = Field(default=None, pattern=r"^https?://[A-Za-z0-9._~:/%+-]+$",
                               description="local-mirror: replaces scheme and host of every vendor repository URL")
    groups: dict[str, DriverChoice] = Field(default_factory=dict, description="per node group overrides")


HealthCheckName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]*$", max_length=32)]


class HealthActive(Strict):
    checks: tuple[Literal["dcgm-diag", "nccl-allreduce", "ib-bandwidth"], ...] = Field(
        default=(), description="active checks run as low-priority Slurm jobs; empty: none")
    share_pct: Num = Field(default=5.0, gt=0, le=50, description="most of the compute nodes they hold at once")
    nice: Int = Field(default=10000, ge=0, le=2147483645)
    time_limit: Text = Field(default="0:15:00", pattern=r"^(\d+-)?\d+(:\d\d){0,2}$")
    partition: Text | None = Field(default=None, description="default: the default partition")
    every_hours: Int = Field(default=24, ge=1, le=24 * 90, description="how often each node is queued for them")
    nccl_min_busbw_gbps: Num | None = Field(default=None, gt=0, le=10_000,
                                            description="nccl-allreduce: bus bandwidth floor")


XidAction = Literal["record", "drain", "reboot", "service"]


class HealthBreaker(Strict):
    """Automatic drains stop past these limits, until an operator resets the breaker (docs/health.md)."""

    enabled: Bool = True
    window_minutes: Int = Field(default=60, ge=5, le=7 * 24 * 60,
                                description="automatic drains are counted over this window")
    drains_pct: Num = Field(default=5.0, gt=0, le=100,
                            description="most automatic drains per window, as a share of the node group")
    out_of_service_pct: Num = Field(default=10.0, gt=0, le=100,
                                    description="no automatic drain once this share of the group is out of service")
    min_nodes: Int = Field(default=2, ge=1, le=100_000,
                           description="each limit is at least this many nodes (small groups)")


class HealthLifecycle(Strict):
    """When a node that keeps failing goes to service-required (a repair ticket), whatever its checks say next."""

    triages: Int = Field(default=3, ge=2, le=100,
                         description="entries into triage (a drain or a reboot for a fault) within window_days that "
                                     "send a node to service-required")
    window_days: Int = Field(default=7, ge=1, le=365, description="the window triage entries are counted over")


class HealthNvlinkDomain(Strict):
    """An NVLink domain (a GB200/GB300 NVL72 rack) degrades as a unit (docs/health.md, "An NVLink domain that lost
    too many trays"); only groups whose GPU has an NVLink domain have one, the others ignore this."""

    enabled: Bool = Field(default=True, description="false: no domain guard on the controller")
    out_of_service_pct: Num = Field(default=25.0, gt=0, lt=100,
                                    description="more than this share of a domain's trays out of service drains "
                                                "the rest of the domain")


class Health(Strict):
    enabled: Bool = True
    interval: Int = Field(default=300, ge=5, le=86400, description="HealthCheckInterval, seconds")
    node_state: Text = Field(default="ANY", max_length=64,
                            pattern=r"^(ALLOC|ANY|CYCLE|IDLE|MIXED|NONDRAINED_IDLE|START_ONLY|REBOOT_ONLY)(,[A-Z_]+)*$",
                            description="HealthCheckNodeState")
    check_timeout: Int = Field(default=20, ge=1, le=45, description="seconds one check may take (the run: +10)")
    resume_after: Int = Field(default=3, ge=1, le=1000, description="passing runs before a gpc: drain is resumed")
    min_free_pct: Num = Field(default=5.0, ge=0, lt=100, description="/tmp and the Slurm spool")
    ecc_uncorrected_max: Int = Field(default=0, ge=0, le=1_000_000,
                                     description="volatile uncorrected ECC errors a GPU may have")
    link_downed_max: Int = Field(default=0, ge=0, le=1_000_000,
                                 description="link_downed increase per run a port may have")
    skip: tuple[HealthCheckName, ...] = Field(default=(), description="checks not run (names as in docs/health.md)")
    fail_after: Int = Field(default=3, ge=1, le=100,
                            description="failing runs in a row before a check of a shared or transient cause "
                                        "(mounts, munge) drains; hardware checks drain on the first")
    breaker: HealthBreaker = Field(default_factory=HealthBreaker)
    lifecycle: HealthLifecycle = Field(default_factory=HealthLifecycle)
    nvlink_domain: HealthNvlinkDomain = Field(default_factory=HealthNvlinkDomain)
    xid_actions: dict[Annotated[int, Field(ge=1, le=1000)], XidAction] = Field(
        default_factory=dict, description="site overrides of the XID table: XID number to record, drain, reboot "
                                          "or service")
    active: HealthActive = Field(default_factory=HealthActive)
# ---- end of the driver stacks and node health block ------------------------------------------------


class Containers(Strict):
    """containers: the OCI runtime oci.conf calls, and where enroot keeps image layers, unpacked containers and its
    working files (docs/containers.md)."""

    runtime: Literal["runc", "crun"] = Field(
        default="runc", description="the OCI runtime of srun --container, one for the cluster (configless Slurm "
                                    "serves one oci.conf to every node); runc is Debian's")
    image_cache: Literal["flash", "local"] | None = Field(
        default=None, description="where enroot caches image layers: flash (the flash tier, one pull per user for "
                                  "the cluster) or local (local_dir on each node); default: flash when storage.flash "
                                  "exists and every group running pyxis mounts it")
    flash_folder: Text = Field(default="containers", pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$", max_length=64,
                               description="folder under the flash tier's mount for container images (enroot's "
                                           "layer cache, OCI layouts, bundles)")
    local_dir: Text = Field(default="/var/lib/enroot", pattern=NODE_DIR, max_length=255,
                            description="node-local folder for unpacked containers and enroot's temporary files")
    runtime_dir: Text = Field(default="/run/enroot", pattern=NODE_DIR, max_length=255,
                              description="enroot's working folder (a tmpfs)")


class Racks(Strict):
    """The racks every node group is planned into (docs/plan.md, "Rack elevations")."""

    # 48U, the tall EIA-310 rack: the DGX SuperPOD B300 XDR RA's rack of four DGX B300 (10U each) and three 2U
    # rack PDUs takes 46U, more than a 42U rack holds. A site of 42U racks sets height_u: 42.
    height_u: Int = Field(default=48, ge=4, le=64, description="height of a rack in U (EIA-310 units of 44.45 mm)")
    # One out-of-band management switch a rack, 1U, at the top (a 48-port 1GbE switch for the BMCs, e.g. NVIDIA
    # SN2201, 1U); the DGX GB200 rack has two (NVIDIA DGX GB Rack Scale Systems User Guide: 2x TOR switches for
    # management).
    management_u: Int = Field(default=1, ge=0, le=8,
                              description="U at the top of every rack for its management switches; 0: none")


def _prometheus_url(value: object) -> object:
    """An http(s) URL of a Prometheus server: scheme, host, optional port and path, nothing else. No user or
    password (the spec is committed; the site keeps its credentials in its own configuration), no query or
    fragment (Prometheus's API paths are appended to it)."""
    from urllib.parse import urlsplit

    if not isinstance(value, str):
        return value  # the str type check reports anything else
    fix = "write http://HOST:PORT or https://HOST[:PORT][/PATH], e.g. http://prometheus.example.org:9090"
    if not re.fullmatch(r"[\x21-\x7e]{1,2048}", value):
        raise ValueError(f"not a URL: it is empty, over 2,048 characters, or holds spaces or control characters; {fix}")
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"'{value}' has no valid port (1-65535); {fix}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"'{value}' is not an http or https URL; {fix}")
    host = parts.hostname or ""
    if not re.fullmatch(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?|[0-9a-f:.]*:[0-9a-f:.]*", host):
        raise ValueError(f"'{value}' names no valid host; {fix}")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"'{value}' holds a user or password, and the spec is committed; {fix}, and keep the "
                         "credentials in the site's own configuration")
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        raise ValueError(f"'{value}' has a query or fragment, which Prometheus's API paths cannot follow; {fix}")
    if port == 0:
        raise ValueError(f"'{value}' has no valid port (1-65535); {fix}")
    if not re.fullmatch(r"[A-Za-z0-9._~%!$&'()*+,;=:@/-]*", parts.path):
        # RFC 3986's path characters only: a brace, quote or backslash would be Jinja or YAML in the files and
        # roles that carry the URL (the Grafana data source, the role's message); write it percent-encoded
        raise ValueError(f"'{value}' has a path character a URL does not hold unencoded; {fix}")
    return value.rstrip("/")


PrometheusUrl = Annotated[str, StringConstraints(max_length=2048), BeforeValidator(_prometheus_url)]


class Metrics(Strict):
    """Prometheus's scrape config, rules and alerts, and a Grafana dashboard, by topology unit (docs/metrics.md)."""

    enabled: Bool = True
    # At most 2 minutes: a series is looked up 5 minutes back, so a longer interval leaves gaps between scrapes.
    scrape_interval: Int = Field(default=30, ge=5, le=120,
                                 description="seconds between scrapes, and between evaluations of the rules")
    down_minutes: Int = Field(default=5, ge=1, le=120,
                              description="minutes a node or a unit stays down or degraded before its alert fires")
    unit_degraded_pct: Num = Field(default=25.0, gt=0, le=100,
                                   description="share of a topology unit's nodes out of service (down, or not in "
                                               "production) over which one alert fires for the unit, not one a node")
    unit_degraded_min_nodes: Int = Field(default=2, ge=1, le=100_000,
                                         description="nodes out of service a unit needs as well before it counts "
                                                     "as degraded (small units: one node down stays one node)")
    # The health circuit breaker's default share (health.breaker.out_of_service_pct): past it automatic drains stop
    # and the cluster no longer heals itself, so a person looks.
    slurm_out_of_service_pct: Num = Field(default=10.0, gt=0, le=100,
                                          description="share of the nodes Slurm has that are drained, down or failed "
                                                      "over which one alert fires for the cluster")
    # Three exits in an hour is no cycle gpucluster drives itself (a reboot for a GPU fault, a rollout wave or an
    # acceptance is one exit each), and every exit ends the jobs on the node.
    flap_count: Int = Field(default=3, ge=2, le=100,
                            description="times a node leaves service (down, or out of production) within "
                                        "flap_minutes before it counts as flapping")
    flap_minutes: Int = Field(default=60, ge=10, le=1440,
                              description="the window flap_count is counted over, in minutes")
    # Slurm's default bf_max_time is its bf_interval, 30 s (the rendered slurm.conf sets neither), and sdiag's cycle
    # leaves out the 0.5 s backfill sleeps every 2 s to yield its locks: no cycle reports much over 24 s before
    # bf_max_time ends it. Raise this with bf_max_time.
    backfill_cycle_seconds: Num = Field(default=20.0, gt=0, le=3600,
                                        description="seconds of a backfill cycle (sdiag's last cycle) over which "
                                                    "the scheduler alert fires, when every cycle is that long")
    # The ports: each exporter's own default (node_exporter's and dcgm-exporter's registered ports, AMD's
    # device-metrics-exporter's ServerPort) and Prometheus's. 1024 and up: below it a daemon needs root or
    # CAP_NET_BIND_SERVICE, and Debian runs node_exporter and Prometheus as the prometheus user. spec/ports.py
    # refuses one that another metrics port or a port the cluster already uses holds.
    node_exporter_port: Int = Field(default=9100, ge=1024, le=65535,
                                    description="node_exporter's listen port on every node")
    dcgm_exporter_port: Int = Field(default=9400, ge=1024, le=65535,
                                    description="dcgm-exporter's listen port on the NVIDIA GPU nodes")
    amd_exporter_port: Int = Field(default=5000, ge=1024, le=65535,
                                   description="the port the amd-gpu job scrapes: AMD device-metrics-exporter's "
                                               "ServerPort, which the site sets to match")
    prometheus_port: Int = Field(default=9090, ge=1024, le=65535,
                                 description="Prometheus's listen port on the controller (unused with external_url)")
    # One field, not a mode and a URL: `prometheus: external` without a URL, or a URL with `prometheus: controller`,
    # would be two more states to refuse. Unset, the metrics role runs Prometheus on the controller; set, the site's
    # own server at this address scrapes the nodes, and the role installs only the exporters and leaves the rendered
    # scrape config, targets and rules on the controller for the operator to copy there.
    external_url: PrometheusUrl | None = Field(
        default=None, description="the site's own Prometheus (http[s]://host[:port][/path]); unset: Prometheus on "
                                  "the controller")
    # Grafana is not in Debian: true installs Grafana's own package on the first controller (one Grafana a cluster,
    # beside Prometheus or with the site's own), from its vendor's repository at the version the lock pins
    # (catalog.GRAFANA), provisioned with the cluster's Prometheus and the four rendered dashboards. False: the
    # dashboards are files to import by hand. spec/ports.py refuses it without metrics and checks its port.
    grafana: Bool = Field(default=False, description="install Grafana on the first controller (the vendor's "
                                                     "package), the cluster's Prometheus and dashboards provisioned")
    grafana_port: Int = Field(default=3000, ge=1024, le=65535,
                              description="Grafana's listen port on the controller (used with grafana: true)")

    @property
    def on_controller(self) -> bool:
        """Whether the metrics role runs Prometheus on the controller (no external server named)."""
        return self.external_url is None


class ClusterSpec(Strict):
    name: Text = Field(pattern=NAME, max_length=40)
    slurm: Slurm
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1, max_length=MAX_GROUPS)
    fabric: Fabric
    storage: Storage = Field(default_factory=Storage)
    catalog: Catalog = Field(default_factory=Catalog)
    drivers: Drivers = Field(default_factory=Drivers)  # driver stacks block (above)
    health: Health = Field(default_factory=Health)  # node health block (above)
    containers: Containers = Field(default_factory=Containers)  # jobs in containers (above)
    racks: Racks = Field(default_factory=Racks)
    metrics: Metrics = Field(default_factory=Metrics)  # Prometheus and Grafana (above)

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
