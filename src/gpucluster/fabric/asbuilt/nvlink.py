"""NVLink domains as built: what each node's GPUs report (`nvidia-smi -q`, or `-q -x`), grouped into
the cliques the NVLink fabric formed, and compared with the racks the plan put the nodes in.

On an NVL72 rack every GPU of every compute tray reports the same ClusterUUID and CliqueId once the
fabric is up (Fabric State `Completed`, Status `Success`); NVIDIA Topograph and the GPU feature discovery
label a node with `<ClusterUUID>.<CliqueId>` the same way. A GPU outside a multi-node NVLink fabric reports
`N/A`. Input is one file per node in a folder, named after the node (`gb0001.txt`, `gb0001.xml`): data,
never code. A file that cannot be read at all is a UsageError (exit 2) naming it; a node whose GPUs report
no clique is a finding.

Findings, each fault once (the verify tests inject one of each and expect only it):
- `nvlink-wrong-domain`: a node reports the clique of another rack's domain than the one it was planned in;
- `nvlink-no-clique`: a planned NVLink node whose GPUs report no clique (fabric not up, or not cabled);
- `nvlink-domain-split`: a domain whose trays formed more than one clique: the trays outside the domain's own
  clique, in a clique no other planned rack has, named together with both cliques (one finding per stray clique);
- `nvlink-domains-merged`: two or more planned domains whose trays all formed one clique;
- `nvlink-domain-short`: a domain with fewer trays than planned, counting trays that reported nothing
  (a tray out); trays already reported above are not counted again.

Slurm's side (the blocks slurmctld loaded) is not read here: `fabric verify` works from files and the spec, with
no inventory and no Slurm. `gpucluster validate` compares slurmctld's blocks with the plan's domains
(validate/checks/test_slurm.py, docs/validate.md); both compare against the same plan, so between them the
as-built cliques, the plan and slurmctld are each checked against the plan.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.errors import UsageError
from gpucluster.fabric.asbuilt.findings import Finding
from gpucluster.fabric.plan import Plan

MAX_FILE = 8 << 20  # an nvidia-smi -q of 8 GPUs is ~60 KB; anything far larger is not one
NONE_VALUES = {"", "n/a", "na", "none", "not supported", "[n/a]"}
_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z][A-Za-z0-9 ()/_.-]*?)\s*(?::\s*(?P<value>.*?))?\s*$")


@dataclass(frozen=True)
class GpuFabric:
    """One GPU's Fabric section."""

    state: str = ""
    status: str = ""
    clique: str = ""
    cluster: str = ""

    @property
    def key(self) -> str | None:
        """`<ClusterUUID>.<CliqueId>` (Topograph's cluster id), or None when the GPU is in no clique."""
        if self.clique.lower() in NONE_VALUES or self.cluster.lower() in NONE_VALUES:
            return None
        return f"{self.cluster}.{self.clique}"


@dataclass
class NodeReport:
    node: str
    source: str
    gpus: list[GpuFabric]

    @property
    def cliques(self) -> set[str | None]:
        return {g.key for g in self.gpus}

    @property
    def clique(self) -> str | None:
        """The node's clique: the one all its GPUs agree on, else None."""
        keys = self.cliques
        return next(iter(keys)) if len(keys) == 1 else None


@dataclass
class Discovery:
    nodes: dict[str, NodeReport] = field(default_factory=dict)

    @property
    def cliques(self) -> dict[str, list[str]]:
        """clique -> its nodes (sorted), nodes without one left out."""
        out: dict[str, list[str]] = {}
        for name, rep in sorted(self.nodes.items()):
            if rep.clique is not None:
                out.setdefault(rep.clique, []).append(name)
        return out

    @property
    def no_clique(self) -> list[str]:
        return sorted(n for n, rep in self.nodes.items() if rep.clique is None)

    def as_dict(self) -> dict:
        return {"nodes": len(self.nodes), "cliques": self.cliques, "no_clique": self.no_clique,
                "mixed": sorted(n for n, r in self.nodes.items() if len(r.cliques) > 1)}


def parse_text(text: str) -> list[GpuFabric]:
    """The Fabric blocks of `nvidia-smi -q`: a `Fabric` line, then its keys indented below it."""
    out: list[GpuFabric] = []
    block: dict[str, str] | None = None
    indent = 0
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        key, value, here = m["key"].strip(), m["value"], len(m["indent"])
        if block is not None and here <= indent:
            out.append(_gpu(block))
            block = None
        if key == "Fabric" and value is None:
            block, indent = {}, here
        elif block is not None and value is not None:
            block.setdefault(key.lower(), value.strip())
    if block is not None:
        out.append(_gpu(block))
    return out


def _gpu(block: dict[str, str]) -> GpuFabric:
    return GpuFabric(block.get("state", ""), block.get("status", ""), block.get("cliqueid", ""),
                     block.get("clusteruuid", ""))


def parse_xml(text: str, where: str) -> list[GpuFabric]:
    """`nvidia-smi -q -x`: each <gpu>'s <fabric> element. Tag names are matched without case or
    underscores (cliqueId, clique_id). A document with a DTD or entities is refused: this is data."""
    if "<!ENTITY" in text.upper():
        raise UsageError(f"{where}: an XML entity declaration; nvidia-smi -q -x writes none")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise UsageError(f"{where}: not XML nvidia-smi -q -x output ({exc}); give the file as written") from None
    out = []
    for gpu in root.iter("gpu"):
        fabric = next((c for c in gpu if _norm(c.tag) == "fabric"), None)
        if fabric is None:
            out.append(GpuFabric())
            continue
        vals = {_norm(c.tag): (c.text or "").strip() for c in fabric}
        out.append(GpuFabric(vals.get("state", ""), vals.get("status", ""), vals.get("cliqueid", ""),
                             vals.get("clusteruuid", "")))
    return out


