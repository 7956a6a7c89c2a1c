"""Everything gpucluster runs on nodes: standalone programs for nodes that have only python3.

Each file imports nothing but the standard library and the files beside it, so no gpucluster package is
needed on a node; roles copy the files as they are, from the folder facts.json names (the controller's
package on a push, the bundle's copy on a node's own pull). `pullrunner.py` is gpucluster-pull (the
pull_runner role installs it as /usr/local/sbin/gpucluster-pull); `roceqos.py` is gpucluster-roce-qos (the
rdma role installs it as /usr/local/sbin/gpucluster-roce-qos); `slurmmetrics.py` is gpucluster-slurm-metrics
(the controller's Slurm metrics for node_exporter, run by a timer: docs/metrics.md).

The health checks (FILES): the slurm_health role copies them to /usr/local/lib/gpucluster/health/ on every
compute node. `runner.py` is Slurm's HealthCheckProgram; `checks.py` runs one check; `decide.py` is the
pure drain/resume decision; `nodestate.py` the node's lifecycle state and record;
`promtext.py` writes the verdict for node_exporter; `xid.py` classifies the GPU
errors of the kernel log by its table; `slurmctl.py` reads and changes the node's state with scontrol, through
`privmunge.py`'s private munged when the node's own is down. `domainguard.py` runs on the controller (a timer
the slurm_health role installs there): it drains a degraded NVLink domain as a unit and resumes it together.
"""

FILES = ("runner.py", "checks.py", "decide.py", "slurmctl.py", "privmunge.py", "breaker.py", "xid.py",
         "nodestate.py", "promtext.py", "domainguard.py")
# The other node programs, each installed by its own role under its command name (not health scripts).
PROGRAMS = {"pullrunner.py": "gpucluster-pull", "roceqos.py": "gpucluster-roce-qos",
            "slurmmetrics.py": "gpucluster-slurm-metrics"}

# Where these files are, for the renderer that ships them (they are copied as they are).
NODE_DIR = __import__("pathlib").Path(__file__).resolve().parent
