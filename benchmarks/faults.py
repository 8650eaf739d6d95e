"""Real faults on the testbed (servers/diagnostics/testbed.py): localization precision, recall and exact-component
accuracy, time from injection to verdict, and false alarms on clean rounds. Needs root and iproute2.

Each round: 1 to 3 faults drawn (seeded) over the six kinds, on disjoint components (no NIC of a downed node, no
link of a slowed spine, at most one downed uplink per leaf: a leaf cut off from every spine is a leaf fault, which
this testbed does not inject), injected by the kernel (links down, htb rate limits at --slow-mbit); then the plan's
pairs probed on real sockets (latency, loss, and --bytes of TCP throughput) and localize_network_fault run on the
rows with its defaults. A suspect counts when its kind and name equal an injected fault's component; precision and
recall are pooled over rounds; "exact" is the share of rounds whose faulty set equals the truth. Clean rounds inject
nothing: any faulty component is a false alarm. The time is the wall time from the injection's end to the verdict
(probing plus localization).

Stragglers (--stragglers, or --only-stragglers): real slowdowns of a real job, tiny-gpt on 2 ranks, found by
detect_stragglers (benchmarks/live_stragglers.py says how): --compute-trials ranks slowed, half of them by a CPU
quota of 1/f of a CPU (f drawn in 1.1..2.5; the slowdown measured is larger, the kernel's throttling costs), half by
a busy neighbour pinned to the rank's CPU with f - 1 times its scheduler weight (f in 2.0..3.2; measured smaller:
the scheduler credits a rank that waited), --network-trials jobs on a 2-node testbed whose node-1 NIC drops to line
rate / f (f in 1.5..8), and --clean-trials runs of each setup with nothing injected. Precision: right verdicts over
all claims; recall: right verdicts over slowdowns, also over those measured at 1.2x or more (the issue's range);
latency: steps (and seconds, live) from the injection to the first right report.

Run from the repository root, as root:
  python benchmarks/faults.py [--faulty-rounds 60] [--clean-rounds 20] [--mode full_mesh] [--bytes 524288]
                              [--slow-mbit 40] [--seed 0] [--json PATH]
                              [--stragglers | --only-stragglers] [--compute-trials 20] [--network-trials 14]
                              [--clean-trials 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servers.diagnostics import netprobe
from servers.diagnostics.netloc import localize_network_fault, plan_pairs
from servers.diagnostics.netmodels import link_name
from servers.diagnostics.slowdowns import cpu_quota_available
from servers.diagnostics.testbed import FAULT_COMPONENT, FAULT_KINDS, Testbed, available

# Published figures (their fleets were production-sized and their faults real; ours is 8 nodes, one machine).
ANCHORS = [
    ("SkeletonHunter (SIGCOMM'25), 4,816 production failures", "precision 0.982, recall 0.993, localization 0.957"),
    ("Greyhound / FALCON (ATC'25), 10k-GPU cluster", "above 0.99"),
    ("Minder (NSDI'25)", "precision 0.904, F1 0.893, 3.6 s to detect"),
]
STRAGGLER_ANCHORS = [
    ("Greyhound / FALCON (ATC'25): slow iterations", "a change point needs 10 slow iterations (its rule, used here)"),
    ("Minder (NSDI'25): faulty machines", "3.6 s to detect, precision 0.904"),
    ("Mycroft (2025): collective anomalies", "90% found in under 15 s"),
]


def straggler_trials(args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """The straggler benchmark: trials drawn (seeded), run one at a time, counted (see the module's docstring)."""
    from benchmarks.live_stragglers import Trial, run_trial

    trials = []
    for i in range(args.compute_trials):
        busy = i % 2 == 1
        factor = round(rng.uniform(2.0, 3.2) if busy else rng.uniform(1.1, 2.5), 2)
        trials.append(Trial("compute", rank=rng.randint(0, 1), factor=factor, how="busy" if busy else "quota"))
    trials += [Trial("network", factor=round(rng.uniform(1.5, 8.0), 2)) for _ in range(args.network_trials)]
    trials += [Trial("clean", network=i % 2 == 1) for i in range(args.clean_trials)]
    rng.shuffle(trials)
    outcomes = []
    work = Path(args.workdir or "/tmp/llm-infra-mcp-faults")
    with Testbed(nodes=2, rails=1, leaves_per_rail=2, spines=2) as bed:
        for k, trial in enumerate(trials):
            o = run_trial(trial, work / f"trial{k}", bed=bed)
            outcomes.append(o)
            label = f"{trial.kind} {trial.how}" if trial.kind == "compute" else trial.kind
            print(f"  trial {k:2d} {label:13s} nominal {o.nominal or '-'!s:5s} measured {o.measured or '-'!s:6s} "
                  f"found {o.found!s:5s} false alarm {o.false_alarm!s:5s} latency {o.latency_steps} steps "
                  f"({o.detect_s} s live)", flush=True)  # fmt: skip
    slow = [o for o in outcomes if o.kind != "clean"]
    clean = [o for o in outcomes if o.kind == "clean"]
    right = sum(o.found and not o.false_alarm for o in slow)
    claims = right + sum(o.false_alarm for o in outcomes)
    latencies = [o.latency_steps for o in slow if o.latency_steps is not None]
    live = [o.detect_s for o in slow if o.detect_s is not None]
    measured = [o.measured for o in slow if o.measured is not None]
    in_range = [o for o in slow if o.measured is not None and o.measured >= 1.2]
    bands: dict[str, Counter] = {}
    for o in slow:
        m = o.measured or 0.0
        band = "<1.2" if m < 1.2 else "1.2-1.5" if m < 1.5 else "1.5-2" if m < 2 else "2-3" if m < 3 else ">=3"
        c = bands.setdefault(f"{o.kind} {o.how + ' ' if o.how else ''}{band}", Counter())
        c["trials"] += 1
        c["found"] += o.found and not o.false_alarm
        if o.latency_steps is not None:
            c["latency_sum"] += o.latency_steps
    out: dict[str, Any] = {
        "slowdowns": len(slow), "clean": len(clean), "right": right,
        "precision": round(right / claims, 4) if claims else 1.0,
        "recall": round(right / len(slow), 4) if slow else 1.0,
        "slowdowns_at_least_1_2": len(in_range),
        "recall_at_least_1_2": (
            round(sum(o.found and not o.false_alarm for o in in_range) / len(in_range), 4) if in_range else None
        ),
        "false_alarms_clean": sum(o.false_alarm for o in clean),
        "false_alarms_slowed": sum(o.false_alarm for o in slow),
        "median_latency_steps": statistics.median(latencies) if latencies else None,
        "median_latency_s_live": round(statistics.median(live), 2) if live else None,
        "measured_range": [min(measured), max(measured)] if measured else None,
        "by_band": {k: dict(v) for k, v in sorted(bands.items())},
        "trials": [o.row() for o in outcomes],
    }  # fmt: skip
    print(f"stragglers: {len(slow)} real slowdowns (measured {out['measured_range']}x), {len(clean)} clean runs")
    print(f"recall over the {len(in_range)} measured at 1.2x or more: {out['recall_at_least_1_2']}")
    print(f"precision {out['precision']:.3f}  recall {out['recall']:.3f}  false alarms: {out['false_alarms_clean']} of "
          f"{len(clean)} clean runs, {out['false_alarms_slowed']} wrong claims in slowed runs")  # fmt: skip
    print(f"latency: median {out['median_latency_steps']} steps from the injection (replayed), "
          f"{out['median_latency_s_live']} s live")  # fmt: skip
    for band, c in out["by_band"].items():
        mean = c.get("latency_sum", 0) / c["found"] if c.get("found") else None
        print(
            f"  {band:22s} found {c.get('found', 0)}/{c['trials']}"
            + (f", mean latency {mean:.1f} steps" if mean else "")
        )
    print("anchors (production fleets; ours: 2 ranks on one machine, slowdowns by the kernel):")
    for who, figure in STRAGGLER_ANCHORS:
        print(f"  {who}: {figure}")
    return out


def draw_faults(bed: Testbed, rng: random.Random, n: int) -> list[tuple[str, str]]:
    """n faults (kind, target) on disjoint components, by the rules in the module's docstring."""
    picked: list[tuple[str, str]] = []
    used_nodes: set[str] = set()
    used_nics: set[str] = set()
    used_links: set[str] = set()
    down_leaves: set[str] = set()
    slow_spines: set[str] = set()
    leaves = [bed.leaf_name(x) for x in range(bed.rails * bed.leaves_per_rail)]
    spines = [bed.spine_name(s) for s in range(bed.spines)]
    for _ in range(200):
        if len(picked) == n:
            break
        kind = rng.choice(FAULT_KINDS)
        if kind in ("nic_down", "nic_slow"):
            i, r = rng.randrange(bed.nodes), rng.randrange(bed.rails)
            node, nic = bed.node_name(i), bed.nic_name(i, r)
            if node in used_nodes or nic in used_nics:
                continue
            used_nics.add(nic)
            used_nodes.add(node)  # one fault a node: a NIC fault and its node's would be one component's
            picked.append((kind, nic))
        elif kind == "node_down":
            node = bed.node_name(rng.randrange(bed.nodes))
            if node in used_nodes:
                continue
            used_nodes.add(node)
            picked.append((kind, node))
        elif kind in ("uplink_down", "link_slow"):
            leaf, spine = rng.choice(leaves), rng.choice(spines)
            link = link_name(leaf, spine)
            if link in used_links or spine in slow_spines or (kind == "uplink_down" and leaf in down_leaves):
                continue
            used_links.add(link)
            if kind == "uplink_down":
                down_leaves.add(leaf)
            picked.append((kind, link))
        else:
            spine = rng.choice(spines)
            if spine in slow_spines or any(link.endswith(f"~{spine}") for link in used_links) or slow_spines:
                continue
            slow_spines.add(spine)
            picked.append((kind, spine))
    return picked


def probe_rows(bed: Testbed, pairs: list[tuple[str, str, str | None]], settings: netprobe.ProbeSettings) -> list:
    specs = netprobe.probe_specs(bed.endpoints(), pairs)
    results = netprobe.run_probes(specs, settings, concurrency=4)
    broken = [r.error for r in results if r.error]
    if broken:
        raise RuntimeError(f"{len(broken)} probe(s) could not be set up: {broken[0]}")
    return [r.row() for r in results]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faulty-rounds", type=int, default=60)
    parser.add_argument("--clean-rounds", type=int, default=20)
    parser.add_argument("--mode", default="full_mesh", choices=["skeleton", "rail", "full_mesh"])
    parser.add_argument("--bytes", type=int, default=1 << 19, help="TCP bytes a throughput probe sends")
    parser.add_argument("--slow-mbit", type=float, default=40.0, help="a slow fault's rate (line rate 400)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--stragglers", action="store_true", help="the straggler benchmark too")
    parser.add_argument("--only-stragglers", action="store_true", help="the straggler benchmark only")
    parser.add_argument("--compute-trials", type=int, default=20)
    parser.add_argument("--network-trials", type=int, default=14)
    parser.add_argument("--clean-trials", type=int, default=20)
    parser.add_argument("--workdir", help="where the trials' jobs write (default /tmp/llm-infra-mcp-faults)")
    args = parser.parse_args(argv)
    why = available() or (cpu_quota_available() if args.stragglers or args.only_stragglers else None)
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    if args.only_stragglers:
        out = {"stragglers": straggler_trials(args, rng)}
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
        return 0
    settings = netprobe.ProbeSettings(bandwidth_bytes=args.bytes, timeout_s=0.2)
    by_kind: dict[str, Counter] = {k: Counter() for k in FAULT_KINDS}
    tp = fp = fn = exact = 0
    false_alarms = 0
    seconds: list[float] = []
    misses: list[str] = []
    with Testbed() as bed:
        topology = bed.topology()
        pairs = plan_pairs(topology, args.mode)
        print(f"testbed: {bed.nodes} nodes x {bed.rails} rails, {bed.rails * bed.leaves_per_rail} leaves, "
              f"{bed.spines} spines; {args.mode}: {len(pairs)} pairs a round; {platform.node()}")  # fmt: skip
        schedule = [0] * args.clean_rounds + [1 + i % 3 for i in range(args.faulty_rounds)]
        rng.shuffle(schedule)
        for k, n in enumerate(schedule):
            faults = draw_faults(bed, rng, n)
            for kind, target in faults:
                bed.inject(kind, target, args.slow_mbit if kind.endswith("_slow") else None)
            started = time.perf_counter()
            found = localize_network_fault(topology, probe_rows(bed, pairs, settings))
            seconds.append(time.perf_counter() - started)
            bed.clear_all()
            named = {(s.kind, s.name) for s in found.suspects if s.faulty}
            truth = {(FAULT_COMPONENT[kind], target) for kind, target in faults}
            tp += len(named & truth)
            fp += len(named - truth)
            fn += len(truth - named)
            exact += named == truth
            if not faults:
                false_alarms += bool(named)
            for kind, target in faults:
                by_kind[kind]["injected"] += 1
                by_kind[kind]["found"] += (FAULT_COMPONENT[kind], target) in named
            if named != truth:
                misses.append(f"round {k}: injected {sorted(truth)}, named {sorted(named)}")
    faulty_rounds = sum(1 for n in schedule if n)
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    out: dict[str, Any] = {
        "rounds": len(schedule), "faulty_rounds": faulty_rounds, "clean_rounds": len(schedule) - faulty_rounds,
        "faults_injected": tp + fn, "precision": round(precision, 4), "recall": round(recall, 4),
        "exact_rounds": round(exact / len(schedule), 4), "false_alarm_rounds": false_alarms,
        "median_s_to_verdict": round(statistics.median(seconds), 3), "max_s_to_verdict": round(max(seconds), 3),
        "by_kind": {k: dict(v) for k, v in by_kind.items()}, "misses": misses[:20],
        "settings": {"mode": args.mode, "bytes": args.bytes, "slow_mbit": args.slow_mbit, "seed": args.seed},
    }  # fmt: skip
    print(f"faults: {out['faults_injected']} injected in {faulty_rounds} rounds (1-3 at a time), "
          f"{out['clean_rounds']} clean rounds")  # fmt: skip
    print(f"precision {precision:.3f}  recall {recall:.3f}  exact-component rounds {out['exact_rounds']:.3f}  "
          f"false alarms {false_alarms} of {out['clean_rounds']} clean rounds")  # fmt: skip
    print(f"injection to verdict: median {out['median_s_to_verdict']} s, max {out['max_s_to_verdict']} s")
    for kind, c in by_kind.items():
        print(f"  {kind:12s} found {c['found']}/{c['injected']}")
    for line in misses[:10]:
        print(f"  miss: {line}")
    print("anchors (real production fleets; ours: 8 nodes in namespaces on one machine, faults by the kernel):")
    for who, figure in ANCHORS:
        print(f"  {who}: {figure}")
    if args.stragglers:
        out["stragglers"] = straggler_trials(args, rng)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
