"""Fleet health: node checks Slurm runs as its HealthCheckProgram, the drain/resume policy, active
checks as low-priority jobs, and `gpucluster health status` (docs/health.md).

The node side is `gpucluster.node` (standalone scripts, standard library only, floor 0); the modules here
run on the machine that holds the spec: config (checks per node group), slurmconf (the slurm.conf lines),
active (job scripts), files (what the slurm_health role installs), status (drained nodes and results).
"""
