"""`gpucluster demo`: stage up -> configure -> validate -> a Slurm job placed by topology, with a summary."""
