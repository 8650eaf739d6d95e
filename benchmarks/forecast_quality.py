"""Forecast quality (issue 24, "Measure"): fit the first half of each run's compute and predict its final metric.

The runs are real ones this machine produces: the bundled tiny-grpo recipe over seeds and variants (difficulty,
lr, base, steps, KL), and optionally TRL GRPO runs from the trl-grpo recipe (--trl). Each run is read back
through servers/runs (the "suite" reader on tiny-grpo's metrics.jsonl; the "trl" reader on TRL's output folder,
its trainer_state.json), and the scaling server's own tools are called in-process: fit_scaling_law on the
points with compute <= half the run's final compute, then predict_scaling at the final compute with level 0.8.
Both curve forms are fitted: scalerl (the ScaleRL sigmoid; the target applies to it) and power_law (for
comparison).

    metric and compute: tiny-grpo: pass_rate (greedy, on its fixed held-out set) on compute_flops;
                        TRL: reward (the mean over the step's completions) on num_tokens (TRL's cumulative
                        count of prompt and completion tokens: proportional to the training FLOPs of a fixed
                        model, generation not separated)
    truth:    the run's last logged value of the metric, one observation at the final compute. It is noisy
              itself (tiny-grpo: ~0.015 binomial sd on 1,024 prompts; TRL: the mean of 8 completions), so the
              primary interval is the prediction interval (pi: the curve's bootstrap interval widened by the
              fit's residual scatter), which is what an interval for one observation must be. Also reported:
              the curve's own interval (ci) against the mean of the last --tail observations (less noisy; the
              ci leaves out the noise that remains in that mean, so it is expected to cover less).
    summary:  median |error| of the point prediction, coverage of the 80% interval with its Wilson 95%
              interval, and the target check |coverage - 80%| <= 10 points (scalerl, pi). When the intervals are
              too narrow or too wide, the factor by which they would have to be scaled to cover 80% is given.

Runs are cached by recipe, arguments and the recipe file's content under --cache (a run is reused only when it
finished). Exit status 1 when the target fails or a run could not be produced, read or fitted.

    python benchmarks/forecast_quality.py --out forecast.json          # ~20 tiny-grpo runs (minutes)
    python benchmarks/forecast_quality.py --trl --out forecast.json    # plus 6 TRL GRPO runs
    python benchmarks/forecast_quality.py --quick                      # 4 short runs (the smoke test)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RECIPES = REPO / "servers" / "launch" / "recipes"
DEFAULT_CACHE = REPO / "benchmarks" / ".cache" / "forecast_runs"
LEVEL = 0.8
TARGET_POINTS = 0.10  # coverage within 10 points of LEVEL
LAWS = ("scalerl", "power_law")
PRIMARY_LAW = "scalerl"
RUN_TIMEOUT_S = 900.0
MIN_FIT_POINTS = 5


@dataclass(frozen=True)
class Variant:
    """One run to produce: which recipe, its arguments, and how to read its metric."""

    name: str
    recipe: str  # "tiny-grpo" or "trl-grpo"
    args: tuple[str, ...]

    @property
    def metric(self) -> str:
        return "pass_rate" if self.recipe == "tiny-grpo" else "reward"

    @property
    def compute_key(self) -> str:
        return "compute_flops" if self.recipe == "tiny-grpo" else "num_tokens"

    @property
    def compute_unit(self) -> str:
        return "flops" if self.recipe == "tiny-grpo" else "tokens"


def tiny(name: str, *args: str) -> Variant:
    return Variant(name, "tiny-grpo", ("--ckpt-every", "0", *args))


def variants(quick: bool, trl: bool) -> list[Variant]:
    """The runs: seeds at the defaults and variants that change the curve's start, slope and plateau."""
    if quick:
        short = ("--steps", "300", "--evals", "16", "--eval-size", "256", "--batch-size", "32")
        out = [tiny(f"tiny-quick-s{s}", *short, "--seed", str(s)) for s in range(2)]
        out.append(tiny("tiny-quick-d0.5", *short, "--difficulty", "0.5"))
        if trl:
            out.append(Variant("trl-quick-s0", "trl-grpo", ("--steps", "24", "--seed", "0")))
        return out
    out = [tiny(f"tiny-s{s}", "--seed", str(s)) for s in range(5)]
    for flag, values in (
        ("--difficulty", ("0.1", "0.5")),
        ("--lr", ("0.005", "0.05")),
        ("--base", ("8", "32")),
        ("--kl-coef", ("0.05",)),
    ):
        for value in values:
            out += [tiny(f"tiny-{flag[2:]}{value}-s{s}", flag, value, "--seed", str(s)) for s in (0, 1)]
    out += [tiny("tiny-steps1000-s0", "--steps", "1000"), tiny("tiny-steps6000-s0", "--steps", "6000")]
    if trl:
        out += [Variant(f"trl-s{s}", "trl-grpo", ("--steps", "200", "--seed", str(s))) for s in range(4)]
        out.append(Variant("trl-lr0.001-s0", "trl-grpo", ("--steps", "200", "--lr", "0.001")))
        out.append(Variant("trl-letters8-s0", "trl-grpo", ("--steps", "200", "--letters", "8")))
    return out


