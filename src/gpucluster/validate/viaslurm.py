"""`gpucluster validate --via-slurm`: the cluster's own scheduler runs the suite on its nodes.

1. Ask slurmctld (on a login node, else the controller) which selected compute nodes are usable.
2. Ship a bundle (checks, expectations, pure-Python pytest + testinfra) to the shared flash tier.
3. One `sbatch --wait` per partition: one task per node (`srun`), each running the suite with
   testinfra's local backend and writing <flash>/.gpucluster-validate/<run>/results/<node>.xml.
4. Meanwhile the hosts outside Slurm (controller, storage) and any node Slurm cannot use are checked
   over SSH from here, so the report still covers every selected host.
5. Fetch the per-node JUnit files, add a failure for every node that sent none, merge.

From this machine that is a handful of SSH sessions whatever the node count: the fan-out is Slurm's.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shlex
import tarfile
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster import slurmtext
from gpucluster.errors import UsageError
from gpucluster.inventory.reader import Host, Inventory
from gpucluster.slurmclient import Client, SlurmError, slurm_host, tail
from gpucluster.validate.suite import CHECKS_DIR, run_pytest

# Pure-Python modules the nodes need; copied from this interpreter's environment.
SITE_MODULES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "testinfra", "py")
USABLE = ("idle", "alloc", "mix", "allocated", "mixed", "comp", "completing")


@dataclass
class SlurmOutcome:
    junits: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    job_hosts: int = 0


def node_states(submit: Host, hosts: list[str]) -> dict[str, str]:
    """sinfo's compact state per node (idle, alloc, mix, down*, drain, ...), asked on `submit`."""
    argv = [*slurmtext.NODE_STATES, "-n", ",".join(hosts)]
    res = Client(submit, timeout=60).check(argv, hint="--via-slurm asks Slurm which nodes it can use")
    try:
        return slurmtext.parse_node_states(res.stdout, argv)
    except slurmtext.SlurmOutputError as exc:
        raise SlurmError(f"--via-slurm: on {submit.name}: {exc}") from None


def usable(state: str) -> bool:
    return not state.endswith(("*", "~", "#", "!", "%", "$", "@", "^", "-")) and state.rstrip("+") in USABLE


def bundle_bytes(doc: dict) -> bytes:
    """tar.gz of checks/ + expectations.json + site/ (no connection details: nodes run locally)."""
    buf = io.BytesIO()
    shipped = {**doc, "hosts": {h: {k: v for k, v in e.items() if k != "ssh"} for h, e in doc["hosts"].items()}}
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        def add(path: Path, arcname: str) -> None:
            tar.add(str(path), arcname=arcname,
                    filter=lambda ti: None if "__pycache__" in ti.name or ti.name.endswith(".pyc") else ti)
        add(CHECKS_DIR, "checks")
        data = json.dumps(shipped).encode()
        info = tarfile.TarInfo("expectations.json")
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))
        for name in SITE_MODULES:
            spec = importlib.util.find_spec(name)
            if spec is None:
                if name == "py":
                    continue
                raise UsageError(f"--via-slurm: this environment lacks {name}; install gpucluster[ops]")
            if spec.submodule_search_locations:
                add(Path(next(iter(spec.submodule_search_locations))), f"site/{name}")
            elif spec.origin:
                add(Path(spec.origin), f"site/{Path(spec.origin).name}")
    return buf.getvalue()