def _norm(tag: str) -> str:
    return tag.replace("_", "").lower()


def read_node(path: Path) -> NodeReport:
    where = str(path)
    try:
        if path.stat().st_size > MAX_FILE:
            raise UsageError(f"{where}: larger than {MAX_FILE >> 20} MB: not one node's nvidia-smi -q")
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"{where}: cannot read ({exc.strerror})") from None
    gpus = parse_xml(text, where) if text.lstrip().startswith("<") else parse_text(text)
    if not gpus:
        raise UsageError(f"{where}: no GPU Fabric section; give the output of `nvidia-smi -q` (or -q -x) of that node")
    return NodeReport(path.name.split(".")[0], where, gpus)


def discover(folder: str | Path) -> Discovery:
    """One report per file of the folder (hidden files skipped); the node is the file name up to its first dot."""
    src = Path(folder)
    if not src.is_dir():
        raise UsageError(f"{src}: not a folder; give a folder with one nvidia-smi -q output per node")
    found = Discovery()
    for path in sorted(p for p in src.iterdir() if p.is_file() and not p.name.startswith(".")):
        rep = read_node(path)
        if rep.node in found.nodes:
            raise UsageError(f"{path}: a second file for node {rep.node} ({found.nodes[rep.node].source})")
        found.nodes[rep.node] = rep
    if not found.nodes:
        raise UsageError(f"{src}: no files; give one nvidia-smi -q output per node, named after the node")
    return found


def verify(plan: Plan, found: Discovery) -> list[Finding]:
    """Each planned domain against the cliques its nodes report. A domain's clique is the one most of its
    reporting nodes share; a node reporting another domain's clique is in the wrong domain, nodes reporting a
    clique no planned domain has split their domain, one reporting none has no clique, a domain whose trays did
    not all report is short by those trays, and domains sharing one clique are merged."""
    findings: list[Finding] = []
    owners: dict[str, list[str]] = {}
    for d in plan.domains:
        group = plan.spec.group(d.group)
        hosts = [group.host(i) for i in range(d.first, d.first + d.count)]
        reports = {h: found.nodes[h] for h in hosts if h in found.nodes}
        own = _clique_of(plan, d, found)
        if own is not None:
            owners.setdefault(own, []).append(d.name)
        stray: dict[str, list[str]] = {}
        for h, rep in reports.items():
            if rep.clique is None:
                findings.append(_no_clique(h, d, rep))
            elif rep.clique != own:
                others = [o.name for o in plan.domains if o is not d and _clique_of(plan, o, found) == rep.clique]
                if not others:
                    stray.setdefault(rep.clique, []).append(h)
                    continue
                findings.append(Finding(
                    "nvlink-wrong-domain", f"{h} was planned in {d.rack} (domain {d.name}) but its GPUs are in "
                    f"the domain of {others[0]} ({rep.clique})", f"move the tray to {d.rack}, or cable it to that "
                    "rack's NVLink switch trays", rep.source, {"node": h, "domain": d.name, "clique": rep.clique}))
        for clique, trays in stray.items():
            findings.append(Finding(
                "nvlink-domain-split", f"domain {d.name} ({d.rack}) is split: {', '.join(trays)} formed clique "
                f"{clique}, apart from the domain's {own}", "check the NVLink cables of those trays and the rack's "
                "NVLink switch trays, then the fabric manager's partition", reports[trays[0]].source,
                {"domain": d.name, "nodes": trays, "clique": clique, "own": own}))
        missing = [h for h in hosts if h not in found.nodes]
        if missing:
            findings.append(Finding(
                "nvlink-domain-short", f"domain {d.name} ({d.rack}) has {d.count - len(missing)} of {d.count} "
                f"trays: {', '.join(missing)} reported nothing", "bring the tray back, or drain it from block "
                "jobs until it is", "", {"domain": d.name, "missing": missing}))
    for clique, names in owners.items():
        if len(names) > 1:
            findings.append(Finding(
                "nvlink-domains-merged", f"domains {', '.join(names)} formed one clique ({clique}), planned as "
                f"{len(names)} racks' domains", "check the NVLink switch trays' cabling between the racks and the "
                "fabric manager's partition", "", {"domain": names[0], "domains": names, "clique": clique}))
    return findings


def _no_clique(h: str, d, rep: NodeReport) -> Finding:
    """A tray in no clique: its GPUs report none, or disagree on one."""
    keys = sorted(k for k in rep.cliques if k is not None)
    if len(keys) > 1:
        why = f"its GPUs disagree on the NVLink clique ({', '.join(keys)})"
    else:
        why = f"its GPUs report no NVLink clique (Fabric state {', '.join(sorted({g.state or '?' for g in rep.gpus}))})"
    return Finding("nvlink-no-clique", f"{h} ({d.rack}, domain {d.name}): {why}", "check the tray's NVLink cables and "
                   "the IMEX/fabric services; nvidia-smi -q shows Fabric State Completed once it has joined",
                   rep.source, {"node": h, "domain": d.name, "rack": d.rack})


def _clique_of(plan: Plan, d, found: Discovery) -> str | None:
    group = plan.spec.group(d.group)
    votes = Counter(found.nodes[h].clique for h in (group.host(i) for i in range(d.first, d.first + d.count))
                    if h in found.nodes and found.nodes[h].clique is not None)
    return votes.most_common(1)[0][0] if votes else None
