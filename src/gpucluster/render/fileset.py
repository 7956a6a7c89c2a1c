"""Render every output of a plan, and write them as one set (gpucluster.outputs)."""

from __future__ import annotations

import csv
import io
import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from gpucluster import slurmtext
from gpucluster.cluster import Cluster
from gpucluster.errors import UsageError
from gpucluster.fabric.cabling import CABLING_HEADER, bom_rows, cabling_rows
from gpucluster.fabric.summary import plan_summary
from gpucluster.outputs import write_set
from gpucluster.render.containers import render_containers
from gpucluster.render.drivers import render_drivers
from gpucluster.render.health.rolefiles import generated as health_files
from gpucluster.render.ibtopo import topofile
from gpucluster.render.imex import render_imex
from gpucluster.render.metrics import render_metrics
from gpucluster.render.nccl import gpu_environment, nccl_settings
from gpucluster.render.roce import render_roce
from gpucluster.render.slurm import slurm_context
from gpucluster.render.slurmunits import render_slurm_units
from gpucluster.render.storage import render_storage
from gpucluster.render.switch import switch_files
from gpucluster.render.templating import environment
from gpucluster.spec.model import NodeGroup

# A value is text, or a function yielding text chunks (for outputs too big to hold twice in memory).
Output = str | Callable[[], Iterable[str]]


def render_slurm(cluster: Cluster) -> dict[str, str]:
    env = environment()
    ctx = slurm_context(cluster)
    out = {
        "slurm.conf": env.get_template("slurm/slurm.conf.j2").render(ctx),
        "gres.conf": env.get_template("slurm/gres.conf.j2").render(ctx),
        "cgroup.conf": env.get_template("slurm/cgroup.conf.j2").render(ctx),
    }
    for name, template in ctx["topology_files"].items():  # topology.conf, or topology.yaml from 25.05
        out[name] = env.get_template(template).render(ctx)
    if cluster.dbd_host:
        out["slurmdbd.conf"] = env.get_template("slurm/slurmdbd.conf.j2").render(ctx)
    return out


def _nccl_for(cluster: Cluster, group: NodeGroup) -> tuple[str, str]:
    env = environment()
    ctx = {"spec": cluster.spec, "group": group, "settings": nccl_settings(cluster, group),
           "environment": gpu_environment(cluster, group), "vendor": cluster.gpu_vendor(group)}
    return (env.get_template("nccl/nccl.conf.j2").render(ctx), env.get_template("nccl/nccl-env.sh.j2").render(ctx))


def nccl_texts(cluster: Cluster) -> dict[str, tuple[str, str, str, str]]:
    """Per GPU compute group: (nccl.conf name, env script name, their texts). One shared pair of names
    when every group renders the same text, else one pair per group."""
    rendered = {g.name: _nccl_for(cluster, g) for g in cluster.spec.gpu_groups if g.role == "compute"}
    shared = len(set(rendered.values())) <= 1
    return {name: (("nccl.conf", "nccl-env.sh") if shared else (f"nccl.{name}.conf", f"nccl-env.{name}.sh")) + texts
            for name, texts in rendered.items()}


def nccl_file_for(cluster: Cluster, group: NodeGroup) -> tuple[str, str]:
    """(nccl.conf name, env script name) a node of this group takes from the render output."""
    conf, env, _c, _e = nccl_texts(cluster)[group.name]
    return conf, env


def render_nccl(cluster: Cluster) -> dict[str, str]:
    out = {}
    for conf_name, env_name, conf, env in nccl_texts(cluster).values():
        out[conf_name] = conf
        out[env_name] = env
    return out


