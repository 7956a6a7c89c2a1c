"""The Slurm jobs of `fabric test`: what each node runs, and the srun line that pins it to its nodes.

Every case is one job (`srun --nodelist=a,b`, an allocation and its step; `--label` tags each line
with its task). Three kinds of task script:

- probe: what a node has (GPUs on the PCI bus, HCAs in /sys/class/infiniband, the test tools), so the
  transport is chosen from the hosts themselves, never from a "staged" flag;
- ring (iperf3, ib_write_bw): every node of the case serves one stream and sends one to the node the
  case names after it. A pair is a ring of two, so both directions cross the link at once (a fault in
  one direction shows); the whole-cluster case sends node i to node i + N/2, so every stream crosses
  the middle of the fabric. ib_write_bw runs one instance per HCA (rail) at once and the case sums them;
- nccl: all_reduce_perf on every GPU of the case's nodes (MPI through srun), NCCL_IB_HCA pinned to one
  HCA for a single-rail case.

Ports come from the job id (both ends know it, and a stale server of an earlier job never answers).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from gpucluster.fabric.asbuilt.tooloutput import MARK

JOB_NAME = "gpucluster-fabric-test"
CASE_MARK = "@@gpucluster-case"  # the round script's line before each case's output
# GPU vendors and PCI classes: the same scan as the nvidia_gpu, amd_gpu and nccl roles (display, 3D,
# processing accelerator); device files alone prove nothing (staged nodes carry stand-in /dev/nvidiaN).
GPU_PCI = (("0x10de", ("0x0300", "0x0302")), ("0x1002", ("0x0300", "0x0302", "0x0380", "0x1200")))


@dataclass(frozen=True)
class Settings:
    """How the jobs run: the tool's duration, Slurm's limits, where the tools are."""

    seconds: int = 3  # iperf3 -t / ib_write_bw -D
    time_limit_min: int = 10
    immediate_s: int = 120  # srun --immediate: give up when the nodes are not free by then
    partition: str = ""
    srun_args: str = ""  # extra srun options, e.g. --reservation=maint
    parallel: int = 64  # jobs of one round in flight at once
    mpi: str = "pmix"  # srun --mpi for all_reduce_perf
    nccl_binary: str = "/opt/nccl-tests/build/all_reduce_perf"
    nccl_env: str = "/etc/profile.d/gpucluster-nccl.sh"
    nccl_bytes: str = "8G"
    gpus_per_node: dict[str, int] = field(default_factory=dict)  # host -> GPUs (from the spec)
    hcas: dict[str, tuple[str, ...]] = field(default_factory=dict)  # host -> HCA names, rail order


def ring_links(nodes: tuple[str, ...]) -> list[tuple[str, str]]:
    """Who sends to whom: a pair both ways; more nodes node i -> node i + N/2 (across the middle)."""
    n = len(nodes)
    if n == 2:
        return [(nodes[0], nodes[1]), (nodes[1], nodes[0])]
    step = max(1, n // 2)
    return [(nodes[i], nodes[(i + step) % n]) for i in range(n)]


# ---- task scripts (bash, run by srun on every node of the case) ---------------------------------

_HEAD = """set -u
me=${SLURMD_NODENAME:-$(hostname -s)}
job=${SLURM_JOB_ID:-0}
"""

PROBE = _HEAD + f"""echo "{MARK} node=$me job=$job role=probe"
gpus=0
for d in /sys/bus/pci/devices/*; do
  [ -r "$d/vendor" ] && [ -r "$d/class" ] || continue
  case "$(cat "$d/vendor"):$(cat "$d/class")" in
    {"|".join(f"{v}:{c}*" for v, classes in GPU_PCI for c in classes)}) gpus=$((gpus + 1)) ;;
  esac
done
echo "gpus=$gpus"
echo "hcas=$(ls /sys/class/infiniband 2>/dev/null | tr '\\n' ' ')"
for t in iperf3 ib_write_bw; do p=$(command -v "$t") && echo "tool.$t=$p"; done
[ -x "$1" ] && echo "tool.all_reduce_perf=$1"
exit 0
"""

_RING_HEAD = _HEAD + f"""secs=$1; shift
hcas=$1; shift
to=""
for link in "$@"; do [ "${{link%%>*}}" = "$me" ] && to=${{link#*>}}; done
[ -n "$to" ] || {{ echo "$me: not one of this job's links: $*"; exit 3; }}
echo "{MARK} node=$me job=$job role=ring to=$to"
tmp=$(mktemp -d) || exit 3
trap 'rm -rf "$tmp"' EXIT
"""

# iperf3 -J exits 0 even when it could not connect: the JSON's "error" says so.
IPERF3_RING = _RING_HEAD + """port=$((20000 + job % 10000))
timeout $((secs + 90)) iperf3 -s -1 -p "$port" >"$tmp/server" 2>&1 &
server=$!
out=""
for _ in $(seq 1 100); do
  out=$(iperf3 -c "$to" -p "$port" -t "$secs" -i 0 -J 2>&1)
  case "$out" in *"Connection refused"*|*"No route to host"*) sleep 0.2 ;; *) break ;; esac
done
printf '%s\\n' "$out"
case "$out" in
  *'"error"'*|"") kill "$server" 2>/dev/null; exit 1 ;;  # srun --kill-on-bad-exit ends the peer's wait too
esac
wait "$server" || { echo "MARK part=server"; cat "$tmp/server"; }
exit 0
""".replace("MARK", MARK)

IB_WRITE_BW_RING = _RING_HEAD + """base=$((20000 + (job % 1000) * 20))
i=0
for hca in $hcas; do
  timeout $((secs + 90)) ib_write_bw -d "$hca" -p $((base + i)) --report_gbits -F -D "$secs" -q 4 \\
    >"$tmp/server.$i" 2>&1 &
  i=$((i + 1))
done
i=0
for hca in $hcas; do
  (
    for _ in $(seq 1 100); do
      out=$(ib_write_bw -d "$hca" -p $((base + i)) --report_gbits -F -D "$secs" -q 4 "$to" 2>&1) && break
      case "$out" in *"Couldn't connect"*|*"Unable to open file descriptor"*) sleep 0.2 ;; *) break ;; esac
    done
    printf '%s\\n' "$out" >"$tmp/client.$i"
  ) &
  i=$((i + 1))
done
wait
rc=0
i=0
for hca in $hcas; do
  echo "MARK part=$hca"
  cat "$tmp/client.$i"
  grep -q 'BW average\\[' "$tmp/client.$i" || rc=1
  i=$((i + 1))
done
exit $rc
""".replace("MARK", MARK)

NCCL = _HEAD + f"""binary=$1; env=$2; hca=$3; size=$4
echo "{MARK} node=$me job=$job role=rank rank=${{SLURM_PROCID:-0}}"
if [ -r "$env" ]; then . "$env"; fi
if [ -n "$hca" ]; then export NCCL_IB_HCA="=$hca"; fi
exec "$binary" -b "$size" -e "$size" -f 2 -g 1 -n 20 -w 5
"""


# ---- srun lines ---------------------------------------------------------------------------------

def _srun(nodes: tuple[str, ...], s: Settings, tasks_per_node: int = 1, extra: tuple[str, ...] = ()) -> list[str]:
    argv = ["srun", f"--job-name={JOB_NAME}", f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
            f"--ntasks-per-node={tasks_per_node}", "--exclusive", f"--time={s.time_limit_min}",
            f"--immediate={s.immediate_s}", "--kill-on-bad-exit=1", "--label", *extra]
    if s.partition:
        argv.append(f"--partition={s.partition}")
    return argv + shlex.split(s.srun_args)


def probe_argv(nodes: tuple[str, ...], s: Settings) -> list[str]:
    return [*_srun(nodes, s), "bash", "-c", PROBE, "gpucluster-fabric-probe", s.nccl_binary]


def case_argv(transport: str, nodes: tuple[str, ...], rail: int | None, s: Settings) -> list[str]:
    """The srun line of one case (its nodes, and the rail for a single-rail case)."""
    if transport == "nccl":
        gpus = min(s.gpus_per_node.get(n, 1) or 1 for n in nodes)
        hca = s.hcas.get(nodes[0], ())[rail] if rail is not None and rail < len(s.hcas.get(nodes[0], ())) else ""
        return [*_srun(nodes, s, gpus, (f"--mpi={s.mpi}",)), "bash", "-c", NCCL, "gpucluster-fabric-nccl",
                s.nccl_binary, s.nccl_env, hca, s.nccl_bytes]
    links = [f"{a}>{b}" for a, b in ring_links(nodes)]
    if transport == "perftest":
        own = s.hcas.get(nodes[0], ())
        hcas = " ".join([own[rail]] if rail is not None and rail < len(own) else own) or "mlx5_0"
        return [*_srun(nodes, s), "bash", "-c", IB_WRITE_BW_RING, "gpucluster-fabric-ring", str(s.seconds), hcas,
                *links]
    return [*_srun(nodes, s), "bash", "-c", IPERF3_RING, "gpucluster-fabric-ring", str(s.seconds), "", *links]


def round_script(argvs: list[list[str]], parallel: int, token: str = "") -> str:
    """A bash script for the submit host: every srun of a round at once (at most `parallel` in flight),
    each one's output into a private folder, then all of them, each under a `@@gpucluster-case I rc=N`
    line (`@@gpucluster-case/TOKEN I rc=N` with a `token`: a round's secret, which no job can print). One SSH
    session per round, whatever the number of jobs."""
    lines = ["set -u", "umask 077", 'd=$(mktemp -d "${TMPDIR:-/tmp}/gpucluster-fabric.XXXXXX") || exit 3',
             "trap 'rm -rf \"$d\"' EXIT",
             'run() { i=$1; shift; "$@" </dev/null >"$d/$i.out" 2>&1; echo $? >"$d/$i.rc"; }']
    for i, argv in enumerate(argvs):
        lines.append(f"while [ \"$(jobs -rp | wc -l)\" -ge {max(1, parallel)} ]; do wait -n; done")
        lines.append(f"run {i} {shlex.join(argv)} &")
    lines.append("wait")
    lines.append(f"for i in $(seq 0 {len(argvs) - 1}); do")
    lines.append(f'  echo "{_mark(token)} $i rc=$(cat "$d/$i.rc" 2>/dev/null || echo 255)"')
    lines.append('  cat "$d/$i.out" 2>/dev/null')
    lines.append("done")
    return "\n".join(lines) + "\n"


def _mark(token: str) -> str:
    if token and not re.fullmatch(r"[A-Za-z0-9]+", token):
        raise ValueError(f"round token {token!r}: letters and digits only")
    return f"{CASE_MARK}/{token}" if token else CASE_MARK


def split_round(text: str, token: str = "") -> dict[int, tuple[int, str]]:
    """The round script's output: case index -> (srun's exit status, its labelled output). A case line is
    the whole line, with the round's token, in order (case 0, 1, ...): a job prints what it likes (srun
    labels every task line, but not srun's own), and without the token it cannot start a case."""
    case = re.compile(re.escape(_mark(token)) + r" (\d+) rc=(\d+)")
    out: dict[int, tuple[int, list[str]]] = {}
    current = None
    for line in text.splitlines():
        m = case.fullmatch(line)
        if m and int(m.group(1)) == len(out):
            current = len(out)
            out[current] = (int(m.group(2)), [])
        elif current is not None:
            out[current][1].append(line)
    return {i: (rc, "\n".join(lines)) for i, (rc, lines) in out.items()}
