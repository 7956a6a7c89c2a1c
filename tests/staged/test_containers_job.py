"""A 2-node job in an OCI container through Slurm's own OCI support (`srun --container=BUNDLE`) on the staged
cluster, configured by the session's `gpucluster configure` (the slurm_compute role installs runc; slurmctld serves
the rendered oci.conf).

The image is local, no registry anywhere (docs/containers.md, "Bringing images in without a registry"):
- a minimal root file system (dash, cat, sleep and their libraries, copied from a staged node's own Debian files)
  is imported into the host's podman storage as an image and saved with `podman save --format oci-archive`;
- the operator puts the archive on the flash tier as an OCI image layout (an oci-archive is a tar of one);
- the job's user unpacks it to a bundle of their own with `umoci unpack --rootless` (Slurm 22.05 runs the rootfs
  inside the bundle folder, and a rootless bundle maps only its user's id) and binds the flash tier and
  /etc/nccl.conf in its config.json;
- the user runs `srun -N2 --mem=... --container=BUNDLE` from the controller. Task 0 writes a file to the flash
  tier, task 1 (the other node) reads it back; both print /etc/nccl.conf, their RSS limit and their user namespace.

Expected values come from the spec and the compiled cluster (the flash mount, the rendered nccl.conf, the compute
hosts). The module fixture runs everything once and records the time it took (logs/containers-job.log).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import time

import hostlist
import pytest

from gpucluster.spec import jobcontainers

pytestmark = pytest.mark.staged

USER, UID = "ctjob", 4242  # a local user with the same id on the controller and the compute nodes
MEM_MB = 300  # srun --mem: per node
IMAGE = "localhost/gpucluster-ct-test:v1"  # and the cluster's name
# The root file system: a shell and the two tools the job uses, from the node's own Debian 12/13 files, at
# /bin and /usr/bin.
ROOTFS_SCRIPT = """set -e
r=$(mktemp -d)
mkdir -p "$r/bin" "$r/lib64" "$r/proc" "$r/sys" "$r/dev" "$r/etc" "$r/tmp" "$r/mnt"
cp /usr/bin/dash "$r/bin/sh"
cp /usr/bin/cat /usr/bin/sleep "$r/bin/"
mkdir -p "$r/usr/bin"  # srun 24.11 sends the command's path on the submitting host: /usr/bin/sh on Debian 13
for t in sh cat sleep; do ln -s "../../bin/$t" "$r/usr/bin/$t"; done
for lib in $(ldd /usr/bin/dash /usr/bin/cat /usr/bin/sleep \\
             | awk '$2 == "=>" {print $3} $1 ~ /^\\/.*[.]so/ {print $1}' | sort -u); do
  mkdir -p "$r$(dirname "$lib")"
  cp -L "$lib" "$r$lib"
done
tar -C "$r" -c .
rm -rf "$r"
"""
# The task on the first node writes the hand-off file on the flash tier; the other waits for it and reads it back.
# Slurm 22.05 gives the container srun's environment only (no SLURM_PROCID or SLURMD_NODENAME per task), and the
# bundle shares the node's host name (no UTS namespace, as enroot's containers do): that tells the tasks apart.
JOB_SCRIPT = """node=$(cat /proc/sys/kernel/hostname)
f={handoff}.$SLURM_JOB_ID
if [ "$node" = {writer} ]; then
  echo "job $SLURM_JOB_ID written on $node" > "$f"
else
  i=0
  while [ ! -s "$f" ] && [ $i -lt 150 ]; do sleep 0.2; i=$((i + 1)); done
  read -r line < "$f"
  echo "read: $line"
