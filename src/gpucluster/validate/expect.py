"""What the cluster must look like, computed once from the spec, the plan, the renderer and the inventory.

The checks (checks/*.py) never import gpucluster: they run on the validating machine over SSH and,
with --via-slurm, on the nodes themselves with only python3 + pytest + testinfra. So every expected
value is computed here and handed to them as one JSON document (`Expectations`). Secrets never go in
it: the munge key travels as a SHA-256, slurmdbd's password not at all.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import hostlist

from gpucluster.cluster import Cluster
from gpucluster.errors import UsageError
from gpucluster.render.topology import slurm_switches
from gpucluster.validate.inventory import Inventory
from gpucluster.validate.thresholds import Threshold, as_dict, threshold_for

# Where the roles install things (roles/*/defaults and vars/Debian.yml); a contract with them.
SLURM_CONF_DIR = "/etc/slurm"
MUNGE_KEY = "/etc/munge/munge.key"
SLURMDBD_CONF = "/etc/slurm/slurmdbd.conf"

# Unit names per contract group (Debian's packages).
SERVICES: dict[str, tuple[str, ...]] = {
    "all": ("ssh",),
    "slurm_dbd": ("munge", "mariadb", "slurmdbd"),
    "slurm_controller": ("munge", "slurmctld"),
    "slurm_compute": ("munge", "slurmd"),
    "slurm_login": ("munge",),
    "flash_meta": ("moosefs-master",),
    "flash_chunk": ("moosefs-chunkserver",),
    "nfs_server": ("nfs-ganesha",),
}

# Slurm config files each kind of Slurm host carries (the renderer's names).
SLURM_HOST_GROUPS = ("slurm_controller", "slurm_compute", "slurm_login")

# slurm.conf keys the staging profile changes; any difference is reported, not passed silently.
_CONF_LINE = re.compile(r"^([A-Za-z]+)=(.*)$")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def conf_keys(text: str) -> dict[str, str]:
    """Top-level Key=Value lines of a rendered slurm.conf (node and partition lines excluded)."""
    out = {}
    for line in text.splitlines():
        m = _CONF_LINE.match(line.strip())
        if m and m.group(1) not in ("NodeName", "PartitionName", "SlurmctldHost"):
            out[m.group(1)] = m.group(2)
    return out


def profile_differences(cluster: Cluster) -> list[dict]:
    """slurm.conf settings where the spec's profile differs from production, from the renderer itself."""
    from gpucluster.render.files import render_slurm

    spec = cluster.spec
    if spec.slurm.profile == "production":
        return []
    prod_spec = spec.model_copy(update={"slurm": spec.slurm.model_copy(update={"profile": "production"})})
    prod_cluster = Cluster(cluster.loaded.model_copy(update={"spec": prod_spec}), cluster.plan)
    actual = conf_keys(render_slurm(cluster)["slurm.conf"])
    prod = conf_keys(render_slurm(prod_cluster)["slurm.conf"])
    return [{"key": k, "production": prod.get(k), "rendered": actual.get(k)}
            for k in sorted(set(actual) | set(prod)) if actual.get(k) != prod.get(k)]


@dataclass
class Options:
    limit: str | None = None
    thresholds: list[Threshold] = field(default_factory=list)
    nccl_bytes: str = "8G"
    nccl_binary: str | None = None  # default: the nccl role's build of all_reduce_perf
    run_id: str = ""


