"""The scaling laws: one Law per law, in one registry, and the bundled laws' forms. Plain Python (no numpy: the
server imports this at start; the fitters load when a fit runs).

- scalerl (ScaleRL, arXiv 2510.13786): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)
- power_law: R(C) = A - D * C^(-B)
- chinchilla (Hoffmann et al. 2022): L(N, D) = E + A / N^alpha + B / D^beta, with the compute-optimal
  allocation for C = 6 N D: N_opt = G (C/6)^(beta/(alpha+beta)), D_opt = (C/6)^(alpha/(alpha+beta)) / G,
  G = (alpha A / (beta B))^(1/(alpha+beta)).

A new law is one module that declares a Law (its parameters, its curve, its fitter, the data it reads) and one line
`laws.register(MY_LAW)`; every tool asks the registry (get, names) instead of naming laws.
"""

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from servers.core import toolcache
from servers.core.errors import InputError
from servers.core.models import Model
from servers.core.refs import resolve

if TYPE_CHECKING:
    from servers.scaling.fitting import FitOutcome
    from servers.scaling.limits import FitTask

# The two shapes of data a law reads (servers/scaling/data.py reads both): a metric against compute, with optional
# run labels (RL curves), or a loss against model size N and training tokens D (pretraining).
CURVE = ("compute", "value")
SIZES = ("params", "tokens", "loss")


@dataclass(frozen=True)
class Parameter:
    """One parameter of a law: its name (as the tools show it), what it means, whether it must be > 0, and the
    bounds a fitter searches (the generic fitter needs them; the bundled fitters set data-dependent ones)."""

    name: str
    meaning: str
    positive: bool = False
    bounds: tuple[float, float] | None = None


@dataclass(frozen=True)
class Work:
    """What one fitting procedure costs, for the bootstrap budget and the thread-or-process choice (limits.py):
    `weight` per point and refit, `budget` on points x resamples (x (resamples + 1) when `counts_fit`)."""

    name: str
    weight: int
    budget: int
    counts_fit: bool = False


@dataclass(frozen=True)
class Law:
    """A scaling law, as every tool uses it.

    evaluate(*inputs, **parameters) is the curve, where inputs are the data columns but the last (compute for a
    CURVE law; params and tokens for a SIZES law); it broadcasts over numpy arrays. fitter(task) fits it (a
    callable, or "module:function" loaded when a fit runs; by default fit_generic's bounded least squares, which
    needs every parameter's bounds) and returns a FitOutcome with its bootstrap intervals
    and draws, its identifiability checks in not_identified. work maps the fit methods it accepts to their cost.
    The optional parts say what the law can answer: inverse(parameters, target) the compute where the curve
    reaches a target (None: never); efficiency the parameter compared across recipes (lower: less compute);
    start the parameter r0 sets; bounded_asymptote whether the asymptote is searched within [0, y_max] (then
    predictions beyond data that do not identify it are widened to that range); published the parameters used
    when none are given; allocate(compute, parameters) the compute-optimal allocation of a SIZES law, and
    undefined(parameters) why a SIZES law has no compute-optimal path (None when it has one); identifiability(fit,
    found) the checks a stored fit's data allow beyond its fitter's own findings; plot(fit, width, height) the PNG
    of one fit of a SIZES law (CURVE laws share plot.plot_curves). Callables may be given as "module:function"."""

    name: str
    title: str
    formula: str
    parameters: tuple[Parameter, ...]
    evaluate: Callable[..., Any]
    fitter: "Callable[[FitTask], FitOutcome] | str" = "servers.scaling.fit_generic:fit_least_squares"
    columns: tuple[str, ...] = CURVE
    asymptote: str = "A"
    work: Mapping[str, Work] = field(default_factory=lambda: {"robust": Work("generic", 20, 200_000)})
    inverse: Callable[[dict[str, float], float], float | None] | None = None
    efficiency: str | None = None
    start: str | None = None
    bounded_asymptote: bool = False
    published: Mapping[str, float] | None = None
    published_note: str | None = None
    allocate: "Callable[[float, dict[str, float]], ComputeOptimal] | None" = None
    undefined: Callable[[dict[str, float]], str | None] | None = None
    identifiability: Callable[..., Any] | str | None = None
    plot: Callable[..., bytes] | str | None = None

    def __post_init__(self) -> None:
        names = self.parameter_names
        if self.columns not in (CURVE, SIZES):
            raise ValueError(f"law {self.name!r}: columns must be {CURVE} or {SIZES}, got {self.columns}")
        for what, name in (("asymptote", self.asymptote), ("efficiency", self.efficiency), ("start", self.start)):
            if name is not None and name not in names:
                raise ValueError(f"law {self.name!r}: its {what} {name!r} is not one of its parameters {names}")
        if not self.work:
            raise ValueError(f"law {self.name!r} declares no fit method")

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    @property
    def on_compute(self) -> bool:
        """True for a law of a metric against compute (CURVE), False for one of a loss against N and D (SIZES)."""
        return self.columns == CURVE

    def fit(self, task: "FitTask") -> "FitOutcome":
        return resolve(self.fitter)(task)


