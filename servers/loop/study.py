"""The experiment loop's decisions, as plain functions over what the suite's tools return.

Nothing here talks MCP or starts anything: each function takes tool results (their structured content, as dicts)
and decides: how a budget splits over variants and seeds, which points are the held-out second half of a run, how
far a prediction was from the measurement, what the node check says, which variant to scale and with what
probability, whether a follow-up round is worth it. Every number these functions put into a sentence comes from
a tool's result (or is arithmetic on such numbers, named as such: an error is predicted minus measured).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")
FLAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
RECIPE = "tiny-grpo"
VALUE_KEY = "pass_rate"
LAW = "scalerl"  # the law the study fits and judges by (ScaleRL's sigmoid): fit_scaling_law's model
LOOP_FLAGS = ("--steps", "--seed", "--evals", "--eval-horizon", "--eval-seed")  # the loop sets these; a variant not
PILOT_STEPS = 400  # long enough for the quicker variants' rise (their midpoint) to show
PILOT_EVALS = 16
MIN_STEPS = 100  # the first rung's runs have at least this many steps
DEFAULT_RUNGS = 3
RISE_FACTOR = 2.0  # the first rung at this many times the latest midpoint the pilot saw
COMPUTE_KEYS = {"flops": "compute_flops", "gpu_hours": "compute_gpu_hours"}


class StudyError(ValueError):
    """A study that cannot be run as asked (bad variants, a budget too small); the message says what to change."""


# ---- configuration ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One recipe variant: a name like 'lr=0.005' and the recipe arguments it adds."""

    name: str
    args: tuple[str, ...]


def parse_variant(text: str) -> Variant:
    """'lr=0.005' or 'lr=0.005,group-size=8' -> Variant; flags without their dashes, values as the recipe takes."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise StudyError(f"variant {text!r} is empty; accepted: flag=value[,flag=value], e.g. lr=0.005")
    names, args = [], []
    for part in parts:
        key, sep, value = part.partition("=")
        key, value = key.strip().lstrip("-"), value.strip()
        if not sep or not value or not FLAG_NAME.fullmatch(key):
            raise StudyError(
                f"variant {text!r}: {part!r} is not flag=value; accepted: e.g. lr=0.005 or lr=0.005,group-size=8"
            )
        if len(value) > 64 or any(c.isspace() for c in value):
            raise StudyError(f"variant {text!r}: the value of {key} must be one word of at most 64 characters")
        names.append(f"{key}={value}")
        args += [f"--{key}", value]
    return Variant(name=",".join(names), args=tuple(args))


@dataclass
class StudyConfig:
    name: str
    out: Path
    variants: list[Variant]
    seeds: int
    budget: float | None = None  # a cap on the study's compute (pilot included); None: what the ladder needs
    budget_unit: Literal["flops", "gpu_hours"] | None = None  # None: flops on CPU, gpu_hours on GPUs
    backend: Literal["local", "slurm", "ray"] = "local"
    quick: bool = False
    preset: str = "llama3-8b"
    tp: int = 2
    overlap: Literal["auto", "on", "off"] = "auto"  # auto: measured where the GPUs for TP are, skipped on CPU
    overlap_layers: list[str] | None = None  # None: every TP layer of the preset
    overlap_iters: int = 10
    cpu_seq_len: int = 64  # the preset's shapes at this many tokens when measured on CPU
    exhaustive: bool = False  # every variant x seed straight to the target: the comparison for the ladder
    rungs: int = DEFAULT_RUNGS
    margin: float | None = None  # pass-rate units: a smaller difference at the target does not matter (None: the
    # evaluation's own resolution, resolve_margin)
    seed: int = 0  # the first run seed; the runs use seed, seed + 1, ...
    level: float = 0.95
    bootstrap: int = 200
    evals: int = 40
    run_wall_s: float = 600.0
    max_runs_per_sweep: int = 4  # LLM_INFRA_MCP_MAX_CONCURRENT_JOBS: jobs the loop runs at once

    def validate(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise StudyError(
                f"--name {self.name!r}: accepted: letters, digits, '_', '.', '-' (at most 48, starting with a letter "
                "or digit); it names the study's jobs"
            )
        if len(self.variants) < 2:
            raise StudyError("--variants: a study compares at least two variants, e.g. --variants lr=0.02 lr=0.005")
        if len(self.variants) > 8:
            raise StudyError(f"--variants: {len(self.variants)} given; accepted: 2 to 8")
        names = [v.name for v in self.variants]
        if len(set(names)) < len(names):
            raise StudyError(f"--variants: the same variant is named twice ({', '.join(names)})")
        if not 1 <= self.seeds <= 16:
            raise StudyError(f"--seeds {self.seeds}: accepted: 1 to 16")
        if not 0 <= self.seed <= 1_000_000:
            raise StudyError(f"--seed {self.seed}: accepted: 0 to 1000000")
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise StudyError(f"--budget {self.budget}: must be a positive number")
        if not 1 <= self.rungs <= 6:
            raise StudyError(f"--rungs {self.rungs}: accepted: 1 to 6")
        if self.margin is not None and not (0 <= self.margin < 1):
            raise StudyError(f"--margin {self.margin}: accepted: 0 <= margin < 1 (pass-rate units)")
        if not 0.5 <= self.level <= 0.99:
            raise StudyError(f"--level {self.level}: accepted: 0.5 to 0.99")
        if self.max_runs_per_sweep < 1:
            raise StudyError("LLM_INFRA_MCP_MAX_CONCURRENT_JOBS must be at least 1 for the loop's jobs")


def check_variants(variants: list[Variant], arguments: list[dict[str, Any]]) -> list[str]:
    """Problems with the variants against the recipe's arguments as list_recipes lists them (empty: none): unknown
    flags, flags the loop sets, and values that are not of the argument's type or outside its bounds."""
    known = {str(a.get("name")): a for a in arguments}
    problems = [f"the recipe has no {flag} argument, which the loop sets" for flag in LOOP_FLAGS if flag not in known]
    for v in variants:
        for flag, value in zip(v.args[::2], v.args[1::2], strict=True):
            if flag in LOOP_FLAGS:
                problems.append(f"variant {v.name}: {flag} is set by the loop (steps from the design, seeds, evals)")
            elif flag not in known:
                problems.append(
                    f"variant {v.name}: the recipe has no {flag} argument; it has {', '.join(sorted(known))}"
                )
            elif (why := value_problem(known[flag], value)) is not None:
                problems.append(f"variant {v.name}: {flag} {value}: {why}")
    return problems


