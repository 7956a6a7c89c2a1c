"""Ansible filters that give roles the cluster spec's storage, fabric and NCCL facts.

Why a filter and not YAML: the spec is parsed by `gpucluster.spec` (one spec -> one model), and the
files roles install are rendered by `gpucluster.render`'s Jinja environment (templates/ only), so a
role and `gpucluster render` can never disagree. The filters run on the Ansible controller, which
needs the gpucluster package importable (the project's venv; a checkout's src/ is found too).

Filters (each takes plain data and returns plain data; see docs/storage.md):
  gpucluster_storage(spec_path)        flash and NFS tiers: mounts, replicas, servers, exports
  gpucluster_fabric(spec_path)         fabric type, RoCE QoS (DSCP, PFC, ECN, MTU), InfiniBand SM
  gpucluster_nccl(spec_path)           per GPU node group: nccl.conf / env script names and text
  gpucluster_render(context, name)     render templates/<name> with the same environment as the CLI
  gpucluster_unit_name(path, suffix)   systemd unit name of a path (systemd-escape --path)
  gpucluster_apt_names(pkgs, version)  apt's NAME=VERSION list; pkgs a list (one version) or {name: version}

Roles call the first three once per play (`run_once` + `set_fact`), not once per host.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

_SRC = Path(__file__).resolve().parent.parent.parent / "src"


def _gpucluster():
    """Import gpucluster, from the checkout's src/ when the controller's Python lacks the package."""
    try:
        import gpucluster
    except ModuleNotFoundError:
        if (_SRC / "gpucluster").is_dir() and str(_SRC) not in sys.path:
            sys.path.insert(0, str(_SRC))
    import gpucluster.render
    import gpucluster.spec

    return gpucluster


def _plain(value: Any) -> Any:
    """Ansible hands filters lazy, tagged containers; templates and JSON want plain data."""
    return json.loads(json.dumps(value, default=str))


def _spec(spec_path: str, *, check: bool = False):
    gc = _gpucluster()
    return gc.spec.load_spec(Path(str(spec_path)), check=check).spec


def _client_groups(spec, declared) -> list[str]:
    """The inventory writer's rule: declared client groups, else every compute and login group."""
    if declared is not None:
        return list(declared)
    return [g.name for g in spec.node_groups if g.role in ("compute", "login")]


def unit_name(path: str, suffix: str = "mount") -> str:
    """systemd's unit name for a path, as `systemd-escape --path --suffix=SUFFIX PATH` writes it."""
    trimmed = "/".join(p for p in str(path).split("/") if p)
    if not trimmed:
        return f"-.{suffix}"
    out = []
    for i, ch in enumerate(trimmed):
        if ch == "/":
            out.append("-")
        elif ch.isascii() and (ch.isalnum() or ch in ":_" or (ch == "." and i > 0)):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out) + f".{suffix}"


def storage_facts(spec_path: str) -> dict:
    """The spec's storage tiers as plain data. Host names come from the spec's node groups."""
    spec = _spec(spec_path)
    st = spec.storage
    flash = None
    if st.flash:
        f = st.flash
        flash = {
            "name": f.name,
            "mount": f.mount,
            "unit": unit_name(f.mount),
            "replicas": f.replicas,
            "metadata_group": f.metadata_group,
            "chunk_group": f.chunk_group,
            "client_groups": _client_groups(spec, f.client_groups),
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
        nfs.append({
            "name": tier.name,
            "server_group": tier.server_group,
            "server": spec.group(tier.server_group).host(0),
            "client_groups": _client_groups(spec, tier.client_groups),
            "exports": exports,
        })
    # One entry per (tier, export): what a client mounts, with the tier it belongs to.
    mounts = [{**e, "tier": tier["name"], "server": tier["server"], "client_groups": tier["client_groups"]}
              for tier in nfs for e in tier["exports"]]
    return {"cluster": spec.name, "flash": flash, "nfs": nfs, "nfs_mounts": mounts}


def fabric_facts(spec_path: str) -> dict:
    """Fabric settings the rdma role applies on hosts; NCCL_IB_TC is the same DSCP x 4 (ToS byte)."""
    spec = _spec(spec_path)
    fab = spec.fabric
    roce = fab.roce
    return {
        "cluster": spec.name,
        "type": fab.type,
        "design": fab.design,
        "roce": {
            "dscp": roce.dscp,
            "tos": roce.dscp * 4,
            "pfc_priority": roce.pfc_priority,
            "pfc_map": ",".join("1" if p == roce.pfc_priority else "0" for p in range(8)),
            "cnp_dscp": roce.cnp_dscp,
            "cnp_priority": roce.cnp_priority,
            "ecn": roce.ecn,
            "mtu": roce.mtu,
            "link_mtu": roce.link_mtu,
            "gid_index": roce.gid_index,
        },
        "infiniband": {
            "subnet_manager": fab.infiniband.subnet_manager,
            "sharp": fab.infiniband.sharp,
            "service_level": fab.infiniband.service_level,
        },
    }


def nccl_files(spec_path: str) -> dict:
    """Per GPU compute node group: the names `gpucluster render` gives its nccl.conf and env script,
    and their text from the same renderer (so /etc/nccl.conf is byte-identical to the CLI's file)."""
    gc = _gpucluster()
    from gpucluster.fabric import plan_cluster

    spec = _spec(spec_path)
    plan = plan_cluster(spec)
    rendered = gc.render.render_all(spec, plan, cabling=False)
    out = {}
    for group in spec.gpu_groups:
        if group.role != "compute":
            continue
        conf_name, env_name = gc.render.nccl_file_for(spec, plan, group)
        out[group.name] = {
            "vendor": spec.parts.gpus[group.gpu].vendor,
            "gpus_per_node": group.gpus_per_node,
            "conf_name": conf_name,
            "env_name": env_name,
            "conf": rendered[conf_name],
            "env": rendered[env_name],
        }
    return out


_APT_VERSION = re.compile(r"^[0-9A-Za-z.+~:*-]+$")


def apt_names(packages: list | dict, version: str = "") -> list[str]:
    """['moosefs-master'] with '3.0.117*' -> ['moosefs-master=3.0.117*']; {name: version} maps each
    package to its own version; an empty version leaves the name bare (the source's newest)."""
    pairs = packages.items() if isinstance(packages, dict) else ((p, version) for p in packages)
    out = []
    for name, ver in pairs:
        ver = str(ver or "").strip()
        if ver and not _APT_VERSION.match(ver):
            raise ValueError(f"{name}: version {ver!r} is not a Debian version or pattern (like 3.0.117*)")
        out.append(f"{name}={ver}" if ver else str(name))
    return out


def render(context: dict, name: str) -> str:
    """Render templates/<name> with gpucluster's Jinja environment (StrictUndefined, trim_blocks)."""
    gc = _gpucluster()
    return gc.render.environment().get_template(str(name)).render(_plain(context))


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpucluster_storage": storage_facts,
            "gpucluster_fabric": fabric_facts,
            "gpucluster_nccl": nccl_files,
            "gpucluster_render": render,
            "gpucluster_unit_name": unit_name,
            "gpucluster_apt_names": apt_names,
        }
