"""Storage: the flash tier's FUSE mount (present, read/write, one namespace across nodes) and the NFS tier."""

from __future__ import annotations

import secrets
import shlex
import time

import pytest
from gpc_checklib import PROBE_DIR, run

SKIP_RECORDS = "/var/lib/gpucluster/skipped"  # where roles record a step they skipped, with the reason


def _flash(doc):
    if not doc.get("flash"):
        pytest.skip("the spec declares no flash tier")
    return doc["flash"]


def _require_mounted(node, target, fl) -> None:
    """Never write into an unmounted mount point: files there would hide the tier and stop the mount
    unit ('mountpoint is not empty')."""
    out = run(node, f"findmnt -n -o FSTYPE {shlex.quote(fl['mount'])}")
    if out.rc != 0 or not out.stdout.strip().startswith("fuse"):
        pytest.fail(f"{target.host}: {fl['mount']} is not the flash tier's FUSE mount "
                    f"({out.stdout.strip() or 'not mounted'}); nothing written", pytrace=False)


@pytest.mark.per("flash_client")
def test_flash_mounted(node, target, doc):
    fl = _flash(doc)
    out = run(node, f"findmnt -n -o FSTYPE,SOURCE {shlex.quote(fl['mount'])}")
    assert out.rc == 0 and out.stdout.strip(), (
        f"{target.host}: {fl['mount']} is not mounted (flash tier {fl['name']} from {fl['master']}); "
        f"unit {fl['unit']}: {run(node, 'systemctl is-active ' + shlex.quote(fl['unit'])).stdout.strip()}")
    fstype = out.stdout.split()[0]
    assert fstype.startswith("fuse"), f"{target.host}: {fl['mount']} is {fstype}, expected a FUSE mount"


@pytest.mark.per("flash_client")
def test_flash_read_write(node, target, doc):
    fl = _flash(doc)
    _require_mounted(node, target, fl)
    d = f"{fl['mount']}/{PROBE_DIR}"
    path = f"{d}/{doc['run_id']}.{target.host}.{secrets.token_hex(4)}.rw"
    cmd = (f"mkdir -p {d} && a=$(head -c 1048576 /dev/urandom | tee {path} | sha256sum) && sync {path} && "
           f"b=$(sha256sum < {path}) && rm -f {path} && [ \"$a\" = \"$b\" ] && echo ok")
    out = run(node, cmd, timeout=120)
    assert out.rc == 0 and out.stdout.strip() == "ok", (
        f"{target.host}: write/read of 1 MiB on {fl['mount']} failed (rc {out.rc}): {out.stderr.strip()[-300:]}")


def _ring_peer(ctx, host: str) -> str | None:
    """The next flash client after `host` among those validated in the same place (this run, or this job)."""
    pool = [h for h in ctx.peers if ctx.in_group(h, "flash_client")]
    if host not in pool or len(pool) < 2:
        return None
    return pool[(pool.index(host) + 1) % len(pool)]


@pytest.mark.per("flash_client")
def test_flash_same_content_across_nodes(ctx, node, target, doc):
    """A file one node writes is read back, byte for byte, by another node."""
    fl = _flash(doc)
    _require_mounted(node, target, fl)
    peer = _ring_peer(ctx, target.host)
    if peer is None:
        pytest.skip(f"{target.host}: no second flash client validated alongside it (use a wider --limit)")
    # Over SSH: a file per run and host, removed again. In a Slurm job: inside the run's bundle folder
    # (removed with it), where every node of the job writes its token and reads its neighbour's.
    d = f"{fl['mount']}/{PROBE_DIR}" + (f"/{doc['run_id']}" if ctx.mode == "local" else "")
    token = f"{doc['run_id']}:{target.host}"
    mine = f"{d}/{doc['run_id']}.{target.host}.token"
    out = run(node, f"mkdir -p {d} && printf %s {shlex.quote(token)} > {mine} && sync {mine}")
    assert out.rc == 0, f"{target.host}: cannot write {mine}: {out.stderr.strip()}"
    if ctx.mode == "ssh":
        # Read it from the peer over its own connection, then clean up.
        got = run(ctx.host(peer), f"cat {mine}")
        run(node, f"rm -f {mine}")
        assert got.rc == 0 and got.stdout == token, (
            f"{target.host}: {peer} does not see the file {target.host} wrote on {fl['mount']} "
            f"(rc {got.rc}, {got.stderr.strip() or 'different content'})")
        return
    # Local mode (inside a Slurm job): the peer's own run writes its token; read it from here.
    # Every node of the job both writes its token and reads its predecessor's, so each pair is covered.
    prev = [h for h in ctx.peers if ctx.in_group(h, "flash_client")]
    source = prev[(prev.index(target.host) - 1) % len(prev)]
    theirs = f"{d}/{doc['run_id']}.{source}.token"
    deadline = time.monotonic() + 90
    got = None
    while time.monotonic() < deadline:
        got = run(node, f"cat {theirs} 2>/dev/null")
        if got.rc == 0 and got.stdout:
            break
        time.sleep(1)
    assert got is not None and got.stdout == f"{doc['run_id']}:{source}", (
        f"{target.host}: does not see the file {source} wrote on {fl['mount']} within 90 s")


