"""The Ansible side without nodes: role layout rules, the filters and modules as plain Python, the
configure wrapper's event handling, a syntax check of site.yml, and ansible-lint's production profile.

House rules checked here (docs/roles.md): meta/argument_specs.yml and defaults/main.yml with a
comment per variable, public variables prefixed with the role name and internal ones with
`__role_`, vars/Debian.yml for OS constants, a preflight task file first, changed_when on every
command, no_log on every task that touches a secret.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import LINTED_BY_THE_PHASE, ansible_lint, load_file

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("common", "munge", "slurm_common", "slurm_controller", "slurm_compute", "slurm_dbd", "slurm_login",
         "flash_storage", "nfs", "pull_runner")
SECRET_PATHS = ("munge_key_path", "password_path", "slurm_dbd_conf_path")


def _load(path: Path, name: str):
    return load_file(path, name)


# Our modules import plugins/module_utils as Ansible bundles it (ansible.module_utils.<name>): do the same.
for _util in (ROOT / "plugins" / "module_utils").glob("*.py"):
    sys.modules[f"ansible.module_utils.{_util.stem}"] = _load(_util, f"ansible.module_utils.{_util.stem}")

filters = _load(ROOT / "plugins" / "filter" / "gpucluster_roles.py", "gpucluster_roles_filters")
m_limits = _load(ROOT / "plugins" / "modules" / "gpucluster_limits.py", "gpucluster_limits_module")
m_sysctl = _load(ROOT / "plugins" / "modules" / "gpucluster_sysctl.py", "gpucluster_sysctl_module")
m_secret = _load(ROOT / "plugins" / "modules" / "gpucluster_secret.py", "gpucluster_secret_module")
m_secret_conf = _load(ROOT / "plugins" / "modules" / "gpucluster_secret_conf.py", "gpucluster_secret_conf_module")
m_files = _load(ROOT / "plugins" / "modules" / "gpucluster_files.py", "gpucluster_files_module")


# ---------------------------------------------------------------- role layout


def _yaml(path: Path):
    return yaml.safe_load(path.read_text()) if path.exists() else None


@pytest.mark.parametrize("role", ROLES)
def test_role_has_the_house_layout(role):
    base = ROOT / "roles" / role
    for rel in ("meta/argument_specs.yml", "meta/main.yml", "defaults/main.yml", "vars/Debian.yml",
                "tasks/main.yml", "tasks/preflight.yml"):
        assert (base / rel).is_file(), f"roles/{role}/{rel} is missing"


@pytest.mark.parametrize("role", ROLES)
def test_preflight_runs_first(role):
    tasks = _yaml(ROOT / "roles" / role / "tasks" / "main.yml")
    first = tasks[0]
    assert first.get("ansible.builtin.import_tasks") == "preflight.yml", f"{role}: first task is {first}"


@pytest.mark.parametrize("role", ROLES)
def test_defaults_are_documented_prefixed_and_in_the_argument_spec(role):
    base = ROOT / "roles" / role
    defaults = _yaml(base / "defaults" / "main.yml") or {}
    lines = (base / "defaults" / "main.yml").read_text().splitlines()
    for var in defaults:
        assert var.startswith(f"{role}_"), f"{role}: public variable {var} lacks the prefix {role}_"
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{var}:"))
        assert at > 0 and lines[at - 1].lstrip().startswith("#"), f"{role}: {var} has no comment above it"
    options = (_yaml(base / "meta" / "argument_specs.yml")["argument_specs"]["main"].get("options") or {})
    assert set(options) == set(defaults), f"{role}: argument_specs {sorted(options)} vs defaults {sorted(defaults)}"
    for var, value in defaults.items():  # a templated default too: the spec documents the same expression
        assert options[var].get("default") == value, f"{role}: {var} default differs from the argument spec"


@pytest.mark.parametrize("role", ROLES)
def test_internal_variables_are_double_underscored(role):
    base = ROOT / "roles" / role
    for path in (base / "vars").glob("*.yml"):
        for var in _yaml(path) or {}:
            assert var.startswith(f"__{role}_"), f"roles/{role}/vars/{path.name}: {var} lacks __{role}_"
    text = "\n".join(p.read_text() for p in base.rglob("*.yml"))
    for registered in re.findall(r"^\s*register:\s*(\S+)", text, re.M):
        assert registered.startswith(f"__{role}_"), f"{role}: registered variable {registered} lacks __{role}_"


def _tasks(role: str):
    for path in sorted((ROOT / "roles" / role).glob("*/*.yml")):
        if path.parent.name not in ("tasks", "handlers"):
            continue
        for task in _yaml(path) or []:
            yield path, task


@pytest.mark.parametrize("role", ROLES)
def test_every_command_says_when_it_changed_something(role):
    for path, task in _tasks(role):
        if any(k in task for k in ("ansible.builtin.command", "ansible.builtin.shell", "command", "shell")):
            assert "changed_when" in task, f"{path}: task {task.get('name')!r} has no changed_when"


def _touches_secret(task: dict) -> bool:
    """Generates, reads, renders with or copies a secret (paths alone, e.g. in a preflight, are not secret)."""
    text = repr({k: v for k, v in task.items() if k not in ("name", "when")})
    copy = task.get("ansible.builtin.copy") or {}
    return ("gpucluster_secret" in task or "gpucluster_secret_conf" in task or "munge_key_b64" in text
            or "lookup('ansible.builtin.file'" in text
            or any(p in str(copy.get("src", "")) for p in SECRET_PATHS))


def test_the_secret_check_sees_the_secret_tasks():
    secret_tasks = [t.get("name") for role in ROLES for _p, t in _tasks(role) if _touches_secret(t)]
    assert len(secret_tasks) >= 6, secret_tasks  # munge: key, copy; dbd: password, user, render, copy


@pytest.mark.parametrize("role", ROLES)
def test_tasks_that_touch_secrets_do_not_log(role):
    for path, task in _tasks(role):
        if _touches_secret(task):
            assert task.get("no_log") is True, f"{path}: {task.get('name')!r} touches a secret without no_log"
            assert task.get("diff") in (None, False), f"{path}: {task.get('name')!r} would print a diff"


def test_site_playbook_imports_the_storage_and_hardware_playbooks():
    plays = _yaml(ROOT / "playbooks" / "site.yml")
    imports = [p.get("ansible.builtin.import_playbook") for p in plays]
    assert "hardware.yml" in imports and "storage.yml" in imports


@pytest.fixture(scope="module")
def staging_inventory(tmp_path_factory) -> Path:
    from gpucluster.cluster import load_cluster
    from gpucluster.inventory import write_inventory

    d = tmp_path_factory.mktemp("inv")
    return write_inventory(d, load_cluster(ROOT / "examples" / "staging.yaml"), extra_vars={
        "gpucluster_spec": str(ROOT / "examples" / "staging.yaml"), "gpucluster_state_dir": str(d / "state"),
        "gpucluster_secrets_dir": str(d / "state" / "secrets")})


def test_site_playbook_passes_syntax_check(staging_inventory):
    exe = Path(sys.executable).parent / "ansible-playbook"
    if not exe.exists():
        pytest.skip("ansible-playbook is not installed in this environment (pip install -e '.[ops]')")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    res = subprocess.run([str(exe), "-i", str(staging_inventory), "playbooks/site.yml", "--syntax-check"],
                         cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr + res.stdout


def test_ansible_lint_production_profile():
    res = ansible_lint([f"roles/{r}" for r in ROLES] + ["playbooks/site.yml"])
    if res is None:
        pytest.skip(LINTED_BY_THE_PHASE)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]


# ---------------------------------------------------------------- filters


def test_etc_hosts_lists_hosts_with_addresses_and_names_the_rest():
    hv = {"a": {"ansible_facts": {"default_ipv4": {"address": "10.0.0.1"}, "eth1": {"ipv4": {"address": "10.1.0.1"}}}},
          "b": {"ansible_facts": {}}, "c": {}}
    assert filters.etc_hosts(["b", "a", "c"], hv) == {"lines": ["10.0.0.1 a"], "missing": ["b", "c"], "kept": []}
    assert filters.etc_hosts(["a"], hv, "eth1")["lines"] == ["10.1.0.1 a"]


def test_etc_hosts_keeps_the_last_known_address_of_a_host_that_is_down():
    hv = {"a": {"ansible_facts": {"default_ipv4": {"address": "10.0.0.1"}}}, "b": {}, "c": {},
          "d": {"gpucluster_address": "10.9.0.4", "ansible_facts": {"default_ipv4": {"address": "10.0.0.4"}}}}
    previous = ("127.0.0.1 localhost\n10.5.5.5 c\n"
                "# BEGIN gpucluster staging hosts (managed by Ansible, role common)\n"
                "10.0.0.9 a\n10.0.0.2 b\n"
                "# END gpucluster staging hosts (managed by Ansible, role common)\n")
    got = filters.etc_hosts(["a", "b", "c", "d"], hv, "", previous)
    # a: fresh facts win over the old block; b: down, keeps its block entry; c: only outside the block
    # (not ours to trust), so missing; d: the inventory address wins over facts.
    assert got == {"lines": ["10.0.0.1 a", "10.0.0.2 b", "10.9.0.4 d"], "missing": ["c"], "kept": ["b"]}


@pytest.mark.parametrize(("facts", "want"), [
    ({"virtualization_role": "guest", "virtualization_type": "podman"}, True),
    ({"virtualization_role": "guest", "virtualization_type": "kvm"}, False),
    ({"virtualization_role": "host", "virtualization_type": "kvm"}, False),
    ({}, False),
])
def test_is_container(facts, want):
    assert filters.is_container(facts) is want


SLURM_CONF = """ClusterName=c
SlurmctldPort=6817
SchedulerParameters=bf_continue
NodeName=n[1-2] CPUs=8 State=UNKNOWN
PartitionName=p Nodes=n[1-2] MaxTime=1:00:00
"""


def _files_result(before: str, after: str, name: str = "slurm.conf") -> dict:
    return {"changed": True, "changed_files": [f"/etc/slurm/{name}"],
            "diff": [{"before_header": f"/etc/slurm/{name}", "after_header": f"/etc/slurm/{name}",
                      "before": before, "after": after}]}


@pytest.mark.parametrize(("change", "want"), [
    (("SchedulerParameters=bf_continue", "SchedulerParameters=bf_continue,bf_interval=60"), []),
    (("MaxTime=1:00:00", "MaxTime=2:00:00"), []),
    (("SlurmctldPort=6817", "SlurmctldPort=7817"), ["slurmctldport changed"]),
    (("CPUs=8", "CPUs=16"), ["node definitions (NodeName lines) changed"]),
])
def test_restart_only_for_what_reconfigure_cannot_apply(change, want):
    after = SLURM_CONF.replace(*change)
    assert filters.slurm_restart_reasons(_files_result(SLURM_CONF, after)) == want


def test_first_install_and_other_files_need_no_restart():
    assert filters.slurm_restart_reasons(_files_result("", SLURM_CONF)) == []
    assert filters.slurm_restart_reasons(_files_result("a", "b", "topology.conf")) == []
    assert filters.slurm_restart_reasons({"changed": False}) == []
    assert filters.slurm_restart_reasons(_files_result("a", "b", "cgroup.conf")) == [
        "cgroup.conf changed (read at daemon start)"]


def test_unknown_previous_content_restarts_to_be_safe():
    result = {"changed": True, "changed_files": ["/etc/slurm/slurm.conf"]}
    assert filters.slurm_restart_reasons(result) == ["slurm.conf changed and its previous content is unknown"]


@pytest.mark.parametrize(("line", "usable", "mismatch"), [
    ("idle|none", True, False),
    ("mix|none", True, False),
    ("idle*|Not responding", False, False),
    ("down*|Not responding", False, False),
    ("unk*|", False, False),
    ("drain|gres/gpu count reported lower than configured (0 < 4)", True, True),
    ("drain|maintenance by admin", True, False),
    ("", False, False),
])
def test_slurm_node_state(line, usable, mismatch):
    state = filters.slurm_node_state(line)
    assert (state["usable"], state["mismatch"]) == (usable, mismatch)


def test_failed_checks_keep_every_message():
    checks = [{"ok": True, "msg": "a"}, {"ok": False, "msg": "b  needs\n fixing"}, {"ok": "False", "msg": "c"}]
    assert filters.failed_checks(checks) == ["b needs fixing", "c"]


def test_pin_and_apt_pin():
    assert filters.pin(["slurmd", "slurm-client"], "22.05.8-4+deb12u3") == [
        "slurmd=22.05.8-4+deb12u3", "slurm-client=22.05.8-4+deb12u3"]
    assert filters.pin(["slurmd"], "") == ["slurmd"]
    with pytest.raises(ValueError):
        filters.pin(["slurmd"], "22.05; rm -rf /")
    assert filters.apt_pin("", "slurm*", "/p") == {}
    text = filters.apt_pin("1:10.0-1", "slurm*", "/p")["/p"]
    assert "Package: slurm*\nPin: version 1:10.0-1\nPin-Priority: 1001\n" in text


def test_file_map_keeps_bytes_and_skips_absent_files(tmp_path):
    (tmp_path / "slurm.conf").write_bytes(b"A=1\n\n")
    got = filters.file_map(["slurm.conf", "topology.conf"], str(tmp_path), "/etc/slurm/")
    assert got == {"/etc/slurm/slurm.conf": "A=1\n\n"}


def test_reports_say_what_and_why():
    text = filters.sysctl_report({"readonly": {"net.core.somaxconn": "4096"}, "missing": ["x.y"], "path": "/f"}, True)
    assert "net.core.somaxconn (is 4096)" in text and "x.y" in text and "podman run --sysctl" in text
    assert filters.sysctl_report({}, False) == ""
    text = filters.limits_report({"capped": {"nofile": {"wanted": "131072", "allowed": "4096"}}}, True)
    assert "nofile 131072 lowered to 4096" in text and "pam_limits" in text


# ---------------------------------------------------------------- modules


CONTAINER_LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max processes             4096                 4096                 processes
Max open files            4096                 4096                 files
Max locked memory         8388608              8388608              bytes
"""


