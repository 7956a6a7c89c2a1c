"""Hardware catalog: the parts a spec may name, with the facts the planner and renderer need.

Keys are what a spec writes (`gpu: h100-sxm5-80g`). A spec can add or override entries under
`catalog:`; those are validated by the same models as the built-ins.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from gpucluster.fields import MAX_LIST, MAX_PORTS, MAX_SPEED_GBPS, Bool, Int, Label, PartKey, Text

# Bounds: a part is consumed by the planner (port counts, divisors of uplinks), gres.conf (GPU counts),
# bom.csv and the racks sum (rack units), so each number is bounded by what those can mean.
Fabric = Literal["infiniband", "roce"]
PortSpeed = Annotated[int, Strict(), Field(ge=1, le=MAX_SPEED_GBPS)]
PortCount = Annotated[int, Strict(), Field(ge=1, le=MAX_PORTS)]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NvlinkRack(_Part):
    """A rack whose compute trays share one NVLink domain through the rack's own NVLink switch trays
    (GB200/GB300 NVL72). The switch trays are part of the rack, not of the scale-out fabric."""

    compute_trays: Int = Field(ge=1, le=72, description="compute trays (nodes) in one domain")
    gpus_per_tray: Int = Field(ge=1, le=8, description="GPUs of one compute tray")
    switch_trays: Int = Field(ge=0, le=72, description="NVLink switch trays in the rack")
    switch_chips_per_tray: Int = Field(default=2, ge=1, le=8)
    links_per_gpu: Int | None = Field(default=None, ge=1, le=64, description="NVLink links of one GPU")
    link_mbytes_per_s: Int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="one link's rate as `nvidia-smi nvlink -s` reports it, in MB/s (53.125 GB/s -> 53125)")
    links_source: Text | None = Field(default=None, max_length=512,
                                      description="where links_per_gpu and link_mbytes_per_s were published")
    trays_below_switches: Int | None = Field(
        default=None, ge=0, le=72,
        description="compute trays under the NVLink switch trays (1U each), the rest above; default: all under")

    @property
    def gpus(self) -> int:
        return self.compute_trays * self.gpus_per_tray


class GpuModel(_Part):
    vendor: Text = Field(pattern="^(nvidia|amd)$")
    name: Label
    memory_gb: Int = Field(ge=1, le=4096)
    slurm_type: Text = Field(pattern=r"^[a-z0-9_]+$", max_length=64,
                             description="GRES type; a substring of the detected name")
    allowed_per_node: tuple[Annotated[int, Strict(), Field(ge=1, le=16)], ...] = Field(
        min_length=1, max_length=16, description="GPU counts the platform is built with (gpus_per_node <= 16)")
    devices_per_card: Int = Field(default=1, ge=1, le=8, description="MI250X: 2 GCDs per card, each a GPU to Slurm")
    nvswitch_at: tuple[Annotated[int, Strict(), Field(ge=1, le=16)], ...] = Field(
        default=(), max_length=16,
        description="GPU counts whose baseboard joins the GPUs through NVSwitch (needs Fabric Manager)")
    host_arch: Literal["x86_64", "arm64"] = Field(
        default="x86_64", description="the CPU architecture of the nodes built with it (Grace trays: arm64)")
    nvlink_domain: NvlinkRack | None = Field(
        default=None, description="rack-scale NVLink (NVL72): the rack the GPU's compute trays share one domain in")
    # A catalog GPU without a height: 8U, the air-cooled 8-GPU server's, as DGX H100 (NVIDIA DGX H100/H200 User
    # Guide, mechanical specifications).
    rack_units: Int = Field(default=8, ge=1, le=64,
                            description="height of one server (compute tray) built with it, in rack units (U)")


class NicModel(_Part):
    name: Label
    speed_gbps: PortSpeed
    fabrics: tuple[Fabric, ...] = Field(min_length=1, max_length=2, description="infiniband and/or roce")
    hca_prefix: Text = Field(default="mlx5_", pattern=r"^[A-Za-z0-9_.-]*$", max_length=32,
                             description="lands in nccl-env.sh")
    rdma: Bool = Field(default=True, description="an RDMA device (/sys/class/infiniband): health-checked")


class SwitchModel(_Part):
    name: Label
    vendor: Text = Field(default="generic", pattern=r"^[a-z][a-z0-9-]*$", max_length=32,
                         description="picks the switch-side config flavour: arista -> EOS, others -> SONiC")
    ports: dict[PortSpeed, PortCount] = Field(min_length=1, max_length=8,
                                              description="link speed in Gb/s -> port count at that speed")
    fabrics: tuple[Fabric, ...] = Field(min_length=1, max_length=2)
    rack_units: Int = Field(default=1, ge=1, le=64, description="a rack is at most 52U; a director spans one")

    def radix(self, speed_gbps: int) -> int:
        return self.ports.get(speed_gbps, 0)


# NVLink 5 on a Blackwell GPU of an NVL72 rack: 18 links of 100 GB/s both directions together (50 GB/s each way),
# 1.8 TB/s a GPU; nvidia-smi reports each link at its signalling rate, 53.125 GB/s, which NVIDIA's own health
# checks take as the expected per-link speed of GB200 and GB300 (53125 MB/s).
NVL72_LINKS_SOURCE = ("NVIDIA NVLink & NVLink Switch page (fifth-generation NVLink: up to 18 links of 100 GB/s per "
                      "Blackwell GPU, 1.8 TB/s); NVIDIA Health Validation, NVLink checks, nvlink_bandwidth_count_speed "
                      "(expected_link_count 18, expected_speed_mbytes_per_sec 53125 for GB200 and GB300)")
# The NVL72 rack GB200 and GB300 both ship in: 18 compute trays of 4 GPUs and 9 NVLink switch trays of 2 chips,
# one NVLink domain of 72 GPUs. Trays and switch trays are 1U each (NVIDIA DGX GB Rack Scale Systems User Guide,
# "Rack Configuration"); the switch trays sit in the middle, ten compute trays above them and so eight below
# (ServeTheHome's photographs of the DGX GB200 NVL72 at GTC 2024: "ten compute nodes in the top stack ... below
# these nodes are nine NVSwitch shelves").
NVL72_RACK = NvlinkRack(compute_trays=18, gpus_per_tray=4, switch_trays=9, switch_chips_per_tray=2, links_per_gpu=18,
                        link_mbytes_per_s=53125, links_source=NVL72_LINKS_SOURCE, trays_below_switches=8)
NVLINK_SWITCH_TRAY_UNITS = 1  # DGX GB Rack Scale Systems User Guide: 9x 1RU NVLink switch trays (NVL36x2 too)
# A node of a group without a GPU (controller, login, storage) unless the group says otherwise: a two-socket 2U
# rack server, the common storage and service chassis (Dell PowerEdge R760: 2U).
CPU_SERVER_RACK_UNITS = 2


GPUS: dict[str, GpuModel] = {
    # HGX 8-GPU boards join the GPUs through NVSwitch (Fabric Manager); the 4-GPU boards link them directly.
    # Heights (rack_units): DGX H100 and DGX H200 are 8U (NVIDIA DGX H100/H200 User Guide, mechanical
    # specifications), as is Supermicro's air-cooled HGX H100/H200 SYS-821GE-TNHR; liquid-cooled HGX servers are
    # lower (Supermicro's 4U, xAI Colossus): a group sets node_rack_units.
    "h100-sxm5-80g": GpuModel(vendor="nvidia", name="NVIDIA H100 SXM5 80GB", memory_gb=80, slurm_type="h100",
                              allowed_per_node=(4, 8), nvswitch_at=(8,), rack_units=8),
    "h200-sxm-141g": GpuModel(vendor="nvidia", name="NVIDIA H200 SXM 141GB", memory_gb=141, slurm_type="h200",
                              allowed_per_node=(4, 8), nvswitch_at=(8,), rack_units=8),
    # DGX A100 User Guide, mechanical specifications: 6U.
    "a100-sxm4-80g": GpuModel(vendor="nvidia", name="NVIDIA A100 SXM4 80GB", memory_gb=80, slurm_type="a100",
                              allowed_per_node=(4, 8), nvswitch_at=(8,), rack_units=6),
    # Four cards, each two GCDs: Slurm and ROCm see 8 GPUs of 64 GB. Height: Gigabyte G262-ZO0, a 2U server of
    # four MI250 OAM modules.
    "mi250x": GpuModel(vendor="amd", name="AMD Instinct MI250X (GCD)", memory_gb=64, slurm_type="mi250x",
                       allowed_per_node=(2, 4, 6, 8), devices_per_card=2, rack_units=2),
    # 8-OAM UBB platforms are 8U air-cooled (Supermicro AS-8125GS-TNMR2).
    "mi300x": GpuModel(vendor="amd", name="AMD Instinct MI300X 192GB", memory_gb=192, slurm_type="mi300x",
                       allowed_per_node=(8,), rack_units=8),
    # ---- the current generation. Figures from published datasheets and reference architectures,
    # each source named beside the entry; a figure not found in one is left out (see docs/spec.md).
    # DGX B200 datasheet: 8 GPUs, 1,440 GB GPU memory in all (180 GB each), joined by NVSwitch. DGX B200 User
    # Guide, mechanical specifications: 10U.
    "b200-sxm-180g": GpuModel(vendor="nvidia", name="NVIDIA B200 180GB", memory_gb=180, slurm_type="b200",
                              allowed_per_node=(8,), nvswitch_at=(8,), rack_units=10),
    # NVIDIA HGX B300 page and DGX SuperPOD B300 RA: 8 Blackwell Ultra GPUs, 288 GB HBM3e each (2.3 TB a node).
    # Height: DGX B300's own was not found published; 10U is DGX B200's, the taller of the HGX Blackwell heights
    # found (ASUS XA NB3I-E12, HGX B300: 9U), so a rack is never planned fuller than it is. The B300 XDR RA puts
    # four DGX B300 in a rack, which 4 x 10U fits.
    "b300-sxm-288g": GpuModel(vendor="nvidia", name="NVIDIA B300 288GB", memory_gb=288, slurm_type="b300",
                              allowed_per_node=(8,), nvswitch_at=(8,), rack_units=10),
    # DGX SuperPOD GB200 RA (network fabrics): a rack of 18 compute trays and 9 NVLink switch trays, 2 NVLink
    # switch chips each; every GPU has 18 NVLink 5 links, one to each chip; 72 GPUs in one domain, 4 per tray.
    # Memory: 186 GB as nvidia-smi reports it (MLCommons inference v6.1 GB200-NVL72 system description).
    # No NVSwitch on the tray: Fabric Manager runs on the switch trays, the compute trays need IMEX.
    # The tray's CPUs are Grace (Arm Neoverse V2): arm64 nodes.
    # A compute tray is 1U (DGX GB Rack Scale Systems User Guide: 18x 1RU compute trays).
    "gb200": GpuModel(vendor="nvidia", name="NVIDIA GB200", memory_gb=186, slurm_type="gb200",
                      host_arch="arm64",
                      allowed_per_node=(4,),
                      nvlink_domain=NVL72_RACK, rack_units=1),
    # NVIDIA Enterprise RA "NVL72 AI factory" (GB300 components): 18 trays of 4 Blackwell Ultra GPUs and 2 Grace
    # CPUs, 9 NVSwitch trays, 4 ConnectX-8 per tray. Memory: 20 TB HBM3e per rack (NVIDIA GB300 NVL72 page),
    # 279 GB per GPU as nvidia-smi reports it (Verda's GB300 NVL72 write-up); links per GPU as GB200 (NVLink 5).
    # 1U compute trays, as GB200's (the same user guide covers GB200 and GB300 racks).
    "gb300": GpuModel(vendor="nvidia", name="NVIDIA GB300", memory_gb=279, slurm_type="gb300",
                      host_arch="arm64",
                      allowed_per_node=(4,),
                      nvlink_domain=NVL72_RACK, rack_units=1),
    # AMD Instinct MI325X product page: 256 GB HBM3E; the MI325X platform is 8 OAM modules on one UBB.
    # Height: Gigabyte G893-ZX1-AAX2 (MI325X), 8U.
    "mi325x": GpuModel(vendor="amd", name="AMD Instinct MI325X 256GB", memory_gb=256, slurm_type="mi325x",
                       allowed_per_node=(8,), rack_units=8),
    # AMD Instinct MI355X product page (CDNA 4): 288 GB HBM3E; 8-GPU OAM platforms. Height: the 8U of the
    # air-cooled UBB chassis above; liquid-cooled MI355X servers are lower (a group sets node_rack_units).
    "mi355x": GpuModel(vendor="amd", name="AMD Instinct MI355X 288GB", memory_gb=288, slurm_type="mi355x",
                       allowed_per_node=(8,), rack_units=8),
}

NICS: dict[str, NicModel] = {
    "cx6-hdr-200g": NicModel(name="NVIDIA ConnectX-6 HDR 200G", speed_gbps=200, fabrics=("infiniband", "roce")),
    "cx7-ndr-400g": NicModel(name="NVIDIA ConnectX-7 NDR 400G", speed_gbps=400, fabrics=("infiniband",)),
    "cx7-400gbe": NicModel(name="NVIDIA ConnectX-7 400GbE", speed_gbps=400, fabrics=("roce",)),
    "bf3-400gbe": NicModel(name="NVIDIA BlueField-3 400GbE", speed_gbps=400, fabrics=("roce",)),
    # ConnectX-8 SuperNIC datasheet: one port of up to 800 Gb/s, XDR InfiniBand or 800GbE (Spectrum-X).
    "cx8-xdr-800g": NicModel(name="NVIDIA ConnectX-8 SuperNIC XDR 800G", speed_gbps=800, fabrics=("infiniband",)),
    "cx8-800gbe": NicModel(name="NVIDIA ConnectX-8 SuperNIC 800GbE", speed_gbps=800, fabrics=("roce",)),
    # AMD Pensando Pollara 400 product page: up to 400 Gb/s Ethernet, UEC-ready RDMA. AMD's 800G Vulcano had no
    # published datasheet figures to take, so it is not listed. Its RDMA devices are ionic_N (the ionic driver).
    "pollara-400": NicModel(name="AMD Pensando Pollara 400 AI NIC", speed_gbps=400, fabrics=("roce",),
                            hca_prefix="ionic_"),
    # Staging stand-in: the container's virtual ethernet. Nothing RDMA about it.
    "veth-staging": NicModel(name="staging stand-in (virtual ethernet)", speed_gbps=10,
                             fabrics=("roce", "infiniband"), hca_prefix="veth", rdma=False),
}

SWITCHES: dict[str, SwitchModel] = {
    "qm8700": SwitchModel(name="NVIDIA Quantum QM8700 HDR", vendor="nvidia", ports={200: 40}, fabrics=("infiniband",)),
    "qm9700": SwitchModel(name="NVIDIA Quantum-2 QM9700 NDR", vendor="nvidia", ports={400: 64, 200: 128},
                          fabrics=("infiniband",)),
    # Quantum-X800 XDR user manual (Q3200-RA/Q3400-RA): Q3400 has 144 ports of 800 Gb/s XDR. Rack units
    # are not given as a figure here and stay at the default.
    "q3400": SwitchModel(name="NVIDIA Quantum-X800 Q3400 XDR", vendor="nvidia", ports={800: 144},
                         fabrics=("infiniband",)),
    # Spectrum-X800-class Ethernet: SN5600 datasheet, 64 ports of 800GbE (128 of 400 split), 2U.
    "sn5600": SwitchModel(name="NVIDIA Spectrum-4 SN5600", vendor="nvidia", ports={800: 64, 400: 128},
                          fabrics=("roce",), rack_units=2),
    # A 16-slot 7800R3-class modular chassis with 36 x 400G line cards.
    "arista-7800r3": SwitchModel(name="Arista 7816R3-class modular", vendor="arista", ports={400: 576},
                                 fabrics=("roce",), rack_units=29),
    "wedge400": SwitchModel(name="OCP Wedge400", vendor="ocp", ports={400: 32}, fabrics=("roce",)),
    "minipack2": SwitchModel(name="OCP Minipack2", vendor="ocp", ports={200: 128, 400: 64}, fabrics=("roce",),
                             rack_units=4),
    # Staging stand-in: a podman network bridge has no port limit worth modelling.
    "staging-bridge": SwitchModel(name="staging stand-in (podman bridge)", vendor="staging", ports={10: 64},
                                  fabrics=("roce", "infiniband")),
}


# ---------------------------------------------------------------- driver stacks: the version lock
# Which driver, Fabric Manager, DCGM, CUDA/ROCm, NCCL/RCCL and OFED releases go together, per GPU SKU.
# One place: `gpucluster.spec.stacks` checks specs against it and hands the chosen row to the roles
# (nvidia_gpu, amd_gpu, rdma, nccl), which pin and hold exactly these versions. docs/drivers.md.

APT_VERSION = r"^[0-9A-Za-z.+~:*-]+$"  # an exact Debian version, or an apt_preferences glob of one


DEB_PACKAGE = r"^[a-z0-9][a-z0-9+.-]{0,99}$"  # Debian policy 5.6.1: what a package name may hold
BRANCH = r"^\d+(\.\d+){0,2}$"
# A spec's catalog can bring its own rows (catalog.releases), and every field lands in apt preferences,
# deb822 sources or a repository URL: each is a pattern, so no value can start a new stanza or line.
PackageName = Annotated[str, Field(pattern=DEB_PACKAGE)]


class Pin(_Part):
    """Packages apt must keep at one version (apt_preferences Pin-Priority 1001, then dpkg hold)."""

    packages: tuple[PackageName, ...] = Field(min_length=1, max_length=32)
    version: str = Field(pattern=APT_VERSION, max_length=128)


class Release(_Part):
    """One row of the lock: a driver branch (NVIDIA) or ROCm release (AMD) and what was released with it."""

    vendor: str = Field(pattern="^(nvidia|amd)$")
    branch: str = Field(pattern=BRANCH, description="NVIDIA driver branch or ROCm release")
    toolkit: str = Field(default="", pattern=r"^(\d+(\.\d+){0,2})?$",
                         description="CUDA or ROCm release the collective library is built for")
    driver: Pin
    fabric_manager: Pin | None = Field(default=None, description="NVIDIA: the driver's exact version")
    dcgm: Pin | None = None
    dcgm_exporter: Pin | None = Field(default=None, description="NVIDIA: the dcgm-exporter release paired with "
                                                               "the row's DCGM (the metrics role installs it)")
    runtime: Pin | None = Field(default=None, description="CUDA toolkit or ROCm runtime")
    collective: Pin | None = Field(default=None, description="NCCL or RCCL")
    ofed: dict[Literal["mlnx-ofed", "doca"], Annotated[str, Field(pattern=r"^[0-9][0-9A-Za-z.-]{0,31}$")]] = Field(
        default_factory=dict, description="mlnx-ofed / doca release tested with this row")


class SkuStack(_Part):
    """The releases tested on one GPU SKU; a spec gets `default` unless it names another of `releases`."""

    default: str = Field(pattern=BRANCH)
    releases: tuple[Annotated[str, Field(pattern=BRANCH)], ...] = Field(min_length=1, max_length=16)


# dcgm-exporter: NVIDIA's package datacenter-gpu-manager-exporter in the CUDA repository (/usr/bin/dcgm-exporter,
# /etc/dcgm-exporter/default-counters.csv, the unit nvidia-dcgm-exporter.service: NVIDIA/dcgm-exporter's
# packaging/ and hack/package/). Each exporter release is built and tested against one DCGM release (its tag
# <dcgm>-<exporter>; NVIDIA's install guide: run the exporter with the DCGM it is paired with) and its package
# version is the exporter's alone, so the lock pairs them here. Confirmed in the stored documentation: the tag
# 4.2.3-4.1.3 (DCGM 4.2.3, the 570 row's) and package versions of the form 4.1.3-1 (the .deb and .rpm file names of
# that release line). Not confirmed here: the Debian package's exact Depends (a packaging of its RPM declares
# datacenter-gpu-manager-4-core >= 4, no upper bound, so apt alone would take any newer exporter), an epoch in its
# Debian version, and an exporter paired with DCGM 4.4.1 (the 580 row) or packaged for DCGM 3 (the 535 row): those
# rows carry none, and the metrics role records why it skips the exporter there. A site that has checked one adds it
# in its spec's catalog.releases row.
def _nvidia(branch: str, driver: str, dcgm: str, cuda: str, nccl: str, ofed: dict[str, str],
            exporter: str | None = None) -> Release:
    cuda_major = cuda.split(".")[0]
    return Release(
        vendor="nvidia", branch=branch, toolkit=cuda,
        driver=Pin(packages=("nvidia-driver", "nvidia-kernel-open-dkms", "nvidia-smi", "libnvidia-ml1", "libcuda1",
                             "firmware-nvidia-gsp", "nvidia-persistenced"), version=driver),
        fabric_manager=Pin(packages=("nvidia-fabricmanager", "libnvidia-nscq"), version=driver),
        dcgm=Pin(packages=(("datacenter-gpu-manager-4-core", f"datacenter-gpu-manager-4-cuda{cuda_major}")
                           if dcgm.startswith("1:4.") else ("datacenter-gpu-manager",)), version=dcgm),
        dcgm_exporter=Pin(packages=("datacenter-gpu-manager-exporter",), version=exporter) if exporter else None,
        runtime=Pin(packages=(f"cuda-toolkit-{cuda.replace('.', '-')}",), version=f"{cuda}.*"),
        collective=Pin(packages=("libnccl2", "libnccl-dev"), version=nccl),
        ofed=ofed)


def rocm_build(release: str) -> str:
    """ROCm's build number, part of every package version of that release: 6.2.4 -> 60204."""
    major, minor, patch = ([int(p) for p in release.split(".")] + [0, 0])[:3]
    return f"{major * 10000 + minor * 100 + patch}"


