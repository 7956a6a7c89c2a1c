"""One renderer for every generated file: the CLI and the Ansible roles both call `render_all`.

The names are imported on first use (gpucluster._lazy): a node converging itself from a bundle
(gpucluster.configure.pull) runs the roles' filters with gpucluster.render.environment(), and that must
not import the spec models (pydantic), which a node does not have.
"""

from gpucluster._lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    ".fileset": ("nccl_file_for", "render_all", "write_outputs"),
    ".templating": ("environment", "templates_dir"),
})
