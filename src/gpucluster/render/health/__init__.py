"""The node health checks' generated files (per-group config, the HealthCheckProgram wrapper, timer units,
the active checks' job scripts) and slurm.conf lines, from the compiled cluster. The checks themselves
are the standalone scripts in gpucluster/node (they run on nodes without gpucluster)."""
