"""Hostile rollout state files: what `gpucluster rollout ... --status` and `--resume` are fed instead of the
state a rollout wrote (a malformed or doctored file, a link to /dev/zero, a FIFO, another user's file or
folder). Each is refused with exit 2 (UsageError from the library) and a message that names the file or
folder and the fix, with no traceback and no wait: every run is a subprocess under a timeout, so a read that
blocks (a FIFO) fails the test instead of hanging it.

Both commands and the library (`state.load`) are run on every case: --resume reads the state before it
reaches Slurm, so a SPEC target with no Slurm near is enough, and a refused state never gets that far."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.paths import examples_dir
from gpucluster.rollout import state as st
from gpucluster.rollout.engine import new_state
from gpucluster.rollout.waves import plan_waves, topology_units

STAGING = examples_dir() / "staging.yaml"
ROOT = Path(__file__).resolve().parent.parent
MOVE = "move it aside"
IS_ROOT = os.geteuid() == 0
NOBODY = pwd.getpwnam("nobody").pw_uid if IS_ROOT else -1
LIBRARY = """
import sys
from gpucluster.errors import UsageError
from gpucluster.rollout import state
try:
    state.load(sys.argv[1])
except UsageError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def good_state() -> dict:
    """A state as a drain rollout of the staging spec writes it (the engine's new_state)."""
    c = load_cluster(STAGING)
    waves = plan_waves(topology_units(c.plan, "leaf", c.contract_groups["slurm_compute"]), 2)
    return new_state("staging-20260101T000000", cluster=c.name, source=str(STAGING), change="drain", by="leaf",
                     max_unavailable=2, waves=waves, skipped=[], halt_share=0.1)


def _write(doc: object) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = st.state_path(folder)
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        path.chmod(0o600)
        return folder

    return make


def _edit(change: Callable[[dict], None]) -> Callable[[Path], Path]:
    s = good_state()
    change(s)
    return _write(s)


def _node_name(name: str) -> Callable[[dict], None]:
    """A node of wave 1 renamed, in the wave and in the outcomes alike (the file agrees with itself)."""
    def change(s: dict) -> None:
        old = s["waves"][0]["nodes"][0]
        s["waves"][0]["nodes"][0] = name
        s["nodes"][name] = s["nodes"].pop(old)
    return change


def _huge(folder: Path) -> Path:
    path = st.state_path(folder)
    with path.open("wb") as fh:  # sparse: the size is what is refused, no disk is spent
        fh.truncate(st.MAX_BYTES + 1)
    path.chmod(0o600)
    return folder


def _symlink_zero(folder: Path) -> Path:
    os.symlink("/dev/zero", st.state_path(folder))
    return folder


def _fifo(folder: Path) -> Path:
    os.mkfifo(st.state_path(folder), 0o600)
    return folder


def _file_owned_by_nobody(folder: Path) -> Path:
    _write(good_state())(folder)
    os.chown(folder / st.NAME, NOBODY, -1)
    return folder


def _file_writable_by_others(folder: Path) -> Path:
    _write(good_state())(folder)
    (folder / st.NAME).chmod(0o666)
    return folder


def _folder_writable_by_others(folder: Path) -> Path:
    _write(good_state())(folder)
    folder.chmod(0o777)
    return folder


def _folder_owned_by_nobody(folder: Path) -> Path:
    _write(good_state())(folder)
    os.chown(folder, NOBODY, -1)
    return folder


def _folder_a_symlink(folder: Path) -> Path:
    real = folder.parent / "real"
    _write(good_state())(real)
    os.symlink(real, folder)
    return folder


def _folder_under_a_symlink(folder: Path) -> Path:
    _write(good_state())(folder.parent / "real" / "s")
    os.symlink(folder.parent / "real", folder.parent / "via")
    return folder.parent / "via" / "s"


def _shared_folder(folder: Path) -> Path:
    """--state-dir pointed at a folder outside any private state folder: a shared one (sticky, as /tmp), with
    a well-formed state someone put there."""
    shared = folder.parent / "shared"
    shared.mkdir()
    _write(good_state())(folder)
    os.replace(folder / st.NAME, shared / st.NAME)
    shared.chmod(0o1777)
    return shared


def _deep(folder: Path) -> Path:
    return _write("[" * 200_000 + "]" * 200_000)(folder)


def _del(key: str) -> Callable[[dict], None]:
    return lambda s: s.pop(key)


def _set(**kv: object) -> Callable[[dict], None]:
    return lambda s: s.update(kv)


