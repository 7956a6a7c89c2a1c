"""Emulate a rendered cluster on this machine: slurmctld plus one ``slurmd -N`` per node."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gpucluster.emulate.adapt import SlurmConf
from gpucluster.emulate.harness import SlurmCluster, SlurmStartError
from gpucluster.words import plural

# Measured on Debian 12 / Slurm 22.05: an idle emulated slurmd has ~8 MB RSS, of which ~2 MB is
# private (the rest is shared libraries); a job step (slurmstepd) adds about as much again while it
# runs. The budget below is deliberately the pessimistic RSS figure, for the daemon and one step.
MIB_PER_NODE = 16


def config_nodes(conf_dir: Path) -> list[str]:
    return SlurmConf.parse((Path(conf_dir) / "slurm.conf").read_text()).node_names()


def mem_available_mib() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


@contextmanager
def emulate(
    conf_dir: Path,
    nodes: int | None = None,
    *,
    overrides: Mapping[str, str | None] | None = None,
    workdir: Path | None = None,
    start_timeout: float = 120.0,
    keep: bool | None = None,
    reboot_delay: float = 2.0,
    configless: bool = False,
) -> Iterator[SlurmCluster]:
    """Start slurmctld and ``nodes`` emulated slurmd (default: every node of the config).

    The node count comes from the spec, never from here: ``nodes`` may only pick the first N
    nodes of the rendered config (the rest stay defined, State=FUTURE, so topology.conf still
    names real nodes); asking for more nodes than the config has is an error. ``reboot_delay``: how long
    an emulated node stays down when slurmctld reboots it (harness.REBOOT_SCRIPT). ``configless``: every slurmd
    fetches its configs from slurmctld (``--conf-server``) and holds no slurm.conf of its own.
    """
    names = config_nodes(conf_dir)
    if nodes is None:
        chosen = names
    elif nodes > len(names):
        raise SlurmStartError(
            f"{conf_dir}/slurm.conf defines {plural(len(names), 'node')}, {nodes} asked for: the emulator never "
            f"invents nodes; render a spec with {nodes} compute nodes instead"
        )
    elif nodes < 1:
        raise SlurmStartError("--nodes must be at least 1")
    else:
        chosen = names[:nodes]
    need = MIB_PER_NODE * len(chosen) + 512
    have = mem_available_mib()
    if have and need > have:
        raise SlurmStartError(
            f"{len(chosen)} emulated nodes need about {need} MiB, only {have} MiB available; emulate fewer nodes"
        )
    cluster = SlurmCluster(
        conf_dir,
        slurmd_nodes=chosen,
        workdir=workdir,
        absent_state="FUTURE" if len(chosen) < len(names) else None,
        overrides=overrides,
        start_timeout=start_timeout,
        keep=keep,
        reboot_delay=reboot_delay,
        configless=configless,
    )
    with cluster:
        yield cluster