fi
echo "node: $node"
echo "rss_kb: $(ulimit -m)"
echo "uid_map: $(cat /proc/self/uid_map)"
while IFS= read -r l; do echo "nccl: $l"; done < /etc/nccl.conf
"""


def _sh(c, host: str, script: str, *, user: str | None = None, stdin: bytes | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess:
    """A shell script on a node through podman exec (as root, or as `user` through runuser)."""
    argv = ["runuser", "-u", user, "--", "sh", "-c", script] if user else ["sh", "-c", script]
    res = subprocess.run(["podman", "exec", "-i", c.container(host), *argv], input=stdin, capture_output=True,
                         timeout=timeout, check=False)
    if res.returncode != 0:
        raise AssertionError(f"{host}: `{script[:200]}` exited {res.returncode}: "
                             f"{(res.stderr or res.stdout).decode(errors='replace')[-1500:]}")
    return res


def run_container_job(c, tmp_path_factory) -> dict:
    """Build the image, bring it in, unpack it, run the job on the staged cluster `c` (a StagedHandle of either
    Slurm line); returns what the checks below read. test_trixie.py runs it on the Slurm 24.11 cluster."""
    if not c.first_configure.ok:
        pytest.fail(f"the first configure failed (test_first_configure_converged of the cluster's module; log "
                    f"{c.first_configure.log_path})", pytrace=False)
    spec = c.spec
    image = f"{IMAGE}-{spec.name}"  # one per cluster: both staged clusters may build theirs at the same time
    flash = jobcontainers.flash_dir(spec)
    assert flash, "examples/staging.yaml has a flash tier"
    controller = c.hosts("slurm_controller")[0]
    compute = [h for h in c.hosts("slurm_compute") if jobcontainers.oci(spec, spec.group(_group_of(spec, h)))]
    operator = compute[0]  # the staged cluster has no login group: the operator works on a compute node
    layout, user_dir = f"{flash}/oci/ct-test", f"{flash}/users/{USER}"
    bundle = f"{user_dir}/ct-test"
    times: dict[str, float] = {}
    start = time.monotonic()

    def lap(name: str) -> None:
        times[name] = round(time.monotonic() - start - sum(times.values()), 2)

    # The job's user on the hosts the job touches (a real cluster has them from its directory service).
    for host in [controller, *compute]:
        _sh(c, host, f"getent passwd {USER} >/dev/null || useradd -u {UID} -m -s /bin/sh {USER}")
    lap("user")

    # A local image: a root file system imported into podman's storage, saved as an OCI archive.
    rootfs = _sh(c, operator, ROOTFS_SCRIPT).stdout
    archive = tmp_path_factory.mktemp("ct-image") / "ct-test.tar"
    subprocess.run(["podman", "import", "-q", "-", image], input=rootfs, capture_output=True, check=True)
    try:
        subprocess.run(["podman", "save", "-q", "--format", "oci-archive", "-o", str(archive), image],
                       capture_output=True, check=True)
    finally:
        subprocess.run(["podman", "rmi", "-f", image], capture_output=True, check=False)
    lap("image")

    # The operator: the archive onto the flash tier as an OCI layout; umoci from Debian.
    _sh(c, operator, f"rm -rf {layout} {user_dir} && mkdir -p {layout} {user_dir} && chown {USER}: {user_dir} && "
        f"tar -C {layout} -x", stdin=archive.read_bytes())
    # (a node whose packages all came with the first configure may never have fetched the package index)
    _sh(c, operator, "command -v umoci >/dev/null || { export DEBIAN_FRONTEND=noninteractive; "
        "apt-get install -y -q umoci || { apt-get update -q && apt-get install -y -q umoci; }; }")
    lap("bring-in")

    # The user: a bundle of their own (rootless: config.json maps their id), with the flash tier and nccl.conf.
    tag = _sh(c, operator, f"umoci ls --layout {layout}", user=USER).stdout.decode().split()[0]
    _sh(c, operator, f"umoci unpack --rootless --image {shlex.quote(f'{layout}:{tag}')} {bundle}", user=USER)
    mounts = [{"destination": spec.storage.flash.mount, "type": "none", "source": spec.storage.flash.mount,
               "options": ["rbind", "rw"]},
              {"destination": "/etc/nccl.conf", "type": "none", "source": "/etc/nccl.conf", "options": ["bind", "ro"]}]
    edit = (f"import json; p = {bundle + '/config.json'!r}; d = json.load(open(p)); "
            f"d['mounts'] += {json.dumps(mounts)}; d.pop('hostname', None); "
            "d['linux']['namespaces'] = [n for n in d['linux']['namespaces'] if n['type'] != 'uts']; "
            "json.dump(d, open(p, 'w'), indent=1)")
    _sh(c, operator, f"python3 -c {shlex.quote(edit)}", user=USER)
    # The mount points, before any job (docs/containers.md): both nodes start from this one folder at once, and two
    # runc making the same missing one collide ("mkdirat .../rootfs/var: file exists", seen on 24.11).
    flash_point = spec.storage.flash.mount.lstrip("/")
    _sh(c, operator, f"cd {bundle}/rootfs && mkdir -p var/run/slurm {shlex.quote(flash_point)} && touch etc/nccl.conf",
        user=USER)
    lap("bundle")

    # The job, as the user, from the controller.
    script = JOB_SCRIPT.format(handoff=f"{user_dir}/handoff", writer=compute[0])
    srun = (f"cd /tmp && srun -N2 -l --mem={MEM_MB} --container={bundle} "
            f"-w {hostlist.collect_hostlist(compute[:2])} sh -c {shlex.quote(script)}")
    res = subprocess.run(["podman", "exec", c.container(controller), "runuser", "-u", USER, "--", "sh", "-c", srun],
                         capture_output=True, text=True, timeout=180, check=False)
    lap("job")
    tasks: dict[str, dict[str, list[str]]] = {}
    for line in res.stdout.splitlines():
        m = re.match(r"^\s*(\d+): (\w+): ?(.*)$", line)
        if m:
            tasks.setdefault(m[1], {}).setdefault(m[2], []).append(m[3])
    job = next((m[1] for t in tasks.values() for r in t.get("read", []) if (m := re.match(r"job (\d+) ", r))), None)
    sacct = _sacct(c, controller, job) if job else ""
    lap("sacct")
    # The flash tier is the session's: the image and the user's bundle go (the outputs are kept in the log below).
    _sh(c, operator, f"rm -rf {layout} {user_dir}")
    times["total"] = round(time.monotonic() - start, 2)
    (c.logs / "containers-job.log").write_text(json.dumps({"times_s": times, "stdout": res.stdout,
                                                           "stderr": res.stderr, "sacct": sacct}, indent=1))
    print(f"container job: {times}")
    return {"rc": res.returncode, "out": res.stdout, "err": res.stderr, "tasks": tasks, "job": job,
            "sacct": sacct, "compute": compute[:2], "bundle": bundle, "controller": controller, "times": times}


@pytest.fixture(scope="module")
def container_job(staged_cluster, tmp_path_factory):
    """The job on the Slurm 22.05 cluster (examples/staging.yaml)."""
    return run_container_job(staged_cluster, tmp_path_factory)


def _group_of(spec, host: str) -> str:
    return next(g.name for g in spec.node_groups if host in g.hosts)


def _sacct(c, controller: str, job: str) -> str:
    """slurmdbd records the job asynchronously, its fields in more than one message (right after the job a row was
    seen COMPLETED with no Container and ReqMem `16?`): read until the job and its step are COMPLETED with their
    container recorded, for up to a minute. (On the production profile the job also has an `extern` step, which
    runs no container.)"""
    deadline = time.monotonic() + 60
    while True:
        res = c.ssh(controller, f"sacct -j {job} -n -P -o JobID,State,NNodes,NodeList,ReqMem,Container,ExitCode")
        rows = [r.split("|") for r in res.stdout.split() if not r.startswith(f"{job}.extern|")]
        done = len(rows) >= 2 and all(len(r) == 7 and r[1] == "COMPLETED" and r[5] for r in rows)
        if done or time.monotonic() > deadline:
            return res.stdout.strip()
        time.sleep(1)


def _explain(job: dict) -> str:
    return f"srun exited {job['rc']}\nstdout:\n{job['out'][-2000:]}\nstderr:\n{job['err'][-2000:]}"


def check_the_job_runs_in_a_container_on_two_nodes(job: dict, cluster) -> None:
    """Both tasks ran, one on each node, inside a user namespace that maps only the user's id (the rootless
    runc of oci.conf: the process is uid 0 in the container and the user outside)."""
    assert job["rc"] == 0 and sorted(job["tasks"]) == ["0", "1"], _explain(job)
    nodes = [job["tasks"][t]["node"][0] for t in ("0", "1")]
    assert sorted(nodes) == sorted(job["compute"]), _explain(job)
    for t in ("0", "1"):
        assert job["tasks"][t]["uid_map"][0].split() == ["0", str(UID), "1"], _explain(job)


def check_a_file_written_on_one_node_is_read_on_the_other(job: dict, cluster) -> None:
    assert job["rc"] == 0, _explain(job)
    writer, reader = job["compute"]
    lines = {job["tasks"][t]["node"][0]: job["tasks"][t].get("read", []) for t in job["tasks"]}
    assert lines.get(reader) == [f"job {job['job']} written on {writer}"], _explain(job)


def check_the_container_sees_the_rendered_nccl_conf(job: dict, cluster) -> None:
    """/etc/nccl.conf inside the container is the file gpucluster rendered for the node group."""
    facts = json.loads((cluster.state_dir / "compiled" / "facts.json").read_text())
    for t in ("0", "1"):
        group = _group_of(cluster.spec, job["tasks"][t]["node"][0])
        rendered = (cluster.state_dir / "compiled" / "rendered" / facts["nccl"][group]["conf_name"]).read_text()
        seen = "\n".join(job["tasks"][t].get("nccl", [])) + "\n"
        assert hashlib.sha256(seen.encode()).hexdigest() == hashlib.sha256(rendered.encode()).hexdigest(), (
            f"task {t} saw:\n{seen}\nrendered:\n{rendered}")


def check_the_memory_limit_is_the_one_slurm_set(job: dict, cluster) -> None:
    """slurmstepd sets the task's RSS limit from --mem; runc keeps it for the container's process. (On the
    production profile task/cgroup also puts the step in a memory cgroup of that size.)"""
    assert job["rc"] == 0, _explain(job)
    for t in ("0", "1"):
        assert job["tasks"][t]["rss_kb"] == [str(MEM_MB * 1024)], _explain(job)


def check_sacct_accounts_the_container_job(job: dict, cluster) -> None:
    assert job["job"], _explain(job)
    rows = {r.split("|")[0]: r.split("|") for r in job["sacct"].splitlines()}
    whole, step = rows.get(job["job"]), rows.get(f"{job['job']}.0")
    assert whole and step, f"sacct: {job['sacct']!r}"
    assert whole[1] == "COMPLETED" and whole[2] == "2", whole
    assert set(hostlist.expand_hostlist(whole[3])) == set(job["compute"]), whole
    assert whole[4] == f"{MEM_MB * 2}M", whole  # ReqMem: --mem per node, two nodes
    assert whole[5] == job["bundle"] and step[5] == job["bundle"], (whole, step)
    assert step[1] == "COMPLETED" and step[6] == "0:0", step


# Every check, by the name of its test: test_trixie.py runs them on the Slurm 24.11 cluster.
CHECKS = {f.__name__.removeprefix("check_"): f for f in (
    check_the_job_runs_in_a_container_on_two_nodes, check_a_file_written_on_one_node_is_read_on_the_other,
    check_the_container_sees_the_rendered_nccl_conf, check_the_memory_limit_is_the_one_slurm_set,
    check_sacct_accounts_the_container_job)}


# ---- the Slurm 22.05 cluster

def test_the_job_runs_in_a_container_on_two_nodes(container_job, staged_cluster):
    check_the_job_runs_in_a_container_on_two_nodes(container_job, staged_cluster)


def test_a_file_written_on_one_node_is_read_on_the_other(container_job, staged_cluster):
    check_a_file_written_on_one_node_is_read_on_the_other(container_job, staged_cluster)


def test_the_container_sees_the_rendered_nccl_conf(container_job, staged_cluster):
    check_the_container_sees_the_rendered_nccl_conf(container_job, staged_cluster)


def test_the_memory_limit_is_the_one_slurm_set(container_job, staged_cluster):
    check_the_memory_limit_is_the_one_slurm_set(container_job, staged_cluster)


def test_sacct_accounts_the_container_job(container_job, staged_cluster):
    check_sacct_accounts_the_container_job(container_job, staged_cluster)
