"""Security: SSH without passwords, Slurm's files, slurmdbd's password file, munge as the cluster's gate.

Nothing here reads a secret back: permissions are checked with stat, readability with `test -r` run as
an unprivileged user, and keys by hash.
"""

from __future__ import annotations

import re
import shlex

import pytest
from gpc_checklib import run, slurm_conf_dir, stat

SLURM_HOSTS = ("slurm_controller", "slurm_compute", "slurm_login")


@pytest.mark.per("all")
def test_sshd_config_refuses_passwords(node, target):
    out = run(node, "sshd -T -C user=root,host=validate,addr=127.0.0.1 2>&1")
    assert out.rc == 0, f"{target.host}: sshd -T failed: {out.stdout.strip()[-200:]}"
    conf = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    bad = [k for k in ("passwordauthentication", "kbdinteractiveauthentication", "permitemptypasswords")
           if conf.get(k, "no").strip() != "no"]
    assert not bad, f"{target.host}: sshd allows {', '.join(f'{k} {conf[k]}' for k in bad)}"


@pytest.mark.per("all")
def test_sshd_offers_no_password_method(node, target):
    """Ask the running sshd (on the node, over loopback) which methods it offers an unknown client."""
    out = run(node, "ssh -v -o BatchMode=yes -o PubkeyAuthentication=no -o GSSAPIAuthentication=no "
                    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 "
                    "-p 22 nobody@127.0.0.1 true 2>&1; echo \"exit $?\"", timeout=30)
    methods = re.findall(r"Authentications that can continue: (\S+)", out.stdout)
    assert methods, f"{target.host}: sshd on port 22 did not answer: {out.stdout.strip()[-300:]}"
    offered = set(",".join(methods).split(","))
    assert not offered & {"password", "keyboard-interactive"}, (
        f"{target.host}: sshd offers {', '.join(sorted(offered))} to a client without a key")


@pytest.mark.per(SLURM_HOSTS)
def test_slurm_etc_not_world_writable(node, target, doc):
    d = doc["slurm"]["conf_dir"]
    out = run(node, f"find {shlex.quote(d)} -xdev -perm -0002 ! -type l -printf '%p %m\\n'")
    assert out.rc == 0, f"{target.host}: cannot read {d}: {out.stderr.strip()}"
    assert not out.stdout.strip(), f"{target.host}: world-writable under {d}: {out.stdout.strip()}"


@pytest.mark.per("slurm_dbd")
def test_slurmdbd_password_file_private(node, target, doc):
    path = doc["slurm"]["dbd_conf"]
    st = stat(node, path)
    assert st is not None, f"{target.host}: {path} is missing"
    mode, user, _group = st
    assert mode & 0o077 == 0 and mode & 0o600 == 0o600, f"{target.host}: {path} is mode {oct(mode)}, expected 0o600"
    assert user == "slurm", f"{target.host}: {path} is owned by {user}, expected slurm (SlurmUser)"
    # As an ordinary user: `test -r` only, the content is never read.
    out = run(node, f"runuser -u nobody -- test -r {shlex.quote(path)}")
    assert out.rc != 0, f"{target.host}: user nobody can read {path}"


def _first_compute(ctx, host):
    """One node per run carries the foreign key probe: the first compute node being validated."""
    pool = ctx.run_hosts if ctx.mode == "ssh" else (ctx.peers or [host])
    first = next((h for h in pool if ctx.in_group(h, "slurm_compute")), None)
    if first == host:
        yield "foreign-key", None