def test_limits_are_capped_where_the_node_cannot_raise_them():
    node = m_limits.proc_limits(CONTAINER_LIMITS)
    assert node["nofile"] == {"soft": 4096, "hard": 4096} and node["memlock"]["hard"] == 8192
    assert m_limits.can_raise_limits("CapBnd:\t00000000802405fb\n") is False
    assert m_limits.can_raise_limits("CapBnd:\t000001ffffffffff\n") is True
    effective, capped = m_limits.cap_limits({"nofile": 131072, "memlock": "unlimited"}, node, can_raise=False)
    assert effective == {"nofile": {"limits": "4096", "systemd": "4096"},
                         "memlock": {"limits": "8192", "systemd": "8192K"}}
    assert capped["memlock"] == {"wanted": "unlimited", "allowed": "8192"}
    effective, capped = m_limits.cap_limits({"nofile": 131072, "memlock": "unlimited"}, node, can_raise=True)
    assert effective["memlock"] == {"limits": "unlimited", "systemd": "infinity"} and capped == {}


def test_limits_files_name_every_item_for_everyone():
    effective = {"nofile": {"limits": "4096", "systemd": "4096"}}
    assert "*     soft  nofile   4096" in m_limits.limits_text(effective, "h")
    assert "TasksMax=infinity\nLimitNOFILE=4096\n" in m_limits.dropin_text(effective, "infinity", "h")


