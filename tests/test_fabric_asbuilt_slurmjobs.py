"""`fabric test` through Slurm, the parts that run without a cluster: the tools' output read back (real
iperf3 output; ib_write_bw and all_reduce_perf in their published format), the task scripts run for real
(the probe on this machine, the iperf3 ring between two network namespaces when root), the submit-host
round script run for real with bash, and the choice of transport from what the nodes report. The jobs
themselves run in tests/staged/test_fabric.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gpucluster.cluster import load_cluster
from gpucluster.errors import OperationError, UsageError
from gpucluster.fabric.asbuilt import jobs
from gpucluster.fabric.asbuilt.measure import measure
from gpucluster.fabric.asbuilt.slurmrun import NodeProbe, choose_transport, parse_probe, partition_for, settings_for
from gpucluster.fabric.asbuilt.tooloutput import (
    MARK,
    ToolError,
    all_reduce_busbw,
    demux,
    ib_write_bw_gbps,
    iperf3_gbps,
)

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tests" / "fixtures" / "asbuilt" / "tools"


def fixture(name: str) -> str:
    return (TOOLS / name).read_text()


def labelled(task: int, text: str) -> str:
    return "\n".join(f"{task}: {line}" for line in text.splitlines())


# ---- the tools' output ------------------------------------------------------------------------------

def test_iperf3_reads_both_directions_and_takes_the_slower():
    doc = json.loads(fixture("iperf3-bidir.json"))["end"]
    forward = doc["sum_received"]["bits_per_second"] / 1e9
    reverse = doc["sum_received_bidir_reverse"]["bits_per_second"] / 1e9
    value, detail = iperf3_gbps(fixture("iperf3-bidir.json"))
    assert value == pytest.approx(min(forward, reverse))
    assert "client -> server" in detail and "server -> client" in detail


def test_iperf3_throttled_receiver_is_the_slow_direction():
    value, _ = iperf3_gbps(fixture("iperf3-bidir-throttled.json"))
    assert value < 0.1 + 0.01  # the tbf rate was 100mbit on the receiver's host veth
    assert iperf3_gbps(fixture("iperf3-forward-throttled.json"))[0] < 0.11


def test_iperf3_error_is_a_tool_error_not_a_figure():
    with pytest.raises(ToolError, match="Connection refused"):
        iperf3_gbps(fixture("iperf3-refused.json"))
    with pytest.raises(ToolError, match="no JSON"):
        iperf3_gbps("iperf3: error - unable to connect to server")


def test_ib_write_bw_average_column_in_both_units():
    assert ib_write_bw_gbps(fixture("ib_write_bw-client.txt")) == 392.64
    assert ib_write_bw_gbps(fixture("ib_write_bw-mbytes.txt")) == pytest.approx(23471.80 * 1048576 * 8 / 1e9)
    with pytest.raises(ToolError, match="no result row"):
        ib_write_bw_gbps(fixture("ib_write_bw-refused.txt"))


def test_all_reduce_busbw_is_the_out_of_place_column_by_header():
    assert all_reduce_busbw(fixture("all_reduce_perf-2x8.txt")) == 347.26
    # an older table without the root column: the header still says where busbw is
    old = ("#       size         count      type   redop     time   algbw   busbw  error\n"
           "  1073741824     268435456     float     sum    10314  104.11  195.20  0e+00\n"
           "  2147483648     536870912     float     sum    20565  104.42  195.79  0e+00\n")
    assert all_reduce_busbw(old) == 195.79
    assert all_reduce_busbw("# Avg bus bandwidth    : 12.5 \n") == 12.5
    with pytest.raises(ToolError):
        all_reduce_busbw("NCCL WARN NET/IB : Got completion with error 12")


def test_demux_keeps_tasks_marks_and_parts_apart():
    text = "\n".join([
        f"0: {MARK} node=gpu01 job=41 role=ring to=gpu02", "1: " + f"{MARK} node=gpu02 job=41 role=ring to=gpu01",
        "0: line a", f"1: {MARK} part=mlx5_1", "1: in part", "srun: error: gpu02: task 1: Exited with exit code 1",
    ])
    tasks = demux(text)
    assert tasks[0].node == "gpu01" and tasks[0].to == "gpu02" and tasks[0].lines == ["line a"]
    assert tasks[1].parts == {"mlx5_1": ["in part"]}
    assert tasks[-1].lines == ["srun: error: gpu02: task 1: Exited with exit code 1"]


# ---- one case's output -> its figure -----------------------------------------------------------------

def _ring_output(per_node: dict[str, tuple[str, str]], job: str = "77") -> str:
    out = []
    for task, (node, (to, body)) in enumerate(per_node.items()):
        out.append(labelled(task, f"{MARK} node={node} job={job} role=ring to={to}\n{body}"))
    return "\n".join(out)


def test_measure_pair_is_the_slower_of_the_two_streams():
    healthy, slow = fixture("iperf3-bidir.json"), fixture("iperf3-forward-throttled.json")
    text = _ring_output({"gpu01": ("gpu02", healthy), "gpu02": ("gpu01", slow)})
    m = measure("iperf3", ("gpu01", "gpu02"), 0, text)
    assert m.value == pytest.approx(iperf3_gbps(slow)[0]) and m.job == "77"
    assert "gpu02 -> gpu01" in m.detail


def test_measure_names_the_silent_node_and_srun_s_own_words():
    text = _ring_output({"gpu01": ("gpu02", fixture("iperf3-bidir.json"))})
    text += "\nsrun: error: gpu02: task 1: Exited with exit code 3"
    with pytest.raises(ToolError, match=r"gpu02 sent no result.*Exited with exit code 3"):
        measure("iperf3", ("gpu01", "gpu02"), 1, text)
    with pytest.raises(ToolError, match=r"ran nothing.*Immediate execution impossible"):
        measure("iperf3", ("gpu01", "gpu02"), 1, "srun: error: Unable to allocate resources: Immediate execution "
                "impossible")


def test_measure_perftest_sums_the_rails_of_each_direction():
    client = fixture("ib_write_bw-client.txt")
    body = "\n".join(f"{MARK} part=mlx5_{r}\n{client}" for r in range(8))
    text = _ring_output({"gti0001": ("gti0002", body), "gti0002": ("gti0001", body)})
    assert measure("perftest", ("gti0001", "gti0002"), 0, text).value == pytest.approx(8 * 392.64)


def test_measure_whole_cluster_reports_the_slowest_stream():
    nodes = ("n1", "n2", "n3", "n4")
    links = dict(jobs.ring_links(nodes))
    bodies = {n: fixture("iperf3-bidir.json") for n in nodes}
    bodies["n3"] = fixture("iperf3-forward-throttled.json")
    text = _ring_output({n: (links[n], bodies[n]) for n in nodes})
    m = measure("iperf3", nodes, 0, text)
    assert m.value < 0.11 and f"slowest n3 -> {links['n3']}" in m.detail


def test_measure_nccl_reads_rank_zero_among_the_ranks():
    text = "\n".join([labelled(r, f"{MARK} node=gti000{1 + r // 8} job=9 role=rank rank={r}") for r in range(16)]
                     + [labelled(0, fixture("all_reduce_perf-2x8.txt"))])
    assert measure("nccl", ("gti0001", "gti0002"), 0, text).value == 347.26


def test_ring_links_pair_both_ways_and_the_cluster_across_the_middle():
    assert jobs.ring_links(("a", "b")) == [("a", "b"), ("b", "a")]
    links = jobs.ring_links(tuple("abcdef"))
    assert links[0] == ("a", "d") and sorted(b for _, b in links) == list("abcdef")  # everyone receives once


# ---- the scripts, run for real -----------------------------------------------------------------------

def test_probe_script_reports_this_machine():
    env = {**os.environ, "SLURMD_NODENAME": "here", "SLURM_JOB_ID": "5"}
    res = subprocess.run(["bash", "-c", jobs.PROBE, "probe", "/nonexistent/all_reduce_perf"], env=env,
                         capture_output=True, text=True, check=True, timeout=60)
    probes = parse_probe(labelled(0, res.stdout))
    p = probes["here"]
    want_gpus = 0
    for dev in Path("/sys/bus/pci/devices").glob("*"):
        try:
            vendor, cls = (dev / "vendor").read_text().strip(), (dev / "class").read_text().strip()
        except OSError:
            continue
        want_gpus += any(vendor == v and cls.startswith(c) for v, cs in jobs.GPU_PCI for c in cs)
    assert p.gpus == want_gpus
    ib = Path("/sys/class/infiniband")
    assert p.hcas == (tuple(sorted(x.name for x in ib.iterdir())) if ib.is_dir() else ())
    assert ("iperf3" in p.tools) == bool(shutil.which("iperf3"))
    assert "all_reduce_perf" not in p.tools


def test_probe_on_a_real_gpu_host_finds_the_gpu_and_refuses_the_stand_in():
    """The probe's output on a real H100 host: its GPU counts, so iperf3 is never chosen there; without
    nccl-tests or an HCA the test says what to build."""
    probes = parse_probe(labelled(0, fixture("probe-h100.txt")))
    (node, p), = probes.items()
    assert p.gpus == 1 and p.hcas == () and p.tools == {}
    with pytest.raises(OperationError, match=f"{node} lack all_reduce_perf"):
        choose_transport({**probes, "peer": p})


def test_round_script_runs_every_job_and_frames_each_output(tmp_path):
    argvs = [["bash", "-c", f"sleep {1 + (3 - i) / 10}; echo '0: job {i}'; exit {i}"] for i in range(4)]
    t0 = time.monotonic()
    res = subprocess.run(["bash", "-s"], input=jobs.round_script(argvs, parallel=8), capture_output=True, text=True,
                         timeout=60, check=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert time.monotonic() - t0 < 3  # at once (1.3 s), not one after another (4.6 s)
    found = jobs.split_round(res.stdout)
    assert found == {i: (i, f"0: job {i}") for i in range(4)}
    assert list(tmp_path.iterdir()) == []  # its private folder is gone


def test_round_script_caps_the_jobs_in_flight(tmp_path):
    argvs = [["bash", "-c", "sleep 0.4"] for _ in range(4)]
    t0 = time.monotonic()
    subprocess.run(["bash", "-s"], input=jobs.round_script(argvs, parallel=2), capture_output=True, text=True,
                   timeout=60, check=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert time.monotonic() - t0 >= 0.8


def _netns(name: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", name, *argv]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("iperf3") or not shutil.which("ip"),
                    reason="needs root, iproute2 and iperf3: the ring script runs in two network namespaces")
def test_iperf3_ring_script_between_two_namespaces():
    """The task script srun runs, run for real on two 'nodes' (namespaces on a veth pair), then read back."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"gpcft-{tag}a", f"gpcft-{tag}b"
    run = lambda *argv: subprocess.run(argv, check=True, capture_output=True)  # noqa: E731
    try:
        run("ip", "netns", "add", a)
        run("ip", "netns", "add", b)
        run("ip", "link", "add", "eth0", "netns", a, "type", "veth", "peer", "name", "eth0", "netns", b)
        for ns, addr in ((a, "10.234.0.1/24"), (b, "10.234.0.2/24")):
            run("ip", "-n", ns, "addr", "add", addr, "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        nodes = ("10.234.0.1", "10.234.0.2")  # node names the scripts resolve: addresses here
        links = [f"{x}>{y}" for x, y in jobs.ring_links(nodes)]
        procs = []
        for ns, node in ((a, nodes[0]), (b, nodes[1])):
            env = {**os.environ, "SLURMD_NODENAME": node, "SLURM_JOB_ID": "4242"}
            procs.append(subprocess.Popen(_netns(ns, "bash", "-c", jobs.IPERF3_RING, "ring", "1", "", *links), env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        text = "\n".join(labelled(i, o) for i, o in enumerate(outs))
        m = measure("iperf3", nodes, 0, text)
        assert m.job == "4242" and m.value > 0.1, m
        assert f"{nodes[0]} -> {nodes[1]}" in m.detail and f"{nodes[1]} -> {nodes[0]}" in m.detail
    finally:
        for ns in (a, b):  # an iperf3 left by a failed run would keep the namespace alive
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout
            for pid in pids.split():
                subprocess.run(["kill", pid], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.mark.skipif(not shutil.which("iperf3"), reason="needs iperf3")
def test_iperf3_ring_client_failure_ends_the_task_at_once():
    """A client that cannot reach its peer exits 1 without waiting for its own server, so srun's
    --kill-on-bad-exit ends the job (and the peer) instead of the time limit."""
    env = {**os.environ, "SLURMD_NODENAME": "here", "SLURM_JOB_ID": str(os.getpid())}
    t0 = time.monotonic()
    res = subprocess.run(["bash", "-c", jobs.IPERF3_RING, "ring", "1", "", "here>nowhere.invalid",
                          "nowhere.invalid>here"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 1 and time.monotonic() - t0 < 20, res.stdout
    with pytest.raises(ToolError, match=r"nowhere\.invalid"):
        measure("iperf3", ("here", "nowhere.invalid"), 1, labelled(0, res.stdout))


def test_task_scripts_are_valid_bash():
    for name in ("PROBE", "IPERF3_RING", "IB_WRITE_BW_RING", "NCCL"):
        res = subprocess.run(["bash", "-n", "-c", getattr(jobs, name)], capture_output=True, text=True, check=False)
        assert res.returncode == 0, (name, res.stderr)


# ---- srun lines and the choice of transport ----------------------------------------------------------

@pytest.fixture(scope="module")
def meta_ib():
    return load_cluster(ROOT / "examples" / "meta-24k-ib.yaml")


def test_each_case_is_pinned_to_its_nodes(meta_ib):
    s = jobs.Settings(hcas={"gti0001": tuple(f"mlx5_{i}" for i in range(8))}, partition="gpu")
    argv = jobs.case_argv("perftest", ("gti0001", "gti0002"), 3, s)
    assert "--nodelist=gti0001,gti0002" in argv and "--nodes=2" in argv and "--partition=gpu" in argv
    assert argv[argv.index("gpucluster-fabric-ring") + 2] == "mlx5_3"  # one rail: its HCA only
    argv = jobs.case_argv("perftest", ("gti0001", "gti0002"), None, s)
    assert argv[argv.index("gpucluster-fabric-ring") + 2].split() == [f"mlx5_{i}" for i in range(8)]
    nccl = jobs.case_argv("nccl", ("gti0001", "gti0002"), 5, jobs.Settings(
        gpus_per_node={"gti0001": 8, "gti0002": 8}, hcas={"gti0001": tuple(f"mlx5_{i}" for i in range(8))}))
    assert "--ntasks-per-node=8" in nccl and "--mpi=pmix" in nccl and "mlx5_5" in nccl


def test_settings_come_from_the_spec(meta_ib):
    from gpucluster.inventory.reader import Inventory

    inv = Inventory(Path("hosts.yml"), {}, {}, {"nccl_tests_dir": "/site/nccl-tests"})
    s = settings_for(meta_ib.plan, inv)
    group = meta_ib.spec.fabric_groups[0]
    assert s.gpus_per_node[group.hosts[0]] == group.gpus_per_node
    assert s.hcas[group.hosts[0]] == tuple(meta_ib.plan.hcas(group))
    assert s.nccl_binary == "/site/nccl-tests/build/all_reduce_perf"


def test_partition_is_the_one_holding_the_nodes():
    staging = load_cluster(ROOT / "examples" / "staging.yaml")
    assert partition_for(staging.plan, ("gpu01", "gpu03")) == ""  # gpu is the default partition


def _probe(n, gpus=0, hcas=(), tools=()):
    return NodeProbe(n, gpus, tuple(hcas), {t: f"/usr/bin/{t}" for t in tools})


def test_transport_follows_what_every_node_has():
    staged = {n: _probe(n, tools=("iperf3", "ib_write_bw")) for n in ("gpu01", "gpu02")}
    assert choose_transport(staged)[0] == "iperf3"
    assert "stand-in" in choose_transport(staged)[1]
    real = {n: _probe(n, 8, ["mlx5_0"], ("iperf3", "ib_write_bw", "all_reduce_perf")) for n in ("a", "b")}
    assert choose_transport(real)[0] == "nccl"
    assert choose_transport(real, "perftest")[0] == "perftest"
    no_tests = {n: _probe(n, 8, ["mlx5_0"], ("ib_write_bw",)) for n in ("a", "b")}
    assert choose_transport(no_tests)[0] == "perftest"


def test_transport_refusals_say_what_is_missing():
    staged = {n: _probe(n, tools=("iperf3",)) for n in ("gpu01", "gpu02")}
    with pytest.raises(UsageError, match="gpu01, gpu02 lack all_reduce_perf or a GPU"):
        choose_transport(staged, "nccl")
    bare = {"gpu01": _probe("gpu01", tools=("iperf3",)), "gpu02": _probe("gpu02")}
    with pytest.raises(OperationError, match=r"gpu02 lack it.*--tags fabric-test"):
        choose_transport(bare)
    mixed = {"a": _probe("a", 8, ["mlx5_0"], ("all_reduce_perf",)), "b": _probe("b", tools=("iperf3",))}
    with pytest.raises(OperationError, match="b lack all_reduce_perf"):
        choose_transport(mixed)
    tools = ("all_reduce_perf", "iperf3")
    half = {"a": _probe("a", 8, (), tools), "b": _probe("b", 0, (), tools)}
    with pytest.raises(OperationError, match="the nodes differ: GPUs on 1 of 2"):
        choose_transport(half)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpucluster.cli", *args], capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def test_cli_bad_inventory_exits_2(tmp_path):
    res = _cli("fabric", "test", str(tmp_path / "nope"))
    assert res.returncode == 2 and "no such inventory" in res.stderr and "Traceback" not in res.stderr
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu01: {}\n")
    res = _cli("fabric", "test", str(inv))
    assert res.returncode == 2 and "gpucluster_spec" in res.stderr
    inv.write_text(f"all:\n  vars:\n    gpucluster_spec: {ROOT / 'examples' / 'staging.yaml'}\n"
                   "  hosts:\n    gpu01: {}\n")
    res = _cli("fabric", "test", str(inv))
    assert res.returncode == 2 and "no slurm_login or slurm_controller host" in res.stderr, res.stderr
    res = _cli("fabric", "test", str(inv), "--efficiency", "1.5")
    assert res.returncode == 2 and "--efficiency 1.5" in res.stderr
    inv.write_text(f"all:\n  vars:\n    gpucluster_spec: {ROOT / 'examples' / 'staging.yaml'}\n"
                   "  children:\n    slurm_controller:\n      hosts:\n        ctl01: {}\n")
    res = _cli("fabric", "test", str(inv), "--tier", "core")
    assert res.returncode == 2 and "no case to run (the fabric has 2 tiers)" in res.stderr, res.stderr
