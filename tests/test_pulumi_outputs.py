"""Reading stack outputs back: `gpucluster inventory --pulumi-stack`, `gpucluster secrets --pulumi-stack`,
and the project and stack files.

The Pulumi CLI cannot be installed on the machines that run these tests; a stand-in `pulumi` script on
PATH answers `pulumi stack output` the way the CLI does (JSON on stdout, errors on stderr, exit 255),
and its absence is tested as the user meets it: exit 2, the install hint, no traceback.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, ROOT, cluster_example, example_path, loaded_example

from gpucluster.cli import main
from gpucluster.deploy.stackoutputs import inventory_args, inventory_json
from gpucluster.inventory import write_inventory

FAKE = """#!{python}
import json, sys
args = sys.argv[1:]
log = {log!r}
with open(log, "a") as fh:
    fh.write(json.dumps(args) + "\\n")
if {fail!r}:
    sys.stderr.write("error: no stack named '" + args[args.index("--stack") + 1] + "' found\\n")
    sys.exit(255)
outputs = json.load(open({outputs!r}))
name = args[-1]
value = outputs[name]
if "--show-secrets=true" not in args and name == "ansibleSecrets":
    value = "[secret]"
print(json.dumps(value))
"""


def _fake_pulumi(tmp_path: Path, outputs: dict, *, fail: bool = False) -> tuple[Path, Path]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "outputs.json").write_text(json.dumps(outputs))
    log = tmp_path / "calls.log"
    exe = bindir / "pulumi"
    exe.write_text(FAKE.format(python=sys.executable, log=str(log), fail=fail, outputs=str(tmp_path / "outputs.json")))
    exe.chmod(0o755)
    return bindir, log


def _stack_inventory(name: str) -> tuple[str, Path]:
    loaded, _plan = loaded_example(name)
    addresses = {h: (h, 22) for g in loaded.spec.node_groups for h in g.hosts}
    connection, extra = inventory_args(cluster_example(name), target="on-prem", stack=name, addresses=addresses,
                                       ssh_user="ops", ssh_key_path="~/.ssh/k", known_hosts="~/.ssh/kh")
    return inventory_json(cluster_example(name), connection, extra), (connection, extra)


def test_inventory_from_a_stack_is_the_writers_file(tmp_path: Path, monkeypatch, capsys) -> None:
    text, (connection, extra) = _stack_inventory("meta-rsc-phase1")
    bindir, log = _fake_pulumi(tmp_path, {"inventory": text})
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert main(["inventory", "--pulumi-stack", "meta-rsc-phase1", "-o", str(tmp_path / "inv")]) == 0
    direct = write_inventory(tmp_path / "direct", cluster_example("meta-rsc-phase1"), connection, extra)
    assert (tmp_path / "inv" / "hosts.yml").read_bytes() == direct.read_bytes()
    call = json.loads(log.read_text().splitlines()[-1])
    assert call == ["stack", "output", "--stack", "meta-rsc-phase1", "--json", "--show-secrets=false", "inventory"]
    assert "wrote" in capsys.readouterr().out


def test_without_the_pulumi_cli_the_inventory_command_says_how_to_install_it(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # the venv's bin: gpucluster, no pulumi
    res = subprocess.run([str(Path(sys.executable).parent / "gpucluster"), "inventory", "--pulumi-stack",
                          "meta-24k-roce", "-o", str(tmp_path / "inv")], capture_output=True, text=True, env=env,
                         timeout=120, check=False)
    assert res.returncode == 2, res.stderr
    assert "the Pulumi CLI is not on PATH" in res.stderr
    assert "https://www.pulumi.com/docs/install/" in res.stderr
    assert "gpucluster inventory SPEC -o DIR" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "inv").exists()


def test_a_stack_the_cli_does_not_know_is_a_usage_error(tmp_path: Path, monkeypatch, capsys) -> None:
    bindir, _log = _fake_pulumi(tmp_path, {}, fail=True)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert main(["inventory", "--pulumi-stack", "nope", "-o", str(tmp_path / "inv")]) == 2
    err = capsys.readouterr().err
    assert "exit 255" in err and "no stack named 'nope' found" in err and "pulumi stack ls" in err


def test_an_output_that_is_not_an_inventory_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    bindir, _log = _fake_pulumi(tmp_path, {"inventory": json.dumps({"all": {}})})
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert main(["inventory", "--pulumi-stack", "x", "-o", str(tmp_path / "inv")]) == 2
    assert "not a gpucluster inventory" in capsys.readouterr().err


def test_secrets_go_to_a_private_file_outside_the_checkout(tmp_path: Path, monkeypatch, capsys) -> None:
    values = {"munge_key_b64": "a2V5", "slurm_dbd_password": "pw", "pull_runner_signing_key_b64": "a2V5"}
    bindir, log = _fake_pulumi(tmp_path, {"ansibleSecrets": values})
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    target = tmp_path / "private" / "secrets.json"
    assert main(["secrets", "--pulumi-stack", "meta-24k-roce", "-o", str(target)]) == 0
    assert json.loads(target.read_text()) == values
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert "--show-secrets=true" in json.loads(log.read_text().splitlines()[-1])
    assert f"-e @{target}" in capsys.readouterr().out


def test_secrets_are_never_written_inside_the_checkout(tmp_path: Path, monkeypatch, capsys) -> None:
    bindir, _log = _fake_pulumi(tmp_path, {"ansibleSecrets": {"munge_key_b64": "a2V5",
                                                              "pull_runner_signing_key_b64": "a2V5"}})
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    inside = ROOT / "inventories" / "leak.json"
    assert main(["secrets", "--pulumi-stack", "x", "-o", str(inside)]) == 2
    assert not inside.exists()
    assert "never written into a checkout" in capsys.readouterr().err


def test_the_stacks_signing_key_reaches_the_secrets_file(tmp_path: Path, monkeypatch) -> None:
    """What the program exports (a mock run: the provider's real create drew the values) through
    `gpucluster secrets --pulumi-stack` into the file `gpucluster configure --secrets` checks and Ansible reads."""
    from pulumi_harness import run_program, stack_config, unwrap

    from gpucluster.configure.secrets import checked_secrets

    run = run_program(stack_config(example_path("meta-rsc-phase1"), sshKeyPath="~/.ssh/k"), stack="to-file")
    values = unwrap(run.stack_outputs["ansibleSecrets"])
    bindir, _log = _fake_pulumi(tmp_path, {"ansibleSecrets": values})
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    target = tmp_path / "private" / "secrets.json"
    assert main(["secrets", "--pulumi-stack", "to-file", "-o", str(target)]) == 0
    read, _raw = checked_secrets(target)
    assert read == values and set(read) == {"munge_key_b64", "slurm_dbd_password", "pull_runner_signing_key_b64"}
    key = tmp_path / "private" / "signing.key"
    key.write_bytes(base64.b64decode(read["pull_runner_signing_key_b64"]))
    key.chmod(0o600)
    res = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, timeout=60,
                         check=False, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and res.stdout.startswith("ssh-ed25519 "), res.stderr


def test_a_stack_without_the_signing_key_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    """A stack last updated before it held the signing key: no file that would leave each pushing machine to
    generate its own."""
    bindir, _log = _fake_pulumi(tmp_path, {"ansibleSecrets": {"munge_key_b64": "a2V5", "slurm_dbd_password": "pw"}})
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    target = tmp_path / "private" / "secrets.json"
    assert main(["secrets", "--pulumi-stack", "old", "-o", str(target)]) == 2
    assert not target.exists()
    err = capsys.readouterr().err
    assert "ansibleSecrets has no pull_runner_signing_key_b64" in err and "pulumi up --stack old" in err


def test_default_secrets_path_is_per_user_and_outside_the_checkout(tmp_path: Path, monkeypatch) -> None:
    from gpucluster.configure.secrets import default_path as default_secrets_path

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_secrets_path("s") == tmp_path / "gpucluster" / "secrets" / "s.json"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_secrets_path("s") == Path.home() / ".config" / "gpucluster" / "secrets" / "s.json"


# ---------------------------------------------------------------- project and stack files


def test_project_file() -> None:
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "gpucluster"
    assert project["runtime"] == {"name": "python", "options": {"toolchain": "pip", "virtualenv": ".venv"}}
    assert project["stackConfigDir"] == "stacks"
    assert (ROOT / project["main"] / "__main__.py").is_file()


def test_the_entry_is_thin() -> None:
    text = (ROOT / "stacks" / "__main__.py").read_text()
    code = [line for line in text.splitlines() if line.strip() and not line.startswith(("#", '"""'))]
    assert len(code) <= 4, code
    assert "from gpucluster.deploy.program import main" in text


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_has_a_stack(name: str) -> None:
    path = ROOT / "stacks" / f"Pulumi.{name}.yaml"
    config = yaml.safe_load(path.read_text())["config"]
    assert (ROOT / config["gpucluster:spec"]).resolve() == example_path(name).resolve()
    staged = name in ("staging", "staging-trixie")  # the examples made to be staged (docs/staging.md)
    assert config["gpucluster:target"] == ("staging" if staged else "on-prem")
    if not staged:
        assert config["gpucluster:sshKeyPath"] and config["gpucluster:knownHosts"]
    assert all(k.startswith("gpucluster:") for k in config), config


def test_no_stack_file_without_a_spec() -> None:
    stacks = {p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "stacks").glob("Pulumi.*.yaml")}
    assert stacks == set(EXAMPLES)
