"""Staged nodes: local podman containers running systemd and sshd, standing in for cluster nodes.

image  builds (once per recipe) the node image from the host's Debian mirror;
podman brings a staged cluster up and down and reports its state.
"""

from gpucluster._lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "._proc": ("StageError",),
    ".image": ("ensure_image", "image_recipe"),
    ".podman": ("NodeStatus", "StageConfig", "StagedCluster", "StageNode", "down", "status", "up"),
})
