"""Training jobs: torchrun here and on Slurm, Ray, Kubernetes and SkyPilot (through servers/engines), sweeps, and
the bundled recipes."""
