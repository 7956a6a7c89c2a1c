"""roce-qos.conf: the RoCE lossless settings the rdma role applies, one file per distinct HCA set."""

from __future__ import annotations

from gpucluster.cluster import Cluster
from gpucluster.render.naming import one_or_per_group
from gpucluster.render.templating import environment

NAME = "roce-qos.conf"


def roce_texts(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """Per node group on a RoCE fabric: (file name, text). The settings are the fabric's; only the device
    list (the group's HCAs) can differ, so groups with the same HCAs share one file."""
    if cluster.spec.fabric.type != "roce":
        return {}
    template = environment().get_template("fabric/roce-qos.conf.j2")
    texts = {g.name: template.render(cluster=cluster.name, roce=cluster.fabric["roce"], devices=cluster.hcas(g))
             for g in cluster.spec.fabric_groups}
    names = one_or_per_group(texts, NAME)
    return {group: (names[group], text) for group, text in texts.items()}


def render_roce(cluster: Cluster) -> dict[str, str]:
    return {name: text for name, text in roce_texts(cluster).values()}