_LAWS: dict[str, Law] = {}


def register(law: Law) -> Law:
    """Add a law to the registry (a name already taken is refused); the tools built after this offer it."""
    if law.name in _LAWS:
        raise ValueError(f"a scaling law named {law.name!r} is registered already")
    _LAWS[law.name] = law
    _declare()
    return law


def unregister(name: str) -> None:
    _LAWS.pop(name, None)
    _declare()


def _declare() -> None:
    """The tools enumerate the registered laws, so a server's cached tool definitions (core/toolcache.py) depend
    on them as well as on the sources (a law may be registered from outside the package)."""
    toolcache.declare("scaling laws", ",".join(f"{n}:{'/'.join(law.work)}" for n, law in _LAWS.items()))


@contextmanager
def registered(law: Law) -> Iterator[Law]:
    """The law registered for the duration of a block (tests, notebooks)."""
    register(law)
    try:
        yield law
    finally:
        unregister(law.name)


def names(on_compute: bool | None = None) -> tuple[str, ...]:
    """The registered laws' names in registration order; only CURVE (True) or SIZES (False) laws if asked."""
    return tuple(n for n, law in _LAWS.items() if on_compute is None or law.on_compute == on_compute)


def get(name: str) -> Law:
    law = _LAWS.get(name)
    if law is None:
        raise InputError(f"unknown scaling law {name!r}; accepted: {', '.join(_LAWS)}")
    return law


def name_type(on_compute: bool | None = None) -> Any:
    """A Literal of the registered names (for a tool's input: its JSON schema enumerates them)."""
    return Literal[names(on_compute)]  # type: ignore[valid-type]


def methods() -> tuple[str, ...]:
    """Every fit method some registered law accepts, in registration order."""
    return tuple(dict.fromkeys(m for law in _LAWS.values() for m in law.work))


def work_named(name: str) -> Work:
    """The fitting procedure of this name, among the registered laws'."""
    for law in _LAWS.values():
        for work in law.work.values():
            if work.name == name:
                return work
    raise InputError(f"unknown fitting procedure {name!r}")


def forms() -> str:
    """Each law's name and formula, as the fit tool describes them."""
    return "; ".join(f"{law.name}: {law.formula}" for law in _LAWS.values())


# Hoffmann et al. 2022, approach 3 (the published fit); used when no chinchilla parameters are given.
CHINCHILLA_PUBLISHED = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


class EvaluationPoint(Model):
    compute: float | None = Field(
        default=None, gt=0, le=1e40, allow_inf_nan=False, description="In the parameters' unit, e.g. GPU-hours"
    )
    params: float | None = Field(default=None, gt=0, le=1e20, allow_inf_nan=False)
    tokens: float | None = Field(default=None, gt=0, le=1e20, allow_inf_nan=False)


