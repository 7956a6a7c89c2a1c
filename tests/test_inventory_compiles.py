"""The production path compiles once (docs/architecture.md, "The one load").

`gpucluster inventory SPEC -o DIR --state-dir S` parses and plans the spec, writes the inventory and compiles
into S (created 0700); configure's first play (playbooks/compile.yml, run here by the real ansible-playbook
against that inventory) then finds the stamp unchanged: 1 parse and 1 plan in total, counted across the
processes by GPUCLUSTER_TRACE. No node is reached: the compile play runs on localhost only.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpucluster.trace import counts

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "staging.yaml"
PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def _env(trace: Path) -> dict:
    return {**os.environ, "GPUCLUSTER_TRACE": str(trace), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}


def _inventory(tmp: Path, trace: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpucluster.cli", "inventory", str(SPEC), "-o", str(tmp / "inv"),
                           *extra], capture_output=True, text=True, env=_env(trace), timeout=120, check=False)


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not installed beside this Python")
def test_inventory_then_the_compile_play_parse_and_plan_once(tmp_path):
    trace, state = tmp_path / "trace", tmp_path / "state"
    res = _inventory(tmp_path, trace, "--state-dir", str(state))
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(state.stat().st_mode) == 0o700, "the state folder is not private"
    assert (state / "compiled" / "facts.json").is_file(), "inventory --state-dir did not compile"
    stamp = (state / "compiled" / "stamp.json").read_text()
    play = subprocess.run([str(PLAYBOOK), "-i", str(tmp_path / "inv"), str(ROOT / "playbooks" / "compile.yml")],
                          capture_output=True, text=True, env=_env(trace), cwd=ROOT, timeout=300, check=False)
    assert play.returncode == 0, play.stdout[-3000:] + play.stderr[-2000:]
    assert "changed=0" in play.stdout, play.stdout[-2000:]
    got = counts(trace)
    assert (got.get("parse", 0), got.get("plan", 0)) == (1, 1), f"inventory + the compile play: {got}"
    assert (state / "compiled" / "stamp.json").read_text() == stamp
    assert json.loads((state / "compiled" / "facts.json").read_text())["cluster"] == "staging"


def test_a_state_folder_others_can_write_is_refused_before_anything_is_written(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    res = _inventory(tmp_path, tmp_path / "trace", "--state-dir", str(state))
    assert res.returncode == 2 and "Traceback" not in res.stderr and "open to other users" in res.stderr
    assert not (tmp_path / "inv").exists() and not (state / "compiled").exists()
    shutil.rmtree(state)


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not installed beside this Python")
def test_a_limited_configure_compiles_an_edited_spec(tmp_path):
    """`--limit` leaves out localhost, and with it the compile play: configure compiles before Ansible runs, so a
    limited run (a rollout's wave, the controllers of a resize) never converges from the compile of an older spec.
    The run reaches no node: the compile playbook's only play is localhost's, which the limit skips."""
    from gpucluster.configure import configure

    spec = tmp_path / "staging.yaml"
    spec.write_text(SPEC.read_text())
    state = tmp_path / "state"
    res = subprocess.run([sys.executable, "-m", "gpucluster.cli", "inventory", str(spec), "-o", str(tmp_path / "inv"),
                          "--state-dir", str(state)], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    rendered = state / "compiled" / "rendered" / "slurm.conf"
    assert "SlurmctldTimeout=333" not in rendered.read_text()
    spec.write_text(SPEC.read_text().replace("  partitions:\n", "  parameters:\n    SlurmctldTimeout: 333\n"
                                             "  partitions:\n", 1))
    result = configure(tmp_path / "inv", playbook="compile.yml", limit="gpu01", log=lambda _line: None)
    assert result.ok, result.status
    assert "SlurmctldTimeout=333" in rendered.read_text()
