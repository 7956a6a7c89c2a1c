"""Rules of meaning that depend on slurm.version: the release must be one gpucluster renders for, and
every setting the spec chooses, or passes through slurm.parameters, must exist in that release.

What each release takes is data (spec/slurm_versions.py); this module only turns it into findings:
a setting the release lacks is an error naming the release that added or removed it; a deprecated one
is a warning naming its replacement.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpucluster.errors import Finding, did_you_mean, shown
from gpucluster.spec.model import ClusterSpec
from gpucluster.spec.slurm_versions import RELEASES, Change, changes_for, feature, is_release, version_tuple

RULE = "slurm-version"
HEALTH_CHECK_STATES = ("ALLOC", "ANY", "CYCLE", "IDLE", "MIXED")  # every release; later ones are FEATURES
HEALTH_CHECK_FEATURES = ("hc-nondrained-idle", "hc-start-only", "hc-reboot-only")


def version_rules(spec: ClusterSpec) -> Iterator[Finding]:
    version = spec.slurm.version
    if not is_release(version):
        yield Finding(("slurm", "version"), f"Slurm {shown(version, 20)} is not a release gpucluster renders for",
                      f"use one of {', '.join(RELEASES)}", RULE)
        return
    yield from _rendered(spec, version)
    yield from _health_check(spec, version)
    yield from _parameters(spec, version)


def _gate(path: tuple, change: Change, version: str, what: str | None = None) -> Iterator[Finding]:
    """The finding for one setting at one release: too new, removed, or deprecated; none when fine."""
    what = what or change.setting
    if change.added and version_tuple(version) < version_tuple(change.added):
        yield Finding(path, f"{what} needs Slurm {change.added} or later (added in {change.added}); "
                      f"slurm.version is {version}",
                      f"remove it, or set slurm.version to {change.added} or later", RULE)
    elif not change.supported(version):
        when = f"in {change.removed}" if change.exact else f"by {change.removed} at the latest"
        yield Finding(path, f"{what} was removed from Slurm {when}; slurm.version is {version}",
                      f"{change.replacement or 'remove it'}, or set slurm.version below {change.removed}", RULE)
    elif change.deprecated_in(version):
        yield Finding(path, f"{what} is deprecated since Slurm {change.deprecated}", change.replacement or "remove it",
                      RULE, level="warning")


def _rendered(spec: ClusterSpec, version: str) -> Iterator[Finding]:
    """Features the spec's own fields choose, which the renderer writes."""
    slurm = spec.slurm
    if slurm.topology == "block":
        yield from _gate(("slurm", "topology"), feature("topology-block"), version, "topology: block (topology/block)")
    for i, p in enumerate(slurm.partitions):
        if p.topology is None or p.topology == slurm.topology:
            continue
        at = ("slurm", "partitions", i, "topology")
        # a partition with a topology of its own is a second named topology: topology.yaml
        yield from _gate(at, feature("topology-yaml"), version,
                         f"partition '{p.name}' with its own topology ({p.topology}; topology.yaml)")
        if p.topology == "block":
            yield from _gate(at, feature("topology-block"), version, "topology: block (topology/block)")
    for i, g in enumerate(spec.node_groups):
        if g.gres_detect == "nvidia":
            yield from _gate(("node_groups", i, "gres_detect"), feature("gres-autodetect-nvidia"), version,
                             "gres_detect: nvidia (gres.conf AutoDetect=nvidia)")


def _health_check(spec: ClusterSpec, version: str) -> Iterator[Finding]:
    hc = spec.health  # gpucluster's health checks: HealthCheckNodeState (docs/health.md)
    if not hc.enabled:
        return
    at = ("health", "node_state")
    flags = [f.strip().upper() for f in hc.node_state.split(",") if f.strip()]
    known = set(HEALTH_CHECK_STATES) | {feature(n).value for n in HEALTH_CHECK_FEATURES}
    for flag in flags:
        if flag not in known:
            # 22.05 .. 26.05 only log "Invalid HealthCheckNodeState value X ignored" and run the check anyway
            yield Finding(at, f"'{flag}' is not a HealthCheckNodeState", did_you_mean(flag, known)
                          or f"use {', '.join(sorted(known))}", RULE)
    for name in HEALTH_CHECK_FEATURES:
        change = feature(name)
        if change.value and change.value.upper() in flags:
            yield from _gate(at, change, version, f"node_state {change.value}")
    only = [f for f in flags if f.endswith("_ONLY")]
    if only and len(flags) > 1:
        # slurm.conf(5) of 26.05: "Multiple state values may be specified ... except for the *_ONLY states";
        # 26.05.5's slurmctld stops: "HealthCheckNodeState=START_ONLY cannot be combined with other options"
        yield Finding(at, f"{only[0]} cannot be combined with other node states",
                      f"set node_state to {only[0]} alone", RULE)


def _parameters(spec: ClusterSpec, version: str) -> Iterator[Finding]:
    for key, value in spec.slurm.parameters.items():
        for change in changes_for(key, str(value)):
            yield from _gate(("slurm", "parameters", key), change, version)
