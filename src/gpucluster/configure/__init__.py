"""`gpucluster configure INVENTORY`: converge a cluster with the Ansible roles, through ansible-runner."""

from gpucluster._lazy import lazy_exports

_EXPORTS = {
    "ConfigureResult": ".runner",
    "HostStats": ".runner",
    "configure": ".runner",
    "summary": ".runner",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
