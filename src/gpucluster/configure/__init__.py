"""`gpucluster configure INVENTORY`: converge a cluster with the Ansible roles, through ansible-runner."""

from gpucluster.configure.runner import ConfigureResult, HostStats, configure, summary

__all__ = ["ConfigureResult", "HostStats", "configure", "summary"]
