"""Both overlap benchmarks of the issue, one after the other:

- overlap_predict.py: predict_overlap against the published Flux measurements (8x H800 AllGather+GEMM and
  GEMM+ReduceScatter, 8x A800 AllGather+GEMM): predicted sequential and overlapped times next to the published
  ones, with ratios; targets: within 15% (sequential) and 25% (overlapped) on the H800 cases.
- overlap_cpu.py: every pattern x method at world size 2 with gloo on a small shape: correctness against the
  sequential result, timings labelled non-representative, and each row's validity checks (most CPU rows are
  flagged invalid; a row scored despite failing a check fails the run).

    python benchmarks/overlap.py
Exit status 1 if either fails.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import overlap_cpu
import overlap_predict


def main() -> int:
    print("=" * 100 + "\nCost model against published measurements\n" + "=" * 100, flush=True)
    predict_status = overlap_predict.main()
    print("\n" + "=" * 100 + "\nEvery pattern x method on CPU (gloo, world size 2)\n" + "=" * 100, flush=True)
    sys.argv = sys.argv[:1]
    cpu_status = overlap_cpu.main()
    return 1 if predict_status or cpu_status else 0


if __name__ == "__main__":
    sys.exit(main())