class SizePoint(Model):
    params: float = Field(gt=0, le=1e20, allow_inf_nan=False)
    tokens: float = Field(gt=0, le=1e20, allow_inf_nan=False)


class EvaluatedPoint(Model):
    compute: float | None = None
    params: float | None = None
    tokens: float | None = None
    value: float = Field(description="Predicted metric (scalerl, power_law) or loss (chinchilla)")


def check_parameters(model: str, params: dict[str, float]) -> dict[str, float]:
    law = get(model)
    required = law.parameter_names
    missing = [p for p in required if p not in params]
    extra = sorted(set(params) - set(required))
    if missing or extra:
        raise InputError(
            f"model {model!r} takes parameters {', '.join(required)}; "
            f"missing: {', '.join(missing) or 'none'}; unknown: {', '.join(extra) or 'none'}"
        )
    for name, value in params.items():
        if not math.isfinite(value):
            raise InputError(f"parameter {name} must be a finite number, got {value}")
    for p in law.parameters:
        if p.positive and params[p.name] <= 0:
            raise InputError(f"parameter {p.name} of {model!r} must be > 0, got {params[p.name]}")
    return {p: float(params[p]) for p in required}


def scalerl(compute: float, A: float, B: float, C_mid: float, R0: float) -> float:  # noqa: N803 - the paper's names
    ratio = C_mid / compute
    if isinstance(ratio, float) and ratio > 1.0 and B * math.log(ratio) > 700.0:
        return R0  # (C_mid / C)^B beyond any float: the curve is at its start (Python floats raise, numpy gives inf)
    return R0 + (A - R0) / (1.0 + ratio**B)


def power_law(compute: float, A: float, B: float, D: float) -> float:  # noqa: N803
    return A - D * compute ** (-B)


def chinchilla(params: float, tokens: float, E: float, A: float, B: float, alpha: float, beta: float) -> float:  # noqa: N803
    return E + A / params**alpha + B / tokens**beta


def _finite(value: float, where: str, model: str, params: dict[str, float]) -> float:
    if not math.isfinite(value):
        shown = ", ".join(f"{k}={v:g}" for k, v in params.items())
        raise InputError(
            f"{where}: {model} with {shown} gives a number too large or too small to represent (overflow); use "
            "parameters and inputs of a moderate size (e.g. exponents B, alpha, beta of order 0.1..10)"
        )
    return value


def evaluate(model: str, params: dict[str, float], points: list[EvaluationPoint]) -> list[EvaluatedPoint]:
    checked = check_parameters(model, params)
    law = get(model)
    inputs = law.columns[:-1]
    out: list[EvaluatedPoint] = []
    for i, point in enumerate(points):
        given = {name: getattr(point, name) for name in inputs}
        if any(v is None for v in given.values()):
            needs = " and ".join(f"'{n}'" + {"params": " (N)", "tokens": " (D)"}.get(n, "") for n in inputs)
            raise InputError(f"point {i}: {model} needs {needs} for every point")
        try:
            value = law.evaluate(*given.values(), **checked)
        except (OverflowError, ZeroDivisionError):
            value = math.inf
        out.append(EvaluatedPoint(**given, value=_finite(value, f"point {i}", model, checked)))
    return out


class ComputeOptimal(Model):
    compute_flops: float
    params: float = Field(description="Compute-optimal parameter count N_opt")
    tokens: float = Field(description="Compute-optimal training tokens D_opt")
    tokens_per_param: float
    loss: float = Field(description="Predicted loss at (N_opt, D_opt)")


