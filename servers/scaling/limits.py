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

from servers.scaling import laws
from servers.scaling.fitting import FitOutcome

MAX_FILE_BYTES = 64 * 2**20
MAX_LINE_BYTES = 64 * 2**10
MAX_ROWS = 100_000
MAX_CURVE_POINTS = 5_000
MAX_LOSS_POINTS = 2_000
INLINE_WORK = 300_000  # the work below which a fit runs in a thread (about half a second or less)
# Each law declares the cost of its fitting procedures (laws.Work: weight per point and refit, bootstrap budget);
# these are the bundled laws' (by procedure name).
BOOTSTRAP_WORK = {
    w.name: w.budget for law in (laws.SCALERL, laws.POWER_LAW, laws.CHINCHILLA) for w in law.work.values()
}
WORK_WEIGHT = {w.name: w.weight for law in (laws.SCALERL, laws.POWER_LAW, laws.CHINCHILLA) for w in law.work.values()}

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


def procedure(model: str, method: str) -> str:
    """The name of the procedure that fits `model` with `method` (a law's default method for one it lacks)."""
    law = laws.get(model)
    return (law.work.get(method) or next(iter(law.work.values()))).name


def bootstrap_allowed(proc: str, points: int, requested: int) -> int:
    """The resamples a fit of `points` points may run: `requested`, cut to the bootstrap budget."""
    work = laws.work_named(proc)
    most = work.budget // max(points, 1) - (1 if work.counts_fit else 0)
    return max(0, min(requested, most))


def fit_work(proc: str, points: int, resamples: int) -> int:
    """Estimated work of a fit: points x (1 + resamples) x the procedure's weight."""
    return points * (1 + resamples) * laws.work_named(proc).weight


def runs_in_process(proc: str, points: int, resamples: int) -> bool:
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
    """One fit's numerics, picklable (its law with it), so that it can run in a worker process (compute_fit)."""

    law: laws.Law
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
    def model(self) -> str:
        return self.law.name

    @property
    def points(self) -> int:
        return len(self.compute) if self.law.on_compute else len(self.loss)

    @property
    def proc(self) -> str:
        return procedure(self.model, self.method)


def compute_fit(task: FitTask) -> FitOutcome:
    """Run the fit a task describes (in the server's thread pool, or in a worker process; numpy loads here)."""
    import numpy as np

    with np.errstate(all="ignore"):  # extreme data overflow harmlessly inside the solvers (the result is checked)
        return task.law.fit(task)
