"""`gpucluster validate INVENTORY`: the testinfra suite on every node, with one readable report.

Exit status: 0 when every check passed (skips and reported differences allowed), 1 when a check
failed, 2 for a usage problem, 3 when the suite itself could not run (pytest's own error; log shown).
"""

from __future__ import annotations

import argparse
import shutil
import sys

from gpucluster.commands._flags import print_json, report_flags
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
    from gpucluster.validate.validation import validate

    run = validate(args.inventory, limit=args.limit, workers=args.workers, keyword=args.keyword, ssh=args.ssh,
                   thresholds=args.thresholds, nccl_bytes=args.nccl_bytes, nccl_binary=args.nccl_binary,
                   probes=args.probes, state_dir=args.state_dir, via_slurm=args.via_slurm,
                   slurm_time=args.slurm_time, sbatch_args=args.sbatch_args, verbose=args.verbose,
                   workdir=args.workdir, keep=args.keep, junit=args.junit, html=args.html)
    if run.suite_error:
        print(run.suite_error, file=sys.stderr)
        return 3
    if args.json:
        print_json(run.as_json())
    else:
        print(run.text(width=shutil.get_terminal_size((110, 24)).columns))
        if run.outputs:
            print("report: " + ", ".join(run.outputs))
        if run.run_folder:
            print(f"run folder (expectations, pytest logs): {run.run_folder}")
    return 0 if run.ok else 1


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
