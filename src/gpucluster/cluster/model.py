"""The compiled cluster: spec + plan + the facts derived from them, each computed once, read everywhere.

Before this module, the inventory writer, the Ansible filters, the validator, the stage layer and the
Pulumi program each derived these facts themselves (client groups, GRES strings, device paths, unit
names, memberships), with small differences. Now each fact has one definition here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gpucluster.cluster.unitnames import unit_name
from gpucluster.errors import Finding, SpecError
from gpucluster.fabric import Plan, PlanError, Unit, plan_cluster
from gpucluster.spec.loader import load_spec
from gpucluster.spec.model import ClusterSpec, LoadedSpec, NodeGroup
from gpucluster.spec.rules import check_rules

# The inventory contract's groups (docs/inventory.md): roles, playbooks and the validator rely on them.
CONTRACT_GROUPS = ("slurm_controller", "slurm_dbd", "slurm_compute", "slurm_login", "flash_meta", "flash_chunk",
                   "flash_client", "nfs_server", "nfs_client", "gpu_nvidia", "gpu_amd", "fabric_ib", "fabric_roce")
ROLE_GROUPS = {"controller": "slurm_controller", "compute": "slurm_compute", "login": "slurm_login"}


@dataclass(frozen=True, eq=False)
class Cluster:
    """A validated spec, where it came from, its plan, and the warnings both raised."""

    loaded: LoadedSpec
    plan: Plan
    warnings: tuple[Finding, ...] = field(default=())

    @property
    def spec(self) -> ClusterSpec:
        return self.loaded.spec

    @property
    def source(self) -> Path:
        return Path(self.loaded.source)

    @property
    def name(self) -> str:
        return self.spec.name

    # ---- hosts and groups ------------------------------------------------------------------------
    @cached_property
    def controllers(self) -> list[str]:
        return [h for g in self.spec.groups_with_role("controller") for h in g.hosts]

    @cached_property
    def dbd_host(self) -> str | None:
        """Where slurmdbd runs: the first controller, when accounting is on."""
        return self.controllers[0] if self.spec.slurm.accounting and self.controllers else None

    def client_groups(self, declared: tuple[str, ...] | None) -> tuple[str, ...]:
        """A storage tier's client node groups: those declared, else every compute and login group."""
        if declared is not None:
            return tuple(declared)
        return tuple(g.name for g in self.spec.node_groups if g.role in ("compute", "login"))

    @cached_property
    def _memberships(self) -> dict[str, tuple[str, ...]]:
        spec = self.spec
        st = spec.storage
        out = {}
        for group in spec.node_groups:
            member: list[str] = []
            if group.role in ROLE_GROUPS:
                member.append(ROLE_GROUPS[group.role])
            if st.flash:
                if group.name == st.flash.metadata_group:
                    member.append("flash_meta")
                if group.name == st.flash.chunk_group:
                    member.append("flash_chunk")
                if group.name in self.client_groups(st.flash.client_groups):
                    member.append("flash_client")
            if any(group.name == n.server_group for n in st.nfs):
                member.append("nfs_server")
            if any(group.name in self.client_groups(n.client_groups) for n in st.nfs):
                member.append("nfs_client")
            if group.gpu and group.gpus_per_node:
                member.append(f"gpu_{self.gpu_vendor(group)}")
            if group in spec.fabric_groups:
                member.append("fabric_ib" if spec.fabric.type == "infiniband" else "fabric_roce")
            out[group.name] = tuple(member)
        return out

    def memberships(self, group: NodeGroup) -> tuple[str, ...]:
        """Contract groups every node of this node group belongs to (slurm_dbd aside: one host)."""
        return self._memberships[group.name]

    @cached_property
    def contract_groups(self) -> dict[str, list[str]]:
        """Contract group -> hosts, in spec order; every contract group is present, maybe empty."""
        out: dict[str, list[str]] = {name: [] for name in CONTRACT_GROUPS}
        for group in self.spec.node_groups:
            for contract in self.memberships(group):
                out[contract].extend(group.hosts)
        if self.dbd_host:
            out["slurm_dbd"].append(self.dbd_host)
        return out

    @cached_property
    def group_of_host(self) -> dict[str, NodeGroup]:
        return {h: g for g in self.spec.node_groups for h in g.hosts}

    @property
    def hosts(self) -> list[str]:
        return list(self.group_of_host)

    def unit_of(self, host: str) -> Unit | None:
        return self.plan.unit_of_host.get(host)

    def host_vars(self, group: NodeGroup, index: int) -> dict:
        """The per-node facts of the inventory contract: node group, rack, leaf, pod, rails, HCAs."""
        plan = self.plan
        out: dict = {"gpucluster_node_group": group.name, "gpucluster_rack": plan.rack_of(group, index)}
        unit = plan.unit_of_host.get(group.host(index))
        if unit is not None:
            out["gpucluster_leaf"] = unit.name
            if plan.tiers == 3:
                out["gpucluster_pod"] = f"pod{unit.pod + 1:03d}"
            out["gpucluster_rails"] = group.nics_per_node
            out["gpucluster_hcas"] = self.hcas(group)
        return out

    # ---- GPUs and NICs ---------------------------------------------------------------------------
    def gpu_vendor(self, group: NodeGroup) -> str | None:
        return self.spec.parts.gpus[group.gpu].vendor if group.gpu else None

    def gres_type(self, group: NodeGroup) -> str:
        return self.spec.parts.gpus[group.gpu].slurm_type

    def gres(self, group: NodeGroup) -> str:
        """Slurm's Gres= of a node of this group ("" without GPUs)."""
        if not (group.gpu and group.gpus_per_node):
            return ""
        return f"gpu:{self.gres_type(group)}:{group.gpus_per_node}"

    def gres_detect(self, group: NodeGroup) -> str:
        if group.gres_detect != "auto":
            return group.gres_detect
        return "nvml" if self.gpu_vendor(group) == "nvidia" else "rsmi"

    def gpu_devices(self, group: NodeGroup) -> tuple[str, ...]:
        """Device files of the GPUs of one node (render /dev/dri/renderD* on AMD, /dev/nvidiaN on NVIDIA)."""
        if not (group.gpu and group.gpus_per_node):
            return ()
        if self.gpu_vendor(group) == "amd":
            return tuple(f"/dev/dri/renderD{128 + i}" for i in range(group.gpus_per_node))
        return tuple(f"/dev/nvidia{i}" for i in range(group.gpus_per_node))

    def gpu_files(self, group: NodeGroup) -> str:
        """The same device files as one gres.conf File= range."""
        n = group.gpus_per_node
        if self.gpu_vendor(group) == "amd":
            return f"/dev/dri/renderD[128-{127 + n}]" if n > 1 else "/dev/dri/renderD128"
        return f"/dev/nvidia[0-{n - 1}]" if n > 1 else "/dev/nvidia0"

    def hcas(self, group: NodeGroup) -> list[str]:
        return self.plan.hcas(group)

    def nic_speed(self, group: NodeGroup) -> int | None:
        if not (group.nic and group.nics_per_node):
            return None
        return self.spec.fabric.link_speed_gbps or self.spec.parts.nics[group.nic].speed_gbps

    # ---- storage and fabric, as plain data (roles and the validator read these) ------------------
    @cached_property
    def storage(self) -> dict:
        """The flash and NFS tiers: mounts and their systemd units, servers, clients, exports."""
        spec = self.spec
        st = spec.storage
        flash = None
        if st.flash:
            f = st.flash
            flash = {
                "name": f.name, "mount": f.mount, "unit": unit_name(f.mount), "replicas": f.replicas,
                "metadata_group": f.metadata_group, "chunk_group": f.chunk_group,
                "client_groups": list(self.client_groups(f.client_groups)),
                "master": spec.group(f.metadata_group).host(0),
                "chunk_servers": spec.group(f.chunk_group).count,
            }
        nfs = []
        export_id = 0
        for tier in st.nfs:
            exports = []
            for e in tier.exports:
                export_id += 1  # unique per cluster, so tiers may share a server
                exports.append({"path": e.path, "pseudo": e.path, "mount": e.mount, "options": e.options,
                                "export_id": export_id, "unit": unit_name(e.mount)})
            server_group = spec.group(tier.server_group)
            nfs.append({
                "name": tier.name, "server_group": tier.server_group, "server": server_group.host(0),
                "servers": list(server_group.hosts), "client_groups": list(self.client_groups(tier.client_groups)),
                "exports": exports,
            })
        mounts = [{**e, "tier": t["name"], "server": t["server"], "client_groups": t["client_groups"]}
                  for t in nfs for e in t["exports"]]
        return {"cluster": spec.name, "flash": flash, "nfs": nfs, "nfs_mounts": mounts}

    @cached_property
    def fabric(self) -> dict:
        """Fabric settings the rdma role applies on hosts; NCCL_IB_TC is the same DSCP x 4 (the ToS byte)."""
        fab = self.spec.fabric
        roce = fab.roce
        return {
            "cluster": self.spec.name, "type": fab.type, "design": fab.design,
            "roce": {
                "dscp": roce.dscp, "tos": roce.dscp * 4, "pfc_priority": roce.pfc_priority,
                "pfc_map": ",".join("1" if p == roce.pfc_priority else "0" for p in range(8)),
                "cnp_dscp": roce.cnp_dscp, "cnp_priority": roce.cnp_priority, "ecn": roce.ecn,
                "mtu": roce.mtu, "link_mtu": roce.link_mtu, "gid_index": roce.gid_index,
            },
            "infiniband": {"subnet_manager": fab.infiniband.subnet_manager, "sharp": fab.infiniband.sharp,
                           "service_level": fab.infiniband.service_level},
        }

    def compute_groups(self) -> Iterator[NodeGroup]:
        return iter(self.spec.groups_with_role("compute"))