def _allocation(compute_flops: float, p: dict[str, float]) -> tuple[float, float]:
    """(N_opt, D_opt) for C = 6 N D, in logs so that no intermediate overflows; may be 0 or infinite, and NaN
    where the law has no compute-optimal path (a parameter A, B, alpha, beta that is not > 0, as a fit on its
    bound may have)."""
    alpha, beta = p["alpha"], p["beta"]
    if not min(alpha, beta, p["A"], p["B"]) > 0:
        return math.nan, math.nan
    log_g = (math.log(alpha) + math.log(p["A"]) - math.log(beta) - math.log(p["B"])) / (alpha + beta)
    log_c = math.log(compute_flops) - math.log(6.0)
    log_n = log_g + log_c * beta / (alpha + beta)
    log_d = log_c * alpha / (alpha + beta) - log_g
    return _exp(log_n), _exp(log_d)


def _exp(x: float) -> float:
    return math.inf if x > 709.0 else math.exp(x)


def optimal_loss(compute_flops: float, params: dict[str, float]) -> float:
    """The predicted loss at the compute-optimal (N, D) for C FLOPs (plain floats; no validation: params checked)."""
    n_opt, d_opt = _allocation(compute_flops, params)
    if not (0 < n_opt < math.inf and 0 < d_opt < math.inf):
        return math.inf
    try:
        return chinchilla(n_opt, d_opt, **params)
    except (OverflowError, ZeroDivisionError):
        return math.inf


def compute_optimal(compute_flops: float, params: dict[str, float]) -> ComputeOptimal:
    """The Chinchilla compute-optimal N and D for a budget of C = 6 N D FLOPs."""
    p = check_parameters("chinchilla", params)
    if not (math.isfinite(compute_flops) and compute_flops > 0):
        raise InputError(f"compute_flops must be a finite number > 0, got {compute_flops}")
    n_opt, d_opt = _allocation(compute_flops, p)
    loss = optimal_loss(compute_flops, p)
    ratio = d_opt / n_opt if 0 < n_opt < math.inf else math.inf
    if not (all(math.isfinite(v) and v > 0 for v in (n_opt, d_opt, ratio)) and math.isfinite(loss)):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in p.items())
        raise InputError(
            f"compute_flops {compute_flops:g}: the chinchilla law with {shown} gives no finite, positive "
            "allocation there (N_opt, D_opt or the loss overflow or vanish); accepted: budgets where "
            "G = (alpha A / (beta B))^(1/(alpha+beta)) and (C/6)^(beta/(alpha+beta)) stay representable, i.e. "
            "exponents alpha, beta of order 0.1..1 and budgets of 1 to 1e40 FLOPs"
        )
    return ComputeOptimal(
        compute_flops=compute_flops,
        params=n_opt,
        tokens=d_opt,
        tokens_per_param=ratio,
        loss=loss,
    )


def has_optimal_path(params: dict[str, float]) -> bool:
    """Whether a chinchilla law has a compute-optimal path: A, B, alpha and beta all > 0."""
    return min(params["A"], params["B"], params["alpha"], params["beta"]) > 0


def _no_optimal_path(params: dict[str, float]) -> str | None:
    if has_optimal_path(params):
        return None
    zero = ", ".join(f"{k}={params[k]:.3g}" for k in ("A", "B", "alpha", "beta") if not params[k] > 0)
    return f"{zero} (on its bound): the compute-optimal allocation needs A, B, alpha and beta > 0"


# ---- the compute at which each bundled law reaches a target ----------------------------------------------------

MAX_COMPUTE = 1e40  # the largest compute the tools accept anywhere; targets beyond it count as out of reach


def _power(base: float, exponent: float) -> float:
    """base ** exponent for base >= 0, infinity where it overflows."""
    try:
        return base**exponent
    except OverflowError:
        return math.inf