def value_problem(argument: dict[str, Any], value: str) -> str | None:
    """Why `value` is not accepted by a recipe argument (its type and bounds as list_recipes lists them), or None."""
    kind = argument.get("type")
    if kind not in ("int", "float"):
        return None
    try:
        number = int(value) if kind == "int" else float(value)
    except ValueError:
        return f"not {'an integer' if kind == 'int' else 'a number'}"
    if not math.isfinite(number):
        return "not a finite number"
    low, high, above = argument.get("minimum"), argument.get("maximum"), argument.get("exclusive_minimum")
    if _number(above) and not number > above:
        return f"must be > {above:g}"
    if _number(low) and number < low:
        return f"must be >= {low:g}"
    if _number(high) and number > high:
        return f"must be <= {high:g}"
    return None


def run_args(variant: Variant, steps: int, seed: int, *, evals: int, horizon: int | None = None) -> list[str]:
    """One run's arguments: the variant's, then what the loop sets (steps, seed, evaluations and their horizon)."""
    extra = ["--eval-horizon", str(horizon)] if horizon else []
    return [*variant.args, "--steps", str(steps), "--seed", str(seed), "--evals", str(evals), *extra]


# ---- the ladder: its design from the pilot -------------------------------------------------------------------


@dataclass
class LadderDesign:
    """The rounds of the study: the compute per run at each rung (doubling), the steps each variant needs there,
    the evaluation horizon (the target's steps, so that a run continued rung by rung evaluates at the same steps as
    one run straight to the target), and how the first rung was chosen."""

    unit: str
    compute_key: str
    rungs: list[float]
    steps: dict[str, list[int]]
    horizon: dict[str, int]
    rule: str
    pilot: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def target(self) -> float:
        return self.rungs[-1]


