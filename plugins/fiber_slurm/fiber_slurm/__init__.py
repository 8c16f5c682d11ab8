"""fiber-slurm: fibercore jobs as Slurm jobs."""
