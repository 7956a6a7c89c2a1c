"""The validation suite: `gpucluster validate INVENTORY` checks a cluster against its spec and plan.

validation the entry: validate(INVENTORY, ...) runs the suite and returns the report (the command prints it)
expect     what the cluster must look like, from spec, plan, renderer and inventory (one JSON document)
inventory  the Ansible inventory, read directly
suite      the checks over SSH, hosts in parallel (pytest-xdist)
viaslurm   the checks as a Slurm job on the nodes themselves, results merged
report     JUnit merge, one-screen summary, HTML
checks/    the pytest + testinfra checks (stdlib + testinfra only: they also run on the nodes)
"""
