"""Staged nodes: local podman containers running systemd and sshd, standing in for cluster nodes.

image  builds (once per recipe) the node image from the host's Debian mirror;
podman brings a staged cluster up and down and reports its state.
"""

from gpucluster._lazy import lazy_exports

_EXPORTS = {
    "StageError": "._proc",
    "ensure_image": ".image",
    "image_recipe": ".image",
    "NodeStatus": ".podman",
    "StageConfig": ".podman",
    "StagedCluster": ".podman",
    "StageNode": ".podman",
    "down": ".podman",
    "status": ".podman",
    "up": ".podman",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
