"""The compiled state of a cluster: every rendered file and every fact the roles and the validator need,
written once into the cluster's state folder and read by everyone after.

    <state>/compiled/stamp.json     what it was compiled from (spec sha256, gpucluster version, templates)
    <state>/compiled/facts.json     the facts (storage, fabric, NCCL files per node group, Slurm nodes, ...)
    <state>/compiled/rendered/      `gpucluster render`'s files (the cabling map aside)

`ensure_compiled` recompiles only when the stamp differs, so a demo run parses and plans the spec
once: the demo (or `gpucluster inventory`) compiles, then the Ansible controller's compile step and
`gpucluster validate` find the stamp unchanged and only read the files. A spec edited since is
compiled again, by whichever step comes first.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

from gpucluster import __version__
from gpucluster.cluster import Cluster, load_cluster
from gpucluster.render import render_all, templates_dir
from gpucluster.render.containers import role_facts as container_facts
from gpucluster.render.drivers import driver_texts
from gpucluster.render.fileset import nccl_texts, profile_differences
from gpucluster.render.health.rolefiles import facts as health_facts
from gpucluster.render.roce import roce_texts
from gpucluster.render.slurm import DBD, REBOOT_PROGRAM
from gpucluster.render.storage import storage_files
from gpucluster.render.topology import slurm_switches
from gpucluster.spec import stacks

COMPILED = "compiled"
# What every Slurm host carries (topology.yaml replaces topology.conf from Slurm 25.05).
SLURM_HOST_FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf", "topology.yaml")
FACTS_VERSION = 5  # 2: `files` (the rendered file each node group takes), storage settings; 3: health, drivers;
# 4: driver_files (the driver stacks' rendered files); 5: containers (render/containers.py's role facts)


@cache
def _digest(root: str, pattern: str) -> str:
    h = hashlib.sha256()
    for p in sorted(Path(root).rglob(pattern)):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def stamp_of(spec_path: str | os.PathLike) -> dict:
    """What a compile depends on: the spec's bytes, the templates, and the code that compiles (a checkout
    changes without a version bump). Hashing them costs a few ms; parsing and planning ~0.5 s."""
    data = Path(spec_path).read_bytes()
    return {"spec": str(Path(spec_path).resolve()), "spec_sha256": hashlib.sha256(data).hexdigest(),
            "gpucluster": __version__, "code": _digest(str(Path(__file__).parent), "*.py"),
            "templates": _digest(str(templates_dir()), "*"), "facts": FACTS_VERSION}


def facts(cluster: Cluster, rendered: dict[str, str]) -> dict:
    """The facts of a compiled cluster as plain data (JSON): what roles and the validator read."""
    spec, plan = cluster.spec, cluster.plan
    groups = {}
    for g in spec.node_groups:
        entry: dict = {"role": g.role, "count": g.count, "hosts": g.hostlist,
                       "memberships": list(cluster.memberships(g))}
        if g.gpu and g.gpus_per_node:
            gpu = spec.parts.gpus[g.gpu]
            entry["gpu"] = {"key": g.gpu, "vendor": gpu.vendor, "name": gpu.name, "count": g.gpus_per_node,
                            "slurm_type": gpu.slurm_type, "memory_gb": gpu.memory_gb,
                            "devices": list(cluster.gpu_devices(g)), "gres": cluster.gres(g)}
        if g.nic and g.nics_per_node:
            entry["nic"] = {"key": g.nic, "name": spec.parts.nics[g.nic].name, "speed_gbps": cluster.nic_speed(g),
                            "hcas": cluster.hcas(g)}
        groups[g.name] = entry
    nccl = {name: {"conf_name": conf, "env_name": env, "vendor": cluster.gpu_vendor(spec.group(name)),
                   "gpus_per_node": spec.group(name).gpus_per_node}
            for name, (conf, env, _c, _e) in nccl_texts(cluster).items()}
    nodes = {}
    for g in spec.groups_with_role("compute"):
        parts = [p.name for p in spec.slurm.partitions if g.name in p.groups]
        for host in g.hosts:
            nodes[host] = {"gres": cluster.gres(g), "partitions": parts, "node_group": g.name}
    switches = [{"name": s.name, "level": s.level, "nodes": list(s.nodes), "switches": list(s.switches)}
                for s in slurm_switches(plan)] if spec.slurm.topology == "tree" else []
    return {
        "cluster": spec.name,
        "spec": str(cluster.source.resolve()),
        "node_groups": groups,
        "contract_groups": {k: v for k, v in cluster.contract_groups.items() if v},
        "dbd_host": cluster.dbd_host,
        "storage": _storage_facts(cluster),
        "fabric": cluster.fabric,
        "files": _files(cluster),
        "nccl": nccl,
        "slurm": {"version": spec.slurm.version, "topology": spec.slurm.topology, "profile": spec.slurm.profile,
                  "profile_differences": profile_differences(cluster),
                  "dbd": {"host": cluster.dbd_host, **DBD} if cluster.dbd_host else None,
                  "accounting": spec.slurm.accounting, "nodes": nodes, "switches": switches,
                  "reboot_program": REBOOT_PROGRAM,
                  "files": sorted(n for n in rendered if n in SLURM_HOST_FILES)},
        "health": health_facts(cluster),
        "drivers": stacks.driver_stacks(spec),
        "driver_files": _driver_files(cluster),
        "containers": container_facts(cluster),
        "rendered": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sorted(rendered.items())},
    }


def _storage_facts(cluster: Cluster) -> dict:
    """cluster.storage plus the settings roles act on beyond the files they copy: directories to create
    and ports to wait for (storage.flash.moosefs), and the protocols each tier's server speaks."""
    out = dict(cluster.storage)
    st = cluster.spec.storage
    if st.flash:
        out["flash"] = {**out["flash"], "moosefs": st.flash.moosefs.model_dump(mode="json")}
    out["nfs"] = [{**tier, "ganesha": spec.ganesha.model_dump(mode="json")}
                  for tier, spec in zip(out["nfs"], st.nfs, strict=True)]
    return out