def profile_differences(cluster: Cluster) -> list[dict]:
    """slurm.conf settings where the spec's profile differs from production, from the renderer itself
    (the validator reports each: a staged cluster's differences are said, never passed silently)."""
    spec = cluster.spec
    if spec.slurm.profile == "production":
        return []
    prod_spec = spec.model_copy(update={"slurm": spec.slurm.model_copy(update={"profile": "production"})})
    prod_cluster = Cluster(cluster.loaded.model_copy(update={"spec": prod_spec}), cluster.plan)
    actual = slurmtext.settings(render_slurm(cluster)["slurm.conf"])
    prod = slurmtext.settings(render_slurm(prod_cluster)["slurm.conf"])
    return [{"key": k, "production": prod.get(k), "rendered": actual.get(k)}
            for k in sorted(set(actual) | set(prod)) if actual.get(k) != prod.get(k)]


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def render_all(cluster: Cluster, *, cabling: bool = True) -> dict[str, Output]:
    """Every file `gpucluster render` writes, by name. Config files come from templates/ only: Slurm, NCCL,
    the RoCE settings (render/roce.py), the storage tiers' daemon configs and mount units (render/storage.py),
    the driver stacks' apt sources, pins and unit drop-ins (render/drivers.py)."""
    plan = cluster.plan
    out: dict[str, Output] = {}
    out.update(render_slurm(cluster))
    out.update(render_nccl(cluster))
    out.update(render_roce(cluster))
    out.update(render_storage(cluster))
    out["bom.csv"] = _csv(bom_rows(plan))
    out["plan.json"] = json.dumps(plan_summary(plan), indent=2) + "\n"
    out.update(switch_files(cluster.spec, plan))
    out.update(health_files(cluster))
    out.update(render_imex(cluster))  # IMEX nodes_config per NVLink domain (render/imex.py)
    out.update(render_drivers(cluster))
    out.update(render_containers(cluster))  # oci.conf, plugstack, pyxis, enroot, pins (render/containers.py)
    out.update(render_metrics(cluster))  # Prometheus config, rules, alerts, targets; Grafana (render/metrics.py)
    out.update(render_slurm_units(cluster))  # the plan's units for the controller's Slurm metrics
    if cabling:
        out["cabling.csv"] = lambda: _chain(CABLING_HEADER, cabling_rows(plan))
        if cluster.spec.fabric.type == "infiniband":
            out["fabric.topo"] = lambda: topofile(plan)  # for ibdiagnet -t: the planned cables, streamed
    return out


def _chain(first: str, rest: Iterable[str]) -> Iterable[str]:
    yield first
    yield from rest


# A streamed file is written in runs of at least this many characters: one encode, hash update, write and
# signal check per run rather than per chunk (Colossus 200k's cabling.csv comes as 3,528 chunks of 2-45 kB).
# Runs of 64-256 kB measured fastest; runs of megabytes were slower (each a fresh buffer to fault in).
RUN_CHARS = 1 << 18


def _runs(chunks: Iterable[str], size: int = RUN_CHARS) -> Iterator[str]:
    run: list[str] = []
    n = 0
    for chunk in chunks:
        run.append(chunk)
        n += len(chunk)
        if n >= size:
            yield "".join(run)
            run, n = [], 0
    if run:
        yield "".join(run)


_END = object()


def made_ahead(make: Callable[[], Iterable[str]], depth: int = 2) -> Iterator[bytes]:
    """The runs of a streamed file, encoded, made on a thread of their own up to `depth` runs ahead of the
    caller. The caller (outputs' writer) hashes and writes each run, and both release the GIL, so on a second
    core making the next run overlaps writing this one (Colossus 200k's cabling.csv: 27 MB). What the maker
    raises is raised here; when the caller stops early (an error, a signal), the thread stops at its next run."""
    ready: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def hand(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for run in _runs(make()):
                if not hand(run.encode()):
                    return
        except BaseException as exc:  # handed to the caller, raised there
            hand(exc)
            return
        hand(_END)

    thread = threading.Thread(target=work, name="gpucluster-render-ahead", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def write_outputs(files: dict[str, Output], outdir: Path) -> dict[str, int]:
    """Write all files as one set, or change nothing (`gpucluster.outputs`): readers of outdir see the
    old set or the new one, files an earlier render wrote and this one does not are removed, the user's
    own files stay. Returns sizes in bytes."""
    files = {name: (lambda value=value: made_ahead(value)) if callable(value) else value
             for name, value in files.items()}
    try:
        return write_set(outdir, files).sizes
    except UsageError as exc:
        raise UsageError(f"{exc} (the output folder given with -o)") from None
