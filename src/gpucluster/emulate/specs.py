"""Specs of a chosen size for emulation and benchmarks, derived from the examples.

The emulator never invents nodes: to emulate N nodes, render a spec with N compute nodes. These
helpers take an example spec, change only the compute node counts (and, where asked, fabric
fields), write the YAML, and render it with the project's one renderer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpucluster.cluster import load_cluster
from gpucluster.fabric import Plan
from gpucluster.paths import examples_dir
from gpucluster.render import render_all, write_outputs
from gpucluster.spec.model import ClusterSpec


def scaled_spec(
    example: str | Path,
    counts: Mapping[str, int],
    *,
    name: str | None = None,
    fabric: Mapping[str, Any] | None = None,
    slurm: Mapping[str, Any] | None = None,
) -> str:
    """YAML text of ``example`` with node group counts (by group name) and fabric/slurm fields replaced."""
    path = Path(example)
    if not path.exists():
        path = examples_dir() / f"{example}.yaml"
    data = yaml.safe_load(path.read_text())
    groups = {g["name"]: g for g in data["node_groups"]}
    for group, count in counts.items():
        if group not in groups:
            raise KeyError(f"{path}: no node group '{group}' (has {', '.join(groups)})")
        groups[group]["count"] = count
    if name:
        data["name"] = name
    data["fabric"].update(fabric or {})
    data["slurm"].update(slurm or {})
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)


@dataclass
class Rendered:
    spec: ClusterSpec
    plan: Plan
    conf_dir: Path
    sizes: dict[str, int]
    render_s: float


def render_spec(spec_path: Path, outdir: Path, *, cabling: bool = False) -> Rendered:
    t0 = time.perf_counter()
    cluster = load_cluster(spec_path)
    sizes = write_outputs(render_all(cluster, cabling=cabling), outdir)
    return Rendered(cluster.spec, cluster.plan, outdir, sizes, time.perf_counter() - t0)


def write_and_render(yaml_text: str, workdir: Path, stem: str) -> Rendered:
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / f"{stem}.yaml"
    spec_path.write_text(yaml_text)
    return render_spec(spec_path, workdir / stem)
