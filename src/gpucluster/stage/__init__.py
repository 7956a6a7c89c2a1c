"""Staged nodes: local podman containers running systemd and sshd, standing in for cluster nodes.

image  builds (once per recipe) the node image from the host's Debian mirror;
podman brings a staged cluster up and down and reports its state.
"""

from ._proc import StageError
from .image import ensure_image, image_recipe
from .podman import NodeStatus, StageConfig, StagedCluster, StageNode, down, status, up

__all__ = [
    "NodeStatus",
    "StageConfig",
    "StageError",
    "StageNode",
    "StagedCluster",
    "down",
    "ensure_image",
    "image_recipe",
    "status",
    "up",
]