# ---- producing runs ---------------------------------------------------------------------------------------------


def recipe_file(recipe: str) -> Path:
    return RECIPES / f"{recipe.replace('-', '_')}.py"


def cache_key(variant: Variant) -> str:
    """Every argument the recipe will run with (the given ones and its current defaults, from its parser) and the
    code of the recipe and of common.py: a changed argument, default or recipe is a new run; an edit to another
    recipe's arguments is not."""
    from servers.launch.recipes import arguments

    parser = getattr(arguments, variant.recipe.replace("-", "_"))()
    resolved = vars(parser.parse_args(list(variant.args)))
    digest = hashlib.sha256(json.dumps([variant.recipe, resolved], sort_keys=True, default=str).encode())
    for stem in (variant.recipe.replace("-", "_"), "common"):
        path = RECIPES / f"{stem}.py"
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def child_env(run_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_INFRA_MCP_")}
    env.update(
        LLM_INFRA_MCP_METRICS=str(run_dir / "metrics.jsonl"),
        OMP_NUM_THREADS="1",  # one core per run: the machine is shared
        MKL_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        WANDB_MODE="offline",
        CUDA_VISIBLE_DEVICES="",  # CPU runs: the compute axis and the noise are those of this machine's CPU
    )
    return env


def produce(variant: Variant, cache: Path, log: Any) -> tuple[Path, bool]:
    """The run's folder (metrics.jsonl, and trl/ for TRL), produced unless a finished one is cached; and whether it
    was reused. RuntimeError when the recipe fails."""
    run_dir = cache / f"{variant.name}-{cache_key(variant)}"
    done = run_dir / "DONE"
    if done.exists():
        return run_dir, True
    if run_dir.exists():  # an earlier attempt that did not finish: start it again from nothing
        for path in sorted(run_dir.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    extra = ["--output-dir", str(run_dir / "trl")] if variant.recipe == "trl-grpo" else []
    cmd = ["nice", "-n", "10", sys.executable, str(recipe_file(variant.recipe)), *variant.args, *extra]
    print(f"  running {variant.name}: {' '.join(cmd[3:])}", file=log, flush=True)
    started = time.monotonic()
    with (run_dir / "output.log").open("wb") as out:
        proc = subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(run_dir), timeout=RUN_TIMEOUT_S, check=False
        )
    if proc.returncode != 0:
        tail = (run_dir / "output.log").read_text(errors="replace")[-600:]
        raise RuntimeError(f"{variant.recipe} exited with {proc.returncode}: {tail.strip()}")
    done.write_text(json.dumps({"args": list(variant.args), "seconds": round(time.monotonic() - started, 2)}))
    return run_dir, False


# ---- reading runs -----------------------------------------------------------------------------------------------


@dataclass
class Curve:
    """A run's metric against compute, as read through servers/runs."""

    compute: list[float]
    value: list[float]
    reader: str
    notes: list[str] = field(default_factory=list)


def read_curve(variant: Variant, run_dir: Path) -> Curve:
    """The metric at each step where the compute is known too, in step order (InputError when unreadable)."""
    from servers.core.errors import InputError
    from servers.runs import registry

    keys = {variant.metric, variant.compute_key}
    if variant.recipe == "trl-grpo":  # TRL's own output folder (trainer_state.json), not the job's metrics file
        where, reader = registry.target(str(run_dir / "trl"), roots=[run_dir]), "trl"
    else:
        where, reader = registry.target(str(run_dir / "metrics.jsonl"), roots=[run_dir]), "suite"
    run = registry.read_run(where, keys=keys, reader=reader)
    metric, compute = run.series.get(variant.metric), run.series.get(variant.compute_key)
    if metric is None or compute is None:
        missing = [k for k in (variant.metric, variant.compute_key) if k not in run.series]
        raise InputError(f"{run_dir.name}: the {reader} reader found no {' or '.join(missing)}")
    at = dict(zip(compute.steps, compute.values, strict=True))
    pairs = [(at[s], v) for s, v in zip(metric.steps, metric.values, strict=True) if s in at and at[s] > 0]
    return Curve([c for c, _ in pairs], [v for _, v in pairs], reader, run.partial + run.notes)


# ---- forecasting ------------------------------------------------------------------------------------------------


@dataclass
class Forecast:
    law: str
    points_fitted: int
    predicted: float | None = None
    ci: tuple[float | None, float | None] = (None, None)
    pi: tuple[float | None, float | None] = (None, None)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)


