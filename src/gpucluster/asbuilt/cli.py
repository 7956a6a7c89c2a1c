"""`gpucluster fabric ...`: the fabric as built against the fabric as planned (argument parsing and
printing only; the work is in the asbuilt modules)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpucluster.errors import UsageError

EPILOG = """examples:
  gpucluster fabric discover --ibnetdiscover dump.txt
  gpucluster fabric discover --ibnetdiscover dump.txt --json > discovered.json
  gpucluster fabric verify examples/meta-24k-ib.yaml --ibnetdiscover dump.txt
  gpucluster fabric verify examples/meta-24k-ib.yaml --ibnetdiscover dump.txt \\
      --hosts site-names.csv --switch-pattern 'MF0;{name}:MQM9700/U1' --json
  gpucluster fabric verify examples/meta-24k-roce.yaml --lldp lldp/
  gpucluster fabric topofile examples/meta-24k-ib.yaml -o fabric.topo     # then: ibdiagnet -t fabric.topo
  gpucluster fabric switch-config examples/meta-24k-roce.yaml -o switch-qos/
  gpucluster fabric test-plan examples/meta-24k-ib.yaml --tier spine --json
exit status: 0 the fabric matches the plan (verify) / done; 1 it differs; 2 bad input (file:line and a fix)."""


def _print_findings(findings, limit: int) -> None:
    from gpucluster.asbuilt.findings import by_kind

    counts = by_kind(findings)
    shown: dict[str, int] = {}
    for f in findings:
        shown[f.kind] = shown.get(f.kind, 0) + 1
        if shown[f.kind] <= limit:
            print(f"  {f.render()}")
        elif shown[f.kind] == limit + 1:
            print(f"  ... {counts[f.kind] - limit} more {f.kind} (all of them: --json)")


def cmd_discover(args: argparse.Namespace) -> int:
    from gpucluster.asbuilt import ibnetdiscover
    from gpucluster.asbuilt.discover import discover
    from gpucluster.asbuilt.findings import Finding

    doc = discover(ibnetdiscover.read(args.ibnetdiscover))
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
        _print_findings(findings, args.limit)
    return 0


def _site(args: argparse.Namespace):
    from gpucluster.asbuilt.names import SiteNames, load_hosts, switch_pattern

    site = SiteNames()
    if args.hosts:
        site.hosts = load_hosts(args.hosts)
    if args.switch_pattern:
        site.switch_pattern = switch_pattern(args.switch_pattern)
    return site


def cmd_verify(args: argparse.Namespace) -> int:
    from gpucluster.asbuilt.planned import PlanIndex
    from gpucluster.asbuilt.verify import verify
    from gpucluster.cluster import load_cluster

    cluster = load_cluster(args.spec)
    site = _site(args)
    idx = PlanIndex.of(cluster.plan)
    if args.ibnetdiscover:
        if cluster.spec.fabric.type != "infiniband":
            raise UsageError(f"{args.spec}: fabric.type is {cluster.spec.fabric.type}; an ibnetdiscover dump is "
                             "InfiniBand: use --lldp for RoCE")
        from gpucluster.asbuilt import ibnetdiscover

        fab = ibnetdiscover.read(args.ibnetdiscover)
    else:
        from gpucluster.asbuilt import lldp

        fab = lldp.read(args.lldp, lldp.default_is_host(set(idx.host_group) | set(site.hosts)))
    result = verify(cluster.plan, fab, site, idx=idx)
    if args.json:
        json.dump({"ok": result.ok, "spec": str(args.spec), "source": fab.source, "summary": result.summary,
                   "findings": [f.as_dict() for f in result.findings]}, sys.stdout, indent=1)
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
    if result.ok:
        print("the fabric matches the plan")
        return 0
    print(f"the fabric differs from the plan: {len(result.findings)} finding(s) "
          f"({', '.join(f'{n} {k}' for k, n in s['findings_by_kind'].items())})")
    _print_findings(result.findings, args.limit)
    return 1


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
    print(f"wrote {out} ({size:,} bytes); check the fabric with: ibdiagnet -t {out}")
    return 0


def cmd_switch_config(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.render import write_outputs
    from gpucluster.render.switch import switch_configs

    cluster = load_cluster(args.spec)
    sizes = write_outputs(switch_configs(cluster.spec, cluster.plan), Path(args.output))
    for name, size in sizes.items():
        print(f"  {args.output.rstrip('/')}/{name}  {size:,} bytes")
    roce = cluster.spec.fabric.roce
    print(f"RoCE QoS for {cluster.name}: DSCP {roce.dscp} -> priority {roce.pfc_priority} (PFC, ECN "
          f"{'on' if roce.ecn else 'off'}), CNP DSCP {roce.cnp_dscp} -> priority {roce.cnp_priority}, "
          f"MTU {roce.link_mtu}")
    return 0


def cmd_test_plan(args: argparse.Namespace) -> int:
    from gpucluster.asbuilt import fabrictest
    from gpucluster.cluster import load_cluster

    cluster = load_cluster(args.spec)
    tiers = fabrictest.TIERS if args.tier == "all-tiers" else (args.tier,)
    doc = fabrictest.summary(cluster.plan, args.transport, args.efficiency)
    doc["tiers"] = {t: v for t, v in doc["tiers"].items() if t in tiers}
    if args.json:
        doc["cases"] = [{"tier": c.tier, "nodes": list(c.nodes), "rail": c.rail, "round": c.round,
                         "threshold": c.threshold, "unit": c.unit}
                        for c in fabrictest.cases(cluster.plan, tiers, args.transport, args.efficiency)]
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    stand_in = " (staging stand-in for the transport)" if doc["stand_in"] else ""
    print(f"{cluster.name}: {doc['tool']}{stand_in}; thresholds = {doc['link_gbps']} Gb/s x lanes x "
          f"{doc['efficiency']} / oversubscription ({doc['efficiency_source']})")
    for tier, t in doc["tiers"].items():
        print(f"  {tier:5}  {t['cases']:>6,} case(s) in {t['rounds']} round(s), each >= {t['threshold']} {doc['unit']}"
              f" (oversubscription {t['oversubscription']:g})")
    print("running them through Slurm is `gpucluster fabric test` (phase 2)")
    return 0


def register(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("fabric", help="the fabric as built: discover it, verify it against the plan, "
                                      "ibdiagnet topology, RoCE switch QoS, bandwidth test plan",
                       description="The fabric as built against the fabric as planned: read what the fabric "
                       "reports (ibnetdiscover, lldpctl), compare it with the plan's cabling, and derive what the "
                       "switches and the bandwidth tests need from the same spec.", epilog=EPILOG, formatter_class=fmt)
    fsub = p.add_subparsers(dest="fabric_command", required=True, metavar="SUBCOMMAND")

    d = fsub.add_parser("discover", help="summarise an ibnetdiscover dump without a spec: tiers, hosts, bundles",
                        epilog=EPILOG, formatter_class=fmt)
    d.add_argument("--ibnetdiscover", required=True, metavar="FILE",
                   help="output of `ibnetdiscover > FILE` (the full topology, not -l/-p)")
    d.add_argument("--json", action="store_true", help="machine-readable: switches, tiers, hosts, host_ports, "
                   "unidentified, bundles, degraded_bundles, findings (docs/fabric.md)")
    d.add_argument("--limit", type=int, default=20, metavar="N", help="findings shown per kind (default 20)")
    d.set_defaults(func=cmd_discover)

    v = fsub.add_parser("verify", help="compare the discovered fabric with the plan's cabling; exit 1 when it "
                        "differs", epilog=EPILOG, formatter_class=fmt)
    v.add_argument("spec", help="the cluster spec (YAML) whose plan is the reference")
    src = v.add_mutually_exclusive_group(required=True)
    src.add_argument("--ibnetdiscover", metavar="FILE", help="InfiniBand: output of `ibnetdiscover > FILE`")
    src.add_argument("--lldp", metavar="DIR_OR_FILE", help="RoCE: a folder of <device>.json files, each the output "
                     "of `lldpctl -f json` on that host or switch, or one JSON object {device: that output}")
    v.add_argument("--hosts", metavar="MAP.csv", help="site names of the plan's hosts: CSV with header "
                   "hostname,address[,port][,user] (the inventory's form), the second column the site's name")
    v.add_argument("--switch-pattern", metavar="P", help="how the site names switches: a format with {name} "
                   "('MF0;{name}:MQM9700/U1') or a regex with (?P<name>...) capturing the plan's name")
    v.add_argument("--json", action="store_true", help="machine-readable: ok, summary, findings (docs/fabric.md)")
    v.add_argument("--limit", type=int, default=20, metavar="N", help="findings shown per kind (default 20)")
    v.set_defaults(func=cmd_verify)

    t = fsub.add_parser("topofile", help="write the plan as an ibdiagnet topology file (ibdiagnet -t FILE)",
                        epilog=EPILOG, formatter_class=fmt)
    t.add_argument("spec", help="the cluster spec (YAML); its fabric must be InfiniBand")
    t.add_argument("-o", "--output", required=True, metavar="FILE", help="the topology file to write (replaced "
                   "atomically)")
    t.set_defaults(func=cmd_topofile)

    s = fsub.add_parser("switch-config", help="render RoCE lossless QoS for the switches (SONiC config_db "
                        "fragments or Arista EOS, by the switch model's vendor)", epilog=EPILOG, formatter_class=fmt)
    s.add_argument("spec", help="the cluster spec (YAML); its fabric must be RoCE")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for one file per switch tier "
                   "(files are replaced atomically)")
    s.set_defaults(func=cmd_switch_config)

    tp = fsub.add_parser("test-plan", help="the bandwidth test `fabric test` runs: pairs per tier and the "
                         "threshold each must reach (no jobs are run)", epilog=EPILOG, formatter_class=fmt)
    tp.add_argument("spec", help="the cluster spec (YAML)")
    tp.add_argument("--tier", default="all-tiers", choices=["leaf", "spine", "core", "rail", "all", "all-tiers"],
                    help="leaf: pairs under one leaf; spine/core: pairs across them; rail: each rail on its own "
                    "(rail-optimised fabrics); all: the whole cluster at once; all-tiers: every one (default)")
    tp.add_argument("--transport", default="nccl", choices=["nccl", "perftest", "iperf3"],
                    help="nccl: all_reduce_perf busbw (GB/s); perftest: ib_write_bw (Gb/s); iperf3: the staging "
                    "stand-in over the container network (Gb/s)")
    tp.add_argument("--efficiency", type=float, metavar="F", help="fraction of the line rate a healthy pair reaches "
                    "(default per transport: nccl 0.925 from ~370 GB/s all_reduce on 8 x 400G H100)")
    tp.add_argument("--json", action="store_true", help="machine-readable, with every case")
    tp.set_defaults(func=cmd_test_plan)
