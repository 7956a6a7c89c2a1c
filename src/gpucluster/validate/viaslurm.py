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
import subprocess
import tarfile
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster import slurmtext
from gpucluster.errors import UsageError
from gpucluster.inventory.reader import Host, Inventory
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


def ssh(host: Host, command: str, *, input: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(host.ssh_argv(command, "ServerAliveInterval=15"), input=input, capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, 124, b"", f"timed out after {timeout:.0f} s".encode())


def _text(res: subprocess.CompletedProcess) -> str:
    return ((res.stderr or b"") + (res.stdout or b"")).decode(errors="replace").strip()[-500:]


def node_states(submit: Host, hosts: list[str]) -> dict[str, str]:
    """sinfo's compact state per node (idle, alloc, mix, down*, drain, ...)."""
    argv = [*slurmtext.NODE_STATES, "-n", ",".join(hosts)]
    res = ssh(submit, shlex.join(argv), timeout=60)
    if res.returncode != 0:
        raise UsageError(f"--via-slurm: sinfo on {submit.name} failed: {_text(res)}")
    try:
        return slurmtext.parse_node_states(res.stdout.decode(errors="replace"), argv)
    except slurmtext.SlurmOutputError as exc:
        raise UsageError(f"--via-slurm: on {submit.name}: {exc}") from None


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


def _pick(inv: Inventory, group: str, among: list[str] | None = None) -> Host | None:
    for h in inv.group(group):
        if among is None or h in among:
            return inv.hosts[h]
    return None


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
    out = SlurmOutcome()
    selected = doc["selected"]
    submit = _pick(inv, "slurm_login") or _pick(inv, "slurm_controller")
    if submit is None:
        raise UsageError("--via-slurm: the inventory has no slurm_login or slurm_controller host to submit from")
    if not doc.get("flash"):
        raise UsageError("--via-slurm needs the flash tier (storage.flash): the suite and the results travel "
                         "through it; run without --via-slurm")
    compute = [h for h in selected if h in inv.group("slurm_compute")]
    states = node_states(submit, compute) if compute else {}
    in_job = [h for h in compute if usable(states.get(h, "unknown")) and h in doc["flash"]["clients"]]
    for h in compute:
        if h not in in_job:
            why = (f"Slurm state {states.get(h, 'unknown')}" if h in doc["flash"]["clients"]
                   else "no flash tier mount")
            out.notes.append(f"{h}: {why}, so it was validated over SSH instead of in the Slurm job")
    over_ssh = [h for h in selected if h not in in_job]

    # The munge reference must travel with the bundle: nodes cannot ask the controller for it.
    if not doc["munge"].get("key_sha256"):
        ctl = _pick(inv, "slurm_controller")
        res = ssh(ctl, f"sha256sum {shlex.quote(doc['munge']['key'])}") if ctl else None
        if res is not None and res.returncode == 0 and res.stdout:
            doc["munge"]["key_sha256"] = res.stdout.decode().split()[0]
            doc["munge"]["reference"] = ctl.name
            expect_path.write_text(json.dumps(doc, indent=1))

    ssh_result: dict = {}
    ssh_thread = None
    if over_ssh:
        def ssh_part() -> None:
            ssh_result["run"] = run_pytest(expect_path, over_ssh, min(workers, len(over_ssh)), workdir,
                                           stream=stream, extra=extra, suite_name="ssh")
        ssh_thread = threading.Thread(target=ssh_part, daemon=True)
        ssh_thread.start()

    if in_job:
        stage = inv.hosts[in_job[0]]
        remote = f"{doc['flash']['mount']}/.gpucluster-validate/{doc['run_id']}"
        mount = shlex.quote(doc["flash"]["mount"])
        # Only onto the mounted tier: a folder in the bare mount point would keep the tier from mounting.
        res = ssh(stage, f"findmnt -n -o FSTYPE {mount} | grep -q '^fuse' || "
                         f"{{ echo '{doc['flash']['mount']} is not mounted'; exit 3; }}; "
                         f"mkdir -p {shlex.quote(remote)} && tar -xzf - -C {shlex.quote(remote)}",
                  input=bundle_bytes(doc), timeout=300)
        if res.returncode != 0:
            raise UsageError(f"--via-slurm: cannot copy the suite to {stage.name}:{remote}: {_text(res)}")
        by_partition: dict[str, list[str]] = {}
        for h in in_job:
            parts = doc["slurm"]["nodes"].get(h, {}).get("partitions") or [""]
            by_partition.setdefault(parts[0], []).append(h)
        peers = ",".join(in_job)
        threads = []
        job_out: dict[str, tuple[int, str]] = {}
        for part, hosts in by_partition.items():
            # -I -S: nothing from the node's own site-packages or environment mixes with the bundle.
            node_cmd = (f"python3 -I -S {remote}/checks/gpc_node.py {remote} {peers} "
                        + " ".join(shlex.quote(a) for a in extra))
            cmd = (f"sbatch --parsable --wait -J gpucluster-validate -N {len(hosts)} -w {','.join(hosts)} "
                   f"--ntasks-per-node=1 -t {shlex.quote(time_limit)} -o {remote}/slurm-%j.out "
                   + (f"-p {part} " if part else "") + f"{sbatch_args} "
                   + "--wrap " + shlex.quote(f"srun --ntasks-per-node=1 --kill-on-bad-exit=0 {node_cmd}"))

            def submit_job(part=part, cmd=cmd) -> None:
                res = ssh(submit, cmd, timeout=_seconds(time_limit) + 300)
                job_out[part] = (res.returncode, res.stdout.decode().strip() or _text(res))

            t = threading.Thread(target=submit_job, daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        for part, (rc, text) in job_out.items():
            job = text.splitlines()[0] if text and text.splitlines()[0].isdigit() else None
            if job:
                out.jobs.append(job)
            if rc != 0:
                out.notes.append(f"Slurm job {job or '?'} (partition {part or 'default'}) ended with exit {rc}: "
                                 f"{text[-200:]}")
        out.job_hosts = len(in_job)
        fetched = ssh(stage, f"cd {shlex.quote(remote)} && tar -czf - results $(ls slurm-*.out 2>/dev/null)",
                      timeout=300)
        dest = workdir / "slurm"
        dest.mkdir(exist_ok=True)
        if fetched.returncode == 0:
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
            out.notes.append(f"the suite and results stay on {stage.name}:{remote} (--keep)")
        else:
            ssh(stage, f"rm -rf {shlex.quote(remote)}")

    if ssh_thread is not None:
        ssh_thread.join()
        run = ssh_result.get("run")
        if run is None or not run.junit.exists():
            raise UsageError(f"the SSH part of the run did not produce results; log: {workdir}/pytest-ssh.log")
        out.junits.insert(0, (run.junit, "ssh"))
    return out


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
