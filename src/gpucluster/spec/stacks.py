"""Driver stacks: which row of the version lock (`catalog.RELEASES`) each node group gets, and the rules
a spec's `drivers:` section must keep.

Why here and not in the roles: a Fabric Manager of another branch than the driver, or Debian's driver
on an NVSwitch board, installs without an error and fails only when a job starts CUDA. The spec check
refuses those mixes before anything is installed, and the roles take their versions from
`driver_stack()`, so what was checked is what gets pinned. docs/drivers.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpucluster.catalog import (
    DEBIAN_RELEASES,
    OFED_DEFAULT,
    OFED_PACKAGES,
    REPOSITORIES_BY_ARCH,
    Release,
    Repository,
)
from gpucluster.errors import Finding, did_you_mean
from gpucluster.spec.model import ClusterSpec, DriverChoice, NodeGroup

VENDOR_REPO = {"nvidia": "cuda-repo", "amd": "rocm-repo"}
OFED_NAMES = {"mlnx-ofed": "MLNX_OFED", "doca": "DOCA-host"}


@dataclass(frozen=True)
class Choice:
    """One setting of a group's stack and where the spec said it (None: the lock's default)."""

    value: str | None
    path: tuple | None


@dataclass(frozen=True)
class Resolved:
    group: NodeGroup
    index: int
    vendor: str | None
    source: Choice
    branch: Choice
    fm_branch: Choice
    ofed: Choice
    lock: dict[str, dict[str, Release]]  # the spec's merged lock: built-in rows plus catalog.releases

    @property
    def release(self) -> Release | None:
        if self.vendor is None or self.source.value is None or self.branch.value is None:
            return None
        if self.source.value == "debian":
            debian = DEBIAN_RELEASES[self.vendor]
            return debian if self.branch.value == debian.branch else None
        return self.lock.get(self.vendor, {}).get(self.branch.value)


def needs_fabric_manager(spec: ClusterSpec, group: NodeGroup) -> bool:
    """NVSwitch baseboards (HGX 8-GPU) need Fabric Manager before CUDA can use the GPUs."""
    model = spec.parts.gpus.get(group.gpu or "")
    return bool(model and model.vendor == "nvidia" and group.gpus_per_node in model.nvswitch_at)


def _pick(spec: ClusterSpec, group: NodeGroup, key: str) -> Choice:
    """The group's override, else the section's value, else None; with the spec path it came from."""
    drivers = spec.drivers
    override: DriverChoice | None = drivers.groups.get(group.name)
    if override is not None and getattr(override, key) is not None:
        return Choice(getattr(override, key), ("drivers", "groups", group.name, key))
    if getattr(drivers, key) is not None:
        return Choice(getattr(drivers, key), ("drivers", key))
    return Choice(None, None)


def resolve(spec: ClusterSpec, group: NodeGroup) -> Resolved:
    index = spec.node_groups.index(group)
    model = spec.parts.gpus.get(group.gpu or "") if group.gpus_per_node else None
    vendor = model.vendor if model else None
    source, branch, fm, ofed = (_pick(spec, group, k) for k in ("source", "branch", "fabric_manager_branch", "ofed"))
    gpu_path = ("node_groups", index, "gpu")
    if vendor is not None:
        if source.value is None:
            source = Choice(VENDOR_REPO[vendor], gpu_path)
        if branch.value is None:
            if source.value == "debian":
                branch = Choice(DEBIAN_RELEASES[vendor].branch, gpu_path)
            elif group.gpu in spec.parts.stacks:
                branch = Choice(spec.parts.stacks[group.gpu].default, gpu_path)
        if fm.value is None and branch.value is not None:
            fm = Choice(branch.value, branch.path)
    if ofed.value is None:
        ofed = Choice("inbox", None)
    return Resolved(group, index, vendor, source, branch, fm, ofed, spec.parts.releases)


# ---------------------------------------------------------------- the rules


def check(spec: ClusterSpec) -> Iterator[Finding]:
    """The rules of the `drivers:` and `health:` sections; spec/rules.py runs them with the others."""
    yield from check_stacks(spec)
    yield from check_health(spec)


def check_stacks(spec: ClusterSpec) -> Iterator[Finding]:
    """Every finding about driver stacks."""
    names = {g.name for g in spec.node_groups}
    for name in spec.drivers.groups:
        if name not in names:
            yield Finding(("drivers", "groups", name), f"'{name}' is not a node group",
                          did_you_mean(name, names) or "name a declared node group", "drivers")
    if spec.drivers.mirror and not _uses_mirror(spec):
        yield Finding(("drivers", "mirror"), "a mirror is set but no group has source: local-mirror",
                      "set source: local-mirror where the mirror should be used, or drop mirror", "drivers",
                      level="warning")
    for group in spec.node_groups:
        yield from _group_rules(spec, resolve(spec, group))


def _uses_mirror(spec: ClusterSpec) -> bool:
    return any(resolve(spec, g).source.value == "local-mirror" for g in spec.node_groups)


def _group_rules(spec: ClusterSpec, r: Resolved) -> Iterator[Finding]:
    g = r.group
    on_fabric = g in spec.fabric_groups
    if r.vendor is None:
        if g.gpu and g.gpu not in spec.parts.gpus:
            return  # the catalog rule reports the unknown GPU
        for choice, key in ((r.source, "source"), (r.branch, "branch"), (r.fm_branch, "fabric_manager_branch")):
            if choice.value is not None and choice.path and choice.path[1] == "groups":
                yield Finding(choice.path, f"group '{g.name}' has no GPU, so no driver {key.replace('_', ' ')}",
                              "drop it; only ofed applies to a group without GPUs", "drivers")
    else:
        yield from _source_rules(spec, r)
    if r.ofed.value != "inbox":
        yield from _ofed_rules(r, on_fabric)


def _source_rules(spec: ClusterSpec, r: Resolved) -> Iterator[Finding]:
    g, vendor, source = r.group, r.vendor, r.source.value
    other = {"nvidia": "rocm-repo", "amd": "cuda-repo"}[vendor]
    if source == other:
        yield Finding(r.source.path, f"group '{g.name}' has {vendor.upper()} GPUs ({g.gpu}); {source} serves the other"
                      " vendor", f"use source: {VENDOR_REPO[vendor]} (or local-mirror, or debian)", "driver-source")
        return
    if source == "local-mirror" and not spec.drivers.mirror:
        yield Finding(r.source.path, f"group '{g.name}' takes its drivers from a local mirror, but drivers.mirror is "
                      "not set", "set drivers.mirror to the base URL of your copy of the vendor repository",
                      "driver-source")
    if source == "debian":
        if needs_fabric_manager(spec, g):
            yield Finding(r.source.path, f"Debian's driver has no Fabric Manager, which {g.gpus_per_node} x {g.gpu} "
                          "(an NVSwitch board) needs before CUDA can use the GPUs",
                          "use source: cuda-repo (or local-mirror); debian suits PCIe cards", "fabric-manager")
        debian = DEBIAN_RELEASES[vendor]
        if r.branch.value != debian.branch:
            yield Finding(r.branch.path, f"Debian 12 packages {vendor} branch {debian.branch} only, not "
                          f"{r.branch.value}", f"drop the branch or set it to {debian.branch}, or use source: "
                          f"{VENDOR_REPO[vendor]}", "version-lock")
            return
    elif g.gpu not in spec.parts.stacks:
        yield Finding(("node_groups", r.index, "gpu"), f"no version lock for GPU '{g.gpu}': the vendor repository's "
                      "versions for it are unknown", f"add catalog.stacks.{g.gpu} (default and releases; a release the "
                      "built-in lock lacks goes under catalog.releases), or use drivers source: debian", "version-lock")
        return
    elif r.branch.value not in spec.parts.stacks[g.gpu].releases:
        what = "driver branch" if vendor == "nvidia" else "ROCm release"
        yield Finding(r.branch.path, f"{what} {r.branch.value} is not in the version lock for {g.gpu}",
                      f"use one of {', '.join(spec.parts.stacks[g.gpu].releases)}", "version-lock")
        return
    elif r.release is None or r.release.vendor != vendor:
        yield Finding(r.branch.path, f"the lock for {g.gpu} names {vendor} release {r.branch.value}, which has no row",
                      f"add catalog.releases.{vendor}.'{r.branch.value}' (driver, runtime, collective pins)",
                      "version-lock")
        return
    yield from _fabric_manager_rules(spec, r)


def _fabric_manager_rules(spec: ClusterSpec, r: Resolved) -> Iterator[Finding]:
    g = r.group
    if r.fm_branch.path is None or r.fm_branch.path[-1] != "fabric_manager_branch":
        return  # not written: it follows the driver branch
    if r.vendor == "amd":
        yield Finding(r.fm_branch.path, f"group '{g.name}' has AMD GPUs, which have no Fabric Manager",
                      "drop fabric_manager_branch", "drivers")
    elif r.fm_branch.value != r.branch.value:
        yield Finding(r.fm_branch.path, f"Fabric Manager branch {r.fm_branch.value} with driver branch "
                      f"{r.branch.value} on group '{g.name}': Fabric Manager refuses to start against another "
                      "driver version, and the GPUs stay unusable", f"drop fabric_manager_branch, or set it to "
                      f"{r.branch.value}", "version-mix")
    elif not needs_fabric_manager(spec, g):
        yield Finding(r.fm_branch.path, f"{g.gpus_per_node} x {g.gpu} has no NVSwitch, so no Fabric Manager is "
                      "installed", "drop fabric_manager_branch", "drivers", level="warning")


def _ofed_rules(r: Resolved, on_fabric: bool) -> Iterator[Finding]:
    g, kind = r.group, r.ofed.value
    if not on_fabric:
        if r.ofed.path and r.ofed.path[1] == "groups":
            yield Finding(r.ofed.path, f"group '{g.name}' is not on the back-end fabric, so no OFED is installed",
                          "drop ofed for it", "drivers", level="warning")
        return
    release = r.release
    if release is None or r.source.value == "debian":
        return  # no row of its own: OFED_DEFAULT applies
    if kind not in release.ofed:
        offered = ", ".join(sorted(release.ofed)) or "inbox only"
        what = "driver branch" if r.vendor == "nvidia" else "ROCm"
        yield Finding(r.ofed.path or ("drivers", "ofed"), f"{OFED_NAMES[kind]} has no release tested with {what} "
                      f"{release.branch} (group '{g.name}')", f"use ofed: {offered}", "version-mix")


# ---------------------------------------------------------------- what the roles get


def _mirrored(url: str, mirror: str | None) -> str:
    """The mirror keeps the vendor's path under its own base: https://m.site/x + /compute/... ."""
    if not mirror or not url.startswith(("http://", "https://")):
        return url
    parts = urlsplit(url)
    return mirror.rstrip("/") + parts.path + (f"?{parts.query}" if parts.query else "")


