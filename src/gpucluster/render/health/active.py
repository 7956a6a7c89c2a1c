"""Active health checks (DCGM diag, NCCL all_reduce, IB bandwidth): which nodes each runs on, as
low-priority Slurm jobs capped by the gpc_active license, and the job scripts.

Why jobs and not HealthCheckProgram: these checks take minutes and the GPUs or links to themselves, so
Slurm must schedule them like work, behind real jobs (nice) and never on more than share_pct of the
nodes at once (the license count). docs/health.md.
"""

from __future__ import annotations

from gpucluster.cluster import Cluster
from gpucluster.render.health.config import STATE_DIR
from gpucluster.render.health.slurmconf import LIB_DIR, LICENSE, PROGRAM, active_partition, license_count
from gpucluster.render.templating import environment

SUBMIT = f"{LIB_DIR}/active-submit.sh"
NCCL_TESTS_DIR = "/opt/nccl-tests"  # the nccl role's nccl_tests_dir default
IB_FLOOR = 0.9  # ib_write_bw must reach this share of the planned link rate
IB_PORT = 18515  # ib_write_bw's default port; HCA i of a job uses IB_PORT + i (the servers run at once)


def tool_seconds(limit_s: int) -> int:
    """How long the check's tool may run inside a job of `limit_s` seconds."""
    return max(1, limit_s - min(60, limit_s // 2))


def _script(check: str, group: str) -> str:
    return f"{LIB_DIR}/active-{check}-{group}.sh"


def slurm_seconds(limit: str) -> int:
    """Slurm's time format: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]."""
    days, _, rest = limit.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
        return ((int(days) * 24 + h) * 60 + m) * 60 + s
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


def jobs(cluster: Cluster) -> list[dict]:
    """One entry per active check: the node sets it is queued on (single nodes; pairs under one leaf
    for ib-bandwidth), GPUs and HCAs per node."""
    spec, plan = cluster.spec, cluster.plan
    part = next(p for p in spec.slurm.partitions if p.name == active_partition(cluster))
    groups = [spec.group(g) for g in part.groups]
    out = []
    for check in spec.health.active.checks:
        if check in ("dcgm-diag", "nccl-allreduce"):
            vendor = "nvidia" if check == "dcgm-diag" else None
            for g in groups:
                model = spec.parts.gpus.get(g.gpu or "")
                if model is None or not g.gpus_per_node or (vendor and model.vendor != vendor):
                    continue
                out.append({"check": check, "group": g.name, "nodes": 1, "gpus": g.gpus_per_node, "hcas": [],
                            "node_sets": list(g.hosts), "script": _script(check, g.name)})
        elif check == "ib-bandwidth":
            for g in groups:
                if g not in spec.fabric_groups or not spec.parts.nics[g.nic].rdma:
                    continue
                pairs = []
                for unit in (u for u in plan.units if u.group == g.name):
                    hosts = [g.host(unit.first + i) for i in range(unit.count)]
                    pairs += [f"{a},{b}" for a, b in zip(hosts[::2], hosts[1::2], strict=False)]
                out.append({"check": check, "group": g.name, "nodes": 2, "gpus": 0, "hcas": plan.hcas(g),
                            "node_sets": pairs, "script": _script(check, g.name)})
    return out


def _ctx(cluster: Cluster) -> dict:
    spec, active = cluster.spec, cluster.spec.health.active
    limit_s = slurm_seconds(active.time_limit)
    return {"cluster": spec.name, "license": LICENSE, "licenses": license_count(cluster), "nice": active.nice,
            "time_limit": active.time_limit, "every_hours": active.every_hours, "program": PROGRAM,
            "submit": SUBMIT, "state_dir": STATE_DIR, "nccl_tests_dir": NCCL_TESTS_DIR,
            "partition": active.partition or "", "min_busbw": active.nccl_min_busbw_gbps or "",
            "min_gbits": round(cluster.plan.speed_gbps * IB_FLOOR, 1),
            "ib_port": IB_PORT,
            # the tool's own budget: the job's limit less a minute (half of a limit under two) for srun and
            # the reports, so a hung tool is killed and still reported before Slurm ends the job
            "seconds": tool_seconds(limit_s)}


def files(cluster: Cluster) -> dict[str, str]:
    """{path on the controller: text} of the job scripts, the submitter and its timer; {} without checks."""
    if not cluster.spec.health.active.checks:
        return {}
    env = environment()
    ctx = _ctx(cluster)
    all_jobs = jobs(cluster)
    out = {}
    for job in all_jobs:
        out[job["script"]] = env.get_template("health/active-job.sh.j2").render({**ctx, "job": job})
    out[SUBMIT] = env.get_template("health/active-submit.sh.j2").render({**ctx, "jobs": all_jobs})
    for unit in ("gpucluster-health-active.service", "gpucluster-health-active.timer"):
        out[f"/etc/systemd/system/{unit}"] = env.get_template(f"health/{unit}.j2").render(ctx)
    return out
