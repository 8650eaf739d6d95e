"""Compute-communication overlap for tensor parallelism: GEMM, collective and overlap benchmarks, and a cost model."""
