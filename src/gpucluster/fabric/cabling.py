"""The per-port cabling map and the bill of materials, streamed: 200k-GPU plans have ~600k cables."""

from __future__ import annotations

from collections.abc import Iterator

from gpucluster.fabric.plan import Plan, Unit

CABLING_HEADER = "a_device,a_port,b_device,b_port,link,media\n"


def leaf_name(plan: Plan, unit: Unit, rail: int) -> str:
    return f"{unit.name}-r{rail}" if plan.design == "rail-optimized" else unit.name


def endpoint_media(plan: Plan) -> str:
    """Fat-tree leaves in the rack take copper; rail leaves sit at the end of the row and need optics."""
    in_rack = all(g.nodes_per_rack >= plan.unit_nodes for g in plan.spec.fabric_groups)
    return "DAC" if plan.design == "fat-tree" and in_rack else "AOC"


class _Ports(dict):
    """Port numbers as text, each converted once (int-to-str is most of the cost of a cabling row)."""

    def __missing__(self, n: int) -> str:
        text = self[n] = str(n)
        return text


def _offsets(counts: list[int]) -> list[int]:
    """Running totals before each entry: where a pod's spines (or a core's ports for a pod) start."""
    out, total = [], 0
    for n in counts:
        out.append(total)
        total += n
    return out


def _blocks(cols: list[str], size: int) -> list[list[str]]:
    """cols cut into runs of `size` (the last may be shorter): the rows of one run share their last columns."""
    return [cols[i:i + size] for i in range(0, len(cols), size)] if cols else []


def cabling_chunks(plan: Plan) -> int:
    """How many chunks cabling_rows yields (one per unit, then one per spine with 3 tiers): a progress total."""
    return len(plan.units) + (plan.switches["spine"] if plan.tiers == 3 else 0)