async def forecast(client: Any, curve: Curve, unit: str, law: str, label: str) -> Forecast:
    """fit_scaling_law on the points with compute <= half the final compute, then predict_scaling at the final
    compute (level 0.8), through the scaling server's tools."""
    final = curve.compute[-1]
    points = [{"compute": c, "value": v} for c, v in zip(curve.compute, curve.value, strict=True) if c <= final / 2]
    out = Forecast(law, len(points))
    if len(points) < MIN_FIT_POINTS:
        out.error = f"only {len(points)} point(s) in the first half of compute (at least {MIN_FIT_POINTS})"
        return out
    fit = await client.call_tool(
        "fit_scaling_law",
        {"model": law, "data": {"points": points}, "label": label[:128], "compute_unit": unit, "level": LEVEL},
    )
    if fit.is_error:
        out.error = "fit_scaling_law: " + fit.content[0].text[:300]
        return out
    report = fit.structured_content
    out.warnings = list(report.get("warnings") or [])
    pred = await client.call_tool("predict_scaling", {"fit_id": report["fit_id"], "compute": [final], "level": LEVEL})
    if pred.is_error:
        out.error = "predict_scaling: " + pred.content[0].text[:300]
        return out
    value = pred.structured_content["values"][0]
    out.predicted = value["value"]
    out.ci = (value.get("ci_low"), value.get("ci_high"))
    out.pi = (value.get("pi_low"), value.get("pi_high"))
    out.warnings += [w for w in pred.structured_content.get("warnings") or [] if w not in out.warnings]
    return out


# ---- scoring ----------------------------------------------------------------------------------------------------


def covered(interval: tuple[float | None, float | None], truth: float) -> bool | None:
    low, high = interval
    if low is None or high is None:
        return None
    return low <= truth <= high


def scaled_miss(predicted: float, interval: tuple[float | None, float | None], truth: float) -> float | None:
    """|truth - predicted| in units of the interval's half on the truth's side (1: on its end); None without one."""
    low, high = interval
    if low is None or high is None:
        return None
    half = (high - predicted) if truth >= predicted else (predicted - low)
    miss = abs(truth - predicted)
    if half <= 0:
        return math.inf if miss > 0 else 0.0
    return miss / half


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval (95% by default) of a binomial proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, center - half)  # exact at the ends (rounding would miss them)
    high = 1.0 if successes == n else min(1.0, center + half)
    return (low, high)


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    if math.isinf(ordered[high]) or math.isinf(ordered[low]):
        return ordered[high] if pos > low else ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Row:
    """One run's forecast with one law, against the truth."""

    run: str
    recipe: str
    law: str
    reader: str
    points_total: int
    points_fitted: int
    final_compute: float
    observed: float  # the last value (the truth for pi)
    observed_tail_mean: float  # the mean of the last --tail values (the truth for ci)
    predicted: float | None
    pi: tuple[float | None, float | None]
    ci: tuple[float | None, float | None]
    abs_error: float | None
    pi_covered: bool | None
    ci_covered_tail: bool | None
    pi_scaled_miss: float | None
    error: str | None
    warnings: list[str]
    notes: list[str]


