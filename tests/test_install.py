"""gpucluster installs as a package: `pip install .` gives `check`, `plan` and `render` outside any checkout
(templates are package data; nothing finds the checkout by counting parent folders)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """gpucluster alone (its dependencies are the test venv's), installed from a wheel pip builds out of
    this checkout into a scratch folder."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    target = tmp_path_factory.mktemp("site")
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "--target", str(target), str(ROOT)], capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return target


def _run(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLUSTER_")}
    env["PYTHONPATH"] = str(installed)  # ahead of the editable install that points at this checkout
    return subprocess.run([sys.executable, "-c", "import sys, gpucluster.cli; "
                           "assert gpucluster.cli.__file__.startswith(sys.argv[1]), gpucluster.cli.__file__; "
                           "sys.exit(gpucluster.cli.main(sys.argv[2:]))", str(installed), *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_check_plan_and_render_work_outside_a_checkout(installed, tmp_path):
    spec = tmp_path / "cluster.yaml"
    shutil.copy(ROOT / "examples" / "meta-24k-roce.yaml", spec)
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert (installed / "gpucluster" / "templates" / "slurm" / "slurm.conf.j2").is_file()
    res = _run(installed, work, "check", str(spec))
    assert res.returncode == 0, res.stderr
    res = _run(installed, work, "plan", "--json", str(spec))
    assert res.returncode == 0 and '"switches"' in res.stdout, res.stderr
    res = _run(installed, work, "render", str(spec), "-o", str(work / "out"), "--no-cabling")
    assert res.returncode == 0, res.stderr
    rendered = (work / "out" / "slurm.conf").read_text()
    from gpucluster.cluster import load_cluster
    from gpucluster.render import render_all

    assert rendered == render_all(load_cluster(ROOT / "examples" / "meta-24k-roce.yaml"), cabling=False)["slurm.conf"]
