"""The fabric as a person reads it: tiers as rows, identical pods and units folded into one box with a
multiplicity, and the uplink bundles between them with their link counts, speed and oversubscription.

Folding is what keeps 200,000 GPUs readable: Colossus 200k is 3 pod boxes (47 identical pods, pod 37
with its 62-node SU, pod 49 with 7 SUs), not 8,312 switches. `expand` draws one pod unit by unit
(with 2 tiers, where there are no pods, one unit rack by rack). Pure data: diagram.py lays it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucluster.fabric import Plan, Unit
from gpucluster.fabric.cabling import endpoint_media
from gpucluster.fabric.plan import PodPlan
from gpucluster.words import plural

TIERS = ("core", "spine", "leaf", "nodes")
MOST_UNITS = 12  # an expanded pod draws this many units one by one, the rest folded
FEW = 4  # with 2 tiers, a class of this many units or fewer is drawn unit by unit


@dataclass
class Box:
    id: str
    tier: str  # one of TIERS
    title: str
    lines: list[str] = field(default_factory=list)
    rails: list[str] = field(default_factory=list)  # rail cells of a rail-optimised SU
    group: str = ""  # the pod group it is drawn in ("" for none)


@dataclass
class Bundle:
    src: str  # the lower box
    dst: str  # the upper box
    label: list[str]


@dataclass
class Group:
    id: str
    label: str


@dataclass
class View:
    title: str
    boxes: list[Box] = field(default_factory=list)
    bundles: list[Bundle] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)

    def tier(self, name: str) -> list[Box]:
        return [b for b in self.boxes if b.tier == name]


def _ranges(numbers: list[int]) -> str:
    """1, 2, 3, 5 -> '1-3, 5'."""
    out, start, prev = [], None, None
    for n in numbers + [None]:
        if start is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = n
    return ", ".join(out)


def _unit_key(u: Unit) -> tuple:
    return (u.group, u.count, u.up)


def _pod_key(plan: Plan, pod: PodPlan) -> tuple:
    members = plan.units[pod.first_unit:pod.first_unit + pod.units]
    return (pod.spines, pod.spine_down, pod.spine_up, pod.planes, pod.links_per_core,
            tuple(_unit_key(u) for u in members))


def _fold(units: list[Unit]) -> list[list[Unit]]:
    """Units in classes of identical shape, in order of first appearance."""
    classes: dict[tuple, list[Unit]] = {}
    for u in units:
        classes.setdefault(_unit_key(u), []).append(u)
    return list(classes.values())


def build_view(plan: Plan, expand: int | None = None) -> View:
    """The folded view; `expand` (1-based) is a pod with 3 tiers, a unit with 2. Raises ValueError."""
    spec = plan.spec
    gpus = f"{plan.gpus:,} GPUs" if plan.gpus else plural(plan.nodes, "node")
    rails = f" ({plural(plan.rails, 'rail')})" if plan.design == "rail-optimized" else ""
    view = View(f"{spec.name}: {gpus}, {plural(plan.tiers, 'tier')}, {plan.speed_gbps} Gb/s {spec.fabric.type} "
                f"{plan.design}{rails}")
    limit = plan.pods if plan.tiers == 3 else len(plan.units)
    if expand is not None and not 1 <= expand <= limit:
        what = "pod" if plan.tiers == 3 else "unit"
        raise ValueError(f"--pod {expand}: this plan has {plural(limit, what)} (1-{limit})")
    if plan.tiers == 3:
        _core(plan, view)
        classes: dict[tuple, list[PodPlan]] = {}
        for pod in plan.pod_plans:
            key = ("expanded",) if expand == pod.index + 1 else _pod_key(plan, pod)
            classes.setdefault(key, []).append(pod)
        for n, pods in enumerate(classes.values()):
            _pod(plan, view, f"p{n}", pods, expanded=expand == pods[0].index + 1)
    else:
        _two_tier(plan, view, expand)
    return view


# ---- tiers ----------------------------------------------------------------------------------------

def _core(plan: Plan, view: View) -> None:
    core = plan.tier("core")
    planes = plan.rail_groups * plan.spines_per_group
    view.boxes.append(Box("core", "core", f"core × {core.count:,}", [
        core.model,
        f"{plural(planes, 'plane')} × {plural(plan.cores_per_plane, 'core')}",
        f"{core.down} of {core.radix} ports used",
    ]))


def _pod(plan: Plan, view: View, gid: str, pods: list[PodPlan], expanded: bool) -> None:
    pod = pods[0]
    numbers = [p.index + 1 for p in pods]
    if len(pods) == 1:
        label = f"pod {numbers[0]}" + (" (expanded)" if expanded else "")
    else:
        label = f"× {len(pods)} pods ({_ranges(numbers)})"
    view.groups.append(Group(gid, label))
    spine = plan.tier("spine")
    groups = plan.rail_groups
    per_group = f" per rail group × {groups}" if groups > 1 else ""
    spine_id = f"{gid}_spine"
    view.boxes.append(Box(spine_id, "spine", f"spine × {pod.spines}{per_group}", [
        spine.model, f"{pod.spine_down} down / {pod.spine_up} up of {spine.radix}"], group=gid))
    reach = pod.planes * plan.cores_per_plane
    ratio = _ratio(pod.spine_down, pod.spine_up)
    view.bundles.append(Bundle(spine_id, "core", [
        f"{pod.spine_up} × {plan.speed_gbps}G a spine", f"{pod.links_per_core} to each of {plural(reach, 'core')}",
        f"{groups * pod.spines * pod.spine_up:,} links a pod · {ratio}"]))
    members = plan.units[pod.first_unit:pod.first_unit + pod.units]
    if expanded:
        shown = [[u] for u in members[:MOST_UNITS]] + ([members[MOST_UNITS:]] if len(members) > MOST_UNITS else [])
    else:
        shown = _fold(members)
    for n, units in enumerate(shown):
        _unit(plan, view, f"{gid}_u{n}", units, spine_id, pod.spines, gid, named=expanded or len(pods) == 1)


def _two_tier(plan: Plan, view: View, expand: int | None) -> None:
    spine = plan.tier("spine")
    pod = plan.pod_plans[0]
    groups = plan.rail_groups
    per_group = f" per rail group × {groups}" if groups > 1 else ""
    view.boxes.append(Box("spine", "spine", f"spine × {pod.spines}{per_group}", [
        spine.model, f"{pod.spine_down} of {spine.radix} ports used"]))
    shown: list[list[Unit]] = []
    for units in _fold(plan.units):
        if len(units) <= FEW:  # a small fabric shows every leaf
            shown += [[u] for u in units]
        elif expand is not None and any(u.index == expand - 1 for u in units):
            before = [u for u in units if u.index < expand - 1]
            after = [u for u in units if u.index > expand - 1]
            shown += [x for x in (before, [plan.units[expand - 1]], after) if x]
        else:
            shown.append(units)
    for n, units in enumerate(shown):
        _unit(plan, view, f"u{n}", units, "spine", pod.spines, "", named=True,
              racks=expand is not None and units[0].index == expand - 1 and len(units) == 1)


def _unit(plan: Plan, view: View, uid: str, units: list[Unit], spine_id: str, spines: int, gid: str,
          named: bool, racks: bool = False) -> None:
    leaf = plan.tier("leaf")
    u = units[0]
    group = plan.spec.group(u.group)
    rail = plan.design == "rail-optimized"
    kind = "SU" if rail else "leaf"
    title = f"{kind} × {len(units)}" if len(units) > 1 else (u.name if named else f"{kind} × 1")
    lines = [f"{leaf.model}" + (" rail leaves" if rail else ""),
             f"{plural(u.count, 'node')} each" if len(units) > 1 else plural(u.count, "node"),
             f"{_leaf_down(plan, u)} down / {u.up} up of {leaf.radix}"]
    if named and len(units) > 1:
        lines.insert(0, f"{units[0].name}–{units[-1].name}")
    cells = [f"r{r}" for r in range(len(u.leaves))] if rail else []
    view.boxes.append(Box(uid, "leaf", title, lines, rails=cells, group=gid))
    ratio = _ratio(_leaf_down(plan, u), u.up)
    per_pod = sum(len(x.leaves) * x.up for x in units)
    view.bundles.append(Bundle(uid, spine_id, [
        f"{u.up} × {plan.speed_gbps}G a leaf", f"{u.up // spines} to each of {plural(spines, 'spine')}",
        f"{per_pod:,} links · {ratio}"]))
    gpu = f" × {group.gpus_per_node} {group.gpu}" if group.gpu else ""
    media = endpoint_media(plan)
    node_label = [f"{plan.rails} × {plan.speed_gbps}G a node ({media})"] + (["one per rail"] if rail else [])
    if racks:
        first_rack = None
        for i in range(u.first, u.first + u.count):
            rack = plan.rack_of(group, i)
            if rack != first_rack:
                first_rack = rack
                members = [j for j in range(u.first, u.first + u.count) if plan.rack_of(group, j) == rack]
                rid = f"{uid}_{rack}"
                view.boxes.append(Box(rid, "nodes", rack, [_hostrange(group, members[0], members[-1]),
                                                           plural(len(members), "node") + gpu], group=gid))
                view.bundles.append(Bundle(rid, uid, [f"{len(members) * plan.rails} links"] + node_label))
        return
    nodes = [plural(u.count, "node") + gpu, group.name]
    if named and len(units) == 1:
        nodes.insert(0, _hostrange(group, u.first, u.first + u.count - 1))
    elif len(units) > 1:
        nodes[0] += f" under each {kind}"
    view.boxes.append(Box(f"{uid}_nodes", "nodes", nodes[0], nodes[1:], group=gid))
    view.bundles.append(Bundle(f"{uid}_nodes", uid, node_label))


def _leaf_down(plan: Plan, u: Unit) -> int:
    return u.count * (1 if plan.design == "rail-optimized" else plan.rails)


def _ratio(down: int, up: int) -> str:
    value = down / up if up else 0
    return f"{value:g}:1" if value == round(value, 2) else f"{value:.2f}:1"


def _hostrange(group, lo: int, hi: int) -> str:
    return group.host(lo) if lo == hi else f"{group.host(lo)}–{group.host(hi)}"



# ---- the summary: one box a tier ------------------------------------------------------------------

def summary_view(plan: Plan) -> View:
    """The fabric in four boxes, one a tier, and the three bundles between them: what the README shows at
    its 800 px column, where the folded view's 2,000-point width would leave its text 4 px tall."""
    spec = plan.spec
    rail = plan.design == "rail-optimized"
    gpus = f"{plan.gpus:,} GPUs" if plan.gpus else plural(plan.nodes, "node")
    view = View(f"{spec.name}: {gpus}, {plan.speed_gbps} Gb/s {spec.fabric.type}")
    links = plan.links
    pods = f"{plural(plan.pods, 'pod')} × {plan.tier('spine').count // plan.pods:,}" if plan.tiers == 3 else ""
    core = plan.tier("core")
    if core is not None:
        view.boxes.append(Box("core", "core", f"core × {core.count:,}", [core.model]))
    spine = plan.tier("spine")
    view.boxes.append(Box("spine", "spine", f"spine × {spine.count:,}", [spine.model] + ([pods] if pods else [])))
    leaf = plan.tier("leaf")
    kind = "SU" if rail else "leaf group"
    units = [f"{plural(len(plan.units), kind)} × {plural(plan.rails, 'rail')}"] if rail else []
    view.boxes.append(Box("leaf", "leaf", f"leaf × {leaf.count:,}", [leaf.model] + units))
    per_group = [f"{g.count:,} × {g.gpus_per_node} {g.gpu}" for g in spec.node_groups
                 if g.gpu and g.name in {u.group for u in plan.units}]
    view.boxes.append(Box("nodes", "nodes", f"{plural(plan.nodes, 'node')}", per_group))
    media = endpoint_media(plan)
    view.bundles.append(Bundle("nodes", "leaf", [f"{links.get('node-leaf', 0):,} links",
                                                 f"{plan.rails} × {plan.speed_gbps}G a node ({media})"]))
    view.bundles.append(Bundle("leaf", "spine", [f"{links.get('leaf-spine', 0):,} links",
                                                 f"oversubscription {leaf.ratio}"]))
    if core is not None:
        view.bundles.append(Bundle("spine", "core", [f"{links.get('spine-core', 0):,} links",
                                                     f"oversubscription {spine.ratio}"]))
    return view
