"""The secrets guard: a converge never replaces a secret a host already holds with one the run did not bring.

The module (plugins/modules/gpucluster_secret_guard.py) as plain Python, then the real first play of
playbooks/site.yml run by the real ansible-playbook on localhost, as hosts of every group, with the hosts' secret
files in a temporary folder: a run from a state folder that lacks the cluster's secrets stops before anything
changes, on every host, whatever --tags, and says how to pass them; the same secrets, a fresh host, a package's
default munge key and an explicit --rotate go on.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import load_file

ROOT = Path(__file__).resolve().parent.parent
ANSIBLE = ROOT / ".venv" / "bin" / "ansible-playbook"

for _util in (ROOT / "plugins" / "module_utils").glob("*.py"):
    sys.modules.setdefault(f"ansible.module_utils.{_util.stem}", load_file(_util, f"ansible.module_utils.{_util.stem}"))
guard = load_file(ROOT / "plugins" / "modules" / "gpucluster_secret_guard.py", "gpucluster_secret_guard_module")
secret = load_file(ROOT / "plugins" / "modules" / "gpucluster_secret.py", "gpucluster_secret_module_for_guard")

KEY_A = b"A" * 1024
KEY_B = b"B" * 1024


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ---------------------------------------------------------------- the module


def test_brought_is_the_provided_value_else_the_state_folder_file_else_none(tmp_path):
    f = tmp_path / "munge.key"
    assert guard.brought("bytes", str(f), None) == ("", "none")
    f.write_bytes(KEY_A)
    assert guard.brought("bytes", str(f), None) == (hashlib.sha256(KEY_A).hexdigest(), "existing")
    assert guard.brought("bytes", str(f), b64(KEY_B)) == (hashlib.sha256(KEY_B).hexdigest(), "provided")
    assert not f.with_name("x").exists(), "brought never writes"


def test_a_signing_key_is_compared_by_its_public_half(tmp_path):
    key = secret.generate("ssh-ed25519", 0)
    public = secret.ssh_public_key(key, "k")
    signers = tmp_path / "allowed_signers"
    signers.write_text(f'# comment\ngpucluster-bundle namespaces="gpucluster-bundle" {public}\n')
    digest, _ = guard.brought("ssh-ed25519", None, b64(key))
    assert guard.check("signing", "ssh-ed25519", digest, str(signers), None, None, None, False) == ("same", None)
    other, _ = guard.brought("ssh-ed25519", None, b64(secret.generate("ssh-ed25519", 0)))
    state, why = guard.check("signing", "ssh-ed25519", other, str(signers), None, None, None, False)
    assert state == "differs" and "--rotate signing" in why


def test_the_slurmdbd_password_is_read_from_its_conf_line(tmp_path):
    conf = tmp_path / "slurmdbd.conf"
    conf.write_text("DbdHost=ctl01\nStoragePass=s3cretPassw0rd1234\nStorageUser=slurm\n")
    digest = hashlib.sha256(b"s3cretPassw0rd1234").hexdigest()
    assert guard.check("slurmdbd", "password", digest, str(conf), "StoragePass", None, None, False)[0] == "same"
    state, why = guard.check("slurmdbd", "password", "", str(conf), "StoragePass", None, None, False)
    assert state == "not-brought" and "StoragePass" in why and "s3cret" not in why
    conf.write_text("StoragePass=old-one-not-in-use\nStoragePass=s3cretPassw0rd1234\n")  # Slurm keeps the last
    assert guard.check("slurmdbd", "password", digest, str(conf), "StoragePass", None, None, False)[0] == "same"
    conf.write_text("DbdHost=ctl01\nStoragePass=\n")  # as rendered, before the role fills it: none held
    assert guard.check("slurmdbd", "password", "", str(conf), "StoragePass", None, None, False) == ("absent", None)


CHECKS = {
    # name: (host key, managed marker, legacy marker, the run's key, rotate) -> state
    "a fresh host": (None, False, False, None, False, "absent"),
    "a package's default key, the run generates": (KEY_B, False, False, None, False, "unmanaged"),
    "a package's default key, the run brings one": (KEY_B, False, False, KEY_A, False, "unmanaged"),
    "the cluster's key, the run brings it": (KEY_A, True, False, KEY_A, False, "same"),
    "the cluster's key, the run brings none": (KEY_A, True, False, None, False, "not-brought"),
    "the cluster's key, the run brings another": (KEY_A, True, False, KEY_B, False, "differs"),
    "the cluster's key, rotated on purpose": (KEY_A, True, False, KEY_B, True, "rotated"),
    "the cluster's key, rotated to a new one": (KEY_A, True, False, None, True, "rotated"),
    "converged before the marker, the run brings none": (KEY_A, False, True, None, False, "not-brought"),
    "converged before the marker, the run brings it": (KEY_A, False, True, KEY_A, False, "same"),
}


@pytest.mark.parametrize("case", list(CHECKS))
def test_the_host_check(tmp_path, case):
    held, managed, legacy, run, rotate, want = CHECKS[case]
    key = tmp_path / "munge.key"
    if held is not None:
        key.write_bytes(held)
    marker, old = tmp_path / "marker", tmp_path / "allowed_signers"
    if managed:
        marker.write_text("x")
    if legacy:
        old.write_text("x")
    digest = hashlib.sha256(run).hexdigest() if run else ""
    state, why = guard.check("munge", "bytes", digest, str(key), None, str(marker), str(old), rotate)
    assert state == want
    assert (why is not None) == (want in ("not-brought", "differs"))
    if why:
        assert "Nothing was changed" in why and "--secrets FILE" in why and "--rotate munge" in why
        assert b64(held)[:16] not in why


def test_the_munge_role_marks_the_key_it_installs_where_the_guard_looks():
    """Without the marker a host's key looks like Debian's package default, which the cluster's may replace."""
    tasks = yaml.safe_load((ROOT / "roles" / "munge" / "tasks" / "main.yml").read_text())
    names = [t.get("name", "") for t in tasks]
    install = names.index("Install the cluster's key")
    marks = [i for i, t in enumerate(tasks) if (t.get("ansible.builtin.copy") or {}).get("dest")
             == "{{ __munge_key_marker }}"]
    assert marks and marks[0] > install, "the marker is written after the key is installed"
    checks = [t for t in yaml.safe_load((ROOT / "roles" / "munge" / "tasks" / "guard.yml").read_text())
              if (t.get("gpucluster_secret_guard") or {}).get("action") == "check"]
    assert checks[0]["gpucluster_secret_guard"]["managed_marker"] == "{{ __munge_key_marker }}"


