"""`gpucluster health`: render, install and read the node health checks (docs/health.md).

  gpucluster health render SPEC -o DIR      what the slurm_health role installs, and the slurm.conf lines
  gpucluster health install INVENTORY       playbooks/health.yml through ansible-runner (as configure does)
  gpucluster health status INVENTORY        drained nodes by reason, since when, each node's last checks, and
                                            each group's circuit breaker
  gpucluster health reset-breaker INVENTORY close a group's open circuit breaker (and start its window over)
  gpucluster health ticket INVENTORY NODE   a repair ticket for one node: where it is, what failed, its cables
  gpucluster health tickets INVENTORY -o DIR a ticket for each service-required node that has none in DIR yet
  gpucluster health accept INVENTORY NODE   a repaired node back to production through its acceptance checks
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gpucluster.commands._flags import json_flag, no_color_flag, print_json, report_flags


def cmd_render(args: argparse.Namespace) -> int:
    from gpucluster.cluster import load_cluster
    from gpucluster.render import write_outputs
    from gpucluster.render.health.rolefiles import review_files

    cluster = load_cluster(args.spec)
    sizes = write_outputs(review_files(cluster), Path(args.output))
    lines = (Path(args.output) / "slurm.conf.health").read_text().splitlines()
    if args.json:
        print_json({"cluster": cluster.name, "output": args.output, "files": sizes, "slurm_conf": lines})
        return 0
    for name, size in sizes.items():
        print(f"  {args.output.rstrip('/')}/{name}  {size:,} bytes")
    print(f"rendered {len(sizes)} health files for {cluster.name}; slurm.conf needs:")
    for line in lines:
        print(f"  {line}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from gpucluster.configure.playbook import configure, summary

    result = configure(args.inventory, playbook="health.yml", limit=args.limit, verbose=args.verbose,
                       log=lambda text: print(text, file=sys.stderr if args.json else sys.stdout, flush=True))
    if args.json:
        print_json({"ok": result.ok, "failed_hosts": result.failed_hosts, **vars(result)})
    else:
        print(summary(result), flush=True)
    return 0 if result.ok else 1


def cmd_status(args: argparse.Namespace) -> int:
    from gpucluster.health import remote, status

    rows, breakers = remote.fleet_report(args.inventory, args.limit)
    if args.json:
        print_json(status.report_json(rows, breakers))
    else:
        sys.stdout.write(status.format_status(rows) + status.format_breakers(breakers))
    return 0


def cmd_reset_breaker(args: argparse.Namespace) -> int:
    from gpucluster.health import remote

    deleted = remote.reset_breaker(args.inventory, args.group)
    if args.json:
        print_json({"group": args.group, "deleted": deleted})
    elif deleted:
        print(f"deleted {len(deleted)} reservations: {', '.join(deleted)}; the breaker of "
              f"{args.group or 'every group'} is closed and its window starts over")
    else:
        print(f"nothing to reset: no breaker reservation for {args.group or 'any group'}")
    return 0


def cmd_ticket(args: argparse.Namespace) -> int:
    from gpucluster.health import remote, ticket
    from gpucluster.outputs import write_file

    url = ticket.check_webhook(args.webhook) if args.webhook is not None else None  # refused before any work
    plan, evidence = remote.ticket_inputs(args.inventory, args.node)
    doc = ticket.build(plan, evidence)
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n" if args.format == "json" else ticket.markdown(doc)
    say = sys.stderr if args.json else sys.stdout
    if args.output:
        # 0644: the ticket goes to people (technicians, a ticket system); it holds names, places and Slurm's reasons,
        # which every cluster user can read already, and no secret.
        write_file(args.output, text, mode=0o644)
        print(f"wrote the repair ticket of {args.node} to {args.output}", file=say)
    elif not args.json:
        sys.stdout.write(text)
    posted = remote.post_ticket(url, doc) if url else None  # after the file: a failed POST loses no ticket
    if args.json:
        print_json({"node": args.node, "output": args.output, "format": args.format, "webhook": args.webhook,
                    "posted": posted, "ticket": doc})
    elif posted:
        print(f"posted the repair ticket of {args.node} to the webhook (HTTP {posted})", file=sys.stderr)
    return 0


def cmd_tickets(args: argparse.Namespace) -> int:
    from gpucluster.health import remote, ticket
    from gpucluster.outputs import write_file

    url = ticket.check_webhook(args.webhook) if args.webhook is not None else None
    folder = Path(args.output)
    written, kept, posted = [], [], []
    for node, since in remote.service_required(args.inventory):
        name = f"{node}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(since))}"
        if (folder / f"{name}.json").exists():  # this stay in service-required has its ticket
            kept.append(node)
            continue
        plan, evidence = remote.ticket_inputs(args.inventory, node)
        doc = ticket.build(plan, evidence)
        write_file(str(folder / f"{name}.md"), ticket.markdown(doc), mode=0o644)
        write_file(str(folder / f"{name}.json"), json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o644)
        written.append(f"{name}.json")
        if url:
            posted.append(remote.post_ticket(url, doc))
    if args.json:
        print_json({"output": args.output, "written": written, "already": kept, "posted": posted})
    else:
        for name in written:
            print(f"  wrote {folder / name} (and .md)")
        print(f"{len(written)} new repair tickets in {folder}; {len(kept)} service-required nodes had theirs already")
    return 0


def cmd_accept(args: argparse.Namespace) -> int:
    from gpucluster.health import remote
    from gpucluster.node.decide import clean

    out = remote.accept_node(args.inventory, args.node, clean(args.why)[:200])
    if args.json:
        print_json(vars(out))
    else:
        for step in out.steps:
            print(f"  {step}")
        word = "back in production" if out.passed else "not accepted, left drained"
        print(f"{out.node}: {word} after {out.seconds:g} s: {out.why}")
    return 0 if out.passed else 1


def register(sub) -> None:
    p = sub.add_parser("health", help="node health checks: render, install, status, reset-breaker, ticket, "
                       "tickets, accept (docs/health.md)",
                       description="Node health checks that slurmd runs as its HealthCheckProgram: GPUs, fabric, "
                                   "mounts, munge and disk, each with a budget. A failing check drains its node with "
                                   "a gpc: reason; the node resumes by itself once the check passes, and a node "
                                   "drained by hand stays drained (docs/health.md).")
    hs = p.add_subparsers(dest="health_command", required=True, metavar="ACTION")
    r = hs.add_parser("render", help="write what the slurm_health role installs, and print the slurm.conf lines",
                      description="Write the health runner, its per-group config and its systemd units into a "
                                  "folder, as the slurm_health role installs them, and print the slurm.conf lines "
                                  "that make slurmd run it.",
                      epilog="example:\n  gpucluster health render examples/staging.yaml -o out/health",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("spec", help="the cluster spec whose health: section and node groups set the checks")
    r.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder (files are replaced "
                   "atomically)")
    report_flags(r, "what was written as JSON: cluster, output, files (name: bytes), slurm_conf (the lines)")
    r.set_defaults(func=cmd_render)
    i = hs.add_parser("install", help="install the checks on the cluster (playbooks/health.yml)",
                      description="Install the health checks on the inventory's compute nodes with "
                                  "playbooks/health.yml (the slurm_health role), without a whole converge.",
                      epilog="example:\n  gpucluster health install inventories/prod --limit 'gpu[001-064]'",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("inventory", help="inventory folder (e.g. inventories/staging) or its hosts.yml")
    i.add_argument("--limit", metavar="PATTERN", help="only these hosts or groups (an Ansible pattern)")
    i.add_argument("-v", "--verbose", action="store_true", help="also print Ansible's own output")
    report_flags(i, "the run's result as JSON, as configure --json prints it (progress lines go to stderr)")
    i.set_defaults(func=cmd_install)
    s = hs.add_parser("status", help="drained nodes by reason and the nodes' last check results",
                      description="Ask the controller which nodes are drained and why, and each node for its last "
                                  "check results (a check that could not run shows NOT RUN).",
                      epilog="example:\n  gpucluster health status inventories/prod --json",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("inventory", help="inventory folder (e.g. inventories/staging) or its hosts.yml")
    s.add_argument("--limit", metavar="PATTERN", help="only these compute nodes (an Ansible pattern)")
    json_flag(s, "as JSON: nodes (one record per node) and breakers (one per compute group)")
    no_color_flag(s)
    s.set_defaults(func=cmd_status)
    b = hs.add_parser("reset-breaker", help="close an open circuit breaker: automatic drains go on",
                      description="Delete the circuit breaker's latch and its window's drain tokens (Slurm "
                                  "reservations gpc_breaker_* and gpc_drain_*) with scontrol on the first controller, "
                                  "so the health checks drain nodes again; see health status for why it opened.",
                      epilog="example:\n  gpucluster health reset-breaker inventories/prod --group h100",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("inventory", help="inventory folder (e.g. inventories/staging) or its hosts.yml")
    b.add_argument("--group", metavar="GROUP", help="only this compute node group's breaker (default: every group)")
    json_flag(b, "the group and the reservations deleted, as JSON")
    no_color_flag(b)
    b.set_defaults(func=cmd_reset_breaker)
    t = hs.add_parser("ticket", help="a repair ticket for one node: where it is, what failed, which cables to check",
                      description="Write a repair ticket for one node: its rack, slot, serial and cables (both ends) "
                                  "from the plan of the spec the inventory names, with Slurm's state and reason and "
                                  "the node's last health checks. Markdown for a technician, or JSON; optionally "
                                  "POSTed as JSON to a webhook (docs/health.md, \"Repair ticket\").",
                      epilog="example:\n  gpucluster health ticket inventories/prod gpu0042 -o gpu0042.md\n"
                             "  gpucluster health ticket inventories/prod gpu0042 --format json "
                             "--webhook https://tickets.example.org/hooks/gpucluster",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("inventory", help="inventory folder (e.g. inventories/staging) or its hosts.yml")
    t.add_argument("node", help="the node's hostname, as the spec plans it (e.g. gpu0042)")
    t.add_argument("-o", "--output", metavar="FILE", help="write the ticket to FILE (replaced atomically, mode 0644) "
                   "instead of printing it")
    t.add_argument("--format", choices=("markdown", "json"), default="markdown",
                   help="markdown (a technician's page, the default) or json (stable keys)")
    t.add_argument("--webhook", metavar="URL", help="also POST the ticket as JSON to this http(s) URL; a failed "
                   "POST exits 1 after the file is written")
    report_flags(t, "node, output, format, webhook, posted (the HTTP status) and ticket (the ticket's JSON) as one "
                    "JSON document; without --json and -o the ticket itself is printed")
    t.set_defaults(func=cmd_ticket)
    _register_lifecycle(hs)


def _register_lifecycle(hs) -> None:
    """`health tickets` and `health accept`: the service-required end of the node lifecycle."""
    ts = hs.add_parser("tickets", help="a repair ticket for each service-required node that has none yet",
                       description="Write a repair ticket (Markdown and JSON, as `health ticket` writes one) for each "
                                   "node in service-required whose current stay there has no ticket in DIR yet; "
                                   "run it from a timer, or after `health status` shows one. Optionally POST each "
                                   "new ticket to a webhook.",
                       epilog="example:\n  gpucluster health tickets inventories/prod -o /srv/tickets",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ts.add_argument("inventory", help="inventory folder (e.g. inventories/staging) or its hosts.yml")
    ts.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder of tickets: <node>-<since>.md "
                    "and .json, mode 0644 (made if missing)")
    ts.add_argument("--webhook", metavar="URL", help="also POST each new ticket as JSON to this http(s) URL")
    report_flags(ts, "output, written, already (nodes whose ticket exists) and posted as one JSON document")
    ts.set_defaults(func=cmd_tickets)
    a = hs.add_parser("accept", help="a repaired node back to production, through its acceptance checks",
                      description="Put a repaired node (service-required, or drained by a gpucluster check) through "
                                  "acceptance: a maintenance reservation of its own, resumed into it, a health run "
                                  "and its group's single-node active checks (DCGM diag, NCCL all_reduce) as jobs in "
                                  "the reservation; production when every check passed, else left drained "
                                  "(docs/health.md, \"Node lifecycle\"). Exit 1 when not accepted.",
                      epilog="example:\n  gpucluster health accept inventories/prod gpu0042 --why 'GPU 3 replaced, "
                             "RMA 4711'", formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("inventory", help="inventory folder (e.g. inventories/staging) or its hosts.yml")
    a.add_argument("node", help="the node's hostname, as the spec plans it (e.g. gpu0042)")
    a.add_argument("--why", required=True, metavar="TEXT", help="what was repaired, for the node's lifecycle record")
    report_flags(a, "node, passed, why, checks, steps and seconds as one JSON document")
    a.set_defaults(func=cmd_accept)
