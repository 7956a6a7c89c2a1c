"""The apply and check steps of a drain-class wave, as commands the operator gives (never a shell: the
template is split once with shlex, and only the tokens {nodes} (a hostlist) and {node} are replaced).

With {node} the command runs once per node and a non-zero exit fails that node; otherwise it runs once
for the wave and a non-zero exit fails every node of it. On a cluster written with `gpucluster inventory`
the default apply is the converge of those hosts: `gpucluster configure INVENTORY --limit {nodes}`."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence

import hostlist

from gpucluster.errors import UsageError
from gpucluster.rollout.engine import Hook


def parse(template: str, option: str) -> list[str]:
    try:
        argv = shlex.split(template)
    except ValueError as exc:
        raise UsageError(f"{option} {template!r}: {exc}; quote it as one shell word") from None
    if not argv:
        raise UsageError(f"{option}: empty; give a command, e.g. {option} 'ssh {{node}} true'")
    return argv


def command_hook(template: str, option: str, *, timeout: float = 3600.0) -> Hook:
    argv = parse(template, option)
    per_node = any("{node}" in a for a in argv)

    def one(args: list[str]) -> str | None:
        try:
            res = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{args[0]}: {exc}"
        if res.returncode == 0:
            return None
        tail = (res.stderr or res.stdout or "").strip().splitlines()[-1:] or [""]
        return f"{shlex.join(args)[:80]} exited {res.returncode}: {tail[0][:200]}"

    def hook(nodes: Sequence[str]) -> dict[str, str]:
        if per_node:
            out = {}
            for n in nodes:
                why = one([a.replace("{node}", n) for a in argv])
                if why:
                    out[n] = why
            return out
        why = one([a.replace("{nodes}", hostlist.collect_hostlist(list(nodes))) for a in argv])
        return dict.fromkeys(nodes, why) if why else {}

    return hook
