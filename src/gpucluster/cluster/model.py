"""The compiled cluster: spec + plan + derived facts, each computed once and read everywhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.errors import Finding, SpecError
from gpucluster.fabric import Plan, PlanError, plan_cluster
from gpucluster.spec.checks import check_rules
from gpucluster.spec.loader import load_spec
from gpucluster.spec.model import ClusterSpec, LoadedSpec


@dataclass(frozen=True, eq=False)
class Cluster:
    """A validated spec, where it came from, its plan, and the warnings both raised."""

    loaded: LoadedSpec
    plan: Plan
    warnings: tuple[Finding, ...] = field(default=())

    @property
    def spec(self) -> ClusterSpec:
        return self.loaded.spec

    @property
    def source(self) -> Path:
        return Path(self.loaded.source)

    @property
    def name(self) -> str:
        return self.spec.name


def _located(loaded: LoadedSpec, findings: list[Finding]) -> list[Finding]:
    name = str(loaded.source)
    return [Finding(f.path, f.message, f.fix, f.rule, f.level, f.file or name, f.line or loaded.line(f.path))
            for f in findings]


def cluster_of(loaded: LoadedSpec) -> Cluster:
    """Check the meaning of a spec that passed the syntax layer, plan it once, and compile it.
    Raises SpecError with every error finding, located in the spec's file."""
    found = list(check_rules(loaded.spec))
    errors = [f for f in found if f.level == "error"]
    if errors:
        raise SpecError(_located(loaded, errors))
    try:
        plan = plan_cluster(loaded.spec)
    except PlanError as exc:
        raise SpecError(_located(loaded, [f for f in exc.findings if f.level == "error"])) from None
    return Cluster(loaded, plan, tuple(_located(loaded, found + list(plan.warnings))))


def load_cluster(path: str | Path) -> Cluster:
    """Read, check and plan a spec file: the one way into gpucluster. Raises SpecError."""
    return cluster_of(load_spec(path, check=False))
