"""What a stack exports, and how the rest of the toolkit reads it back.

Building the outputs (`inventory_args`, `inventory_json`, `file_hashes`) uses the same inventory writer and renderer as
the CLI. Reading them back (`inventory_from_stack`, `secrets_from_stack`) shells out to the Pulumi CLI;
this module never imports the Pulumi SDK, so `gpucluster inventory --pulumi-stack` works in an
install without it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from gpucluster.cluster import Cluster
from gpucluster.configure.secrets import default_path, write_secrets_file
from gpucluster.errors import UsageError
from gpucluster.inventory.values import (
    DEFAULT_KNOWN_HOSTS,
    ssh_common_args,
    valid_address,
    valid_path,
    valid_port,
    valid_user,
)
from gpucluster.inventory.writer import write_inventory_data
from gpucluster.paths import pulumi_project

SLURM_FILES = ("slurm.conf", "topology.conf", "topology.yaml", "gres.conf", "cgroup.conf")
INSTALL_HINT = ("install the Pulumi CLI (https://www.pulumi.com/docs/install/: curl -fsSL https://get.pulumi.com | sh, "
                "or brew install pulumi/tap/pulumi) and log in to the stack's backend")


# ---------------------------------------------------------------- building


def inventory_args(cluster: Cluster, *, target: str, stack: str, addresses: dict[str, tuple[str, int]],
                   ssh_user: str, ssh_key_path: str | None, known_hosts: str,
                   stage_dir: Path | None = None) -> tuple[dict[str, dict], dict]:
    """(connection, extra_vars) for the inventory writer: how Ansible reaches the nodes the stack enrolled,
    with the same key, user and known_hosts the enrollment used."""
    extra: dict = {"gpucluster_spec": str(cluster.source.resolve()), "gpucluster_pulumi_stack": stack}
    if target == "staging":
        # the same connection variables and staged-cluster variables `gpucluster stage up` writes
        from gpucluster.stage.lifecycle import connection_vars
        from gpucluster.stage.podman import StagedCluster

        assert stage_dir is not None
        staged = StagedCluster(nodes=addresses, ssh_key=Path(ssh_key_path or stage_dir / "id_ed25519"),
                               known_hosts=Path(known_hosts), ssh_config=stage_dir / "ssh_config", network="",
                               ssh_user=ssh_user)
        extra.update({"gpucluster_secrets_dir": str(stage_dir / "secrets"), "gpucluster_state_dir": str(stage_dir)})
        return connection_vars(staged), extra
    # Real clusters: per host only what differs (the address, when it is not the name); the rest once for
    # all hosts, which keeps a 25k-host inventory small. Every value comes from the stack's config: checked
    # as the inventory sources check theirs (gpucluster.inventory.values), then written !unsafe by the writer.
    _check_connection(addresses, ssh_user, ssh_key_path, known_hosts)
    connection = {h: {"ansible_host": a} for h, (a, _p) in addresses.items() if a != h}
    ports = {p for _a, p in addresses.values()}
    extra["ansible_user"] = ssh_user
    if ssh_key_path:
        extra["ansible_ssh_private_key_file"] = ssh_key_path
    extra["ansible_ssh_common_args"] = ssh_common_args(known_hosts or DEFAULT_KNOWN_HOSTS)
    if ports != {22}:
        if len(ports) == 1:
            extra["ansible_port"] = ports.pop()
        else:
            for h, (_a, p) in addresses.items():
                connection.setdefault(h, {})["ansible_port"] = p
    return connection, extra


def _check_connection(addresses: dict[str, tuple[str, int]], ssh_user: str, ssh_key_path: str | None,
                      known_hosts: str) -> None:
    """The stack config's connection values against their allow-lists; a UsageError names the setting."""
    bad = next((f"{h}: '{a}'" for h, (a, p) in addresses.items() if not valid_address(a) or not valid_port(p)),
               None)
    if bad:
        raise UsageError(f"gpucluster:hostDomain / sshPort: {bad} is not a host name or address with a TCP port")
    if not valid_user(ssh_user):
        raise UsageError(f"gpucluster:sshUser '{ssh_user}' is not a login name")
    for key, value in (("sshKeyPath", ssh_key_path), ("knownHosts", known_hosts)):
        if value and not valid_path(value):
            raise UsageError(f"gpucluster:{key} '{value}' is not an absolute path of plain characters "
                             "(letters, digits, ._+,=@~/-)")