def _amd(rocm: str, amdgpu: str, rccl: str, ofed: dict[str, str]) -> Release:
    build = rocm_build(rocm)
    return Release(
        vendor="amd", branch=rocm, toolkit=rocm,
        driver=Pin(packages=("amdgpu-dkms", "amdgpu-dkms-firmware"), version=f"1:{amdgpu}.{build}-*"),
        runtime=Pin(packages=("rocm-hip-runtime", "rocm-smi-lib", "hsa-rocr", "rocm-core"), version=f"*.{build}-*"),
        collective=Pin(packages=("rccl", "rccl-dev"), version=f"{rccl}.{build}-*"),
        ofed=ofed)


# Vendor repositories. NVIDIA: exact versions of its Debian 12 repository; AMD: ROCm's build number
# pins every package of the release. MLNX_OFED ends with 24.10 (LTS); later rows offer DOCA-host only.
RELEASES: dict[str, dict[str, Release]] = {
    "nvidia": {
        "535": _nvidia("535", "535.261.03-1", "1:3.3.9", "12.2", "2.21.5-1+cuda12.2",
                       {"mlnx-ofed": "23.10-3.2.2.0", "doca": "2.7.0"}),
        "570": _nvidia("570", "570.172.08-1", "1:4.2.3-1", "12.8", "2.26.5-1+cuda12.8",
                       {"mlnx-ofed": "24.10-3.2.5.0", "doca": "2.10.0"}, exporter="4.1.3-1"),
        "580": _nvidia("580", "580.95.05-1", "1:4.4.1-1", "13.0", "2.28.3-1+cuda13.0", {"doca": "3.1.0"}),
    },
    "amd": {
        "6.2.4": _amd("6.2.4", "6.8.5", "2.20.5", {"mlnx-ofed": "24.10-3.2.5.0", "doca": "2.10.0"}),
        "6.3.3": _amd("6.3.3", "6.10.5", "2.21.5", {"mlnx-ofed": "24.10-3.2.5.0", "doca": "2.10.0"}),
    },
}