def cabling_rows(plan: Plan) -> Iterator[str]:
    """CSV text for every link: node NIC -> leaf, leaf -> spine, spine -> core; one chunk per unit/spine.

    Rows are joined from pieces built once per fabric (port numbers, "<port>,spineNNNNN," columns,
    tails) rather than formatted one by one: Colossus 200k has ~600k rows. Where a run of rows shares
    its first and last columns (one host's NICs, one switch's uplinks to one block of peers) the run is
    one `str.join` with "<last columns>\n<first column>" as the separator, so a row costs a copy, not
    two concatenations. Spines and core ports are numbered pod after pod, so a partial pod with fewer
    spines shifts nothing before it.
    """
    spec = plan.spec
    rails, groups_n = plan.rails, plan.rail_groups
    rail_design = plan.design == "rail-optimized"
    per_group = max(1, rails // groups_n) if rail_design else 1
    leaf = plan.tier("leaf")
    pods = plan.pod_plans
    spine_base = _offsets([groups_n * p.spines for p in pods])
    ports = _Ports()
    node_tail = f",node-leaf,{endpoint_media(plan)}\n"
    uplink_tail = ",leaf-spine,fiber\n"
    # Per (first spine, spines, uplinks): ",<leaf port>,spineNNNNN," for each leaf uplink q, in blocks of `spines`.
    uplink_cols: dict[tuple[int, int, int], list[list[str]]] = {}
    # Per (HCA count, node count): "<leaf port>,node-leaf,<media>\n" for node p, HCA r (fat-tree numbering).
    node_tails: dict[tuple[int, int], list[list[str]]] = {}
    taken: dict[int, int] = {}  # pod -> spine ports (per spine) taken by the leaves cabled so far
    for unit in plan.units:
        group = spec.group(unit.group)
        hcas = plan.hcas(group)
        hosts = group.hosts[unit.first:unit.first + unit.count]
        rows: list[str] = []
        if rail_design:
            mids = [f",{hca},{leaf_name(plan, unit, r)}," for r, hca in enumerate(hcas)]
            for p, host in enumerate(hosts):
                tail = ports[p + 1] + node_tail
                rows.append(host + (tail + host).join(mids) + tail)  # host,<hca>,<leaf>,<port>,... per rail
        else:
            mids = [f",{hca},{unit.name}," for hca in hcas]
            key = (len(hcas), len(hosts))
            tails = node_tails.get(key)
            if tails is None:
                tails = node_tails[key] = [[ports[p * rails + r + 1] + node_tail for r in range(len(hcas))]
                                           for p in range(len(hosts))]
            for host, host_tails in zip(hosts, tails, strict=True):
                rows.extend([host + mid + tail for mid, tail in zip(mids, host_tails, strict=True)])
        pod = pods[unit.pod]
        s_per = pod.spines
        m = unit.up // s_per  # links from each of this unit's leaves to each spine of its pod
        first_port = taken.get(unit.pod, 0)
        taken[unit.pod] = first_port + per_group * m
        for r in range(len(unit.leaves)):
            lname = leaf_name(plan, unit, r)
            base = spine_base[unit.pod] + (r // per_group) * s_per
            blocks = uplink_cols.get((base, s_per, unit.up))
            if blocks is None:  # uplink q goes to spine q % s_per, on that spine's port number first + q // s_per
                cols = [f",{leaf.down + q + 1},spine{base + q % s_per + 1:05d}," for q in range(unit.up)]
                blocks = uplink_cols[base, s_per, unit.up] = _blocks(cols, s_per)
            first = first_port + (r % per_group) * m
            for k, block in enumerate(blocks):
                tail = ports[first + k + 1] + uplink_tail
                rows.append(lname + (tail + lname).join(block) + tail)
        yield "".join(rows)
    if plan.tiers == 3:
        yield from _spine_core_chunks(plan, ports, spine_base)


def _spine_core_chunks(plan: Plan, ports: _Ports, spine_base: list[int]) -> Iterator[str]:
    """The spine -> core links of a 3-tier fabric, one chunk per spine: spine s of rail group g in a pod reaches
    the consecutive cores of its planes, and core ports are numbered pod after pod (`core_base`)."""
    spine = plan.tier("spine")
    pods = plan.pod_plans
    groups_n = plan.rail_groups
    c_per = plan.cores_per_plane
    s_full = plan.spines_per_group
    core_tail = ",spine-core,fiber\n"
    core_cols: dict[tuple[int, int, int], list[list[str]]] = {}
    core_base = _offsets([p.links_per_core for p in pods])
    for pod in pods:
        reach = pod.planes * c_per  # a spine reaches these consecutive cores (its planes' cores)
        # uplink q of a spine lands on core port core_base + q // reach + 1: one tail per block of `reach`
        tails = [ports[core_base[pod.index] + k + 1] + core_tail
                 for k in range(-(-pod.spine_up // reach) if pod.spine_up else 0)]
        for g in range(groups_n):
            for s in range(pod.spines):
                sname = f"spine{spine_base[pod.index] + g * pod.spines + s + 1:05d}"
                first_core = (g * s_full + s * pod.planes) * c_per + 1
                blocks = core_cols.get((first_core, reach, pod.spine_up))
                if blocks is None:
                    blocks = core_cols[first_core, reach, pod.spine_up] = _blocks(
                        [f",{spine.down + q + 1},core{first_core + q % reach:05d}," for q in range(pod.spine_up)],
                        reach)
                yield "".join([sname + (tail + sname).join(block) + tail
                               for block, tail in zip(blocks, tails, strict=True)])


def bom_rows(plan: Plan) -> list[list]:
    spec = plan.spec
    parts = spec.parts
    rows: list[list] = [["category", "item", "model", "description", "quantity"]]
    for t in plan.tier_plans:
        rows.append(["switch", t.tier, t.model, parts.switches[t.model].name, t.count])
    for g in spec.node_groups:
        rows.append(["node", g.name, g.role, f"{g.cpu.sockets}x{g.cpu.cores_per_socket}c {g.memory_gb} GB", g.count])
    gpus: dict[str, int] = plan.gpus_by_type
    for key, n in gpus.items():
        model = parts.gpus[key]
        rows.append(["gpu", key, key, model.name, n // model.devices_per_card])
    nics: dict[str, int] = {}
    for g in spec.node_groups:
        if g.nic:
            nics[g.nic] = nics.get(g.nic, 0) + g.count * g.nics_per_node
    for key, n in nics.items():
        rows.append(["nic", key, key, parts.nics[key].name, n])
    links = plan.links
    rows.append(["cable", "node-leaf", endpoint_media(plan), f"{plan.speed_gbps}G", links["node-leaf"]])
    optical = 0
    for name, n in links.items():
        if name != "node-leaf":
            rows.append(["cable", name, "fiber", f"{plan.speed_gbps}G", n])
            optical += n
    rows.append(["transceiver", "switch-switch", "optic", f"{plan.speed_gbps}G, two per fiber", 2 * optical])
    rows.append(["rack", "nodes", "rack", "racks holding nodes (network racks not counted)", plan.rack_count])
    rows += nvlink_rows(plan)
    return rows


def nvlink_rows(plan: Plan) -> list[list]:
    """Rack-scale NVLink: the NVLink switch trays are part of each NVL72 rack, not of the scale-out fabric.
    Listed only where a plan has domains, so other bills keep their bytes."""
    out = []
    for key in dict.fromkeys(plan.spec.group(d.group).gpu for d in plan.domains):
        rack = plan.spec.parts.gpus[key].nvlink_domain
        n = sum(1 for d in plan.domains if plan.spec.group(d.group).gpu == key)
        out.append(["nvlink", "domains", key, f"NVLink domains of {rack.compute_trays} trays x {rack.gpus_per_tray} "
                    "GPUs, one per rack", n])
        out.append(["nvlink", "switch trays", key, f"NVLink switch trays ({rack.switch_trays} a rack, "
                    f"{rack.switch_chips_per_tray} switch chips each)", n * rack.switch_trays])
    return out
