"""Chinchilla fit: the robust method against Hoffmann et al.'s naive 4,500-start L-BFGS grid, on synthetic data.

What is measured: synthetic pretraining runs from the Epoch AI replication's parameters (E 1.82, A 482, B 2085,
alpha 0.348, beta 0.366); ``points`` runs with N log-uniform in 7e7..1.6e10 parameters and D log-uniform in
5e9..5e11 tokens (numpy default_rng(seed)), loss = L(N, D) * exp(eps), eps ~ Normal(0, NOISE_SD) with
NOISE_SD = 0.002 (0.2% multiplicative noise, ~0.005 in loss units). Both methods run in this process on the
same data, without bootstrap; for each: wall time (perf_counter), the final Huber objective, the recovered
parameters and their relative errors (the robust time is the median of 3 runs, the naive grid runs once, both after
an untimed warm-up fit on a small problem). Then the robust method again with 200 bootstrap resamples (timed).

Pass criteria: alpha and beta within 2% of the truth (robust fit); robust at least 5x faster than the naive grid
with an objective the same or lower (robust <= naive * (1 + 1e-9)).

Why 0.2% noise: with Hoffmann's Huber objective the statistical error of alpha and beta at 250 points grows with
the noise; at SD 0.01 it is ~3.5% on average over seeds (up to ~8%), so a 2% criterion would test the data, not
the optimiser. An informational row fits the same design at SD 0.01 with the robust method and reports its errors
(the naive grid reached the same optimum there too when checked at seed 0, to ~1e-15 relative; it is not
rerun, to keep the script short).

Run from the repository root: python benchmarks/bench_chinchilla_fit.py [--points 250] [--seed 0]
"""

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

# One BLAS thread, set before numpy loads OpenBLAS (override by setting it yourself): L-BFGS-B on 5 parameters makes
# only tiny BLAS calls, and on a machine whose cores are busy OpenBLAS's worker threads slow each run ~20x. The fitter
# does the same through threadpoolctl when that is installed.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.scaling.fit_chinchilla import fit_chinchilla, predict_loss

TRUE = {"E": 1.82, "A": 482.0, "B": 2085.0, "alpha": 0.348, "beta": 0.366}
NOISE_SD = 0.002
N_RANGE = (7e7, 1.6e10)
D_RANGE = (5e9, 5e11)
ALPHA_BETA_TOL = 0.02
MIN_SPEEDUP = 5.0
OBJECTIVE_REL_TOL = 1e-9
NAIVE_SLOW_S = 120.0
ROBUST_REPEATS = 3


def synthetic_data(
    points: int = 250, seed: int = 0, noise_sd: float = NOISE_SD
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(np.log(N_RANGE[0]), np.log(N_RANGE[1]), points))
    d = np.exp(rng.uniform(np.log(D_RANGE[0]), np.log(D_RANGE[1]), points))
    loss = predict_loss(TRUE, n, d) * np.exp(rng.normal(0.0, noise_sd, points))
    return n, d, loss


def _summary(outcome: Any, wall_s: float) -> dict[str, Any]:
    values = {k: v.value for k, v in outcome.parameters.items()}
    return {
        "time_s": wall_s,
        "objective": outcome.objective,
        "rmse": outcome.rmse,
        "converged": outcome.converged,
        "parameters": values,
        "rel_errors": {k: values[k] / TRUE[k] - 1.0 for k in TRUE},
        "message": outcome.message,
        "warnings": outcome.warnings,
    }