def inventory_json(cluster: Cluster, connection: dict[str, dict], extra_vars: dict) -> str:
    """The inventory contract's data (`inventory_data`, the writer's own function) as one JSON string.

    A string, not a nested output: the SDK serialises nested outputs value by value (minutes for a
    25k-host inventory), a string costs nothing. JSON, not hosts.yml: PyYAML's representer needs ~10 s
    CPU for Colossus 100k, paid here on every `pulumi up` otherwise; `gpucluster inventory
    --pulumi-stack` pays it once when it writes hosts.yml. The JSON is itself an Ansible inventory
    (`pulumi stack output inventory > hosts.json`)."""
    from gpucluster.inventory import inventory_data

    return json.dumps(inventory_data(cluster, connection, extra_vars), separators=(",", ":"))


def file_hashes(files: dict) -> dict[str, str]:
    """sha256 of each rendered file (text, or a function yielding chunks)."""
    out = {}
    for name in sorted(files):
        value = files[name]
        h = hashlib.sha256()
        for chunk in [value] if isinstance(value, str) else value():
            h.update(chunk.encode())
        out[name] = f"sha256:{h.hexdigest()}"
    return out


# ---------------------------------------------------------------- reading back


def _pulumi(otherwise: str = "") -> str:
    exe = shutil.which("pulumi")
    if exe is None:
        raise UsageError(f"the Pulumi CLI is not on PATH: {INSTALL_HINT}" + (f"; {otherwise}" if otherwise else ""))
    return exe


def project_root(start: Path | None = None) -> Path:
    """The folder holding Pulumi.yaml: the current one or a parent, else this checkout's root."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "Pulumi.yaml").is_file():
            return d
    checkout = pulumi_project()
    if checkout is not None:
        return checkout
    raise UsageError("no Pulumi.yaml in this folder or above it: run this in the gpucluster checkout")


def stack_output(stack: str, name: str, *, show_secrets: bool = False, otherwise: str = ""):
    """One stack output as JSON data, through `pulumi stack output`. `otherwise`: what to do without the CLI."""
    exe = _pulumi(otherwise)
    cmd = [exe, "stack", "output", "--stack", stack, "--json", f"--show-secrets={'true' if show_secrets else 'false'}",
           name]
    try:
        res = subprocess.run(cmd, cwd=project_root(), capture_output=True, text=True, timeout=300, check=False,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"pulumi stack output failed: {exc}") from None
    if res.returncode != 0:
        detail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise UsageError(f"pulumi stack output --stack {stack} {name} failed (exit {res.returncode}): "
                         f"{' '.join(detail)}; check the stack name (pulumi stack ls) and that `pulumi up` ran")
    try:
        return json.loads(res.stdout)
    except ValueError:
        raise UsageError(f"pulumi stack output --stack {stack} {name} did not print JSON") from None


def inventory_from_stack(stack: str, outdir: Path) -> Path:
    """`gpucluster inventory --pulumi-stack NAME -o DIR`: the inventory `pulumi up` exported."""
    text = stack_output(stack, "inventory", otherwise="without it, write the inventory from the spec: "
                                                      "gpucluster inventory SPEC -o DIR")
    try:
        data = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise UsageError(f"stack {stack}: the inventory output is not the JSON inventory this version exports; "
                         "run pulumi up with this checkout")
    return write_inventory_data(Path(outdir), data)


# ---------------------------------------------------------------- secrets for Ansible


# What every stack's ansibleSecrets holds (slurm_dbd_password only where the spec has accounting). A stack
# last updated without the signing key would leave each pushing machine to generate its own: refused.
STACK_SECRETS = ("munge_key_b64", "pull_runner_signing_key_b64")


def secrets_from_stack(stack: str, path: Path | None = None) -> Path:
    """`gpucluster secrets --pulumi-stack NAME`: the stack's ansibleSecrets as the operator's secrets file."""
    values = stack_output(stack, "ansibleSecrets", show_secrets=True)
    if not isinstance(values, dict):
        raise UsageError(f"stack {stack}: ansibleSecrets is not a mapping; run pulumi up first")
    missing = [k for k in STACK_SECRETS if k not in values]
    if missing:
        raise UsageError(f"stack {stack}: ansibleSecrets has no {', '.join(missing)}; run pulumi up --stack {stack} "
                         "with this checkout (it generates them once), then this command again")
    return write_secrets_file(values, path or default_path(stack))
