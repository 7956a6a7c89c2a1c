"""The component tree of a cluster stack.

    gpucluster:index:Cluster                 one per stack: inventory, plan, rendered-file hashes, secrets
    ├── gpucluster:index:NodeGroup           one per spec node group: hosts, enrolled count, drift
    │   └── NodeEnrollment (dynamic)         one per batch of nodes (nodes.py explains the granularity)
    ├── gpucluster:index:Fabric              the plan: switches per tier, links, oversubscription, ...
    ├── gpucluster:index:StorageTier         one per flash tier and per NFS tier
    └── ClusterSecret (dynamic)              munge key, slurmdbd password, bundle-signing key, unless given
                                             as config

Components take typed args built from the loaded spec and plan; none reads config or the YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi

from gpucluster.cluster import Cluster as Compiled
from gpucluster.configure.secrets import is_signing_key
from gpucluster.deploy import nodes as nodes_mod
from gpucluster.deploy.enroll import node_entry
from gpucluster.deploy.provider import FIXED_LENGTH, ClusterSecret, NodeEnrollment
from gpucluster.deploy.settings import DeploySettings
from gpucluster.deploy.stackoutputs import SLURM_FILES, file_hashes, inventory_args, inventory_json
from gpucluster.fabric import Plan
from gpucluster.fabric.summary import plan_summary
from gpucluster.spec.model import NodeGroup as SpecGroup

PREFIX = "gpucluster:index"


@dataclass(frozen=True)
class SshArgs:
    user: str
    known_hosts: str
    key_path: str | None
    key_text: pulumi.Output[str] | None  # secret
    timeout: float

    def as_input(self) -> dict:
        out: dict = {"user": self.user, "known_hosts": self.known_hosts, "timeout": self.timeout}
        if self.key_text is not None:
            out["key_text"] = self.key_text
        else:
            out["key_path"] = self.key_path
        return out


@dataclass(frozen=True)
class NodeGroupArgs:
    group: SpecGroup
    cluster: str
    target: str
    spec_path: str
    owner: dict
    expect: dict
    batches: list[nodes_mod.Batch]
    addresses: dict[str, tuple[str, int]]
    ssh: SshArgs
    parallel: int


class NodeGroup(pulumi.ComponentResource):
    enrolled: pulumi.Output[int]
    drift: pulumi.Output[dict]

    def __init__(self, name: str, args: NodeGroupArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PREFIX}:NodeGroup", name, None, opts)
        g = args.group
        ssh = args.ssh.as_input()
        self.batches = [
            NodeEnrollment(b.name, {
                "cluster": args.cluster, "group": g.name, "target": args.target, "spec": args.spec_path,
                "owner": args.owner, "expect": args.expect, "ssh": ssh, "parallel": args.parallel,
                "nodes": [node_entry(h, *args.addresses[h]) for h in b.hosts],
            }, pulumi.ResourceOptions(parent=self))
            for b in args.batches
        ]
        self.hosts = list(g.hosts)
        self.enrolled = pulumi.Output.all(*[b.enrolled for b in self.batches]).apply(lambda n: sum(x or 0 for x in n))
        self.drift = pulumi.Output.all(*[b.drift for b in self.batches]).apply(_merge)
        self.register_outputs({
            "name": g.name, "role": g.role, "count": g.count, "hostlist": g.hostlist,
            "batches": len(self.batches), "enrolled": self.enrolled, "drift": self.drift,
            "hardware": {k: v for k, v in args.expect.items() if k not in ("fields", "where")},
        })


def _checked_signing_key(value: str) -> str:
    if not is_signing_key(value):  # the message names the key, never the value
        raise pulumi.RunError("gpucluster:pullRunnerSigningKey is not an OpenSSH ed25519 private key file "
                              "(unencrypted) as base64; set it with pulumi config set --secret "
                              "gpucluster:pullRunnerSigningKey \"$(base64 -w0 KEY)\", KEY from "
                              "ssh-keygen -q -t ed25519 -N '' -f KEY")
    return value


def _merge(parts: list) -> dict:
    out: dict = {}
    for p in parts:
        out.update(p or {})
    return out


class Fabric(pulumi.ComponentResource):
    """The planned fabric as outputs; switches are counted, not modelled one by one."""

    def __init__(self, name: str, plan: Plan, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PREFIX}:Fabric", name, None, opts)
        s = plan_summary(plan)
        self.summary = {
            "type": s["fabric"]["type"], "design": s["fabric"]["design"], "tiers": s["tiers"],
            "linkGbps": s["fabric"]["link_gbps"], "rails": s["fabric"]["rails"], "endpoints": s["fabric"]["endpoints"],
            "switches": s["switches"], "switchModels": s["switch_models"], "links": s["links"],
            "oversubscription": s["oversubscription"], "bisectionTbps": s["bisection_tbps"],
            "units": s["units"]["count"], "pods": s["pods"], "slurmSwitches": s["slurm_switches"],
        }
        self.switches = pulumi.Output.from_input(s["switches"])
        self.links = pulumi.Output.from_input(s["links"])
        self.oversubscription = pulumi.Output.from_input(s["oversubscription"])
        self.register_outputs(self.summary)


@dataclass(frozen=True)
class StorageTierArgs:
    kind: str  # flash or nfs
    name: str
    summary: dict  # this tier's entry of plan_summary()["storage"]
    server_groups: tuple[str, ...]
    client_groups: tuple[str, ...]
    mounts: tuple[str, ...]
    servers: pulumi.Output  # enrolled count of the server groups: the tier exists once they are enrolled
    extra: dict = field(default_factory=dict)


class StorageTier(pulumi.ComponentResource):
    def __init__(self, name: str, args: StorageTierArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PREFIX}:StorageTier", name, None, opts)
        self.summary = {"kind": args.kind, "name": args.name, **args.summary, "serverGroups": list(args.server_groups),
                        "clientGroups": list(args.client_groups), "mounts": list(args.mounts), **args.extra}
        self.servers_enrolled = args.servers
        self.register_outputs({**self.summary, "serversEnrolled": self.servers_enrolled})


@dataclass(frozen=True)
class ClusterArgs:
    cluster: Compiled  # the compiled spec and plan (gpucluster.cluster)
    settings: DeploySettings
    addresses: dict[str, tuple[str, int]]


class Cluster(pulumi.ComponentResource):
    inventory: pulumi.Output[str]
    plan: pulumi.Output[dict]
    slurm_files: pulumi.Output[dict]
    ansible_secrets: pulumi.Output[dict]

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(f"{PREFIX}:Cluster", name, None, opts)
        from gpucluster.render import render_all

        compiled, st = args.cluster, args.settings
        loaded, plan, spec = compiled.loaded, compiled.plan, compiled.spec
        child = pulumi.ResourceOptions(parent=self)
        ssh = SshArgs(user=st.ssh_user, known_hosts=st.known_hosts, key_path=st.ssh_key_path,
                      key_text=st.ssh_private_key, timeout=st.ssh_timeout)
        owner = {"project": st.project, "stack": st.stack}
        self.node_groups = {
            g.name: NodeGroup(g.name, NodeGroupArgs(
                group=g, cluster=spec.name, target=st.target, spec_path=str(loaded.source), owner=owner,
                expect=nodes_mod.expectation(compiled, g, st.target).as_dict(),
                batches=nodes_mod.batches(g, st.enroll_batch), addresses=args.addresses, ssh=ssh,
                parallel=st.enroll_parallel,
            ), child)
            for g in spec.node_groups
        }
        self.fabric = Fabric("fabric", plan, child)
        summary = plan_summary(plan)
        self.storage = self._storage(compiled, summary, child)

        enrolled = pulumi.Output.all(*[ng.enrolled for ng in self.node_groups.values()])
        connection, extra = inventory_args(compiled, target=st.target, stack=st.stack, addresses=args.addresses,
                                           ssh_user=st.ssh_user, ssh_key_path=st.ssh_key_path,
                                           known_hosts=st.known_hosts, stage_dir=st.stage_dir)
        text = inventory_json(compiled, connection, extra)
        # The inventory is known once every node is enrolled: Ansible never sees an unchecked node.
        self.inventory = enrolled.apply(lambda _: text)
        self.plan = pulumi.Output.from_input(summary)
        rendered = file_hashes(render_all(compiled, cabling=False))
        self.rendered_files = pulumi.Output.from_input(rendered)
        self.slurm_files = pulumi.Output.from_input({k: v for k, v in rendered.items() if k in SLURM_FILES})
        self.enrollment = pulumi.Output.all(**{n: ng.enrolled for n, ng in self.node_groups.items()})
        self.drift = pulumi.Output.all(*[ng.drift for ng in self.node_groups.values()]).apply(_merge)

        self.secrets: list[ClusterSecret] = []
        munge = st.munge_key or self._secret("munge-key", "munge-key", 1024, child)
        values = {"munge_key_b64": munge}
        if spec.slurm.accounting:
            values["slurm_dbd_password"] = st.slurmdbd_password or self._secret(
                "slurmdbd-password", "password", 32, child)
        # One bundle-signing key per cluster, whichever machine pushes: roles/pull_runner writes it from the
        # operator's secrets file (`gpucluster secrets --pulumi-stack`) instead of generating one per state folder.
        values["pull_runner_signing_key_b64"] = (
            st.signing_key.apply(_checked_signing_key) if st.signing_key is not None
            else self._secret("bundle-signing-key", "ssh-ed25519", FIXED_LENGTH["ssh-ed25519"], child))
        self.ansible_secrets = pulumi.Output.secret(pulumi.Output.all(**values))
        self.register_outputs({
            "inventory": self.inventory, "plan": self.plan, "slurmFiles": self.slurm_files,
            "renderedFiles": self.rendered_files, "enrollment": self.enrollment, "drift": self.drift,
            "ansibleSecrets": self.ansible_secrets,
        })

    def _secret(self, name: str, kind: str, length: int, opts: pulumi.ResourceOptions) -> pulumi.Output[str]:
        res = ClusterSecret(name, kind, length, opts)
        self.secrets.append(res)
        return pulumi.Output.secret(res.value)

    def _storage(self, compiled: Compiled, summary: dict, opts: pulumi.ResourceOptions) -> list[StorageTier]:
        tiers = []
        st = compiled.spec.storage

        def enrolled(*groups: str) -> pulumi.Output:
            return pulumi.Output.all(*[self.node_groups[g].enrolled for g in dict.fromkeys(groups)]).apply(sum)

        if st.flash:
            f = st.flash
            tiers.append(StorageTier(f"flash-{f.name}", StorageTierArgs(
                kind="flash", name=f.name, summary=summary["storage"]["flash"],
                server_groups=tuple(dict.fromkeys((f.metadata_group, f.chunk_group))),
                client_groups=compiled.client_groups(f.client_groups), mounts=(f.mount,),
                servers=enrolled(f.metadata_group, f.chunk_group),
                extra={"replicas": f.replicas, "nvmePerServer": f.nvme_per_server},
            ), opts))
        for n, entry in zip(st.nfs, summary["storage"]["nfs"], strict=True):
            tiers.append(StorageTier(f"nfs-{n.name}", StorageTierArgs(
                kind="nfs", name=n.name, summary=entry, server_groups=(n.server_group,),
                client_groups=compiled.client_groups(n.client_groups), mounts=tuple(e.mount for e in n.exports),
                servers=enrolled(n.server_group),
                extra={"exports": [{"path": e.path, "mount": e.mount, "options": e.options} for e in n.exports]},
            ), opts))
        return tiers
