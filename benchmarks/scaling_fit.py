"""Both scaling-fit benchmarks of the issue, one after the other:

- bench_scalerl_fit.py: synthetic ScaleRL curves from every row of the paper's Table 1 (R0 0.25, 75 points on
  100..50,000 GPU-hours, noise SD 0.01, 20 seeds, fitted on 1,500..25,000): |A error|, |prediction error at 50k|
  and time per fit for the robust method (200 bootstrap resamples), the paper's grid, and plain curve_fit.
- bench_chinchilla_fit.py: synthetic Chinchilla data (E 1.82, A 482, B 2085, alpha 0.348, beta 0.366; 250
  points): parameter recovery and time of the robust fit against the naive 4,500-start L-BFGS grid, same process.

    python benchmarks/scaling_fit.py            # about two minutes here
Exit status 1 if either misses its targets.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads: stable timings on a shared machine
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_chinchilla_fit
import bench_scalerl_fit


def main() -> int:
    print("=" * 100 + "\nScaleRL curves\n" + "=" * 100, flush=True)
    scalerl_status = bench_scalerl_fit.main([])
    print("\n" + "=" * 100 + "\nChinchilla\n" + "=" * 100, flush=True)
    sys.argv = sys.argv[:1]
    chinchilla_status = bench_chinchilla_fit.main()
    return 1 if scalerl_status or chinchilla_status else 0


if __name__ == "__main__":
    sys.exit(main())
