"""How much work one scaling call may do, and how it stays within that. The numbers reach the agent in the error
that refuses an input and in what every fit reports having done (the tool schemas leave them out: a model reads
those before its first call). Plain Python (no numpy), so the server imports it at start.

- Files (data.path, a job's metrics file): at most MAX_FILE_BYTES (64 MiB), refused by their size before anything
  is read; at most MAX_ROWS (100,000) rows, each line at most MAX_LINE_BYTES (64 KiB). Only the named columns of
  each row are kept while reading.
- Points fitted: a curve (scalerl, power_law) fits at most MAX_CURVE_POINTS (5,000) points, a chinchilla fit at most
  MAX_LOSS_POINTS (2,000). Above that the points are thinned: within each run (points ordered by compute; for
  chinchilla, all points ordered by params then tokens) points evenly spaced by rank are kept, the first and the
  last of each run among them, each run keeping its share of the total. The points are kept as they are (no
  averaging), so the residuals, the RMSE, the noise estimate and the prediction intervals stay those of single
  observations, and the intervals rest on the points used (on average wider than all points would give, so no
  precision is claimed that was not used). Thinning by rank keeps the data's own density along compute, so the
  thinned fit estimates what the full fit would (100,000 points in 4 runs: A 0.6089 thinned, 0.6088 all points).
- Bootstrap work: points used x resamples <= BOOTSTRAP_WORK[...] (1,000,000 for robust curve fits, scalerl and
  power_law alike; 200,000 for chinchilla fits, whose refits are L-BFGS runs); for method scalerl-grid, whose every
  refit is the 7,100-cell grid, points used x (resamples + 1) <= 16,000 (75 points: the default 200 resamples).
  Above it the resamples are cut to fit, and the result says so (bootstrap_requested, a warning). Worst cases
  measured on 2 busy cores: 5,000-point power law with 200 resamples ~9 s, scalerl-grid on 75 points with 212
  resamples ~47 s (both in the worker process, so a cancel stops them).
- Where the work runs: fits estimated at more than INLINE_WORK run in a worker process that is killed when the
  client cancels the call (see servers/scaling/server.py); smaller ones (well under a second) run in a thread.
"""

from dataclasses import dataclass, field
from typing import Literal

from servers.scaling.fitting import FitOutcome

MAX_FILE_BYTES = 64 * 2**20
MAX_LINE_BYTES = 64 * 2**10
MAX_ROWS = 100_000
MAX_CURVE_POINTS = 5_000
MAX_LOSS_POINTS = 2_000
BOOTSTRAP_WORK = {"robust": 1_000_000, "power_law": 1_000_000, "chinchilla": 200_000, "scalerl-grid": 16_000}
# Relative cost of one point in one refit, by procedure (measured on 2 busy cores: ~2.5 us robust scalerl, ~20 us
# power law, ~30 us chinchilla L-BFGS, ~3 ms the paper's grid), and the work below which a fit runs in a thread
# (about half a second or less).
WORK_WEIGHT = {"robust": 1, "power_law": 8, "chinchilla": 10, "scalerl-grid": 700}
INLINE_WORK = 300_000

Procedure = Literal["robust", "power_law", "chinchilla", "scalerl-grid"]

THINNING_RULE = (
    f"above {MAX_CURVE_POINTS:,} points (curves) or {MAX_LOSS_POINTS:,} (chinchilla), the points are thinned evenly "
    "by rank along compute within each run (chinchilla: along params, then tokens), first and last kept"
)
BOOTSTRAP_RULE = (
    f"points used x resamples <= {BOOTSTRAP_WORK['robust']:,} (robust scalerl and power_law fits), "
    f"{BOOTSTRAP_WORK['chinchilla']:,} "
    f"(chinchilla); points used x (resamples + 1) <= {BOOTSTRAP_WORK['scalerl-grid']:,} (scalerl-grid); above it "
    "the resamples are cut and the result says so"
)


def procedure(model: str, method: str) -> Procedure:
    if model in ("chinchilla", "power_law"):
        return model  # type: ignore[return-value]
    return "scalerl-grid" if method == "scalerl-grid" else "robust"


def bootstrap_allowed(proc: Procedure, points: int, requested: int) -> int:
    """The resamples a fit of `points` points may run: `requested`, cut to the bootstrap budget."""
    budget = BOOTSTRAP_WORK[proc]
    most = budget // max(points, 1) - 1 if proc == "scalerl-grid" else budget // max(points, 1)
    return max(0, min(requested, most))


def fit_work(proc: Procedure, points: int, resamples: int) -> int:
    """Estimated work of a fit: points x (1 + resamples) x the procedure's weight."""
    return points * (1 + resamples) * WORK_WEIGHT[proc]


def runs_in_process(proc: Procedure, points: int, resamples: int) -> bool:
    return fit_work(proc, points, resamples) > INLINE_WORK