def design_ladder(
    rates: dict[str, float],
    c_mids: dict[str, float | None],
    pilot_compute: dict[str, float],
    *,
    unit: str,
    compute_key: str,
    rungs: int = DEFAULT_RUNGS,
    rise: float = RISE_FACTOR,
    min_steps: int = MIN_STEPS,
) -> LadderDesign:
    """The first rung at `rise` times the latest fitted midpoint (C_mid) seen within the pilot, so that the part
    of every curve fitted at the first round includes its rise; then `rungs` - 1 doublings to the target. A variant
    whose midpoint lies beyond its pilot (or could not be fitted) rises later than the pilot shows: it is judged on
    its forecast like the others, and the rule says so."""
    if rungs < 1:
        raise StudyError(f"--rungs {rungs}: accepted: 1 to 6")
    seen = {v: c for v, c in c_mids.items() if c is not None and 0 < c <= pilot_compute.get(v, 0.0)}
    later = sorted(v for v in rates if v not in seen)
    if seen:
        slowest = max(seen, key=lambda v: seen[v])
        first = rise * seen[slowest]
        rule = (
            f"the first rung is {rise:g} x the latest midpoint the pilot saw ({slowest}: C_mid {seen[slowest]:.3g} "
            f"{unit}), so the first round's fits include the rise"
        )
    else:
        first = rise * max(pilot_compute.values())
        rule = f"no midpoint lay within the pilot; the first rung is {rise:g} x the pilot's compute"
    floor = min_steps * max(rates.values())
    if first < floor:
        first = floor
        rule += f"; raised to {min_steps} steps of the costliest variant ({floor:.3g} {unit})"
    if later:
        rule += (
            f"; {', '.join(later)}: midpoint beyond the pilot (a later rise), judged on its forecast like the others"
        )
    ladder = [first * 2**k for k in range(rungs)]
    steps = {v: [max(1, math.ceil(c / rate)) for c in ladder] for v, rate in rates.items()}
    rule += f"; {rungs} rung(s), each doubling the compute per run, to the target {ladder[-1]:.3g} {unit}"
    return LadderDesign(
        unit=unit,
        compute_key=compute_key,
        rungs=ladder,
        steps=steps,
        horizon={v: s[-1] for v, s in steps.items()},
        rule=rule,
    )


def per_step_rate(rows: list[dict[str, Any]], compute_key: str) -> float | None:
    """Compute per step from a pilot run's metrics rows (the last row that has both), or None."""
    usable = [r for r in rows if _number(r.get(compute_key)) and _number(r.get("step")) and r["step"] > 0]
    if not usable:
        return None
    last = max(usable, key=lambda r: r["step"])
    rate = float(last[compute_key]) / float(last["step"])
    return rate if rate > 0 else None


def ceiling_of(rows: list[dict[str, Any]]) -> float | None:
    """The task's best reachable pass rate on the held-out prompts, as the recipe logs it (None when it does not)."""
    values = {float(r["ceiling"]) for r in rows if _number(r.get("ceiling"))}
    return max(values) if values else None


# ---- the ladder: judging a round -------------------------------------------------------------------------------


@dataclass
class RoundCall:
    """What one round decides: the leader at the target, who stops and why, who goes on, and whether the study
    ends. A variant stops when it cannot beat the leader at the target by the margin: `stopped` (clearly below the
    leader), `tied` (within the margin of it either way) or `futile` (neither, but it cannot be better by the
    margin or more)."""

    leader: str | None
    stopped: list[str]
    tied: list[str]
    futile: list[str]
    continued: list[str]
    end: Literal["one_leader"] | None
    note: str
    why: dict[str, str] = field(default_factory=dict)  # each stopped variant's own reason


