"""The active checks' job scripts, run for real: rendered from examples/meta-24k-ib.yaml (8 x H100, 8 x
400G NDR rails), run by sh as sbatch would, with stand-ins on PATH for what this machine lacks (no GPU, no
HCA, no Slurm job): `dcgmi`, `all_reduce_perf`, `ib_write_bw`, `srun` and `scontrol`. Their output is the
tools' published format (tests/fixtures/asbuilt/tools/, tests/data/health/).

The stand-in srun runs the command once per node of the step (SLURMD_NODENAME set, as srun does); the
program the job reports through is the real runner (`runner.py --report`), each node with its own state
folder, and the stand-in scontrol keeps each node's State and Reason. So each case ends where an operator
looks: the node's state.json and its drain reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.node import runner
from gpucluster.render.health import active, slurmconf

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "health"
TOOLS = ROOT / "tests" / "fixtures" / "asbuilt" / "tools"
TIME_LIMIT = "0:00:06"  # the job's limit: the tools' budget is half of it (active.tool_seconds)
BUDGET = active.tool_seconds(active.slurm_seconds(TIME_LIMIT))
MIN_BUSBW = 350

# Stand-in for srun (no Slurm job here): runs the command once per node of the step; the health program
# the job reports through becomes the real runner with that node's config.
FAKE_SRUN = r'''#!/bin/sh
# Stand-in for srun, for the active-check job tests.
nodes="" n=1
while [ $# -gt 0 ]; do
  case "$1" in
    -w) nodes=$2; shift 2 ;;
    --nodes=*) n=${1#--nodes=}; shift ;;
    --ntasks=*|--ntasks-per-node=*|--overlap) shift ;;
    *) break ;;
  esac
done
[ -n "$nodes" ] || nodes=$(echo "$SLURM_JOB_NODELIST" | tr ',' '\n' | head -n "$n" | tr '\n' ',')
rc=0
for node in $(echo "$nodes" | tr ',' ' '); do
  if [ "$1" = "{program}" ]; then
    ( shift; SLURMD_NODENAME=$node "{python}" "{runner}" --config "$GPC_TEST_DIR/$node/config.json" \
      --node "$node" "$@" >>"$GPC_TEST_DIR/reports.log" 2>&1 ) || rc=$?
  else
    SLURMD_NODENAME=$node "$@" || rc=$?
  fi
done
exit $rc
'''

# Stand-in for scontrol: per node State and Reason in a JSON file; `show hostnames` splits on commas.
FAKE_SCONTROL = r'''#!/usr/bin/env python3
# Stand-in for scontrol, for the active-check job tests.
import json, os, sys
db_path = os.path.join(os.environ["GPC_TEST_DIR"], "slurm.json")
db = json.load(open(db_path))
args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    print("\n".join(args[2].split(",")))
elif args[:3] == ["show", "node", "-o"]:
    node = db[args[3]]
    head = open("{line}").read().splitlines()[0].split(" Reason=")[0]
    head = head.replace("State=IDLE+DRAIN", "State=" + node["state"]).replace("NodeName=gpu01", "NodeName=" + args[3])
    print(head + (" Reason=" + node["reason"] + " [root@2026-11-23T01:23:51]" if node["reason"] else ""))
elif args[0] == "update":
    kv = dict(a.split("=", 1) for a in args[1:])
    node = db[kv["nodename"]]
    if kv["state"] == "drain":
        db[kv["nodename"]] = {"state": node["state"].split("+")[0] + "+DRAIN", "reason": kv["reason"]}
    json.dump(db, open(db_path, "w"))
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    text = (ROOT / "examples" / "meta-24k-ib.yaml").read_text()
    section = (f"health:\n  active:\n    checks: [dcgm-diag, nccl-allreduce, ib-bandwidth]\n"
               f"    time_limit: \"{TIME_LIMIT}\"\n    nccl_min_busbw_gbps: {MIN_BUSBW}\n")
    d = tmp_path_factory.mktemp("active")
    (d / "s.yaml").write_text(text.replace("fabric:\n", section + "fabric:\n", 1))
    return load_cluster(d / "s.yaml")


@pytest.fixture
def job(cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """run(check, tools) renders the check's job script and runs it as sbatch would on its first node set."""
    monkeypatch.setattr(active, "NCCL_TESTS_DIR", str(tmp_path / "no-nccl-tests"))  # the fake is on PATH
    scripts = {j["check"]: j for j in active.jobs(cluster)}
    files = active.files(cluster)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def tool(name: str, body: str) -> None:
        (bin_dir / name).write_text(body if body.startswith("#!") else "#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)

    srun = FAKE_SRUN.replace("{program}", slurmconf.PROGRAM).replace("{python}", sys.executable)
    tool("srun", srun.replace("{runner}", str(Path(runner.__file__))))
    tool("scontrol", FAKE_SCONTROL.replace("{line}", str(DATA / "scontrol-show-node-o.txt")))

    class Job:
        def __init__(self) -> None:
            self.tool, self.dir = tool, tmp_path

        def run(self, check: str) -> subprocess.CompletedProcess:
            spec = scripts[check]
            nodes = spec["node_sets"][0].split(",")
            self.nodes = nodes
            (tmp_path / "slurm.json").write_text(json.dumps({n: {"state": "ALLOCATED", "reason": ""} for n in nodes}))
            for n in nodes:
                (tmp_path / n).mkdir(exist_ok=True)
                (tmp_path / n / "config.json").write_text(json.dumps({
                    "state_dir": str(tmp_path / n / "state"), "checks": [],
                    "env": {"PATH": f"{bin_dir}:/usr/bin:/bin", "GPC_TEST_DIR": str(tmp_path)}}))
            script = tmp_path / f"{check}.sh"
            script.write_text(files[spec["script"]])
            env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": ",".join(nodes),
                   "GPC_TEST_DIR": str(tmp_path), "HOME": str(tmp_path)}
            self.t0 = time.monotonic()
            res = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=120,
                                 check=False)
            self.seconds = time.monotonic() - self.t0
            return res

        def result(self, check: str, node: str | None = None) -> dict:
            node = node or self.nodes[0]
            return json.loads((tmp_path / node / "state" / "state.json").read_text())["checks"][check]

        def slurm(self, node: str | None = None) -> dict:
            return json.loads((tmp_path / "slurm.json").read_text())[node or self.nodes[0]]

    return Job()