# Debian 12's own packages (source 'debian'): the PCIe option. No Fabric Manager, DCGM, CUDA or NCCL;
# for AMD the kernel's amdgpu module is the driver and the pin covers rocm-smi.
DEBIAN_RELEASES: dict[str, Release] = {
    "nvidia": Release(vendor="nvidia", branch="535", driver=Pin(
        packages=("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libnvidia-ml1", "firmware-nvidia-gsp"),
        version="535.309.01-0+deb12u1")),
    "amd": Release(vendor="amd", branch="5.2.3", driver=Pin(packages=("rocm-smi", "librocm-smi64-1"),
                                                            version="5.2.3*")),
}

STACKS: dict[str, SkuStack] = {
    "h100-sxm5-80g": SkuStack(default="570", releases=("570", "580")),
    "h200-sxm-141g": SkuStack(default="570", releases=("570", "580")),
    "a100-sxm4-80g": SkuStack(default="535", releases=("535", "570")),
    "mi250x": SkuStack(default="6.2.4", releases=("6.2.4", "6.3.3")),
    "mi300x": SkuStack(default="6.3.3", releases=("6.2.4", "6.3.3")),
    # Blackwell needs the open kernel modules and branch 570 or later (CUDA 12.8 added sm_100).
    "b200-sxm-180g": SkuStack(default="570", releases=("570", "580")),
    "b300-sxm-288g": SkuStack(default="580", releases=("580",)),
    "gb200": SkuStack(default="570", releases=("570", "580")),
    "gb300": SkuStack(default="580", releases=("580",)),
    # ROCm release notes: MI325X from 6.3; MI355X needs ROCm 7.0, which has no row in this lock yet, so the
    # built-in catalog gives it none and a spec adds its own row (catalog.stacks/releases) or uses debian.
    "mi325x": SkuStack(default="6.3.3", releases=("6.3.3",)),
}