def judge_round(forecasts: dict[str, dict[str, Any] | None], margin: float) -> RoundCall:
    """forecasts: each active variant's forecast at the target (predict_scaling's value with its interval at the
        study's level), or None when it has none (its fit was refused). The leader is the variant surest to be high: the
    highest lower bound (then the highest forecast), the one against which "cannot beat it by the margin" is the
    strongest statement (a leader by point estimate with a wide interval stops nothing, though a surer variant could
    stop it). A variant
        stops when its upper bound is at most the leader's lower bound plus `margin`: it cannot beat the leader by a
        difference that matters (margin 0: only one clearly below stops). The study ends when the leader is the only
        variant going on. A variant without a forecast goes on (it cannot be judged) and keeps the study going."""
    judged = {v: f for v, f in forecasts.items() if f is not None and _number(f.get("value"))}
    unjudged = [v for v in forecasts if v not in judged]
    if not judged:
        return RoundCall(None, [], [], [], list(forecasts), None, "no variant has a forecast this round", {})
    leader = max(judged, key=lambda v: (judged[v]["ci_low"], judged[v]["value"]))
    top = judged[leader]
    eps = 1e-12
    below: list[str] = []
    tied: list[str] = []
    futile: list[str] = []
    notes: list[str] = []
    why: dict[str, str] = {}
    for v, f in judged.items():
        if v == leader or f["ci_high"] > top["ci_low"] + margin + eps:
            continue
        if f["ci_high"] < top["ci_low"]:
            below.append(v)
            notes.append(
                f"{v} stops: its upper bound {f['ci_high']:.3f} is below {leader}'s lower bound {top['ci_low']:.3f}"
            )
        elif f["ci_low"] >= top["ci_high"] - margin - eps:
            tied.append(v)
            notes.append(
                f"{v} stops, tied with {leader}: its interval [{f['ci_low']:.3f}, {f['ci_high']:.3f}] and the leader's "
                f"[{top['ci_low']:.3f}, {top['ci_high']:.3f}] differ by at most the margin {margin:.3g} either way"
            )
        else:
            futile.append(v)
            notes.append(
                f"{v} stops: its upper bound {f['ci_high']:.3f} is within the margin {margin:.3g} of {leader}'s lower "
                f"bound {top['ci_low']:.3f}, so it cannot beat it by a difference that matters"
            )
        why[v] = notes[-1]
    continued = [v for v in forecasts if v not in below and v not in tied and v not in futile]
    if unjudged:
        notes.append(f"{', '.join(unjudged)}: no forecast (see the errors), not judged this round")
    end: Literal["one_leader"] | None = None
    if continued == [leader]:
        end = "one_leader"
        notes.append(f"{leader} leads; no other variant goes on")
    return RoundCall(leader, below, tied, futile, continued, end, "; ".join(notes) or "no variant stops", why)


def resolve_margin(margin: float | None, arguments: list[dict[str, Any]]) -> tuple[float, str]:
    """The margin below which a difference at the target does not matter, and why: as given, else twice the
    standard error of one evaluation's pass rate at 0.5 on the recipe's held-out set (--eval-size's default): a
    smaller difference between two runs cannot be told from the evaluation's own noise."""
    if margin is not None:
        return margin, f"{margin:g}, as given (--margin)"
    size = next((a.get("default") for a in arguments if a.get("name") == "--eval-size"), None)
    if not isinstance(size, int) or size < 1:
        return 0.02, "0.02 (the recipe states no held-out set size)"
    value = 2 * math.sqrt(0.25 / size)
    return value, (
        f"{value:.3f}: twice the standard error of one evaluation's pass rate at 0.5 on the {size} held-out prompts; "
        "a smaller difference cannot be told from the evaluation's own noise (--margin sets another)"
    )


def stop_rule_text(level: float, margin: float) -> str:
    return (
        f"after each round every variant's runs (its seeds pooled) are fitted ({LAW}) and forecast at the target "
        f"with a {level:.0%} interval (the task's ceiling bounds the fits); a variant stops when "
        f"its upper bound is at most the leader's lower bound + {margin:.3g}: it cannot beat the leader by a "
        "difference that matters; the study ends when only the leader goes on, at the target, or when the budget is "
        "spent"
    )


def round_cost(rungs: list[float], round_index: int, chains: int) -> float:
    """Compute that one more round costs: each continued run goes from the previous rung to this one."""
    before = rungs[round_index - 1] if round_index > 0 else 0.0
    return chains * (rungs[round_index] - before)