def score(variant: Variant, curve: Curve, fc: Forecast, tail: int) -> Row:
    observed = curve.value[-1]
    tail_mean = statistics.fmean(curve.value[-tail:])
    ok = fc.predicted is not None
    return Row(
        run=variant.name,
        recipe=variant.recipe,
        law=fc.law,
        reader=curve.reader,
        points_total=len(curve.value),
        points_fitted=fc.points_fitted,
        final_compute=curve.compute[-1],
        observed=observed,
        observed_tail_mean=tail_mean,
        predicted=fc.predicted,
        pi=fc.pi,
        ci=fc.ci,
        abs_error=abs(fc.predicted - observed) if ok else None,
        pi_covered=covered(fc.pi, observed) if ok else None,
        ci_covered_tail=covered(fc.ci, tail_mean) if ok else None,
        pi_scaled_miss=scaled_miss(fc.predicted, fc.pi, observed) if ok else None,
        error=fc.error,
        warnings=fc.warnings[:6],
        notes=curve.notes[:6],
    )


def coverage(flags: list[bool]) -> dict[str, Any]:
    hits = sum(flags)
    low, high = wilson(hits, len(flags))
    return {"covered": hits, "n": len(flags), "rate": hits / len(flags) if flags else None, "wilson95": [low, high]}


def summarize(rows: list[Row], law: str, recipe: str | None = None) -> dict[str, Any]:
    """Median |error|, pi and ci coverage (with Wilson intervals) and the widening factor, for one law."""
    mine = [r for r in rows if r.law == law and (recipe is None or r.recipe == recipe)]
    scored = [r for r in mine if r.abs_error is not None]
    pi_flags = [bool(r.pi_covered) for r in scored if r.pi_covered is not None]
    ci_flags = [bool(r.ci_covered_tail) for r in scored if r.ci_covered_tail is not None]
    misses = [r.pi_scaled_miss for r in scored if r.pi_scaled_miss is not None]
    out: dict[str, Any] = {
        "law": law,
        "recipe": recipe or "all",
        "runs": len(mine),
        "failed": len(mine) - len(scored),
        "median_abs_error": statistics.median([r.abs_error for r in scored]) if scored else None,  # type: ignore[misc]
        "pi_coverage": coverage(pi_flags),
        "ci_coverage_vs_tail_mean": coverage(ci_flags),
        # The factor the pi's halves would need to be scaled by for LEVEL of the truths to fall inside: >1 too
        # narrow, <1 too wide.
        "pi_scale_for_level": quantile(misses, LEVEL) if misses else None,
    }
    rate = out["pi_coverage"]["rate"]
    out["target_met"] = rate is not None and abs(rate - LEVEL) <= TARGET_POINTS + 1e-12
    return out


# ---- running it all ---------------------------------------------------------------------------------------------


async def forecast_all(work: list[tuple[Variant, Curve]], tail: int, home: Path, log: Any) -> list[Row]:
    from mcp import Client

    from servers.core.mcp_layer import App
    from servers.core.settings import Settings
    from servers.scaling.server import create_server

    app = App(Settings(home=home, allowed_roots=[home]), owner="forecast-quality")
    rows: list[Row] = []
    async with Client(create_server(app)) as client:
        for variant, curve in work:
            for law in LAWS:
                fc = await forecast(client, curve, variant.compute_unit, law, variant.name)
                row = score(variant, curve, fc, tail)
                rows.append(row)
                print(f"  {line(row)}", file=log, flush=True)
    return rows


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def line(r: Row) -> str:
    interval = f"[{fmt(r.pi[0])}, {fmt(r.pi[1])}]"
    cov = {True: "yes", False: "NO", None: "-"}[r.pi_covered]
    head = f"{r.run:<24} {r.law:<9} {r.points_fitted:>3}/{r.points_total:<3}"
    if r.error:
        return f"{head} failed: {r.error}"
    return f"{head} {fmt(r.predicted):>7} {interval:>16} {r.observed:>7.3f} {fmt(r.abs_error):>7} {cov:>4}"


def table(rows: list[Row], summaries: list[dict[str, Any]]) -> str:
    head = f"{'run':<24} {'law':<9} {'fit/all':<7} {'pred':>7} {'80% pi':>16} {'obs':>7} {'|err|':>7} {'in':>4}"
    out = [head, "-" * len(head), *(line(r) for r in rows), ""]
    for s in summaries:
        pc, cc = s["pi_coverage"], s["ci_coverage_vs_tail_mean"]
        if not pc["n"]:
            out.append(f"{s['law']:<9} {s['recipe']:<9} no forecast ({s['failed']} failed)")
            continue
        lo, hi = pc["wilson95"]
        out.append(
            f"{s['law']:<9} {s['recipe']:<9} runs {s['runs']:>2} (failed {s['failed']}): median |error| "
            f"{fmt(s['median_abs_error'], '.4f')}; pi covers {pc['covered']}/{pc['n']} = {pc['rate']:.0%} "
            f"(Wilson 95% {lo:.0%}-{hi:.0%}); ci covers the tail mean {cc['covered']}/{cc['n']}; pi would need "
            f"x{fmt(s['pi_scale_for_level'], '.2f')} for {LEVEL:.0%}"
        )
    return "\n".join(out)