# ---------------------------------------------------------------- the first play of site.yml, run for real


def guard_play() -> dict:
    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    found = [p for p in plays if str(p.get("name", "")).startswith("Secrets |")]
    assert len(found) == 1, "site.yml has one secrets-guard play"
    assert plays.index(found[0]) == 1, "it runs right after the compile play, before anything changes a host"
    return found[0]


def test_the_guard_play_comes_first_and_stops_every_host():
    play = guard_play()
    assert play["any_errors_fatal"] is True and "always" in play["tags"]
    assert play["gather_facts"] is False


HOSTS = ("flash01", "ctl01", "gpu01")  # flash01 first: in no Slurm group, so a run_once under a `when` would skip


@pytest.fixture
def cluster(tmp_path):
    """A localhost 'cluster' whose hosts keep their secret files under tmp_path/hosts/NAME."""
    for h in HOSTS:
        (tmp_path / "hosts" / h).mkdir(parents=True)
    inv = {"all": {"hosts": {h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                             for h in HOSTS},
                   "children": {"slurm_controller": {"hosts": {"ctl01": None}},
                                "slurm_dbd": {"hosts": {"ctl01": None}},
                                "slurm_compute": {"hosts": {"gpu01": None}},
                                "slurm_login": {"hosts": {}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    (tmp_path / "state" / "secrets").mkdir(parents=True, mode=0o700)
    return tmp_path


def host_file(root: Path, host: str, name: str) -> Path:
    return root / "hosts" / host / name


def converged(root: Path, munge: bytes = KEY_A, password: str = "passwordpassword1234") -> None:
    """Every Slurm host holds `munge` as gpucluster installs it; ctl01's slurmdbd.conf holds `password`."""
    for h in ("ctl01", "gpu01"):
        host_file(root, h, "munge.key").write_bytes(munge)
        host_file(root, h, "marker").write_text("gpucluster installed this host's munge key\n")
    host_file(root, "ctl01", "slurmdbd.conf").write_text(f"StorageUser=slurm\nStoragePass={password}\n")


def run_guard(root: Path, *args: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    """The guard play, then a play that marks every host it reaches: a host marked was not stopped."""
    after = {"name": "after the guard", "hosts": "all", "gather_facts": False, "tags": ["always"],
             "tasks": [{"ansible.builtin.file": {"path": str(root / "reached-{{ inventory_hostname }}"),
                                                 "state": "touch", "mode": "0644"}}]}
    (root / "play.yml").write_text(yaml.safe_dump([guard_play(), after], sort_keys=False))
    hosts = str(root / "hosts" / "{{ inventory_hostname }}")
    values = {"ansible_become": False, "gpucluster_secrets_dir": str(root / "state" / "secrets"),
              "__munge_key_dest": f"{hosts}/munge.key", "__munge_key_marker": f"{hosts}/marker",
              "__slurm_dbd_conf": f"{hosts}/slurmdbd.conf", **(extra or {})}
    (root / "extra.json").write_text(json.dumps(values))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCALHOST_WARNING": "0"}
    return subprocess.run([str(ANSIBLE), "-i", str(root / "hosts.yml"), "-e", f"@{root / 'extra.json'}", *args,
                           str(root / "play.yml")], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300, check=False)


def reached(root: Path) -> set[str]:
    return {h for h in HOSTS if (root / f"reached-{h}").exists()}


needs_ansible = pytest.mark.skipif(not ANSIBLE.exists(), reason=f"{ANSIBLE} missing: run scripts/setup.sh")


@needs_ansible
def test_a_fresh_cluster_goes_on(cluster):
    res = run_guard(cluster)
    assert res.returncode == 0, res.stdout[-3000:]
    assert reached(cluster) == set(HOSTS)


@needs_ansible
@pytest.mark.parametrize("args", [(), ("--tags", "slurm"), ("--check",)], ids=["all", "tags-slurm", "check"])
def test_a_state_folder_without_the_secrets_stops_every_host_before_anything_changes(cluster, args):
    converged(cluster)
    res = run_guard(cluster, *args)
    assert res.returncode != 0
    assert reached(cluster) == set(), "no host went past the guard"
    out = res.stdout
    assert "holds the cluster's munge secret" in out and "--secrets FILE" in out and "--rotate munge" in out
    assert host_file(cluster, "ctl01", "munge.key").read_bytes() == KEY_A
    assert not (cluster / "state" / "secrets" / "munge.key").exists(), "the guard generates nothing"


@needs_ansible
def test_the_cluster_s_own_secrets_go_on(cluster):
    converged(cluster)
    secrets = cluster / "state" / "secrets"
    (secrets / "munge.key").write_bytes(KEY_A)
    (secrets / "slurmdbd.password").write_text("passwordpassword1234")
    res = run_guard(cluster)
    assert res.returncode == 0, res.stdout[-3000:]
    assert reached(cluster) == set(HOSTS)


@needs_ansible
def test_another_password_stops_the_run_and_rotate_lets_it_through(cluster):
    converged(cluster)
    res = run_guard(cluster, extra={"munge_key_b64": b64(KEY_A), "slurm_dbd_password": "anotherPassword12345"})
    assert res.returncode != 0 and reached(cluster) == set()
    assert "slurmdbd secret" in res.stdout and "anotherPassword" not in res.stdout
    res = run_guard(cluster, extra={"munge_key_b64": b64(KEY_A), "slurm_dbd_password": "anotherPassword12345",
                                    "gpucluster_rotate_secrets": ["slurmdbd"]})
    assert res.returncode == 0, res.stdout[-3000:]


@needs_ansible
def test_a_node_s_own_pull_skips_the_guards_of_what_it_skips(cluster):
    """gpucluster-pull runs site.yml with --skip-tags munge,signing: a node has no secrets folder."""
    converged(cluster)
    (cluster / "state" / "secrets" / "slurmdbd.password").write_text("passwordpassword1234")
    res = run_guard(cluster, "--skip-tags", "munge,signing")
    assert res.returncode == 0, res.stdout[-3000:]
    assert reached(cluster) == set(HOSTS)


# ---------------------------------------------------------------- an inventory rewritten without --state-dir


def _inventory(out: Path, *state: str) -> int:
    from gpucluster.cli import main

    spec = ROOT / "examples" / "staging.yaml"
    return main(["inventory", str(spec), "-o", str(out), *(("--state-dir", state[0]) if state else ())])


def test_an_inventory_that_names_a_state_folder_is_not_rewritten_to_the_default(tmp_path, capsys):
    out, state = tmp_path / "inv", tmp_path / "state"
    assert _inventory(out, str(state)) == 0
    before = (out / "group_vars" / "all.yml").read_bytes()
    capsys.readouterr()
    assert _inventory(out) == 2
    err = capsys.readouterr().err
    assert f"--state-dir {state}" in err and "Traceback" not in err
    assert (out / "group_vars" / "all.yml").read_bytes() == before, "nothing was written"
    assert _inventory(out, str(state)) == 0, "the same folder, named again"
    assert _inventory(out, str(tmp_path / "elsewhere")) == 0, "another folder, named on purpose"


def test_an_inventory_on_the_default_state_folder_is_rewritten_as_before(tmp_path):
    out = tmp_path / "inv"
    assert _inventory(out) == 0
    assert _inventory(out) == 0


# ---------------------------------------------------------------- rotation: planned by diff, asked of configure


def test_diff_names_what_rotating_each_secret_disrupts(capsys):
    from gpucluster.cli import main

    spec = str(ROOT / "examples" / "staging.yaml")
    assert main(["diff", spec, spec, "--rotate", "munge,slurmdbd,signing", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = {c["target"]: (c["class"], c["hosts"]) for c in doc["changes"]}
    assert got == {"secret.munge": ("restart-slurmd", ["ctl01", "gpu[01-04]"]),
                   "secret.slurmdbd": ("restart-slurmctld", ["ctl01"]),
                   "secret.signing": ("none", ["ctl01", "gpu[01-04]", "flash01", "nfs01"])}
    assert doc["class"] == "restart-slurmd"
    assert main(["diff", spec, spec]) == 0
    assert "no change" in capsys.readouterr().out, "without --rotate a spec against itself changes nothing"


@pytest.mark.parametrize("value", ["bogus", "munge,munge", "munge;id", "-oProxyCommand=x", "{{7*191}}"])
def test_an_unknown_secret_to_rotate_is_refused_before_anything_runs(tmp_path, capsys, value):
    from gpucluster.cli import main

    spec = str(ROOT / "examples" / "staging.yaml")
    assert main(["diff", spec, spec, f"--rotate={value}"]) == 2
    assert main(["configure", str(tmp_path / "no-inventory-read"), f"--rotate={value}"]) == 2
    err = capsys.readouterr().err
    assert "name secrets from munge, slurmdbd, signing" in err and "Traceback" not in err
    assert "1337" not in err
