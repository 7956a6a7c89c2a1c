"""The change set between two specs: every rendered file and compiled fact compared, each difference with
the hosts it touches and the least disruptive way to apply it (docs/operations.md, "What a change disrupts").

Both specs go through `load_cluster` and `render_all`, and their compiled facts are built the way
`compiled.compile_to` builds them, so every file a role installs is covered. slurm.conf is compared key by
key, and each key's class comes from gpucluster.slurmkeys for the NEW spec's Slurm release (the release the
change is applied to). Classes, least disruptive first:

    none               copy the file; nothing running reads it again (new jobs, the next health run do)
    reconfigure        scontrol reconfigure: running jobs keep running
    restart-slurmctld  restart the controller's daemon (slurmctld, or slurmdbd): jobs keep running
    restart-slurmd     restart slurmd on the nodes (slurmctld first where both are named): jobs keep running
    drain              drain the nodes, wait for their jobs, apply (packages, mounts, storage services), resume
    reboot             drain, then reboot (driver, kernel, kernel parameters, fabric mode)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from gpucluster import slurmkeys, slurmtext
from gpucluster.cluster import Cluster, load_cluster
from gpucluster.compiled import facts
from gpucluster.render import render_all

NONE, RECONFIGURE, RESTART_SLURMCTLD, RESTART_SLURMD, DRAIN, REBOOT = (
    "none", "reconfigure", "restart-slurmctld", "restart-slurmd", "drain", "reboot")
CLASSES = (NONE, RECONFIGURE, RESTART_SLURMCTLD, RESTART_SLURMD, DRAIN, REBOOT)
CONTRACT = 1  # the --json contract's version (docs/operations.md); bumped on any incompatible change

SLURM_GROUPS = ("slurm_controller", "slurm_compute", "slurm_login")
CTLD = ("slurm_controller",)
SLURMD = ("slurm_compute",)
# Configless Slurm (docs/roles.md): slurmctld serves these files to every slurmd; only the hosts that hold them
# (controllers and login nodes) get a copy, and a compute node is visited only for a slurmd restart.
SERVED = ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf", "topology.yaml", "oci.conf", "plugstack.conf")
HOLDERS = ("slurm_controller", "slurm_login")

# Where the classes of files other than slurm.conf come from.
TOPOLOGY_SOURCE = ('topology.conf(5) 22.05.8, 24.11.5, 26.05.5: "Changes to the configuration file take effect upon '
                   'restart of Slurm daemons, daemon receipt of the SIGHUP signal, or execution of the command '
                   '"scontrol reconfigure" unless otherwise noted." (no note follows)')
GRES_CORES = ('gres.conf(5) 22.05.8, 24.11.5, 26.05.5: "A restart of the slurmctld is needed for changes to the '
              'Cores option"')
GRES_TYPE_22 = ('gres.conf(5) 22.05.8: "A restart of the slurmctld and slurmd daemons is required for changes to '
                'the Type option to take effect."')
GRES_TYPE_24 = ('gres.conf(5) 24.11.5: "For changes to the Type option to take effect with a scontrol reconfig all '
                'affected slurmd daemons must be responding to the slurmctld."')
OCI_SOURCE = ('oci.conf(5) 22.05.8-26.05: "Changes to the configuration file take effect upon restart of Slurm '
              'daemons." slurmctld serves it (configless), so it restarts first')
SPANK_SOURCE = ('spank(8) 22.05.8-26.05: "Plugins loaded in slurmd context persist for the entire time slurmd is '
                'running, so if configuration is changed or plugins are updated, slurmd must be restarted for the '
                'changes to take effect." srun (local context) reads plugstack.conf at each run')
PARTITION_REMOVED = ('slurm.conf(5) 22.05.8-26.05.5: "If a partition that is in use is deleted from the configuration '
                     'and slurm is restarted or reconfigured (scontrol reconfigure), jobs using the partition are '
                     'canceled."')


@dataclass(frozen=True)
class Change:
    """One difference. `what` says it for a person; `target` is the rendered file (or the fact) it is in."""

    what: str
    kind: str  # slurm-key | slurm-nodes | slurm-partition | file | hosts | slurm-version | driver | fabric
    target: str
    cls: str
    action: str
    groups: tuple[str, ...]
    hosts: tuple[str, ...]
    old: str | None = None
    new: str | None = None
    source: str = ""

    def as_json(self) -> dict:
        return {"what": self.what, "kind": self.kind, "target": self.target, "class": self.cls,
                "action": self.action, "groups": list(self.groups), "hosts": list(self.hosts),
                "old": self.old, "new": self.new, "source": self.source}


@dataclass(frozen=True)
class DiffResult:
    old: str
    new: str
    old_version: str
    new_version: str
    changes: tuple[Change, ...] = field(default=())

    @property
    def cls(self) -> str:
        """The whole change set's class: its most disruptive change ("none" when nothing changes)."""
        return max((c.cls for c in self.changes), key=CLASSES.index, default=NONE)

    def as_json(self) -> dict:
        return {"contract": CONTRACT, "old": self.old, "new": self.new,
                "slurm_version": {"old": self.old_version, "new": self.new_version}, "class": self.cls,
                "classes": list(CLASSES), "changes": [c.as_json() for c in self.changes]}


