"""The node side of the health checks: standalone scripts for nodes that have only python3.

The slurm_health role copies these files to /usr/local/lib/gpucluster/health/ on every compute node;
they import nothing but the standard library and each other, so no gpucluster package is needed
there. `runner.py` is Slurm's HealthCheckProgram; `checks.py` runs one check; `decide.py` is the
pure drain/resume decision; `slurmctl.py` reads and changes the node's state with scontrol, through
`privmunge.py`'s private munged when the node's own is down.
"""

FILES = ("runner.py", "checks.py", "decide.py", "slurmctl.py", "privmunge.py")

# Where these files are, for the renderer that ships them (they are copied as they are).
NODE_DIR = __import__("pathlib").Path(__file__).resolve().parent
