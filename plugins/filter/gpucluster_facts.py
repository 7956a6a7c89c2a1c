"""Ansible filters that give roles the compiled cluster's facts (storage, fabric, NCCL files).

Why filters that read files: the spec is compiled once per run on the controller (playbooks/compile.yml,
gpucluster.compiled) into the cluster's state folder; roles read its facts.json and rendered/ files and
never parse the spec again. Each filter takes plain data and returns plain data (docs/storage.md).

  gpucluster_facts(state_dir, section) one section of facts.json (e.g. slurm, node_groups, or files: the
                                       rendered files each node group takes, by purpose)
  gpucluster_storage(state_dir)        flash and NFS tiers: mounts, units, replicas, servers, exports
  gpucluster_fabric_facts(state_dir)   fabric type, RoCE QoS (DSCP, PFC, ECN, MTU), InfiniBand SM
  gpucluster_nccl(state_dir)           per GPU node group: nccl.conf / env script names and text
  gpucluster_apt_names(pkgs, version)  apt's NAME=VERSION list; pkgs a list (one version) or {name: version}

Roles call the facts filters once per play (`run_once` + `set_fact`), not once per host. Nothing is rendered here:
every config file a role installs is a file of `rendered/`, copied byte for byte, and facts.json's `files`
names the one each node group takes.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any


def _compiled(state_dir: str) -> Path:
    folder = Path(str(state_dir)) / "compiled"
    if not (folder / "facts.json").is_file():
        raise ValueError(f"{folder}/facts.json does not exist: run the whole of playbooks/site.yml (its first play, "
                         "compile.yml, compiles the spec there), e.g. through `gpucluster configure INVENTORY`")
    return folder


@cache
def _facts_at(path: str, mtime_ns: int) -> dict:
    return json.loads(Path(path).read_text())


def _facts(state_dir: str) -> dict:
    path = _compiled(state_dir) / "facts.json"
    return _facts_at(str(path), path.stat().st_mtime_ns)


def facts(state_dir: str, section: str) -> Any:
    """One section of the compiled facts (facts.json), e.g. 'slurm' or 'node_groups'."""
    return _facts(state_dir)[section]


def storage_facts(state_dir: str) -> dict:
    """The spec's storage tiers as plain data (gpucluster.cluster.Cluster.storage, compiled)."""
    return _facts(state_dir)["storage"]


def fabric_facts(state_dir: str) -> dict:
    """Fabric settings the rdma role applies on hosts; NCCL_IB_TC is the same DSCP x 4 (ToS byte)."""
    return _facts(state_dir)["fabric"]


def nccl_files(state_dir: str) -> dict:
    """Per GPU compute node group: the names `gpucluster render` gives its nccl.conf and env script,
    and their text from the compiled rendered/ folder (byte-identical to the CLI's files)."""
    rendered = _compiled(state_dir) / "rendered"
    out = {}
    for name, entry in _facts(state_dir)["nccl"].items():
        out[name] = {**entry, "conf": (rendered / entry["conf_name"]).read_text(),
                     "env": (rendered / entry["env_name"]).read_text()}
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


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpucluster_facts": facts,
            "gpucluster_storage": storage_facts,
            # Not `gpucluster_fabric`: a filter is never named like a variable (tests/test_fact_channel.py).
            "gpucluster_fabric_facts": fabric_facts,
            "gpucluster_nccl": nccl_files,
            "gpucluster_apt_names": apt_names,
        }