def _located(loaded: LoadedSpec, findings: list[Finding]) -> list[Finding]:
    name = str(loaded.source)
    return [Finding(f.path, f.message, f.fix, f.rule, f.level, f.file or name, f.line or loaded.line(f.path),
                    f.column or loaded.column(f.path)) for f in findings]


def _compile(loaded: LoadedSpec) -> tuple[list[Finding], Plan | None]:
    """Every finding of meaning, located (rules, then the planner's errors or warnings), and the plan
    when there is no error. The planner runs once, and only on a spec that passed the rules."""
    found = _located(loaded, list(check_rules(loaded.spec)))
    if any(f.level == "error" for f in found):
        return found, None
    try:
        plan = plan_cluster(loaded.spec)
    except PlanError as exc:
        return found + _located(loaded, exc.findings), None
    return found + _located(loaded, plan.warnings), plan


def cluster_of(loaded: LoadedSpec) -> Cluster:
    """Check the meaning of a spec that passed the syntax layer, plan it once, and compile it.
    Raises SpecError with every error finding, located in the spec's file."""
    found, plan = _compile(loaded)
    if plan is None:
        raise SpecError([f for f in found if f.level == "error"])
    return Cluster(loaded, plan, tuple(found))


def check_meaning(loaded: LoadedSpec) -> list[Finding]:
    """Every finding of meaning, errors and warnings (what `gpucluster check` prints)."""
    return _compile(loaded)[0]


def check_file(path: str | Path) -> tuple[LoadedSpec, list[Finding]]:
    """`gpucluster check`: the spec's syntax layer (raises SpecError) and every finding of meaning."""
    loaded = load_spec(path)
    return loaded, check_meaning(loaded)


def with_slurm_version(loaded: LoadedSpec, version: str) -> LoadedSpec:
    """The spec with slurm.version replaced, before any rule of meaning runs, so every version rule
    judges the override; findings stay located at slurm.version in the file."""
    spec = loaded.spec
    slurm = spec.slurm.model_copy(update={"version": version})
    return loaded.model_copy(update={"spec": spec.model_copy(update={"slurm": slurm})})


def load_cluster(path: str | Path, *, slurm_version: str | None = None) -> Cluster:
    """Read, check and plan a spec file: the one way into gpucluster. Raises SpecError.
    slurm_version: render for this Slurm release instead of the spec's (an upgrade, diffed)."""
    loaded = load_spec(path)
    if slurm_version is not None:
        loaded = with_slurm_version(loaded, slurm_version)
    return cluster_of(loaded)