class Catalog(BaseModel):
    """The merged catalog a spec sees: built-ins plus the spec's own entries. A spec adds a part, and for a
    GPU its version lock (`stacks`, and `releases` for rows the built-in lock lacks), without editing code."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpus: dict[PartKey, GpuModel] = Field(default_factory=dict, max_length=MAX_LIST)
    nics: dict[PartKey, NicModel] = Field(default_factory=dict, max_length=MAX_LIST)
    switches: dict[PartKey, SwitchModel] = Field(default_factory=dict, max_length=MAX_LIST)
    stacks: dict[PartKey, SkuStack] = Field(default_factory=dict, max_length=MAX_LIST,
                                            description="GPU -> the lock's releases tested on it, and the default")
    releases: dict[Literal["nvidia", "amd"], dict[Annotated[str, Field(pattern=BRANCH)], Release]] = (
        Field(default_factory=dict, description="vendor -> branch -> a row of the lock (driver, runtime, ...)"))

    @model_validator(mode="after")
    def _rows_match_their_keys(self) -> Catalog:
        for vendor, rows in self.releases.items():
            for branch, row in rows.items():
                if row.vendor != vendor or row.branch != branch:
                    raise ValueError(f"releases.{vendor}.'{branch}' holds a row of {row.vendor} branch {row.branch}: "
                                     "a row sits under its own vendor and branch")
        for key, stack in self.stacks.items():
            if stack.default not in stack.releases:
                raise ValueError(f"stacks.{key}: default {stack.default} is not one of its releases")
        return self

    def merged(self) -> Catalog:
        releases = {v: {**RELEASES.get(v, {}), **self.releases.get(v, {})} for v in ("nvidia", "amd")}
        return Catalog(gpus={**GPUS, **self.gpus}, nics={**NICS, **self.nics},
                       switches={**SWITCHES, **self.switches}, stacks={**STACKS, **self.stacks}, releases=releases)


class Repository(_Part):
    """An apt repository in deb822 terms; `{release}` in uri is the row's branch, ROCm or OFED release."""

    name: str = Field(pattern=r"^[a-z0-9-]+$")
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...] = ()
    key: str = Field(description="URL of the signing key (fetched to /etc/apt/keyrings) or a local keyring path")


