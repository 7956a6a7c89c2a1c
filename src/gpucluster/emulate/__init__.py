"""Run rendered Slurm configs for real on one machine: a private slurmctld, optionally hundreds of
emulated ``slurmd -N`` nodes, and the topology-aware placement measurements built on them."""

from gpucluster.emulate.harness import SlurmCluster, SlurmCommandError, SlurmConfigError, SlurmStartError

__all__ = ["SlurmCluster", "SlurmCommandError", "SlurmConfigError", "SlurmStartError"]