def _repositories(kind: str, release: str, mirror: str | None, arch: str = "x86_64") -> list[dict]:
    return [_repo(repo, release, mirror) for repo in REPOSITORIES_BY_ARCH[arch].get(kind, ())]


def _repo(repo: Repository, release: str, mirror: str | None) -> dict:
    uri = _mirrored(repo.uri.format(release=release), mirror)
    flat = repo.suites == ("/",)
    # Release, not InRelease: every apt repository has it, flat ones too.
    probe = uri.rstrip("/") + "/Release" if flat else f"{uri.rstrip('/')}/dists/{repo.suites[0]}/Release"
    return {"name": repo.name, "uri": uri, "suites": list(repo.suites), "components": list(repo.components),
            "key": _mirrored(repo.key, mirror), "probe": probe}


def _pins(release: Release | None) -> dict:
    if release is None:
        return {}
    out = {}
    for part in ("driver", "fabric_manager", "dcgm", "runtime", "collective"):
        pin = getattr(release, part)
        if pin is not None:
            out[part] = {"packages": list(pin.packages), "version": pin.version}
    return out


def driver_stack(spec: ClusterSpec, group_name: str) -> dict:
    """What the roles install on one node group, as plain data: source, branch, repositories, apt pins
    (packages and version per part), which services run, and the RDMA stack. Assumes a checked spec."""
    group = spec.group(group_name)
    r = resolve(spec, group)
    release = r.release
    source = r.source.value
    mirror = spec.drivers.mirror if source == "local-mirror" or spec.drivers.source == "local-mirror" else None
    # The lock's repositories for each host architecture it has them for; the role takes the one of the node's
    # architecture fact (gpucluster_for_arch), the rendered sources show the GPU's own (catalog host_arch).
    arches: dict[str, list[dict]] = {}
    if r.vendor is not None and release is not None:
        if source == "debian":
            # The node's own Debian mirror (the role reads it from the node's apt sources), non-free added; one
            # archive for every architecture.
            debian = [{"name": f"gpucluster-{r.vendor}-debian", "uri": "", "suites": ["bookworm", "bookworm-updates"],
                       "components": ["non-free", "non-free-firmware"],
                       "key": "/usr/share/keyrings/debian-archive-keyring.gpg", "probe": ""}]
            arches = {arch: debian for arch in REPOSITORIES_BY_ARCH}
        else:
            arches = {arch: repos for arch in REPOSITORIES_BY_ARCH
                      if (repos := _repositories(VENDOR_REPO[r.vendor], release.branch, mirror, arch))}
    model = spec.parts.gpus.get(group.gpu or "") if r.vendor else None
    host_arch = model.host_arch if model else "x86_64"
    repos = arches.get(host_arch, [])
    on_fabric = group in spec.fabric_groups
    kind = r.ofed.value if on_fabric else "inbox"
    ofed: dict = {"kind": kind, "version": "", "packages": [], "repositories": []}
    if kind != "inbox":
        version = (release.ofed.get(kind) if release is not None and source != "debian" else None) \
            or OFED_DEFAULT[kind]
        ofed.update(version=version, packages=list(OFED_PACKAGES[kind]),
                    repositories=_repositories(kind, version, mirror))
    pins = _pins(release)
    fm = needs_fabric_manager(spec, group) and "fabric_manager" in pins
    if "fabric_manager" in pins and not fm:
        del pins["fabric_manager"]
    return {
        "group": group.name,
        "vendor": r.vendor,
        "gpu": group.gpu if r.vendor else None,
        "gpus_per_node": group.gpus_per_node,
        "source": source,
        "branch": r.branch.value,
        "toolkit": release.toolkit if release else "",
        "host_arch": host_arch,
        "repositories": repos,
        "arch_repositories": arches,
        "pins": pins,
        "fabric_manager": fm,
        "dcgm": "dcgm" in pins,
        "persistenced": "nvidia-persistenced" in pins.get("driver", {}).get("packages", []),
        # nvidia-peermem needs the peer-memory API of MLNX_OFED / DOCA; with the inbox stack GPUDirect
        # RDMA goes through DMA-BUF instead (open kernel module, kernel >= 5.12).
        "peermem": r.vendor == "nvidia" and on_fabric and kind != "inbox",
        "fabric": on_fabric,
        "ofed": ofed,
    }


