"""Which checks each compute node group runs, with what it expects, from the spec and the plan.

The result is the JSON file the slurm_health role installs as /etc/gpucluster/health/config.json: the
node side (node/checks.py) reads only that, so expected values (GPU count and model, HCA names and rate,
mount points, thresholds) come from the spec and the plan, never from the node's own idea of itself.
"""

from __future__ import annotations

from gpucluster.catalog import NvlinkRack
from gpucluster.cluster import Cluster
from gpucluster.cluster.unitnames import unit_name
from gpucluster.render.health import breakerconf
from gpucluster.render.slurm import SPOOL_DIR
from gpucluster.spec.model import NodeGroup
from gpucluster.spec.stacks import RUN_MARGIN_S, driver_stack, needs_fabric_manager

# node_exporter's textfile collector folder (Debian's prometheus-node-exporter default): the runner writes its
# metrics there when the folder exists (node/promtext.py).
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
STATE_DIR = "/var/lib/gpucluster/health"
SITE_DIR = "/etc/gpucluster/health.d"
SKIP_DIR = "/var/lib/gpucluster/skipped"  # where roles record what they skipped (docs/storage.md)
RUN_DIR = "/run/gpucluster/health"  # the private munged's folders (node/privmunge.py), gone at reboot
MUNGE_KEY = "/etc/munge/munge.key"  # where the munge role installs the cluster's key (Debian)
# Device files Slurm's gres.conf names (render/slurm.py gpu_files), per vendor: (folder/regex of a
# name, GPU i's name is prefix + (first + i)).
DEVICES = {"nvidia": (r"/dev/nvidia\d+", "nvidia", 0), "amd": (r"/dev/dri/renderD\d+", "renderD", 128)}
# How long a mount may take to answer statvfs + listdir before the node drains. A metadata server under load
# (a checkpoint storm) can take seconds, and every client asks at once: 5 s drained all four staged GPU nodes
# twice in one CI run while the shared 2-core machine ran two converges. A hung mount still drains within the
# same health run (the check's budget is 20 s by default).
MOUNT_STAT_TIMEOUT_S = 15
# Where gpu-xid reads the kernel log: "kmsg" is /dev/kmsg (sequence numbers: "since the last run" is exact, no
# journald needed); a path names a text file of kernel lines instead (node/xid.py).
KERNEL_LOG = "kmsg"


def _client_groups(spec, declared) -> list[str]:
    if declared is not None:
        return list(declared)
    return [g.name for g in spec.node_groups if g.role in ("compute", "login")]


def mount_checks(cluster: Cluster, group: NodeGroup) -> list[dict]:
    spec = cluster.spec
    out = []
    flash = spec.storage.flash
    if flash and group.name in _client_groups(spec, flash.client_groups):
        out.append({"name": f"mount-{flash.name}", "kind": "mount", "path": flash.mount, "fstype": "fuse",
                    "stat_timeout": MOUNT_STAT_TIMEOUT_S})
    for tier in spec.storage.nfs:
        if group.name not in _client_groups(spec, tier.client_groups):
            continue
        for i, export in enumerate(tier.exports):
            out.append({"name": f"mount-{tier.name}" + (f"-{i + 1}" if i else ""), "kind": "mount",
                        "path": export.mount, "fstype": "nfs", "stat_timeout": MOUNT_STAT_TIMEOUT_S,
                        # Where the kernel has no NFS client the nfs role skips the mount and says why.
                        "skip_record": f"{SKIP_DIR}/nfs-mount-{unit_name(export.mount)}"})
    return out


def nvlink_check(rack: NvlinkRack, count: int) -> dict:
    """A tray of a rack-scale NVLink domain: IMEX runs, each GPU's fabric registration completed with a clique and
    cluster the tray's GPUs share, and its NVLinks are all up at the catalog's rate (docs/health.md: the tray that
    fails drains; the rest of its domain stays in service). A catalog entry without link figures checks the
    fabric registration alone."""
    check: dict = {"name": "nvlink-fabric", "kind": "nvlink-fabric", "unit": "nvidia-imex.service", "count": count}
    if rack.links_per_gpu:
        check["links"] = rack.links_per_gpu
        if rack.link_mbytes_per_s:
            check["link_mbytes_per_s"] = rack.link_mbytes_per_s
    return check


