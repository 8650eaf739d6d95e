"""Every overlap pattern x method on two gloo ranks on this CPU: correctness, and timings that are NOT representative.

What runs: for ag_gemm, gemm_rs and gemm_ar (Flux shape convention, M=N=256, K=128 by default), the overlap
benchmark's work function (servers/overlap/overlap_bench.py) with every method: sequential, chunked (2 and 4
chunks), ring, and symm_mem (which reports why it cannot run without CUDA GPUs). Each method's output is compared
with the sequential result on every rank; the timings are medians over iterations of the slowest rank.

On a CPU the "communication" is memcpy plus TCP loopback on the same cores that run the GEMM, so the timings check
the plumbing only; they say nothing about GPUs or networks. Every row carries the validity checks of
servers/overlap/validity.py: a row whose timings cannot be true (an overlap faster than its own GEMM, a sequential
schedule that is not GEMM + collective, a wide spread) is printed INVALID with its reason and without scores, and
no best is named from it; on CPU most rows are. The exit status is 1 if any available method fails the correctness
check, or if a row is scored although it fails a validity check (the self-check itself broken).

    python benchmarks/overlap_cpu.py
    python benchmarks/overlap_cpu.py --m 512 --n 512 --k 256 --dtype bf16 --iters 20 --json overlap_cpu.json
"""

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from servers.overlap.overlap_bench import run_overlap_benchmark  # noqa: E402

PATTERNS = ("ag_gemm", "gemm_rs", "gemm_ar")


class QuietContext:
    """What a work function needs from a job context: logs go to a temporary folder, the rest is dropped."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        pass

    def log_metrics(self, step: int | None = None, **values: Any) -> None:
        pass

    def log_path(self, process: str) -> Path:
        path = self.root / "logs" / f"{process}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, default=256)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--k", type=int, default=128)
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    results = []
    failed: list[str] = []
    unchecked: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="overlap-cpu-") as tmp:
        for pattern in PATTERNS:
            spec = {
                "pattern": pattern,
                "m": args.m,
                "n": args.n,
                "k": args.k,
                "dtype": args.dtype,
                "world_size": args.world_size,
                "backend": "gloo",
                "methods": ["sequential", "chunked", "ring", "symm_mem"],
                "chunks": [2, 4],
                "warmup": args.warmup,
                "iters": args.iters,
            }
            with contextlib.redirect_stdout(io.StringIO()):  # the work function prints its own table too
                result = run_overlap_benchmark(spec, QuietContext(Path(tmp)))
            results.append(result)
            failed += [
                f"{pattern}/{row['name']}" for row in result["methods"] if row.get("available") and not row["passed"]
            ]
            unchecked += [
                f"{pattern}/{row['name']}"
                for row in result["methods"]
                if row.get("available")
                and (
                    row["valid"] == bool(row["invalid_reasons"]) or (not row["valid"] and row["efficiency"] is not None)
                )
            ]

    banner = "NOT REPRESENTATIVE: CPU + gloo timings check plumbing and correctness only, not GPU/network performance"
    print("=" * len(banner))
    print(banner)
    print("=" * len(banner))
    print(
        f"{'pattern':<8} {'method':<13} {'ok':>4} {'valid':>5} {'rel err':>9} {'T_gemm':>8} {'T_comm':>8} "
        f"{'T_overlap':>9} {'exposed':>8} {'E':>6} {'speedup':>7}   (times in ms)"
    )
    reasons = []
    for result in results:
        for row in result["methods"]:
            if not row.get("available"):
                print(f"{result['pattern']:<8} {row['name']:<13} {'-':>4} {'-':>5}  {row['reason']}")
                continue
            efficiency = "-" if row["efficiency"] is None else f"{row['efficiency']:.2f}"
            speedup = "-" if row["speedup"] is None else f"{row['speedup']:.2f}"
            exposed = "-" if row["exposed_comm_ms"] is None else f"{row['exposed_comm_ms']:.3f}"
            print(
                f"{result['pattern']:<8} {row['name']:<13} {'yes' if row['passed'] else 'NO':>4} "
                f"{'yes' if row['valid'] else 'NO':>5} {row['rel_err']:>9.1e} {result['t_gemm_ms']:>8.3f} "
                f"{result['t_comm_ms']:>8.3f} {row['t_overlap_ms']:>9.3f} {exposed:>8} {efficiency:>6} {speedup:>7}"
            )
            if row["invalid_reasons"]:
                reasons.append(f"  {result['pattern']}/{row['name']}: {row['invalid_reasons'][0]}")
        print(f"{result['pattern']:<8} best: {result['best'] or '-'} ({result['best_reason']})")
    if reasons:
        print("INVALID rows (first reason each; the full list is in each row's invalid_reasons):")
        print("\n".join(reasons))
    print(
        f"M={args.m} N={args.n} K={args.k} {args.dtype}, world_size {args.world_size} (gloo), {args.iters} iterations; "
        f"tolerance: {results[0]['tolerance']['rule']}; wall time {time.perf_counter() - started:.1f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if unchecked:
        print(f"FAILED self-check (scored although flagged, or flagged without a reason): {', '.join(unchecked)}")
    if failed:
        print(f"FAILED correctness: {', '.join(failed)}")
    if failed or unchecked:
        return 1
    print("all available methods match the sequential result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
