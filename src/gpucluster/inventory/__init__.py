"""The Ansible inventory contract (docs/inventory.md): one writer for staged and real clusters."""

from gpucluster._lazy import lazy_exports

_EXPORTS = {
    "GROUPS": ".writer",
    "host_vars": ".writer",
    "inventory_data": ".writer",
    "write_inventory": ".writer",
    "write_inventory_data": ".writer",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