def verdict(primary: dict[str, Any]) -> str:
    pc = primary["pi_coverage"]
    if not pc["n"]:
        return f"target not checked: no {primary['law']} forecast succeeded"
    rate, scale = pc["rate"], primary["pi_scale_for_level"]
    state = "met" if primary["target_met"] else "FAILED"
    text = (
        f"target {state}: {primary['law']}'s 80% prediction interval covers the final value in {rate:.0%} of "
        f"{pc['n']} runs (target {LEVEL:.0%} +- {TARGET_POINTS * 100:.0f} points)"
    )
    if not primary["target_met"] and scale is not None:
        how = "too narrow" if rate < LEVEL else "too wide"
        text += f"; the intervals are {how}: scaling their halves by {scale:.2f} would cover {LEVEL:.0%}"
    return text


def finite(value: Any) -> Any:
    """`value` with every non-finite float as null (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 short tiny-grpo runs (and 1 TRL with --trl)")
    parser.add_argument("--trl", action="store_true", help="also TRL GRPO runs (the trl-grpo recipe)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where runs are kept and reused")
    parser.add_argument("--tail", type=int, default=3, help="last values averaged for the ci's truth (>= 1)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows and the summary as JSON here")
    args = parser.parse_args(argv)
    if args.tail < 1:
        parser.error("--tail must be at least 1")
    if args.trl and not recipe_file("trl-grpo").exists():
        parser.error(f"--trl: the trl-grpo recipe is not there ({recipe_file('trl-grpo')})")
    cache = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    ignore = cache / ".gitignore"
    if not ignore.exists():  # generated runs are never committed
        ignore.write_text("*\n")
    log = sys.stderr
    started = time.monotonic()
    work: list[tuple[Variant, Curve]] = []
    failures: list[dict[str, str]] = []
    reused = 0
    for variant in variants(args.quick, args.trl):
        try:
            run_dir, was_cached = produce(variant, cache, log)
            reused += was_cached
            work.append((variant, read_curve(variant, run_dir)))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:  # InputError is a ValueError
            failures.append({"run": variant.name, "error": str(exc)[:600]})
            print(f"  {variant.name}: {exc}", file=log, flush=True)
    produced_s = time.monotonic() - started
    with tempfile.TemporaryDirectory(prefix="forecast-quality-") as home:
        rows = anyio.run(forecast_all, work, args.tail, Path(home), log)
    summaries = [summarize(rows, law, recipe) for law in LAWS for recipe in (None, "tiny-grpo", "trl-grpo")]
    summaries = [s for s in summaries if s["runs"] or s["recipe"] == "all"]
    primary = summaries[0]
    text = verdict(primary)
    print(table(rows, summaries))
    print(text)
    for f in failures:
        print(f"run not produced or not read: {f['run']}: {f['error']}")
    result = {
        "level": LEVEL,
        "target": f"|pi coverage - {LEVEL:.0%}| <= {TARGET_POINTS * 100:.0f} points ({PRIMARY_LAW})",
        "truth": "the last logged value (pi); the mean of the last --tail values (ci)",
        "tail": args.tail,
        "verdict": text,
        "summary": summaries,
        "rows": [asdict(r) for r in rows],
        "failures": failures,
        "runs_reused": reused,
        "seconds": {"runs": round(produced_s, 1), "total": round(time.monotonic() - started, 1)},
        "command": " ".join(
            ["python", "benchmarks/forecast_quality.py", *(argv if argv is not None else sys.argv[1:])]
        ),
    }
    if args.out is not None:
        args.out.write_text(json.dumps(finite(result), indent=2, default=str) + "\n")
    bad_fit = any(r.error for r in rows if r.law == PRIMARY_LAW)
    return 0 if primary["target_met"] and not failures and not bad_fit else 1


if __name__ == "__main__":
    sys.exit(main())
