"""Scaling laws: the ScaleRL sigmoid in compute, the power law it is compared with, and Chinchilla."""
