"""gpucluster.slurmclient: the one way gpucluster runs Slurm's clients from the operator's machine.

The SSH form is run for real against a fake `ssh` on PATH that records its argv and hands the remote command to
`sh -c`, as the remote login shell would; the "remote" PATH holds stand-ins for scontrol, sinfo and sbatch that
record the argv they got. So what the remote shell makes of a hostile argument is what these tests see, and no
host is needed."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cluster_example

from gpucluster.errors import OperationError, UsageError
from gpucluster.inventory.reader import Host, Inventory
from gpucluster.slurmclient import SSH_OPTIONS, Client, SlurmError, failed, slurm_host

FAKE_SSH = """import json, os, sys
with open(os.environ["FAKE_SSH_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
env = dict(os.environ, PATH=os.environ["FAKE_REMOTE_PATH"] + os.pathsep + os.environ["PATH"])
os.chdir(os.environ["FAKE_REMOTE_HOME"])  # what a broken quoting makes lands here, not in the caller's folder
os.execvpe("sh", ["sh", "-c", sys.argv[-1]], env)
"""
FAKE_CLIENT = """import json, os, sys
with open(os.environ["FAKE_REMOTE_LOG"], "a") as fh:
    fh.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
sys.stdout.write(os.environ.get("FAKE_OUT", ""))
sys.stderr.write(os.environ.get("FAKE_ERR", ""))
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


class Remote:
    """What the fake ssh and the remote stand-ins recorded."""

    def __init__(self, tmp: Path):
        self.tmp = tmp

    def ssh_calls(self) -> list[list[str]]:
        log = self.tmp / "ssh.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def client_calls(self) -> list[list[str]]:
        log = self.tmp / "remote.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _script(path: Path, text: str) -> None:
    path.write_text(f"#!{sys.executable}\n{text}")
    path.chmod(0o755)


@pytest.fixture
def remote(tmp_path, monkeypatch) -> Remote:
    local, far = tmp_path / "bin", tmp_path / "remote-bin"
    local.mkdir()
    far.mkdir()
    _script(local / "ssh", FAKE_SSH)
    for name in ("scontrol", "sinfo", "sbatch"):
        _script(far / name, FAKE_CLIENT)
    monkeypatch.setenv("PATH", f"{local}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_SSH_LOG", str(tmp_path / "ssh.log"))
    monkeypatch.setenv("FAKE_REMOTE_LOG", str(tmp_path / "remote.log"))
    monkeypatch.setenv("FAKE_REMOTE_PATH", str(far))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("FAKE_REMOTE_HOME", str(tmp_path / "home"))
    return Remote(tmp_path)


def _host(name: str = "ctl01", **extra) -> Host:
    return Host(name, vars={"ansible_host": "192.0.2.10", "ansible_port": 2222, "ansible_user": "ops",
                            "ansible_ssh_private_key_file": "/keys/id_ed25519",
                            "ansible_ssh_common_args": "-o UserKnownHostsFile=/state/known_hosts", **extra})


def _inventory(**groups: list[str]) -> Inventory:
    hosts = {h: _host(h) for members in groups.values() for h in members}
    return Inventory(Path("inventories/test/hosts.yml"), hosts, {g: list(m) for g, m in groups.items()}, {})


# ---- the SSH command line -------------------------------------------------------------------------------------

def test_the_ssh_form_is_our_options_first_then_the_host_then_one_quoted_command():
    argv = Client(_host()).argv(["scontrol", "update", "nodename=gpu01", "reason=fan replaced"])
    dash = argv.index("--")
    assert argv[:3] == ["ssh", "-o", "StrictHostKeyChecking=yes"]  # gpucluster's host-key option before any other
    assert argv[dash + 1:] == ["192.0.2.10", "scontrol update nodename=gpu01 'reason=fan replaced'"]
    options = argv[1:dash]
    assert options[:8] == ["-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/state/known_hosts",
                           "-o", "BatchMode=yes", "-o", SSH_OPTIONS[0]]
    assert [options[i + 1] for i, o in enumerate(options) if o == "-o"][3:] == list(SSH_OPTIONS)
    assert options[-6:] == ["-i", "/keys/id_ed25519", "-p", "2222", "-l", "ops"]


def test_the_host_inventory_options_cannot_come_before_ours():
    host = _host(ansible_ssh_common_args="-o StrictHostKeyChecking=no")
    argv = Client(host).argv(["sinfo"])
    assert argv[1:3] == ["-o", "StrictHostKeyChecking=yes"]  # ssh keeps the first value of an option


def test_the_local_form_is_the_argv_itself_with_no_shell():
    hostile = "a b; $(touch x)"
    assert Client().argv(["sinfo", "-n", hostile]) == ["sinfo", "-n", hostile]
    res = Client()([sys.executable, "-c", "import sys; print(sys.stdin.read().upper(), sys.argv[1:])", hostile],
                   input="in")
    assert res.returncode == 0 and res.stdout == f"IN {[hostile]}\n"
    raw = Client()([sys.executable, "-c", "import sys; sys.stdout.buffer.write(bytes([0, 255]))"], binary=True)
    assert raw.stdout == b"\x00\xff"


def test_no_command_is_refused():
    with pytest.raises(ValueError, match="no command"):
        Client(_host()).argv([])


# ---- what the remote shell gets ---------------------------------------------------------------------------------

def test_hostile_arguments_reach_the_remote_command_as_data(remote, tmp_path):
    pwned = tmp_path / "pwned"
    hostile = ["two words", f"x; touch {pwned}1", f"$(touch {pwned}2)", f"`touch {pwned}3`", "line one\nline two",
               f"&& touch {pwned}4 ||", "it's \"quoted\"", "$HOME ~ * ?", "|", "", "-n", "--", "\\", "é ☃"]
    res = Client(_host())(["scontrol", "update", *hostile])
    assert res.returncode == 0, res.stderr
    assert remote.client_calls() == [["scontrol", "update", *hostile]]
    assert not list(tmp_path.glob("pwned*")) and not list((tmp_path / "home").iterdir())
    (call,) = remote.ssh_calls()
    assert call[-2:] == ["192.0.2.10", shlex.join(["scontrol", "update", *hostile])]


def test_input_reaches_the_remote_command_and_nothing_else_does(remote):
    client = Client(_host())
    assert client(["cat"], input="the round script\n").stdout == "the round script\n"
    assert client(["cat"]).stdout == ""  # no input: /dev/null, never the operator's terminal
    assert client(["cat"], input=b"\x00\x01", binary=True).stdout == b"\x00\x01"


# ---- errors -----------------------------------------------------------------------------------------------------

def test_a_timeout_is_one_error_naming_the_host_the_command_and_the_time(remote):
    with pytest.raises(SlurmError) as exc:
        Client(_host(), timeout=0.5)(["sleep", "5"])
    assert str(exc.value) == "sleep 5 on ctl01: no answer within 0.5 s"
    with pytest.raises(SlurmError, match=r"^sleep 5 on this machine: no answer within 0\.2 s$"):
        Client(timeout=10)(["sleep", "5"], timeout=0.2)


def test_a_non_zero_exit_is_an_error_with_the_command_host_status_and_output(remote, monkeypatch):
    monkeypatch.setenv("FAKE_RC", "1")
    monkeypatch.setenv("FAKE_ERR", "slurm_update error: Invalid node state\n\x1b[2J")
    client = Client(_host())
    res = client(["scontrol", "update", "nodename=gpu01", "state=bogus"])  # a call returns what ran
    assert res.returncode == 1
    with pytest.raises(SlurmError) as exc:
        client.check(["scontrol", "update", "nodename=gpu01", "state=bogus"], hint="is the state a Slurm one?")
    assert str(exc.value) == ("scontrol update nodename=gpu01 state=bogus on ctl01 failed (exit 1): slurm_update "
                              "error: Invalid node state \\x1b[2J; is the state a Slurm one?")
    with pytest.raises(SlurmError, match=r"^false on this machine failed \(exit 1\): no output$"):
        Client().check(["false"])


def test_the_error_is_an_operation_error_and_a_long_command_is_cut():
    assert issubclass(SlurmError, OperationError)  # the CLI prints it and exits 1
    res = subprocess.CompletedProcess([], 2, "", "bad")
    text = str(failed(["sh", "-c", "x" * 1000], res))
    assert text.startswith("sh -c xxx") and "…" in text and text.endswith("failed (exit 2): bad") and len(text) < 250


def test_a_missing_client_or_ssh_says_what_to_do(remote, monkeypatch):
    with pytest.raises(SlurmError, match="gpucluster-no-such-client not found on this machine: run this where the "
                                         "Slurm clients are"):
        Client()(["gpucluster-no-such-client"])
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SlurmError, match="ssh not found: install the OpenSSH client to reach ctl01"):
        Client(_host())(["sinfo"])


# ---- which host -------------------------------------------------------------------------------------------------

def test_the_slurm_host_is_a_login_node_else_a_controller():
    both = _inventory(slurm_controller=["ctl01"], slurm_login=["login01", "login02"])
    assert slurm_host(both, "to ask Slurm from").name == "login01"
    assert slurm_host(_inventory(slurm_controller=["ctl01"]), "to ask Slurm from").name == "ctl01"
    assert slurm_host(both, "to reach", ("slurm_controller",)).name == "ctl01"
    with pytest.raises(UsageError, match=r"^inventories/test/hosts.yml: no slurm_login or slurm_controller host to "
                                         r"ask Slurm from; write the inventory with `gpucluster inventory SPEC`"):
        slurm_host(_inventory(slurm_compute=["gpu01"]), "to ask Slurm from")


# ---- its users send the same commands through it ----------------------------------------------------------------

def test_the_rollout_drains_through_the_first_controller_with_the_reason_whole(remote, tmp_path):
    from gpucluster.rollout.live import LiveCluster

    inv = _inventory(slurm_login=["login01"], slurm_controller=["ctl01", "ctl02"], slurm_compute=["gpu01"])
    reason = "gpc: rollout r1; $(reboot) `x` 'y'\nState=IDLE"
    LiveCluster(tmp_path, inv).slurm().drain(["gpu01", "gpu02"], reason)
    assert remote.client_calls() == [["scontrol", "update", "nodename=gpu[01-02]", "state=DRAIN", f"reason={reason}"]]
    (call,) = remote.ssh_calls()
    assert call[call.index("--") - 6:call.index("--")] == ["-i", "/keys/id_ed25519", "-p", "2222", "-l", "ops"]
    with pytest.raises(UsageError, match="no slurm_controller host to reach Slurm through"):
        LiveCluster(tmp_path, _inventory(slurm_login=["login01"])).slurm()


def test_health_status_asks_the_login_node_and_says_a_failed_client(remote, tmp_path, monkeypatch):
    from gpucluster.health import remote as health_remote
    from gpucluster.health import status

    inv = tmp_path / "inv" / "hosts.yml"
    inv.parent.mkdir()
    inv.write_text("all:\n  children:\n    slurm_controller:\n      hosts:\n        ctl01: {ansible_host: 192.0.2.1}\n"
                   "    slurm_login:\n      hosts:\n        login01: {ansible_host: 192.0.2.2}\n"
                   "    slurm_compute:\n      hosts:\n        gpu01: {}\n")
    monkeypatch.setenv("FAKE_RC", "1")
    monkeypatch.setenv("FAKE_ERR", "Unable to contact slurm controller")
    with pytest.raises(SlurmError) as exc:
        health_remote.fleet_status(inv)
    assert str(exc.value).startswith("sh -c ") and " on login01 failed (exit 1): " in str(exc.value)
    assert "Unable to contact slurm controller" in str(exc.value)
    assert remote.client_calls() == [["scontrol", "--json", "show", "node"], ["sinfo", "--json"]]
    assert remote.ssh_calls()[0][-2:] == ["192.0.2.2", shlex.join(status.SHOW_NODES)]


def test_health_state_files_say_each_node_that_did_not_answer(remote, tmp_path):
    from gpucluster.health.remote import state_files

    texts, errors = state_files([_host("gpu01"), _host("gpu02")], timeout=5)
    assert texts == {} and set(errors) == {"gpu01", "gpu02"} and "No such file" in errors["gpu01"]


def test_fabric_test_asks_sinfo_on_the_login_node(remote, monkeypatch):
    from gpucluster.fabric.asbuilt import jobs
    from gpucluster.fabric.asbuilt.slurmrun import SlurmRunner

    plan = cluster_example("staging").plan
    runner = SlurmRunner(plan, _inventory(slurm_controller=["ctl01"], slurm_login=["login01"]), jobs.Settings())
    nodes = runner.nodes()
    runner.inv.groups["slurm_compute"] = list(nodes)
    monkeypatch.setenv("FAKE_OUT", "".join(f"{n} {'down*' if i == 0 else 'idle'}\n" for i, n in enumerate(nodes)))
    assert runner.check_nodes() == nodes[1:]
    assert remote.client_calls() == [["sinfo", "-h", "-N", "-o", "%N %t", "-n", ",".join(nodes)]]
    assert runner.submit.name == "login01"
    monkeypatch.setenv("FAKE_RC", "1")
    with pytest.raises(SlurmError, match=r"on login01 failed \(exit 1\): .*; is slurmctld up"):
        runner.check_nodes()


def test_validate_via_slurm_asks_sinfo_and_keeps_each_extra_argument_whole(remote, monkeypatch):
    from gpucluster.validate import viaslurm

    monkeypatch.setenv("FAKE_OUT", "gpu01 idle\ngpu02 drain\n")
    assert viaslurm.node_states(_host("login01"), ["gpu01", "gpu02"]) == {"gpu01": "idle", "gpu02": "drain"}
    assert remote.client_calls() == [["sinfo", "-h", "-N", "-o", "%N %t", "-n", "gpu01,gpu02"]]
    extra = ["-k", "munge or (slurmd and not gpu)", "--gpc-ssh=paramiko"]
    argv = viaslurm.sbatch_argv(["gpu01", "gpu02"], "gpu", "/mnt/flash/.gpucluster-validate/r1", "gpu01,gpu02",
                                extra=extra, time_limit="20:00", sbatch_words=["--reservation=maint", "--qos=a b"])
    assert argv[:argv.index("--wrap")] == [
        "sbatch", "--parsable", "--wait", "-J", "gpucluster-validate", "-N", "2", "-w", "gpu01,gpu02",
        "--ntasks-per-node=1", "-t", "20:00", "-o", "/mnt/flash/.gpucluster-validate/r1/slurm-%j.out", "-p", "gpu",
        "--reservation=maint", "--qos=a b"]
    wrap = shlex.split(argv[-1])
    assert wrap[wrap.index("python3"):] == ["python3", "-I", "-S", "/mnt/flash/.gpucluster-validate/r1/checks/"
                                            "gpc_node.py", "/mnt/flash/.gpucluster-validate/r1", "gpu01,gpu02", *extra]


def test_validate_ships_only_onto_a_mounted_tier_and_collects_what_the_nodes_wrote(tmp_path):
    """The shell steps of --via-slurm, run here (the local form): the bundle is refused by a folder that is not a
    fuse mount; the results and the jobs' logs come back, a node with none gets a failure, the run's folder goes."""
    from gpucluster.validate import viaslurm

    mount = tmp_path / "flash with space"
    mount.mkdir()
    remote = str(mount / ".gpucluster-validate" / "r1")
    with pytest.raises(UsageError, match=r"cannot copy the suite to this machine:.*/r1: .*flash with space is not "
                                         r"mounted"):
        viaslurm._ship(Client(), {"flash": {"mount": str(mount)}, "hosts": {}}, remote)
    assert not (mount / ".gpucluster-validate").exists()
    (Path(remote) / "results").mkdir(parents=True)
    (Path(remote) / "results" / "gpu01.xml").write_text("<testsuite/>")
    (Path(remote) / "slurm-7.out").write_text("log")
    out = viaslurm.SlurmOutcome(jobs=["7"])
    (tmp_path / "work").mkdir()
    viaslurm._collect(Client(), remote, ["gpu01", "gpu02"], tmp_path / "work", out, keep=False)
    got = tmp_path / "work" / "slurm"
    assert (got / "results" / "gpu01.xml").read_text() == "<testsuite/>" and (got / "slurm-7.out").exists()
    assert "no result from the Slurm job(s) 7" in (got / "results" / "gpu02.xml").read_text()
    assert out.junits == [(got / "results" / "gpu01.xml", "slurm:gpu01"), (got / "results" / "gpu02.xml",
                                                                           "slurm:gpu02")]
    assert not Path(remote).exists() and out.notes == []