def diff_specs(old: str | Path, new: str | Path, rotate: str | None = None) -> DiffResult:
    """The change set between two specs; `rotate` (configure --rotate's value) adds the secrets to replace."""
    from gpucluster.configure.playbook import rotated_secrets

    names = rotated_secrets(rotate)  # bad names are refused before either spec is read
    result = diff_clusters(load_cluster(old), new_cluster := load_cluster(new))
    return replace(result, changes=result.changes + rotation_changes(new_cluster, names)) if names else result


# What replacing each secret disrupts (configure --rotate NAME; docs/roles.md, "Rotating a secret").
ROTATION = {
    "munge": (RESTART_SLURMD, ("slurm_dbd", *SLURM_GROUPS),
              "install the new key and restart munged on every Slurm host in one run (no --batch, no --limit): "
              "until every host has it, messages between hosts with different keys fail authentication; running "
              "jobs keep running"),
    "slurmdbd": (RESTART_SLURMCTLD, ("slurm_dbd",),
                 "set MariaDB's password and restart slurmdbd; slurmctld queues accounting records meanwhile"),
    "signing": (NONE, ("all",),
                "rewrite every node's allowed_signers; a pointer signed with the old key is refused from then on"),
}


def rotation_changes(cluster: Cluster, names: list[str]) -> tuple[Change, ...]:
    """One change per secret `configure --rotate` replaces, on the hosts that hold it."""
    out = []
    for name in names:
        cls, groups, action = ROTATION[name]
        hosts = (tuple(dict.fromkeys(g.hostlist for g in cluster.spec.node_groups)) if groups == ("all",)
                 else _hosts(cluster, groups))
        out.append(Change(f"rotate the {name} secret", "secret", f"secret.{name}", cls,
                          f"configure --secrets FILE --rotate {name}: {action}", groups, hosts))
    return tuple(out)


