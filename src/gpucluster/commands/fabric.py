"""`gpucluster fabric ...`: the fabric as built against the fabric as planned (argument parsing and
printing only; the work is in the asbuilt modules)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpucluster.commands._flags import deprecated_alias, json_flag, no_color_flag, print_json
from gpucluster.errors import UsageError
from gpucluster.progress import progress

# Each subcommand's own examples; the exit status is the group's.
EXIT = ("exit status: 0 the fabric matches the plan (verify) / every result passed (test); 1 it differs / some "
        "result failed or was not measured; 2 bad input (file:line and a fix).")
EXAMPLES = {
    "discover": ["gpucluster fabric discover --ibnetdiscover dump.txt",
                 "gpucluster fabric discover --nvlink smi/        # smi/<node>.txt: nvidia-smi -q of each node"],
    "verify": ["gpucluster fabric verify examples/meta-24k-ib.yaml --ibnetdiscover dump.txt --sites site-names.csv",
               "gpucluster fabric verify examples/meta-24k-roce.yaml --lldp lldp/ --json"],
    "topofile": ["gpucluster fabric topofile examples/meta-24k-ib.yaml -o fabric.topo   # then: ibdiagnet -t "
                 "fabric.topo"],
    "switch-config": ["gpucluster fabric switch-config examples/meta-24k-roce.yaml -o switch-qos/"],
    "test-plan": ["gpucluster fabric test-plan examples/meta-24k-ib.yaml --tier spine"],
    "test": ["gpucluster fabric test inventories/prod                # every tier, as Slurm jobs",
             "gpucluster fabric test inventories/prod --tier spine --json"],
}

# A subcommand's description and examples print as written, not re-wrapped.
_RAW = argparse.RawDescriptionHelpFormatter


def _epilog(name: str) -> str:
    return "examples:\n" + "".join(f"  {line}\n" for line in EXAMPLES[name]) + EXIT


def _print_findings(findings, limit: int) -> None:
    from gpucluster.fabric.asbuilt.findings import by_kind

    counts = by_kind(findings)
    shown: dict[str, int] = {}
    for f in findings:
        shown[f.kind] = shown.get(f.kind, 0) + 1
        if shown[f.kind] <= limit:
            print(f"  {f.render()}")
        elif shown[f.kind] == limit + 1:
            print(f"  ... {counts[f.kind] - limit} more {f.kind} (all of them: --json)")


def cmd_discover(args: argparse.Namespace) -> int:
    from gpucluster.fabric.asbuilt.discover import discover
    from gpucluster.fabric.asbuilt.findings import Finding

    if args.nvlink:
        return _discover_nvlink(args)

    fab = _read_dump(args.ibnetdiscover)
    with progress("discover", total=fab.link_count(), unit="links") as advance:
        doc = discover(fab, advance)
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    tiers = ", ".join(f"{n:,} {t}" for t, n in doc["tiers"].items())
    print(f"{doc['source']}: {doc['switches']:,} switches ({tiers}), {doc['hosts']:,} hosts, "
          f"{doc['host_ports']:,} host ports, {len(doc['unidentified'])} unidentified, "
          f"{doc['aggregation_nodes']} aggregation nodes, {doc['routers']} routers")
    by_tiers: dict[str, dict[int, int]] = {}
    for b in doc["bundles"]:
        by_tiers.setdefault(b["tiers"], {}).setdefault(b["links"], 0)
        by_tiers[b["tiers"]][b["links"]] += 1
    for tiers_name, counts in by_tiers.items():
        shape = ", ".join(f"{n:,} of {links} link(s)" for links, n in sorted(counts.items(), reverse=True))
        print(f"  {tiers_name} bundles: {shape}")
    for pair, rates in doc["rates"].items():
        print(f"  {pair} links: " + ", ".join(f"{n:,} at {r or 'unknown rate'}" for r, n in rates.items()))
    findings = [Finding(f["kind"], f["message"], f.get("fix", ""), f.get("where", "")) for f in doc["findings"]]
    if findings:
        print(f"{len(findings)} finding(s):")
        _print_findings(findings, args.max_findings)
    return 0


def _discover_nvlink(args: argparse.Namespace) -> int:
    from gpucluster.fabric.asbuilt import nvlink

    doc = nvlink.discover(args.nvlink).as_dict()
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    print(f"{args.nvlink}: {doc['nodes']:,} nodes in {len(doc['cliques']):,} NVLink clique(s), "
          f"{len(doc['no_clique'])} without one")
    for clique, nodes in doc["cliques"].items():
        print(f"  {clique}: {len(nodes)} nodes ({nodes[0]} .. {nodes[-1]})")
    if doc["no_clique"]:
        print(f"  no clique: {', '.join(doc['no_clique'][:args.max_findings])}")
    return 0


def _verify_nvlink(args: argparse.Namespace, cluster) -> int:
    from gpucluster.fabric.asbuilt import nvlink

    if not cluster.plan.domains:
        raise UsageError(f"{args.spec}: no node group has rack-scale NVLink (a GPU with nvlink_domain), so there "
                         "are no NVLink domains to verify")
    findings = nvlink.verify(cluster.plan, nvlink.discover(args.nvlink))
    if args.json:
        json.dump({"ok": not findings, "spec": str(args.spec), "source": str(args.nvlink),
                   "domains": len(cluster.plan.domains), "findings": [f.as_dict() for f in findings]},
                  sys.stdout, indent=1)
        print()
        return 0 if not findings else 1
    if not findings:
        print(f"{cluster.name}: every one of {len(cluster.plan.domains)} NVLink domains is its planned rack")
        return 0
    print(f"{cluster.name}: the NVLink domains differ from the plan: {len(findings)} finding(s)")
    _print_findings(findings, args.max_findings)
    return 1


def _read_dump(path: str):
    """ibnetdiscover.read with a progress bar (shown only on a terminal, after 2 s: a large dump)."""
    import math
    import os

    from gpucluster.fabric.asbuilt import ibnetdiscover

    try:
        size = math.ceil(os.path.getsize(path) / (1 << 20))
    except OSError:
        size = None  # read() says why it cannot
    with progress(f"reading {Path(path).name}", total=size, unit="MB") as advance:
        return ibnetdiscover.read(path, advance)


def _site(args: argparse.Namespace, cluster):
    from gpucluster.fabric.asbuilt.names import SiteNames, load_hosts, switch_pattern

    site = SiteNames()
    if args.sites:
        site.hosts = load_hosts(args.sites, [h for g in cluster.spec.node_groups for h in g.hosts], str(args.spec))
    if args.switch_pattern:
        site.switch_pattern = switch_pattern(args.switch_pattern)
    return site


def cmd_verify(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.asbuilt.planned import PlanIndex
    from gpucluster.fabric.asbuilt.slurmview import compare_topology
    from gpucluster.fabric.asbuilt.verify import verify

    cluster = load_cluster(args.spec)
    if args.nvlink:
        return _verify_nvlink(args, cluster)
    site = _site(args, cluster)
    idx = PlanIndex.of(cluster.plan)
    if args.ibnetdiscover:
        if cluster.spec.fabric.type != "infiniband":
            raise UsageError(f"{args.spec}: fabric.type is {cluster.spec.fabric.type}; an ibnetdiscover dump is "
                             "InfiniBand: use --lldp for RoCE")
        fab = _read_dump(args.ibnetdiscover)
    else:
        from gpucluster.fabric.asbuilt import lldp

        src = Path(args.lldp)
        files = len(list(src.glob("*.json"))) if src.is_dir() else None
        with progress(f"reading {src.name}", total=files, unit="devices") as advance:
            fab = lldp.read(args.lldp, lldp.default_is_host(set(idx.host_group) | set(site.hosts)), advance)
    with progress("verify", total=sum(cluster.plan.links.values()), unit="links") as advance:
        result = verify(cluster.plan, fab, site, idx=idx, advance=advance)
    topo = compare_topology(cluster.plan, fab, result.match)
    if args.slurm_topology and topo["name"]:
        from gpucluster.render import write_outputs

        out = Path(args.slurm_topology)
        if out.is_dir():
            out = out / topo["name"]
        write_outputs({out.name: topo["text"]}, out.parent if str(out.parent) else Path("."))
        topo["written"] = str(out)
    topo_doc = {k: v for k, v in topo.items() if k != "text"}
    if args.json:
        json.dump({"ok": result.ok, "spec": str(args.spec), "source": fab.source, "summary": result.summary,
                   "findings": [f.as_dict() for f in result.findings], "slurm_topology": topo_doc},
                  sys.stdout, indent=1)
        print()
        return 0 if result.ok else 1
    s = result.summary
    how = ", ".join(f"{n:,} {what}" for what, n in s["matching"].items())
    print(f"{cluster.name}: {s['matched_links']:,} of {s['planned_links']:,} planned links found as planned; "
          f"{s['discovered_links']:,} links discovered ({fab.source})")
    print(f"  matched: {how or 'nothing'}")
    if s["inferred"]:
        print(f"  inferred by position (no name matched): {len(s['inferred_switches']):,} switch(es)"
              + (f", NIC names {s['inferred_nic_names']}" if s["inferred_nic_names"] else ""))
    _print_topology(topo, args.max_findings)
    if result.ok:
        print("the fabric matches the plan")
        return 0
    print(f"the fabric differs from the plan: {len(result.findings)} finding(s) "
          f"({', '.join(f'{n} {k}' for k, n in s['findings_by_kind'].items())})")
    _print_findings(result.findings, args.max_findings)
    return 1


def _print_topology(topo: dict, limit: int) -> None:
    if not topo["name"]:
        return
    written = f"; written to {topo['written']}" if topo.get("written") else \
        " (write it with --slurm-topology FILE)"
    if topo["same_as_plan"]:
        print(f"  Slurm {topo['name']} from the wires: the same as the plan's{written}")
        return
    print(f"  Slurm {topo['name']} from the wires differs from the plan's ({topo['diff_lines']} diff lines)"
          f"{written}:")
    for line in topo["diff"][: max(limit, 2) + 2]:
        print(f"    {line}")


def cmd_topofile(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.outputs import write_file
    from gpucluster.render.ibtopo import topofile

    cluster = load_cluster(args.spec)
    if cluster.spec.fabric.type != "infiniband":
        raise UsageError(f"{args.spec}: fabric.type is {cluster.spec.fabric.type}; ibdiagnet topology files are "
                         "for InfiniBand (for RoCE use `fabric verify --lldp`)")
    out = Path(args.output)
    if out.is_dir():
        raise UsageError(f"{out}: is a folder; give the topology file's path, e.g. -o {out / 'fabric.topo'}")
    size = write_file(out, lambda: topofile(cluster.plan))
    if args.json:
        print_json({"cluster": cluster.name, "written": str(out), "bytes": size})
        return 0
    print(f"wrote {out} ({size:,} bytes); check the fabric with: ibdiagnet -t {out}")
    return 0


def cmd_switch_config(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.render import write_outputs
    from gpucluster.render.switch import switch_configs

    cluster = load_cluster(args.spec)
    sizes = write_outputs(switch_configs(cluster.spec, cluster.plan), Path(args.output))
    roce = cluster.spec.fabric.roce
    if args.json:
        print_json({"cluster": cluster.name, "output": args.output, "files": sizes,
                    "roce": {"dscp": roce.dscp, "pfc_priority": roce.pfc_priority, "ecn": roce.ecn,
                             "cnp_dscp": roce.cnp_dscp, "cnp_priority": roce.cnp_priority, "mtu": roce.link_mtu}})
        return 0
    for name, size in sizes.items():
        print(f"  {args.output.rstrip('/')}/{name}  {size:,} bytes")
    print(f"RoCE QoS for {cluster.name}: DSCP {roce.dscp} -> priority {roce.pfc_priority} (PFC, ECN "
          f"{'on' if roce.ecn else 'off'}), CNP DSCP {roce.cnp_dscp} -> priority {roce.cnp_priority}, "
          f"MTU {roce.link_mtu}")
    return 0


def cmd_test_plan(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.asbuilt import fabrictest

    cluster = load_cluster(args.spec)
    tiers = fabrictest.TIERS if args.tier == "all-tiers" else (args.tier,)
    doc = fabrictest.summary(cluster.plan, args.transport, args.efficiency)
    doc["tiers"] = {t: v for t, v in doc["tiers"].items() if t in tiers}
    if args.json and args.summary:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    if args.json:  # streamed: the cases are written as they are made (Colossus 200k: 137,893 of them)
        fabrictest.write_json(doc, fabrictest.iter_cases(cluster.plan, tiers, args.transport, args.efficiency),
                              sys.stdout)
        print()
        return 0
    stand_in = " (staging stand-in for the transport)" if doc["stand_in"] else ""
    print(f"{cluster.name}: {doc['tool']}{stand_in}; thresholds = {doc['link_gbps']} Gb/s x lanes x "
          f"{doc['efficiency']} / oversubscription ({doc['efficiency_source']})")
    for tier, t in doc["tiers"].items():
        print(f"  {tier:5}  {t['cases']:>6,} case(s) in {t['rounds']} round(s), each >= {t['threshold']} {doc['unit']}"
              f" (oversubscription {t['oversubscription']:g})")
    print("run them as Slurm jobs with `gpucluster fabric test INVENTORY`")
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.fabric.asbuilt import fabrictest, slurmrun
    from gpucluster.inventory.reader import load_inventory

    inv = load_inventory(args.inventory)
    spec = args.spec or inv.vars.get("gpucluster_spec")
    if not spec:
        raise UsageError(f"{inv.path}: all.vars has no gpucluster_spec (the spec the inventory was written from); "
                         "write the inventory with `gpucluster inventory SPEC`, or give --spec SPEC")
    if not Path(spec).is_file():
        raise UsageError(f"{inv.path}: gpucluster_spec is {spec}, which is not a file here; give --spec SPEC")
    cluster = load_cluster(spec)
    tiers = fabrictest.TIERS if args.tier == "all-tiers" else (args.tier,)
    if args.efficiency is not None:
        fabrictest.threshold(cluster.plan, "leaf", fabrictest.TRANSPORTS["nccl"], args.efficiency)  # 0 < F <= 1
    settings = slurmrun.settings_for(cluster.plan, inv, seconds=args.seconds, time_limit_min=args.time_limit,
                                     immediate_s=args.immediate, partition=args.partition or "",
                                     srun_args=args.srun_args, parallel=args.parallel, mpi=args.mpi,
                                     **({"nccl_binary": args.nccl_binary} if args.nccl_binary else {}))

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    run = slurmrun.run_fabric_test(cluster.plan, inv, settings, tiers=tiers, wanted=args.transport,
                                   efficiency=args.efficiency, log=log)
    doc = _test_doc(run, cluster.plan, tiers, args.efficiency)
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0 if run.ok else 1
    _print_test(doc, args.slowest)
    return 0 if run.ok else 1


def _test_doc(run, plan, tiers, efficiency) -> dict:
    from gpucluster.fabric.asbuilt import fabrictest

    summary = fabrictest.summary(plan, run.transport, efficiency)
    v = run.verdict
    return {
        "ok": run.ok, "cluster": run.cluster, "transport": run.transport, "tool": summary["tool"],
        "stand_in": summary["stand_in"], "why": run.why, "unit": summary["unit"],
        "efficiency": summary["efficiency"], "efficiency_source": summary["efficiency_source"],
        "link_gbps": summary["link_gbps"], "rails": summary["rails"], "submit_host": run.submit,
        "tiers": {t: x for t, x in summary["tiers"].items() if t in tiers},
        "results": [{"tier": o.case.tier, "nodes": list(o.case.nodes), "rail": o.case.rail, "round": o.case.round,
                     "value": o.value, "threshold": o.case.threshold, "unit": o.case.unit, "slow": o.slow,
                     "job": o.job, "detail": o.detail} for o in v.outcomes],
        "not_measured": [{"tier": f.case.tier, "nodes": list(f.case.nodes), "rail": f.case.rail, "why": f.why,
                          "job": f.job} for f in run.failures],
        "suspects": [{"kind": s.kind, "name": s.name, "fix": s.fix, "evidence": list(s.evidence)}
                     for s in v.suspects],
        "jobs": run.jobs,
    }


def _print_test(doc: dict, limit: int) -> None:
    print(f"{doc['cluster']}: {doc['tool']}, {len(doc['jobs'])} Slurm job(s) from {doc['submit_host']}")
    print(f"  thresholds = {doc['link_gbps']} Gb/s x lanes x {doc['efficiency']} / oversubscription "
          f"({doc['efficiency_source']})")
    for tier, t in doc["tiers"].items():
        mine = [r for r in doc["results"] if r["tier"] == tier]
        slow = [r for r in mine if r["slow"]]
        missing = [r for r in doc["not_measured"] if r["tier"] == tier]
        values = [r["value"] for r in mine]
        span = f", {min(values):.3g}..{max(values):.3g} {doc['unit']}" if values else ""
        print(f"  {tier:5}  {len(mine) - len(slow)} of {len(mine) + len(missing)} passed (>= {t['threshold']} "
              f"{doc['unit']}{span})" + (f", {len(slow)} slow" if slow else "")
              + (f", {len(missing)} not measured" if missing else ""))
    slowest = sorted((r for r in doc["results"] if r["slow"]), key=lambda r: r["value"] / (r["threshold"] or 1))
    for r in slowest[:limit]:
        rail = f" rail {r['rail']}" if r["rail"] is not None else ""
        print(f"  slow: {r['tier']}{rail} {' - '.join(r['nodes']) if len(r['nodes']) <= 2 else 'whole cluster'}: "
              f"{r['value']:.3g} < {r['threshold']:g} {r['unit']} (job {r['job'] or '?'}; {r['detail']})")
    for r in doc["not_measured"][:limit]:
        rail = f" rail {r['rail']}" if r["rail"] is not None else ""
        nodes = " - ".join(r["nodes"]) if len(r["nodes"]) <= 2 else f"{len(r['nodes'])} nodes"
        print(f"  not measured: {r['tier']}{rail} {nodes}" + (f" (job {r['job']})" if r["job"] else "")
              + f": {r['why']}")
    for s in doc["suspects"]:
        print(f"suspect {s['kind']} {s['name']}: {s['fix']}")
        for e in s["evidence"]:
            print(f"    {e}")
    print("every result passed" if doc["ok"] else "the fabric test failed")


def _max_findings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-findings", type=int, default=20, metavar="N", help="findings shown per kind; all of them "
                   "are in --json (default 20)")
    deprecated_alias(p, "--limit", "--max-findings")


def register(sub) -> None:
    """`gpucluster fabric` and its subcommands, in the order its help lists them."""
    p = sub.add_parser("fabric", help="the fabric as built: discover it, verify it against the plan, "
                                      "ibdiagnet topology, RoCE switch QoS, bandwidth test plan",
                       description="The fabric as built against the fabric as planned: read what the fabric "
                       "reports (ibnetdiscover, lldpctl), compare it with the plan's cabling, and derive what the "
                       "switches and the bandwidth tests need from the same spec.", epilog=EXIT)
    fsub = p.add_subparsers(dest="fabric_command", required=True, metavar="SUBCOMMAND")
    _register_discover(fsub)
    _register_verify(fsub)
    _register_topofile(fsub)
    _register_switch_config(fsub)
    _register_test_plan(fsub)
    _register_test(fsub)


def _register_discover(fsub) -> None:
    """`fabric discover`: a dump (or nvidia-smi outputs) read with no spec."""
    d = fsub.add_parser("discover", help="summarise an ibnetdiscover dump without a spec: tiers, hosts, bundles",
                        description="Read what the fabric reports, with no spec: from an ibnetdiscover dump, the "
                        "switch tiers, the hosts and their ports, the bundles of parallel links and what looks "
                        "wrong; from nvidia-smi outputs, the NVLink domains the GPUs formed.",
                        epilog=_epilog("discover"), formatter_class=_RAW)
    dsrc = d.add_mutually_exclusive_group(required=True)
    dsrc.add_argument("--ibnetdiscover", metavar="FILE",
                      help="output of `ibnetdiscover > FILE` (the full topology, not -l/-p)")
    dsrc.add_argument("--nvlink", metavar="DIR", help="NVLink domains: a folder of one `nvidia-smi -q` (or -q -x) "
                      "output per node, named after the node; groups nodes by ClusterUUID and CliqueId")
    json_flag(d, "machine-readable: switches, tiers, hosts, host_ports, unidentified, bundles, degraded_bundles, "
              "findings (docs/fabric.md)")
    no_color_flag(d)
    _max_findings(d)
    d.set_defaults(func=cmd_discover)


def _register_verify(fsub) -> None:
    """`fabric verify`: the fabric as built against the spec's plan, from one of three sources."""
    v = fsub.add_parser("verify", help="compare the discovered fabric with the plan's cabling; exit 1 when it "
                        "differs", description="Compare the fabric as built (ibnetdiscover, lldpctl or nvidia-smi "
                        "outputs) with the plan's cabling and NVLink domains: one finding per fault (a missing, "
                        "extra or swapped cable, a down-rated link, a tray in the wrong domain), each naming the "
                        "ports and the fix. Exit 1 when they differ.", epilog=_epilog("verify"), formatter_class=_RAW)
    v.add_argument("spec", help="the cluster spec (YAML) whose plan is the reference")
    src = v.add_mutually_exclusive_group(required=True)
    src.add_argument("--ibnetdiscover", metavar="FILE", help="InfiniBand: output of `ibnetdiscover > FILE`")
    src.add_argument("--nvlink", metavar="DIR", help="NVLink domains (NVL72): a folder of one `nvidia-smi -q` output "
                     "per node; reports a node outside its planned rack's domain, and a domain short of trays")
    src.add_argument("--lldp", metavar="DIR_OR_FILE", help="RoCE: a folder of <device>.json files, each the output "
                     "of `lldpctl -f json` on that host or switch, or one JSON object {device: that output}")
    v.add_argument("--sites", metavar="MAP.csv", help="site names of the plan's hosts: CSV with header "
                   "hostname,address[,port][,user] (the inventory's form), the second column the site's name")
    v.add_argument("--switch-pattern", metavar="P", help="how the site names switches: a format with {name} "
                   "('MF0;{name}:MQM9700/U1') or a regex with (?P<name>...) capturing the plan's name")
    v.add_argument("--slurm-topology", metavar="FILE", help="write the topology the wires describe as Slurm's "
                   "topology.conf (topology.yaml from 25.05), rendered as `gpucluster render` renders the plan's, "
                   "to compare the two (a folder: the file's own name in it)")
    json_flag(v, "machine-readable: ok, summary, findings, slurm_topology (docs/fabric.md)")
    no_color_flag(v)
    _max_findings(v)
    deprecated_alias(v, "--hosts", "--sites")
    v.set_defaults(func=cmd_verify)