def _files(cluster: Cluster) -> dict[str, dict]:
    """Node group -> the rendered files it takes, by purpose (every node group, maybe with none): roles copy
    `rendered/<name>` and never derive a name. roce_qos (fabric groups on RoCE), moosefs_master,
    moosefs_metalogger, moosefs_chunkserver (lists), flash_mount, ganesha, nfs_mounts (list)."""
    out = storage_files(cluster).groups
    for group, (name, _text) in roce_texts(cluster).items():
        out[group]["roce_qos"] = name
    return out


def _driver_files(cluster: Cluster) -> dict[str, dict[str, str]]:
    """Node group -> the rendered driver-stack files its roles install, as `<role>_<kind>` (nvidia_gpu_sources,
    nvidia_gpu_pins, nvidia_gpu_peermem, nvidia_gpu_slurmd_dropin, amd_gpu_*, nccl_pins, rdma_sources:
    render/drivers.py). The roles read their texts through gpucluster_driver_files, which fills in the node's
    URIs; a kind not named is a file the stack does not need."""
    return {group: {f"{role}_{kind}": name for role, files in roles.items() for kind, (name, _t) in files.items()}
            for group, roles in driver_texts(cluster).items()}


def compile_to(cluster: Cluster, state_dir: str | os.PathLike) -> Path:
    """Render and write the compiled state of `cluster` under state_dir/compiled, replacing the old one
    whole through outputs.write_set (one rename-exchange: readers see the old set or the new one, and
    there is never a moment with no compiled/ folder)."""
    from gpucluster.outputs import write_set
    from gpucluster.paths import private_dir

    state = private_dir(state_dir)
    rendered = {name: (v if isinstance(v, str) else "".join(v())) for name, v in
                render_all(cluster, cabling=False).items()}
    doc = facts(cluster, rendered)
    files = {f"rendered/{name}": text for name, text in rendered.items()}
    files["facts.json"] = json.dumps(doc, indent=1) + "\n"
    files["stamp.json"] = json.dumps(stamp_of(cluster.source), indent=1) + "\n"
    return write_set(state / COMPILED, files, folder_mode=0o700, file_mode=0o600).folder


def _ours(path: Path) -> bool:
    """A file or folder only this user can have written: not a link, owned by us, not writable by others."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return not stat.S_ISLNK(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def is_current(spec_path: str | os.PathLike, state_dir: str | os.PathLike) -> bool:
    """Whether the compiled state matches the spec. Only a compiled folder this user wrote counts (the state
    folder, compiled/ and its stamp owned by us, writable by no one else, no folder above them that others
    could swap): a planted one is compiled over, never trusted."""
    from gpucluster.paths import unsafe_ancestor

    folder = Path(state_dir) / COMPILED
    if unsafe_ancestor(folder) or not all(_ours(p) for p in (Path(state_dir), folder, folder / "stamp.json")):
        return False
    try:
        have = json.loads((folder / "stamp.json").read_text())
    except (OSError, ValueError):
        return False
    return have == stamp_of(spec_path)


def ensure_compiled(spec_path: str | os.PathLike, state_dir: str | os.PathLike,
                    cluster: Cluster | None = None) -> tuple[Path, bool]:
    """(the compiled folder, whether it was compiled now). Parses and plans the spec only when the
    compiled state is missing or was compiled from something else."""
    if is_current(spec_path, state_dir):
        return Path(state_dir) / COMPILED, False
    return compile_to(cluster or load_cluster(spec_path), state_dir), True


def read_facts(state_dir: str | os.PathLike) -> dict:
    return json.loads((Path(state_dir) / COMPILED / "facts.json").read_text())