def diff_clusters(old: Cluster, new: Cluster) -> DiffResult:
    ro, rn = _rendered(old), _rendered(new)
    fo, fn = facts(old, ro), facts(new, rn)
    version = new.spec.slurm.version
    changes: list[Change] = []
    changes += _hosts_changes(old, new)
    if old.spec.slurm.version != version:
        changes.append(Change(
            f"Slurm {old.spec.slurm.version} -> {version}", "slurm-version", "slurm.version", DRAIN,
            "upgrade the packages in Slurm's order: slurmdbd, then slurmctld, then slurmd on drained nodes",
            ("slurm_dbd", *SLURM_GROUPS), _hosts(new, ("slurm_dbd", *SLURM_GROUPS)),
            old.spec.slurm.version, version, "Slurm's upgrade guide: slurmdbd first, then slurmctld, then slurmd"))
    changes += _driver_changes(new, fo["drivers"], fn["drivers"])
    if fo["fabric"] != fn["fabric"]:
        changes.append(Change("fabric settings", "fabric", "facts.fabric", REBOOT,
                              "drain, apply the fabric role, reboot (NIC mode and kernel modules)",
                              ("fabric_ib", "fabric_roce"), _hosts(new, ("fabric_ib", "fabric_roce"))))
    owners = _file_owners(fo, fn, ro, rn)
    for name in sorted(set(ro) | set(rn)):
        a, b = ro.get(name), rn.get(name)
        if a == b:
            continue
        changes += _file_changes(name, a or "", b or "", old, new, version, owners.get(name, ()))
    if _configless(rn.get("slurm.conf", "")):
        changes = [_served(c, new) for c in changes]
    return DiffResult(str(old.source), str(new.source), old.spec.slurm.version, version, tuple(changes))


# ---- hosts ----------------------------------------------------------------------------------------------------

def _hosts(cluster: Cluster, groups: tuple[str, ...]) -> tuple[str, ...]:
    """The hostlist expressions (one per node group) of the contract groups given."""
    out: list[str] = []
    covered: set[str] = set()
    for g in cluster.spec.node_groups:
        if set(cluster.memberships(g)) & set(groups) and g.hostlist not in out:
            out.append(g.hostlist)
            covered.update(g.hosts)
    if "slurm_dbd" in groups and cluster.dbd_host and cluster.dbd_host not in covered:
        out.append(cluster.dbd_host)
    return tuple(out)


def _group_hosts(cluster: Cluster, node_groups) -> tuple[str, ...]:
    names = set(node_groups)
    return tuple(g.hostlist for g in cluster.spec.node_groups if g.name in names)


def _hosts_changes(old: Cluster, new: Cluster) -> list[Change]:
    before, after = set(old.hosts), set(new.hosts)
    out = []
    added = [h for h in new.hosts if h not in before]
    removed = [h for h in old.hosts if h not in after]
    if added:
        out.append(Change(f"{len(added)} hosts added", "hosts", "inventory", NONE,
                          "enrol and converge the new hosts while out of service; then Slurm learns of them "
                          "(the slurm.conf node change below)", (), tuple(added)))
    if removed:
        out.append(Change(f"{len(removed)} hosts removed", "hosts", "inventory", DRAIN,
                          "drain the hosts and wait for their jobs before they leave slurm.conf", (), tuple(removed)))
    return out


# ---- facts ------------------------------------------------------------------------------------------------------

_REBOOT_DRIVER = ("vendor", "gpu", "source", "branch")


def _driver_changes(new: Cluster, old: dict, cur: dict) -> list[Change]:
    out = []
    for group in sorted(set(old) | set(cur)):
        a, b = old.get(group), cur.get(group)
        if a == b:
            continue
        a, b = a or {}, b or {}
        driver = (a.get("pins") or {}).get("driver") != (b.get("pins") or {}).get("driver") or any(
            a.get(k) != b.get(k) for k in _REBOOT_DRIVER)
        cls = REBOOT if driver else DRAIN
        action = ("drain, install the driver, reboot (the kernel module is loaded at boot)" if driver else
                  "drain, install the packages (toolkit, repositories), resume")
        out.append(Change(f"GPU stack of {group}", "driver", f"facts.drivers.{group}", cls, action,
                          (), _group_hosts(new, [b.get("group") or a.get("group") or group]),
                          _stack_word(a), _stack_word(b)))
    return out


def _stack_word(stack: dict) -> str | None:
    if not stack:
        return None
    pin = ((stack.get("pins") or {}).get("driver") or {}).get("version")
    return " ".join(str(x) for x in (stack.get("vendor"), stack.get("branch"), pin) if x)


