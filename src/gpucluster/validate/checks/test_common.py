"""Every node: services, time, packages and sysctls; munge on every Slurm node."""

from __future__ import annotations

import fnmatch

import pytest
from gpc_checklib import journal, run


def _services(ctx, host):
    """Every service the host's groups run, reported under the first group that needs it."""
    seen = []
    for group in ["all", *ctx.groups_of(host)]:
        for unit in ctx.doc["services"].get(group, []):
            if unit not in seen:
                seen.append(unit)
                yield unit, unit, group


@pytest.mark.per("all", items=_services)
def test_service_active(node, target, item):
    svc = node.service(item)
    if not svc.is_running:
        state = run(node, f"systemctl is-active {item}").stdout.strip() or "unknown"
        pytest.fail(f"{target.host}: service {item} is {state}, expected active\n{journal(node, item)}",
                    pytrace=False)
    assert svc.is_enabled, f"{target.host}: service {item} runs but is not enabled: it will not start after a reboot"


SLURM_HOSTS = ("slurm_controller", "slurm_compute", "slurm_login", "slurm_dbd")


@pytest.mark.per(SLURM_HOSTS)
def test_munge_key_mode(node, target, doc):
    key = node.file(doc["munge"]["key"])
    assert key.exists, f"{target.host}: {key.path} is missing"
    got = (oct(key.mode), key.user, key.group)
    assert got == (oct(0o400), "munge", "munge"), (
        f"{target.host}: {key.path} is mode {got[0]} {got[1]}:{got[2]}, expected 0o400 munge:munge")


def _munge_reference(ctx) -> tuple[str | None, str]:
    """The cluster's munge key hash: from the secrets dir, else from the first controller."""
    m = ctx.doc["munge"]
    if m.get("key_sha256"):
        return m["key_sha256"], m.get("reference") or "reference"
    if ctx.mode == "local" or not ctx.controller:
        return None, "no reference"

    def fetch():
        out = run(ctx.host(ctx.controller), f"sha256sum {m['key']}")
        return out.stdout.split()[0] if out.rc == 0 and out.stdout else None

    return ctx.cached("munge-ref", fetch), ctx.controller


@pytest.mark.per(SLURM_HOSTS)
def test_munge_key_matches_cluster(node, target, ctx, doc):
    ref, where = _munge_reference(ctx)
    if ref is None:
        pytest.fail(f"{target.host}: no reference munge key hash (no secrets dir key, controller unreadable)",
                    pytrace=False)
    out = run(node, f"sha256sum {doc['munge']['key']}")  # a hash: the key itself is never read back
    assert out.rc == 0, f"{target.host}: cannot hash {doc['munge']['key']}: {out.stderr.strip()}"
    got = out.stdout.split()[0]
    assert got == ref, (f"{target.host}: munge key differs from the cluster's (sha256 {got[:8]}… vs {ref[:8]}… "
                        f"from {where}); this node cannot talk to slurmctld")


@pytest.mark.per("all")
def test_time_sync(node, target):
    virt = run(node, "systemd-detect-virt --container").stdout.strip()
    if virt and virt != "none":
        # A container has no clock of its own: it reads the host kernel's, which the host keeps in sync.
        pytest.skip(f"{target.host}: {virt} container: the clock is the host kernel's, kept by the host; "
                    "no time daemon runs in the node")
    out = run(node, "timedatectl show -p NTPSynchronized --value")
    if out.stdout.strip() != "yes":
        active = [u for u in ("chrony", "chronyd", "systemd-timesyncd", "ntp", "ntpsec")
                  if node.service(u).is_running]
        pytest.fail(f"{target.host}: clock not synchronized (NTPSynchronized={out.stdout.strip() or '?'}, "
                    f"running: {', '.join(active) or 'no time daemon'})", pytrace=False)


def _packages(ctx, host):
    seen = set()
    for group in ["all", *ctx.groups_of(host)]:
        for name, version in (ctx.doc.get("packages", {}).get(group) or {}).items():
            if name not in seen:
                seen.add(name)
                yield name, (name, version), group


@pytest.mark.per("all", items=_packages)
def test_package_pinned(node, target, item):
    """Installed at the version `gpucluster configure` pins (role defaults, or the inventory's override)."""
    name, version = item
    pkg = node.package(name)
    assert pkg.is_installed, f"{target.host}: package {name} is not installed (pinned {version})"
    got = pkg.version
    assert fnmatch.fnmatchcase(got, version), f"{target.host}: {name} {got} installed, pinned to {version}"


@pytest.mark.per(SLURM_HOSTS)
def test_slurm_release_matches_spec(node, target, doc):
    got = node.package("slurm-client").version if node.package("slurm-client").is_installed else "not installed"
    want = doc["slurm"]["version"]
    assert got.startswith(want + "."), f"{target.host}: slurm-client {got}, the spec declares Slurm {want}"


def _sysctls(ctx, host):
    for group in ["all", *ctx.groups_of(host)]:
        for key, value in (ctx.doc.get("sysctls", {}).get(group) or {}).items():
            yield key, (key, value), group


@pytest.mark.per("all", items=_sysctls)
def test_sysctl(node, target, doc, item):
    """Persisted in the role's sysctl.d file, and live where the kernel lets the node write it."""
    key, value = item
    want = " ".join(str(value).split())
    conf = node.file(doc["sysctl_file"])
    persisted = {}
    if conf.exists:
        for line in conf.content_string.splitlines():
            if "=" in line and not line.lstrip().startswith(("#", ";")):
                k, v = line.split("=", 1)
                persisted[k.strip()] = " ".join(v.split())
    assert persisted.get(key) == want, (
        f"{target.host}: {doc['sysctl_file']} has {key} = {persisted.get(key, '(absent)')}, expected {want}")
    proc = "/proc/sys/" + key.replace(".", "/")
    out = run(node, f"cat {proc}")
    assert out.rc == 0, f"{target.host}: {key} is not a setting of this kernel ({out.stderr.strip()})"
    got = " ".join(out.stdout.split())
    if got != want and run(node, f"test -w {proc}").rc != 0:
        pytest.skip(f"{target.host}: {key} is read-only here (/proc/sys of a container): persisted, not live "
                    f"(live {got}); set it on the host")
    assert got == want, f"{target.host}: {key} = {got} live, expected {want} (persisted, not applied)"
