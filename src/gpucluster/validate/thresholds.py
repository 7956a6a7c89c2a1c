"""NCCL/RCCL all_reduce bus bandwidth a healthy node must reach, per GPU SKU x fabric x GPUs per node.

Defaults are what operators use for one node at large message sizes (nccl-tests all_reduce_perf,
busbw): 8 x H100 ~ 460 GB/s, 8 x H200 ~ 431 GB/s, 8 x MI300X (RCCL) ~ 314 GB/s. On one node the
traffic stays on NVLink / Infinity Fabric, so the fabric column is '*' unless a user pins it; a
thresholds file (`gpucluster validate --thresholds FILE`) adds or replaces rows:

    nccl_busbw_gbps:
      - {gpu: h100-sxm5-80g, fabric: "*", gpus: 8, busbw: 440}
      - {gpu: a100-sxm4-80g, fabric: infiniband, gpus: 8, busbw: 225}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from gpucluster.errors import UsageError


@dataclass(frozen=True)
class Threshold:
    gpu: str  # catalog key, as the spec writes it
    fabric: str  # infiniband, roce or '*'
    gpus: int  # GPUs per node the figure is for
    busbw: float  # GB/s, minimum all_reduce bus bandwidth at large sizes


DEFAULTS: tuple[Threshold, ...] = (
    Threshold("h100-sxm5-80g", "*", 8, 460.0),
    Threshold("h200-sxm-141g", "*", 8, 431.0),
    Threshold("mi300x", "*", 8, 314.0),
)


def load_thresholds(path: str | Path | None) -> list[Threshold]:
    """Defaults, with rows from the file replacing those with the same (gpu, fabric, gpus)."""
    rows = {(t.gpu, t.fabric, t.gpus): t for t in DEFAULTS}
    if path:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"{p}: cannot read thresholds ({exc})") from None
        items = data.get("nccl_busbw_gbps") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise UsageError(f"{p}: expected a list under 'nccl_busbw_gbps:' (see docs/validate.md)")
        for i, item in enumerate(items):
            try:
                t = Threshold(gpu=str(item["gpu"]), fabric=str(item.get("fabric", "*")),
                              gpus=int(item["gpus"]), busbw=float(item["busbw"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise UsageError(f"{p}: nccl_busbw_gbps[{i}]: needs gpu, gpus and busbw (GB/s), "
                                 f"fabric optional ({exc})") from None
            if t.fabric not in ("*", "infiniband", "roce") or t.busbw <= 0 or t.gpus < 1:
                raise UsageError(f"{p}: nccl_busbw_gbps[{i}]: fabric must be infiniband, roce or '*', "
                                 "busbw > 0 and gpus >= 1")
            rows[(t.gpu, t.fabric, t.gpus)] = t
    return list(rows.values())


def threshold_for(table: list[Threshold], gpu: str, fabric: str, gpus: int) -> Threshold | None:
    """The most specific row: an exact fabric beats '*'. None when the table has no row."""
    exact = [t for t in table if t.gpu == gpu and t.gpus == gpus and t.fabric == fabric]
    if exact:
        return exact[-1]
    wild = [t for t in table if t.gpu == gpu and t.gpus == gpus and t.fabric == "*"]
    return wild[-1] if wild else None


def as_dict(t: Threshold | None) -> dict | None:
    return asdict(t) if t else None
