"""Hardware catalog: the parts a spec may name, with the facts the planner and renderer need.

Keys are what a spec writes (`gpu: h100-sxm5-80g`). A spec can add or override entries under
`catalog:`; those are validated by the same models as the built-ins.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from gpucluster.fields import MAX_LIST, MAX_PORTS, MAX_SPEED_GBPS, Int, Label, PartKey, Text

# Bounds: a part is consumed by the planner (port counts, divisors of uplinks), gres.conf (GPU counts),
# bom.csv and the racks sum (rack units), so each number is bounded by what those can mean.
Fabric = Literal["infiniband", "roce"]
PortSpeed = Annotated[int, Strict(), Field(ge=1, le=MAX_SPEED_GBPS)]
PortCount = Annotated[int, Strict(), Field(ge=1, le=MAX_PORTS)]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuModel(_Part):
    vendor: Text = Field(pattern="^(nvidia|amd)$")
    name: Label
    memory_gb: Int = Field(ge=1, le=4096)
    slurm_type: Text = Field(pattern=r"^[a-z0-9_]+$", max_length=64,
                             description="GRES type; a substring of the detected name")
    allowed_per_node: tuple[Annotated[int, Strict(), Field(ge=1, le=16)], ...] = Field(
        min_length=1, max_length=16, description="GPU counts the platform is built with (gpus_per_node <= 16)")
    devices_per_card: Int = Field(default=1, ge=1, le=8, description="MI250X: 2 GCDs per card, each a GPU to Slurm")


class NicModel(_Part):
    name: Label
    speed_gbps: PortSpeed
    fabrics: tuple[Fabric, ...] = Field(min_length=1, max_length=2, description="infiniband and/or roce")
    hca_prefix: Text = Field(default="mlx5_", pattern=r"^[A-Za-z0-9_.-]*$", max_length=32,
                             description="lands in nccl-env.sh")


class SwitchModel(_Part):
    name: Label
    ports: dict[PortSpeed, PortCount] = Field(min_length=1, max_length=8,
                                              description="link speed in Gb/s -> port count at that speed")
    fabrics: tuple[Fabric, ...] = Field(min_length=1, max_length=2)
    rack_units: Int = Field(default=1, ge=1, le=64, description="a rack is at most 52U; a director spans one")

    def radix(self, speed_gbps: int) -> int:
        return self.ports.get(speed_gbps, 0)


GPUS: dict[str, GpuModel] = {
    "h100-sxm5-80g": GpuModel(vendor="nvidia", name="NVIDIA H100 SXM5 80GB", memory_gb=80, slurm_type="h100",
                              allowed_per_node=(4, 8)),
    "h200-sxm-141g": GpuModel(vendor="nvidia", name="NVIDIA H200 SXM 141GB", memory_gb=141, slurm_type="h200",
                              allowed_per_node=(4, 8)),
    "a100-sxm4-80g": GpuModel(vendor="nvidia", name="NVIDIA A100 SXM4 80GB", memory_gb=80, slurm_type="a100",
                              allowed_per_node=(4, 8)),
    # Four cards, each two GCDs: Slurm and ROCm see 8 GPUs of 64 GB.
    "mi250x": GpuModel(vendor="amd", name="AMD Instinct MI250X (GCD)", memory_gb=64, slurm_type="mi250x",
                       allowed_per_node=(2, 4, 6, 8), devices_per_card=2),
    "mi300x": GpuModel(vendor="amd", name="AMD Instinct MI300X 192GB", memory_gb=192, slurm_type="mi300x",
                       allowed_per_node=(8,)),
}

NICS: dict[str, NicModel] = {
    "cx6-hdr-200g": NicModel(name="NVIDIA ConnectX-6 HDR 200G", speed_gbps=200, fabrics=("infiniband", "roce")),
    "cx7-ndr-400g": NicModel(name="NVIDIA ConnectX-7 NDR 400G", speed_gbps=400, fabrics=("infiniband",)),
    "cx7-400gbe": NicModel(name="NVIDIA ConnectX-7 400GbE", speed_gbps=400, fabrics=("roce",)),
    "bf3-400gbe": NicModel(name="NVIDIA BlueField-3 400GbE", speed_gbps=400, fabrics=("roce",)),
    # Staging stand-in: the container's virtual ethernet. Nothing RDMA about it.
    "veth-staging": NicModel(name="staging stand-in (virtual ethernet)", speed_gbps=10,
                             fabrics=("roce", "infiniband"), hca_prefix="veth"),
}

SWITCHES: dict[str, SwitchModel] = {
    "qm8700": SwitchModel(name="NVIDIA Quantum QM8700 HDR", ports={200: 40}, fabrics=("infiniband",)),
    "qm9700": SwitchModel(name="NVIDIA Quantum-2 QM9700 NDR", ports={400: 64, 200: 128}, fabrics=("infiniband",)),
    "sn5600": SwitchModel(name="NVIDIA Spectrum-4 SN5600", ports={800: 64, 400: 128}, fabrics=("roce",),
                          rack_units=2),
    # A 16-slot 7800R3-class modular chassis with 36 x 400G line cards.
    "arista-7800r3": SwitchModel(name="Arista 7816R3-class modular", ports={400: 576}, fabrics=("roce",),
                                 rack_units=29),
    "wedge400": SwitchModel(name="OCP Wedge400", ports={400: 32}, fabrics=("roce",)),
    "minipack2": SwitchModel(name="OCP Minipack2", ports={200: 128, 400: 64}, fabrics=("roce",), rack_units=4),
    # Staging stand-in: a podman network bridge has no port limit worth modelling.
    "staging-bridge": SwitchModel(name="staging stand-in (podman bridge)", ports={10: 64},
                                  fabrics=("roce", "infiniband")),
}


class Catalog(BaseModel):
    """The merged catalog a spec sees: built-ins plus the spec's own entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpus: dict[PartKey, GpuModel] = Field(default_factory=dict, max_length=MAX_LIST)
    nics: dict[PartKey, NicModel] = Field(default_factory=dict, max_length=MAX_LIST)
    switches: dict[PartKey, SwitchModel] = Field(default_factory=dict, max_length=MAX_LIST)

    def merged(self) -> Catalog:
        return Catalog(gpus={**GPUS, **self.gpus}, nics={**NICS, **self.nics},
                       switches={**SWITCHES, **self.switches})