# Vendor repositories for Debian 12 (AMD and the OFED builds are made for Ubuntu 22.04, which Debian 12 matches).
REPOSITORIES: dict[str, tuple[Repository, ...]] = {
    "cuda-repo": (Repository(name="gpucluster-cuda", uri="https://developer.download.nvidia.com/compute/cuda/repos/"
                             "debian12/x86_64/", suites=("/",), key="https://developer.download.nvidia.com/compute/"
                             "cuda/repos/debian12/x86_64/3bf863cc.pub"),),
    "rocm-repo": (
        Repository(name="gpucluster-rocm", uri="https://repo.radeon.com/rocm/apt/{release}", suites=("jammy",),
                   components=("main",), key="https://repo.radeon.com/rocm/rocm.gpg.key"),
        Repository(name="gpucluster-amdgpu", uri="https://repo.radeon.com/amdgpu/{release}/ubuntu", suites=("jammy",),
                   components=("main",), key="https://repo.radeon.com/rocm/rocm.gpg.key"),
    ),
    "doca": (Repository(name="gpucluster-doca", uri="https://linux.mellanox.com/public/repo/doca/{release}/"
                        "ubuntu22.04/x86_64/", suites=("/",), key="https://linux.mellanox.com/public/repo/doca/"
                        "GPG-KEY-Mellanox.pub"),),
    "mlnx-ofed": (Repository(name="gpucluster-mlnx-ofed", uri="https://linux.mellanox.com/public/repo/mlnx_ofed/"
                             "{release}/ubuntu22.04/x86_64/", suites=("/",), key="https://linux.mellanox.com/public/"
                             "repo/mlnx_ofed/latest/RPM-GPG-KEY-Mellanox"),),
}