def _file_owners(fo: dict, fn: dict, ro: dict, rn: dict) -> dict[str, tuple[str, str]]:
    """Rendered file -> (purpose, node group) from the compiled facts: storage, RoCE QoS, NCCL files."""
    out: dict[str, tuple[str, str]] = {}
    for doc in (fo, fn):
        for group, purposes in doc["files"].items():
            for purpose, names in purposes.items():
                for name in [names] if isinstance(names, str) else names:
                    out.setdefault(name, (purpose, group))
        for group, nccl in doc["nccl"].items():
            out.setdefault(nccl["conf_name"], ("nccl", group))
            out.setdefault(nccl["env_name"], ("nccl", group))
    return out


# ---- rendered files ----------------------------------------------------------------------------------------------

def _rendered(cluster: Cluster) -> dict[str, str]:
    return {name: (v if isinstance(v, str) else "".join(v())) for name, v in
            render_all(cluster, cabling=False).items()}


_STORAGE = {
    "flash_mount": (DRAIN, ("flash_client",), "drain the clients, remount the flash tier, resume"),
    "nfs_mounts": (DRAIN, ("nfs_client",), "drain the clients, remount, resume"),
    "moosefs_master": (DRAIN, ("flash_meta", "flash_client"),
                       "restart mfsmaster: the clients' I/O stalls meanwhile, so drain them first"),
    "moosefs_metalogger": (NONE, ("flash_meta",), "restart mfsmetalogger (clients do not use it)"),
    "moosefs_chunkserver": (DRAIN, ("flash_chunk", "flash_client"),
                            "restart the chunkservers: the clients' I/O stalls meanwhile, so drain them first"),
    "ganesha": (DRAIN, ("nfs_server", "nfs_client"),
                "restart nfs-ganesha: the clients' I/O stalls meanwhile, so drain them first"),
    "roce_qos": (DRAIN, ("fabric_roce",), "drain, apply the QoS to the NICs (RDMA traffic pauses), resume"),
}


def _file_changes(name: str, a: str, b: str, old: Cluster, new: Cluster, version: str,
                  owner: tuple[str, str] | tuple) -> list[Change]:
    if name == "slurm.conf":
        return _slurm_conf(a, b, old, new, version)
    what = f"{name} {'added' if not a else 'removed' if not b else 'changed'}"

    def change(cls, action, groups, hosts=None, source=""):
        return [Change(what, "file", name, cls, action, groups, hosts if hosts is not None else
                       _hosts(new if b else old, groups), source=source)]

    if name in ("topology.conf", "topology.yaml"):
        return change(RECONFIGURE, "copy, then scontrol reconfigure", CTLD + SLURMD, source=TOPOLOGY_SOURCE)
    if name == "gres.conf":
        return _gres(a, b, new, version)
    if name == "cgroup.conf":
        return change(RESTART_SLURMD, "copy, then restart slurmd (read at start)", SLURMD,
                      source="read by slurmd at start (the slurm_common role's rule)")
    if name == "slurmdbd.conf":
        return change(RESTART_SLURMCTLD, "copy, then restart slurmdbd on the accounting host", ("slurm_dbd",))
    if name in ("oci.conf", "plugstack.conf") or name.startswith("pyxis.") or name in (
            "enroot.conf", "apt-enroot-pyxis.pref"):
        return _container_change(name, what, new if b else old)
    if owner and owner[0] == "nccl":
        return change(NONE, "copy; jobs started afterwards read it", (), _group_hosts(new, [owner[1]]))
    if owner and owner[0] in _STORAGE:
        cls, groups, action = _STORAGE[owner[0]]
        return change(cls, action, groups)
    if name.startswith(("gpucluster-health", "health-config")):
        return change(NONE, "copy; the next health run reads it", SLURMD)
    if name in ("plan.json", "bom.csv"):
        return change(NONE, "documentation only: nothing is installed", (), ())
    if name.startswith(("prometheus", "grafana-")):
        return change(NONE, "copy to the Prometheus server, import into Grafana: no node reads it", (), ())
    if name == "slurm-metrics.json" or name.startswith("gpucluster-slurm-metrics."):
        return change(NONE, "copy to the controller; the Slurm exporter's next run reads it", CTLD)
    return change(DRAIN, "not known to diff: treated as a package or mount change", SLURM_GROUPS)


