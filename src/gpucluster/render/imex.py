"""The IMEX daemon's node list, one file per NVLink domain (GB200/GB300 NVL72 racks).

NVIDIA's IMEX guide ("Deployment Models: NVLink domain wide") has every compute tray of a domain run
nvidia-imex with the same `nodes_config.cfg` (IMEX_NODE_CONFIG_FILE): the addresses of all the domain's trays,
one per line, and nothing else (each instance checks that its map equals every other's). The plan knows which
trays share a domain; it does not know their addresses, which the inventory gives. So the rendered
`imex-domain.<domain>.hosts` lists the domain's trays by host name, in tray order, and the nvidia_gpu role writes
/etc/nvidia-imex/nodes_config.cfg on each tray from the file that names it, with each name turned into the
address the inventory gives it (plugins/filter/gpucluster_imex.py), so every tray of a domain writes the same
lines in the same order.
"""

from __future__ import annotations

from gpucluster.cluster import Cluster
from gpucluster.render.templating import environment

PREFIX = "imex-domain."
SUFFIX = ".hosts"


def imex_file_name(domain: str) -> str:
    """The rendered file of one domain (nvl0001 -> imex-domain.nvl0001.hosts)."""
    return f"{PREFIX}{domain}{SUFFIX}"


def domain_hosts(cluster: Cluster) -> dict[str, list[str]]:
    """NVLink domain name -> its compute trays' host names, in tray order; {} for a cluster without domains."""
    spec = cluster.spec
    return {d.name: [spec.group(d.group).host(i) for i in range(d.first, d.first + d.count)]
            for d in cluster.plan.domains}


def render_imex(cluster: Cluster) -> dict[str, str]:
    """imex-domain.<domain>.hosts for every NVLink domain of the plan."""
    template = environment().get_template("imex/nodes_config.cfg.j2")
    return {imex_file_name(name): template.render(hosts=hosts) for name, hosts in domain_hosts(cluster).items()}
