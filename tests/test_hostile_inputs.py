"""Every case of tests/hostile/inputs.py through the real reader or command: refused with a message that names
the file (and line), no traceback, nothing written, nothing run; or, where a value is data by design (a
tampered Pulumi export, a hand-written inventory), written !unsafe and kept out of ssh's options."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import cluster_example, example_path
from hostile.inputs import HOSTS, INPUT_CASES, InputCase

from gpucluster.cli import main
from gpucluster.errors import UsageError

SPEC = str(example_path("staging"))


class Blocked(BaseException):
    """Not an OSError (TimeoutError is one), so no reader's `except OSError` can mistake it for a refusal."""


@contextlib.contextmanager
def deadline(seconds: int = 20):
    """A read that blocks (a FIFO, /dev/zero) fails the test instead of hanging it."""
    def expired(*_):
        raise Blocked(f"no answer in {seconds} s: a read blocked")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused_by_command(case: InputCase, argv: list[str], arg: str, out: Path, capsys) -> None:
    with deadline():
        rc = main(argv)
    _, err = capsys.readouterr()
    assert rc == 2, err
    assert "Traceback" not in err
    named = arg if case.source not in ("state-dir",) else "--state-dir"
    assert named in err, err
    if case.line:
        assert f"{arg}:{case.line}" in err, err
    if case.says:
        assert case.says in err, err
    assert not out.exists()  # nothing written


@pytest.mark.parametrize("case", INPUT_CASES, ids=lambda c: c.id)
def test_hostile_input(case: InputCase, tmp_path: Path, capsys, monkeypatch):
    arg = case.build(tmp_path)
    out = tmp_path / "inv"
    monkeypatch.chdir(tmp_path)
    if case.source in ("ssh-config", "hosts"):
        flag = "--ssh-config" if case.source == "ssh-config" else "--hosts"
        refused_by_command(case, ["inventory", SPEC, "-o", str(out), flag, arg], arg, out, capsys)
    elif case.source == "spec":
        with deadline():
            rc = main(["check", arg])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and arg in err, err
    elif case.source == "spec-path":
        refused_by_command(case, ["inventory", arg, "-o", str(out)], arg, out, capsys)
    elif case.source == "state-dir":
        refused_by_command(case, ["inventory", SPEC, "-o", str(out), "--state-dir", arg], arg, out, capsys)
    elif case.source == "secrets":
        from gpucluster.configure.secrets import read_secrets_file

        with deadline(), pytest.raises(UsageError) as err:
            read_secrets_file(arg)
        assert arg in str(err.value) or str(Path(arg).parent) in str(err.value)
    elif case.source == "pulumi":
        pulumi_case(case, arg)
    elif case.source == "pulumi-export":
        pulumi_export_case(arg, tmp_path)
    elif case.source == "ssh-argv":
        ssh_argv_case(arg, tmp_path)
    else:
        raise AssertionError(case.source)


def pulumi_case(case: InputCase, arg: str) -> None:
    from gpucluster.deploy.stackoutputs import inventory_args

    key, _, v = arg.partition("=")
    kw = {"ssh_user": "ops", "ssh_key_path": None, "known_hosts": "/etc/gpc/known_hosts"}
    addresses = {h: (h, 22) for h in HOSTS}
    if key == "user":
        kw["ssh_user"] = v
    elif key == "known_hosts":
        kw["known_hosts"] = v
    elif key == "key":
        kw["ssh_key_path"] = v
    elif key == "address":
        addresses["gpu01"] = (v, 22)
    with pytest.raises(UsageError, match=case.says):
        inventory_args(cluster_example("staging"), target="on-prem", stack="s", addresses=addresses, **kw)


def pulumi_export_case(arg: str, tmp_path: Path) -> None:
    """A stack's inventory output changed by whoever can write the stack's state: written !unsafe, read back
    as data, and the default state folder's template is not confused with it."""
    from gpucluster.deploy.stackoutputs import inventory_json
    from gpucluster.inventory.reader import load_inventory
    from gpucluster.inventory.statedir import literal
    from gpucluster.inventory.values import Data
    from gpucluster.inventory.writer import write_inventory_data

    key, _, v = arg.partition("=")
    data = json.loads(inventory_json(cluster_example("staging"), {}, {}))
    if key.startswith("ansible_"):
        data["all"]["children"]["nodegroup_gpu"]["hosts"] = {"gpu01": {key: v}, **{
            h: None for h in HOSTS if h.startswith("gpu") and h != "gpu01"}}
    else:
        data["all"]["vars"][key] = v
    hosts = write_inventory_data(tmp_path / "inv", data)
    files = "".join(p.read_text() for p in (tmp_path / "inv").rglob("*.yml"))
    assert re.search(r"!unsafe ['\"]?" + re.escape(v), files), files
    inv = load_inventory(hosts)
    got = inv.hosts["gpu01"].vars[key]
    assert got == v and isinstance(got, Data)
    if key == "gpucluster_state_dir":
        assert literal(got) == v  # data, not mistaken for the Jinja default


def ssh_argv_case(arg: str, tmp_path: Path) -> None:
    """An inventory written by hand (or by someone else): ssh_argv keeps gpucluster's host-key option first
    and the destination after `--`, so the real ssh (ssh -G) never reads a value as an option."""
    from gpucluster.inventory.reader import load_inventory

    key, _, v = arg.partition("=")
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(json.dumps({"all": {"vars": {"gpucluster_cluster": "x"},
                                                       "hosts": {"gpu01": {key: v}}}}))
    argv = load_inventory(inv).hosts["gpu01"].ssh_argv("true")
    assert argv[1:3] == ["-o", "StrictHostKeyChecking=yes"]
    res = subprocess.run(["ssh", "-G", "-F", "/dev/null", *argv[1:]], capture_output=True, text=True, timeout=30,
                         check=False)
    opts = {k: val for k, _, val in (line.partition(" ") for line in res.stdout.splitlines())}
    if key == "ansible_host" or key == "ansible_user":
        # a value that starts with '-' is the destination or the login name, never an option
        assert res.returncode != 0 or opts.get("proxycommand") in (None, "none"), res.stdout
    else:
        assert res.returncode == 0, res.stderr
        assert opts["stricthostkeychecking"] == "true" and opts.get("proxycommand") in (None, "none")
