"""The stack's configuration, read once by the program's entry and handed down as typed values.

Only `from_config` touches `pulumi.Config`; components and providers take these fields. Paths in
stack config are relative to the project root (the folder of Pulumi.yaml), whatever folder the
engine runs the program from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pulumi

from gpucluster.deploy.nodes import TARGETS
from gpucluster.errors import UsageError

NAMESPACE = "gpucluster"


@dataclass(frozen=True)
class DeploySettings:
    project: str
    stack: str
    root: Path
    spec: Path
    target: str = "on-prem"
    ssh_user: str = "root"
    ssh_key_path: str | None = None
    ssh_private_key: pulumi.Output[str] | None = None  # secret
    known_hosts: str = ""  # on-prem default ~/.ssh/known_hosts; staging: the stage directory's
    ssh_port: int = 22
    ssh_timeout: float = 15.0
    host_domain: str | None = None
    stage_dir: Path | None = None
    enroll_batch: int = 64
    enroll_parallel: int = 32
    munge_key: pulumi.Output[str] | None = None  # secret; generated once per stack when not given
    slurmdbd_password: pulumi.Output[str] | None = None  # secret; likewise
    signing_key: pulumi.Output[str] | None = None  # secret, base64 of an OpenSSH ed25519 key file; likewise

    def for_cluster(self, name: str) -> DeploySettings:
        """Fill the defaults that depend on the spec's name: a staged cluster's state directory, and
        the key and known_hosts that `gpucluster stage up` keeps there."""
        if self.target != "staging":
            return self
        stage_dir = self.stage_dir or self.root / ".state" / "stage" / name
        return replace(self, stage_dir=stage_dir,
                       ssh_key_path=self.ssh_key_path or str(stage_dir / "id_ed25519"),
                       known_hosts=self.known_hosts or str(stage_dir / "known_hosts"))

    def path(self, text: str) -> Path:
        """Relative paths are the project root's; '~' stays as written (state moves between people)."""
        p = Path(text)
        return p if p.is_absolute() or text.startswith("~") else self.root / p


def _int(cfg: pulumi.Config, key: str, default: int, low: int, high: int) -> int:
    value = cfg.get(key)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{NAMESPACE}:{key} is {value!r}; give a whole number") from None
    if not low <= number <= high:
        raise UsageError(f"{NAMESPACE}:{key} is {number}; use {low}..{high}")
    return number


def from_config(cfg: pulumi.Config, root: Path, project: str, stack: str) -> DeploySettings:
    """Read every gpucluster:* key, with the checks a user needs to fix a stack file."""
    spec = cfg.get("spec")
    if not spec:
        raise UsageError(f"stack {stack}: set gpucluster:spec to the cluster spec "
                         f"(pulumi config set gpucluster:spec examples/{stack}.yaml)")
    target = cfg.get("target") or "on-prem"
    if target not in TARGETS:
        raise UsageError(f"{NAMESPACE}:target is {target!r}; use one of {', '.join(TARGETS)}")
    base = DeploySettings(project=project, stack=stack, root=root, spec=Path())
    spec_path = base.path(spec)
    key_path = cfg.get("sshKeyPath")
    known_hosts = cfg.get("knownHosts") or ("" if target == "staging" else "~/.ssh/known_hosts")
    stage_dir = cfg.get("stageDir")
    private_key = cfg.get_secret("sshPrivateKey")
    if target == "on-prem" and not key_path and private_key is None:
        raise UsageError(f"stack {stack}: enrollment needs an SSH key: set gpucluster:sshKeyPath (a path) or "
                         "the secret gpucluster:sshPrivateKey (pulumi config set --secret gpucluster:sshPrivateKey "
                         "< key)")
    return DeploySettings(
        project=project, stack=stack, root=root, spec=spec_path, target=target,
        ssh_user=cfg.get("sshUser") or "root",
        ssh_key_path=str(base.path(key_path)) if key_path else None,
        ssh_private_key=private_key,
        known_hosts=str(base.path(known_hosts)) if known_hosts else "",
        ssh_port=_int(cfg, "sshPort", 22, 1, 65535),
        ssh_timeout=float(_int(cfg, "sshTimeout", 15, 1, 600)),
        host_domain=cfg.get("hostDomain"),
        stage_dir=base.path(stage_dir) if stage_dir else None,
        enroll_batch=_int(cfg, "enrollBatch", 64, 1, 65536),
        enroll_parallel=_int(cfg, "enrollParallel", 32, 1, 512),
        munge_key=cfg.get_secret("mungeKey"),
        slurmdbd_password=cfg.get_secret("slurmdbdPassword"),
        signing_key=cfg.get_secret("pullRunnerSigningKey"),
    )

