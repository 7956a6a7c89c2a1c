"""Run rendered Slurm configs for real on one machine: a private slurmctld, optionally hundreds of
emulated ``slurmd -N`` nodes, and the topology-aware placement measurements built on them."""

from gpucluster._lazy import lazy_exports

_EXPORTS = {
    "SlurmCluster": ".harness",
    "SlurmCommandError": ".harness",
    "SlurmConfigError": ".harness",
    "SlurmStartError": ".harness",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
