"""NCCL/RCCL settings for a GPU node group, from the fabric and the plan."""

from __future__ import annotations

from gpucluster.cluster import Cluster
from gpucluster.spec.model import NodeGroup


def nccl_settings(cluster: Cluster, group: NodeGroup) -> dict[str, str]:
    """NCCL_* variables, in the order they are written to nccl.conf."""
    fab = cluster.spec.fabric
    plan = cluster.plan
    vendor = cluster.gpu_vendor(group)
    out: dict[str, str] = {}
    if group.nics_per_node:
        # '=' makes the names exact: without it mlx5_1 would also match mlx5_10.
        out["NCCL_IB_HCA"] = "=" + ",".join(cluster.hcas(group))
    out["NCCL_SOCKET_IFNAME"] = fab.management_interface
    if fab.type == "roce":
        if fab.roce.gid_index is not None:
            out["NCCL_IB_GID_INDEX"] = str(fab.roce.gid_index)
        out["NCCL_IB_TC"] = str(fab.roce.dscp * 4)  # the IP ToS byte carries DSCP in its top six bits
    else:
        out["NCCL_IB_SL"] = str(fab.infiniband.service_level)
    qps = fab.qps_per_connection or (4 if fab.type == "roce" and plan.tiers >= 3 else 1)
    out["NCCL_IB_QPS_PER_CONNECTION"] = str(qps)
    out["NCCL_CROSS_NIC"] = "0" if fab.design == "rail-optimized" else "1"
    if fab.type == "infiniband" and fab.infiniband.sharp:
        out["NCCL_COLLNET_ENABLE"] = "1"
    if vendor == "amd":
        out["NCCL_NET_GDR_LEVEL"] = "3"
    return out


def gpu_environment(cluster: Cluster, group: NodeGroup) -> dict[str, str]:
    """Variables beyond NCCL's own that jobs on this group need (written to a profile script)."""
    if cluster.gpu_vendor(group) == "amd":
        return {"HSA_FORCE_FINE_GRAIN_PCIE": "1"}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
