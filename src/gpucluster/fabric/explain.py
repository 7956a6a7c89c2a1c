"""Why a count is above its arithmetic minimum: one line per count that rounding or even spreading raised.

The planner keeps every switch's uplinks spread evenly over the switches above it, and a node's NICs
(or a scalable unit's rails) on leaves of their own. Both round counts up. A reviewer should not have
to reverse-engineer that from a tier table, so each raised count says by how much, why, and the
nearest design change that would avoid it. Counts at their minimum say nothing.

Minimums are pure arithmetic at the chosen switch models and declared oversubscription:
- leaves: endpoints / the most downlinks a leaf takes;
- leaf-spine and spine-core links: what each switch's downlinks need at the declared ratio;
- spines: leaf-spine links / the most downlinks a spine takes (all its ports on a 2-tier top);
- cores: spine-core links / the core's ports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpucluster.fabric.plan import Plan, PodPlan, Unit, _divisors, _max_down, _up


@dataclass(frozen=True)
class Explanation:
    subject: str  # what is counted: "leaf switches", "spine-core links", ...
    count: int
    minimum: int
    why: str
    fix: str

    @property
    def excess(self) -> int:
        return self.count - self.minimum

    def render(self) -> str:
        return (f"{self.subject}: {self.count:,}, {self.excess:,} above the {self.minimum:,} the arithmetic needs: "
                f"{self.why}; {self.fix}")

    def as_dict(self) -> dict:
        return {"subject": self.subject, "count": self.count, "minimum": self.minimum, "excess": self.excess,
                "why": self.why, "fix": self.fix}


def _n(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def _names(items: list[str], most: int = 3) -> str:
    shown = items[:most]
    rest = len(items) - len(shown)
    text = ", ".join(shown[:-1]) + (" and " if len(shown) > 1 else "") + shown[-1] if shown else ""
    return text + (f" and {rest:,} more" if rest else "")


def _partial_units(plan: Plan) -> list[Unit]:
    return [u for u in plan.units if u.count < plan.unit_nodes]


def _unit_word(plan: Plan, n: int = 2) -> str:
    if plan.design == "rail-optimized":
        return "SU" if n == 1 else "SUs"
    return "leaf" if n == 1 else "leaves"


def _leaf_down(plan: Plan, unit: Unit) -> int:
    return unit.count * (1 if plan.design == "rail-optimized" else plan.rails)


def _pod_label(plan: Plan, pod: PodPlan) -> str:
    return f"pod {pod.index + 1}" if plan.tiers == 3 else "the fabric"


def explain(plan: Plan) -> list[Explanation]:
    """Every raised count of the plan, in tier order."""
    out = [_leaves(plan), _leaf_links(plan), _spines(plan)]
    if plan.tiers == 3:
        out += [_spine_links(plan), _cores(plan)]
    return [e for e in out if e is not None and e.excess > 0]


# ---- leaves -------------------------------------------------------------------------------------

def _leaves(plan: Plan) -> Explanation | None:
    spec = plan.spec
    leaf = plan.tier("leaf")
    ratio = spec.fabric.ratio("leaf")
    most = _max_down(leaf.radix, ratio)
    minimum = math.ceil(plan.endpoints / most)
    if leaf.count <= minimum:
        return None
    why, fix = [], []
    at_design = math.ceil(plan.endpoints / leaf.down)
    if leaf.down < most:
        fab = spec.fabric
        at = fab.oversubscription.get("leaf", "1:1")
        share = f"each leaf takes {leaf.down} of the {most} downlinks a {leaf.radix}-port leaf offers at {at}"
        if plan.design == "rail-optimized":
            why.append(f"{share} (scalable_unit_nodes: {plan.unit_nodes}, one rail of each node per leaf)")
            trays = max((d.planned for d in plan.domains), default=1)  # a unit holds whole NVLink domains
            fill = most // trays * trays
            if fill > plan.unit_nodes:
                fix.append(f"scalable_unit_nodes: {fill} would fill every leaf" if fill == most else
                           f"scalable_unit_nodes: {fill} ({fill // trays} whole NVLink domains) would fill more")
            elif trays > 1:
                fix.append(f"no larger unit of whole {trays}-tray NVLink domains fits a {leaf.radix}-port leaf")
        elif fab.nodes_per_leaf and fab.nodes_per_leaf < most // plan.rails:
            why.append(f"{share} (nodes_per_leaf: {fab.nodes_per_leaf})")
            fix.append(f"nodes_per_leaf: {most // plan.rails} is the most a leaf takes")
        else:
            why.append(f"{share}: a node's {plan.rails} NICs land on one leaf, and {most} is not a multiple of "
                       f"{plan.rails}")
            fix.append("design: rail-optimized (a leaf per rail) or a leaf whose downlinks are a multiple of "
                       f"{plan.rails} would leave no port idle")
    partial = _partial_units(plan)
    if partial and leaf.count > at_design:
        if why:
            why[-1] += f" ({at_design - minimum:,} of the extra leaves)"
        per_unit = len(partial[0].leaves)
        names = _names([f"{u.name} ({u.count} of {plan.unit_nodes} nodes)" for u in partial])
        its = "its" if len(partial) == 1 else "their"
        rails = f", and each of {its} {per_unit} rails has a leaf of its own" if per_unit > 1 else ""
        why.append(f"{names} {'is' if len(partial) == 1 else 'are'} partial{rails}")
        fix.append(_fill_groups(plan, partial))
    return Explanation("leaf switches", leaf.count, minimum, "; ".join(why), "; ".join(fix))


def _fill_groups(plan: Plan, partial: list[Unit]) -> str:
    """The node counts per group, nearest below and above, that leave no unit partial."""
    spec = plan.spec
    parts = []
    for u in partial:
        g = spec.group(u.group)
        low, high = g.count - u.count, g.count - u.count + plan.unit_nodes
        full = _n(high // plan.unit_nodes, f"full {_unit_word(plan, 1)}", f"full {_unit_word(plan)}")
        parts.append(f"{g.name}: {high:,} nodes ({full})" + (f" or {low:,}" if low else ""))
    return "node counts that fill every unit: " + "; ".join(parts)


def _leaf_links(plan: Plan) -> Explanation | None:
    ratio = plan.spec.fabric.ratio("leaf")
    need = sum(len(u.leaves) * _up(_leaf_down(plan, u), ratio) for u in plan.units)
    count = plan.links["leaf-spine"]
    if count <= need:
        return None
    raised = [u for u in _partial_units(plan) if u.up > _up(_leaf_down(plan, u), ratio)]
    if not raised:
        return None
    pods = plan.pod_plans
    lines = [f"{u.name} has {u.up} a leaf for {_n(u.count, 'node')} ({_pod_label(plan, pods[u.pod])}, "
             f"{_n(pods[u.pod].spines, 'spine')})" for u in raised]
    why = ("a leaf reaches each spine of its pod with as many links as the others, so a partial unit's leaves "
           "round their uplinks up to a multiple of the pod's spines: " + _names(lines))
    return Explanation("leaf-spine links", count, need, why, _fill_groups(plan, raised))


# ---- spines -------------------------------------------------------------------------------------

def _spine_most(plan: Plan) -> int:
    spine = plan.tier("spine")
    return spine.radix if plan.tiers == 2 else _max_down(spine.radix, plan.spec.fabric.ratio("spine"))


def _pod_links(plan: Plan, pod: PodPlan) -> int:
    """Leaf-spine links of one rail group of a pod."""
    members = plan.units[pod.first_unit:pod.first_unit + pod.units]
    return sum(len(u.leaves) // plan.rail_groups * u.up for u in members)


def _spines(plan: Plan) -> Explanation | None:
    spine = plan.tier("spine")
    leaf = plan.tier("leaf")
    most = _spine_most(plan)
    links = plan.links["leaf-spine"]
    minimum = math.ceil(links / most)
    if spine.count <= minimum:
        return None
    groups = plan.rail_groups
    needed = [math.ceil(_pod_links(plan, p) / most) for p in plan.pod_plans]
    why = []
    separate = groups * sum(needed)
    if separate > minimum:
        owners = (["pod"] if plan.tiers == 3 else []) + (["rail group"] if groups > 1 else [])
        why.append(f"each {' and each '.join(owners)} has spines of its own ({separate:,} needed between them)")
    raised = [(p, n) for p, n in zip(plan.pod_plans, needed, strict=True) if p.spines > n]
    if raised:
        shapes: dict[tuple[int, int], list[PodPlan]] = {}
        for p, n in raised:
            shapes.setdefault((p.spines, n), []).append(p)
        where = []
        for (spines, n), pods in shapes.items():
            who = _pod_label(plan, pods[0]) if len(pods) == 1 else _n(len(pods), "pod")
            where.append(f"{who} {'has' if len(pods) == 1 else 'have'} {spines} spines where {n} would carry "
                         f"{'its' if len(pods) == 1 else 'their'} links")
        whose = "a pod's" if plan.tiers == 3 else "the"
        why.append(f"each leaf spreads its {leaf.up} uplinks evenly, so {whose} spine count divides {leaf.up}: "
                   + "; ".join(where))
    return Explanation("spine switches", spine.count, minimum, "; ".join(why), _spine_fix(plan, most))


def _spine_fix(plan: Plan, most: int) -> str:
    leaf = plan.tier("leaf")
    per_unit = max(1, len(plan.units[0].leaves) // plan.rail_groups)
    s = plan.spines_per_group
    full = [p for p in plan.pod_plans if p.units == plan.units_per_pod] if plan.tiers == 3 else plan.pod_plans
    fixes = []
    if full and full[0].spine_down < most:
        # leaves per group that fill s spines, and s' (the divisor below) spines
        below = [d for d in _divisors(leaf.up) if d < s]
        options = []
        for spines in ([below[-1]] if below else []) + [s]:
            leaves = spines * most // leaf.up
            if leaves and leaves % per_unit == 0:
                nodes = leaves // per_unit * plan.unit_nodes
                options.append((spines, leaves, nodes))
        if plan.tiers == 3:
            text = [f"nodes_per_pod: {nodes:,} would fill {spines} spines a pod" for spines, _l, nodes in options
                    if nodes != plan.units_per_pod * plan.unit_nodes]
        else:
            text = [f"{_n(leaves, 'leaf', 'leaves')} ({nodes:,} nodes) would fill {_n(spines, 'spine')}"
                    for spines, leaves, nodes in options]
        fixes += text
    if plan.tiers == 3:
        fixes += [_fill_pod(plan, p, "would fill its spines") for p in plan.pod_plans
                  if p.spine_down < plan.tier("spine").down]
    return "; ".join(fixes) or "a spine switch with more ports would need fewer of them"


def _fill_pod(plan: Plan, pod: PodPlan, effect: str) -> str:
    """How many more nodes give a partial pod's spines their designed downlinks."""
    leaf = plan.tier("leaf")
    per_unit = max(1, len(plan.units[0].leaves) // plan.rail_groups)
    units = pod.spines * plan.tier("spine").down // (leaf.up * per_unit)
    have = sum(u.count for u in plan.units[pod.first_unit:pod.first_unit + pod.units])
    return (f"{units * plan.unit_nodes - have:,} more nodes in {_pod_label(plan, pod)} "
            f"({units} full {_unit_word(plan, units)}) {effect}")


def _spine_links(plan: Plan) -> Explanation | None:
    ratio = plan.spec.fabric.ratio("spine")
    groups = plan.rail_groups
    need = groups * sum(p.spines * _up(p.spine_down, ratio) for p in plan.pod_plans)
    count = plan.links["spine-core"]
    if count <= need:
        return None
    raised = [p for p in plan.pod_plans if p.spine_up > _up(p.spine_down, ratio)]
    c = plan.cores_per_plane
    lines = [f"{_pod_label(plan, p)}'s {p.spines} spines take {p.spine_down} links down, need "
             f"{_up(p.spine_down, ratio)} up and have {p.spine_up}, the fewest that split evenly over the "
             f"{p.planes * c} cores each reaches ({p.links_per_core} each)" for p in raised]
    fixes = [_fill_pod(plan, p, "would use every uplink") for p in raised]
    return Explanation("spine-core links", count, need, _names(lines, 2),
                       "; ".join(fixes) or "pods whose spine downlinks are a multiple of the cores they reach")


# ---- cores --------------------------------------------------------------------------------------

def _cores(plan: Plan) -> Explanation | None:
    core = plan.tier("core")
    spine = plan.tier("spine")
    links = plan.links["spine-core"]
    minimum = math.ceil(links / core.radix)
    if core.count <= minimum:
        return None
    planes = plan.rail_groups * plan.spines_per_group
    c = plan.cores_per_plane
    per = spine.up // c
    shares = sorted({p.links_per_core for p in plan.pod_plans}, reverse=True)
    if len(shares) == 1:
        sum_text = f"{_n(plan.pods, 'pod')} x {per} = {core.down}"
    else:
        counts = {m: sum(1 for p in plan.pod_plans if p.links_per_core == m) for m in shares}
        sum_text = " + ".join(f"{counts[m]} x {m}" if counts[m] > 1 else str(m) for m in shares) + f" = {core.down}"
    why = (f"{core.count:,} cores use {core.down} of {core.radix} ports each: a full pod's {plan.spines_per_group} "
           f"spines make {_n(planes, 'core plane')}, each spine's {spine.up} uplinks split evenly over its plane's "
           f"{_n(c, 'core')} ({per} each), and {sum_text}")
    return Explanation("core switches", core.count, minimum, why, _core_fix(plan))


def _core_fix(plan: Plan) -> str:
    """Pod counts, nearest below and above, whose cores would have every port in use."""
    core = plan.tier("core")
    spine = plan.tier("spine")
    planes = plan.rail_groups * plan.spines_per_group
    fills = []
    for c in _divisors(spine.up):
        per = spine.up // c
        if core.radix % per == 0:
            fills.append((core.radix // per, planes * c))
    below = [f for f in fills if plan.pods / 2 <= f[0] < plan.pods]
    above = [f for f in fills if plan.pods < f[0] <= 2 * plan.pods]
    picks = ([min(above)] if above else []) + ([max(below)] if below else [])
    if not picks:
        most = core.radix // (spine.up // plan.cores_per_plane)
        used = most * (spine.up // plan.cores_per_plane)
        return f"the same {core.count:,} cores have room for {_n(most, 'pod')} ({used} of {core.radix} ports)"
    return "; ".join(f"{pods} pods instead of {plan.pods} would use {cores:,} cores fully" for pods, cores in picks)