# ---- curves ---------------------------------------------------------------------------------------------------


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def curve_points(rows: list[dict[str, Any]], compute_key: str, run: str | None = None) -> list[dict[str, Any]]:
    """The evaluation rows of a run as curve points {compute, value, run}, in compute order."""
    points = [
        {"compute": float(r[compute_key]), "value": float(r[VALUE_KEY]), **({"run": run} if run else {})}
        for r in rows
        if r.get("split", "eval") == "eval" and _number(r.get(compute_key)) and _number(r.get(VALUE_KEY))
    ]
    points = [p for p in points if p["compute"] > 0]
    return sorted(points, key=lambda p: p["compute"])


# ---- the node check --------------------------------------------------------------------------------------------


def node_verdict(health: dict[str, Any] | None, kernel: dict[str, Any] | None, kernel_error: str | None) -> str:
    """One paragraph from gpu_health and scan_kernel_log (either may be missing)."""
    parts = []
    if health is None:
        parts.append("The GPUs could not be read (gpu_health failed; see the errors).")
    elif not health.get("available"):
        parts.append(
            f"No GPU here: {health.get('reason') or 'no GPUs were found'}. The study runs on CPU: training "
            "with gloo and compute counted in FLOPs; the overlap step needs GPUs and is skipped unless asked for "
            "(--overlap measures gloo on CPU, which checks plumbing and correctness, not GPU performance)."
        )
    else:
        gpus = [g.get("gpu") or {} for g in health.get("gpus") or []]
        names = sorted({str(g.get("name")) for g in gpus if g.get("name")})
        parts.append(
            f"{health.get('gpu_count', len(gpus))} GPU(s) ({', '.join(names) or 'names not reported'}), driver "
            f"{health.get('driver_version') or 'unknown'}, CUDA {health.get('cuda_version') or 'unknown'}."
        )
    if health is not None and health.get("available"):
        counts = ", ".join(f"{n} {s}" for s, n in sorted((health.get("counts") or {}).items()))
        parts.append(f"Health: node {health.get('node_status')} ({counts}).")
        for gpu in health.get("gpus") or []:
            findings = [f for f in gpu.get("findings") or [] if f.get("severity") != "info"]
            for f in findings[:5]:
                parts.append(
                    f"GPU {gpu.get('gpu', {}).get('index')}: {f.get('severity')}: {f.get('what')}; {f.get('action')}."
                )
        if health.get("node_status") in ("unhealthy", "degraded"):
            parts.append("Treat this node's measurements with care; the findings above say what to do first.")
    if kernel is not None:
        rows = kernel.get("summary") or []
        text = (
            f"Kernel log: {kernel.get('matched_lines', 0)} GPU-related line(s) in {kernel.get('lines_read', 0)} lines, "
            f"{kernel.get('summary_rows', len(rows))} GPU/error pair(s)"
        )
        if rows:
            worst = rows[0]
            text += (
                f"; the worst: {worst.get('kind')} {worst.get('code') if worst.get('code') is not None else ''} x"
                f"{worst.get('count')} ({worst.get('severity')}): {worst.get('action')}"
            )
        parts.append(text + ".")
    else:
        parts.append(f"Kernel log not read: {kernel_error or 'not asked'}.")
    return " ".join(parts)


# ---- overlap: prediction next to measurement --------------------------------------------------------------------