# ---------------------------------------------------------------- DCGM diag

DCGM_TABLE = """Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| CUDA Main Library         | Pass                                           |
| Permissions and OS Blocks | Pass                                           |
| Persistence Mode          | Pass                                           |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | {remap}|
| Graphics Processes        | Pass                                           |
| Inforom                   | Pass                                           |
+---------------------------+------------------------------------------------+
"""


def dcgmi(job, remap: str = "Pass", rc: int = 0) -> None:
    (job.dir / "dcgmi.out").write_text(DCGM_TABLE.format(remap=f"{remap:47}"))
    job.tool("dcgmi", f'[ "$1 $2 $3" = "diag -r 1" ] || exit 99\ncat "{job.dir}/dcgmi.out"\nexit {rc}\n')


def test_dcgm_pass(job) -> None:
    dcgmi(job)
    res = job.run("dcgm-diag")
    assert res.returncode == 0, res.stderr
    r = job.result("dcgm-diag")
    assert (r["ok"], r["message"], r["active"]) == (True, "dcgmi diag -r 1 passed", True)
    assert job.slurm() == {"state": "ALLOCATED", "reason": ""}


@pytest.mark.parametrize("rc", [226, 0], ids=["exit-226", "exit-0"])
def test_dcgm_failure_drains_whatever_the_exit_status(job, rc: int) -> None:
    dcgmi(job, "Fail - GPU: 3", rc=rc)
    res = job.run("dcgm-diag")
    assert res.returncode == 1
    r = job.result("dcgm-diag")
    assert r["ok"] is False and r["message"].startswith("dcgmi diag -r 1: | Page Retirement/Row Remap | Fail - GPU: 3")
    assert job.slurm()["state"] == "ALLOCATED+DRAIN"
    assert job.slurm()["reason"].startswith("gpc:dcgm-diag: dcgmi diag -r 1: | Page Retirement")


