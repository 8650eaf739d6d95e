"""GPU and cluster health: NVML, kernel logs, DCGM, collective probes, stragglers."""