def test_sysctl_applies_writable_keys_and_reports_the_rest(tmp_path, monkeypatch):
    (tmp_path / "net" / "core").mkdir(parents=True)
    (tmp_path / "fs").mkdir()
    (tmp_path / "net" / "core" / "somaxconn").write_text("128\n")
    (tmp_path / "fs" / "file-max").write_text("9999999\n")
    ro = tmp_path / "net" / "core" / "rmem_max"
    ro.write_text("1\n")
    real_access = os.access
    monkeypatch.setattr(m_sysctl.os, "access", lambda p, mode: False if str(p) == str(ro) else real_access(p, mode))
    settings = {"net.core.somaxconn": 4096, "fs.file-max": 1048576, "net.core.rmem_max": 2, "net.x.missing": 1}
    kept = m_sysctl.above_minimum(settings, m_sysctl.live_values(settings, str(tmp_path)))
    assert kept == {"fs.file-max": "9999999"}
    applied, readonly, missing = m_sysctl.apply({k: v for k, v in settings.items() if k not in kept},
                                                str(tmp_path), check_mode=False)
    assert applied == {"net.core.somaxconn": "4096"} and readonly == {"net.core.rmem_max": "1"}
    assert missing == ["net.x.missing"]
    assert (tmp_path / "net" / "core" / "somaxconn").read_text() == "4096"
    assert m_sysctl.render_file({"b.c": "1  2", "a.b": 3}, "h") == "# h\na.b = 3\nb.c = 1 2\n"