def test_dcgm_missing_is_not_run_never_passed(job) -> None:
    res = job.run("dcgm-diag")
    assert res.returncode == 1
    r = job.result("dcgm-diag")
    assert (r["ok"], r.get("not_run")) == (False, True)
    assert r["message"] == "not run: dcgmi is not installed (no DCGM on this node)"
    assert job.slurm() == {"state": "ALLOCATED", "reason": ""}  # a missing tool is no fault of the GPUs


def test_dcgm_that_hangs_is_killed_at_its_budget(job) -> None:
    job.tool("dcgmi", "sleep 600\n")
    res = job.run("dcgm-diag")
    assert res.returncode == 1 and job.seconds < BUDGET + 5, job.seconds
    assert job.result("dcgm-diag")["message"] == f"dcgmi diag -r 1 did not finish within {BUDGET}s (killed)"
    assert job.slurm()["state"] == "ALLOCATED+DRAIN"


# ---------------------------------------------------------------- NCCL all_reduce

def all_reduce(job, busbw: float = 370.2, wrong: int = 0, rc: int = 0) -> None:
    text = (TOOLS / "all_reduce_perf-2x8.txt").read_text().replace("347.595", f"{busbw}")
    if wrong:
        text = text.replace("# Out of bounds values : 0 OK", f"# Out of bounds values : {wrong} FAILED")
    (job.dir / "arp.out").write_text(text)
    job.tool("all_reduce_perf", f'cat "{job.dir}/arp.out"\nexit {rc}\n')


@pytest.mark.parametrize("busbw", [350.0, 369.9, 391.0])
def test_nccl_pass(job, busbw: float) -> None:
    all_reduce(job, busbw)
    res = job.run("nccl-allreduce")
    assert res.returncode == 0, res.stderr
    r = job.result("nccl-allreduce")
    assert (r["ok"], r["message"]) == (True, f"all_reduce_perf on 8 GPUs: bus bandwidth {busbw} GB/s")
    assert job.slurm() == {"state": "ALLOCATED", "reason": ""}


def test_nccl_below_the_bar(job) -> None:
    all_reduce(job, 349.9)
    assert job.run("nccl-allreduce").returncode == 1
    want = f"all_reduce_perf on 8 GPUs: bus bandwidth 349.9 GB/s < {MIN_BUSBW:.1f}"
    assert job.result("nccl-allreduce")["message"] == want
    assert job.slurm()["reason"].startswith("gpc:nccl-allreduce: all_reduce_perf on 8 GPUs: bus bandwidth 349.9")


@pytest.mark.parametrize("rc", [0, 1], ids=["exit-0", "exit-1"])
def test_nccl_wrong_results_fail_even_at_full_speed(job, rc: int) -> None:
    all_reduce(job, 380.0, wrong=12, rc=rc)
    assert job.run("nccl-allreduce").returncode == 1
    assert job.result("nccl-allreduce")["message"] == "all_reduce_perf on 8 GPUs: 12 wrong results"
    assert job.slurm()["state"] == "ALLOCATED+DRAIN"


def test_nccl_fails_when_it_crashes(job) -> None:
    job.tool("all_reduce_perf", "echo 'gti0001: Test NCCL failure common.cu:1005 unhandled system error' >&2; exit 3\n")
    assert job.run("nccl-allreduce").returncode == 1
    assert job.result("nccl-allreduce")["message"].startswith("all_reduce_perf on 8 GPUs: exit 3 gti0001: Test NCCL")


