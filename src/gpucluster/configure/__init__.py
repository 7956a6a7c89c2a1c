"""`gpucluster configure INVENTORY`: converge a cluster with the Ansible roles, through ansible-runner."""

from gpucluster._lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    ".playbook": ("ConfigureResult", "HostStats", "configure", "summary"),
})
