"""Roll a change out to a running cluster in waves that are whole topology units (docs/operations.md,
"Rolling a change out"): actions.py is the operator's entry (start, resume, status, plan, resize_to), waves.py
plans the waves (pure), slurmops.py drains, reboots and resumes nodes through Slurm, engine.py runs the waves and
keeps a state file (state.py) so a rollout can be resumed. Lazy: `gpucluster --help` loads none of it."""

from gpucluster._lazy import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    ".actions": ("Target", "target", "plan", "start", "resume", "status", "resize_to"),
    ".waves": ("BY", "Wave", "WaveError", "parse_max_unavailable", "plan_waves", "topology_units"),
    ".engine": ("Rollout", "Halted", "new_state", "summary"),
    ".slurmops": ("Slurm", "NodeState"),
})
