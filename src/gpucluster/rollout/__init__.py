"""Roll a change out to a running cluster in waves that are whole topology units (docs/operations.md,
"Rolling a change out"): waves.py plans them (pure), slurm.py talks to Slurm, engine.py runs them and
keeps a state file so a rollout can be resumed."""

from gpucluster.rollout.waves import BY, Wave, WaveError, parse_max_unavailable, plan_waves, topology_units

__all__ = ["BY", "Wave", "WaveError", "parse_max_unavailable", "plan_waves", "topology_units"]
