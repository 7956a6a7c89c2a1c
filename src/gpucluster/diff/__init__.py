"""`gpucluster diff`: what changes between two specs, on which hosts, and what the change disrupts."""

from gpucluster.diff.changes import CLASSES, Change, DiffResult, diff_clusters, diff_specs

__all__ = ["CLASSES", "Change", "DiffResult", "diff_clusters", "diff_specs"]
