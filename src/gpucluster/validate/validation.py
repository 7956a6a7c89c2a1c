"""Validate a cluster: the one entry of `gpucluster validate` (the command parses, calls `validate`, prints).

`validate` reads the inventory, builds the expectations (expect.py), runs the checks over SSH (suite.py) or as a
Slurm job with the rest over SSH (viaslurm.py), merges their JUnit reports and writes the operator's reports
(report.py). The run folder is removed at the end unless the caller keeps it (`keep`, or a `workdir` given) or the suite
itself failed (its log is there)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpucluster.errors import UsageError
from gpucluster.validate import expect, report
from gpucluster.validate import suite as runner
from gpucluster.validate.thresholds import load_thresholds


@dataclass
class Validation:
    """One validate run: its report, the report files written, the run folder (None once removed), and, when
    the suite itself could not run (pytest's own error: exit 3), what to show instead of a report."""

    report: report.Report
    outputs: list[str]
    run_folder: Path | None
    suite_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.suite_error is None and self.report.ok

    def text(self, width: int) -> str:
        """The one-screen summary."""
        return report.summary_text(self.report, width=width)

    def as_json(self) -> dict:
        """validate --json's document."""
        rep = self.report
        return {"title": rep.title, "ok": rep.ok, "seconds": round(rep.seconds, 3), "notes": rep.notes,
                "counts": {k: sum(1 for r in rep.results if r.outcome == k)
                           for k in ("passed", "failed", "skipped", "differs")},
                "results": rep.results, "reports": self.outputs,
                "run_folder": str(self.run_folder) if self.run_folder else None}


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return ""


def validate(inventory: str | os.PathLike, *, limit: str | None = None, workers: int | str = "auto",
             keyword: str | None = None, ssh: str = "paramiko", thresholds: str | os.PathLike | None = None,
             nccl_bytes: str = "8G", nccl_binary: str | None = None, probes: bool = False,
             state_dir: str | os.PathLike | None = None, via_slurm: bool = False, slurm_time: str = "20:00",
             sbatch_args: str = "", verbose: bool = False, workdir: str | os.PathLike | None = None,
             keep: bool = False, junit: str | os.PathLike | None = None,
             html: str | os.PathLike | None = None) -> Validation:
    """Run the validation suite on the hosts of `inventory` that `limit` selects; never raises for a failed
    check. `workers` ("auto" or N) hosts at a time; `keyword` a pytest -k expression; `via_slurm` runs the
    compute nodes' checks as a Slurm job. Without `verbose` a live line of counts goes to stderr."""
    from gpucluster.inventory.reader import load_inventory

    t0 = time.perf_counter()
    inv = load_inventory(inventory)
    opts = expect.Options(limit=limit, thresholds=load_thresholds(thresholds), nccl_bytes=nccl_bytes,
                          nccl_binary=nccl_binary,
                          run_id=time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}",
                          probes=probes)
    doc = expect.build(inv, opts, state_dir=state_dir)
    hosts = doc["selected"]
    if not hosts:
        raise UsageError(f"{inv.path}: --limit {limit!r} selects no host")
    folder = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gpucluster-validate-"))
    folder.mkdir(parents=True, exist_ok=True)
    expect_path = expect.write(doc, folder / "expectations.json")
    n = runner.default_workers(len(hosts)) if workers == "auto" else min(int(workers), len(hosts))
    extra = (["-k", keyword] if keyword else []) + [f"--gpc-ssh={ssh}"]

    rep = report.Report(title=f"gpucluster validate {doc['cluster']}")
    junits: list[tuple[Path, str]] = []
    if via_slurm:
        from gpucluster.validate.viaslurm import run_via_slurm

        outcome = run_via_slurm(inv, doc, expect_path, folder, workers=n, extra=extra, time_limit=slurm_time,
                                sbatch_args=sbatch_args, stream=verbose, keep=keep)
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
                     f"({time.monotonic() - started:.0f} s, {len(hosts):,} hosts, -n {n})")

            res = runner.run_pytest(expect_path, hosts, n, folder, stream=verbose, extra=extra,
                                    on_progress=None if verbose else counter)
        if not res.junit.exists() or res.rc in (2, 3, 4):  # interrupted, internal error, usage error
            return Validation(rep, [], folder, suite_error=f"error: the validation suite itself failed (pytest "
                                                           f"exit {res.rc}); log: {res.log}\n" + _tail(res.log))
        junits = [(res.junit, "ssh")]
        mode = f"over SSH, -n {n}"
    for path, source in junits:
        rep.results += report.parse_junit(path, source)
    rep.seconds = time.perf_counter() - t0
    rep.title = f"gpucluster validate {doc['cluster']} ({mode})"
    rep.notes += doc.get("notes", [])
    if doc["slurm"]["profile"] != "production":
        rep.notes.append(f"slurm.profile is '{doc['slurm']['profile']}': the settings listed under "
                         "'differs from production' are not what a production cluster runs")

    if junit:
        report.merge_junit(junits, Path(junit))
    elif junits:
        report.merge_junit(junits, folder / "validate.xml")
    if html:
        report.write_html(rep, Path(html))
    outputs = [str(p) for p in (junit, html) if p]
    kept = keep or workdir
    if not kept:
        shutil.rmtree(folder, ignore_errors=True)
    return Validation(rep, outputs, folder if kept else None)