def driver_stacks(spec: ClusterSpec) -> dict[str, dict]:
    """driver_stack() of every group with GPUs or on the back-end fabric."""
    return {g.name: driver_stack(spec, g.name) for g in spec.node_groups
            if (g.gpu and g.gpus_per_node) or g in spec.fabric_groups}


# ---------------------------------------------------------------- node health (docs/health.md)

# The node checks gpucluster ships; per-tier mount checks are named mount-<tier name>.
HEALTH_CHECKS = ("gpu-count", "gpu-ecc", "gpu-xid", "fabric-manager", "nvlink-fabric", "hca-ports", "link-flap",
                 "munge", "disk-tmp", "disk-spool")
RUN_MARGIN_S = 10  # the runner's own work (scontrol show + update, 5 s each at most) on top of the slowest check


def mount_check_names(spec: ClusterSpec) -> list[str]:
    names = []
    if spec.storage.flash:
        names.append(f"mount-{spec.storage.flash.name}")
    for tier in spec.storage.nfs:
        names += [f"mount-{tier.name}" + (f"-{i + 1}" if i else "") for i in range(len(tier.exports))]
    return names


def check_health(spec: ClusterSpec) -> Iterator[Finding]:
    health = spec.health
    known = [*HEALTH_CHECKS, *mount_check_names(spec)]
    for i, name in enumerate(health.skip):
        if name not in known:
            yield Finding(("health", "skip", i), f"'{name}' is not a health check of this cluster",
                          did_you_mean(name, known) or f"use one of {', '.join(known)}", "health")
    if health.enabled and health.interval < health.check_timeout + RUN_MARGIN_S:
        yield Finding(("health", "interval"), f"a run takes up to {health.check_timeout + RUN_MARGIN_S} s "
                      f"(check_timeout {health.check_timeout} s + {RUN_MARGIN_S} s), longer than the interval "
                      f"of {health.interval} s", f"set interval to at least {health.check_timeout + RUN_MARGIN_S}"
                      " or lower check_timeout", "health")
    active = health.active
    partitions = [p.name for p in spec.slurm.partitions]
    if active.partition is not None and active.partition not in partitions:
        yield Finding(("health", "active", "partition"), f"'{active.partition}' is not a partition",
                      did_you_mean(active.partition, partitions) or f"use one of {', '.join(partitions)}", "health")
    vendors = {spec.parts.gpus[g.gpu].vendor for g in spec.gpu_groups if g.gpu in spec.parts.gpus}
    for i, name in enumerate(active.checks):
        if name == "dcgm-diag" and "nvidia" not in vendors:
            yield Finding(("health", "active", "checks", i), "dcgm-diag needs NVIDIA GPUs; this cluster has none",
                          "drop it", "health", level="warning")
        if name == "ib-bandwidth" and not spec.fabric_groups:
            yield Finding(("health", "active", "checks", i), "ib-bandwidth needs nodes on the back-end fabric",
                          "drop it", "health", level="warning")
