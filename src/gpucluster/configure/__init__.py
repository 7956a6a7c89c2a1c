"""`gpucluster configure INVENTORY`: converge a cluster with the Ansible roles, through ansible-runner.

The operator's entry is gpucluster.configure.converge.converge (push or pull, chosen there); playbook.configure
is the push, pull.pull the pull."""

from gpucluster._lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    ".playbook": ("ConfigureResult", "HostStats", "configure", "summary"),
})
