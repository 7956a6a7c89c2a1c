"""The Pulumi program: config -> compiled cluster (spec + plan) -> one Cluster component -> stack outputs.

`stacks/__main__.py` calls `main()`; tests and the bench call `build()` under mocks with the same
settings the config would give.
"""

from __future__ import annotations

from pathlib import Path

import pulumi

from gpucluster.deploy import nodes
from gpucluster.deploy import settings as settings_mod
from gpucluster.deploy.components import Cluster, ClusterArgs
from gpucluster.errors import SpecError, UsageError

# Stack outputs, by name: docs/pulumi.md documents each; `gpucluster inventory --pulumi-stack` reads
# `inventory`, `gpucluster secrets --pulumi-stack` reads `ansibleSecrets`.
OUTPUTS = ("cluster", "inventory", "plan", "slurmFiles", "renderedFiles", "enrollment", "drift", "ansibleSecrets")


def build(st: settings_mod.DeploySettings) -> Cluster:
    """Load the spec once (gpucluster.cluster), and build the cluster's component tree. Exports the outputs."""
    from gpucluster.cluster import load_cluster

    compiled = load_cluster(st.spec)
    st = st.for_cluster(compiled.name)
    addresses = nodes.addresses(compiled, st.target, host_domain=st.host_domain, ssh_port=st.ssh_port,
                                stage_dir=st.stage_dir)
    cluster = Cluster(compiled.name, ClusterArgs(cluster=compiled, settings=st, addresses=addresses))
    pulumi.export("cluster", compiled.name)
    pulumi.export("inventory", cluster.inventory)
    pulumi.export("plan", cluster.plan)
    pulumi.export("slurmFiles", cluster.slurm_files)
    pulumi.export("renderedFiles", cluster.rendered_files)
    pulumi.export("enrollment", cluster.enrollment)
    pulumi.export("drift", cluster.drift)
    pulumi.export("ansibleSecrets", cluster.ansible_secrets)
    return cluster


def main(root: Path) -> None:
    """The entry: config is read here and nowhere else. Spec and config errors end the run with their
    message (file:line, field, fix) instead of a Python traceback."""
    try:
        st = settings_mod.from_config(pulumi.Config(settings_mod.NAMESPACE), root,
                                      pulumi.get_project(), pulumi.get_stack())
        build(st)
    except SpecError as exc:
        findings = "\n".join(f.render() for f in exc.findings)
        raise pulumi.RunError(f"the cluster spec has problems:\n{findings}") from None
    except UsageError as exc:
        raise pulumi.RunError(str(exc)) from None
