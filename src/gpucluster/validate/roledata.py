"""Pinned package versions and kernel settings, as `gpucluster configure` applies them.

They are role variables (roles/*/defaults/main.yml), which an inventory may override; the validator
reads the same two places rather than keeping copies. Package names per group are Debian constants
(the roles' vars/Debian.yml) and live in PACKAGES below beside the variable that pins them. A default
that depends on the node's Debian release (`"{{ __role_default_x | default('') }}"`, the value in each
vars/Debian-<major>.yml) becomes {major: version}, and the check picks the one of the node's release.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpucluster.paths import roles_dir

SLURM_HOSTS = ("slurm_dbd", "slurm_controller", "slurm_compute", "slurm_login")

# (role, version variable, {inventory group: packages pinned by it})
PACKAGES: tuple[tuple[str, str, dict[str, tuple[str, ...]]], ...] = (
    ("munge", "munge_version", {g: ("munge",) for g in SLURM_HOSTS}),
    ("slurm_common", "slurm_common_version", {
        **{g: ("slurm-client", "slurm-wlm-basic-plugins") for g in SLURM_HOSTS},
        "slurm_controller": ("slurm-client", "slurm-wlm-basic-plugins", "slurmctld"),
        "slurm_compute": ("slurm-client", "slurm-wlm-basic-plugins", "slurmd"),
        "slurm_dbd": ("slurm-client", "slurm-wlm-basic-plugins", "slurmdbd"),
    }),
    ("nfs", "nfs_ganesha_version", {"nfs_server": ("nfs-ganesha", "nfs-ganesha-vfs")}),
    ("flash_storage", "flash_storage_moosefs_version", {
        "flash_meta": ("moosefs-master",), "flash_chunk": ("moosefs-chunkserver",),
        "flash_client": ("moosefs-client",),
    }),
)
SYSCTLS = ("common", "common_sysctls", "all")
# Where the nccl role installs the rendered files and builds nccl-tests / rccl-tests.
NCCL_PATHS = ("nccl", {"conf": ("nccl_conf_path", "/etc/nccl.conf"),
                       "env": ("nccl_env_script", "/etc/profile.d/gpucluster-nccl.sh"),
                       "tests_dir": ("nccl_tests_dir", "/opt/nccl-tests")})
SYSCTL_FILE = "/etc/sysctl.d/90-gpucluster.conf"  # roles/common/vars/Debian.yml __common_sysctl_file


def _defaults(roles: Path, role: str) -> dict:
    try:
        return yaml.safe_load((roles / role / "defaults" / "main.yml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _value(var: str, role_defaults: dict, inv_vars: dict):
    value = inv_vars.get(var, role_defaults.get(var))
    if isinstance(value, str) and "{{" in value:
        return None  # a template: only Ansible can evaluate it
    return value


def _per_release(roles: Path, role: str, var: str, role_defaults: dict, inv_vars: dict) -> dict[str, str]:
    """{Debian major: value} of a default that names a per-release constant (vars/Debian-<major>.yml)."""
    if var in inv_vars:
        return {}
    m = re.fullmatch(r"\{\{\s*(__\w+)\s*(\|\s*default\([^)]*\)\s*)?\}\}", str(role_defaults.get(var, "")).strip())
    if not m:
        return {}
    found = {}
    for path in sorted((roles / role / "vars").glob("Debian-*.yml")):
        try:
            value = (yaml.safe_load(path.read_text()) or {}).get(m.group(1))
        except (OSError, yaml.YAMLError):
            continue
        if value:
            found[path.stem.removeprefix("Debian-")] = str(value)
    return found


def nccl_paths(inv_vars: dict) -> dict[str, str]:
    """nccl.conf, env script and tests folder: the nccl role's defaults (or the inventory's override)."""
    roles = roles_dir()
    role, names = NCCL_PATHS
    defaults = _defaults(roles, role) if roles else {}
    return {k: str(_value(var, defaults, inv_vars) or fallback) for k, (var, fallback) in names.items()}


def role_expectations(inv_vars: dict) -> tuple[dict, dict, list[str]]:
    """({group: {package: version}}, {"all": {key: value}}, notes)."""
    roles = roles_dir()
    if roles is None:
        return {}, {}, ["roles/ not found (set GPUCLUSTER_HOME to a gpucluster checkout): package pins and "
                        "sysctls are not checked"]
    packages: dict[str, dict[str, str]] = {}
    notes: list[str] = []
    for role, var, groups in PACKAGES:
        defaults = _defaults(roles, role)
        version = _value(var, defaults, inv_vars) or _per_release(roles, role, var, defaults, inv_vars)
        if not version:
            notes.append(f"{var} is empty: {role}'s packages are not pinned, so their versions are not checked")
            continue
        for group, names in groups.items():
            packages.setdefault(group, {}).update({n: version if isinstance(version, dict) else str(version)
                                                   for n in names})
    role, var, group = SYSCTLS
    sysctls = _value(var, _defaults(roles, role), inv_vars) or {}
    return packages, {group: {str(k): str(v) for k, v in dict(sysctls).items()}}, notes