def _exports(ctx, host):
    for tier in ctx.doc["nfs"]:
        if host in tier["servers"]:
            for e in tier["exports"]:
                yield e["path"], {"tier": tier["name"], **e}


@pytest.mark.per("nfs_server", items=_exports)
def test_nfs_export_served(node, target, item):
    """The export answers NFS on the server itself (libnfs in user space: no kernel NFS needed)."""
    svc = run(node, "command -v nfs-ls")
    if svc.rc != 0:
        pytest.fail(f"{target.host}: nfs-ls (libnfs-utils) is not installed", pytrace=False)
    out = run(node, f"nfs-ls 'nfs://127.0.0.1{item['path']}?version=4'", timeout=60)
    assert out.rc == 0, (f"{target.host}: NFS export {item['path']} (tier {item['tier']}) not served: "
                         f"{(out.stderr or out.stdout).strip()[-300:]}")


def _client_exports(ctx, host):
    for tier in ctx.doc["nfs"]:
        for e in tier["exports"]:
            yield e["mount"], {"tier": tier["name"], "server": tier["server"], **e}


def _unit_props(node, unit: str) -> dict[str, str]:
    out = run(node, f"systemctl show -p What,Where,Type,Options,LoadState,UnitFileState {shlex.quote(unit)}")
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)


@pytest.mark.per("nfs_client", items=_client_exports)
def test_nfs_client_mount_unit(node, target, item):
    """The client's mount unit carries the declared server, path and options."""
    props = _unit_props(node, item["unit"])
    assert props.get("LoadState") == "loaded", f"{target.host}: mount unit {item['unit']} is not installed"
    problems = []
    if props.get("What") != f"{item['server']}:{item['path']}":
        problems.append(f"What={props.get('What')}, expected {item['server']}:{item['path']}")
    if props.get("Where") != item["mount"]:
        problems.append(f"Where={props.get('Where')}, expected {item['mount']}")
    if not (props.get("Type") or "").startswith("nfs"):
        problems.append(f"Type={props.get('Type')}, expected nfs")
    got = set((props.get("Options") or "").split(","))
    missing = [o for o in item["options"].split(",") if o not in got]
    if missing:
        problems.append(f"Options={props.get('Options')} lacks {','.join(missing)}")
    assert not problems, f"{target.host}: {item['unit']}: " + "; ".join(problems)


@pytest.mark.per("nfs_client", items=_client_exports)
def test_nfs_client_reaches_export(node, target, item):
    """From the client, in user space: the server answers for this export."""
    out = run(node, f"nfs-ls 'nfs://{item['server']}{item['path']}?version=4'", timeout=60)
    assert out.rc == 0, (f"{target.host}: cannot reach {item['server']}:{item['path']} over NFS: "
                         f"{(out.stderr or out.stdout).strip()[-300:]}")


@pytest.mark.per("nfs_client", items=_client_exports)
def test_nfs_client_mounted(node, target, item):
    """Enabled and mounted; where the kernel has no NFS client, skipped with the reason the role recorded."""
    fs = run(node, "grep -qw nfs4 /proc/filesystems || grep -qw nfs /proc/filesystems || "
                   "test -d /lib/modules/$(uname -r)/kernel/fs/nfs")
    if fs.rc != 0:
        record = run(node, f"cat {SKIP_RECORDS}/nfs-mount-{shlex.quote(item['unit'])} 2>/dev/null").stdout.strip()
        pytest.skip(f"{target.host}: the kernel has no NFS client (/proc/filesystems lacks nfs); the mount unit "
                    f"is checked as configuration and the export from user space"
                    + (" - the nfs role recorded the skip" if record else ""))
    props = _unit_props(node, item["unit"])
    assert props.get("UnitFileState") in ("enabled", "static", "generated"), (
        f"{target.host}: {item['unit']} is {props.get('UnitFileState')}: it will not mount at boot")
    out = run(node, f"findmnt -n -o FSTYPE,SOURCE {shlex.quote(item['mount'])}")
    assert out.rc == 0 and out.stdout.split()[0].startswith("nfs"), (
        f"{target.host}: {item['mount']} is not an NFS mount ({out.stdout.strip() or 'not mounted'})")