@dataclass
class Thinning:
    """What the thinning did: how many points there were, how many were kept, and the rule in words."""

    before: int
    after: int
    rule: str

    def describe(self) -> str:
        return f"{self.after:,} of {self.before:,} points fitted: {self.rule}"


def _even(count: int, keep: int) -> list[int]:
    """`keep` positions of range(count) spread evenly by rank, the first and the last included (exact integers)."""
    if keep >= count:
        return list(range(count))
    if keep <= 0:
        return []
    if keep == 1:
        return [0]
    span, gaps = count - 1, keep - 1
    return [(2 * i * span + gaps) // (2 * gaps) for i in range(keep)]


def _quotas(sizes: list[int], total: int) -> list[int]:
    """Split `total` over groups in proportion to their sizes (largest remainder; ties to the earlier group)."""
    n = sum(sizes)
    exact = [s * total / n for s in sizes]
    quotas = [int(e) for e in exact]
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - quotas[i]), i))
    for i in order[: total - sum(quotas)]:
        quotas[i] += 1
    return quotas


def thin_groups(keys: list[tuple[object, float, float]], cap: int) -> list[int]:
    """Indices (sorted) of at most `cap` points to keep. keys[i] = (group, order1, order2): within each group
    points are ranked by (order1, order2) and kept evenly by rank; each group keeps its share of `cap`."""
    if len(keys) <= cap:
        return list(range(len(keys)))
    groups: dict[object, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key[0], []).append(i)
    members = [sorted(idx, key=lambda i: (keys[i][1], keys[i][2], i)) for idx in groups.values()]
    kept: list[int] = []
    for idx, quota in zip(members, _quotas([len(m) for m in members], cap), strict=True):
        kept.extend(idx[p] for p in _even(len(idx), quota))
    return sorted(kept)


def thin_curve(compute: list[float], run: list[str], cap: int = MAX_CURVE_POINTS) -> tuple[list[int], Thinning | None]:
    kept = thin_groups([(r, c, 0.0) for c, r in zip(compute, run, strict=True)], cap)
    if len(kept) == len(compute):
        return kept, None
    runs = len(set(run))
    rule = (
        f"more than {cap:,} points, so points evenly spaced by rank along compute were kept within "
        + (f"each of the {runs} runs (each its share)" if runs > 1 else "the run")
        + ", the first and last included; the points are not averaged"
    )
    return kept, Thinning(before=len(compute), after=len(kept), rule=rule)


def thin_loss(
    params: list[float], tokens: list[float], cap: int = MAX_LOSS_POINTS
) -> tuple[list[int], Thinning | None]:
    kept = thin_groups([(0, n, d) for n, d in zip(params, tokens, strict=True)], cap)
    if len(kept) == len(params):
        return kept, None
    rule = (
        f"more than {cap:,} points, so points evenly spaced by rank along (params, tokens) were kept, the smallest "
        "and largest included; the points are not averaged"
    )
    return kept, Thinning(before=len(params), after=len(kept), rule=rule)


@dataclass
class FitTask:
    """One fit's numerics, picklable, so that it can run in a worker process (compute_fit)."""

    model: str
    method: str
    bootstrap: int
    seed: int
    compute: list[float] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    run: list[str] | None = None
    r0: float | None = None
    r0_from: tuple[list[float], list[float], list[str]] | None = None  # the points the default R0 comes from
    free_r0: bool = False
    y_max: float = 1.0
    level: float = 0.95
    params: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)

    @property
    def points(self) -> int:
        return len(self.loss) if self.model == "chinchilla" else len(self.compute)

    @property
    def proc(self) -> Procedure:
        return procedure(self.model, self.method)


def compute_fit(task: FitTask) -> FitOutcome:
    """Run the fit a task describes (in the server's thread pool, or in a worker process; numpy loads here)."""
    import numpy as np

    with np.errstate(all="ignore"):  # extreme data overflow harmlessly inside the solvers (the result is checked)
        if task.model == "chinchilla":
            from servers.scaling.fit_chinchilla import fit_chinchilla

            return fit_chinchilla(
                task.params, task.tokens, task.loss, bootstrap=task.bootstrap, seed=task.seed, level=task.level
            )
        return _fit_curve(task)


def _fit_curve(task: FitTask) -> FitOutcome:
    from servers.scaling.fit_sigmoid import fit_sigmoid

    return fit_sigmoid(
        task.compute,
        task.value,
        task.run,
        model=task.model,  # type: ignore[arg-type]
        method=task.method,  # type: ignore[arg-type]
        r0=task.r0,
        r0_from=task.r0_from,
        free_r0=task.free_r0,
        y_max=task.y_max,
        bootstrap=task.bootstrap,
        seed=task.seed,
        level=task.level,
    )
