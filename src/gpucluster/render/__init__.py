"""One renderer for every generated file: the CLI and the Ansible roles both call `render_all`."""

from gpucluster.render.fileset import nccl_file_for, render_all, write_outputs
from gpucluster.render.templating import environment, templates_dir

__all__ = ["environment", "nccl_file_for", "render_all", "templates_dir", "write_outputs"]
