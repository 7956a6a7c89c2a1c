"""Every node: services, time, packages and sysctls; munge on every Slurm node."""

from __future__ import annotations

import fnmatch

import pytest
from gpc_checklib import host_facts, journal, run, stat, unit_state


def _services(ctx, host):
    """Every service the host's groups run, reported under the first group that needs it."""
    seen = []
    for group in ["all", *ctx.groups_of(host)]:
        for unit in ctx.doc["services"].get(group, []):
            if unit not in seen:
                seen.append(unit)
                yield unit, unit, group


@pytest.mark.per("all", items=_services)
def test_service_active(ctx, node, target, item):
    st = host_facts(ctx, target.host)["units"].get(item) or unit_state(node, item)
    if st.get("ActiveState") != "active":
        state = f"{st.get('ActiveState', 'unknown')} ({st.get('SubState', '?')})"
        if st.get("LoadState") == "not-found":
            state = "not installed"
        pytest.fail(f"{target.host}: service {item} is {state}, expected active\n{journal(node, item)}",
                    pytrace=False)
    assert st.get("UnitFileState") in ("enabled", "static", "generated", "enabled-runtime", "indirect"), (
        f"{target.host}: service {item} runs but is {st.get('UnitFileState')}: it will not start after a reboot")


SLURM_HOSTS = ("slurm_controller", "slurm_compute", "slurm_login", "slurm_dbd")


@pytest.mark.per(SLURM_HOSTS)
def test_munge_key_mode(node, target, doc):
    path = doc["munge"]["key"]
    st = stat(node, path)
    assert st is not None, f"{target.host}: {path} is missing"
    mode, user, group = st
    assert (mode, user, group) == (0o400, "munge", "munge"), (
        f"{target.host}: {path} is mode {oct(mode)} {user}:{group}, expected 0o400 munge:munge")


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
def test_time_sync(ctx, node, target):
    virt = host_facts(ctx, target.host)["container"]
    if virt:
        # A container has no clock of its own: it reads the host kernel's, which the host keeps in sync.
        pytest.skip(f"{target.host}: {virt} container: the clock is the host kernel's, kept by the host; "
                    "no time daemon runs in the node")
    out = run(node, "timedatectl show -p NTPSynchronized --value")
    if out.stdout.strip() != "yes":
        active = [u for u in ("chrony", "chronyd", "systemd-timesyncd", "ntp", "ntpsec")
                  if unit_state(node, u).get("ActiveState") == "active"]
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
def test_package_pinned(ctx, target, item):
    """Installed at the version `gpucluster configure` pins (role defaults, or the inventory's override);
    a default that differs by Debian release is the one of the node's release."""
    name, version = item
    facts = host_facts(ctx, target.host)
    if isinstance(version, dict):
        release = facts.get("release") or "?"
        assert release in version, (f"{target.host}: runs Debian {release}; the roles pin {name} for Debian "
                                    f"{', '.join(sorted(version))} only (roles/*/vars/Debian-<major>.yml)")
        version = version[release]
    got = facts["packages"].get(name)
    assert got is not None, f"{target.host}: package {name} is not installed (pinned {version})"
    assert fnmatch.fnmatchcase(got, version), f"{target.host}: {name} {got} installed, pinned to {version}"


@pytest.mark.per(SLURM_HOSTS)
def test_slurm_release_matches_spec(ctx, target, doc):
    got = host_facts(ctx, target.host)["packages"].get("slurm-client") or "not installed"
    want = doc["slurm"]["version"]
    assert got.startswith(want + "."), f"{target.host}: slurm-client {got}, the spec declares Slurm {want}"


def _sysctls(ctx, host):
    for group in ["all", *ctx.groups_of(host)]:
        for key, value in (ctx.doc.get("sysctls", {}).get(group) or {}).items():
            yield key, (key, value), group


@pytest.mark.per("all", items=_sysctls)
def test_sysctl(ctx, target, doc, item):
    """Persisted in the role's sysctl.d file, and live where the kernel lets the node write it. A single
    integer is a minimum (roles/common, module gpucluster_sysctl): a live value already above it is
    kept, neither lowered nor persisted (fs.file-max, which the kernel sizes from the RAM)."""
    key, value = item
    want = " ".join(str(value).split())
    facts = host_facts(ctx, target.host)
    persisted = facts["sysctl_file"]
    live = facts["sysctls"].get(key, {"access": "missing", "value": ""})
    got = live["value"]
    want_n, got_n = _as_int(want), _as_int(got)
    if want_n is not None and got_n is not None and got_n > want_n:
        assert key not in persisted or (_as_int(persisted[key]) or 0) >= want_n, (
            f"{target.host}: {doc['sysctl_file']} lowers {key} to {persisted[key]} (minimum {want})")
        return  # above the minimum live: kept as the kernel set it
    assert persisted.get(key) == want, (
        f"{target.host}: {doc['sysctl_file']} has {key} = {persisted.get(key, '(absent)')}, expected {want}")
    if live["access"] == "missing":
        if facts["container"]:
            pytest.skip(f"{target.host}: {key} does not exist in a {facts['container']} container's namespace "
                        "(persisted; set it on the host)")
        pytest.fail(f"{target.host}: {key} is not a setting of this kernel", pytrace=False)
    if got != want and live["access"] == "ro":
        pytest.skip(f"{target.host}: {key} is read-only here (/proc/sys of a container): persisted, not live; "
                    "set it on the host")
    assert got == want, f"{target.host}: {key} = {got} live, expected {want} (persisted, not applied)"


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None
