"""Everything the slurm_health role installs, from one compiled cluster: the node scripts (package data
under node/, copied as they are), and the generated files render_all writes (each compute group's
config, the HealthCheckProgram wrapper, the timer units, the active checks' job scripts and timer, the
controller's NVLink domain guard config and timer). The
slurm.conf lines go into slurm.conf itself (render/slurm.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpucluster.cluster import Cluster
from gpucluster.node import FILES, NODE_DIR
from gpucluster.render.health import active, domainconf
from gpucluster.render.health.config import SITE_DIR, STATE_DIR, node_configs, stale_after, timer_period
from gpucluster.render.health.slurmconf import CONFIG, LIB_DIR, PROGRAM, slurm_conf_lines
from gpucluster.render.templating import environment
from gpucluster.spec.stacks import RUN_MARGIN_S


def node_scripts() -> dict[str, str]:
    """{file name: text} of the node side, read from the package (they run there as they are here)."""
    return {name: (NODE_DIR / name).read_text() for name in FILES}


def config_text(config: dict) -> str:
    return json.dumps(config, indent=1, sort_keys=True) + "\n"


def timer_units(cluster: Cluster) -> dict[str, str]:
    """The compute nodes' own timer: the checks run even where slurmd cannot reach slurmctld."""
    health = cluster.spec.health
    ctx = {"cluster": cluster.name, "program": PROGRAM, "interval": health.interval,
           "period": timer_period(health.interval), "stale_after": stale_after(health.interval),
           "run_budget": health.check_timeout + RUN_MARGIN_S}
    env = environment()
    return {unit: env.get_template(f"health/{unit}.j2").render(ctx)
            for unit in ("gpucluster-health.service", "gpucluster-health.timer")}


WRAPPER = "gpucluster-health"


def config_name(group: str) -> str:
    return f"health-config.{group}.json"


def generated(cluster: Cluster) -> dict[str, str]:
    """The health checks' generated files, for render_all: the wrapper slurm.conf names, each compute
    group's config, the node timer units and the active checks' files (by file name)."""
    if not cluster.spec.health.enabled:
        return {}
    out = {WRAPPER: environment().get_template("health/gpucluster-health.sh.j2").render(
        {"cluster": cluster.name, "lib_dir": LIB_DIR, "config": CONFIG})}
    out |= {config_name(group): config_text(c) for group, c in node_configs(cluster).items()}
    out |= timer_units(cluster)
    out |= {Path(path).name: text for path, text in active.files(cluster).items()}
    out |= domainconf.files(cluster)
    return out


def facts(cluster: Cluster) -> dict:
    """What the slurm_health role reads from the compiled facts: where things go, and which rendered file
    (in the compiled rendered/ folder) or node script goes there."""
    health = cluster.spec.health
    return {
        "enabled": health.enabled,
        "paths": {"lib_dir": LIB_DIR, "config": CONFIG, "program": PROGRAM, "state_dir": STATE_DIR,
                  "site_dir": SITE_DIR},
        "scripts_dir": str(NODE_DIR),
        "scripts": list(FILES),
        "wrapper": WRAPPER,
        "configs": {group: config_name(group) for group in node_configs(cluster)} if health.enabled else {},
        "units": list(timer_units(cluster)) if health.enabled else [],
        "active": {path: Path(path).name for path in active.files(cluster)} if health.enabled else {},
        # the controller's NVLink domain guard: {destination: rendered file}; {} without NVLink domains
        "domain_guard": ({domainconf.CONFIG: domainconf.CONFIG_NAME}
                         | {f"/etc/systemd/system/{u}": u for u in domainconf.UNITS}) if domainconf.enabled(cluster)
        else {},
        "slurm_conf": slurm_conf_lines(cluster),
    }


def review_files(cluster: Cluster) -> dict[str, str]:
    """{file name: text} for `gpucluster health render`: what the role would install, for review."""
    out = dict(node_scripts()) | generated(cluster)
    out["slurm.conf.health"] = "".join(f"{line}\n" for line in slurm_conf_lines(cluster))
    return out