# A second munged with a fresh random key on a private socket, and a second slurmd (own port, spool,
# pid and log) that uses it and tries to register as this node. slurmctld must refuse the credential.
_FOREIGN_PROBE = r"""
set -u
d=$(mktemp -d /tmp/gpc-foreign.XXXXXX)
trap 'kill $(cat $d/munged.pid 2>/dev/null) 2>/dev/null; rm -rf $d' EXIT
mkdir -p $d/etc $d/spool
dd if=/dev/urandom of=$d/munge.key bs=1024 count=1 status=none
# munged wants its socket folder searchable by all and not writable by others
chown munge:munge $d $d/munge.key && chmod 0711 $d && chmod 0400 $d/munge.key
runuser -u munge -- /usr/sbin/munged --socket=$d/munge.sock --key-file=$d/munge.key --pid-file=$d/munged.pid \
  --seed-file=$d/munged.seed --log-file=$d/munged.log \
  || { echo "PROBE-ERROR munged did not start: $(tail -n 1 $d/munged.log 2>/dev/null)"; exit 0; }
for i in $(seq 50); do [ -S $d/munge.sock ] && break; sleep 0.1; done
munge -s probe -S $d/munge.sock | unmunge -S $d/munge.sock >/dev/null 2>&1 && echo "ROGUE-MUNGE-OK"
munge -s probe -S $d/munge.sock | unmunge >/dev/null 2>&1 || echo "CLUSTER-REJECTS-CREDENTIAL"
cp -a CONF_DIR/. $d/etc/
sed -i -e '/^SlurmdPort=/d' -e '/^SlurmdPidFile=/d' -e '/^SlurmdSpoolDir=/d' -e '/^SlurmdLogFile=/d' \
  -e '/^AuthInfo=/d' $d/etc/slurm.conf
printf 'SlurmdPort=%s\nSlurmdPidFile=%s\nSlurmdSpoolDir=%s\nSlurmdLogFile=%s\nAuthInfo=socket=%s\n' \
  PORT $d/slurmd.pid $d/spool $d/slurmd.log $d/munge.sock >> $d/etc/slurm.conf
/usr/sbin/slurmd -D -f $d/etc/slurm.conf -N NODE -v > $d/slurmd.out 2>&1 &
pid=$!
# slurmd tries to register within a few seconds of starting; stop it after the first refusal.
for i in $(seq $((SECONDS * 5))); do grep -q "Unable to register" $d/slurmd.out && break; sleep 0.2; done
kill -INT $pid 2>/dev/null; wait $pid
echo "SLURMD-EXIT $?"
grep -h -i -E 'regist|authentic|credential|zero bytes|munge' $d/slurmd.out $d/slurmd.log 2>/dev/null | tail -n 12
"""


@pytest.mark.per("slurm_compute", items=_first_compute)
def test_foreign_munge_key_cannot_register(ctx, node, target, doc):
    if not doc["probes"]:
        pytest.skip(f"{target.host}: probe not asked for (a second slurmd with a foreign munge key on this node); "
                    "gpucluster validate --probes runs it")
    # a configless compute node: the files slurmctld served, from slurmd's cache
    script = (_FOREIGN_PROBE.replace("CONF_DIR", shlex.quote(slurm_conf_dir(ctx, target.host)))
              .replace("PORT", "16818").replace("SECONDS", "20").replace("NODE", shlex.quote(target.host)))
    ctl_log = shlex.quote(doc["slurm"]["ctld_log"])
    ctl = ctx.slurm_host() if ctx.mode == "ssh" and ctx.controller else None
    before = run(ctl, f"wc -l < {ctl_log} 2>/dev/null || echo 0").stdout.strip() if ctl else "0"
    out = run(node, f"bash -c {shlex.quote(script)}", timeout=90)
    text = out.stdout
    assert "PROBE-ERROR" not in text, f"{target.host}: probe could not run: {text.strip()[-400:]}"
    assert "ROGUE-MUNGE-OK" in text, f"{target.host}: the probe's own munged failed: {text.strip()[-400:]}"
    assert "CLUSTER-REJECTS-CREDENTIAL" in text, (
        f"{target.host}: the node's munged accepted a credential made with a fresh random key")
    assert re.search(r"Unable to register", text), (
        f"{target.host}: a slurmd with a foreign munge key did not fail to register:\n{text.strip()[-600:]}")
    if ctl is not None:
        # The controller's side: it refused this node's registration because of the credential.
        log = run(ctl, f"tail -n +{int(before or 0) + 1} {ctl_log} 2>/dev/null").stdout
        refused = [line for line in log.splitlines() if f"[{target.host}]" in line
                   and "NODE_REGISTRATION_STATUS has authentication error" in line]
        assert refused, (f"{target.host}: {ctx.controller}'s slurmctld.log shows no refused registration from "
                         f"{target.host} (slurmd said: {text.strip()[-300:]})")
