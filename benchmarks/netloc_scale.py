"""How localize_network_fault's time and memory grow with the probes (issue 21, defect 7), each against a baseline
measured in the same run: the same call on half the probes.

Cases (every row set drawn from a seeded numpy generator; the topology validation and row reading are part of the
call, as a tool's user sees it):
- ``random``: 2,048 nodes x 8 NICs (servers/diagnostics/netsim.py: rail-optimised, 32 nodes per leaf, 512 leaves,
  16 spines), random NIC pairs without spines (ECMP-ambiguous across leaves), 10% of probes with random loss and
  lognormal latencies: --probes and twice as many (default 200,000 and 400,000).
- ``random_all_bad``: the same pairs with every probe's loss and latency random, so that nearly all are bad and the
  greedy search makes its maximum number of picks (the case whose time grew fastest before: every pick recomputed
  every candidate's gains over all probes).
- ``wide_ecmp``: 2 leaves x 1,024 shared spines, 64 single-NIC nodes, cross-leaf probes without spines, one bad NIC
  and 3% noise: --wide-probes and twice as many (default 12,000 and 24,000; before the ECMP table, 12,000 took 69 s
  and 4.1 GB).

For each case: the n and 2n calls alternate, --runs of each (the median is reported), then one more call of each
under tracemalloc for the peak of the memory it allocated (numpy's arrays included; the rows given are not counted).
Reported per case: the times, the peaks, and the ratio time(2n) / time(n), which a linear cost puts near 2; a case
passes when the ratio is at most --max-ratio (2.6). The exit status is 1 if any case fails. Times depend on the
machine and its load; the ratios much less.

Run from the repository root:
  python benchmarks/netloc_scale.py [--probes 200000] [--wide-probes 12000] [--runs 3] [--cases random,wide_ecmp]
                                    [--max-ratio 2.6] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.diagnostics.netloc import localize_network_fault
from servers.diagnostics.netsim import build_fleet

Case = Callable[[int], tuple[dict[str, Any], list[dict[str, Any]]]]


def random_rows(n: int, all_bad: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    fleet = build_fleet(2048)
    names = fleet.nic_names
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, len(names), n), rng.integers(0, len(names), n)
    b = np.where(a == b, (b + 1) % len(names), b)
    if all_bad:
        loss, latency = rng.random(n), rng.random(n) * 100
    else:
        loss = np.where(rng.random(n) < 0.1, rng.random(n), 0.0)
        latency = 5 * np.exp(rng.normal(0, 0.5, n))
    rows = [
        {"src_nic": names[x], "dst_nic": names[y], "latency_us": float(lat), "loss_rate": float(q)}
        for x, y, lat, q in zip(a.tolist(), b.tolist(), latency.tolist(), loss.tolist(), strict=True)
    ]
    return fleet.topology, rows


def wide_ecmp_rows(n: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spines = [f"s{i}" for i in range(1024)]
    nodes = [
        {"name": f"n{i}", "nics": [{"name": f"n{i}-0", "rail": 0, "leaf": "A" if i < 32 else "B"}]} for i in range(64)
    ]
    leaves = [{"name": leaf, "tier": "leaf", "uplinks": spines} for leaf in ("A", "B")]
    topology = {"nodes": nodes, "switches": leaves + [{"name": s, "tier": "spine"} for s in spines]}
    rng = np.random.default_rng(0)
    src, dst, noise = rng.integers(0, 32, n), rng.integers(32, 64, n), rng.random(n) < 0.03
    rows = [
        {"src_nic": f"n{x}-0", "dst_nic": f"n{y}-0", "latency_us": 5.0, "loss_rate": 0.5 if x == 3 or e else 0.0}
        for x, y, e in zip(src.tolist(), dst.tolist(), noise.tolist(), strict=True)
    ]
    return topology, rows


CASES: dict[str, Case] = {
    "random": lambda n: random_rows(n, all_bad=False),
    "random_all_bad": lambda n: random_rows(n, all_bad=True),
    "wide_ecmp": wide_ecmp_rows,
}


def call(topology: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = localize_network_fault(topology, rows)
    return time.perf_counter() - start, result


def peak_mb(topology: dict[str, Any], rows: list[dict[str, Any]]) -> float:
    tracemalloc.start()
    localize_network_fault(topology, rows)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def measure(case: Case, n: int, runs: int) -> list[dict[str, Any]]:
    """The n and 2n calls, alternated run after run (and which goes first swapped) so that load on the machine hits
    both alike."""
    inputs = [case(n), case(2 * n)]
    seconds: list[list[float]] = [[], []]
    results: list[Any] = [None, None]
    for r in range(runs):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            took, results[i] = call(*inputs[i])
            seconds[i].append(took)
    return [
        {
            "probes": len(rows),
            "seconds": statistics.median(seconds[i]),
            "peak_mb": peak_mb(topology, rows),
            "faulty": results[i].faulty_count,
            "bad": results[i].probes.bad,
        }
        for i, (topology, rows) in enumerate(inputs)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", type=int, default=200_000, help="the random cases' baseline size")
    parser.add_argument("--wide-probes", type=int, default=12_000, help="the wide_ecmp case's baseline size")
    parser.add_argument("--runs", type=int, default=3, help="timed calls per size (the median is reported)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--max-ratio", type=float, default=2.6, help="time(2n) / time(n) above this fails")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; accepted: {', '.join(CASES)}")
    report: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine(), "cases": {}}
    failed = False
    print("| case | probes | time (s) | peak (MB) | faulty | probes 2n | time 2n (s) | peak 2n (MB) | ratio | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        n = args.wide_probes if name == "wide_ecmp" else args.probes
        small, large = measure(CASES[name], n, args.runs)
        ratio = large["seconds"] / small["seconds"]
        ok = ratio <= args.max_ratio
        failed |= not ok
        report["cases"][name] = {"n": small, "2n": large, "ratio": ratio, "ok": ok}
        print(
            f"| {name} | {small['probes']:,} | {small['seconds']:.2f} | {small['peak_mb']:.0f} | {small['faulty']} | "
            f"{large['probes']:,} | {large['seconds']:.2f} | {large['peak_mb']:.0f} | {ratio:.2f} | "
            f"{'yes' if ok else 'NO'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
