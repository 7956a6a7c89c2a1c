"""Wall time and peak memory of `gpucluster fabric verify` on a Colossus-size InfiniBand dump.

    .venv/bin/python bench/fabric_verify.py                       # colossus-200k on InfiniBand, 3 runs
    .venv/bin/python bench/fabric_verify.py --spec examples/meta-24k-ib.yaml --runs 5
    .venv/bin/python bench/fabric_verify.py --keep /some/dir       # keep the generated dump there

The dump is written from the plan in ibnetdiscover's format by the test-side generator
(tests/fixtures/asbuilt/fabricgen.py), with a few faults injected so verify has something to explain.
The default spec is examples/colossus-200k.yaml moved onto InfiniBand (ib_colossus): 25,000 GPU nodes
(200,000 host links) and 600,896 cables in all, 8,312 switches. Each
run is a fresh `gpucluster fabric verify SPEC --ibnetdiscover DUMP --json` process, so the figures
include start-up, loading the spec and writing the JSON; peak RSS is that process's own (wait4).
Target: under 5 s and 500 MB. Prints figures, asserts nothing (bench/ convention).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))


def ib_colossus(folder: Path) -> Path:
    """examples/colossus-200k.yaml on InfiniBand: the same nodes, rails, scalable units and tiers, with
    ConnectX-7 NDR HCAs and a 128-port 400G switch (a catalog entry of the spec), so the dump has the
    Colossus shape: 25,000 GPU nodes, 200,000 host links, 600,896 cables, 8,312 switches."""
    import yaml

    data = yaml.safe_load((ROOT / "examples" / "colossus-200k.yaml").read_text())
    data["name"] = "colossus-200k-ib"
    for g in data["node_groups"]:
        if g.get("nic") == "bf3-400gbe":
            g["nic"] = "cx7-ndr-400g"
    data["fabric"]["type"] = "infiniband"
    data["fabric"].pop("roce", None)
    data["fabric"]["switches"] = {"leaf": "ib-128", "spine": "ib-128", "core": "ib-128"}
    data.setdefault("catalog", {}).setdefault("switches", {})["ib-128"] = {
        "name": "128-port 400G InfiniBand (bench)", "vendor": "nvidia", "ports": {400: 128},
        "fabrics": ["infiniband"]}
    path = folder / "colossus-200k-ib.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_dump(spec: str, path: Path) -> dict:
    """Runs in a child process (--write-dump): the generator's model of 600k cables takes GBs, and a
    verify process forked from a big parent would report the parent's pages as its own peak RSS."""
    from fixtures.asbuilt.fabricgen import build

    from gpucluster.cluster import load_cluster

    plan = load_cluster(spec).plan
    built = build(plan)
    group = plan.spec.fabric_groups[0]
    hosts = group.hosts
    hcas = plan.hcas(group)
    # four faults: a rail swap, a missing cable, a down-rated link, an unnamed HCA
    built.swap_far_ends(("H", hosts[10], hcas[1]), ("H", hosts[10], hcas[-1]))
    built.unlink(("H", hosts[20], hcas[0]))
    built.downrate(("H", hosts[30], hcas[2]), "4xHDR")
    built.hcas[(hosts[40], hcas[3])] = "localhost " + hcas[3]
    with open(path, "w") as fh:
        for chunk in built.ibnetdiscover_chunks():
            fh.write(chunk)
    return {"nodes": plan.nodes, "host_links": plan.links["node-leaf"], "cables": sum(plan.links.values()),
            "switches": sum(t.count for t in plan.tier_plans), "dump_mb": round(path.stat().st_size / 1e6, 1)}


def one_run(spec: str, dump: Path, folder: Path) -> tuple[float, float, float, int, dict]:
    """One verify process: wall seconds, CPU seconds (user + system: on a shared machine the steadier
    figure), its own peak RSS in MB (wait4's ru_maxrss), exit code, JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                    os.environ.get("PYTHONPATH")]))}
    out_path, err_path = folder / "verify.json", folder / "verify.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "gpucluster.cli", "fabric", "verify", spec,
                                 "--ibnetdiscover", str(dump), "--json"], stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = out_path.read_text()
    doc = json.loads(text) if text else {"error": err_path.read_text()[-500:]}
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode, doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", help="an InfiniBand spec whose plan is cabled (default: colossus-200k on InfiniBand)")
    ap.add_argument("--runs", type=int, default=3, help="verify runs (median printed)")
    ap.add_argument("--keep", help="write the dump into this folder and keep it")
    ap.add_argument("--write-dump", help=argparse.SUPPRESS)  # internal: the child that writes the dump
    args = ap.parse_args()
    if args.write_dump:
        print(json.dumps(write_dump(args.spec, Path(args.write_dump))))
        return 0
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-fabric-verify-"))
    folder.mkdir(parents=True, exist_ok=True)
    dump = folder / "ibnetdiscover.txt"
    try:
        spec = args.spec or str(ib_colossus(folder))
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, __file__, "--spec", spec, "--write-dump", str(dump)],
                               capture_output=True, text=True, check=True)
        shape = json.loads(child.stdout)
        args.spec = spec
        print(f"{Path(args.spec).name}: {shape['nodes']:,} nodes, {shape['switches']:,} switches, "
              f"{shape['host_links']:,} host links, {shape['cables']:,} cables; dump {shape['dump_mb']} MB "
              f"(written in {time.perf_counter() - t0:.1f} s)", flush=True)
        walls, cpus, rsss = [], [], []
        for i in range(args.runs):
            wall, cpu, rss, rc, doc = one_run(args.spec, dump, folder)
            walls.append(wall)
            cpus.append(cpu)
            rsss.append(rss)
            kinds = doc.get("summary", {}).get("findings_by_kind", doc)
            print(f"  run {i + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss:.0f} MB, exit {rc}, "
                  f"findings {kinds}", flush=True)
        print(f"verify: median {statistics.median(walls):.2f} s wall (min {min(walls):.2f}, max {max(walls):.2f}), "
              f"median {statistics.median(cpus):.2f} s CPU, peak RSS {max(rsss):.0f} MB; target < 5 s and < 500 MB; "
              f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
