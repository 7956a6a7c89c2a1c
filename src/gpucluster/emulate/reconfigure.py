"""A served-config change on a configless emulated cluster, and proof that every slurmd runs it.

The key changed is ``SlurmdDebug``: slurmd reads it from the slurm.conf slurmctld serves it, applies it on
``scontrol reconfigure``, and reports its live value back (``scontrol show slurmd`` -> "Slurmd Debug = N",
answered by the slurmd itself; SLURMD_NODENAME picks which emulated slurmd is asked). Two moments are timed
per node: the served slurm.conf with the new value lands in the node's conf-cache (slurmd writes it), and the
slurmd reports the new level.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.emulate.adapt import SlurmConf
from gpucluster.emulate.harness import SlurmCluster, SlurmCommandError

# slurm.conf debug level names and the numbers slurmd reports for them (slurm.conf(5), SlurmdDebug)
DEBUG_LEVELS = ("quiet", "fatal", "error", "info", "verbose", "debug", "debug2", "debug3", "debug4", "debug5")


@dataclass
class Reconfigured:
    """Seconds from ``scontrol reconfigure`` to: each node's conf-cache holding the new value, and each slurmd
    reporting it. ``missing``: nodes that did neither before the timeout."""

    key: str
    value: str
    cache_s: dict[str, float] = field(default_factory=dict)
    live_s: dict[str, float] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    reconfigure_s: float = 0.0  # the scontrol reconfigure call itself


def other_level(current: str) -> str:
    """A SlurmdDebug level other than ``current`` that logs little more (verbose after info, else info)."""
    return "verbose" if current.lower() == "info" else "info"


def slurmd_debug(cluster: SlurmCluster, node: str) -> int | None:
    """The debug level this node's slurmd runs now, as it reports it itself; None if it does not answer."""
    env = dict(cluster.env, SLURMD_NODENAME=node)
    res = subprocess.run(cluster.runtime.argv(["scontrol", "show", "slurmd"]), env=env, capture_output=True,
                         text=True, timeout=60)
    m = re.search(r"^Slurmd Debug\s*=\s*(\d+)", res.stdout, re.M)
    return int(m.group(1)) if m else None


def cached_value(cluster: SlurmCluster, node: str, key: str) -> str | None:
    """``key`` in the slurm.conf that this node's slurmd keeps in its conf-cache (None: no file or no key)."""
    try:
        return SlurmConf.parse((cluster.conf_cache(node) / "slurm.conf").read_text()).param(key)
    except (OSError, ValueError):
        return None


def own_conf(cluster: SlurmCluster, node: str) -> list[str]:
    """What would make this slurmd read a slurm.conf of its own: -f on its command line, SLURM_CONF in its
    environment. Empty for a configless slurmd."""
    pid = cluster.slurmd[node].pid
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    found = [f"-f {argv[argv.index(b'-f') + 1].decode()}"] if b"-f" in argv else []
    found += [e.decode() for e in env if e.startswith(b"SLURM_CONF=")]
    return found


def set_served(cluster: SlurmCluster, key: str, value: str) -> str | None:
    """Set ``key`` in the slurm.conf slurmctld serves (the controller's only); returns the old value."""
    conf = SlurmConf.parse(cluster.conf_path.read_text())
    old = conf.set_param(key, value)
    cluster.conf_path.write_text(conf.render())
    return old


def reconfigure_debug(
    cluster: SlurmCluster, nodes: Sequence[str], *, timeout: float = 600.0, workers: int = 4
) -> Reconfigured:
    """Change SlurmdDebug in the served config, run ``scontrol reconfigure``, and wait until every node's
    slurmd reports the new level. Times are from the start of the reconfigure call."""
    current = SlurmConf.parse(cluster.conf_path.read_text()).param("SlurmdDebug") or "info"
    value = other_level(current)
    want = DEBUG_LEVELS.index(value)
    set_served(cluster, "SlurmdDebug", value)
    out = Reconfigured("SlurmdDebug", value)
    t0, wall0 = time.monotonic(), time.time()
    res = cluster.run(["scontrol", "reconfigure"], timeout=120)
    if res.returncode != 0:
        raise SlurmCommandError(f"scontrol reconfigure failed ({res.returncode}): {res.stderr.strip()}")
    out.reconfigure_s = time.monotonic() - t0
    pending = list(nodes)
    deadline = t0 + timeout
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while pending and time.monotonic() < deadline:
            for n in pending:
                now = time.monotonic() - t0
                if n not in out.cache_s and cached_value(cluster, n, "SlurmdDebug") == value:
                    # when slurmd wrote it (the file's mtime), not when this loop saw it
                    with contextlib.suppress(OSError):
                        now = (cluster.conf_cache(n) / "slurm.conf").stat().st_mtime - wall0
                    out.cache_s[n] = now
            ask = [n for n in pending if n in out.cache_s]
            for n, level in zip(ask, pool.map(lambda n: slurmd_debug(cluster, n), ask), strict=True):
                if level == want:
                    out.live_s[n] = time.monotonic() - t0
            pending = [n for n in pending if n not in out.live_s]
            if pending:
                time.sleep(0.2)
    out.missing = pending
    return out
