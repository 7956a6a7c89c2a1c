"""One compiled load: a spec, its plan (computed once) and every fact derived from them.

`load_cluster(path)` is the one entry point: the CLI, Pulumi, stage, emulate, validate and the
Ansible plugins call it; nothing else parses the YAML or calls the planner.
"""

from gpucluster.cluster.model import CONTRACT_GROUPS, Cluster, check_file, check_meaning, cluster_of, load_cluster

__all__ = ["CONTRACT_GROUPS", "Cluster", "check_file", "check_meaning", "cluster_of", "load_cluster"]
