"""The overlap cost model against the published Flux measurements (bytedance/flux performance report, as quoted in
the project's overlap reference note), TP=8, bf16, the model used exactly as servers.overlap.cost_model ships it:

    /work/main/.venv/bin/python benchmarks/overlap_predict.py

Targets, for the two H800 cases: the predicted sequential time (t_gemm + t_comm) within 15% of the published torch
total, and the predicted overlapped time (best chunk count) within 25% of the published Flux total. The A800 case
is reported without a target. Exit status 1 if an H800 target is missed.

Shapes: the Flux report lists AllGather+GEMM with M=4096 K=12288 N=49152 (the first MLP GEMM) and GEMM+ReduceScatter
with M=4096 K=49152 N=12288 (the second, same FLOPs). The reference note quotes one shape for all rows; read
literally for GEMM+ReduceScatter it would reduce-scatter a 4096 x 49152 partial (403 MB, four times the gathered
A), which cannot fit the published 0.59 ms of NCCL time at H800 link rates. The script uses the report's shape and
prints the literal reading for information.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.core.errors import InputError
from servers.core.gpus import find_gpu
from servers.overlap.cost_model import OverlapPrediction, predict_overlap

SEQ_TOLERANCE = 0.15
OVERLAP_TOLERANCE = 0.25

# (label, gpu, pattern, m, n, k, published torch total ms, published flux total ms, has a target,
#  published torch gemm ms, published torch comm ms)
CASES = [
    ("8x H800 AllGather+GEMM", "H800-SXM", "ag_gemm", 4096, 49152, 12288, 1.429, 0.957, True, 0.846, 0.583),
    ("8x H800 GEMM+ReduceScatter", "H800-SXM", "gemm_rs", 4096, 12288, 49152, 1.408, 0.932, True, 0.818, 0.590),
    ("8x A800 AllGather+GEMM", "A800-SXM-80GB", "ag_gemm", 4096, 49152, 12288, 3.099, 2.469, False, 2.438, 0.662),
]
L20_CASES = [
    ("8x L20 AllGather+GEMM", "ag_gemm", 16.946, 5.903),
    ("8x L20 GEMM+ReduceScatter", "gemm_rs", 17.664, 5.730),
]


def _row(label: str, p: OverlapPrediction, seq: float, ovl: float, target: bool) -> tuple[str, bool]:
    seq_ratio = p.t_sequential_ms / seq
    ovl_ratio = p.t_overlap_ms / ovl
    if target:
        seq_ok = abs(seq_ratio - 1) <= SEQ_TOLERANCE
        ovl_ok = abs(ovl_ratio - 1) <= OVERLAP_TOLERANCE
        verdict = f"{'PASS' if seq_ok else 'FAIL'} / {'PASS' if ovl_ok else 'FAIL'}"
        ok = seq_ok and ovl_ok
    else:
        verdict = "report only"
        ok = True
    line = (
        f"{label:<28} {p.t_sequential_ms:>8.3f} {seq:>8.3f} {seq_ratio:>6.3f}  "
        f"{p.t_overlap_ms:>8.3f} {ovl:>8.3f} {ovl_ratio:>6.3f} {p.best_chunks:>3}  {verdict}"
    )
    return line, ok


def main() -> int:
    print(
        "Overlap cost model vs published Flux numbers (TP=8, bf16). seq = t_gemm + t_comm vs torch total; "
        f"ovl = best pipelined time vs Flux total. Targets (H800): seq within {SEQ_TOLERANCE:.0%}, "
        f"ovl within {OVERLAP_TOLERANCE:.0%}.\n"
    )
    header = (
        f"{'case':<28} {'seq pred':>8} {'seq pub':>8} {'ratio':>6}  {'ovl pred':>8} {'ovl pub':>8} {'ratio':>6} "
        f"{'C':>3}  seq / ovl"
    )
    print(header)
    print("-" * len(header))
    all_ok = True
    details = []
    for label, gpu, pattern, m, n, k, seq, ovl, target, pub_gemm, pub_comm in CASES:
        p = predict_overlap(pattern, m, n, k, 8, "bf16", gpu)  # type: ignore[arg-type]
        line, ok = _row(label, p, seq, ovl, target)
        all_ok = all_ok and ok
        print(line)
        details.append(
            f"{label}: M={m} N={n} K={k}; gemm {p.t_gemm_ms:.3f} ms predicted vs {pub_gemm:.3f} torch "
            f"({p.gemm_tflops:.0f} TFLOP/s), comm {p.t_comm_ms:.3f} ms vs {pub_comm:.3f} "
            f"({p.bytes_communicated / 1e6:.1f} MB at {p.bus_bandwidth_gbps:.0f} GB/s busbw, {p.protocol}); "
            f"efficiency {p.efficiency:.2f}, speedup {p.speedup:.2f}x at C={p.best_chunks}"
        )
    print()
    for text in details:
        print(text)

    literal = predict_overlap("gemm_rs", 4096, 49152, 12288, 8, "bf16", "H800-SXM")
    print(
        f"\nFor information, GEMM+ReduceScatter with the note's literal shape (K=12288, N=49152): partial "
        f"{literal.bytes_communicated / 1e6:.0f} MB, predicted seq {literal.t_sequential_ms:.3f} ms, ovl "
        f"{literal.t_overlap_ms:.3f} ms; the report's 1.408 / 0.932 ms fit K=49152, N=12288 instead."
    )

    try:
        find_gpu("L20")
    except InputError:
        print(
            "\nL20 (PCIe) Flux numbers not compared: the GPU catalog has no L20 entry. Published, for information: "
            + "; ".join(f"{label} torch {seq:.3f} -> flux {ovl:.3f} ms" for label, _, seq, ovl in L20_CASES)
            + "."
        )
    else:
        print("\nL20 (PCIe), for information only:")
        for label, pattern, seq, ovl in L20_CASES:
            m, n, k = (4096, 49152, 12288) if pattern == "ag_gemm" else (4096, 12288, 49152)
            p = predict_overlap(pattern, m, n, k, 8, "bf16", "L20")  # type: ignore[arg-type]
            print(_row(label, p, seq, ovl, False)[0])

    print(f"\n{'all H800 targets met' if all_ok else 'an H800 target was missed'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