# The same vendor repositories for arm64 hosts (Grace: GB200/GB300 compute trays). NVIDIA's CUDA repository keeps
# one tree per architecture, debian12/sbsa/ beside debian12/x86_64/ (the CUDA installation guide's x86_64 and
# arm64-sbsa targets), signed with the same debian12 key (3bf863cc, NVIDIA/cuda-repo-management's key table), and
# carries the arm64 builds of the driver, DCGM, CUDA, NCCL and IMEX under the same package names and the same
# versions as x86_64 (NVIDIA/DCGM#10 and #117: DCGM's arm64 packages are published in the sbsa trees; Azure/aks-gpu
# #170: nvidia-imex for arm64 ships only in the CUDA repository; Azure/azhpc-images#561: IMEX on aarch64 at the
# driver's own version). So a row of the lock pins both architectures; only the path differs. ROCm and the OFED
# repositories of the lock are x86_64 builds: no arm64 entry (spec/rules.py refuses them on arm64 groups).
REPOSITORIES_ARM64: dict[str, tuple[Repository, ...]] = {
    "cuda-repo": (Repository(name="gpucluster-cuda", uri="https://developer.download.nvidia.com/compute/cuda/repos/"
                             "debian12/sbsa/", suites=("/",), key="https://developer.download.nvidia.com/compute/"
                             "cuda/repos/debian12/sbsa/3bf863cc.pub"),),
}
# The lock's repositories per host architecture (GpuModel.host_arch; the roles map the node's fact onto it:
# aarch64 -> arm64).
REPOSITORIES_BY_ARCH: dict[str, dict[str, tuple[Repository, ...]]] = {"x86_64": REPOSITORIES,
                                                                      "arm64": REPOSITORIES_ARM64}