def test_secret_is_generated_once_private_and_never_returned(tmp_path):
    path = str(tmp_path / "secrets" / "munge.key")
    assert m_secret.ensure(path, "bytes", 1024, 32, None) == (True, "generated")
    first = Path(path).read_bytes()
    assert len(first) == 1024 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "secrets").st_mode) == 0o700
    assert m_secret.ensure(path, "bytes", 1024, 32, None) == (False, "existing")
    assert Path(path).read_bytes() == first
    given = base64.b64encode(b"k" * 64).decode()
    assert m_secret.ensure(path, "bytes", 1024, 32, given) == (True, "provided")
    assert m_secret.ensure(path, "bytes", 1024, 32, given) == (False, "provided")
    with pytest.raises(ValueError, match="base64"):
        m_secret.ensure(path, "bytes", 1024, 32, "not base64!")
    with pytest.raises(ValueError, match="at least 32"):
        m_secret.ensure(path, "bytes", 1024, 32, base64.b64encode(b"short").decode())
    pw = str(tmp_path / "pw")
    m_secret.ensure(pw, "password", 32, 32, None)
    assert re.fullmatch(r"[A-Za-z0-9]{32}", Path(pw).read_text())


def test_the_signing_key_is_an_ed25519_key_generated_once_or_the_provided_one(tmp_path):
    """kind ssh-ed25519 (roles/pull_runner): an OpenSSH private key ssh-keygen reads; a provided one replaces it;
    anything else, provided or found, is refused (a key the timer cannot sign with would lock the fleet out)."""
    path = str(tmp_path / "secrets" / "bundle-signing.key")
    assert m_secret.ensure(path, "ssh-ed25519", 1024, 32, None) == (True, "generated")
    first = Path(path).read_bytes()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and not Path(f"{path}.pub").exists()
    public = m_secret.ssh_public_key(first, path)
    if shutil.which("ssh-keygen"):  # a missing tool: that half not run
        assert subprocess.run(["ssh-keygen", "-y", "-f", path], capture_output=True, text=True,
                              check=True).stdout.split()[:2] == public.split()[:2]
    assert public.startswith("ssh-ed25519 ")
    assert m_secret.ensure(path, "ssh-ed25519", 1024, 32, None) == (False, "existing")
    assert Path(path).read_bytes() == first
    from gpucluster.configure.secrets import generate

    given = generate()["pull_runner_signing_key_b64"]
    assert m_secret.ensure(path, "ssh-ed25519", 1024, 32, given) == (True, "provided")
    assert Path(path).read_bytes() == base64.b64decode(given) != first
    with pytest.raises(ValueError, match="not an unencrypted OpenSSH private key"):
        m_secret.ensure(path, "ssh-ed25519", 1024, 32, base64.b64encode(b"k" * 64).decode())
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    ecdsa = ec.generate_private_key(ec.SECP256R1()).private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH,
                                                                  ser.NoEncryption())
    with pytest.raises(ValueError, match="but not ed25519"):
        m_secret.ensure(path, "ssh-ed25519", 1024, 32, base64.b64encode(ecdsa).decode())
    Path(path).write_bytes(b"k" * 64)
    with pytest.raises(ValueError, match="not an unencrypted OpenSSH private key"):
        m_secret.ensure(path, "ssh-ed25519", 1024, 32, None)


