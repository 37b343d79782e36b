"""Slurm for gpu-slurm: reading sinfo and squeue output (pure) and running the commands."""