# What each OFED kind installs (the DOCA-host 'doca-ofed' profile; MLNX_OFED's full user space and modules).
OFED_PACKAGES: dict[str, tuple[str, ...]] = {
    "doca": ("doca-ofed",),
    "mlnx-ofed": ("mlnx-ofed-all",),
}

# OFED for fabric groups whose stack has no row of its own (no GPU, or Debian's driver).
OFED_DEFAULT: dict[str, str] = {"mlnx-ofed": "24.10-3.2.5.0", "doca": "3.1.0"}


# ---------------------------------------------------------------- container runtimes: the version lock
# enroot (NVIDIA's unprivileged container runtime) and pyxis (its SPANK plugin behind `srun --container-image`),
# pinned together the way a driver row is: one place, read by render/containers.py, which writes the apt pins
# (apt-enroot-pyxis.pref) that the node groups running pyxis install. docs/containers.md.
#
# enroot 4.1.2: NVIDIA/enroot, tag v4.1.2 (2026-03-23), its release carrying enroot_4.1.2-1_<arch>.deb and
#   enroot+caps_4.1.2-1_<arch>.deb (doc/installation.md; pkg/deb/changelog "4.1.2-1"). pkg/deb/control: enroot
#   depends on bash, curl, gawk | mawk, jq, parallel, passwd, squashfs-tools, zstd and bsdmainutils; enroot+caps
#   on enroot (= the same version) and libcap2-bin. Its helpers are linked statically against musl (Makefile), so
#   the release's Ubuntu 24.04 build does not ask for a newer glibc than Debian 12's. 4.0.0 added IMEX channels
#   to its NVIDIA hook (GB200/GB300 trays) and zstd layers.
# pyxis 0.24.0: NVIDIA/pyxis, tag v0.24.0 (2026-05-11). NVIDIA publishes no binary package: pyxis must be built
#   against the spank.h of the Slurm it runs under (its README), so a site builds the Debian package from the
#   repository's debian/ folder: nvslurm-plugin-pyxis, version 0.24.0-1 (debian/changelog), depending on
#   enroot (>= 3.1.0) | enroot-hardened (>= 3.1.0) (debian/control), the plugin at
#   /usr/lib/<multiarch>/slurm/spank_pyxis.so (debian/rules: libdir=/usr/lib/$(DEB_HOST_MULTIARCH)).
ENROOT_SOURCE = ("NVIDIA/enroot v4.1.2 (2026-03-23): enroot_4.1.2-1 and enroot+caps_4.1.2-1 .deb from the "
                 "project's GitHub releases")