def test_compile_writes_what_the_cli_renders_and_only_when_something_changed(tmp_path):
    """The controller's compile (playbooks/compile.yml) writes `gpucluster render --no-cabling`'s files and
    the facts the roles read; a second compile of the same spec parses nothing and changes nothing."""
    from gpucluster.cluster import load_cluster
    from gpucluster.compiled import ensure_compiled
    from gpucluster.render import render_all
    from gpucluster.render.topology import slurm_switches

    spec_path = ROOT / "examples" / "staging.yaml"
    compiled, now = ensure_compiled(spec_path, tmp_path / "state")
    cluster = load_cluster(spec_path)
    assert now and {p.name: p.read_text() for p in (compiled / "rendered").iterdir()} == render_all(cluster,
                                                                                                     cabling=False)
    facts = json.loads((compiled / "facts.json").read_text())
    assert [s["name"] for s in facts["slurm"]["switches"]] == [s.name for s in slurm_switches(cluster.plan)]
    assert ensure_compiled(spec_path, tmp_path / "state") == (compiled, False)
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700


def test_slurmdbd_conf_is_rendered_without_its_password_and_filled_from_the_secret_file(tmp_path):
    from gpucluster.cluster import load_cluster
    from gpucluster.render import render_all

    rendered = render_all(load_cluster(ROOT / "examples" / "staging.yaml"), cabling=False)["slurmdbd.conf"]
    assert "\nStoragePass=\n" in rendered and "DbdHost=ctl01\n" in rendered and "Purge" not in rendered
    filled = m_secret_conf.fill(rendered, {"StoragePass": "s3cret"})
    assert "\nStoragePass=s3cret\n" in filled and filled.replace("StoragePass=s3cret", "StoragePass=") == rendered
    with pytest.raises(ValueError, match="spans lines"):
        m_secret_conf.fill(rendered, {"StoragePass": "a\nPurgeJobAfter=1"})