def _read_secret_hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def build(inv: Inventory, opts: Options) -> dict:
    """The Expectations document. Raises UsageError when the inventory does not name its spec."""
    from gpucluster.cluster import load_cluster
    from gpucluster.render import nccl_file_for, render_all

    spec_path = inv.vars.get("gpucluster_spec")
    if not spec_path:
        raise UsageError(f"{inv.path}: the inventory has no gpucluster_spec variable; write it with "
                         "`gpucluster inventory SPEC -o DIR` or `gpucluster stage up SPEC`")
    if not Path(spec_path).is_file():
        raise UsageError(f"{inv.path}: gpucluster_spec points to {spec_path}, which does not exist")
    cluster = load_cluster(spec_path)
    spec, plan = cluster.spec, cluster.plan
    rendered = render_all(cluster, cabling=False)
    selected = inv.select(opts.limit)

    contract_groups = [g for g in inv.groups if not g.startswith("nodegroup_")]
    hosts: dict[str, dict] = {}
    for name, h in inv.hosts.items():
        group_name = h.vars.get("gpucluster_node_group")
        try:
            ng = spec.group(group_name) if group_name else None
        except StopIteration:
            raise UsageError(f"{inv.path}: host {name} is in node group '{group_name}', which the spec "
                             f"{spec_path} does not have; regenerate the inventory") from None
        entry = {
            "groups": [g for g in h.groups if g in contract_groups],
            "node_group": group_name,
            "rack": h.vars.get("gpucluster_rack"),
            "leaf": h.vars.get("gpucluster_leaf"),
            "hcas": list(h.vars.get("gpucluster_hcas") or []),
            "ssh": h.ssh(),
        }
        if ng is not None and ng.gpu and ng.gpus_per_node:
            gpu = spec.parts.gpus[ng.gpu]
            t = threshold_for(opts.thresholds, ng.gpu, spec.fabric.type, ng.gpus_per_node)
            entry["gpu"] = {"key": ng.gpu, "vendor": gpu.vendor, "name": gpu.name, "count": ng.gpus_per_node,
                            "slurm_type": gpu.slurm_type, "memory_gb": gpu.memory_gb,
                            "threshold": as_dict(t)}
        if ng is not None and ng.nic and ng.nics_per_node:
            entry["nic"] = {"key": ng.nic, "name": spec.parts.nics[ng.nic].name, "speed_gbps": cluster.nic_speed(ng)}
        hosts[name] = entry

    # Slurm: the files every Slurm host carries, hashed; expected node lines and the topology.
    slurm_files = {n: rendered[n] for n in ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf")
                   if n in rendered}
    nodes = {}
    for g in spec.groups_with_role("compute"):
        gres = cluster.gres(g)
        parts = [p.name for p in spec.slurm.partitions if g.name in p.groups]
        for host in g.hosts:
            nodes[host] = {"gres": gres, "partitions": parts, "node_group": g.name}
    switches = []
    if spec.slurm.topology == "tree":
        # `scontrol show topology` lists, for an upper switch, every node beneath it: compute that too.
        below: dict[str, list[str]] = {}
        for sw in slurm_switches(plan):  # leaves first, then each level above its children
            own = [n for expr in sw.nodes for n in hostlist.expand_hostlist(expr)]
            below[sw.name] = sorted(set(own).union(*(below.get(c, []) for c in sw.switches)))
            switches.append({"name": sw.name, "level": sw.level, "nodes": sorted(own),
                             "nodes_below": below[sw.name], "switches": sorted(sw.switches)})

    from gpucluster.validate.roledata import SYSCTL_FILE, nccl_paths, role_expectations

    paths = nccl_paths(inv.vars)
    nccl = {}
    for g in spec.gpu_groups:
        if g.role != "compute":
            continue
        conf_name, env_name = nccl_file_for(cluster, g)
        nccl[g.name] = {"conf": {"path": paths["conf"], "name": conf_name, "sha256": sha256_text(rendered[conf_name]),
                                 "text": rendered[conf_name]},
                        "env": {"path": paths["env"], "name": env_name, "sha256": sha256_text(rendered[env_name]),
                                "text": rendered[env_name]}}

    storage = cluster.storage
    flash = None
    if storage["flash"]:
        f = storage["flash"]
        flash = {"name": f["name"], "mount": f["mount"], "unit": f["unit"], "master": f["master"],
                 "clients": inv.group("flash_client")}
    nfs = [{"name": t["name"], "server": t["server"], "servers": t["servers"],
            "exports": [{k: e[k] for k in ("path", "mount", "options", "unit")} for e in t["exports"]]}
           for t in storage["nfs"]]

    packages, sysctls, notes = role_expectations(inv.vars)
    roce = spec.fabric.roce
    secrets = inv.vars.get("gpucluster_secrets_dir")
    munge_ref = _read_secret_hash(Path(secrets) / "munge.key") if secrets else None

    return {
        "version": 1,
        "run_id": opts.run_id or time.strftime("%Y%m%d-%H%M%S"),
        "cluster": spec.name,
        "spec": str(spec_path),
        "inventory": str(inv.path),
        "staged": bool(inv.vars.get("gpucluster_staged")),
        "selected": selected,
        "groups": {g: inv.group(g) for g in contract_groups if inv.group(g)},
        "hosts": hosts,
        "slurm": {
            "version": spec.slurm.version,
            "munge_groups": ["slurm_dbd", "slurm_controller", "slurm_compute", "slurm_login"],
            "conf_dir": SLURM_CONF_DIR,
            "profile": spec.slurm.profile,
            "profile_differences": profile_differences(cluster),
            "files": {n: {"sha256": sha256_text(t), "text": t} for n, t in slurm_files.items()},
            "host_groups": list(SLURM_HOST_GROUPS),
            "nodes": nodes,
            "switches": switches,
            "topology": spec.slurm.topology,
            "accounting": spec.slurm.accounting,
            "dbd_conf": SLURMDBD_CONF,
            "ctld_log": conf_keys(rendered["slurm.conf"]).get("SlurmctldLogFile", "/var/log/slurm/slurmctld.log"),
        },
        "services": {g: list(s) for g, s in SERVICES.items()},
        "packages": packages,
        "sysctls": sysctls,
        "sysctl_file": SYSCTL_FILE,
        "notes": notes,
        "munge": {"key": MUNGE_KEY, "key_sha256": munge_ref,
                  "reference": "secrets dir" if munge_ref else None},
        "nccl": nccl,
        "flash": flash,
        "nfs": nfs,
        "fabric": {"type": spec.fabric.type,
                   "roce": {"dscp": roce.dscp, "pfc_priority": roce.pfc_priority, "mtu": roce.mtu,
                            "link_mtu": roce.link_mtu, "trust": "dscp"}},
        "nccl_test": {"bytes": opts.nccl_bytes,
                      "binary": opts.nccl_binary or f"{paths['tests_dir']}/build/all_reduce_perf"},
    }


def write(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False))
    path.chmod(0o644)
    return path