def _missing_result(path: Path, host: str, why: str) -> None:
    suite = ET.Element("testsuite", name=f"slurm:{host}", tests="1", failures="1", errors="0", skipped="0")
    tc = ET.SubElement(suite, "testcase", classname="gpc_node", name=f"test_ran_in_slurm_job[all:{host}]", time="0")
    props = ET.SubElement(tc, "properties")
    for k, v in (("group", "all"), ("host", host)):
        ET.SubElement(props, "property", name=k, value=v)
    ET.SubElement(tc, "failure", message=f"{host}: {why}")
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def run_via_slurm(inv: Inventory, doc: dict, expect_path: Path, workdir: Path, *, workers: int,
                  extra: list[str], time_limit: str, sbatch_args: str, stream: bool, keep: bool) -> SlurmOutcome:
    """The compute nodes Slurm can use, checked inside one job per partition; every other selected host over SSH
    from here at the same time. The outcome's JUnit files cover every selected host."""
    out = SlurmOutcome()
    submit = slurm_host(inv, "to submit the checks' job from (--via-slurm)")
    if not doc.get("flash"):
        raise UsageError("--via-slurm needs the flash tier (storage.flash): the suite and the results travel "
                         "through it; run without --via-slurm")
    try:
        sbatch_words = shlex.split(sbatch_args)
    except ValueError as exc:
        raise UsageError(f"--sbatch-args {sbatch_args!r}: {exc}; give sbatch options as a shell would split "
                         "them, e.g. '--reservation=maint --qos=high'") from None
    in_job = _job_hosts(inv, doc, submit, out)
    doc["via_slurm"] = True  # the SSH part's checks that would need the job's nodes skip, saying so
    expect_path.write_text(json.dumps(doc, indent=1))
    _munge_reference(inv, doc, expect_path)
    over_ssh = _start_ssh_part(expect_path, [h for h in doc["selected"] if h not in in_job], workers, workdir,
                               stream=stream, extra=extra)
    if in_job:
        stage = Client(inv.hosts[in_job[0]], timeout=300)
        remote = f"{doc['flash']['mount']}/.gpucluster-validate/{doc['run_id']}"
        _ship(stage, doc, remote)
        started = _submit(Client(submit, timeout=_seconds(time_limit) + 300), doc, in_job, remote,
                          extra=extra, time_limit=time_limit, sbatch_words=sbatch_words)
        _wait(started, out)
        out.job_hosts = len(in_job)
        _collect(stage, remote, in_job, workdir, out, keep=keep)
    if over_ssh is not None:
        out.junits.insert(0, (_finish_ssh_part(over_ssh, workdir), "ssh"))
    return out


def _job_hosts(inv: Inventory, doc: dict, submit: Host, out: SlurmOutcome) -> list[str]:
    """The selected compute nodes the job runs on: those Slurm can use now that mount the flash tier. Each other
    compute node gets a note, and is checked over SSH instead."""
    compute = [h for h in doc["selected"] if h in inv.group("slurm_compute")]
    states = node_states(submit, compute) if compute else {}
    clients = doc["flash"]["clients"]
    in_job = [h for h in compute if usable(states.get(h, "unknown")) and h in clients]
    for h in compute:
        if h not in in_job:
            why = f"Slurm state {states.get(h, 'unknown')}" if h in clients else "no flash tier mount"
            out.notes.append(f"{h}: {why}, so it was validated over SSH instead of in the Slurm job")
    return in_job


def _munge_reference(inv: Inventory, doc: dict, expect_path: Path) -> None:
    """The munge key's SHA-256 from the first controller, into the expectations, where the secrets folder gave
    none: nodes cannot ask the controller for it, so it travels with the bundle. Best effort: without it the
    munge check says it has no reference."""
    controllers = inv.group("slurm_controller")
    if doc["munge"].get("key_sha256") or not controllers:
        return
    ctl = inv.hosts[controllers[0]]
    try:
        res = Client(ctl)(["sha256sum", doc["munge"]["key"]])
    except SlurmError:
        return
    if res.returncode == 0 and res.stdout.split():
        doc["munge"]["key_sha256"] = res.stdout.split()[0]
        doc["munge"]["reference"] = ctl.name
        expect_path.write_text(json.dumps(doc, indent=1))


@dataclass
class _SshPart:
    thread: threading.Thread
    result: dict  # "run": run_pytest's result, once it is done


def _start_ssh_part(expect_path: Path, hosts: list[str], workers: int, workdir: Path, *, stream: bool,
                    extra: list[str]) -> _SshPart | None:
    """The hosts outside the job checked over SSH from here, in a thread while the job runs (None: no host)."""
    if not hosts:
        return None
    result: dict = {}

    def run() -> None:
        result["run"] = run_pytest(expect_path, hosts, min(workers, len(hosts)), workdir, stream=stream, extra=extra,
                                   suite_name="ssh")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return _SshPart(thread, result)


def _finish_ssh_part(part: _SshPart, workdir: Path) -> Path:
    """The SSH part's JUnit file, once it is done."""
    part.thread.join()
    run = part.result.get("run")
    if run is None or not run.junit.exists():
        raise UsageError(f"the SSH part of the run did not produce results; log: {workdir}/pytest-ssh.log")
    return run.junit


# Unpack the bundle only onto the mounted tier ($1: its mount point; $2: the run's folder): a folder made in the
# bare mount point would keep the tier from mounting.
SHIP = ('findmnt -n -o FSTYPE "$1" | grep -q "^fuse" || { echo "$1 is not mounted"; exit 3; }; '
        'mkdir -p "$2" && tar -xzf - -C "$2"')
FETCH = 'cd "$1" && tar -czf - results $(ls slurm-*.out 2>/dev/null)'  # $1: the run's folder