def test_files_module_writes_diffs_and_fixes_modes(tmp_path):
    path = str(tmp_path / "a.conf")
    changed, diff = m_files.install(path, "x\n", os.getuid(), os.getgid(), 0o644, check_mode=False)
    assert changed and diff["before"] == "" and diff["after"] == "x\n"
    assert m_files.install(path, "x\n", os.getuid(), os.getgid(), 0o644, check_mode=False) == (False, None)
    os.chmod(path, 0o600)
    assert m_files.install(path, "x\n", os.getuid(), os.getgid(), 0o644, check_mode=False) == (True, None)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


# ---------------------------------------------------------------- the configure wrapper


def _event(kind: str, created: str, **data) -> dict:
    return {"event": kind, "created": created, "event_data": data}


def test_progress_collects_changes_failures_and_role_times():
    from gpucluster.configure.playbook import Progress

    lines: list[str] = []
    p = Progress(lines.append)
    events = [
        _event("playbook_on_play_start", "2026-01-01T00:00:00", name="Common"),
        _event("playbook_on_task_start", "2026-01-01T00:00:00", task="common : Sysctls", role="common"),
        _event("runner_on_ok", "2026-01-01T00:00:01", host="a", res={"changed": True}),
        _event("runner_on_unreachable", "2026-01-01T00:00:01", host="b",
               res={"msg": "Failed to connect to the host via ssh: Connection refused", "unreachable": True}),
        _event("playbook_on_task_start", "2026-01-01T00:00:04", task="munge : Key", role="munge"),
        _event("runner_on_failed", "2026-01-01T00:00:05", host="a", res={"censored": "hidden (no_log)"}),
        _event("playbook_on_stats", "2026-01-01T00:00:06", ok={"a": 1}, changed={"a": 1}, failures={"a": 1},
               dark={"b": 1}),
    ]
    events.insert(3, {**_event("runner_on_ok", "2026-01-01T00:00:01", host="c", res={"censored": "hidden"}),
                      "stdout": "changed: [c -> localhost]"})
    for e in events:
        p(e)
    assert p.role_times == {"common": 4.0, "munge": 2.0}
    assert p.changes == {"a": ["common : Sysctls"], "c": ["common : Sysctls"]}
    assert "Connection refused" in p.failures["b"][0] and "unreachable" in p.failures["b"][0]
    assert "no_log" in p.failures["a"][0]
    assert p.stats["b"].unreachable == 1 and p.stats["a"].failed == 1
    assert any("UNREACHABLE b" in line for line in lines)


