"""Fleet-health benchmarks on simulated fleets, one section per question (run one with --section, or all).

Section ``localization`` (network fault localization, servers/diagnostics/netloc.py on servers/diagnostics/netsim.py):
for each fleet size (--sizes, default 64, 512, 4,096, 16,384 nodes of 8 NICs: rail-optimised, 32 nodes per leaf,
one spine plane), the skeleton plan is made once (its probe count against full mesh and rail is reported, with its
coverage); then for every fault kind (--kinds; default the issue's seven: nic_down, nic_lossy 5%, nic_slow 3x,
node_down, leaf_down, link_lossy 5%, spine_slow 3x) and 1, 2 and 3 simultaneous faults of that kind, --trials trials
(default 50): faults on disjoint components drawn at random, the plan's pairs probed for --rounds rounds (default
2) with 3% probe noise and 2% missing probes, and localize_network_fault run on the rows. Also --trials trials with
no fault and with three faults of three different kinds ("mixed"). Precision and recall are over faulty
components (a suspect counts when its kind and name equal an injected fault's; pooled over trials); "exact" is the
share of trials whose faulty set equals the truth; time is the wall time of one localize_network_fault call
(validation of the rows included, simulation not). Goal: P >= 0.97 and R >= 0.97 at 4,096 nodes, under 10 s per
localization. --routes ecmp runs the same without the pinned spines and without spines in the rows (ECMP-ambiguous
paths) and adds "group recall": the true spine or link is the suspect or among its ambiguous_with.

Section ``stragglers`` (detect_stragglers on simulated step times; the code is benchmarks/stragglers.py, which also
runs alone): detection rate and false positives for 1% slow ranks with 10-50% slowdowns in 2% and 5% noise, per fleet
size; --quick-stragglers for 64 and 512 ranks only.

Run from the repository root:
  python benchmarks/fleet.py [--section localization] [--sizes 64,512,4096,16384] [--trials 50] [--rounds 2]
                             [--kinds nic_down,leaf_down] [--routes recorded|ecmp] [--seed 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.diagnostics.netloc import localize_network_fault, plan_network_probes, plan_pairs
from servers.diagnostics.netsim import build_fleet, make_scenario

# ==== section: localization =========================================================================================

ISSUE_KINDS = ("nic_down", "nic_lossy", "nic_slow", "node_down", "leaf_down", "link_lossy", "spine_slow")
GOAL_SIZE = 4096
GOAL_P = GOAL_R = 0.97
GOAL_SECONDS = 10.0


@dataclass
class Cell:
    """Pooled counts of one (size, kind, faults) configuration."""

    trials: int = 0
    tp: int = 0
    fp: int = 0
    fn: int = 0
    exact: int = 0
    group_hits: int = 0
    seconds: list[float] = field(default_factory=list)
    sim_seconds: list[float] = field(default_factory=list)
    probes: list[int] = field(default_factory=list)
    false_kinds: dict[str, int] = field(default_factory=dict)

    def add(self, other: Cell) -> None:
        for name in ("trials", "tp", "fp", "fn", "exact", "group_hits"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.seconds += other.seconds
        self.sim_seconds += other.sim_seconds
        self.probes += other.probes
        for k, v in other.false_kinds.items():
            self.false_kinds[k] = self.false_kinds.get(k, 0) + v

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


def _trial(fleet: Any, pairs: Any, faults: Any, seed: int, args: argparse.Namespace) -> Cell:
    t0 = time.perf_counter()
    scenario = make_scenario(
        fleet.nodes,
        faults,
        seed=seed,
        fleet=fleet,
        pairs=pairs,
        rounds=args.rounds,
        record_route=args.routes == "recorded",
    )
    t1 = time.perf_counter()
    result = localize_network_fault(fleet.topology, scenario.probes)
    t2 = time.perf_counter()
    named = [s for s in result.suspects if s.faulty]
    got = {(s.kind, s.name) for s in named}
    cell = Cell(trials=1, seconds=[t2 - t1], sim_seconds=[t1 - t0], probes=[len(scenario.probes)])
    cell.tp = len(got & scenario.truth)
    cell.fp = len(got - scenario.truth)
    cell.fn = len(scenario.truth - got)
    cell.exact = int(got == scenario.truth)
    for kind, _ in got - scenario.truth:
        cell.false_kinds[kind] = cell.false_kinds.get(kind, 0) + 1
    groups = [{s.name, *s.ambiguous_with} for s in named]
    cell.group_hits = sum(1 for _, name in scenario.truth if any(name in g for g in groups))
    return cell


def run_localization(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    kinds = [k for k in args.kinds.split(",") if k]
    lines: list[str] = []
    raw: dict[str, Any] = {"sizes": {}}
    plan_rows = []
    summary_rows = []
    for size in args.sizes:
        t0 = time.perf_counter()
        fleet = build_fleet(size)
        plan = plan_network_probes(fleet.topology, "skeleton", limit=0)
        pairs = plan_pairs(fleet.topology)
        if args.routes == "ecmp":
            pairs = [(a, b, None) for a, b, _ in pairs]
        plan_s = time.perf_counter() - t0
        cov = plan.coverage
        plan_rows.append(
            f"| {size:,} | {fleet.nodes * fleet.nics_per_node:,} | {fleet.n_leaves:,} | {len(fleet.spine_names)} | "
            f"{plan.count:,} | {plan.rail_count:,} | {plan.full_mesh_count:,} | {plan.ratio_to_full_mesh:.2e} | "
            f"{'yes' if cov.complete else 'NO'} | {plan.probes_per_nic.min if plan.probes_per_nic else '-'} | "
            f"{plan_s:.1f} |"
        )
        cells: dict[str, Cell] = {}
        rng = random.Random(args.seed * 1_000_003 + size)
        configs: list[tuple[str, Any]] = [("none", {})]
        configs += [(f"{kind} x{count}", {kind: count}) for kind in kinds for count in (1, 2, 3)]
        configs.append(("mixed x3", None))
        for label, faults in configs:
            cell = Cell()
            for _ in range(args.trials):
                seed = rng.randrange(2**31)
                chosen = faults if faults is not None else random.Random(seed).sample(kinds, min(3, len(kinds)))
                cell.add(_trial(fleet, pairs, chosen, seed, args))
            cells[label] = cell
            if args.verbose:
                print(f"  {size} {label}: P={cell.precision:.3f} R={cell.recall:.3f}", file=sys.stderr, flush=True)
        total = Cell()
        for cell in cells.values():
            total.add(cell)
        raw["sizes"][str(size)] = {
            "plan": {
                "count": plan.count,
                "rail_count": plan.rail_count,
                "full_mesh_count": plan.full_mesh_count,
                "coverage_complete": cov.complete,
            },
            "cells": {label: asdict(cell) for label, cell in cells.items()},
        }
        lines.append(
            f"\n#### {size:,} nodes ({args.trials} trials per row, {statistics.mean(total.probes):,.0f} probes)"
        )
        lines.append("")
        group_col = " group R |" if args.routes == "ecmp" else ""
        lines.append(f"| faults | trials | P | R | exact |{group_col} false positives | t mean s | t p95 s | t max s |")
        lines.append("|---|---:|---:|---:|---:|" + ("---:|" if group_col else "") + "---|---:|---:|---:|")
        by_kind: dict[str, Cell] = {}
        for label, cell in cells.items():
            by_kind.setdefault(label.split(" x")[0], Cell()).add(cell)
        for label, cell in [*cells.items(), *((f"all {k}", c) for k, c in by_kind.items() if k in kinds)]:
            if label.startswith("all ") or args.detail or label in ("none", "mixed x3"):
                group = f" {cell.group_hits / (cell.tp + cell.fn):.3f} |" if group_col and cell.tp + cell.fn else ""
                if group_col and not group:
                    group = " - |"
                fps = ", ".join(f"{k} {v}" for k, v in sorted(cell.false_kinds.items())) or "0"
                injected = cell.tp + cell.fn > 0
                p_text = f"{cell.precision:.3f}" if injected else "-"
                r_text = f"{cell.recall:.3f}" if injected else "-"
                lines.append(
                    f"| {label} | {cell.trials} | {p_text} | {r_text} | "
                    f"{cell.exact / cell.trials:.3f} |{group} {fps} | {statistics.mean(cell.seconds):.3f} | "
                    f"{_p95(cell.seconds):.3f} | {max(cell.seconds):.3f} |"
                )
        summary_rows.append(
            f"| {size:,} | {total.trials} | {total.precision:.4f} | {total.recall:.4f} | "
            f"{total.exact / total.trials:.3f} | {statistics.mean(total.seconds):.2f} | {_p95(total.seconds):.2f} | "
            f"{max(total.seconds):.2f} | {statistics.mean(total.sim_seconds):.2f} |"
        )
        raw["sizes"][str(size)]["total"] = {
            "precision": total.precision,
            "recall": total.recall,
            "max_seconds": max(total.seconds),
        }
        if size == GOAL_SIZE:
            ok = total.precision >= GOAL_P and total.recall >= GOAL_R and max(total.seconds) < GOAL_SECONDS
            raw["goal"] = {"size": size, "met": ok}
    head = [
        "### Network fault localization",
        "",
        f"routes: {args.routes}; rounds: {args.rounds}; noise 3%, missing 2%; seed {args.seed}; "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}",
        "",
        "| nodes | NICs | leaves | spines | skeleton pairs | rail pairs | full-mesh pairs | skeleton / full mesh | "
        "covers all | min probes per NIC | plan s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        *plan_rows,
        "",
        "| nodes | trials | precision | recall | exact | t mean s | t p95 s | t max s | sim s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *summary_rows,
    ]
    if "goal" in raw:
        head.append(
            f"\nGoal at {GOAL_SIZE:,} nodes (P >= {GOAL_P}, R >= {GOAL_R}, < {GOAL_SECONDS:.0f} s per localization): "
            + ("MET" if raw["goal"]["met"] else "NOT MET")
        )
    return "\n".join(head + lines), raw


# ==== section: stragglers ==========================================================================================


def run_stragglers(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_stragglers", Path(__file__).with_name("stragglers.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    print(module.HEADER, flush=True)
    results = module.run(module.QUICK_FLEETS if args.quick_stragglers else module.FLEETS, args.seed)
    found = sum(o.found for *_, o in results)
    slow = sum(o.slow for *_, o in results)
    false = sum(o.false_positives for *_, o in results)
    return f"stragglers: {found}/{slow} slow ranks found, {false} false positive(s) in all", {"found": found}


# ==== driver ========================================================================================================

SECTIONS: dict[str, Callable[[argparse.Namespace], tuple[str, dict[str, Any]]]] = {
    "localization": run_localization,
    "stragglers": run_stragglers,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", choices=[*SECTIONS, "all"], default="all")
    parser.add_argument("--sizes", default="64,512,4096,16384", help="fleet sizes in nodes, comma-separated")
    parser.add_argument("--trials", type=int, default=50, help="trials per configuration")
    parser.add_argument("--rounds", type=int, default=2, help="probing rounds per localization window")
    parser.add_argument("--kinds", default=",".join(ISSUE_KINDS), help="fault kinds, comma-separated")
    parser.add_argument("--routes", choices=["recorded", "ecmp"], default="recorded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--detail", action="store_true", help="a row per (kind, count), not only per kind")
    parser.add_argument("--verbose", action="store_true", help="progress on stderr")
    parser.add_argument("--json", type=Path, help="write the raw counts here")
    parser.add_argument("--quick-stragglers", action="store_true", help="stragglers: 64 and 512 ranks only")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.trials < 1 or args.rounds < 1:
        parser.error("--trials and --rounds must be at least 1")
    reports: dict[str, Any] = {}
    failed = False
    for name, section in SECTIONS.items():
        if args.section not in (name, "all"):
            continue
        text, raw = section(args)
        print(text, flush=True)
        reports[name] = raw
        failed |= raw.get("goal", {}).get("met") is False
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