def _register_topofile(fsub) -> None:
    """`fabric topofile`: the plan's InfiniBand cabling as an ibdiagnet topology file."""
    t = fsub.add_parser("topofile", help="write the plan as an ibdiagnet topology file (ibdiagnet -t FILE)",
                        description="Write the plan's InfiniBand cabling as an ibdiagnet topology file, so "
                        "`ibdiagnet -t FILE` checks the fabric against it on the cluster itself.",
                        epilog=_epilog("topofile"), formatter_class=_RAW)
    t.add_argument("spec", help="the cluster spec (YAML); its fabric must be InfiniBand")
    t.add_argument("-o", "--output", required=True, metavar="FILE", help="the topology file to write (replaced "
                   "atomically)")
    json_flag(t, "what was written as JSON: cluster, written, bytes")
    no_color_flag(t)
    t.set_defaults(func=cmd_topofile)


def _register_switch_config(fsub) -> None:
    """`fabric switch-config`: the switches' RoCE lossless settings, one file per tier."""
    s = fsub.add_parser("switch-config", help="render RoCE lossless QoS for the switches (SONiC config_db "
                        "fragments or Arista EOS, by the switch model's vendor)",
                        description="Render the switches' side of the spec's RoCE lossless settings (trust DSCP, "
                        "PFC on the RoCE priority, ECN, the CNP priority) in the switch vendor's form, from the "
                        "same fabric.roce values the hosts and NCCL get.", epilog=_epilog("switch-config"),
                        formatter_class=_RAW)
    s.add_argument("spec", help="the cluster spec (YAML); its fabric must be RoCE")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for one file per switch tier "
                   "(files are replaced atomically)")
    json_flag(s, "what was written as JSON: cluster, output, files (name: bytes), roce (the settings used)")
    no_color_flag(s)
    s.set_defaults(func=cmd_switch_config)


