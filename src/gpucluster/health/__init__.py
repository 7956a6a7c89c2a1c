"""Fleet health: node checks Slurm runs as its HealthCheckProgram, the drain/resume policy, active
checks as low-priority jobs, and `gpucluster health status` (docs/health.md).

The node side is `gpucluster.node` (standalone scripts, standard library only, floor 0); what is rendered
for it is `gpucluster.render.health`: config (checks per node group), slurmconf (the slurm.conf lines),
active (job scripts), rolefiles (what the slurm_health role installs). The modules here run on the machine
that holds the spec: remote (reading the nodes over SSH), status (drained nodes and results).
"""