def _ship(stage: Client, doc: dict, remote: str) -> None:
    """The bundle (checks, expectations, site modules) into `remote` on the flash tier, through `stage`."""
    res = stage(["sh", "-c", SHIP, "sh", doc["flash"]["mount"], remote], input=bundle_bytes(doc), binary=True)
    if res.returncode != 0:
        raise UsageError(f"--via-slurm: cannot copy the suite to {stage.where}:{remote}: {tail(res, 500)}")


def sbatch_argv(hosts: list[str], partition: str, remote: str, peers: str, *, extra: list[str], time_limit: str,
                sbatch_words: list[str]) -> list[str]:
    """One partition's job: one task per node, each running the suite from the bundle in `remote`."""
    # -I -S: nothing from the node's own site-packages or environment mixes with the bundle.
    node_cmd = ["python3", "-I", "-S", f"{remote}/checks/gpc_node.py", remote, peers, *extra]
    return ["sbatch", "--parsable", "--wait", "-J", "gpucluster-validate", "-N", str(len(hosts)), "-w", ",".join(hosts),
            "--ntasks-per-node=1", "-t", time_limit, "-o", f"{remote}/slurm-%j.out",
            *(["-p", partition] if partition else []), *sbatch_words,
            "--wrap", shlex.join(["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0", *node_cmd])]


@dataclass
class _Submitted:
    threads: list[threading.Thread]
    ended: dict[str, tuple[int, str]]  # partition -> (sbatch's exit status, its output)


def _submit(submit: Client, doc: dict, in_job: list[str], remote: str, *, extra: list[str], time_limit: str,
            sbatch_words: list[str]) -> _Submitted:
    """One `sbatch --wait` per partition of the job's nodes, each in its own thread."""
    by_partition: dict[str, list[str]] = {}
    for h in in_job:
        parts = doc["slurm"]["nodes"].get(h, {}).get("partitions") or [""]
        by_partition.setdefault(parts[0], []).append(h)
    started = _Submitted([], {})
    for part, hosts in by_partition.items():
        argv = sbatch_argv(hosts, part, remote, ",".join(in_job), extra=extra, time_limit=time_limit,
                           sbatch_words=sbatch_words)

        def job(part: str = part, argv: list[str] = argv) -> None:
            try:
                res = submit(argv)
            except SlurmError as exc:
                started.ended[part] = (124, str(exc))
                return
            started.ended[part] = (res.returncode, res.stdout.strip() or tail(res, 500))

        t = threading.Thread(target=job, daemon=True)
        t.start()
        started.threads.append(t)
    return started


def _wait(started: _Submitted, out: SlurmOutcome) -> None:
    """Every job to its end: its id into the outcome, and a note for each that did not end well."""
    for t in started.threads:
        t.join()
    for part, (rc, text) in started.ended.items():
        job = text.splitlines()[0] if text and text.splitlines()[0].isdigit() else None
        if job:
            out.jobs.append(job)
        if rc != 0:
            out.notes.append(f"Slurm job {job or '?'} (partition {part or 'default'}) ended with exit {rc}: "
                             f"{text[-200:]}")


def _collect(stage: Client, remote: str, in_job: list[str], workdir: Path, out: SlurmOutcome, *,
             keep: bool) -> None:
    """The per-node JUnit files and the jobs' logs into workdir/slurm, a failure for every node that sent none,
    then the run's folder removed from the tier (unless `keep`)."""
    dest = workdir / "slurm"
    dest.mkdir(exist_ok=True)
    try:
        fetched = stage(["sh", "-c", FETCH, "sh", remote], binary=True)
    except SlurmError as exc:
        out.notes.append(f"the results could not be fetched: {exc}")
        fetched = None
    if fetched is not None and fetched.returncode == 0:
        with tarfile.open(fileobj=io.BytesIO(fetched.stdout), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")
    for h in in_job:
        path = dest / "results" / f"{h}.xml"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            _missing_result(path, h, f"no result from the Slurm job(s) {', '.join(out.jobs) or '?'}; "
                                     f"see {dest}/slurm-*.out")
        out.junits.append((path, f"slurm:{h}"))
    if keep:
        out.notes.append(f"the suite and results stay on {stage.where}:{remote} (--keep)")
        return
    try:
        stage(["rm", "-rf", remote], timeout=120)
    except SlurmError as exc:
        out.notes.append(f"{stage.where}:{remote} is left behind: {exc}")


def _seconds(limit: str) -> int:
    """Slurm time limit ([D-]HH:MM:SS, MM:SS, MM) in seconds."""
    days = 0
    if "-" in limit:
        d, limit = limit.split("-", 1)
        days = int(d)
    parts = [int(p) for p in limit.split(":")]
    if len(parts) == 1:
        secs = parts[0] * 60
    elif len(parts) == 2:
        secs = parts[0] * 60 + parts[1]
    else:
        secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return days * 86400 + secs
