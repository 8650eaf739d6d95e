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
LOOP_FLAGS = ("--steps", "--seed", "--evals")  # the loop sets these itself; a variant may not
PILOT_STEPS = 20
MIN_STEPS = 200  # a round-1 run shorter than this gives too few evaluations beyond its first half
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
    budget: float
    budget_unit: Literal["flops", "gpu_hours"] | None = None  # None: flops on CPU, gpu_hours on GPUs
    backend: Literal["local", "slurm", "ray"] = "local"
    quick: bool = False
    preset: str = "llama3-8b"
    tp: int = 2
    overlap: bool = True
    overlap_layers: list[str] | None = None  # None: every TP layer of the preset
    overlap_iters: int = 10
    cpu_seq_len: int = 64  # the preset's shapes at this many tokens when measured on CPU
    followup: bool = True
    followup_threshold: float = 0.02  # pass-rate units: check_extrapolation's mean |error| that calls a follow-up
    level: float = 0.95
    bootstrap: int = 200
    evals: int = 60
    run_wall_s: float = 600.0
    max_runs_per_sweep: int = 4  # LLM_INFRA_MCP_MAX_CONCURRENT_JOBS: a sweep starts all its runs at once

    def validate(self) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise StudyError(
                f"--name {self.name!r}: accepted: letters, digits, '_', '.', '-' (at most 48, starting with a letter "
                "or digit); it names the study's sweeps and jobs"
            )
        if len(self.variants) < 2:
            raise StudyError("--variants: a study compares at least two variants, e.g. --variants lr=0.02 lr=0.005")
        names = [v.name for v in self.variants]
        if len(set(names)) < len(names):
            raise StudyError(f"--variants: the same variant is named twice ({', '.join(names)})")
        if not 1 <= self.seeds <= 16:
            raise StudyError(f"--seeds {self.seeds}: accepted: 1 to 16")
        if not (self.budget > 0 and math.isfinite(self.budget)):
            raise StudyError(f"--budget {self.budget}: must be a positive number")
        if self.max_runs_per_sweep < 1:
            raise StudyError("LLM_INFRA_MCP_MAX_CONCURRENT_JOBS must be at least 1 for the loop's sweeps")


def check_variants(variants: list[Variant], arguments: list[dict[str, Any]]) -> list[str]:
    """Problems with the variants against the recipe's arguments as list_recipes lists them (empty: none)."""
    known = {str(a.get("name")) for a in arguments}
    problems = [f"the recipe has no {flag} argument, which the loop sets" for flag in LOOP_FLAGS if flag not in known]
    for v in variants:
        for flag in v.args[::2]:
            if flag in LOOP_FLAGS:
                problems.append(f"variant {v.name}: {flag} is set by the loop (steps from the budget, seeds, evals)")
            elif flag not in known:
                problems.append(
                    f"variant {v.name}: the recipe has no {flag} argument; it has {', '.join(sorted(known))}"
                )
    return problems


def run_args(variant: Variant, steps: int, seed: int) -> list[str]:
    """One run's arguments beyond the sweep's base arguments."""
    return [*variant.args, "--steps", str(steps), "--seed", str(seed)]


# ---- the budget ------------------------------------------------------------------------------------------------


@dataclass
class BudgetPlan:
    """How the budget splits: round 1 over every variant and seed, a reserve for the follow-up round."""

    budget: float
    unit: str
    runs: int
    reserve: float
    per_run: float
    per_step: dict[str, float]
    steps: dict[str, int]
    followup_steps: dict[str, int]
    rule: str