def test_nccl_missing_is_not_run_never_passed(job) -> None:
    res = job.run("nccl-allreduce")
    assert res.returncode == 1
    r = job.result("nccl-allreduce")
    assert (r["ok"], r.get("not_run")) == (False, True) and r["message"].startswith("not run: all_reduce_perf")


def test_nccl_that_hangs_is_killed_at_its_budget(job) -> None:
    job.tool("all_reduce_perf", "sleep 600\n")
    assert job.run("nccl-allreduce").returncode == 1 and job.seconds < BUDGET + 5
    assert job.result("nccl-allreduce")["message"] == (f"all_reduce_perf on 8 GPUs did not finish within {BUDGET}s "
                                                       "(killed)")


# ---------------------------------------------------------------- IB bandwidth

def ib_write_bw(job, gbps: dict[str, float] | None = None, hang: str = "") -> None:
    """Server (no host argument): exits at once. Client: the captured table with this HCA's figure."""
    text = (TOOLS / "ib_write_bw-client.txt").read_text()
    for hca in job.hcas:
        (job.dir / f"ib.{hca}.out").write_text(text.replace("392.64", f"{(gbps or {}).get(hca, 392.64)}"))
    job.tool("ib_write_bw", f'''hca=$2
for last; do :; done
case "$last" in --report_gbits) exit 0 ;; esac
[ "$hca" = "{hang}" ] && sleep 600
cat "{job.dir}/ib.$hca.out"
''')


@pytest.fixture
def ib(job, cluster):
    job.hcas = next(j for j in active.jobs(cluster) if j["check"] == "ib-bandwidth")["hcas"]
    return job


def test_ib_pass(ib, cluster) -> None:
    ib_write_bw(ib)
    res = ib.run("ib-bandwidth")
    assert res.returncode == 0, res.stderr
    a, b = ib.nodes
    bar = round(cluster.plan.speed_gbps * active.IB_FLOOR, 1)
    for node in (a, b):
        r = ib.result("ib-bandwidth", node)
        assert (r["ok"], r["message"]) == (True, f"ib_write_bw {a} -> {b} on 8 HCAs at {bar} Gb/s or more")
        assert ib.slurm(node) == {"state": "ALLOCATED", "reason": ""}


def test_ib_below_the_bar_names_the_hca_and_drains_both(ib, cluster) -> None:
    bar = round(cluster.plan.speed_gbps * active.IB_FLOOR, 1)
    assert bar == 360.0
    ib_write_bw(ib, {"mlx5_3": 359.9})
    assert ib.run("ib-bandwidth").returncode == 1
    a, b = ib.nodes
    assert ib.result("ib-bandwidth")["message"] == f"ib_write_bw {a} -> {b} below {bar} Gb/s: mlx5_3 359.9 Gb/s;"
    assert ib.slurm(a)["state"] == ib.slurm(b)["state"] == "ALLOCATED+DRAIN"


def test_ib_no_figure_fails(ib) -> None:
    ib_write_bw(ib)
    (ib.dir / "ib.mlx5_5.out").write_text((TOOLS / "ib_write_bw-refused.txt").read_text())
    assert ib.run("ib-bandwidth").returncode == 1
    assert " mlx5_5 no result (exit 0: " in ib.result("ib-bandwidth")["message"]


def test_ib_missing_is_not_run_never_passed(ib) -> None:
    res = ib.run("ib-bandwidth")
    assert res.returncode == 1
    r = ib.result("ib-bandwidth")
    a, b = ib.nodes
    assert (r["ok"], r.get("not_run")) == (False, True)
    assert r["message"] == f"not run: ib_write_bw (perftest) is not installed on {a} {b}"


def test_ib_that_hangs_is_killed_at_its_budget(ib) -> None:
    ib_write_bw(ib, hang="mlx5_6")
    assert ib.run("ib-bandwidth").returncode == 1 and ib.seconds < BUDGET + 12, ib.seconds
    assert ib.result("ib-bandwidth")["message"].endswith(f"mlx5_6 did not finish within {BUDGET}s;")