def _container_change(name: str, what: str, cluster: Cluster) -> list[Change]:
    """The container files (render/containers.py): Slurm's two are served and read at daemon start; enroot reads
    its configuration at each container start; the pins move packages, which running container jobs use."""
    from gpucluster.render.containers import arch_of, pyxis_file
    from gpucluster.spec import jobcontainers

    spec = cluster.spec
    pyxis = [g.name for g in spec.node_groups if jobcontainers.enroot_pyxis(spec, g)]
    if name == "oci.conf":
        return [Change(what, "file", name, RESTART_SLURMD, "copy to the controllers, then restart slurmctld (it "
                       "serves the file) and slurmd: running jobs keep running", CTLD + SLURMD,
                       _hosts(cluster, CTLD + SLURMD), source=OCI_SOURCE)]
    if name == "plugstack.conf":
        return [Change(what, "file", name, RESTART_SLURMD, "copy to the controllers and login nodes, then restart "
                       "slurmctld (it serves the file) and slurmd: running jobs keep running", SLURM_GROUPS,
                       _hosts(cluster, SLURM_GROUPS), source=SPANK_SOURCE)]
    if name.startswith("pyxis."):
        groups = [g for g in pyxis if pyxis_file(arch_of(spec, spec.group(g))) == name]
        return [Change(what, "file", name, RESTART_SLURMD, "copy to plugstack.conf.d, then restart slurmd: running "
                       "jobs keep running", SLURMD, _group_hosts(cluster, groups), source=SPANK_SOURCE)]
    if name == "enroot.conf":
        return [Change(what, "file", name, NONE, "copy; enroot reads it at each container start", (),
                       _group_hosts(cluster, pyxis))]
    return [Change(what, "file", name, DRAIN, "drain, move the pins, install the locked enroot and pyxis (running "
                   "container jobs use them), resume", SLURMD, _group_hosts(cluster, pyxis))]


def _gres(a: str, b: str, new: Cluster, version: str) -> list[Change]:
    def fields(text: str, key: str) -> list[str]:
        return sorted(r.get(key, "") for r in slurmtext.records(text, "NodeName") + slurmtext.records(text, "Name"))

    groups = CTLD + SLURMD
    hosts = _hosts(new, groups)
    if fields(a, "Cores") != fields(b, "Cores"):
        return [Change("gres.conf Cores changed", "file", "gres.conf", RESTART_SLURMCTLD,
                       "copy, then restart slurmctld", groups, hosts, source=GRES_CORES)]
    if fields(a, "Type") != fields(b, "Type") and _before_2311(version):
        return [Change("gres.conf Type changed", "file", "gres.conf", RESTART_SLURMD,
                       "copy, then restart slurmctld and every slurmd", groups, hosts, source=GRES_TYPE_22)]
    return [Change("gres.conf changed", "file", "gres.conf", RECONFIGURE, "copy, then scontrol reconfigure",
                   groups, hosts, source=GRES_TYPE_24 if not _before_2311(version) else TOPOLOGY_SOURCE)]


def _configless(slurm_conf: str) -> bool:
    flags = slurmtext.all_settings(slurm_conf).get("slurmctldparameters", ())
    return any("enable_configless" in str(f).split(",") for f in flags)


def _served(change: Change, new: Cluster) -> Change:
    """A copy-only change (none, reconfigure) to a file slurmctld serves reaches slurmd without a visit: the
    copy goes to the holders only. A restart or a drain still visits the compute nodes."""
    if change.target not in SERVED or change.cls not in (NONE, RECONFIGURE) or not set(change.groups) - set(HOLDERS):
        return change
    groups = tuple(g for g in change.groups if g in HOLDERS) or HOLDERS[:1]
    action = change.action.replace("copy", "copy to the controllers (slurmd reads the served file)", 1)
    return replace(change, groups=groups, hosts=_hosts(new, groups), action=action)


