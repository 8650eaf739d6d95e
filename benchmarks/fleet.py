"""Fleet-health benchmarks on simulated fleets, one section per question (run one with --section, or all).

Section ``localization`` (network fault localization, servers/diagnostics/netloc.py on servers/diagnostics/netsim.py):
for each fleet size (--sizes, default 64, 512, 4,096, 16,384 nodes of 8 NICs: rail-optimised, 32 nodes per leaf,
one spine plane), the skeleton plan is made once (its probe count against full mesh and rail is reported, with its
coverage); then for every fault kind (--kinds; default the issue's seven: nic_down, nic_lossy 5%, nic_slow 3x,
node_down, leaf_down, link_lossy 5%, spine_slow 3x) and --counts simultaneous faults of that kind (default 1, 2 and
3; a count the fleet has too few disjoint components for is skipped and said), --trials trials (default 50): faults
on disjoint components drawn at random, the plan's pairs probed for --rounds rounds (default 2) with 3% probe noise
and 2% missing probes, and localize_network_fault run on the rows. Also --trials trials with no fault and with
three faults of three different kinds ("mixed"). Precision and recall are over faulty components (a suspect counts
when its kind and name equal an injected fault's; pooled over trials); "exact" is the share of trials whose faulty
set equals the truth; time is the wall time of one localize_network_fault call (validation of the rows included,
simulation not); peak RSS is the process's, fleet and simulation included. --routes ecmp runs the same without the
pinned spines and without spines in the rows (ECMP-ambiguous paths) and adds group precision and recall: an ECMP
group (a suspect and its ambiguous_with, which the rows cannot tell apart) counts as one component. Goal at every
size from 4,096 nodes: P and R >= 0.97 (with --routes ecmp, group P and R) and under 10 s per localization; the
issue's scale case is ``--sizes 16384 --routes ecmp --counts 1,2,3,4,5``.

Section ``stragglers`` (detect_stragglers on simulated step times; the code is benchmarks/stragglers.py, which also
runs alone): detection rate and false positives for 1% slow ranks with 10-50% slowdowns in 2% and 5% noise, per fleet
size; --quick-stragglers for 64 and 512 ranks only.

Run from the repository root:
  python benchmarks/fleet.py [--section localization] [--sizes 64,512,4096,16384] [--trials 50] [--rounds 2]
                             [--kinds nic_down,leaf_down] [--counts 1,2,3] [--routes recorded|ecmp] [--seed 0]
                             [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.core.errors import InputError
from servers.diagnostics.netloc import localize_network_fault, plan_network_probes, plan_pairs
from servers.diagnostics.netsim import build_fleet, make_scenario

# ==== section: localization =========================================================================================

ISSUE_KINDS = ("nic_down", "nic_lossy", "nic_slow", "node_down", "leaf_down", "link_lossy", "spine_slow")
GOAL_SIZE = 4096  # the goal holds at every size from this one up (the issue asks 16,384 x 8 NICs, routes unknown)
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
    group_tp: int = 0  # named suspects whose ECMP group (the suspect and its ambiguous_with) holds a true fault
    named: int = 0
    seconds: list[float] = field(default_factory=list)
    sim_seconds: list[float] = field(default_factory=list)
    probes: list[int] = field(default_factory=list)
    false_kinds: dict[str, int] = field(default_factory=dict)

    def add(self, other: Cell) -> None:
        for name in ("trials", "tp", "fp", "fn", "exact", "group_hits", "group_tp", "named"):
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

    @property
    def group_precision(self) -> float:
        return self.group_tp / self.named if self.named else 1.0

    @property
    def group_recall(self) -> float:
        return self.group_hits / (self.tp + self.fn) if self.tp + self.fn else 1.0


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


def _peak_rss_mib() -> float:
    """This process's peak resident memory so far (fleet, plan, simulation and localization together)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    truth_names = {name for _, name in scenario.truth}
    cell.group_hits = sum(1 for name in truth_names if any(name in g for g in groups))
    cell.named = len(named)
    cell.group_tp = sum(1 for g in groups if g & truth_names)
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
        configs += [(f"{kind} x{count}", {kind: count}) for kind in kinds for count in args.counts]
        configs.append(("mixed x3", None))
        skipped: list[str] = []
        for label, faults in configs:
            cell = Cell()
            try:
                for _ in range(args.trials):
                    seed = rng.randrange(2**31)
                    chosen = faults if faults is not None else random.Random(seed).sample(kinds, min(3, len(kinds)))
                    cell.add(_trial(fleet, pairs, chosen, seed, args))
            except InputError:  # more faults of a kind than this fleet has disjoint components for
                skipped.append(label)
                continue
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
        if skipped:
            lines.append(f"Not run (too few disjoint components at this size): {', '.join(skipped)}.\n")
        ecmp = args.routes == "ecmp"
        group_col = " group P | group R |" if ecmp else ""
        lines.append(f"| faults | trials | P | R | exact |{group_col} false positives | t mean s | t p95 s | t max s |")
        lines.append("|---|---:|---:|---:|---:|" + ("---:|---:|" if ecmp else "") + "---|---:|---:|---:|")
        by_kind: dict[str, Cell] = {}
        for label, cell in cells.items():
            by_kind.setdefault(label.split(" x")[0], Cell()).add(cell)
        for label, cell in [*cells.items(), *((f"all {k}", c) for k, c in by_kind.items() if k in kinds)]:
            if label.startswith("all ") or args.detail or label in ("none", "mixed x3"):
                injected = cell.tp + cell.fn > 0
                group = ""
                if ecmp:
                    group = f" {cell.group_precision:.3f} | {cell.group_recall:.3f} |" if injected else " - | - |"
                fps = ", ".join(f"{k} {v}" for k, v in sorted(cell.false_kinds.items())) or "0"
                p_text = f"{cell.precision:.3f}" if injected else "-"
                r_text = f"{cell.recall:.3f}" if injected else "-"
                lines.append(
                    f"| {label} | {cell.trials} | {p_text} | {r_text} | "
                    f"{cell.exact / cell.trials:.3f} |{group} {fps} | {statistics.mean(cell.seconds):.3f} | "
                    f"{_p95(cell.seconds):.3f} | {max(cell.seconds):.3f} |"
                )
        peak_mib = _peak_rss_mib()
        # Under ECMP a spine's or link's name cannot be told from its alternatives' without routes: the goal is on
        # the group figures there (the suspect and its ambiguous_with counted as one component).
        goal_p = total.group_precision if ecmp else total.precision
        goal_r = total.group_recall if ecmp else total.recall
        summary_rows.append(
            f"| {size:,} | {total.trials} | {total.precision:.4f} | {total.recall:.4f} | "
            + (f"{total.group_precision:.4f} | {total.group_recall:.4f} | " if ecmp else "")
            + f"{total.exact / total.trials:.3f} | {statistics.mean(total.seconds):.2f} | {_p95(total.seconds):.2f} | "
            f"{max(total.seconds):.2f} | {statistics.mean(total.sim_seconds):.2f} | {peak_mib:,.0f} |"
        )
        raw["sizes"][str(size)]["total"] = {
            "precision": total.precision,
            "recall": total.recall,
            "group_precision": total.group_precision,
            "group_recall": total.group_recall,
            "max_seconds": max(total.seconds),
            "peak_rss_mib": peak_mib,
        }
        if size >= GOAL_SIZE:
            ok = goal_p >= GOAL_P and goal_r >= GOAL_R and max(total.seconds) < GOAL_SECONDS
            raw.setdefault("goal", {"sizes": [], "met": True})
            raw["goal"]["sizes"].append(size)
            raw["goal"]["met"] &= ok
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
        "| nodes | trials | precision | recall | "
        + ("group P | group R | " if args.routes == "ecmp" else "")
        + "exact | t mean s | t p95 s | t max s | sim s | peak RSS MiB |",
        "|---:|---:|---:|---:|" + ("---:|---:|" if args.routes == "ecmp" else "") + "---:|---:|---:|---:|---:|---:|",
        *summary_rows,
    ]
    if "goal" in raw:
        which = "group P and R (ECMP groups as one component)" if args.routes == "ecmp" else "P and R"
        head.append(
            f"\nGoal at {', '.join(f'{n:,}' for n in raw['goal']['sizes'])} nodes ({which} >= {GOAL_P}, "
            f"< {GOAL_SECONDS:.0f} s per localization): " + ("MET" if raw["goal"]["met"] else "NOT MET")
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
    parser.add_argument("--counts", default="1,2,3", help="simultaneous faults of one kind, comma-separated")
    parser.add_argument("--kinds", default=",".join(ISSUE_KINDS), help="fault kinds, comma-separated")
    parser.add_argument("--routes", choices=["recorded", "ecmp"], default="recorded")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--detail", action="store_true", help="a row per (kind, count), not only per kind")
    parser.add_argument("--verbose", action="store_true", help="progress on stderr")
    parser.add_argument("--json", type=Path, help="write the raw counts here")
    parser.add_argument("--quick-stragglers", action="store_true", help="stragglers: 64 and 512 ranks only")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.counts = [int(c) for c in args.counts.split(",") if c]
    if args.trials < 1 or args.rounds < 1 or not args.counts or min(args.counts) < 1:
        parser.error("--trials, --rounds and every --counts value must be at least 1")
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