def _tier_argument(p: argparse.ArgumentParser) -> None:
    """--tier, the same for the plan of the fabric test and for the test itself."""
    p.add_argument("--tier", default="all-tiers", choices=["leaf", "spine", "core", "rail", "all", "all-tiers"],
                   help="leaf: pairs under one leaf; spine/core: pairs across them; rail: each rail on its own "
                   "(rail-optimised fabrics); all: the whole cluster at once; all-tiers: every one (default)")


def _register_test_plan(fsub) -> None:
    """`fabric test-plan`: the bandwidth test's pairs and thresholds, from the plan alone."""
    tp = fsub.add_parser("test-plan", help="the bandwidth test `fabric test` runs: pairs per tier and the "
                         "threshold each must reach (no jobs are run)",
                         description="Print the bandwidth test `fabric test` would run, from the plan alone: the "
                         "node pairs per tier and the figure each must reach (line rate x efficiency, divided by "
                         "the oversubscription the pair crosses). Nothing is submitted.",
                         epilog=_epilog("test-plan"), formatter_class=_RAW)
    tp.add_argument("spec", help="the cluster spec (YAML)")
    _tier_argument(tp)
    tp.add_argument("--transport", default="nccl", choices=["nccl", "perftest", "iperf3"],
                    help="nccl: all_reduce_perf busbw (GB/s); perftest: ib_write_bw (Gb/s); iperf3: the staging "
                    "stand-in over the container network (Gb/s)")
    tp.add_argument("--efficiency", type=float, metavar="F", help="fraction of the line rate a healthy pair reaches "
                    "(default per transport: nccl 0.85, below the published 350-390 GB/s all_reduce on 8 x 400G H100)")
    json_flag(tp, "machine-readable, with every case (streamed: Colossus 200k writes 21.6 MB)")
    tp.add_argument("--summary", action="store_true", help="with --json: the thresholds and case counts per tier "
                    "alone, without the list of cases")
    no_color_flag(tp)
    tp.set_defaults(func=cmd_test_plan)


