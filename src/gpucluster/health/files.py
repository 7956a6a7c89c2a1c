"""Everything the slurm_health role installs, as text, from one compiled cluster: the node scripts
(package data under health/node/), each compute group's config, the HealthCheckProgram wrapper, the
active checks' job scripts and timer, and the slurm.conf lines the lead's template adds.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpucluster.cluster import Cluster
from gpucluster.health import active
from gpucluster.health.config import SITE_DIR, STATE_DIR, node_configs
from gpucluster.health.node import FILES
from gpucluster.health.slurmconf import CONFIG, LIB_DIR, PROGRAM, slurm_conf_lines
from gpucluster.render import environment
from gpucluster.spec.stacks import RUN_MARGIN_S

NODE_DIR = Path(__file__).resolve().parent / "node"


def node_scripts() -> dict[str, str]:
    """{file name: text} of the node side, read from the package (they run there as they are here)."""
    return {name: (NODE_DIR / name).read_text() for name in FILES}


def config_text(config: dict) -> str:
    return json.dumps(config, indent=1, sort_keys=True) + "\n"


def timer_units(cluster: Cluster) -> dict[str, str]:
    """The compute nodes' own timer: the checks run even where slurmd cannot reach slurmctld."""
    health = cluster.spec.health
    ctx = {"cluster": cluster.name, "program": PROGRAM, "interval": health.interval,
           "run_budget": health.check_timeout + RUN_MARGIN_S}
    env = environment()
    return {unit: env.get_template(f"health/{unit}.j2").render(ctx)
            for unit in ("gpucluster-health.service", "gpucluster-health.timer")}


def role_data(cluster: Cluster) -> dict:
    """Plain data for the slurm_health role (the gpucluster_health filter)."""
    wrapper = environment().get_template("health/gpucluster-health.sh.j2").render(
        {"cluster": cluster.name, "lib_dir": LIB_DIR, "config": CONFIG})
    return {
        "enabled": cluster.spec.health.enabled,
        "paths": {"lib_dir": LIB_DIR, "config": CONFIG, "program": PROGRAM, "state_dir": STATE_DIR,
                  "site_dir": SITE_DIR},
        "scripts": node_scripts(),
        "wrapper": wrapper,
        "configs": {group: config_text(c) for group, c in node_configs(cluster).items()},
        "units": timer_units(cluster),
        "slurm_conf": slurm_conf_lines(cluster),
        "active": active.files(cluster),
    }


def render_all(cluster: Cluster) -> dict[str, str]:
    """{file name: text} for `gpucluster health render`: what the role would install, for review."""
    data = role_data(cluster)
    out = dict(data["scripts"])
    out["gpucluster-health"] = data["wrapper"]
    out |= {f"config-{group}.json": text for group, text in data["configs"].items()}
    out |= data["units"]
    out["slurm.conf.health"] = "".join(f"{line}\n" for line in data["slurm_conf"])
    out |= {Path(path).name: text for path, text in data["active"].items()}
    return out
