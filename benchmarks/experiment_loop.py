"""How long the experiment loop takes, where the time goes, and how well its fits predict held-out compute.

    python benchmarks/experiment_loop.py              # the default study, then --quick (about 2-3 minutes on 2 cores)
    python benchmarks/experiment_loop.py --only quick

Each study runs as the README runs it (examples/experiment_loop.py in a subprocess, the suite over stdio), with a
fresh state directory, so every job really runs. From study.json:
- wall: the whole command (interpreter start, the server, the study, the report);
- jobs: the time during which at least one of the study's jobs ran (the union of their started..ended intervals,
  as get_job reports them);
- loop + server: wall - jobs, i.e. what the loop and the suite add to the jobs' own time (target: under 10%), split
  into the job engine's start-up latency (created..started), the tool calls made while no job ran (fits, plots,
  comparisons...), and the rest (process start, report writing);
- the held-out error of the fits: each run's first-half fit predicting its second half (mean and max |error| of
  the pass rate), and check_extrapolation's scalerl mean |error| per variant.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOOP = REPO / "examples" / "experiment_loop.py"


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


def inside(t: float, intervals: list[tuple[float, float]]) -> bool:
    return any(a <= t <= b for a, b in intervals)


def measure(mode: str, keep: Path | None) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"loop-bench-{mode}-", dir=keep))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_INFRA_MCP_")}
    env["LLM_INFRA_MCP_HOME"] = str(folder / "state")
    args = [sys.executable, str(LOOP), "--out", str(folder / "out")] + (["--quick"] if mode == "quick" else [])
    t0 = time.monotonic()
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{mode} study failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    study = json.loads((folder / "out" / "study.json").read_text())
    jobs = study["jobs"]
    spans = [(ts(j["started_at"]), ts(j["ended_at"])) for j in jobs if j.get("started_at") and j.get("ended_at")]
    spans = [(a, b) for a, b in spans if a is not None and b is not None]
    busy = union(spans)
    latency = sum(
        ts(j["started_at"]) - ts(j["created_at"]) for j in jobs if j.get("started_at") and j.get("created_at")
    )
    # tool calls (not waits) whose middle falls while no job ran: the loop's own analysis through the server
    calls = [c for c in study["calls"] if c["tool"] != "wait_for_job"]
    idle_calls = sum(c["duration_s"] for c in calls if not inside(c["started_at"] + c["duration_s"] / 2, spans))
    scaling = study.get("scaling") or {}
    held = [h["summary"] for h in scaling.get("held_out") or [] if h.get("summary")]
    checks = {}
    for rnd in scaling.get("rounds") or []:
        for name, v in (rnd.get("variants") or {}).items():
            scalerl = next((m for m in (v.get("check") or {}).get("models") or [] if m["model"] == "scalerl"), None)
            if scalerl:
                checks[f"{name} (round {rnd['round']})"] = scalerl["mean_abs_error"]
    return {
        "mode": mode,
        "wall_s": wall,
        "study_wall_s": study["timing"]["wall_s"],
        "jobs": len(jobs),
        "jobs_busy_s": busy,
        "overhead_s": wall - busy,
        "engine_latency_s": latency,
        "idle_tool_calls_s": idle_calls,
        "tool_calls": len(study["calls"]),
        "held_out_runs": len(held),
        "held_out_points": sum(h["points"] for h in held),
        "held_out_mean_abs_error": sum(h["mean_abs_error"] * h["points"] for h in held)
        / max(1, sum(h["points"] for h in held)),
        "held_out_max_abs_error": max((h["max_abs_error"] for h in held), default=None),
        "inside_pi": f"{sum(h['inside_pi'] or 0 for h in held)}/{sum(h.get('judged') or 0 for h in held)}",
        "extrapolation_scalerl_mae": checks,
        "followup": (scaling.get("followup") or {}).get("needed"),
        "decision": (scaling.get("decision") or {}).get("text"),
        "folder": str(folder),
    }


def show(r: dict[str, Any]) -> None:
    busy, over = r["jobs_busy_s"], r["overhead_s"]
    print(f"\n== {r['mode']} study ({r['folder']})")
    print(
        f"wall {r['wall_s']:.1f} s (the study itself {r['study_wall_s']:.1f} s); {r['jobs']} jobs, "
        f"{r['tool_calls']} tool calls"
    )
    print(f"jobs running {busy:.1f} s = {100 * busy / r['wall_s']:.1f}% of the wall time")
    print(
        f"loop + server {over:.1f} s = {100 * over / busy:.1f}% on top of the jobs' own time (target < 10%): engine "
        f"start-up latency {r['engine_latency_s']:.1f} s (summed over jobs), tool calls while no job ran "
        f"{r['idle_tool_calls_s']:.1f} s, the rest (interpreter, server start, waits' polling, report) "
        f"{over - r['idle_tool_calls_s']:.1f} s"
    )
    print(
        f"held-out prediction ({r['held_out_runs']} runs, {r['held_out_points']} points beyond half of each run's "
        f"compute): mean |error| {r['held_out_mean_abs_error']:.4f}, max {r['held_out_max_abs_error']:.4f} pass rate; "
        f"inside the 95% prediction interval {r['inside_pi']}"
    )
    for name, err in r["extrapolation_scalerl_mae"].items():
        print(f"check_extrapolation scalerl mean |error|, {name}: {err:.4f}")
    print(f"follow-up round: {'run' if r['followup'] else 'not run'}; decision: {r['decision']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["default", "quick"], default=None)
    p.add_argument("--keep", type=Path, default=None, help="make the study folders under this folder")
    args = p.parse_args()
    modes = [args.only] if args.only else ["default", "quick"]
    results = [measure(m, args.keep) for m in modes]
    for r in results:
        show(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