def _before_2311(version: str) -> bool:
    return tuple(int(x) for x in version.split(".")) < (23, 11)


# ---- slurm.conf, key by key -----------------------------------------------------------------------------------

_CLASS_OF_KEY = {slurmkeys.RECONFIGURE: (RECONFIGURE, SLURM_GROUPS, "copy, then scontrol reconfigure"),
                 slurmkeys.RESTART_SLURMCTLD: (RESTART_SLURMCTLD, CTLD, "copy, then restart slurmctld"),
                 slurmkeys.RESTART_SLURMD: (RESTART_SLURMD, SLURMD, "copy, then restart slurmd on every node"),
                 slurmkeys.RESTART: (RESTART_SLURMD, CTLD + SLURMD,
                                     "copy, then restart slurmctld, then slurmd on every node")}


def _slurm_conf(a: str, b: str, old: Cluster, new: Cluster, version: str) -> list[Change]:
    out: list[Change] = []
    sa, sb = slurmtext.all_settings(a), slurmtext.all_settings(b)
    for low in sorted(set(sa) | set(sb)):
        if sa.get(low) == sb.get(low):
            continue
        entry = slurmkeys.key(low)
        name = entry.name if entry else next(
            line.split("=", 1)[0].strip() for line in (b or a).splitlines() + a.splitlines()
            if line.split("=", 1)[0].strip().lower() == low)
        was, now = ",".join(sa.get(low, ())) or None, ",".join(sb.get(low, ())) or None
        key_cls, source = slurmkeys.value_change_class(name, was, now, version)
        cls, groups, action = _CLASS_OF_KEY[key_cls]
        if entry and entry.loses_jobs:
            cls, groups, source = DRAIN, CTLD + SLURMD, entry.loses_jobs
            action = "drain every node and wait for every job to end (it would be lost), then " + action
        out.append(Change(f"slurm.conf {name}", "slurm-key", "slurm.conf", cls, action, groups,
                          _hosts(new, groups), was, now, source))
    na, nb = _records(a, "NodeName"), _records(b, "NodeName")
    if na != nb:
        cls, groups, action = _CLASS_OF_KEY[slurmkeys.change_class("NodeName", version)]
        out.append(Change("slurm.conf node definitions (NodeName lines)", "slurm-nodes", "slurm.conf", cls, action,
                          groups, _hosts(new, groups), "; ".join(sorted(set(na) - set(nb))) or None,
                          "; ".join(sorted(set(nb) - set(na))) or None, slurmkeys.key("NodeName").source))
    pa, pb = _partitions(a), _partitions(b)
    for part in sorted(set(pa) | set(pb)):
        if pa.get(part) == pb.get(part):
            continue
        if part not in pb:
            out.append(Change(f"partition {part} removed", "slurm-partition", "slurm.conf", DRAIN,
                              f"scontrol update PartitionName={part} State=DRAIN, wait for its jobs, then copy and "
                              "scontrol reconfigure (a partition removed under running jobs cancels them)",
                              CTLD, _hosts(new, CTLD), pa[part], None, PARTITION_REMOVED))
        else:
            out.append(Change(f"partition {part} {'added' if part not in pa else 'changed'}", "slurm-partition",
                              "slurm.conf", RECONFIGURE, "copy, then scontrol reconfigure", SLURM_GROUPS,
                              _hosts(new, SLURM_GROUPS), pa.get(part), pb[part], slurmkeys.UNLESS_NOTED))
    if not out:
        out.append(Change("slurm.conf comments", "file", "slurm.conf", NONE, "copy; no setting changed", (), ()))
    return out


def _records(text: str, kind: str) -> list[str]:
    return sorted(" ".join(f"{k}={v}" for k, v in r.items()) for r in slurmtext.records(text, kind))


def _partitions(text: str) -> dict[str, str]:
    return {r["PartitionName"]: " ".join(f"{k}={v}" for k, v in r.items())
            for r in slurmtext.records(text, "PartitionName")}
