"""Turning a recipe into an allocation (local processes or a Slurm job) and talking to it."""
