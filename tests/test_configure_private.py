"""`gpucluster configure` runs Ansible from the cluster's private state folder, with a minimal environment,
and takes the cluster's secrets by path: checked here with the compile play alone (it runs on the
controller, so no node is needed), through the real ansible-runner and ansible-playbook."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import example_path

from gpucluster.cli import main
from gpucluster.configure.playbook import configure
from gpucluster.configure.secrets import generate, read_secrets_file, write_secrets_file
from gpucluster.errors import UsageError
from gpucluster.inventory.build import build_inventory
from gpucluster.paths import private_dir

OLD_SHARED = Path("/tmp/gpucluster-runner")  # where configure used to fall back to: anyone could write there


@pytest.fixture
def inventory(tmp_path) -> Path:
    return build_inventory(example_path("staging"), tmp_path / "inv").parent


def _tree_text(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_configure_ignores_extravars_planted_in_the_old_shared_folder(inventory, tmp_path, monkeypatch):
    """Before: no state folder in the inventory meant /tmp/gpucluster-runner, created without an owner or mode
    check, whose env/extravars ansible-runner reads. A planted gpucluster_spec there must change nothing now."""
    planted = OLD_SHARED / "env" / "extravars"
    created = not OLD_SHARED.exists()
    if created:
        planted.parent.mkdir(parents=True)
    saved = planted.read_bytes() if planted.exists() else None
    try:
        planted.write_text(json.dumps({"gpucluster_spec": "/nonexistent/planted.yaml"}))
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
        result = configure(inventory, playbook="compile.yml", log=lambda _l: None)
        assert result.ok, result.failures
        runner = tmp_path / "xdg" / "gpucluster" / "staging" / "runner"
        assert result.artifacts.is_relative_to(runner)
        assert stat.S_IMODE(runner.stat().st_mode) == 0o700
        assert "planted" not in _tree_text(result.artifacts)
    finally:
        if created:
            shutil.rmtree(OLD_SHARED, ignore_errors=True)
        elif saved is not None:
            planted.write_bytes(saved)
        else:
            planted.unlink()


def test_the_operators_environment_and_the_secrets_stay_out_of_the_artifacts(inventory, tmp_path, monkeypatch):
    marker = "gpc-operator-marker-" + base64.b32encode(os.urandom(10)).decode()
    monkeypatch.setenv("GPC_TEST_TOKEN", marker)
    secrets = generate()
    path = write_secrets_file(secrets, tmp_path / "private" / "secrets.json")
    result = configure(inventory, playbook="compile.yml", secrets=path, state_dir=tmp_path / "state",
                       log=lambda _l: None)
    assert result.ok, result.failures
    text = _tree_text(tmp_path / "state" / "runner")
    assert marker not in text
    assert secrets["munge_key_b64"] not in text and secrets["slurm_dbd_password"] not in text
    env = json.loads((result.artifacts / "command").read_text())["env"]
    assert "GPC_TEST_TOKEN" not in env and env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    # Ansible read a private copy of the checked bytes, never the operator's path; gone after the run
    command = " ".join(json.loads((result.artifacts / "command").read_text())["command"])
    assert str(path) not in command and f"@{tmp_path / 'state' / 'runner' / 'secrets.json'}" in command
    assert not (tmp_path / "state" / "runner" / "secrets.json").exists()


def test_configure_refuses_a_state_folder_others_can_write(inventory, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    state.chmod(0o770)
    with pytest.raises(UsageError, match="open to other users"):
        configure(inventory, playbook="compile.yml", state_dir=state, log=lambda _l: None)
    state.chmod(0o700)
    os.chown(state, 65534, 65534)  # nobody: root can do it, and a CI machine runs as root
    with pytest.raises(UsageError, match="belongs to uid 65534"):
        configure(inventory, playbook="compile.yml", state_dir=state, log=lambda _l: None)


def test_private_dir_refuses_a_link(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UsageError, match="not a plain folder"):
        private_dir(tmp_path / "link")
    assert stat.S_IMODE(private_dir(tmp_path / "new" / "state").stat().st_mode) == 0o700


# ---- the secrets file ------------------------------------------------------------------------------

@pytest.mark.parametrize("folder", ["/etc", "/etc/gpucluster", "/", "/var", "/usr/local/x", "/root", "/tmp",
                                    "/etc/../usr"])
def test_private_dir_never_takes_a_system_folder(folder):
    """As root every system folder is 'ours': closing /etc to 0700 would lock every other user out of it."""
    before = os.stat("/etc").st_mode
    with pytest.raises(UsageError, match="system folder"):
        private_dir(folder)
    assert os.stat("/etc").st_mode == before
    assert not Path("/etc/gpucluster").exists() or folder != "/etc/gpucluster"


def test_private_dir_takes_a_folder_of_its_own_under_a_system_folder(tmp_path):
    assert private_dir(tmp_path / "state").is_dir()


def test_generated_secrets_are_private_and_well_formed(tmp_path, capsys):
    out = tmp_path / "keep" / "prod.json"
    assert main(["secrets", "--generate", "-o", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    values = read_secrets_file(out)
    assert len(base64.b64decode(values["munge_key_b64"])) == 1024 and len(values["slurm_dbd_password"]) == 32
    assert base64.b64decode(values["pull_runner_signing_key_b64"]).startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    capsys.readouterr()
    assert main(["secrets", "--generate", "-o", str(out)]) == 2  # a new key would lock every node out
    assert "pass --force" in capsys.readouterr().err
    assert read_secrets_file(out) == values
    assert main(["secrets", "--generate", "-o", str(out), "--force"]) == 0
    assert read_secrets_file(out) != values


def test_secrets_are_never_generated_into_a_checkout(capsys):
    inside = Path(__file__).resolve().parent / "leak.json"
    assert main(["secrets", "--generate", "-o", str(inside)]) == 2
    assert not inside.exists() and "never written into a checkout" in capsys.readouterr().err


def _ecdsa_key_b64() -> str:
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    return base64.b64encode(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())).decode()


ARMOR_ONLY = base64.b64encode(b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n"
                              b"-----END OPENSSH PRIVATE KEY-----\n").decode()  # the lines, no key


@pytest.mark.parametrize("content, mode, message", [
    ({"munge_key_b64": "a2V5"}, 0o600, "munge_key_b64 decodes to 3 bytes"),
    ({"munge_key_b64": "not base64!"}, 0o600, "not base64"),
    ({"slurm_dbd_password": "x y"}, 0o600, "slurm_dbd_password must be"),
    ({"pull_runner_signing_key_b64": "a2V5"}, 0o600, "pull_runner_signing_key_b64 is not an OpenSSH private key"),
    ({"pull_runner_signing_key_b64": "not base64!"}, 0o600, "pull_runner_signing_key_b64 is not an OpenSSH"),
    ({"pull_runner_signing_key_b64": ARMOR_ONLY}, 0o600, "pull_runner_signing_key_b64 is not an OpenSSH"),
    ({"pull_runner_signing_key_b64": _ecdsa_key_b64()}, 0o600, "(unencrypted, ed25519)"),
    ({"ansible_ssh_pass": "x"}, 0o600, "unknown key"),
    (None, 0o640, "can be read by other users"),
])
def test_a_bad_secrets_file_is_refused_before_anything_runs(inventory, tmp_path, capsys, content, mode, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(content if content is not None else generate()))
    path.chmod(mode)
    assert main(["configure", str(inventory), "--secrets", str(path), "--state-dir", str(tmp_path / "st")]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err and "Traceback" not in err
    assert not (tmp_path / "st" / "runner" / "artifacts").exists()


# ---- what a person sees while configure runs -----------------------------------------------------

def test_the_live_line_says_what_runs_where_and_the_slowest_host():
    from gpucluster.configure.playbook import Progress

    p = Progress(log=lambda _l: None)
    p({"event": "playbook_on_play_start", "event_data": {"name": "Slurm | controller and compute"}})
    p({"event": "playbook_on_task_start", "created": "2026-01-01T00:00:00",
       "event_data": {"task": "slurm_common : Install", "role": "slurm_common"}})
    for host, at in (("gpu01", "00:00:01"), ("gpu02", "00:00:02"), ("gpu03", "00:00:03")):
        p({"event": "runner_on_start", "created": f"2026-01-01T{at}", "event_data": {"host": host}})
    p({"event": "runner_on_ok", "event_data": {"host": "gpu02", "res": {"changed": False}}})
    p({"event": "runner_on_failed", "event_data": {"host": "gpu03", "res": {"msg": "no"}}})
    line = p.now()
    assert "Slurm | controller and compute | slurm_common : Install: 2 done, 1 failed, 1 running" in line
    assert "slowest gpu01" in line


def test_status_lines_off_a_terminal_are_logged_when_they_change_at_most_every_n_seconds():
    from gpucluster.progress import status_line

    out: list[str] = []
    with status_line(live=False, every=0.0, write=out.append) as show:
        show("a")
        show("a")
        show("b")
    assert out == ["a", "b"]
    out.clear()
    with status_line(live=False, every=3600.0, write=out.append) as show:
        show("a")
        show("b")  # too soon after "a": a log gets one line per `every`
    assert out == ["a"]


def test_the_first_status_line_is_printed_however_young_the_clock(monkeypatch):
    """time.monotonic() counts from boot on Linux: on a host up less than `every` seconds the first
    line must still be printed (it was swallowed while printed_at started at 0.0)."""
    from gpucluster import progress

    monkeypatch.setattr(progress.time, "monotonic", lambda: 5.0)
    out: list[str] = []
    with progress.status_line(live=False, every=3600.0, write=out.append) as show:
        show("first")
        show("second")
    assert out == ["first"]


@pytest.mark.parametrize("options, message", [
    ({"mode": "sideways"}, "converge mode"),
    ({"mode": "push", "full": True}, "--full goes with"),
    ({"mode": "push", "trigger": "timer"}, "--trigger and --wait go with --pull"),
    ({"mode": "push", "wait": 5.0}, "--trigger and --wait go with --pull"),
])
def test_converge_refuses_a_pull_option_with_a_push_before_anything_runs(options, message, tmp_path) -> None:
    """configure.converge.converge decides push or pull: a pull-only option with a push is bad input (exit 2),
    refused before the inventory is read (there is none here) or anything runs."""
    from gpucluster.configure.converge import converge

    with pytest.raises(UsageError, match=message):
        converge(tmp_path / "no-inventory", **options)