def _register_test(fsub) -> None:
    """`fabric test`: the bandwidth test as Slurm jobs, with the settings of those jobs."""
    ft = fsub.add_parser("test", help="measure the fabric through Slurm: pairs under a leaf, across the spine and "
                         "core, each rail, the whole cluster; thresholds from the plan; slow results localised",
                         description="Bandwidth tests as Slurm jobs, submitted from the inventory's login (else "
                         "controller) host: each case is one job pinned to its nodes with --nodelist. The transport "
                         "follows from what the nodes have: all_reduce_perf (GPUs and nccl-tests), ib_write_bw "
                         "(HCAs and perftest), or iperf3 over the container network on staged nodes (the staging "
                         "stand-in for the transport). Each result is judged against link speed x lanes x "
                         "efficiency / the oversubscription it crosses; a slow node or uplink is named with the "
                         "results that point at it (docs/fabric.md).", epilog=_epilog("test"), formatter_class=_RAW)
    ft.add_argument("inventory", help="inventory folder (hosts.yml) or file, as `gpucluster inventory` writes it")
    _tier_argument(ft)
    ft.add_argument("--via-slurm", action="store_true", help="run the cases as Slurm jobs: the default and the only "
                    "engine (accepted as `validate --via-slurm` takes it)")
    ft.add_argument("--transport", default="auto", choices=["auto", "nccl", "perftest", "iperf3"],
                    help="auto (default): from what the nodes have; nccl: all_reduce_perf busbw (GB/s); perftest: "
                    "ib_write_bw (Gb/s); iperf3: over the hosts' IP network (the staging stand-in)")
    ft.add_argument("--efficiency", type=float, metavar="F", help="fraction of the line rate a healthy pair reaches "
                    "(default per transport, docs/fabric.md)")
    ft.add_argument("--spec", help="the cluster spec (default: the inventory's gpucluster_spec)")
    ft.add_argument("--seconds", type=int, default=3, metavar="S", help="iperf3/ib_write_bw duration per case "
                    "(default 3)")
    ft.add_argument("--time-limit", type=int, default=10, metavar="MIN", help="Slurm time limit of each job in "
                    "minutes (default 10)")
    ft.add_argument("--immediate", type=int, default=120, metavar="S", help="give a job up when its nodes are not "
                    "free within S seconds (srun --immediate; default 120)")
    ft.add_argument("--partition", help="partition for every job (default: the spec's partition holding the nodes)")
    ft.add_argument("--srun-args", default="", metavar="ARGS", help="extra srun options, e.g. '--reservation=maint'")
    ft.add_argument("--parallel", type=int, default=64, metavar="N", help="jobs of one round in flight at once "
                    "(default 64)")
    ft.add_argument("--mpi", default="pmix", help="srun --mpi for all_reduce_perf (default pmix)")
    ft.add_argument("--nccl-binary", metavar="FILE", help="all_reduce_perf (default: where the nccl role builds it)")
    json_flag(ft, "machine-readable: ok, transport, results, not_measured, suspects, jobs (progress goes to stderr)")
    no_color_flag(ft)
    ft.add_argument("--slowest", type=int, default=20, metavar="N", help="slow results listed, the slowest first, "
                    "and as many not measured (default 20)")
    deprecated_alias(ft, "--limit", "--slowest")
    ft.set_defaults(func=cmd_test)
