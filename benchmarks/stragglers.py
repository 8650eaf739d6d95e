"""Straggler detection: detection rate and false positives of servers.diagnostics.stragglers.detect_stragglers on
simulated per-rank step times. Seeded; run by hand, never as a timed test.

What is simulated, per trial: a job of N ranks (8 per node) logging every step for S steps. Each rank's time at a
step is base * c_step * (1 + e) where c_step is a factor all ranks share at that step (uniform 0.95..1.05: data,
checkpointing), e is the rank's own noise (gaussian, sigma = --noise levels), and a few cells (0.5%) are one-off
spikes of 1.5x to 3x (a GC pause, a page fault storm). 1% of the ranks (at least one) are slow: from an onset step
drawn in the first half of the job to the end, their time is multiplied by 1 + d, with d drawn uniformly from the
slowdown band of the row (10-20%, 20-35%, 35-50%).

Measured: detection rate (slow ranks reported as stragglers / slow ranks), slow ranks reported as likely
stragglers instead, false positives (healthy ranks reported as stragglers / healthy ranks, and per trial), healthy
ranks reported as likely stragglers, the median error of since_step against the true onset (in steps), and the
median time of one detect_stragglers call (its row validation included).

Second table, pairs (issue 22, defect 8: tiny-gpt on 2 CPU ranks, one slowed 1.5x, was "the whole job slowed
together"): 2 ranks, a row every 10 steps (20 rows, each an average of 10 iterations, as the recipes log them),
every row's own work drawn with gaussian noise (sigma 4% or 8%). Cases: "first": rank 0 slowed by 1.4-2x from a row
drawn in 8..12, and in half the trials rank 1 too, later (3-4 rows) and by less (so that rank 0 stays at least 15%
slower); "noise": nobody slowed; "together": both slowed by the same factor from the same row. Measured per case:
rank 0 (first) or any rank (the others) reported as a straggler, as a likely straggler, neither; and reports that
say the ranks slowed together (changed_together), which in "first" names a wrong cause.

Run from the repository root: python benchmarks/stragglers.py [--quick] [--seed 0]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.diagnostics.stragglers import detect_stragglers

BANDS = ((0.10, 0.20), (0.20, 0.35), (0.35, 0.50))
NOISES = (0.02, 0.05)
SPIKE_FRACTION = 0.005
RANKS_PER_NODE = 8
# (ranks, steps, trials) per fleet size; 16,384 ranks x 60 steps stays under the 1,000,000-row input cap
FLEETS = ((64, 100, 20), (512, 100, 10), (4096, 100, 3), (16384, 60, 1))
QUICK_FLEETS = ((64, 100, 5), (512, 100, 2))


@dataclass
class Outcome:
    slow: int = 0
    found: int = 0
    likely: int = 0
    healthy: int = 0
    false_positives: int = 0
    false_likely: int = 0
    trials_with_fp: int = 0
    since_errors: list[int] | None = None
    seconds: list[float] | None = None

    def __post_init__(self) -> None:
        self.since_errors = []
        self.seconds = []


def simulate(
    rng: random.Random, ranks: int, steps: int, noise: float, band: tuple[float, float]
) -> tuple[list[dict[str, object]], dict[int, int]]:
    """Rows and {slow rank: onset step}."""
    count = max(1, round(ranks * 0.01))
    slow = {r: rng.randint(1, steps // 2) for r in rng.sample(range(ranks), count)}
    factor = {r: 1.0 + rng.uniform(*band) for r in slow}
    rows: list[dict[str, object]] = []
    gauss, uniform, chance = rng.gauss, rng.uniform, rng.random
    for step in range(1, steps + 1):
        common = uniform(0.95, 1.05)
        for rank in range(ranks):
            t = 0.5 * common * max(0.2, 1.0 + gauss(0.0, noise))
            if chance() < SPIKE_FRACTION:
                t *= uniform(1.5, 3.0)
            onset = slow.get(rank)
            if onset is not None and step >= onset:
                t *= factor[rank]
            rows.append({"rank": rank, "step": step, "step_time_s": t, "node": f"n{rank // RANKS_PER_NODE}"})
    return rows, slow


def run(
    fleets: tuple[tuple[int, int, int], ...], seed: int
) -> list[tuple[int, int, float, tuple[float, float], Outcome]]:
    results = []
    for ranks, steps, trials in fleets:
        for noise in NOISES:
            for band in BANDS:
                outcome = Outcome()
                rng = random.Random(f"{seed}-{ranks}-{noise}-{band}")
                for _ in range(trials):
                    rows, slow = simulate(rng, ranks, steps, noise, band)
                    started = time.perf_counter()
                    report = detect_stragglers(rows)
                    outcome.seconds.append(time.perf_counter() - started)  # type: ignore[union-attr]
                    assert report.stragglers_omitted == 0
                    flagged = {e.rank: e for e in report.stragglers}
                    likely = {e.rank for e in report.likely_stragglers}
                    assert report.likely_stragglers_omitted == 0
                    outcome.likely += sum(1 for r in slow if r in likely)
                    outcome.false_likely += sum(1 for r in likely if r not in slow)
                    outcome.slow += len(slow)
                    outcome.healthy += ranks - len(slow)
                    outcome.found += sum(1 for r in slow if r in flagged)
                    fp = sum(1 for r in flagged if r not in slow)
                    outcome.false_positives += fp
                    outcome.trials_with_fp += fp > 0
                    for r, onset in slow.items():
                        if r in flagged and flagged[r].since_step is not None:
                            outcome.since_errors.append(abs(flagged[r].since_step - onset))  # type: ignore[union-attr,operator]
                results.append((ranks, steps, noise, band, outcome))
                print(_line(ranks, steps, noise, band, trials, outcome), flush=True)
    return results


def _line(ranks: int, steps: int, noise: float, band: tuple[float, float], trials: int, o: Outcome) -> str:
    rate = o.found / o.slow if o.slow else float("nan")
    fp_rate = o.false_positives / o.healthy if o.healthy else float("nan")
    since = statistics.median(o.since_errors) if o.since_errors else float("nan")
    seconds = statistics.median(o.seconds) if o.seconds else float("nan")
    head = f"| {ranks:>6} | {steps:>5} | {noise:>4.0%} | {band[0]:.0%}-{band[1]:.0%} | {trials:>6} "
    found = f"| {o.found:>4}/{o.slow:<4} | {rate:>6.1%} | {o.likely:>3} | {o.false_positives:>3} ({fp_rate:.4%}) "
    found += f"| {o.false_likely:>3} "
    tail = f"| {o.trials_with_fp:>3} | {since:>5.1f} | {seconds:>7.3f} |"
    return head + found + tail


HEADER = (
    "| ranks  | steps | noise | slowdown | trials | found     | detection | slow ranks likely | false positives (rate) "
    "| healthy ranks likely | trials with FP | since error (steps, median) | s per call |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)

PAIR_NOISES = (0.04, 0.08)
PAIR_CASES = ("first", "noise", "together")
PAIR_TRIALS, QUICK_PAIR_TRIALS = 300, 60
PAIR_ROWS, PAIR_STRIDE = 20, 10


def simulate_pair(rng: random.Random, case: str, noise: float) -> list[dict[str, object]]:
    """Rows of a 2-rank job logged every PAIR_STRIDE steps (see the module docstring for the cases)."""
    factor = {0: 1.0, 1: 1.0}
    onset = {0: PAIR_ROWS + 1, 1: PAIR_ROWS + 1}
    if case == "first":
        factor[0], onset[0] = rng.uniform(1.4, 2.0), rng.randint(8, 12)
        if rng.random() < 0.5:
            factor[1], onset[1] = rng.uniform(1.0, factor[0] / 1.15), onset[0] + rng.randint(3, 4)
    elif case == "together":
        shared, start = rng.uniform(1.3, 2.0), rng.randint(8, 12)
        factor, onset = {0: shared, 1: shared}, {0: start, 1: start}
    rows: list[dict[str, object]] = []
    for row in range(1, PAIR_ROWS + 1):
        for rank in (0, 1):
            work = 0.0065 * max(0.3, 1.0 + rng.gauss(0.0, noise)) * (factor[rank] if row >= onset[rank] else 1.0)
            rows.append({"rank": rank, "step": row * PAIR_STRIDE, "step_time_s": work + 0.018, "compute_s": work})
    return rows


def run_pairs(trials: int, seed: int) -> list[tuple[str, float, dict[str, int]]]:
    print(
        "\n| case | noise | trials | straggler | likely straggler | neither | reports 'slowed together' |\n"
        "|---|---|---|---|---|---|---|"
    )
    results = []
    for case in PAIR_CASES:
        for noise in PAIR_NOISES:
            rng = random.Random(f"{seed}-pair-{case}-{noise}")
            tally = {"straggler": 0, "likely": 0, "neither": 0, "together": 0}
            for _ in range(trials):
                report = detect_stragglers(simulate_pair(rng, case, noise))
                judged = {0} if case == "first" else {0, 1}
                if any(e.rank in judged for e in report.stragglers):
                    tally["straggler"] += 1
                elif any(e.rank in judged for e in report.likely_stragglers):
                    tally["likely"] += 1
                else:
                    tally["neither"] += 1
                tally["together"] += report.changed_together is not None
            results.append((case, noise, tally))
            print(
                f"| {case} | {noise:.0%} | {trials} | {tally['straggler']} | {tally['likely']} | {tally['neither']} "
                f"| {tally['together']} |",
                flush=True,
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 and 512 ranks only, fewer trials")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"# stragglers benchmark (seed {args.seed}; Python {platform.python_version()}, {platform.machine()})")
    print(
        f"# 1% slow ranks (at least 1), {RANKS_PER_NODE} ranks per node, common per-step factor 0.95-1.05, "
        f"{SPIKE_FRACTION:.1%} one-off spikes 1.5-3x; default thresholds"
    )
    print(HEADER)
    run(QUICK_FLEETS if args.quick else FLEETS, args.seed)
    run_pairs(QUICK_PAIR_TRIALS if args.quick else PAIR_TRIALS, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