def overlap_rows(
    predictions: dict[str, dict[str, Any]], measured: dict[str, Any] | None, measured_note: str | None = None
) -> list[dict[str, Any]]:
    """One row per layer: predict_overlap's figures (prediction) and tune_overlap's (measurement), side by side."""
    by_layer = {e["layer"]: e for e in (measured or {}).get("layers") or []}
    rows = []
    for layer in dict.fromkeys([*predictions, *by_layer]):
        pred = (predictions.get(layer) or {}).get("prediction")
        meas = by_layer.get(layer)
        fastest = None
        if meas:
            timed = [m for m in meas.get("methods") or [] if m.get("available") and _number(m.get("t_overlap_ms"))]
            if timed:
                best = min(timed, key=lambda m: m["t_overlap_ms"])
                fastest = {"name": best["name"], "t_ms": best["t_overlap_ms"], "valid": bool(best.get("valid"))}
        rows.append(
            {
                "layer": layer,
                "pattern": (pred or {}).get("pattern") or (meas or {}).get("pattern"),
                "predicted": None
                if pred is None
                else {
                    "gpu": pred.get("gpu"),
                    "interconnect": pred.get("interconnect"),
                    "shape": _shape(pred),
                    "t_sequential_ms": pred.get("t_sequential_ms"),
                    "t_overlap_ms": pred.get("t_overlap_ms"),
                    "speedup": pred.get("speedup"),
                    "best_chunks": pred.get("best_chunks"),
                    "worth_it": pred.get("worth_it"),
                },
                "measured": None
                if meas is None
                else {
                    "shape": f"{meas.get('m')}x{meas.get('n')}x{meas.get('k')}",
                    "t_sequential_ms": meas.get("t_sequential_ms"),
                    "best": meas.get("best"),
                    "best_t_ms": meas.get("best_t_ms"),
                    "gain": meas.get("gain"),
                    "verdict": meas.get("verdict"),
                    "valid": meas.get("measurement_valid"),
                    "invalid_reasons": meas.get("measurement_invalid_reasons") or [],
                    "fastest": fastest,
                },
                "note": measured_note,
            }
        )
    return rows


def _shape(pred: dict[str, Any]) -> str | None:
    m, n, k = pred.get("m"), pred.get("n"), pred.get("k")
    return f"{m}x{n}x{k}" if None not in (m, n, k) else None


# ---- the decision ----------------------------------------------------------------------------------------------


@dataclass
class Decision:
    kind: Literal["forecast", "asymptote", "efficiency", "none"]
    variant: str | None
    fit_id: str | None
    leading_variant: str | None  # the best fitted asymptote: what a follow-up round extends
    text: str
    quoted: dict[str, Any] = field(default_factory=dict)


def _pairs_led_by(comparison: dict[str, Any], fit_id: str) -> list[dict[str, Any]]:
    return [p for p in comparison.get("pairs") or [] if p.get("first") == fit_id]