def test_summary_names_the_failing_hosts():
    from gpucluster.configure.playbook import ConfigureResult, HostStats, summary

    result = ConfigureResult(rc=1, status="failed", hosts={"a": HostStats(ok=3), "b": HostStats(unreachable=1)},
                             failures={"b": ["[common : x] unreachable: refused"]}, role_times={"common": 1.5},
                             elapsed=2.0, artifacts=None)
    text = summary(result)
    assert "failed hosts: b" in text and "b: [common : x] unreachable: refused" in text and "NOT converged" in text


def test_inventory_folder_means_its_hosts_yml(tmp_path):
    from gpucluster.errors import UsageError
    from gpucluster.inventory.reader import inventory_file

    (tmp_path / "validate.html").write_text("<html>")
    with pytest.raises(UsageError, match=r"no hosts\.yml"):
        inventory_file(tmp_path)
    (tmp_path / "hosts.yml").write_text("all: {}\n")
    assert inventory_file(tmp_path) == tmp_path / "hosts.yml"


def test_configure_subcommand_registers():
    from gpucluster.commands.configure import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["configure", "inventories/staging", "--limit", "gpu01"])
    assert args.inventory == "inventories/staging" and args.limit == "gpu01" and callable(args.func)


def test_no_secret_files_are_tracked_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert not [f for f in tracked.splitlines() if f.endswith((".key", ".password")) or "/secrets/" in f]


# ---------------------------------------------------------------- tags and batches (configure --tags/--batch)

CONCERNS = {"common", "gpu", "rdma", "nccl", "storage", "munge", "slurm", "health", "pull"}


@pytest.mark.parametrize("book", ["site.yml", "hardware.yml", "storage.yml", "compile.yml", "health.yml"])
def test_every_play_carries_the_tag_of_its_concern(book):
    """--tags selects whole concerns: every play has one concern tag (the compile play runs always), so every
    role's tasks inherit it."""
    for play in _yaml(ROOT / "playbooks" / book):
        if "import_playbook" in play or "ansible.builtin.import_playbook" in play:
            continue
        tags = set(play.get("tags") or [])
        assert tags and tags <= CONCERNS | {"always"}, (book, play["name"], tags)
        assert len(tags) == 1, (book, play["name"], tags)


def test_the_slurm_play_rolls_in_batches():
    plays = {p["name"]: p for p in _yaml(ROOT / "playbooks" / "site.yml") if "name" in p}
    slurm = plays["Slurm | accounting, controller, compute and login nodes"]
    assert "gpucluster_batch" in str(slurm["serial"]) and "100%" in str(slurm["serial"])


def test_slurm_nodes_state_reads_one_sinfo_for_many_nodes():
    text = "gpu01|idle|none\ngpu02|idle*|Not responding\ngpu01|idle|none\ngpu03|drain|gres/gpu count reported lower"
    got = filters.slurm_nodes_state(text, ["gpu01", "gpu02", "gpu03", "gpu04"])
    assert got["waiting"] == ["gpu02", "gpu04"] and got["usable"] is False  # gpu04: slurmctld does not list it
    assert got["nodes"]["gpu01"]["usable"] and got["nodes"]["gpu03"]["mismatch"]
    assert filters.slurm_nodes_state(text, ["gpu01", "gpu03"])["usable"] is True


def test_the_registration_wait_is_one_task_on_the_controller():
    """One sinfo for the run's nodes, run once, never a delegated SSH session per node."""
    tasks = yaml.safe_load((ROOT / "roles" / "slurm_compute" / "tasks" / "registered.yml").read_text())
    delegated = [t for t in tasks if "delegate_to" in t]
    assert delegated and all(t.get("run_once") is True for t in delegated), delegated