def split_budget(
    budget: float, unit: str, per_step: dict[str, float], seeds: int, followup: bool, *, min_steps: int = MIN_STEPS
) -> BudgetPlan:
    """Round 1: (budget - reserve) shared evenly by the runs (variants x seeds), each run's steps from its variant's
    compute per step (measured by the pilot). With a follow-up, the reserve is 2 / (runs + 2) of the budget: one
    run of the leading variant at twice a round-1 run's compute, so that the follow-up doubles the compute range."""
    runs = len(per_step) * seeds
    reserve = budget * 2 / (runs + 2) if followup else 0.0
    per_run = (budget - reserve) / runs
    steps = {name: math.floor(per_run / rate) for name, rate in per_step.items()}
    short = {name: s for name, s in steps.items() if s < min_steps}
    if short:
        worst = max(per_step[name] for name in short)
        needed = min_steps * worst * runs * ((runs + 2) / runs if followup else 1.0)
        raise StudyError(
            f"--budget {budget:g} {unit} gives {', '.join(f'{n}: {s} steps' for n, s in short.items())} per run; "
            f"each run needs at least {min_steps} steps: a budget of at least {needed:.3g} {unit}, or fewer "
            "variants or seeds"
        )
    followup_steps = {name: math.floor(reserve / rate) for name, rate in per_step.items()} if followup else {}
    rule = f"{runs} runs ({len(per_step)} variants x {seeds} seeds) share {budget - reserve:.3g} {unit}" + (
        f"; {reserve:.3g} {unit} (2/(runs+2) of the budget) is kept for one follow-up run" if followup else ""
    )
    return BudgetPlan(
        budget=budget,
        unit=unit,
        runs=runs,
        reserve=reserve,
        per_run=per_run,
        per_step=dict(per_step),
        steps=steps,
        followup_steps=followup_steps,
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


# ---- curves and the held-out half -----------------------------------------------------------------------------


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


def half_split(points: list[dict[str, Any]]) -> float:
    """The first half of compute ends at half the largest compute (ScaleRL; check_extrapolation's default too)."""
    return max(p["compute"] for p in points) / 2


def held_out(points: list[dict[str, Any]]) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    """(split, the points up to it, the points beyond it)."""
    split = half_split(points)
    return split, [p for p in points if p["compute"] <= split], [p for p in points if p["compute"] > split]


def error_rows(held: list[dict[str, Any]], predicted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured (read_job_metrics) next to predicted (predict_scaling, in the same order) for the held-out points;
    error = predicted - measured."""
    if len(held) != len(predicted):
        raise ValueError(f"{len(held)} held-out points but {len(predicted)} predictions")
    rows = []
    for point, p in zip(held, predicted, strict=True):
        low, high = p.get("pi_low"), p.get("pi_high")
        rows.append(
            {
                "compute": point["compute"],
                "measured": point["value"],
                "predicted": p["value"],
                "ci_low": p.get("ci_low"),
                "ci_high": p.get("ci_high"),
                "pi_low": low,
                "pi_high": high,
                "error": p["value"] - point["value"],
                "inside_pi": None if low is None or high is None else bool(low <= point["value"] <= high),
            }
        )
    return rows


def error_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and max |error| over held-out rows, and how many measurements fell inside the prediction interval."""
    if not rows:
        return {"points": 0, "mean_abs_error": None, "max_abs_error": None, "inside_pi": None}
    errors = [abs(r["error"]) for r in rows]
    judged = [r["inside_pi"] for r in rows if r["inside_pi"] is not None]
    return {
        "points": len(rows),
        "mean_abs_error": sum(errors) / len(errors),
        "max_abs_error": max(errors),
        "inside_pi": sum(1 for x in judged if x) if judged else None,
        "judged": len(judged),
    }


# ---- the node check --------------------------------------------------------------------------------------------


def node_verdict(health: dict[str, Any] | None, kernel: dict[str, Any] | None, kernel_error: str | None) -> str:
    """One paragraph from gpu_health and scan_kernel_log (either may be missing)."""
    parts = []
    if health is None:
        parts.append("The GPUs could not be read (gpu_health failed; see the errors).")
    elif not health.get("available"):
        parts.append(
            f"No GPU here: {health.get('reason') or 'no GPUs were found'}. The study runs on CPU: training "
            "with gloo and compute counted in FLOPs; overlap is predicted for a catalog GPU and measured on CPU, "
            "where timings check plumbing and correctness, not GPU performance."
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
    kind: Literal["asymptote", "efficiency", "none"]
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


def followup_needed(
    check: dict[str, Any] | None, threshold: float, plan: BudgetPlan | None, leading: str | None
) -> tuple[bool, str]:
    """Whether to run the follow-up round: the leading variant's scalerl extrapolation error (check_extrapolation's
    mean |error| on the held-out half) above the threshold, and a reserve that extends its compute range."""
    if leading is None:
        return False, "no leading variant (no comparison could be made)"
    if plan is None or not plan.followup_steps:
        return False, "the follow-up round is off (--no-followup)"
    if check is None:
        return False, f"no extrapolation check of {leading} to judge by"
    judged = next((m for m in check.get("models") or [] if m.get("model") == LAW), None)
    if judged is None:
        return False, f"the extrapolation check of {leading} has no {LAW} model"
    error = judged["mean_abs_error"]
    if error <= threshold:
        return False, (
            f"{leading} extrapolates within the threshold: {LAW} mean |error| {error:.4f} on the held-out half "
            f"<= {threshold:g}"
        )
    steps = plan.followup_steps.get(leading, 0)
    if steps <= plan.steps.get(leading, 0):
        return False, f"the reserve ({plan.reserve:.3g} {plan.unit}) does not extend {leading}'s compute range"
    return True, (
        f"{leading}'s {LAW} mean |error| on the held-out half is {error:.4f} > {threshold:g}: one run of {steps} "
        "steps (twice a round-1 run) extends its compute range, then refit"
    )