def _timed_fit(n: np.ndarray, d: np.ndarray, loss: np.ndarray, **kwargs: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    outcome = fit_chinchilla(n, d, loss, **kwargs)
    return outcome, time.perf_counter() - t0


def run_chinchilla_benchmark(points: int = 250, seed: int = 0, bootstrap: int = 0) -> dict[str, Any]:
    """Robust vs naive-grid on the same synthetic data; ``bootstrap`` > 0 also times a robust fit with that many
    resamples. Returns the figures and the PASS/FAIL verdicts as a dict."""
    n, d, loss = synthetic_data(points, seed)
    # Untimed warm-up on a small problem (lazy imports, first-call costs), so neither method pays them.
    wn, wd, wl = synthetic_data(20, seed + 1)
    fit_chinchilla(wn, wd, wl, method="robust", bootstrap=2, seed=seed)
    # The robust fit is short, so its time is the median of ROBUST_REPEATS runs (the machine may be shared);
    # the naive grid runs once.
    runs = [_timed_fit(n, d, loss, method="robust", bootstrap=0, seed=seed) for _ in range(ROBUST_REPEATS)]
    robust, robust_s = runs[0][0], float(np.median([t for _, t in runs]))
    naive, naive_s = _timed_fit(n, d, loss, method="naive-grid", bootstrap=0, seed=seed)
    result: dict[str, Any] = {
        "points": points,
        "seed": seed,
        "noise_sd": NOISE_SD,
        "true": TRUE,
        "robust": _summary(robust, robust_s),
        "naive-grid": _summary(naive, naive_s),
        "speedup": naive_s / robust_s,
        "objective_rel_diff": (robust.objective - naive.objective) / naive.objective,
    }
    errs = result["robust"]["rel_errors"]
    result["pass_recovery"] = abs(errs["alpha"]) <= ALPHA_BETA_TOL and abs(errs["beta"]) <= ALPHA_BETA_TOL
    result["pass_speed"] = result["speedup"] >= MIN_SPEEDUP and robust.objective <= naive.objective * (
        1 + OBJECTIVE_REL_TOL
    )
    result["naive_slow"] = naive_s > NAIVE_SLOW_S
    if bootstrap:
        boot, boot_s = _timed_fit(n, d, loss, method="robust", bootstrap=bootstrap, seed=seed)
        result["bootstrap"] = {
            "resamples": bootstrap,
            "fits": boot.bootstrap,
            "time_s": boot_s,
            "intervals": {k: (v.ci_low, v.ci_high) for k, v in boot.parameters.items()},
            "warnings": boot.warnings,
        }
    return result


def _informational_noisy(points: int, seed: int, noise_sd: float = 0.01) -> dict[str, Any]:
    n, d, loss = synthetic_data(points, seed, noise_sd)
    outcome, wall_s = _timed_fit(n, d, loss, method="robust", bootstrap=0, seed=seed)
    return _summary(outcome, wall_s)


def _print_table(result: dict[str, Any], noisy: dict[str, Any] | None) -> None:
    names = ("E", "A", "B", "alpha", "beta")
    print(
        f"Chinchilla fit benchmark: {result['points']} points, seed {result['seed']}, multiplicative noise "
        f"SD {result['noise_sd']}; Python {platform.python_version()}, {os.cpu_count()} CPU(s), "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}"
    )
    print(f"N in {N_RANGE[0]:.3g}..{N_RANGE[1]:.3g}, D in {D_RANGE[0]:.3g}..{D_RANGE[1]:.3g} (log-uniform)")
    header = f"{'method':<22}{'time (s)':>10}{'objective':>24}" + "".join(f"{k:>10}" for k in names)
    print(header)
    print("-" * len(header))
    print(f"{'true':<22}{'':>10}{'':>24}" + "".join(f"{TRUE[k]:>10.4g}" for k in names))
    rows = [("robust", result["robust"]), ("naive-grid (4,500)", result["naive-grid"])]
    if noisy is not None:
        rows.append(("robust, SD 0.01 (info)", noisy))
    for label, row in rows:
        p, e = row["parameters"], row["rel_errors"]
        print(f"{label:<22}{row['time_s']:>10.3f}{row['objective']:>24.16g}" + "".join(f"{p[k]:>10.4g}" for k in names))
        print(f"{'  rel. error':<22}{'':>10}{'':>24}" + "".join(f"{e[k]:>+10.2%}" for k in names))
    print()
    print("robust time: median of 3 runs; naive-grid: one run (analytic gradient, same L-BFGS-B options)")
    print(f"speedup naive/robust: {result['speedup']:.1f}x")
    print(f"objective (robust - naive) / naive: {result['objective_rel_diff']:+.3e}")
    if result["naive_slow"]:
        print(f"note: the naive grid took {result['naive-grid']['time_s']:.0f} s here, over {NAIVE_SLOW_S:.0f} s")
    if "bootstrap" in result:
        b = result["bootstrap"]
        print(f"robust + {b['resamples']} bootstrap resamples: {b['time_s']:.2f} s ({b['fits']} refits)")
        for k in names:
            lo, hi = b["intervals"][k]
            print(f"  95% CI {k:<6} [{lo:.4g}, {hi:.4g}]")
        for w in b["warnings"]:
            print(f"  warning: {w}")
    errs = result["robust"]["rel_errors"]
    print(
        f"{'PASS' if result['pass_recovery'] else 'FAIL'}: alpha and beta within 2% "
        f"(alpha {errs['alpha']:+.2%}, beta {errs['beta']:+.2%})"
    )
    print(
        f"{'PASS' if result['pass_speed'] else 'FAIL'}: >= 5x faster for the same or lower objective "
        f"(within 1e-9 relative): {result['speedup']:.1f}x, rel. diff {result['objective_rel_diff']:+.2e}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=200, help="resamples for the timed bootstrap run")
    args = parser.parse_args()
    result = run_chinchilla_benchmark(args.points, args.seed, args.bootstrap)
    noisy = _informational_noisy(args.points, args.seed)
    _print_table(result, noisy)
    return 0 if result["pass_recovery"] and result["pass_speed"] else 1


if __name__ == "__main__":
    sys.exit(main())
