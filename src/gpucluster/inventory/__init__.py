"""The Ansible inventory contract (docs/inventory.md): one writer for staged and real clusters."""

from gpucluster.inventory.writer import GROUPS, host_vars, inventory_data, write_inventory, write_inventory_data

__all__ = ["GROUPS", "host_vars", "inventory_data", "write_inventory", "write_inventory_data"]
