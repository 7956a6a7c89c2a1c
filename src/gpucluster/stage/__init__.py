"""Staged nodes: local podman containers running systemd and sshd, standing in for cluster nodes."""

from ._proc import StageError
from .image import ensure_image, image_recipe

__all__ = ["StageError", "ensure_image", "image_recipe"]
