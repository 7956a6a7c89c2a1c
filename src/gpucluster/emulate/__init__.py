"""Run rendered Slurm configs for real on one machine: a private slurmctld, optionally hundreds of
emulated ``slurmd -N`` nodes, and the topology-aware placement measurements built on them."""

from gpucluster._lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    ".harness": ("SlurmCluster", "SlurmCommandError", "SlurmConfigError", "SlurmStartError"),
})
