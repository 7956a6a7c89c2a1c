"""`gpucluster validate INVENTORY`: the testinfra suite on every node, with one readable report.

Exit status: 0 when every check passed (skips and reported differences allowed), 1 when a check
failed, 2 for a usage problem, 3 when the suite itself could not run (pytest's own error; log shown).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpucluster.commands._flags import print_json, report_flags
from gpucluster.errors import UsageError
from gpucluster.words import plain

EXAMPLES = """examples:
  gpucluster validate inventories/staging
  gpucluster validate inventories/prod --limit slurm_compute -n 32 --html out/v.html --via-slurm
"""


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of workers (or 'auto')") from None
    if n < 1:
        raise argparse.ArgumentTypeError("-n must be at least 1")
    return n


def cmd_validate(args: argparse.Namespace) -> int:
    from gpucluster.inventory.reader import load_inventory
    from gpucluster.validate import expect, report
    from gpucluster.validate import suite as runner
    from gpucluster.validate.thresholds import load_thresholds

    t0 = time.perf_counter()
    inv = load_inventory(args.inventory)
    opts = expect.Options(limit=args.limit, thresholds=load_thresholds(args.thresholds),
                          nccl_bytes=args.nccl_bytes, nccl_binary=args.nccl_binary,
                          run_id=time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}",
                          probes=args.probes)
    doc = expect.build(inv, opts, state_dir=args.state_dir)
    hosts = doc["selected"]
    if not hosts:
        raise UsageError(f"{inv.path}: --limit {args.limit!r} selects no host")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gpucluster-validate-"))
    workdir.mkdir(parents=True, exist_ok=True)
    expect_path = expect.write(doc, workdir / "expectations.json")
    workers = runner.default_workers(len(hosts)) if args.workers == "auto" else min(args.workers, len(hosts))
    extra = (["-k", args.keyword] if args.keyword else []) + [f"--gpc-ssh={args.ssh}"]

    rep = report.Report(title=f"gpucluster validate {doc['cluster']}")
    junits: list[tuple[Path, str]] = []
    if args.via_slurm:
        from gpucluster.validate.viaslurm import run_via_slurm

        outcome = run_via_slurm(inv, doc, expect_path, workdir, workers=workers, extra=extra,
                                time_limit=args.slurm_time, sbatch_args=args.sbatch_args, stream=args.verbose,
                                keep=args.keep)
        junits = outcome.junits
        rep.notes += outcome.notes
        over_ssh = len(hosts) - outcome.job_hosts
        mode = (f"via Slurm: {outcome.job_hosts} nodes in job {', '.join(outcome.jobs) or '-'}, "
                f"{over_ssh} hosts over SSH")
    else:
        from gpucluster.progress import status_line

        started = time.monotonic()
        with status_line(every=10.0, stream=sys.stderr) as show:
            def counter(c: dict[str, int]) -> None:  # validate's live line: checks done so far
                show(f"validate: {c['passed']:,} passed, {c['failed']:,} failed, {c['skipped']:,} skipped "
                     f"({time.monotonic() - started:.0f} s, {len(hosts):,} hosts, -n {workers})")

            res = runner.run_pytest(expect_path, hosts, workers, workdir, stream=args.verbose, extra=extra,
                                    on_progress=None if args.verbose else counter)
        if not res.junit.exists() or res.rc in (2, 3, 4):  # interrupted, internal error, usage error
            print(f"error: the validation suite itself failed (pytest exit {res.rc}); log: {res.log}\n"
                  + _tail(res.log), file=sys.stderr)
            return 3
        junits = [(res.junit, "ssh")]
        mode = f"over SSH, -n {workers}"
    for path, source in junits:
        rep.results += report.parse_junit(path, source)
    rep.seconds = time.perf_counter() - t0
    rep.title = f"gpucluster validate {doc['cluster']} ({mode})"
    rep.notes += doc.get("notes", [])
    if doc["slurm"]["profile"] != "production":
        rep.notes.append(f"slurm.profile is '{doc['slurm']['profile']}': the settings listed under "
                         "'differs from production' are not what a production cluster runs")

    if args.junit:
        report.merge_junit(junits, Path(args.junit))
    elif junits:
        report.merge_junit(junits, workdir / "validate.xml")
    if args.html:
        report.write_html(rep, Path(args.html))
    outputs = [p for p in (args.junit, args.html) if p]
    kept = args.keep or args.workdir
    if args.json:
        print_json({"title": rep.title, "ok": rep.ok, "seconds": round(rep.seconds, 3), "notes": rep.notes,
                    "counts": {k: sum(1 for r in rep.results if r.outcome == k)
                               for k in ("passed", "failed", "skipped", "differs")},
                    "results": rep.results, "reports": outputs, "run_folder": str(workdir) if kept else None})
    else:
        print(report.summary_text(rep, width=shutil.get_terminal_size((110, 24)).columns))
        if outputs:
            print("report: " + ", ".join(outputs))
        if kept:
            print(f"run folder (expectations, pytest logs): {workdir}")
    if not kept:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if rep.ok else 1


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return ""


def register(sub) -> None:
    p = sub.add_parser("validate", help="run the testinfra validation suite against an inventory",
                       description=plain(__doc__), epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inventory", help="inventory folder (hosts.yml) or file")
    p.add_argument("-l", "--limit", metavar="PATTERN", help="only these hosts or groups (an Ansible pattern): "
                   "slurm_compute, gpu0[1-2]*, '!gpu03'")
    p.add_argument("-n", "--workers", type=_workers, default="auto", metavar="N",
                   help="hosts validated in parallel (pytest-xdist workers; default: auto)")
    p.add_argument("--junit", metavar="FILE", help="write the merged JUnit XML here")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report here")
    p.add_argument("--via-slurm", action="store_true",
                   help="run the checks on the compute nodes as a Slurm job (one task per node, local backend); "
                        "hosts outside Slurm are checked over SSH in the same run")
    p.add_argument("--slurm-time", default="20:00", help="time limit of the validation job (default 20:00)")
    p.add_argument("--sbatch-args", default="", help="extra sbatch options, e.g. '--reservation=maint'")
    p.add_argument("--thresholds", metavar="FILE", help="YAML with NCCL/RCCL busbw thresholds per GPU x fabric "
                   "(docs/validate.md)")
    p.add_argument("--nccl-bytes", default="8G", help="message size for the all_reduce check (default 8G)")
    p.add_argument("--nccl-binary", metavar="FILE", help="nccl-tests / rccl-tests all_reduce_perf (default: where "
                   "the nccl role builds it)")
    p.add_argument("--ssh", choices=("paramiko", "openssh"), default="paramiko",
                   help="paramiko (default): one connection per host, no process per check; openssh: the ssh "
                        "command, multiplexed (for ProxyJump and other ssh_config features, chosen automatically "
                        "for hosts whose ansible_ssh_common_args need it)")
    p.add_argument("-k", dest="keyword", help="only checks matching this pytest -k expression")
    p.add_argument("--probes", action="store_true", help="also run the probes that start a second slurmd with a "
                   "foreign munge key on one compute node (it must fail to register): harmless, but ask for it")
    p.add_argument("--state-dir", metavar="DIR", help="the cluster's private state folder (default: the inventory's, "
                   "else $XDG_STATE_HOME/gpucluster/<cluster>)")
    p.add_argument("-v", "--verbose", action="store_true", help="stream pytest's own output")
    p.add_argument("--workdir", metavar="DIR", help="keep the run's files (expectations, logs, per-node JUnit) here")
    p.add_argument("--keep", action="store_true", help="keep the temporary run folder (and the flash-tier copy)")
    report_flags(p, "the results as JSON: title, ok, counts, results (one per check and host), notes; the live "
                    "line goes to stderr")
    p.set_defaults(func=cmd_validate)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run `gpucluster validate`")
