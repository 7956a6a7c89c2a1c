"""The SSH part of `gpucluster health status`: thin on purpose (the parsing is status.py's).

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