def decide(
    best_first: dict[str, Any],
    efficient_first: dict[str, Any] | None,
    variant_of_fit: dict[str, str],
    level: float,
) -> Decision:
    """Which variant to scale, from compare_scaling_fits called with the best asymptote's fit first (so that every
    pair's p_first_higher_asymptote is the probability that it is higher) and, when another fit is the most
    efficient, called again with that fit first.

    1. The best fitted asymptote is higher than every other's in at least `level` of the bootstrap draw pairs:
       scale it (ScaleRL: the asymptote decides what scaling buys).
    2. Else, the most efficient fit (lowest C_mid) reaches half its gain with less compute than every other in at
       least `level` of the draws, and no asymptote is clearly above its own (each other's is higher in at most
       `level` of the draws): scale it.
    3. Else: no decision at this level; the leading variant is the best fitted asymptote."""
    fits = {f["fit_id"]: f for f in best_first.get("fits") or []}
    best = best_first.get("highest_fitted_asymptote") or best_first["best_asymptote"]
    unit = best_first.get("compute_unit", "")
    others = [f for f in fits if f != best]
    pairs = _pairs_led_by(best_first, best)
    if {p["second"] for p in pairs} != set(others):
        raise ValueError("decide() needs compare_scaling_fits called with the best asymptote's fit first")
    p_higher = {p["second"]: p.get("p_first_higher_asymptote") for p in pairs}

    def name(fit_id: str) -> str:
        return variant_of_fit.get(fit_id, fits.get(fit_id, {}).get("label") or fit_id)

    def describe(fit_id: str) -> str:
        f = fits[fit_id]
        ci = f.get("asymptote_ci")
        band = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        mid = f.get("c_mid")
        half = f", reaches half its gain at C_mid={mid:.3g} {unit}" if mid is not None else ""
        return f"A={f['asymptote']:.3f}{band}{half}"

    def quoted(fit_id: str, probabilities: dict[str, float | None], what: str) -> dict[str, Any]:
        f = fits[fit_id]
        return {
            "fit_id": fit_id,
            "A": f["asymptote"],
            "A_ci": f.get("asymptote_ci"),
            "C_mid": f.get("c_mid"),
            "B": f.get("b"),
            "compute_unit": unit,
            "probability_of": what,
            "probabilities": {name(k): v for k, v in probabilities.items()},
            "probabilities_by_fit": dict(probabilities),
            "level": level,
        }

    known = [v for v in p_higher.values() if v is not None]
    named = best_first.get("best_asymptote", best) == best  # the comparison names it (every A identified)
    if named and known and len(known) == len(p_higher) and min(known) >= level:
        against = "; ".join(f"P(A higher than {name(k)}) = {v:.2f}" for k, v in p_higher.items())
        return Decision(
            kind="asymptote",
            variant=name(best),
            fit_id=best,
            leading_variant=name(best),
            text=f"Scale {name(best)}: higher asymptote {describe(best)}; {against} (bootstrap draw pairs).",
            quoted=quoted(best, p_higher, "higher asymptote"),
        )
    efficient = best_first.get("most_efficient")
    if efficient is not None and efficient_first is not None and efficient in fits:
        e_pairs = _pairs_led_by(efficient_first, efficient)
        p_eff = {p["second"]: p.get("p_first_more_efficient") for p in e_pairs}
        p_a = {p["second"]: p.get("p_first_higher_asymptote") for p in e_pairs}
        complete = {p["second"] for p in e_pairs} == {f for f in fits if f != efficient}
        eff_known = [v for v in p_eff.values() if v is not None]
        a_known = [v for v in p_a.values() if v is not None]
        if (
            complete
            and eff_known
            and len(eff_known) == len(p_eff)
            and min(eff_known) >= level
            and len(a_known) == len(p_a)
            and min(a_known) >= 1 - level
        ):
            against = "; ".join(f"P(more efficient than {name(k)}) = {v:.2f}" for k, v in p_eff.items())
            ties = ", ".join(f"P(A higher than {name(k)}) = {v:.2f}" for k, v in p_a.items())
            return Decision(
                kind="efficiency",
                variant=name(efficient),
                fit_id=efficient,
                leading_variant=name(efficient),
                text=(
                    f"Scale {name(efficient)}: the asymptotes do not separate at {level:.0%} ({ties}), and it is the "
                    f"more efficient: {describe(efficient)}; {against} (bootstrap draw pairs)."
                ),
                quoted={
                    **quoted(efficient, p_eff, "more efficient"),
                    "p_higher_asymptote": {name(k): v for k, v in p_a.items()},
                },
            )
    shown = "; ".join(
        f"P(A of {name(best)} higher than {name(k)}) = {v:.2f}" if v is not None else f"no draws for {name(k)}"
        for k, v in p_higher.items()
    )
    return Decision(
        kind="none",
        variant=None,
        fit_id=None,
        leading_variant=name(best),
        text=(
            f"No variant to scale yet: neither the asymptotes nor the efficiencies separate at {level:.0%}. "
            f"{name(best)} has the highest fitted asymptote, {describe(best)}, but {shown}."
            + ("" if named else f" {best_first.get('asymptote_statement', '')}")
        ),
        quoted=quoted(best, p_higher, "higher asymptote"),
    )


def _band(f: dict[str, Any]) -> str:
    return f"{f['value']:.3f} [{f['ci_low']:.3f}, {f['ci_high']:.3f}]"


