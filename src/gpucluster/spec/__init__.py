"""The cluster spec: typed model, located loading, and the checks of meaning."""

from gpucluster.spec.loader import load_spec
from gpucluster.spec.model import ClusterSpec, LoadedSpec, NodeGroup

__all__ = ["ClusterSpec", "LoadedSpec", "NodeGroup", "load_spec"]
