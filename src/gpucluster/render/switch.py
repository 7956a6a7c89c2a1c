"""RoCE lossless QoS for the switches, from the same spec fields the hosts and NCCL use (fabric.roce).

One spec, three places that must agree on the RoCE class:
- NCCL marks its traffic with NCCL_IB_TC = DSCP x 4 (render/nccl.py),
- the host trusts DSCP and maps DSCP -> the PFC priority (roles/rdma, templates/fabric/roce-qos.conf.j2),
- the switch maps the same DSCP to the lossless traffic class, with PFC on that priority only, ECN
  marking on its queue and the PFC watchdog (this module, templates/switch/).
The flavour is the switch model's catalog vendor: arista -> EOS snippets, anything else -> SONiC
config_db.json fragments (to merge with `sonic-cfggen -j FILE --write-to-db` or config load).
Thresholds below are starting points, not spec fields: tune them per ASIC buffer size.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.errors import UsageError
from gpucluster.fabric.plan import Plan, TierPlan
from gpucluster.render.templating import environment
from gpucluster.spec.model import ClusterSpec

# ECN marking on the RoCE queue (WRED profile) and the PFC watchdog; per-ASIC tuning starts from here.
ECN_MIN_BYTES = 150_000
ECN_MAX_BYTES = 1_500_000
ECN_MARK_PERCENT = 20
PFC_WD_DETECT_MS = 200
PFC_WD_RESTORE_MS = 200
FLAVOURS = {"arista": "eos"}  # vendor -> flavour; every other vendor gets SONiC
NO_SWITCH = {"staging"}  # stand-ins with no switch to configure (a podman bridge)


@dataclass(frozen=True)
class TierQos:
    tier: str
    model: str
    vendor: str
    flavour: str
    ports: tuple[str, ...]  # interface names of the ports the plan uses (down + up)
    mtu: int

    @property
    def interface_range(self) -> str:
        """EOS's range form of the ports: Ethernet1-64."""
        return f"{self.ports[0]}-{self.ports[-1].removeprefix('Ethernet')}" if len(self.ports) > 1 else self.ports[0]


def sonic_lanes(ports: dict[int, int], speed: int) -> int:
    """Lanes per port at `speed`, for SONiC's EthernetN names (N = first lane): a cage carries 8 lanes
    at the model's top speed, and a slower port takes its share (SN5600: 64 x 800G = 512 lanes, so a
    400G port takes 4). Check against the platform's port_config.ini / platform.json."""
    top = max(ports)
    count = ports.get(speed) or ports[top]
    return max(1, 8 * ports[top] // count)


def tier_qos(spec: ClusterSpec, plan: Plan, tier: TierPlan) -> TierQos | None:
    model = spec.parts.switches[tier.model]
    if model.vendor in NO_SWITCH:
        return None
    flavour = FLAVOURS.get(model.vendor, "sonic")
    used = tier.down + tier.up
    if flavour == "sonic":
        lanes = sonic_lanes(model.ports, plan.speed_gbps)
        ports = tuple(f"Ethernet{(p - 1) * lanes}" for p in range(1, used + 1))
    else:
        ports = tuple(f"Ethernet{p}" for p in range(1, used + 1))
    return TierQos(tier.tier, tier.model, model.vendor, flavour, ports, spec.fabric.roce.link_mtu)


def context(spec: ClusterSpec, plan: Plan, qos: TierQos) -> dict:
    roce = spec.fabric.roce
    others = [d for d in range(64) if d not in (roce.dscp, roce.cnp_dscp)]
    return {
        "cluster": spec.name,
        "qos": qos,
        "roce": roce,
        "dscp_to_tc": {**{d: 0 for d in others}, roce.dscp: roce.pfc_priority, roce.cnp_dscp: roce.cnp_priority},
        "tc_to_pg": {tc: (tc if tc == roce.pfc_priority else 0) for tc in range(8)},
        "ecn": {"min": ECN_MIN_BYTES, "max": ECN_MAX_BYTES, "percent": ECN_MARK_PERCENT},
        "pfc_wd": {"detect": PFC_WD_DETECT_MS, "restore": PFC_WD_RESTORE_MS},
        "speed_gbps": plan.speed_gbps,
    }


def switch_files(spec: ClusterSpec, plan: Plan) -> dict[str, str]:
    """{file name: text}: one lossless-QoS file per RoCE switch tier (every switch of a tier gets the same
    QoS); none for InfiniBand (the subnet manager's service levels) or for staging stand-in switches."""
    if spec.fabric.type != "roce":
        return {}
    env = environment()
    out: dict[str, str] = {}
    for tier in plan.tier_plans:
        qos = tier_qos(spec, plan, tier)
        if qos is None:
            continue
        name = f"{tier.tier}-{qos.flavour}-qos" + (".json" if qos.flavour == "sonic" else ".cfg")
        template = "switch/sonic-qos.json.j2" if qos.flavour == "sonic" else "switch/eos-qos.cfg.j2"
        out[name] = env.get_template(template).render(context(spec, plan, qos))
    return out


def switch_configs(spec: ClusterSpec, plan: Plan) -> dict[str, str]:
    """`gpucluster fabric switch-config`: the switch files, or a UsageError saying why there are none."""
    if spec.fabric.type != "roce":
        raise UsageError(f"{spec.name}: switch-config renders RoCE lossless QoS; this fabric is "
                         f"{spec.fabric.type} (its QoS is the subnet manager's service levels)")
    out = switch_files(spec, plan)
    if not out:
        raise UsageError(f"{spec.name}: every switch tier is a staging stand-in (no switch to configure)")
    return out
