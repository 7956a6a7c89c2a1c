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
    import gpucluster.cluster
    import gpucluster.cluster.names
    import gpucluster.render
    import gpucluster.render.files

    return gpucluster


def _plain(value: Any) -> Any:
    """Ansible hands filters lazy, tagged containers; templates and JSON want plain data."""
    return json.loads(json.dumps(value, default=str))


def _cluster(spec_path: str):
    gc = _gpucluster()
    return gc.cluster.load_cluster(Path(str(spec_path)))


def unit_name(path: str, suffix: str = "mount") -> str:
    """systemd's unit name for a path, as `systemd-escape --path --suffix=SUFFIX PATH` writes it."""
    return _gpucluster().cluster.names.unit_name(path, suffix)


def storage_facts(spec_path: str) -> dict:
    """The spec's storage tiers as plain data (gpucluster.cluster.Cluster.storage)."""
    return _cluster(spec_path).storage


def fabric_facts(spec_path: str) -> dict:
    """Fabric settings the rdma role applies on hosts; NCCL_IB_TC is the same DSCP x 4 (ToS byte)."""
    return _cluster(spec_path).fabric


def nccl_files(spec_path: str) -> dict:
    """Per GPU compute node group: the names `gpucluster render` gives its nccl.conf and env script,
    and their text from the same renderer (so /etc/nccl.conf is byte-identical to the CLI's file)."""
    gc = _gpucluster()
    cluster = _cluster(spec_path)
    out = {}
    for name, (conf_name, env_name, conf, env) in gc.render.files.nccl_texts(cluster).items():
        group = cluster.spec.group(name)
        out[name] = {"vendor": cluster.gpu_vendor(group), "gpus_per_node": group.gpus_per_node,
                     "conf_name": conf_name, "env_name": env_name, "conf": conf, "env": env}
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