PYXIS_SOURCE = ("NVIDIA/pyxis v0.24.0 (2026-05-11): nvslurm-plugin-pyxis 0.24.0-1, built by the site from the "
                "repository's debian/ folder against its Slurm (NVIDIA ships no binary package)")


class ContainerStack(_Part):
    """enroot and pyxis at the versions the node groups running pyxis install and pin (Pin-Priority 1001); every
    other version of these packages, and enroot's hardened flavor, is refused (-1)."""

    enroot: Pin
    pyxis: Pin
    refused: tuple[PackageName, ...] = Field(default=(), max_length=32,
                                             description="packages no version of which may be installed")
    enroot_source: str = Field(max_length=512)
    pyxis_source: str = Field(max_length=512)


CONTAINER_STACK = ContainerStack(
    enroot=Pin(packages=("enroot", "enroot+caps"), version="4.1.2-1"),
    pyxis=Pin(packages=("nvslurm-plugin-pyxis",), version="0.24.0-1"),
    # The hardened flavor Replaces and Conflicts with enroot (pkg/deb/rules): pyxis accepts either, so the lock
    # names the one flavor it pins and refuses the other.
    refused=("enroot-hardened", "enroot-hardened+caps"),
    enroot_source=ENROOT_SOURCE, pyxis_source=PYXIS_SOURCE)


# ---------------------------------------------------------------- Grafana: the version lock
# Grafana is not in Debian. Its vendor publishes it in its own apt repository (Grafana's installation guide for
# Debian and Ubuntu, grafana/grafana docs/sources/setup-grafana/installation/debian): `deb
# [signed-by=/etc/apt/keyrings/grafana.asc] https://apt.grafana.com stable main`, the key at
# https://apt.grafana.com/gpg-full.key, one repository for both editions: `grafana` (OSS) and `grafana-enterprise`
# (the same features without a licence). The lock takes OSS and refuses the other edition, so no dependency or
# operator's install swaps one for the other. The package runs grafana-server.service with EnvironmentFile=
# /etc/default/grafana-server and reads its provisioning from /etc/grafana/provisioning (grafana/grafana
# packaging/deb: the unit passes cfg:default.paths.provisioning=${PROVISIONING_CFG_DIR}); Grafana takes any
# grafana.ini key from a GF_<SECTION>_<KEY> variable, so a drop-in of the unit sets the port.
# Version: 11.6.0, the release whose dashboard schema render/dashboards.py writes (grafana-foundation-sdk
# 11.6.0). Confirmed in the stored material: the release's package file grafana_11.6.0_amd64.deb (Grafana's
# download commands). Not confirmed here: the Version field of the repository's package (taken as 11.6.0, the
# file name's, with no Debian revision and no epoch), its exact Depends (the download page installs adduser,
# libfontconfig1 and musl first), whether grafana-enterprise declares Conflicts with grafana, and which key
# signs the repository today (the guide names gpg-full.key; older guides named gpg.key).
class GrafanaLock(_Part):
    """Grafana's package at the version the controller installs and pins (Pin-Priority 1001, then a dpkg hold);
    every other version, and the other edition, at -1."""

    repository: Repository
    package: Pin
    refused: tuple[PackageName, ...] = Field(default=(), max_length=8,
                                             description="packages no version of which may be installed")
    source: str = Field(max_length=512)


GRAFANA = GrafanaLock(
    repository=Repository(name="gpucluster-grafana", uri="https://apt.grafana.com", suites=("stable",),
                          components=("main",), key="https://apt.grafana.com/gpg-full.key"),
    package=Pin(packages=("grafana",), version="11.6.0"),
    refused=("grafana-enterprise",),
    source="Grafana's apt repository (stable main), Grafana OSS 11.6.0: the dashboards' schema release")
