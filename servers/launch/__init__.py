"""Training jobs: local torchrun first, then Slurm, Kubernetes and SkyPilot, and bundled recipes."""
