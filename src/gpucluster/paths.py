"""Where gpucluster finds what it does not ship inside the package: the Ansible project (ansible.cfg,
playbooks/, roles/, plugins/), the example specs and the Pulumi project.

One documented setting, GPUCLUSTER_HOME: a gpucluster checkout (or an unpacked release of one).
Without it, the checkout this package runs from, when it runs from one, else the current folder.
Templates are package data (gpucluster/templates): `check`, `plan` and `render` need nothing here.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpucluster.errors import UsageError

SETTING = "GPUCLUSTER_HOME"
_CHECKOUT = Path(__file__).resolve().parents[2]  # src/gpucluster/paths.py -> the checkout's root


def _is_home(path: Path) -> bool:
    return (path / "ansible.cfg").is_file() and (path / "playbooks" / "site.yml").is_file()


def home(given: str | os.PathLike | None = None) -> Path | None:
    """The gpucluster project folder: `given`, $GPUCLUSTER_HOME, this checkout, or the current folder."""
    for candidate in (given, os.environ.get(SETTING), _CHECKOUT, Path.cwd()):
        if candidate and _is_home(Path(candidate)):
            return Path(candidate).resolve()
    return None


def ansible_dir(given: str | os.PathLike | None = None) -> Path:
    """The folder holding ansible.cfg, playbooks/ and roles/; a UsageError says how to point at one."""
    found = home(given)
    if found is None:
        raise UsageError(f"cannot find playbooks/site.yml and ansible.cfg: set {SETTING} to a gpucluster checkout "
                         "(or pass --project-dir), or run from one")
    return found


def roles_dir() -> Path | None:
    found = home()
    return found / "roles" if found else None


def examples_dir() -> Path:
    found = home()
    return (found or _CHECKOUT) / "examples"


def pulumi_project() -> Path | None:
    """The folder holding Pulumi.yaml: this checkout, or $GPUCLUSTER_HOME."""
    for candidate in (os.environ.get(SETTING), _CHECKOUT):
        if candidate and (Path(candidate) / "Pulumi.yaml").is_file():
            return Path(candidate).resolve()
    return None
