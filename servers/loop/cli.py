"""The experiment loop's command line (examples/experiment_loop.py; `llm-infra-mcp loop` where the CLI offers it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servers.loop.study import StudyConfig, StudyError, parse_variant

DEFAULT_VARIANTS = ["lr=0.02", "lr=0.005"]
# Budgets in the recipe's FLOPs (CPU): with the pilot's ~8.7e6 FLOPs per step of tiny-grpo at its defaults, the
# default study's round-1 runs take about 21k steps each (about 80 s, 4 at once on 2 cores), the quick study's 1.1k.
DEFAULT_BUDGET = {False: 1.1e12, True: 4.0e10}
DEFAULT_SEEDS = {False: 2, True: 1}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="experiment_loop",
        description=(
            "Run an experiment study end to end over the suite's tools (stdio, like any MCP client): node check, "
            "overlap prediction next to measurement, an RL scaling study of tiny-grpo variants (fit the first half "
            "of compute, predict the second, compare, decide), and a report with pictures."
        ),
    )
    p.add_argument(
        "--name",
        default=None,
        help="the study's name (default: 'quick' with --quick, else 'default'); "
        "rerunning a study reuses its finished jobs",
    )
    p.add_argument("--out", type=Path, default=None, help="where the report goes (default: studies/NAME)")
    p.add_argument("--backend", choices=["local", "slurm", "ray"], default="local", help="where training runs")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="compute for the RL study in --budget-unit "
        f"(default {DEFAULT_BUDGET[False]:g}, with --quick {DEFAULT_BUDGET[True]:g})",
    )
    p.add_argument(
        "--budget-unit",
        choices=["flops", "gpu_hours"],
        default="flops",
        help="flops (deterministic; the default, and the right unit on CPU) or gpu_hours",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        default=None,
        metavar="FLAG=VALUE[,FLAG=VALUE]",
        help=f"recipe variants to compare, at least two (default: {' '.join(DEFAULT_VARIANTS)})",
    )
    p.add_argument("--seeds", type=int, default=None, help="seeds per variant (default 2, with --quick 1)")
    p.add_argument("--quick", action="store_true", help="CI size: smaller budget, one seed, one overlap layer")
    p.add_argument("--preset", default="llama3-8b", help="shape preset for the overlap step (list_shape_presets)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree of the overlap step")
    p.add_argument("--no-overlap", action="store_true", help="skip the overlap step")
    p.add_argument("--no-followup", action="store_true", help="no follow-up round (the whole budget goes to round 1)")
    p.add_argument(
        "--followup-threshold",
        type=float,
        default=0.02,
        help="check_extrapolation's mean |error| (pass rate) above which the follow-up round runs",
    )
    p.add_argument("--level", type=float, default=0.95, help="bootstrap agreement needed to call a variant ahead")
    p.add_argument("--bootstrap", type=int, default=None, help="bootstrap resamples per fit (default 200, quick 100)")
    return p


def config_from(args: argparse.Namespace) -> StudyConfig:
    from servers.loop.runner import max_runs_per_sweep

    name = args.name or ("quick" if args.quick else "default")
    variants = [parse_variant(v) for v in (args.variants or DEFAULT_VARIANTS)]
    return StudyConfig(
        name=name,
        out=args.out or Path("studies") / name,
        variants=variants,
        seeds=args.seeds if args.seeds is not None else DEFAULT_SEEDS[args.quick],
        budget=args.budget if args.budget is not None else DEFAULT_BUDGET[args.quick],
        budget_unit=args.budget_unit,
        backend=args.backend,
        quick=args.quick,
        preset=args.preset,
        tp=args.tp,
        overlap=not args.no_overlap,
        overlap_layers=["attn_out"] if args.quick else None,
        overlap_iters=5 if args.quick else 10,
        followup=not args.no_followup,
        followup_threshold=args.followup_threshold,
        level=args.level,
        bootstrap=args.bootstrap if args.bootstrap is not None else (100 if args.quick else 200),
        evals=40 if args.quick else 60,
        max_runs_per_sweep=max_runs_per_sweep(),
    )


def main(argv: list[str] | None = None) -> int:
    import anyio

    from servers.loop.runner import run_study

    args = build_parser().parse_args(argv)
    try:
        cfg = config_from(args)
        cfg.validate()
    except StudyError as exc:
        print(f"experiment_loop: {exc}", file=sys.stderr)
        return 2
    print(f"study {cfg.name}: report in {cfg.out.resolve()}", flush=True)
    try:
        data = anyio.run(run_study, cfg)
    except StudyError as exc:
        print(f"experiment_loop: {exc}", file=sys.stderr)
        return 2
    decision = (data.get("scaling") or {}).get("decision")
    print(f"\n== decision: {decision['text'] if decision else 'none (see the errors in the report)'}")
    errors = data.get("errors") or []
    if errors:
        print(f"   {len(errors)} error(s) recorded in the report")
    for name in ("report.html", "report.md", "study.json"):
        print(f"   {(cfg.out / name).resolve()}")
    return 0 if decision is not None else 1


if __name__ == "__main__":
    sys.exit(main())
