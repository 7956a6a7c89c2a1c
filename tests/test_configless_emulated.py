"""Configless Slurm on the emulator: a real slurmctld (SlurmctldParameters=enable_configless, as rendered) and
24 ``slurmd -N --conf-server`` (22.05), and 8 of them on each Debian root's line (24.11, 26.05). No slurmd
holds a slurm.conf of its own (no -f, no SLURM_CONF; its configs are the ones slurmctld served into its
spool's conf-cache), and a SlurmdDebug change made on the controller only reaches every slurmd after
``scontrol reconfigure``: each slurmd reports the new level itself."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpucluster.emulate import roots
from gpucluster.emulate.emulator import config_nodes, emulate
from gpucluster.emulate.harness import SlurmCluster
from gpucluster.emulate.reconfigure import DEBUG_LEVELS, cached_value, own_conf, reconfigure_debug, slurmd_debug
from gpucluster.emulate.specs import scaled_spec, write_and_render

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HAVE_SLURM = all(shutil.which(t) or Path("/usr/sbin", t).exists() for t in ("slurmctld", "slurmd", "munged"))
needs_slurm = pytest.mark.skipif(not IN_CI and not HAVE_SLURM, reason="slurmctld/slurmd/munged not installed")
pytestmark = [needs_slurm, pytest.mark.slurm, pytest.mark.emulate]
NODES = 24
ROOT_LINES = [line for line, suite in roots.LINES.items() if suite]


def test_reconfigure_reaches_every_configless_slurmd(tmp_path: Path) -> None:
    rendered = write_and_render(scaled_spec("meta-24k-ib", {"h100": NODES}, name="cl24"), tmp_path, "cl24")
    with emulate(rendered.conf_dir, configless=True) as c:
        nodes = list(c.slurmd)
        assert len(nodes) == NODES
        served = (c.conf_path.read_text(), c.scontrol("show", "config"))
        assert "enable_configless" in served[1]
        before = DEBUG_LEVELS.index((cached_value(c, nodes[0], "SlurmdDebug") or "info").lower())
        for n in nodes:
            assert own_conf(c, n) == [], f"{n}'s slurmd reads a slurm.conf of its own"
            # what it runs on is what slurmctld served, kept in its own spool
            assert (c.conf_cache(n) / "slurm.conf").read_text() == served[0], n
            assert slurmd_debug(c, n) == before, n
        # the only slurm.conf files: the controller's, and one conf-cache copy per node
        confs = sorted(p.relative_to(c.workdir) for p in c.workdir.rglob("slurm.conf"))
        assert confs == sorted([Path("etc/slurm.conf"), *(Path("spool", n, "conf-cache/slurm.conf") for n in nodes)])

        got = reconfigure_debug(c, nodes, timeout=120)
        assert got.missing == [], f"{len(got.missing)} slurmd never reported SlurmdDebug={got.value}"
        assert DEBUG_LEVELS.index(got.value) != before
        for n in nodes:
            assert slurmd_debug(c, n) == DEBUG_LEVELS.index(got.value), n
            assert cached_value(c, n, "SlurmdDebug") == got.value, n


@pytest.mark.parametrize("line", ROOT_LINES)
def test_configless_on_every_root_line(tmp_path: Path, line: str) -> None:
    """The same on 24.11 and 26.05 (Debian roots, chroot): each slurmd fetches its configs and takes the change."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("root lines need root (chroot, mount namespaces)")
        pytest.skip("root lines need root (chroot, mount namespaces)")
    rendered = write_and_render(scaled_spec("meta-24k-ib", {"h100": 8}, name="cl8"), tmp_path, "cl8")
    with SlurmCluster(rendered.conf_dir, slurmd_nodes=config_nodes(rendered.conf_dir), line=line,
                      configless=True) as c:
        assert c.runtime.version().startswith(line + ".")
        nodes = list(c.slurmd)
        assert [n for n in nodes if own_conf(c, n)] == []
        got = reconfigure_debug(c, nodes, timeout=60)
        assert got.missing == [], f"{line}: {len(got.missing)} slurmd never reported SlurmdDebug={got.value}"
        assert all(cached_value(c, n, "SlurmdDebug") == got.value for n in nodes)
