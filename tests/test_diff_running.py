"""`gpucluster diff --inventory` against a running controller (the emulator: a real slurmctld 22.05 and one
`slurmd -N` per node): each change names the running jobs on the hosts it touches, in the text and in the
--json contract (contract 1, fields added: "running" at the top, "jobs" on each change); a controller that
does not answer is said, not an error."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import hostlist
import pytest

from gpucluster.cli import main
from gpucluster.emulate.emulator import emulate
from gpucluster.emulate.specs import scaled_spec, write_and_render

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HAVE_SLURM = all(shutil.which(t) or Path("/usr/sbin", t).exists() for t in ("slurmctld", "slurmd", "munged"))
pytestmark = [pytest.mark.skipif(not IN_CI and not HAVE_SLURM, reason="slurmctld/slurmd/munged not installed"),
              pytest.mark.slurm, pytest.mark.emulate]


def test_each_change_names_the_running_jobs_it_would_hit(tmp_path, capsys, monkeypatch) -> None:
    text = scaled_spec("meta-24k-ib", {"h100": 8}, name="dj", fabric={"scalable_unit_nodes": 4})
    r = write_and_render(text, tmp_path, "dj")
    old = tmp_path / "dj.yaml"
    new = tmp_path / "new.yaml"
    new.write_text(text.replace("\nfabric:", '\ndrivers:\n  branch: "580"\nfabric:', 1))  # reboot, compute only
    assert main(["inventory", str(old), "-o", str(tmp_path / "inv")]) == 0
    capsys.readouterr()
    with emulate(r.conf_dir) as c:
        res = c.run(["sbatch", "--parsable", "-N", "2", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 60"])
        jobid = res.stdout.strip().split(";")[0]
        deadline = time.monotonic() + 30
        while "RUNNING" not in c.run(["squeue", "-h", "-j", jobid, "-o", "%T"]).stdout:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        nodes = c.run(["squeue", "-h", "-j", jobid, "-o", "%N"]).stdout.strip()
        monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
        assert main(["diff", str(old), str(new), "--inventory", str(tmp_path / "inv"), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert main(["diff", str(old), str(new), "--inventory", str(tmp_path / "inv")]) == 0
        text_out = capsys.readouterr().out
    assert doc["contract"] == 1 and doc["running"] == {"asked": True, "reached": True, "error": None, "jobs": 1}
    reboot = [ch for ch in doc["changes"] if ch["class"] == "reboot"]
    assert reboot and all(ch["jobs"] == [{"id": jobid, "user": "root", "name": "wrap", "nodes": nodes}]
                          for ch in reboot)
    assert set(hostlist.expand_hostlist(nodes)) <= {h for ch in reboot for hl in ch["hosts"]
                                                    for h in hostlist.expand_hostlist(hl)}
    assert f"waits for 1 running job: {jobid} (root, {nodes})" in text_out
    # the same diff with no controller answering: said, not an error; jobs unknown (null), not empty. The clients'
    # config is an empty file: squeue fails at once as it does for a missing one (exit 1, "Unable to process
    # configuration file"), where a missing one is retried for 60 s first (Slurm 22.05's s_p_parse_file)
    gone = tmp_path / "gone" / "slurm.conf"
    gone.parent.mkdir()
    gone.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(gone))
    assert main(["diff", str(old), str(new), "--inventory", str(tmp_path / "inv"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["running"]["reached"] is False and doc["running"]["error"]
    assert all(ch["jobs"] is None for ch in doc["changes"])