def scalerl_compute_for(params: dict[str, float], target: float) -> float | None:
    """Where the sigmoid reaches `target`: None when it never does, 0 when it starts there, infinity when it gets
    there only beyond any representable compute."""
    a, b, c_mid, r0 = params["A"], params["B"], params["C_mid"], params["R0"]
    rising = a > r0
    if (target <= r0) if rising else (target >= r0):
        return 0.0
    if (target >= a) if rising else (target <= a):
        return None
    return c_mid * _power((target - r0) / (a - target), 1.0 / b)


def power_law_compute_for(params: dict[str, float], target: float) -> float | None:
    a, b, d = params["A"], params["B"], params["D"]
    if target >= a:
        return None
    return _power(d / (a - target), 1.0 / b)


def chinchilla_compute_for(params: dict[str, float], target: float) -> float | None:
    """FLOPs along the compute-optimal path at which the loss reaches `target` (bisection in log compute)."""
    if target <= params["E"] or not has_optimal_path(params):
        return None
    low, high = 1.0, MAX_COMPUTE  # loss along the compute-optimal path falls monotonically in C
    if optimal_loss(high, params) > target:
        return math.inf
    for _ in range(200):
        mid = math.sqrt(low * high)
        if optimal_loss(mid, params) > target:
            low = mid
        else:
            high = mid
        if high <= low * (1 + 1e-12):
            break
    return high


# ---- the bundled laws -------------------------------------------------------------------------------------------
# Bootstrap budgets and per-point weights measured on 2 busy cores (~2.5 us robust scalerl, ~20 us power law, ~30 us
# chinchilla L-BFGS, ~3 ms the paper's grid); limits.py explains the rule.

SCALERL = register(
    Law(
        name="scalerl",
        title="ScaleRL sigmoid",
        formula="R0+(A-R0)/(1+(C_mid/C)^B)",
        parameters=(
            Parameter("A", "asymptote: the metric approached with unlimited compute"),
            Parameter("B", "scaling exponent: how sharply the curve rises", positive=True),
            Parameter("C_mid", "compute at half the gain from R0 to A", positive=True),
            Parameter("R0", "the metric at the start of training"),
        ),
        evaluate=scalerl,
        fitter="servers.scaling.fit_sigmoid:fit_task",
        work={"robust": Work("robust", 1, 1_000_000), "scalerl-grid": Work("scalerl-grid", 700, 16_000, True)},
        inverse=scalerl_compute_for,
        efficiency="C_mid",
        start="R0",
        bounded_asymptote=True,
        identifiability="servers.scaling.analysis:sigmoid_identifiability",
    )
)
POWER_LAW = register(
    Law(
        name="power_law",
        title="power law",
        formula="A-D*C^-B",
        parameters=(
            Parameter("A", "asymptote"),
            Parameter("B", "exponent", positive=True),
            Parameter("D", "coefficient: the gap to A at compute 1"),
        ),
        evaluate=power_law,
        fitter="servers.scaling.fit_sigmoid:fit_task",
        work={"robust": Work("power_law", 8, 1_000_000)},
        inverse=power_law_compute_for,
    )
)
CHINCHILLA = register(
    Law(
        name="chinchilla",
        title="Chinchilla law",
        formula="E+A/N^alpha+B/D^beta",
        parameters=(
            Parameter("E", "irreducible loss"),
            Parameter("A", "coefficient of the model-size term", positive=True),
            Parameter("B", "coefficient of the data term", positive=True),
            Parameter("alpha", "model-size exponent", positive=True),
            Parameter("beta", "data exponent", positive=True),
        ),
        evaluate=chinchilla,
        fitter="servers.scaling.fit_chinchilla:fit_task",
        columns=SIZES,
        asymptote="E",
        work={"robust": Work("chinchilla", 10, 200_000)},
        inverse=chinchilla_compute_for,
        published=CHINCHILLA_PUBLISHED,
        published_note="Hoffmann et al. 2022's published fit (approach 3); no intervals",
        allocate=compute_optimal,
        undefined=_no_optimal_path,
        plot="servers.scaling.plot:plot_chinchilla",
    )
)