# (id, how the folder is made, words the message must hold besides the path, needs root)
CASES = [
    ("not-json", _write("{not json"), ["not JSON", MOVE], False),
    ("json-list", _write("[]"), ["a JSON object is expected", MOVE], False),
    ("nested-too-deep", _deep, ["nested too deep", MOVE], False),
    ("wrong-version", _edit(_set(version=2)), ["state version 2", "move the file aside"], False),
    ("version-a-string", _edit(_set(version="1")), ["version: the number 1", MOVE], False),
    ("missing-waves", _edit(_del("waves")), ["waves: a list of waves, not missing", MOVE], False),
    ("wrong-types", _edit(_set(max_unavailable="5", halt_share=True, finished="no", controller=[])),
     ["max_unavailable: a whole number", "halt_share: a share from 0 to 1", "finished: true or false", MOVE], False),
    ("unknown-change", _edit(_set(change="rm -rf /")), ["change: one of reboot, drain, reconfigure", MOVE], False),
    ("unknown-field", _edit(_set(apply_command="sh -c x")), ["apply_command: not a field", MOVE], False),
    ("id-not-a-name", _edit(_set(id="x reason=y")), ["id: a name of letters", MOVE], False),
    ("node-an-option", _edit(_node_name("-oProxyCommand=x")),
     ["waves[0].nodes[0]: -oProxyCommand=x is not a host name", MOVE], False),
    ("node-a-template", _edit(_node_name("{{7*191}}")), ["waves[0].nodes[0]: {{7*191}} is not a host name", MOVE],
     False),
    ("node-without-outcome", _edit(lambda s: s["nodes"].pop(s["waves"][0]["nodes"][0])),
     ["every node of a wave has an outcome", MOVE], False),
    ("outcome-unknown", _edit(lambda s: s["nodes"][s["waves"][0]["nodes"][0]].update(outcome="resumed")),
     [".outcome: one of pending", MOVE], False),
    ("huge-file", _huge, [f"larger than {st.MAX_BYTES} bytes", MOVE], False),
    ("symlink-to-dev-zero", _symlink_zero, ["is a link (to /dev/zero)", MOVE], False),
    ("fifo", _fifo, ["not a regular file", MOVE], False),
    ("file-of-another-uid", _file_owned_by_nobody, [f"belongs to uid {NOBODY}", MOVE], True),
    ("file-writable-by-others", _file_writable_by_others, ["can be written by other users", MOVE], False),
    ("folder-writable-by-others", _folder_writable_by_others, ["open to other users", "chmod 700"], False),
    ("folder-of-another-uid", _folder_owned_by_nobody, [f"belongs to uid {NOBODY}", "your own state folder"], True),
    ("folder-a-symlink", _folder_a_symlink, ["not a plain folder", "give --state-dir the real folder"], False),
    ("folder-under-a-symlink", _folder_under_a_symlink, ["is a link", "give the real path"], False),
    ("shared-folder", _shared_folder, ["open to other users", "chmod 700"], False),
]
MODES = ("status", "resume", "library")


def _run(mode: str, folder: Path) -> subprocess.CompletedProcess:
    if mode == "library":
        argv = [sys.executable, "-c", LIBRARY, str(folder / st.NAME)]
    else:
        argv = [sys.executable, "-m", "gpucluster.cli", "rollout", str(STAGING), "--change", "drain",
                "--state-dir", str(folder), f"--{mode}"]
    env = {**os.environ, "PATH": "/nonexistent"}  # no Slurm client can be reached, should it get that far
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("make", "words", "root"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_a_hostile_state_is_refused_with_exit_2_and_the_fix(make, words, root, mode, tmp_path) -> None:
    if root and not IS_ROOT:
        pytest.skip("giving a file to another uid needs root")
    folder = make(tmp_path / "state")
    res = _run(mode, folder)
    err = res.stderr
    assert res.returncode == 2, (res.returncode, res.stdout, err)
    assert "Traceback" not in err and not res.stdout, err
    assert err.startswith("error: ") and str(folder) in err, err
    for w in words:
        assert w in err, (w, err)


def test_the_good_state_passes_every_mode(tmp_path) -> None:
    """The control: the same runs on the state the engine writes get past the checks (--status prints it;
    --resume goes on to Slurm, which is out of reach here: exit 1, not 2)."""
    folder = _write(good_state())(tmp_path / "state")
    assert _run("library", folder).returncode == 0
    status = _run("status", folder)
    assert status.returncode == 0 and "rollout staging-20260101T000000 (drain by leaf" in status.stdout, status
    resume = _run("resume", folder)
    assert resume.returncode == 1 and "scontrol not found" in resume.stderr, resume


def test_a_state_of_another_cluster_is_refused(tmp_path) -> None:
    folder = _edit(_set(cluster="other"))(tmp_path / "state")
    for mode in ("status", "resume"):
        res = _run(mode, folder)
        assert res.returncode == 2 and "cluster: the rollout of 'other', not of 'staging'" in res.stderr, res


def test_status_and_resume_create_nothing(tmp_path) -> None:
    for mode in ("status", "resume"):
        res = _run(mode, tmp_path / "none")
        assert res.returncode == 2 and "no rollout state here" in res.stderr, res
    assert not (tmp_path / "none").exists()


def test_a_new_rollout_does_not_write_through_a_link(tmp_path) -> None:
    """A state file that is a link (here, dangling) is refused before a new rollout starts, and the file it
    points at is never written."""
    folder = tmp_path / "state"
    st.state_path(folder)
    os.symlink(tmp_path / "elsewhere", folder / st.NAME)
    argv = [sys.executable, "-m", "gpucluster.cli", "rollout", str(STAGING), "--change", "drain", "--state-dir",
            str(folder)]
    env = {**os.environ, "PATH": "/nonexistent"}  # no Slurm client: were the link not refused, exit 1
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=ROOT, env=env,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 2 and "is a link" in res.stderr and "Traceback" not in res.stderr, res
    assert not (tmp_path / "elsewhere").exists()
