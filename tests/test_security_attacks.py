"""Every attack on the inputs (but `slurm.parameters`, tested elsewhere), as a test that failed on the
code before the fix. Each is the input a new user would meet (an IPAM export, a vendor's ssh_config, a
colleague's spec, a shared folder), given to the real reader, writer, check or command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cluster_example, example_path, example_text

from gpucluster.cli import main
from gpucluster.errors import SpecError, UsageError
from gpucluster.inventory.reader import load_inventory
from gpucluster.inventory.sources import from_hosts_file, from_ssh_config

HOSTS = cluster_example("staging").hosts  # ctl01 gpu01..gpu04 flash01 nfs01
PWN = "{{ lookup('ansible.builtin.pipe', 'cd; id > PWNED; echo x') }}"
NOBODY = 65534


def write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(text)
    return p


def csv_with(line: str) -> str:
    rows = [f"{h},10.0.0.{i + 1}" for i, h in enumerate(HOSTS) if h != "gpu01"]
    return "hostname,address\n" + "\n".join(rows) + "\n" + line + "\n"


def refused(fn, *args, **kw) -> list:
    with pytest.raises(SpecError) as err:
        fn(*args, **kw)
    return err.value.findings


# ---- hosts.csv: an IPv6 scope id that is a Jinja expression ----------------------------------------

def test_hosts_csv_scope_id_with_jinja_is_refused(tmp_path):
    path = write(tmp_path, "hosts.csv", csv_with(f'gpu01,"::1%{PWN}"'))
    fs = refused(from_hosts_file, path, HOSTS)
    assert any(f.field == "address" and f.line == 8 and f.file == str(path) for f in fs), [f.render() for f in fs]


def test_hosts_csv_scope_id_that_is_an_interface_name_is_kept(tmp_path):
    path = write(tmp_path, "hosts.csv", csv_with("gpu01,fe80::1%eth0.100"))
    assert from_hosts_file(path, HOSTS)["gpu01"]["ansible_host"] == "fe80::1%eth0.100"


def test_hosts_csv_jinja_never_reaches_the_inventory_file(tmp_path, capsys):
    out = tmp_path / "inv"
    path = write(tmp_path, "hosts.csv", csv_with(f'gpu01,"::1%{PWN}"'))
    assert main(["inventory", str(example_path("staging")), "-o", str(out), "--hosts", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:8: address" in err and "Traceback" not in err
    assert not out.exists()


# ---- ssh_config: values copied unchecked ----------------------------------------------------------

BLOCK = "Host *01 gpu* nfs01\n  HostName %h.example\n"


@pytest.mark.parametrize("option, value", [
    ("User", "{{ lookup('pipe','id') }}"),
    ("IdentityFile", "~/.ssh/{{ lookup('pipe','id') }}"),
    ("UserKnownHostsFile", "/tmp/{{ lookup('pipe','id') }}"),
    ("ProxyJump", "{{ lookup('pipe','id') }}"),
])
def test_ssh_config_jinja_in_a_carried_option_is_refused(tmp_path, option, value):
    cfg = write(tmp_path, "config", f"{BLOCK}  {option} {value}\n")
    fs = refused(from_ssh_config, cfg, HOSTS)
    assert any(f.field == option and f.line == 3 and f.file == str(cfg) for f in fs), [f.render() for f in fs]


def test_proxyjump_cannot_smuggle_options(tmp_path):
    cfg = write(tmp_path, "config", f"{BLOCK}  ProxyJump jump -oStrictHostKeyChecking=no "
                                    "-oUserKnownHostsFile=/dev/null\n")
    fs = refused(from_ssh_config, cfg, HOSTS)
    assert any(f.field == "ProxyJump" and f.line == 3 for f in fs), [f.render() for f in fs]


def test_a_proxyjump_host_list_is_kept_after_our_options(tmp_path):
    cfg = write(tmp_path, "config", f"{BLOCK}  ProxyJump ops@bastion1:2222,bastion2.example\n")
    args = from_ssh_config(cfg, HOSTS)["gpu01"]["ansible_ssh_common_args"].split()
    assert args[:2] == ["-o", "StrictHostKeyChecking=yes"] and args[2] == "-o"
    assert args[3].startswith("UserKnownHostsFile=")
    assert "ProxyJump=ops@bastion1:2222,bastion2.example" in args


# ---- host keys with --hosts (and with no source at all) ----------------------------------------------

@pytest.mark.parametrize("source", ["hosts", "none"])
def test_every_inventory_source_forces_host_key_checking_first(tmp_path, source):
    out = tmp_path / "inv"
    argv = ["inventory", str(example_path("staging")), "-o", str(out)]
    if source == "hosts":
        argv += ["--hosts", str(write(tmp_path, "h.csv", csv_with("gpu01,10.0.0.2")))]
    assert main(argv) == 0
    for host in load_inventory(out).hosts.values():
        args = str(host.vars.get("ansible_ssh_common_args") or "").split()
        assert args[:2] == ["-o", "StrictHostKeyChecking=yes"], (host.name, args)
        assert args[3].startswith("UserKnownHostsFile="), (host.name, args)


# ---- ssh_config Include of something that is not a file; a huge CSV field ----------------------------

def _run_sources(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_ssh_config_include_of_a_device_or_fifo_is_refused_without_hanging(tmp_path, target):
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
        target = str(tmp_path / "fifo")
    cfg = write(tmp_path, "config", f"{BLOCK}Include {target}\n")
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "from conftest import cluster_example\n"
            "from gpucluster.errors import SpecError\n"
            "from gpucluster.inventory.sources import from_ssh_config\n"
            "try:\n"
            f"    from_ssh_config({str(cfg)!r}, cluster_example('staging').hosts)\n"
            "except SpecError as e:\n"
            "    print('\\n'.join(f.render() for f in e.findings)); sys.exit(2)\n")
    try:
        res = _run_sources(code, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading an ssh_config that includes {target} hung")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{cfg}:3" in res.stdout and target in res.stdout and "Traceback" not in res.stderr


def test_a_128k_csv_field_is_a_located_error(tmp_path, capsys):
    path = write(tmp_path, "hosts.csv", csv_with("gpu01," + "a" * (128 * 1024 + 64)))
    assert main(["inventory", str(example_path("staging")), "-o", str(tmp_path / "inv"), "--hosts", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:8" in err and "Traceback" not in err


# ---- the secrets file: owned by another user; Ansible re-reading it by path ---------------------------

def _secrets(tmp_path: Path) -> Path:
    from gpucluster.configure.secrets import generate, write_secrets_file

    folder = tmp_path / "private"
    return write_secrets_file(generate(), folder / "secrets.json")


def test_a_secrets_file_owned_by_another_user_is_refused(tmp_path):
    from gpucluster.configure.secrets import read_secrets_file

    path = _secrets(tmp_path)
    os.chown(path, NOBODY, NOBODY)  # mode stays 0600: only its owner, someone else, can read or swap it
    with pytest.raises(UsageError, match="belongs to uid 65534"):
        read_secrets_file(path)


def test_a_secrets_file_in_a_folder_others_can_read_is_refused(tmp_path):
    from gpucluster.configure.secrets import read_secrets_file

    path = _secrets(tmp_path)
    path.parent.chmod(0o755)
    with pytest.raises(UsageError, match="folder"):
        read_secrets_file(path)


def test_ansible_gets_a_private_copy_of_the_checked_bytes(tmp_path):
    from gpucluster.configure.playbook import private_secrets

    path = _secrets(tmp_path)
    checked = path.read_bytes()
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    copy = private_secrets(path, run)
    path.write_text('{"munge_key_b64": "swapped"}')  # the owner swaps the file after the check
    assert copy.parent == run and copy != path and copy.read_bytes() == checked
    assert copy.stat().st_mode & 0o777 == 0o600


# ---- state folders: a parent others can write -------------------------------------------------------

def test_a_state_folder_under_a_parent_others_can_write_is_refused(tmp_path):
    from gpucluster.paths import private_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone can rename our folder away and put theirs in its place
    with pytest.raises(UsageError, match=str(shared)):
        private_dir(shared / "me" / "state")


def test_a_state_folder_under_a_linked_parent_is_refused(tmp_path):
    from gpucluster.paths import private_dir

    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UsageError, match="link"):
        private_dir(tmp_path / "link" / "state")


def test_the_inventorys_state_dir_gets_the_same_check(tmp_path):
    from gpucluster.inventory.statedir import state_dirs

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UsageError, match=str(shared)):
        state_dirs({"gpucluster_cluster": "staging", "gpucluster_state_dir": str(shared / "st")})


def test_a_planted_compiled_folder_is_not_trusted(tmp_path):
    from gpucluster.compiled import compile_to, is_current

    spec = example_path("staging")
    state = tmp_path / "state"
    compiled = compile_to(cluster_example("staging"), state)
    assert is_current(spec, state)
    os.chown(compiled / "stamp.json", NOBODY, NOBODY)  # a stamp another user wrote
    assert not is_current(spec, state)
    os.chown(compiled / "stamp.json", 0, 0)
    os.chown(compiled, NOBODY, NOBODY)
    assert not is_current(spec, state)


def test_the_secret_task_refuses_an_existing_key_another_user_owns(tmp_path):
    sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpc_secret_mod", ROOT / "plugins" / "modules" /
                                                  "gpucluster_secret.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("ansible.module_utils.gpucluster_fileutil",
                           __import__("gpucluster_fileutil"))
    spec.loader.exec_module(mod)
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    assert mod.ensure(str(key), "bytes", 1024, 32, None) == (False, "existing")
    os.chown(key, NOBODY, NOBODY)  # a planted key: its owner knows it
    with pytest.raises(ValueError, match="65534"):
        mod.ensure(str(key), "bytes", 1024, 32, None)
    os.chown(key, 0, 0)
    folder.chmod(0o777)
    with pytest.raises(ValueError, match="other users"):
        mod.ensure(str(key), "bytes", 1024, 32, None)


# ---- MooseFS paths: the same reserved-prefix rule as NFS ---------------------------------------------

@pytest.mark.parametrize("moosefs, field", [
    ("data_path: /etc", "storage.flash.moosefs.data_path"),
    ("data_path: /var/lib/munge", "storage.flash.moosefs.data_path"),
    ("chunk_dirs: [{path: /etc/munge}]", "storage.flash.moosefs.chunk_dirs[0].path"),
])
def test_moosefs_paths_in_system_folders_are_refused_by_check(tmp_path, capsys, moosefs, field):
    flash = "    mount: /mnt/flash\n"
    text = example_text("staging").replace(flash, f"{flash}    moosefs: {{{moosefs}}}\n")
    spec = write(tmp_path, "spec.yaml", text)
    assert main(["check", str(spec)]) == 2
    err = capsys.readouterr().err
    assert field in err and "reserved-path" in err, err


def test_the_default_moosefs_paths_still_pass(tmp_path, capsys):
    text = example_text("staging").replace("    mount: /mnt/flash\n", "    mount: /mnt/flash\n"
                                           "    moosefs: {data_path: /var/lib/mfs, chunk_dirs: [{path: /srv/c}]}\n")
    assert main(["check", str(write(tmp_path, "spec.yaml", text))]) == 0, capsys.readouterr().err


# ---- closed pipes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, take", [
    (["plan", "examples/meta-24k-roce.yaml"], 0),  # closed before the first byte: plan prints 2 KB at once
    (["plan", "examples/meta-24k-roce.yaml", "--json"], 0),
    (["fabric", "test-plan", "examples/meta-24k-roce.yaml", "--json"], 100),
    (["fabric", "test-plan", "examples/meta-24k-roce.yaml", "--json"], "line"),
])
def test_a_closed_pipe_ends_quietly_with_sigpipes_status(argv, take):
    cmd = [sys.executable, "-c", "import sys; from gpucluster.cli import main; sys.exit(main())", *argv]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if take:
        assert proc.stdout.readline() if take == "line" else proc.stdout.read(take)
    proc.stdout.close()  # `| head -1`: the reader goes away with most of the output unread
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc == 128 + 13, (rc, err)


# ---- validate's paramiko path reads ssh's options as ssh does: the first value wins -------------------

def test_validate_paramiko_keeps_the_first_host_key_option():
    import importlib.util

    from gpucluster.validate.suite import CHECKS_DIR

    spec = importlib.util.spec_from_file_location("gpc_checklib_sec", CHECKS_DIR / "gpc_checklib.py")
    lib = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpc_checklib_sec", lib)
    spec.loader.exec_module(lib)
    opts = lib._ssh_options("-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/k "
                            "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")
    assert opts["stricthostkeychecking"] == "yes" and opts["userknownhostsfile"] == "/k"


@pytest.mark.parametrize("value", ["-oProxyCommand=id", "--export=ALL", "opt/nccl-tests", "/opt/x y", "/opt/$(id)"])
def test_an_inventory_nccl_tests_dir_never_becomes_an_srun_option(tmp_path, value):
    """fabric test runs `srun ... <nccl_tests_dir>/build/all_reduce_perf`: a value that is not a plain absolute
    path (a leading '-' would be read as srun's option) is refused naming the variable, exit 2."""
    from gpucluster.fabric.asbuilt.slurmrun import nccl_paths
    from gpucluster.inventory.reader import Inventory

    inv = Inventory(path=tmp_path / "hosts.yml", hosts={}, groups={}, vars={"nccl_tests_dir": value})
    with pytest.raises(UsageError, match="nccl_tests_dir"):
        nccl_paths(inv)
    inv.vars["nccl_tests_dir"] = "/opt/nccl-tests-2.13"
    assert nccl_paths(inv)[0] == "/opt/nccl-tests-2.13/build/all_reduce_perf"