def xid_check(cluster: Cluster) -> dict:
    """GPU errors of the kernel log since the last run (node/xid.py: its table, with the site's overrides)."""
    overrides = {str(code): action for code, action in sorted(cluster.spec.health.xid_actions.items())}
    return {"name": "gpu-xid", "kind": "gpu-xid", "kernel_log": KERNEL_LOG, "xid_actions": overrides}


def timer_period(interval: int) -> int:
    """How often the node's timer looks whether slurmd has run the checks (a third of the interval)."""
    return max(1, interval // 3)


def stale_after(interval: int) -> int:
    """No run for this long and the timer runs the checks itself: slurmd's own runs come every interval, a
    second or two late, and a quarter interval of grace keeps the two from both counting one interval. A
    node whose slurmd no longer runs them is checked at most stale_after + timer_period after the last run
    (1.6 intervals: a stopped munged drains its node within two)."""
    return interval + max(2, interval // 4)


def node_config(cluster: Cluster, group_name: str) -> dict:
    """The health config of one compute node group: the checks in the order their failures are reported."""
    spec, plan = cluster.spec, cluster.plan
    health = spec.health
    group = spec.group(group_name)
    checks: list[dict] = [{"name": "munge", "kind": "munge"}]
    model = spec.parts.gpus.get(group.gpu or "") if group.gpus_per_node else None
    if model is not None:
        count = group.gpus_per_node
        pattern, prefix, first = DEVICES[model.vendor]
        checks.append({"name": "gpu-count", "kind": "gpu-count", "vendor": model.vendor, "count": count,
                       "model": model.slurm_type, "memory_gb": model.memory_gb, "devices": pattern,
                       "device_prefix": prefix, "device_first": first})
        checks.append({"name": "gpu-ecc", "kind": "gpu-ecc", "vendor": model.vendor,
                       "max_uncorrected": health.ecc_uncorrected_max})
        checks.append(xid_check(cluster))
        if needs_fabric_manager(spec, group) and driver_stack(spec, group.name)["fabric_manager"]:
            checks.append({"name": "fabric-manager", "kind": "service", "unit": "nvidia-fabricmanager.service"})
        if model.nvlink_domain is not None:
            checks.append(nvlink_check(model.nvlink_domain, count))
    nic = spec.parts.nics.get(group.nic or "") if group.nics_per_node else None
    if nic is not None and nic.rdma and group in spec.fabric_groups:
        hcas = plan.hcas(group)
        checks.append({"name": "hca-ports", "kind": "hca-ports", "hcas": hcas, "rate_gbps": plan.speed_gbps})
        checks.append({"name": "link-flap", "kind": "link-flap", "hcas": hcas,
                       "max_increase": health.link_downed_max})
    checks += mount_checks(cluster, group)
    checks.append({"name": "disk-tmp", "kind": "disk", "path": "/tmp", "min_free_pct": health.min_free_pct})
    checks.append({"name": "disk-spool", "kind": "disk", "path": SPOOL_DIR, "min_free_pct": health.min_free_pct})
    checks = [{**c, "timeout": health.check_timeout} for c in checks if c["name"] not in health.skip]
    return {
        "version": 1,
        "cluster": spec.name,
        "group": group.name,
        "interval": health.interval,
        "check_timeout": health.check_timeout,
        "run_budget": health.check_timeout + RUN_MARGIN_S,
        "resume_after": health.resume_after,
        "fail_after": health.fail_after,
        "lifecycle": {"triages": health.lifecycle.triages, "window_s": health.lifecycle.window_days * 86400},
        "stale_after": stale_after(health.interval),
        "munge_key": MUNGE_KEY,
        "run_dir": RUN_DIR,
        "state_dir": STATE_DIR,
        "textfile_dir": TEXTFILE_DIR,
        "site_dir": SITE_DIR,
        "checks": checks,
        **breakerconf.config_keys(cluster, group.name),
    }


def node_configs(cluster: Cluster) -> dict[str, dict]:
    """node_config() of every compute group (where slurmd, and so the HealthCheckProgram, runs)."""
    return {g.name: node_config(cluster, g.name) for g in cluster.spec.groups_with_role("compute")}
