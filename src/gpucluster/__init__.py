"""gpucluster: one cluster spec -> plan, Slurm/NCCL configs, Ansible inventory, Pulumi program, validation."""

__version__ = "0.1.0"
