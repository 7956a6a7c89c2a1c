"""CI's xdist groups hold (scripts/test.sh runs both pytest phases with `--dist loadgroup`): each staged cluster's
tests run on one worker, the two clusters on different workers, `disruptive` tests last in their group, and
each Slurm cluster a module-scoped fixture starts is started by one worker only.

A real pytest-xdist run in a scratch tree holding copies of tests/conftest.py and tests/staged/conftest.py and a
probe module whose fixtures shadow the staged clusters by name (no podman, no Slurm): every probe test writes
the worker it ran on. xdist's own loadgroup is broken under pytest 9.2 (pytest-xdist#1386): without the
conftest's scheduler these tests spread over both workers and this test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

PROBE_STAGED = '''
import os, pytest
pytestmark = pytest.mark.staged

@pytest.fixture(scope="module")
def staged_cluster():
    return "22.05"

@pytest.fixture(scope="module")
def staged_trixie():
    return "24.11"

@pytest.fixture
def through_another(staged_trixie):
    return staged_trixie

def _ran(name, cluster):
    with open(os.environ["PROBE_OUT"], "a") as fh:
        fh.write(f"{os.environ['PYTEST_XDIST_WORKER']} {name} {cluster}\\n")

@pytest.mark.disruptive(2)
def test_node_stopped(staged_cluster):
    _ran("node_stopped", staged_cluster)

@pytest.mark.disruptive
def test_daemon_stopped(staged_cluster):
    _ran("daemon_stopped", staged_cluster)

@pytest.mark.parametrize("i", range(5))
def test_old(staged_cluster, i):
    _ran(f"old{i}", staged_cluster)

@pytest.mark.parametrize("i", range(5))
def test_new(staged_trixie, i):
    _ran(f"new{i}", staged_trixie)

def test_new_through_another_fixture(through_another):
    _ran("new_indirect", through_another)

def test_own_nodes():  # stages nodes of its own from the default image: the 22.05 group
    _ran("own_nodes", "22.05")
'''

PROBE_SLURM = '''
import os, pytest
pytestmark = pytest.mark.slurm

@pytest.fixture(scope="module", params=["a", "b"])
def daemons(request):
    return request.param

@pytest.mark.parametrize("i", range(4))
def test_on_daemons(daemons, i):
    with open(os.environ["PROBE_OUT"], "a") as fh:
        fh.write(f"{os.environ['PYTEST_XDIST_WORKER']} daemons{i} {daemons}\\n")
'''


def test_each_cluster_runs_on_one_worker_and_disruptive_tests_last(tmp_path: Path) -> None:
    (tmp_path / "tests" / "staged").mkdir(parents=True)
    shutil.copyfile(HERE / "conftest.py", tmp_path / "tests" / "conftest.py")
    shutil.copyfile(HERE / "staged" / "conftest.py", tmp_path / "tests" / "staged" / "conftest.py")
    (tmp_path / "tests" / "staged" / "test_probe_staged.py").write_text(PROBE_STAGED)
    (tmp_path / "tests" / "test_probe_slurm.py").write_text(PROBE_SLURM)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "ran.txt"
    env = {**os.environ, "PROBE_OUT": str(out)}
    env.pop("PYTEST_XDIST_WORKER", None)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "tests"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    ran = [line.split() for line in out.read_text().splitlines()]
    assert len(ran) == 14 + 8, ran

    workers: dict[str, set[str]] = {}
    for worker, _name, cluster in ran:
        workers.setdefault(cluster, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), f"a group ran on more than one worker: {workers}"
    assert workers["22.05"] != workers["24.11"], f"both staged clusters on one worker: {workers}"

    old = [name for worker, name, cluster in ran if cluster == "22.05"]
    assert old[-2:] == ["daemon_stopped", "node_stopped"], f"disruptive tests not last, by rank: {old}"
