"""The munge gap: a node whose munged died drains itself through a private munged with its own key.

These start the real munged (the package's, as root) on private sockets; scontrol is a stand-in here (a
script that gets a credential from the socket its slurm.conf names, as Slurm's auth/munge does, and
prints a `scontrol show node -o` line). tests/test_health_slurm.py runs the same path against a real
slurmctld, which decodes the private munged's credential.

munged refuses a socket under a folder that is not searchable by all, and pytest's tmp base is 0700:
so, as tests/test_health_slurm.py does, each test makes its own mkdtemp folder in the system temp folder
(0711: no one else may list or write it) and removes it at the end.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpucluster.node import privmunge, slurmctl

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
MUNGED = shutil.which("munged") or ("/usr/sbin/munged" if Path("/usr/sbin/munged").exists() else None)
needs_munged = pytest.mark.skipif(not IN_CI and (MUNGED is None or os.geteuid() != 0),
                                  reason="needs root and munged (apt-get install munge)")

# What scontrol (Slurm 22.05) prints when munged is down, captured on this machine.
NO_MUNGED = ('scontrol: error: If munged is up, restart with --num-threads=10 scontrol: error: Munge encode failed: '
             'Failed to access "/run/munge/munge.socket.2": No such file or directory (Did you start munged?) '
             'scontrol: error: slurm_send_node_msg: auth_g_create: REQUEST_NODE_INFO has authentication error '
             'slurm_load_node error: Protocol authentication error')
FAKE_SCONTROL = r'''#!/usr/bin/env python3
# Stand-in for scontrol: gets a credential from the munged its slurm.conf names (the last AuthInfo=socket=,
# as Slurm reads it), as auth/munge does, then answers for one node; otherwise fails as scontrol does.
import os, re, subprocess, sys
text = open(os.environ["SLURM_CONF"]).read()
sockets = re.findall(r"(?mi)^AuthInfo=socket=([^,\s]+)", text)
open(sys.argv[0] + ".log", "a").write(" ".join(sys.argv[1:]) + " via " + (sockets[-1] if sockets else "-") + "\n")
cred = subprocess.run(["munge", "-n", "--socket", sockets[-1]], capture_output=True, text=True) if sockets else None
if cred is None or cred.returncode != 0:
    sys.stderr.write({no_munged})
    sys.exit(1)
if sys.argv[1] == "show":
    print("NodeName=" + sys.argv[4] + " Arch=x86_64 CoresPerSocket=1 State=IDLE ThreadsPerCore=1")
'''.replace("{no_munged}", repr(NO_MUNGED + "\\n"))


@pytest.fixture
def base():
    folder = Path(tempfile.mkdtemp(prefix="gpucluster-privmunge-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def node(base: Path):
    """A node's view: its key (root's, 0600), a slurm.conf whose munge socket is dead, a stand-in scontrol."""
    keys = base / "keys"
    keys.mkdir(mode=0o700)
    key = keys / "munge.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(128))
    conf = base / "slurm.conf"
    conf.write_text(f"ClusterName=t\nAuthType=auth/munge\nAuthInfo=socket={base}/dead/munge.socket.2,ttl=120\n")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(conf)}
    return {"key": key, "conf": conf, "env": env, "run_dir": base / "run", "log": bin_dir / "scontrol.log"}


def munged_pids(under: str | Path | None = None) -> set[int]:
    """The munged processes running, those whose command line names a path under `under` only when given: other
    tests of the session start their own munged (the emulated clusters), so a test counts its own."""
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "munged" and (
                        under is None or str(under) in Path(f"/proc/{pid}/cmdline").read_text()):
                    out.add(int(pid))
            except OSError:
                pass
    return out


# ---------------------------------------------------------------- pure parts


def test_only_a_missing_credential_counts_as_a_munge_failure() -> None:
    assert privmunge.munge_failure(NO_MUNGED)
    # slurmctld refusing the credential (another key) or not answering: a private munged would not help
    assert not privmunge.munge_failure("slurm_load_node error: Protocol authentication error")
    assert not privmunge.munge_failure("slurm_load_node error: Unable to contact slurm controller (connect failure)")


def test_auth_info_keeps_the_nodes_options_and_replaces_the_socket() -> None:
    assert privmunge.auth_info("ClusterName=x\n", "/p/s") == "socket=/p/s"
    assert privmunge.auth_info("authinfo = socket=/run/m.sock,ttl=60\n", "/p/s") == "socket=/p/s,ttl=60"
    assert privmunge.auth_info("AuthInfo=ttl=60\nAuthInfo=socket=/a,ttl=90\n", "/p/s") == "socket=/p/s,ttl=90"


def test_the_base_folder_must_be_private(base: Path) -> None:
    made = base / "run" / "health"
    assert privmunge.private_base(str(made)) == str(made)  # made when missing, 0755 (munged: searchable by all)
    assert stat.S_IMODE(made.stat().st_mode) == 0o755
    made.chmod(0o777)
    with pytest.raises(privmunge.PrivateMungeError, match="not a private folder"):
        privmunge.private_base(str(made))
    made.chmod(0o755)
    link = base / "link"
    link.symlink_to(made)
    with pytest.raises(privmunge.PrivateMungeError, match="not a private folder"):
        privmunge.private_base(str(link))
    if os.geteuid() == 0:
        os.chown(made, 65534, 65534)
        with pytest.raises(privmunge.PrivateMungeError, match="owner uid 65534"):
            privmunge.private_base(str(made))


# ---------------------------------------------------------------- the real munged


@needs_munged
def test_private_munged_serves_credentials_and_leaves_nothing_behind(node) -> None:
    before = munged_pids(node["run_dir"])
    pm = privmunge.PrivateMunged(str(node["key"]), str(node["conf"]), str(node["run_dir"]))
    t0 = time.monotonic()
    env = pm.start()
    started = time.monotonic() - t0
    try:
        folder = Path(pm.folder)
        print(f"private munged answered {started * 1000:.0f} ms after start")
        assert folder.parent == node["run_dir"] and folder.name.startswith(privmunge.PREFIX)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o711  # no one else lists or writes it
        conf = Path(env["SLURM_CONF"]).read_text()
        assert f"Include {node['conf']}\n" in conf
        assert f"AuthInfo=socket={folder}/munge.socket,ttl=120\n" in conf  # the node's own ttl kept
        cred = subprocess.run(["munge", "-n", "--socket", pm.socket], capture_output=True, text=True, check=True)
        back = subprocess.run(["unmunge", "--socket", pm.socket], input=cred.stdout, capture_output=True, text=True)
        assert back.returncode == 0 and "STATUS:          Success (0)" in back.stdout, back.stderr
        assert len(munged_pids(node["run_dir"]) - before) == 1
    finally:
        pm.stop()
    assert not folder.exists()
    assert munged_pids(node["run_dir"]) - before == set()


@needs_munged
def test_private_munged_runs_as_the_keys_owner(node) -> None:
    try:
        munge_user = pwd.getpwnam("munge")
    except KeyError:
        pytest.skip("no 'munge' user on this machine (package munge creates it)")
    os.chown(node["key"].parent, munge_user.pw_uid, munge_user.pw_gid)
    os.chown(node["key"], munge_user.pw_uid, munge_user.pw_gid)
    os.chmod(node["key"], 0o400)
    with privmunge.PrivateMunged(str(node["key"]), str(node["conf"]), str(node["run_dir"])) as _env:
        uids = {int(Path(f"/proc/{p}/status").read_text().split("Uid:")[1].split()[1])
                for p in munged_pids(node["run_dir"])}
    assert uids == {munge_user.pw_uid}  # munged refuses a key owned by anyone but the user it runs as


@needs_munged
def test_a_key_munged_refuses_is_said_and_nothing_is_left(node) -> None:
    node["key"].write_bytes(b"short")  # munged wants at least 32 bytes
    pm = privmunge.PrivateMunged(str(node["key"]), str(node["conf"]), str(node["run_dir"]))
    with pytest.raises(privmunge.PrivateMungeError, match="munged did not start"):
        pm.start()
    assert list(node["run_dir"].iterdir()) == []


@needs_munged
def test_leftovers_of_a_killed_run_are_removed_with_their_munged(node) -> None:
    pm = privmunge.PrivateMunged(str(node["key"]), str(node["conf"]), str(node["run_dir"]))
    pm.start()
    folder, pid = Path(pm.folder), pm.proc.pid
    pm.proc = None  # as if the run had been killed: nobody stops it
    assert privmunge.remove_leftovers(str(node["run_dir"])) == []  # younger than a run: maybe another's
    old = time.time() - privmunge.STALE_S - 1
    os.utime(folder, (old, old))
    assert privmunge.remove_leftovers(str(node["run_dir"])) == [str(folder)]
    assert not folder.exists()
    # SIGTERM was sent; munged then finishes its threads and exits. On a loaded 2-core CI machine that took
    # just over 5 s once, so the wait is generous: what is asserted is that it goes, not how fast.
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the leftover munged still runs"
        time.sleep(0.05)
    os.waitpid(pid, 0)


@needs_munged
def test_a_session_falls_back_to_the_private_munged_and_stops_it(node) -> None:
    before = munged_pids(node["run_dir"])
    with slurmctl.Session(node["env"], munge_key=str(node["key"]), run_dir=str(node["run_dir"])) as ctl:
        info, why = ctl.show("gpu07")
        assert info is not None and info["State"] == "IDLE", why
        assert ctl.auth.startswith("private munged (the node's did not answer: Failed to access")
        ok, text = ctl.drain("gpu07", "gpc:munge: munge -n failed")
        assert ok, text
    calls = node["log"].read_text().splitlines()
    assert calls[0].endswith(f"via {node['run_dir'].parent}/dead/munge.socket.2")  # the node's own first
    private = re.compile(rf"via {node['run_dir']}/munge-\w+/munge.socket$")
    assert private.search(calls[1]) and private.search(calls[2]), calls  # then the private one, kept for the run
    assert calls[2].startswith("update nodename=gpu07 state=drain reason=gpc:munge: munge -n failed")
    assert munged_pids(node["run_dir"]) - before == set() and list(node["run_dir"].iterdir()) == []


@needs_munged
def test_without_the_key_the_session_says_why_and_changes_nothing(node) -> None:
    with slurmctl.Session(node["env"], munge_key=str(node["key"]) + ".gone", run_dir=str(node["run_dir"])) as ctl:
        info, why = ctl.show("gpu07")
    assert info is None and "Munge encode failed" in why
    assert ctl.auth == f"private munged failed: {node['key']}.gone: No such file or directory"


def test_a_healthy_munge_never_starts_a_private_one(node, tmp_path: Path) -> None:
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho 'NodeName=gpu07 State=IDLE'\n")
    (tmp_path / "scontrol").chmod(0o755)
    env = {**node["env"], "PATH": f"{tmp_path}:/usr/bin:/bin"}
    with slurmctl.Session(env, munge_key=str(node["key"]), run_dir=str(node["run_dir"])) as ctl:
        info, _ = ctl.show("gpu07")
    assert info["State"] == "IDLE" and ctl.private is None and ctl.auth == ""
    assert not node["run_dir"].exists()


def test_the_node_scripts_run_with_python3_alone(tmp_path: Path) -> None:
    """On a node the files sit side by side in one folder, with no gpucluster and no site packages."""
    from gpucluster.node import FILES, NODE_DIR

    for name in FILES:
        shutil.copy(NODE_DIR / name, tmp_path / name)
    res = subprocess.run([sys.executable, "-E", "-S", str(tmp_path / "runner.py"), "--help"], capture_output=True,
                         text=True, check=False, cwd="/")
    assert res.returncode == 0 and "--if-stale" in res.stdout, res.stderr
    res = subprocess.run([sys.executable, "-E", "-S", "-c", "import slurmctl; print(slurmctl.privmunge.KEY)"],
                         cwd=tmp_path, capture_output=True, text=True, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "/etc/munge/munge.key", res.stderr
