"""Where a cluster's private state lives, for an inventory: the one rule configure and validate share."""

from __future__ import annotations

import os
from pathlib import Path

from gpucluster.inventory.values import Data
from gpucluster.paths import private_dir, state_dir


def literal(value) -> str | None:
    """A path the inventory gives, or None for unset or a Jinja default (Ansible evaluates those; here
    gpucluster.paths gives the same default)."""
    if isinstance(value, Data):  # written !unsafe: a literal path, whatever it holds
        return str(value)
    return None if value is None or "{{" in str(value) else str(value)


def state_dirs(inv_vars: dict, given: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(state folder, secrets folder) of the inventory's cluster: `given`, the inventory's own, else the
    per-user default; both created 0700 and checked (gpucluster.paths.private_dir)."""
    folder = given or literal(inv_vars.get("gpucluster_state_dir"))
    state = private_dir(state_dir(inv_vars["gpucluster_cluster"], folder))
    secrets = private_dir(literal(inv_vars.get("gpucluster_secrets_dir")) or state / "secrets", what="secrets folder")
    return state, secrets
