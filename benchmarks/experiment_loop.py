"""The experiment loop as a study: does the adaptive ladder reach the decision an exhaustive study reaches, with how
much of its compute, how good are the forecasts it stops on, how long does it take, and what does the loop add.

    python benchmarks/experiment_loop.py                      # 10 seeded pairs, then the default and --quick timings
    python benchmarks/experiment_loop.py --pairs 3 --no-timing
    python benchmarks/experiment_loop.py --only-timing

Every study runs as the README runs it (examples/experiment_loop.py in a subprocess, the suite over stdio).

Agreement: N seeded studies of the default four variants (two seeds each, --quick's evaluations and resamples),
each run twice on one state directory: adaptive (the default) and --exhaustive (every variant straight to the
target, judged there once). The pilot is the same job for both (same spec, same idempotency key), so it runs once.
A pair reaches the same decision when the adaptive study's pick is one the exhaustive study leaves standing (its
leader, or a tie within the margin), or when neither decides; also counted, stricter: both leave exactly the same
variants standing.
Compute: the ladder's compute (each run's largest compute; a continued run counts from its checkpoint) over the
exhaustive study's; the pilot is reported apart (both studies share it). Forecasts: each variant the adaptive
study stopped, its forecast at the target (at the round that stopped it) against what the exhaustive study
measured there (the evaluation at the target): |error|, and whether the 95% interval of the curve and the
prediction interval hold it.

Timing: the default study (two seeds) and --quick from a fresh state directory: wall time, and the loop's overhead
over its jobs (wall time less the time during which at least one job ran; target < 10%).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOOP = REPO / "examples" / "experiment_loop.py"
sys.path.insert(0, str(REPO))

from servers.loop.study import acceptable  # noqa: E402 (after the path above)


def ts(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


def union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def run_study(home: Path, out: Path, *args: str) -> tuple[dict[str, Any], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_INFRA_MCP_")}
    env["LLM_INFRA_MCP_HOME"] = str(home)
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(LOOP), "--out", str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    wall = time.monotonic() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"study {out} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads((out / "study.json").read_text()), wall


def pair(folder: Path, index: int, seed: int, seeds: int) -> dict[str, Any]:
    home = folder / f"state-{index}"
    name = f"pair{index}"
    common = ("--quick", "--no-overlap", "--seeds", str(seeds), "--seed", str(seed), "--name", name)
    adaptive, wall_a = run_study(home, folder / f"adaptive-{index}", *common)
    exhaustive, wall_e = run_study(home, folder / f"exhaustive-{index}", *common, "--exhaustive")
    a, e = adaptive["scaling"], exhaustive["scaling"]
    measured = e.get("measured_at_target") or {}
    stops = []
    for variant, stop in (a.get("stops") or {}).items():
        truth = measured.get(variant)
        f = stop["forecast"]
        if truth is None:
            continue
        stops.append(
            {
                "variant": variant,
                "round": stop["round"],
                "kind": stop.get("kind"),
                "forecast": f["value"],
                "measured": truth,
                "error": f["value"] - truth,
                "inside_ci": f["ci_low"] <= truth <= f["ci_high"],
                "inside_pi": None
                if f.get("pi_low") is None or f.get("pi_high") is None
                else f["pi_low"] <= truth <= f["pi_high"],
            }
        )
    # The same decision: the adaptive study's pick is one the exhaustive study leaves standing (its leader or a
    # tie within the margin), or neither decides. Stricter: both leave exactly the same variants standing.
    chosen = (a.get("decision") or {}).get("variant")
    standing = acceptable(e.get("decision"))
    same = chosen in standing if chosen is not None else not standing
    return {
        "index": index,
        "seed": seed,
        "same_set": acceptable(a.get("decision")) == standing,
        "chosen": chosen,
        "adaptive": sorted(acceptable(a.get("decision"))),
        "exhaustive": sorted(acceptable(e.get("decision"))),
        "agree": same,
        "adaptive_kind": (a.get("decision") or {}).get("kind"),
        "exhaustive_kind": (e.get("decision") or {}).get("kind"),
        "rounds": len(a.get("ladder") or []),
        "end": (a.get("end") or {}).get("why"),
        "compute_adaptive": a["spent"]["compute"],
        "compute_exhaustive": e["spent"]["compute"],
        "pilot": a["spent"]["pilot"],
        "stops": stops,
        "wall_s": {"adaptive": wall_a, "exhaustive": wall_e},
        "errors": len(adaptive.get("errors") or []) + len(exhaustive.get("errors") or []),
    }


def timing(folder: Path, mode: str) -> dict[str, Any]:
    sub = folder / f"timing-{mode}"
    study, wall = run_study(sub / "state", sub / "out", *(["--quick"] if mode == "quick" else []))
    jobs = study["jobs"]
    spans = [(ts(j["started_at"]), ts(j["ended_at"])) for j in jobs if j.get("started_at") and j.get("ended_at")]
    busy = union([(a, b) for a, b in spans if a is not None and b is not None])
    scaling = study.get("scaling") or {}
    return {
        "mode": mode,
        "wall_s": wall,
        "jobs": len(jobs),
        "busy_s": busy,
        "overhead_share": (wall - busy) / busy if busy else None,
        "share_of_exhaustive": (scaling.get("spent") or {}).get("share"),
        "decision": (scaling.get("decision") or {}).get("text"),
        "folder": str(sub),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=10, help="seeded adaptive/exhaustive pairs (default 10)")
    p.add_argument("--only-pairs", type=int, nargs="+", default=None, help="run only these pair indices")
    p.add_argument("--seeds", type=int, default=2, help="seeds per variant in each pair's studies (default 2)")
    p.add_argument("--no-timing", action="store_true", help="skip the default and --quick timings")
    p.add_argument("--only-timing", action="store_true", help="only the default and --quick timings")
    p.add_argument("--keep", type=Path, default=None, help="make the study folders under this folder")
    p.add_argument("--json", type=Path, default=None, help="write every figure here too")
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="loop-bench-", dir=args.keep))
    print(f"studies under {folder}")
    out: dict[str, Any] = {}
    if not args.only_timing:
        pairs = []
        for i in args.only_pairs if args.only_pairs is not None else range(args.pairs):
            r = pair(folder, i, seed=100 * i, seeds=args.seeds)
            pairs.append(r)
            print(
                f"pair {i} (seed {r['seed']}): adaptive {r['adaptive'] or 'none'} ({r['adaptive_kind']}, "
                f"{r['rounds']} round(s), {r['end']}) vs exhaustive {r['exhaustive'] or 'none'} "
                f"({r['exhaustive_kind']}): {'agree' if r['agree'] else 'DISAGREE'}; compute "
                f"{r['compute_adaptive'] / r['compute_exhaustive']:.0%} of exhaustive; "
                f"{r['wall_s']['adaptive']:.0f} s vs {r['wall_s']['exhaustive']:.0f} s",
                flush=True,
            )
        agree = sum(r["agree"] for r in pairs)
        same_set = sum(r["same_set"] for r in pairs)
        ratio = sum(r["compute_adaptive"] for r in pairs) / sum(r["compute_exhaustive"] for r in pairs)
        per_pair = [r["compute_adaptive"] / r["compute_exhaustive"] for r in pairs]
        stops = [s for r in pairs for s in r["stops"]]
        print(f"\nagreement: {agree}/{len(pairs)} pairs reach the same decision (target >= 9 of 10)")
        print(f"stricter: both leave exactly the same variants standing (leader and ties) in {same_set}/{len(pairs)}")
        print(
            f"compute: adaptive {ratio:.0%} of exhaustive over all pairs (per pair median "
            f"{statistics.median(per_pair):.0%}, max {max(per_pair):.0%}; target <= 50%); the shared pilot is "
            f"{sum(r['pilot'] for r in pairs) / sum(r['compute_exhaustive'] for r in pairs):.0%} more"
        )
        if stops:
            errors = [abs(s["error"]) for s in stops]
            ci = sum(s["inside_ci"] for s in stops)
            pi = [s["inside_pi"] for s in stops if s["inside_pi"] is not None]
            print(
                f"stops: {len(stops)} variants stopped, forecast at the target vs what the exhaustive run measured "
                f"there: median |error| {statistics.median(errors):.3f}, max {max(errors):.3f}; inside the 95% curve "
                f"interval {ci}/{len(stops)}, inside the 95% prediction interval {sum(pi)}/{len(pi)}"
            )
        out["pairs"] = pairs
        out["summary"] = {
            "agree": agree,
            "same_set": same_set,
            "pairs": len(pairs),
            "compute_ratio": ratio,
            "stops": len(stops),
        }
    if not args.no_timing:
        out["timing"] = []
        for mode in ("default", "quick"):
            t = timing(folder, mode)
            out["timing"].append(t)
            print(
                f"\n{mode} study: wall {t['wall_s']:.0f} s, {t['jobs']} jobs, jobs running {t['busy_s']:.0f} s, loop "
                f"overhead {t['overhead_share']:.0%} over its jobs (target < 10%); ladder compute "
                f"{t['share_of_exhaustive']:.0%} of exhaustive\n   {t['decision']}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
