"""The experiment loop's command line (examples/experiment_loop.py; `llm-infra-mcp loop` where the CLI offers it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servers.loop.study import StudyConfig, StudyError, parse_variant

# Learning rate and group size: two variants that rise early and two that rise late, so that stopping the ones
# that cannot catch up has something to save.
DEFAULT_VARIANTS = ["lr=0.02", "lr=0.005", "group-size=4", "lr=0.005,group-size=4"]
DEFAULT_SEEDS = {False: 2, True: 1}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="experiment_loop",
        description=(
            "Run an experiment study end to end over the suite's tools (stdio, like any MCP client): node check, "
            "overlap (where GPUs are), an adaptive RL scaling study of tiny-grpo variants (a pilot, then rounds "
            "that double the compute per run and stop the variants whose forecast at the target cannot catch the "
            "leader's), a decision, and a report with pictures."
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
        help="a cap on the RL study's compute in --budget-unit, pilot included (default: none; the ladder stops "
        "where its rule says, at most every variant x seed at the target)",
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
        help=f"recipe variants to compare, 2 to 8 (default: {' '.join(DEFAULT_VARIANTS)})",
    )
    p.add_argument("--seeds", type=int, default=None, help="seeds per variant (default 2, with --quick 1)")
    p.add_argument("--seed", type=int, default=0, help="the first run seed (runs use SEED, SEED+1, ...)")
    p.add_argument("--quick", action="store_true", help="CI size: one seed, fewer evaluations and resamples")
    p.add_argument(
        "--exhaustive",
        action="store_true",
        help="run every variant x seed straight to the target (what the adaptive ladder saves is measured against it)",
    )
    p.add_argument("--rungs", type=int, default=3, help="rounds of the ladder, each doubling the compute per run")
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        help="pass-rate difference at the target that does not matter (default: twice the standard error of one "
        "evaluation, about 0.031 on the 1024 held-out prompts)",
    )
    p.add_argument("--preset", default="llama3-8b", help="shape preset for the overlap step (list_shape_presets)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree of the overlap step")
    overlap = p.add_mutually_exclusive_group()
    overlap.add_argument("--overlap", action="store_true", help="measure overlap even on CPU (skipped there otherwise)")
    overlap.add_argument("--no-overlap", action="store_true", help="skip the overlap step, GPUs or not")
    p.add_argument("--level", type=float, default=0.95, help="interval level of the forecasts and comparisons")
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
        budget=args.budget,
        budget_unit=args.budget_unit,
        backend=args.backend,
        quick=args.quick,
        preset=args.preset,
        tp=args.tp,
        overlap="on" if args.overlap else "off" if args.no_overlap else "auto",
        overlap_layers=["attn_out"] if args.quick else None,
        overlap_iters=5 if args.quick else 10,
        exhaustive=args.exhaustive,
        rungs=args.rungs,
        margin=args.margin,
        seed=args.seed,
        level=args.level,
        bootstrap=args.bootstrap if args.bootstrap is not None else (100 if args.quick else 200),
        evals=30 if args.quick else 40,
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
