"""Jobs in containers: on every node group with Slurm's OCI support on, a job in a container runs on two of its
nodes, hands a file over on the flash tier and sees the group's NCCL settings, with the memory limit Slurm set
(docs/containers.md).

The check needs no image and no registry. On the first of the two nodes it makes a bundle in a private folder on
the flash tier: a root file system of the node's own shell and a few coreutils with their libraries, and a
config.json that binds the flash tier, the group's NCCL config file and the node's GPU and RDMA device files, and
keeps the node's host name (no UTS namespace, as enroot's containers do). From the controller, as root, it runs
`srun -N2 --mem=... --container=BUNDLE` on two idle nodes of the group; the bundle is removed afterwards. A node
group with fewer than two idle nodes is skipped with the reason: the check never waits behind, or displaces, a job.

Each task writes a line naming its node to the flash tier and reads the other task's line back; then it prints
its RSS limit, the SHA-256 of the NCCL config it sees and how many GPU and RDMA device files it sees.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import shlex

import pytest
from gpc_checklib import PROBE_DIR, run

MEM_MB = 256  # srun --mem, per node: a shell and cat need a few MiB
# The container's root file system, from the node's own files: the shell at /bin/sh, the tools the job uses, their
# libraries, and /usr/bin links (srun from a Debian 13 host sends the command as /usr/bin/sh).
TOOLS = ("cat", "sleep", "sha256sum")
ROOTFS = """set -e
b={bundle}
r="$b/rootfs"
mkdir -p "$(dirname "$b")"
umask 077
mkdir "$b"
mkdir -p "$r/bin" "$r/usr/bin" "$r/proc" "$r/sys" "$r/dev" "$r/etc" "$r/tmp"
cp "$(readlink -f /bin/sh)" "$r/bin/sh"
for t in {tools}; do cp "$(command -v "$t")" "$r/bin/"; done
for t in sh {tools}; do ln -s "../../bin/$t" "$r/usr/bin/$t"; done
libs=$(ldd "$r"/bin/* | awk '$2 == "=>" && $3 ~ /^\\// {{print $3}} $1 ~ /^\\/.*[.]so/ {{print $1}}')
for lib in $(echo "$libs" | sort -u); do
  mkdir -p "$r$(dirname "$lib")"
  cp -L "$lib" "$r$lib"
done
for d in {dirs}; do mkdir -p "$r$d"; done
for f in {files}; do mkdir -p "$r$(dirname "$f")" && : > "$r$f"; done
chmod -R go-w "$r"
echo {config} | base64 -d > "$b/config.json"
echo ok
"""
# Mount points made in the root file system beforehand. Both nodes start their container from this one folder on
# the flash tier at the same moment, and runc makes a missing mount point itself: two of them making the same one
# collide ("mkdirat .../rootfs/var/run: file exists", seen on 24.11). /var/run/slurm is where slurmstepd 23.02 and
# later mounts the step's spool folder (oci.conf's MountSpoolDir default).
SPOOL_MOUNT = "/var/run/slurm"


def mount_points(flash_mount: str, nccl_conf: str | None) -> tuple[list[str], list[str]]:
    """(folders, files) the bundle's root file system holds before any container starts from it."""
    return [SPOOL_MOUNT, flash_mount], [nccl_conf] if nccl_conf else []


# The job, the same on both nodes (Slurm 22.05 gives the container no per-task variables): a line per node on the
# flash tier, then the other node's line read back.
JOB = """h=$(cat /proc/sys/kernel/hostname)
d={handoff}
echo "job $SLURM_JOB_ID written on $h" > "$d/$h"
i=0
while :; do
  other=
  for f in "$d"/*; do [ "$f" = "$d/$h" ] || [ ! -s "$f" ] || other=$f; done
  [ -z "$other" ] && [ $i -lt 300 ] || break
  sleep 0.2; i=$((i + 1))
done
if [ -n "$other" ]; then read -r line < "$other"; echo "read: $line"; else echo "read: nothing"; fi
echo "node: $h"
echo "rss_kb: $(ulimit -m)"
echo "nccl: $(sha256sum < {nccl_conf})"
set -- /dev/nvidia[0-9]*; [ -e "$1" ] && echo "gpus: $#" || echo "gpus: 0"
set -- /dev/infiniband/uverbs*; [ -e "$1" ] && echo "rdma: $#" || echo "rdma: 0"
"""
# srun's words when --immediate could not have the nodes (another job took them after sinfo said idle).
BUSY = re.compile(r"Unable to allocate resources|Immediate execution impossible|Requested nodes are busy")
DEVICES = "ls -d /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm /dev/infiniband/* /dev/kfd /dev/dri/* 2>/dev/null"


def config_json(flash_mount: str, nccl_conf: str | None, devices: list[tuple[str, str, int, int]]) -> dict:
    """The bundle's OCI runtime config: root's, no user namespace; Slurm replaces the process's arguments and
    environment with the job's. `devices`: (path, type c/b, major, minor) to bind in and allow."""
    mounts = [{"destination": "/proc", "type": "proc", "source": "proc"},
              {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
              {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]},
              {"destination": flash_mount, "type": "none", "source": flash_mount, "options": ["rbind", "rw"]}]
    if nccl_conf:
        mounts.append({"destination": nccl_conf, "type": "none", "source": nccl_conf, "options": ["bind", "ro"]})
    mounts += [{"destination": p, "type": "none", "source": p, "options": ["bind"]} for p, *_ in devices]
    return {"ociVersion": "1.0.2",
            "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/sh"], "cwd": "/",
                        "env": ["PATH=/usr/bin:/bin"], "noNewPrivileges": True},
            "root": {"path": "rootfs", "readonly": True},
            "mounts": mounts,
            "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}],
                      "resources": {"devices": [{"allow": False, "access": "rwm"}] + [
                          {"allow": True, "type": t, "major": ma, "minor": mi, "access": "rwm"}
                          for _p, t, ma, mi in devices]}}}


def parse_devices(text: str) -> list[tuple[str, str, int, int]]:
    """`stat -c '%n %F %t %T'` lines -> (path, c/b, major, minor) of the character and block devices."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"(/dev/\S+) (character|block) special file ([0-9a-f]+) ([0-9a-f]+)", line.strip())
        if m:
            out.append((m[1], m[2][0], int(m[3], 16), int(m[4], 16)))
    return out


def parse_tasks(stdout: str) -> dict[str, dict[str, str]]:
    """`srun -l` output -> {task: {key: value}}."""
    tasks: dict[str, dict[str, str]] = {}
    for line in stdout.splitlines():
        m = re.match(r"^\s*(\d+): (\w+): ?(.*)$", line)
        if m:
            tasks.setdefault(m[1], {})[m[2]] = m[3].strip()
    return tasks


def job_problems(tasks: dict[str, dict[str, str]], *, mem_mb: int, nccl_sha256: str | None,
                 devices: dict[str, int]) -> list[str]:
    """What the two tasks' output says is wrong, one sentence each; [] when the job did what it should."""
    if sorted(tasks) != ["0", "1"]:
        return [f"expected the output of tasks 0 and 1, got tasks {sorted(tasks) or 'none'}"]
    problems = []
    nodes = {t: tasks[t].get("node", "") for t in ("0", "1")}
    if not all(nodes.values()) or nodes["0"] == nodes["1"]:
        problems.append(f"the two tasks did not run on two nodes (host names {nodes['0']!r}, {nodes['1']!r})")
    for t, other in (("0", "1"), ("1", "0")):
        want = f"written on {nodes[other]}"
        if not tasks[t].get("read", "").endswith(want) or not tasks[t]["read"].startswith("job "):
            problems.append(f"task {t} on {nodes[t]} read {tasks[t].get('read', 'nothing')!r} from the flash tier, "
                            f"not the line task {other} wrote ('... {want}')")
        if tasks[t].get("rss_kb") != str(mem_mb * 1024):
            problems.append(f"task {t} on {nodes[t]}: RSS limit {tasks[t].get('rss_kb')!r} KiB in the container, "
                            f"not the {mem_mb * 1024} of srun --mem={mem_mb}")
        seen = tasks[t].get("nccl", "").split(" ")[0]
        if nccl_sha256 and seen != nccl_sha256:
            problems.append(f"task {t} on {nodes[t]}: the NCCL config in the container has SHA-256 {seen or 'none'}, "
                            f"not the rendered file's {nccl_sha256}")
        for kind, want_n in devices.items():
            got = tasks[t].get(kind)
            if got != str(want_n):
                problems.append(f"task {t} on {nodes[t]}: {got} {kind} device files in the container, the node has "
                                f"{want_n}")
    return problems


def _groups(ctx, host):
    if host != ctx.controller:  # one job per node group, submitted from the first controller
        return
    for g, want in ctx.doc.get("containers", {}).items():
        yield g, {**want, "group": g}


def _idle(ctx, hosts: list[str]) -> tuple[list[str], str]:
    out = run(ctx.slurm_host(), "sinfo -h -N -o '%N %t' -n " + shlex.quote(",".join(hosts)), timeout=60)
    if out.rc != 0:
        pytest.fail(f"sinfo on {ctx.controller} failed: {(out.stderr or out.stdout).strip()[-300:]}", pytrace=False)
    state = dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)
    return [h for h in hosts if state.get(h) == "idle"], ", ".join(f"{h} {state.get(h, '?')}" for h in hosts)


@pytest.mark.per("slurm_controller", items=_groups)
def test_container_job_on_two_nodes(ctx, target, doc, item):
    group = item["group"]
    if ctx.mode == "local" or doc.get("via_slurm"):
        pytest.skip("--via-slurm: the compute nodes are in validate's own job; the container job runs in a validate "
                    "without --via-slurm")
    if not item["flash_dir"]:
        pytest.skip(f"node group {group}: not every node mounts the flash tier, where the job's bundle and hand-off "
                    "file must be for both nodes")
    idle, states = _idle(ctx, item["hosts"])
    if len(idle) < 2:
        pytest.skip(f"node group {group}: fewer than two idle nodes ({states}); the check waits behind no job")
    pair = idle[:2]
    nccl = doc["nccl"].get(group, {}).get("conf")
    builder = ctx.host(pair[0])
    listed = run(builder, f"stat -c '%n %F %t %T' $({DEVICES})", timeout=30).stdout if nccl else ""
    devices = parse_devices(listed)
    counts = {"gpus": sum(bool(re.fullmatch(r"/dev/nvidia\d+", p)) for p, *_ in devices),
              "rdma": sum(p.startswith("/dev/infiniband/uverbs") for p, *_ in devices)}
    flash_mount = doc["flash"]["mount"]
    # In validate's own folder on the tier (test_storage's probes use it too), never in the users' folders.
    bundle = f"{flash_mount}/{PROBE_DIR}/container-{doc['run_id']}-{group}-{secrets.token_hex(4)}"
    config = base64.b64encode(json.dumps(config_json(flash_mount, nccl and nccl["path"], devices)).encode())
    try:
        dirs, files = mount_points(flash_mount, nccl and nccl["path"])
        made = run(builder, ROOTFS.format(bundle=shlex.quote(bundle), tools=" ".join(TOOLS), config=config.decode(),
                                          dirs=" ".join(map(shlex.quote, dirs)),
                                          files=" ".join(map(shlex.quote, files))), timeout=120)
        assert made.rc == 0 and made.stdout.strip().endswith("ok"), (
            f"{pair[0]}: making the bundle {bundle} failed: {(made.stderr or made.stdout).strip()[-500:]}")
        handoff = f"{bundle}/handoff"
        mk = run(builder, f"mkdir -p {shlex.quote(handoff)}", timeout=30)
        assert mk.rc == 0, f"{pair[0]}: mkdir {handoff}: {mk.stderr.strip()[-300:]}"
        script = JOB.format(handoff=shlex.quote(handoff), nccl_conf=shlex.quote(nccl["path"] if nccl else "/dev/null"))
        srun = (f"cd /tmp && srun -N2 -n2 -l -J gpc-validate-container --immediate=30 -t 5 --mem={MEM_MB} "
                f"-w {','.join(pair)} --container={shlex.quote(bundle)} sh -c {shlex.quote(script)}")
        res = run(ctx.slurm_host(), srun, timeout=240)
    finally:
        run(builder, f"rm -rf {shlex.quote(bundle)}", timeout=60)
    if res.rc != 0 and BUSY.search(res.stderr or ""):
        pytest.skip(f"node group {group}: {','.join(pair)} were taken by another job before the container job "
                    f"started; it waits behind no job ({(res.stderr or '').strip()[-200:]})")
    tasks = parse_tasks(res.stdout)
    problems = ([f"srun exited {res.rc}: {(res.stderr or '').strip()[-600:]}"] if res.rc != 0 else []) + job_problems(
        tasks, mem_mb=MEM_MB, nccl_sha256=nccl and nccl["sha256"], devices=counts)
    assert not problems, (f"node group {group}: a container job on {','.join(pair)} "
                          f"(srun --container, from {ctx.controller}): " + "; ".join(problems))
