"""The Ansible inventory contract (docs/inventory.md): one writer for staged and real clusters."""

from gpucluster._lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    ".writer": ("GROUPS", "inventory_data", "write_inventory", "write_inventory_data"),
})
