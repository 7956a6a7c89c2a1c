"""The SSH part of `gpucluster health status` and its entry point, fleet_status (the parsing is status.py's).

Hosts are the inventory's (anything with .name and .ssh() -> {host, port, user, identity, extra_args}),
reached as Ansible reaches them: batch mode, host keys checked, the inventory's key and options.
"""

from __future__ import annotations

import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor

from gpucluster.render.health.config import STATE_DIR


def run(host, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
    command = " ".join(shlex.quote(a) for a in argv)
    try:
        res = subprocess.run(host.ssh_argv(command, "ConnectTimeout=10"), capture_output=True, text=True,
                             timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"no answer within {timeout:g}s"
    return res.returncode, res.stdout, res.stderr


def state_files(hosts: list, workers: int = 16, timeout: float = 30) -> tuple[dict[str, str], dict[str, str]]:
    """({node: state.json text}, {node: why it could not be read}), fetched in parallel."""
    texts, errors = {}, {}

    def one(host) -> None:
        rc, out, err = run(host, ["cat", f"{STATE_DIR}/state.json"], timeout)
        if rc == 0:
            texts[host.name] = out
        else:
            errors[host.name] = " ".join((err or f"exit {rc}").split())[:200]

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(hosts) or 1))) as pool:
        list(pool.map(one, hosts))
    return texts, errors


def fleet_status(inventory, limit: str | None = None) -> list:
    """`gpucluster health status`: the rows of status.merge for the inventory's compute nodes (those of `limit`),
    from Slurm's node table and reasons, asked of the first login node, else the first controller, and each node's
    state file. Refused (UsageError) where the inventory has no host to ask Slurm from; OperationError where Slurm
    does not answer."""
    from gpucluster.errors import OperationError, UsageError
    from gpucluster.health import status
    from gpucluster.inventory.reader import load_inventory

    inv = load_inventory(inventory)
    submit = (inv.group("slurm_login") + inv.group("slurm_controller"))[:1]
    if not submit:
        raise UsageError(f"{inv.path}: no slurm_login or slurm_controller host to ask Slurm from")
    host = inv.hosts[submit[0]]
    texts = []
    for argv in (status.SHOW_NODES, status.SINFO_REASONS):
        rc, out, err = run(host, argv)
        if rc != 0:
            raise OperationError(f"{' '.join(argv)} on {host.name} failed (exit {rc}): {' '.join(err.split())[:300]}")
        texts.append(out)
    nodes = [n for n in inv.select(limit) if n in inv.group("slurm_compute")]
    raw, errors = state_files([inv.hosts[n] for n in nodes])
    states = {n: status.parse_state_file(t) for n, t in raw.items()}
    return status.merge(texts[0], texts[1], states, errors, nodes)
