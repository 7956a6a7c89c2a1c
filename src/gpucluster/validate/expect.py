"""What the cluster must look like, computed once from the spec, the plan, the renderer and the inventory.

The checks (checks/*.py) never import gpucluster: they run on the validating machine over SSH and,
with --via-slurm, on the nodes themselves with only python3 + pytest + testinfra. So every expected
value is computed here and handed to them as one JSON document (`Expectations`). Secrets never go in
it: the munge key travels as a SHA-256, slurmdbd's password not at all.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import hostlist

from gpucluster import slurmtext
from gpucluster.cluster import CONTRACT_GROUPS
from gpucluster.errors import UsageError
from gpucluster.inventory.reader import Inventory
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

def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Options:
    limit: str | None = None
    thresholds: list[Threshold] = field(default_factory=list)
    nccl_bytes: str = "8G"
    nccl_binary: str | None = None  # default: the nccl role's build of all_reduce_perf
    run_id: str = ""
    # Probes that start a second slurmd with a foreign munge key on a compute node: harmless, but not
    # something to run on a production node unasked (gpucluster validate --probes).
    probes: bool = False


def _read_secret_hash(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _spec_path(inv: Inventory) -> str:
    """The spec the inventory names, which must exist: everything expected is computed from it."""
    spec_path = inv.vars.get("gpucluster_spec")
    if not spec_path:
        raise UsageError(f"{inv.path}: the inventory has no gpucluster_spec variable; write it with "
                         "`gpucluster inventory SPEC -o DIR` or `gpucluster stage up SPEC`")
    if not Path(spec_path).is_file():
        raise UsageError(f"{inv.path}: gpucluster_spec points to {spec_path}, which does not exist")
    return spec_path


def _hosts(inv: Inventory, opts: Options, node_groups: dict, fabric_type: str, spec_path: str) -> dict[str, dict]:
    """Per inventory host: its contract groups, place in the fabric, HCAs, SSH address and, from its node
    group, the GPUs (with their threshold) and NIC it must have. Raises UsageError for a node group the
    spec does not have."""
    hosts: dict[str, dict] = {}
    for name, h in inv.hosts.items():
        group_name = h.vars.get("gpucluster_node_group")
        if group_name and group_name not in node_groups:
            raise UsageError(f"{inv.path}: host {name} is in node group '{group_name}', which the spec "
                             f"{spec_path} does not have; regenerate the inventory")
        ng = node_groups.get(group_name) if group_name else None
        entry = {
            "groups": [g for g in h.groups if g in CONTRACT_GROUPS],
            "node_group": group_name,
            "rack": h.vars.get("gpucluster_rack"),
            "leaf": h.vars.get("gpucluster_leaf"),
            # The HCAs are a compiled fact (facts.json), never an inventory variable (docs/architecture.md).
            "hcas": list((ng or {}).get("nic", {}).get("hcas") or []) if "fabric_ib" in h.groups
            or "fabric_roce" in h.groups else [],
            "ssh": h.ssh(),
        }
        if ng is not None and "gpu" in ng:
            gpu = ng["gpu"]
            t = threshold_for(opts.thresholds, gpu["key"], fabric_type, gpu["count"])
            entry["gpu"] = {**{k: gpu[k] for k in ("key", "vendor", "name", "count", "slurm_type", "memory_gb")},
                            "threshold": as_dict(t)}
        if ng is not None and "nic" in ng:
            entry["nic"] = {k: ng["nic"][k] for k in ("key", "name", "speed_gbps")}
        hosts[name] = entry
    return hosts


def _switches(planned: list[dict]) -> list[dict]:
    """The topology's switches as `scontrol show topology` lists them: for an upper switch, every node
    beneath it too."""
    switches = []
    below: dict[str, list[str]] = {}
    for sw in planned:  # leaves first, then each level above its children
        own = [n for expr in sw["nodes"] for n in hostlist.expand_hostlist(expr)]
        below[sw["name"]] = sorted(set(own).union(*(below.get(c, []) for c in sw["switches"])))
        switches.append({"name": sw["name"], "level": sw["level"], "nodes": sorted(own),
                         "nodes_below": below[sw["name"]], "switches": sorted(sw["switches"])})
    return switches


def _blocks(rendered: dict[str, str], topology: str) -> dict | None:
    """topology/block as the rendered topology file hands it to slurmctld (the plan's NVLink domains, or its
    units, as render/topology.py translates them): the base blocks with their nodes, BlockSizes, and the
    aggregated blocks slurmctld builds from them. None on any other topology. Aggregation as slurmctld 24.11
    and 26.05 do it (docs/validate.md): for each size after the first, every complete run of size/base
    consecutive base blocks, from the first; a trailing run too short is not aggregated."""
    if topology != "block":
        return None
    if "topology.yaml" in rendered:
        import yaml

        entries = yaml.safe_load(rendered["topology.yaml"]) or []
        block = next(e["block"] for e in entries if "block" in e and e.get("cluster_default"))
        base = [{"name": b["block"], "nodes": sorted(hostlist.expand_hostlist(b["nodes"]))} for b in block["blocks"]]
        sizes, source = [int(s) for s in block.get("block_sizes") or []], "topology.yaml"
    else:
        text = rendered["topology.conf"]
        base = [{"name": r["BlockName"], "nodes": sorted(hostlist.expand_hostlist(r["Nodes"]))}
                for r in slurmtext.records(text, "BlockName")]
        sizes_text = slurmtext.settings(text).get("BlockSizes", "")
        sizes, source = [int(s) for s in sizes_text.split(",") if s], "topology.conf"
    aggregated = []
    for size in sizes[1:]:
        k = size // sizes[0]
        for i in range(0, len(base) - k + 1, k):
            run = base[i:i + k]
            names = [b["name"] for b in run]
            aggregated.append({"name": hostlist.collect_hostlist(names), "members": names, "size": size})
    return {"file": source, "blocks": base, "sizes": sizes, "aggregated": aggregated}


def _nccl(groups: dict, rendered: dict[str, str], paths: dict[str, str]) -> dict:
    """Per node group: where its NCCL config and environment files go, and their rendered text and hash."""
    nccl = {}
    for g, entry in groups.items():
        conf_name, env_name = entry["conf_name"], entry["env_name"]
        nccl[g] = {"conf": {"path": paths["conf"], "name": conf_name, "sha256": sha256_text(rendered[conf_name]),
                            "text": rendered[conf_name]},
                   "env": {"path": paths["env"], "name": env_name, "sha256": sha256_text(rendered[env_name]),
                           "text": rendered[env_name]}}
    return nccl


def _storage(storage: dict, inv: Inventory) -> tuple[dict | None, list[dict]]:
    """The flash file system (None without one), with the hosts that mount it, and the NFS targets."""
    flash = None
    if storage["flash"]:
        f = storage["flash"]
        flash = {"name": f["name"], "mount": f["mount"], "unit": f["unit"], "master": f["master"],
                 "clients": inv.group("flash_client")}
    nfs = [{"name": t["name"], "server": t["server"], "servers": t["servers"],
            "exports": [{k: e[k] for k in ("path", "mount", "options", "unit")} for e in t["exports"]]}
           for t in storage["nfs"]]
    return flash, nfs


def _containers(facts: dict, hosts: dict[str, dict], selected: list[str], flash_clients: list[str]) -> dict:
    """Per node group with Slurm's OCI support on: its selected hosts, in inventory order, and the flash tier's
    container folder where every one of them mounts it (else None: the job's bundle needs a tier both nodes see)."""
    ct = facts.get("containers") or {}
    out = {}
    for g, entry in (ct.get("groups") or {}).items():
        if not entry.get("oci"):
            continue
        members = [h for h in selected if hosts.get(h, {}).get("node_group") == g]
        shared = bool(members) and set(members) <= set(flash_clients)
        out[g] = {"hosts": members, "flash_dir": ct.get("flash_dir") if shared else None}
    return out


def _slurm(slurm: dict, slurm_files: dict[str, str], switches: list[dict], rendered: dict[str, str]) -> dict:
    """The Slurm part: version, profile, config files with their hashes, node lines, topology, accounting
    and where slurmctld logs."""
    return {
        "version": slurm["version"],
        "munge_groups": ["slurm_dbd", "slurm_controller", "slurm_compute", "slurm_login"],
        "conf_dir": SLURM_CONF_DIR,
        "profile": slurm["profile"],
        "profile_differences": slurm["profile_differences"],
        "files": {n: {"sha256": sha256_text(t), "text": t} for n, t in slurm_files.items()},
        "host_groups": list(SLURM_HOST_GROUPS),
        "nodes": slurm["nodes"],
        "switches": switches,
        "blocks": _blocks(rendered, slurm["topology"]),
        "topology": slurm["topology"],
        "accounting": slurm["accounting"],
        "dbd_conf": SLURMDBD_CONF,
        "ctld_log": slurmtext.settings(rendered["slurm.conf"]).get("SlurmctldLogFile",
                                                                   "/var/log/slurm/slurmctld.log"),
    }


def build(inv: Inventory, opts: Options, *, state_dir: str | None = None) -> dict:
    """The Expectations document, from the compiled cluster (compiled now only when the spec changed
    since: validate after configure parses nothing) and the inventory. Raises UsageError when the
    inventory does not name its spec."""
    from gpucluster.compiled import ensure_compiled
    from gpucluster.inventory.statedir import state_dirs

    spec_path = _spec_path(inv)
    state, secrets = state_dirs(inv.vars, state_dir)
    compiled, _now = ensure_compiled(spec_path, state)
    facts = json.loads((compiled / "facts.json").read_text())
    rendered = {p.name: p.read_text() for p in (compiled / "rendered").iterdir()}
    selected = inv.select(opts.limit)
    node_groups = facts["node_groups"]
    fabric_type = facts["fabric"]["type"]
    hosts = _hosts(inv, opts, node_groups, fabric_type, spec_path)

    # Slurm: the files every Slurm host carries, hashed; expected node lines and the topology.
    slurm = facts["slurm"]
    slurm_files = {n: rendered[n] for n in slurm["files"]}
    switches = _switches(slurm["switches"])

    from gpucluster.validate.roledata import SYSCTL_FILE, nccl_paths, role_expectations

    paths = nccl_paths(inv.vars)
    nccl = _nccl(facts["nccl"], rendered, paths)
    flash, nfs = _storage(facts["storage"], inv)

    packages, sysctls, notes = role_expectations(inv.vars)
    roce = facts["fabric"]["roce"]
    munge_ref = _read_secret_hash(Path(secrets) / "munge.key")

    return {
        "version": 1,
        "run_id": opts.run_id or time.strftime("%Y%m%d-%H%M%S"),
        "cluster": facts["cluster"],
        "spec": str(spec_path),
        "inventory": str(inv.path),
        "probes": opts.probes,
        "selected": selected,
        "groups": {g: inv.group(g) for g in CONTRACT_GROUPS if inv.group(g)},
        "hosts": hosts,
        "slurm": _slurm(slurm, slurm_files, switches, rendered),
        "services": {g: list(s) for g, s in SERVICES.items()},
        "packages": packages,
        "sysctls": sysctls,
        "sysctl_file": SYSCTL_FILE,
        "notes": notes,
        "munge": {"key": MUNGE_KEY, "key_sha256": munge_ref,
                  "reference": "secrets dir" if munge_ref else None},
        "nccl": nccl,
        "containers": _containers(facts, hosts, selected, inv.group("flash_client")),
        "flash": flash,
        "nfs": nfs,
        "fabric": {"type": fabric_type,
                   "roce": {"dscp": roce["dscp"], "pfc_priority": roce["pfc_priority"], "mtu": roce["mtu"],
                            "link_mtu": roce["link_mtu"], "trust": "dscp"}},
        "nccl_test": {"bytes": opts.nccl_bytes,
                      "binary": opts.nccl_binary or f"{paths['tests_dir']}/build/all_reduce_perf"},
    }


def write(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False))
    path.chmod(0o644)
    return path
