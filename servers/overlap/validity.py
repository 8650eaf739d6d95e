"""Validity checks that every overlap measurement carries: numbers that cannot be true are flagged, never scored.

An overlap measurement times the GEMM alone (T_gemm), the collective alone (T_comm), the sequential schedule
(T_sequential) and each overlapped method (T_overlap), as medians over iterations of the slowest rank. Physics and
arithmetic bound them; a measurement outside the bounds (CPU threads fighting over cores, a warm-up effect, a timer
reading zero) says nothing about overlap, and a "best" picked from it would be a wrong verdict. So:

Checks of the measurement (the baseline every row is scored against):
- enough_iterations: at least MIN_ITERS timed iterations of everything, so that a spread can be measured;
- positive_times: T_gemm > 0 and T_comm > 0 (there is something to divide by);
- spread of T_gemm, T_comm and T_sequential: (p90 - p10) / median over the iterations at most MAX_SPREAD;
- sequential_is_gemm_plus_comm: |T_sequential - (T_gemm + T_comm)| <= noise(T_gemm + T_comm); the sequential
  schedule is the two parts one after the other, so it can be neither faster nor slower than their sum.

Checks of each overlapped row (besides the measurement's):
- overlap_not_faster_than_longest_part: T_overlap >= max(T_gemm, T_comm) - noise(max(T_gemm, T_comm)); overlap can
  hide the shorter part inside the longer one, never more;
- efficiency_at_most_one: E <= E_MAX (1.05); with the check above it rules out "more than all of the communication
  hidden";
- spread of the row's own iterations, as above.

noise(x) = max(REL_NOISE * x, ABS_NOISE_MS): 5% of the quantity, and at least 5 us (kernel launch and timer
overhead). E below E_MIN (-0.05) is not invalid: with a consistent baseline it is a real result (the method costs
more than it hides, as Flux issues 34/79/90 report for small N); such rows carry a warning and are never "best"
since sequential beats them.

The sequential row is the baseline: by definition E = 0, exposed communication = T_comm, speedup = 1; it is valid
when the measurement is. Rows that fail a check keep their measured times but lose their scores (E, speedup,
exposed communication: None) and list the reasons; no best is chosen from them.
"""

from __future__ import annotations

import statistics
from typing import Any

REL_NOISE = 0.05
ABS_NOISE_MS = 0.005
E_MIN = -0.05
E_MAX = 1.05
MAX_SPREAD = 0.25
MIN_ITERS = 3

RULES = (
    f"noise(x) = max({REL_NOISE:g} x, {ABS_NOISE_MS * 1e3:g} us); measurement: >= {MIN_ITERS} iterations, T_gemm and "
    f"T_comm > 0, spread (p90 - p10) / median <= {MAX_SPREAD:g} for T_gemm, T_comm and T_sequential, "
    "|T_sequential - (T_gemm + T_comm)| <= noise(T_gemm + T_comm); each overlapped row: "
    f"T_overlap >= max(T_gemm, T_comm) - noise, E <= {E_MAX:g}, its own spread <= {MAX_SPREAD:g}. A row failing a "
    "check (or measured against a failing baseline) is flagged, keeps its times, loses its scores and is never "
    f"chosen as best; E < {E_MIN:g} is a warning (slower than sequential), not invalid"
)


def noise_ms(reference_ms: float) -> float:
    """The margin within which two timings of `reference_ms` count as equal."""
    return max(REL_NOISE * abs(reference_ms), ABS_NOISE_MS)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(series: list[float]) -> float | None:
    """(p90 - p10) / median of a series of iteration times; None with fewer than MIN_ITERS or a zero median."""
    if len(series) < MIN_ITERS:
        return None
    median = statistics.median(series)
    if median <= 0:
        return None
    return (percentile(series, 0.9) - percentile(series, 0.1)) / median


def _check(name: str, passed: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "passed": bool(passed), "detail": detail}


def _spread_check(name: str, what: str, series: list[float]) -> dict[str, Any]:
    value = spread(series)
    if value is None:
        n = len(series)
        why = f"{n} iteration(s), at least {MIN_ITERS} needed" if n < MIN_ITERS else "median time is 0"
        return _check(name, False, f"the spread of {what} cannot be measured: {why}")
    return _check(
        name,
        value <= MAX_SPREAD,
        f"spread of {what} over iterations (p90 - p10) / median = {value:.3g} (limit {MAX_SPREAD:g})",
    )


def measurement_checks(
    t_gemm: float, t_comm: float, t_seq: float | None, series: dict[str, list[float]]
) -> list[dict[str, Any]]:
    """The checks of the baseline: `series` holds the per-iteration times of 'gemm', 'comm' and 'sequential'."""
    counts = {key: len(values) for key, values in series.items()}
    fewest = min(counts.values()) if counts else 0
    checks = [
        _check(
            "enough_iterations",
            fewest >= MIN_ITERS,
            f"{fewest} timed iteration(s) (at least {MIN_ITERS} needed to measure the spread)",
        ),
        _check(
            "positive_times",
            t_gemm > 0 and t_comm > 0,
            f"T_gemm {t_gemm:.4g} ms and T_comm {t_comm:.4g} ms must both be > 0",
        ),
    ]
    if fewest >= MIN_ITERS:  # with fewer, enough_iterations has said it: the spreads cannot be measured
        checks.append(_spread_check("gemm_spread", "T_gemm", series.get("gemm", [])))
        checks.append(_spread_check("comm_spread", "T_comm", series.get("comm", [])))
        if t_seq is not None:
            checks.append(_spread_check("sequential_spread", "T_sequential", series.get("sequential", [])))
    if t_seq is None:
        checks.append(_check("sequential_is_gemm_plus_comm", False, "the sequential schedule was not measured"))
        return checks
    parts = t_gemm + t_comm
    margin = noise_ms(parts)
    checks.append(
        _check(
            "sequential_is_gemm_plus_comm",
            abs(t_seq - parts) <= margin,
            f"T_sequential {t_seq:.4g} ms against T_gemm + T_comm = {parts:.4g} ms (allowed difference "
            f"{margin:.3g} ms): the sequential schedule is the two parts one after the other"
            + ("" if abs(t_seq - parts) <= margin else (", so the parts or the schedule were mis-timed")),
        )
    )
    return checks


def row_checks(t_gemm: float, t_comm: float, t_overlap: float, series: list[float]) -> list[dict[str, Any]]:
    """The checks of one overlapped method's row (the measurement's checks come on top)."""
    longest = max(t_gemm, t_comm)
    margin = noise_ms(longest)
    which = "T_gemm" if t_gemm >= t_comm else "T_comm"
    checks = [
        _check(
            "overlap_not_faster_than_longest_part",
            t_overlap >= longest - margin,
            f"T_overlap {t_overlap:.4g} ms against {which} {longest:.4g} ms (allowed {margin:.3g} ms less): "
            "overlap hides the shorter part in the longer one, never more",
        )
    ]
    if t_comm > 0:
        efficiency = (t_gemm + t_comm - t_overlap) / t_comm
        checks.append(
            _check(
                "efficiency_at_most_one",
                efficiency <= E_MAX,
                f"E = (T_gemm + T_comm - T_overlap) / T_comm = {efficiency:.3g} (at most {E_MAX:g}: no more than "
                "all of the communication can be hidden)",
            )
        )
    checks.append(_spread_check("spread", "T_overlap", series))
    return checks


def failed(checks: list[dict[str, Any]]) -> list[str]:
    """The reasons of the checks that failed, one line each."""
    return [f"{c['name']}: {c['detail']}" for c in checks if not c["passed"]]