def decide_forecast(
    leader: str,
    ladder: list[dict[str, Any]],
    stops: dict[str, dict[str, Any]],
    level: float,
    unit: str,
    target: float,
    margin: float,
    *,
    unfitted: list[str] | None = None,
) -> Decision:
    """The ladder ended with only the leader going on: every other variant stopped in some round, below the
    then-leader (its upper bound under the leader's lower bound) or tied with it (both within the margin). Quotes
    each stop: its round, both forecasts then, and the share of bootstrap draw pairs in which the leader's curve was
    higher at the target."""
    last = next(r for r in reversed(ladder) if (r.get("forecasts") or {}).get(leader))
    mine = last["forecasts"][leader]
    below: list[str] = []
    tied: list[str] = []
    futile: list[str] = []
    probabilities: dict[str, float | None] = {}
    for variant, stop in stops.items():
        rnd = next(r for r in ladder if r["round"] == stop["round"])
        p = (rnd.get("p_leader_higher") or {}).get(variant)
        probabilities[variant] = p
        there = rnd["forecasts"][stop["leader"]]
        text = (
            f"{variant} after round {stop['round']} (forecast {_band(stop['forecast'])} against {stop['leader']}'s "
            f"{_band(there)}" + (f", P({stop['leader']} higher) = {p:.2f}" if p is not None else "") + ")"
        )
        {"tied": tied, "futile": futile}.get(stop.get("kind") or "", below).append(text)
    parts = []
    if below:
        parts.append("stopped below the leader: " + "; ".join(below))
    if futile:
        parts.append(
            f"stopped as unable to beat the leader by the margin {margin:.3g} (its upper bound within it of the "
            "leader's lower bound): " + "; ".join(futile)
        )
    if tied:
        parts.append(
            f"stopped as ties (within {margin:.3g} of the leader, a difference that does not matter): "
            + "; ".join(tied)
        )
    text = (
        f"Scale {leader}: at the target ({target:.3g} {unit} per run) its forecast is {_band(mine)} "
        f"({level:.0%} interval, round {last['round']}); every other variant "
        + ("; ".join(parts) if parts else "was left out")
        + "."
    )
    if unfitted:
        text += (
            f" Left out: {', '.join(unfitted)}, whose curve could not be fitted at the target (see the errors), so "
            "nothing here compares it."
        )
    return Decision(
        kind="forecast",
        variant=leader,
        fit_id=mine.get("fit_id"),
        leading_variant=leader,
        text=text,
        quoted={
            "fit_id": mine.get("fit_id"),
            "forecast": mine,
            "target": target,
            "compute_unit": unit,
            "ties": [v for v, stop in stops.items() if stop.get("kind") == "tied"],
            "left_out": list(unfitted or []),
            "margin": margin,
            "probability_of": "leader higher at the target (draw pairs, in the round that stopped each)",
            "probabilities": probabilities,
            "level": level,
        },
    )


def acceptable(decision: dict[str, Any] | None) -> frozenset[str]:
    """What a decision leaves standing: the chosen variant and its ties (empty: no variant chosen). Two studies
    reach the same decision when these sets are equal."""
    if not decision or not decision.get("variant"):
        return frozenset()
    ties = (decision.get("quoted") or {}).get("ties") or []
    return frozenset([decision["variant"], *ties])


def forecast_checks(ladder: list[dict[str, Any]], measured: dict[str, float]) -> list[dict[str, Any]]:
    """Each round's forecast at the target next to what the variant measured there (the mean over its seeds of the
    last evaluation at the target), for the variants that reached it: error = forecast - measured."""
    rows = []
    for rnd in ladder:
        for variant, f in (rnd.get("forecasts") or {}).items():
            if variant not in measured or f is None or rnd.get("at_target"):
                continue
            value = measured[variant]
            rows.append(
                {
                    "variant": variant,
                    "round": rnd["round"],
                    "forecast": f["value"],
                    "measured": value,
                    "error": f["value"] - value,
                    "inside_ci": bool(f["ci_low"] <= value <= f["ci_high"]),
                    "inside_pi": None
                    if f.get("pi_low") is None or f.get("pi_high") is None
                    else bool(f["pi_low"] <= value <= f["pi_high"]),
                }
            )
    return rows


def measured_at(rows: list[dict[str, Any]], compute_key: str, target: float) -> float | None:
    """A run's evaluation at the target compute (the last evaluation at or past 99.9% of it), or None."""
    points = [r for r in rows if _number(r.get(compute_key)) and _number(r.get(VALUE_KEY))]
    reached = [r for r in points if r[compute_key] >= 0.999 * target]
    if not reached:
        return None
    return float(min(reached, key=lambda r: r[compute_key])[VALUE_KEY])
