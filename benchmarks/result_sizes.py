"""What an agent pays for each tool's default result (issue 22, defect 9): every tool called the way the scripted
agent's workflows call it (tests/test_agent_workflows.py, and the issue's seven: node health, a kernel log with two
Xids, two RL recipes compared, a straggler, network localization, overlap prediction, a long job), with the tool's
default options and inputs of a realistic size (a 64-node, 512-NIC fabric; 64 ranks x 200 steps; the repository's
captured nvidia-smi, kernel-log, nccl-tests, DCGM and dcgm-exporter fixtures), in-process against the suite.

Measured per call: the compact JSON (UTF-8 bytes) of the result as the client receives it, its structured content
and text blocks (what a model reads); image blocks (plot_scaling_fit's PNG) are counted apart, since a client shows
them as images, not text. Reported per tool: calls, max and median bytes (~4 bytes a token), and the largest call.
Goal: every default result at most 16 KB (16,384 B, ~4k tokens); exit status 1 when one is over it, or when a
workflow step fails.

    python benchmarks/result_sizes.py            # the instant workflows and the job workflows (a few minutes)
    python benchmarks/result_sizes.py --no-jobs  # without starting jobs (seconds; what tests/test_result_sizes.py runs)
    python benchmarks/result_sizes.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL_BYTES = 16 * 1024
FIXTURES = REPO / "tests" / "fixtures" / "diagnostics"


def compact(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


@dataclass
class Call:
    workflow: str
    tool: str
    args: str  # the arguments, shortened, to say which call it was
    bytes: int  # structured content + text blocks, compact JSON
    other_bytes: int  # image and other non-text blocks
    error: bool


def result_bytes(result: Any) -> tuple[int, int]:
    """(bytes a model reads: structured content and text blocks, compact JSON; bytes of other blocks)."""
    data = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    blocks = data.get("content", [])
    text = [b for b in blocks if b.get("type") == "text"]
    other = [b for b in blocks if b.get("type") != "text"]
    read = {k: v for k, v in data.items() if k != "content"}
    return compact({**read, "content": text}), compact(other) if other else 0


def short(args: dict[str, Any], limit: int = 90) -> str:
    parts = []
    for key, value in args.items():
        shown = json.dumps(value, separators=(",", ":"))
        parts.append(f"{key}={shown if len(shown) <= 24 else f'<{len(shown):,} B>'}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class Recorder:
    """Calls the suite's tools and records the size of each result."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.workflow = ""
        self.calls: list[Call] = []

    async def call(self, tool: str, args: dict[str, Any], *, may_fail: bool = False) -> dict[str, Any]:
        result = await self.client.call_tool(tool, args)
        read, other = result_bytes(result)
        self.calls.append(Call(self.workflow, tool, short(args), read, other, bool(result.is_error)))
        if result.is_error and not may_fail:
            text = " ".join(getattr(c, "text", "") for c in result.content)
            raise RuntimeError(f"{self.workflow}: {tool}({short(args)}) failed: {text[:500]}")
        return result.structured_content or {}

    async def finish(self, job_id: str, limit_s: float = 600) -> dict[str, Any]:
        deadline = time.monotonic() + limit_s
        while True:
            waited = await self.call("wait_for_job", {"job_id": job_id, "wait_s": 30})
            if not waited.get("timed_out") or time.monotonic() > deadline:
                return waited


# ---- inputs ----------------------------------------------------------------------------------------------------------


def fixture(*parts: str) -> str:
    return (FIXTURES.joinpath(*parts)).read_text()


def scalerl_curve(a: float, b: float, c_mid: float, seed: int, r0: float = 0.05) -> list[dict[str, Any]]:
    """A ScaleRL curve at 30 computes over two decades of GPU-hours around its midpoint, seeded scatter (sd 0.01)."""
    rng = random.Random(seed)
    points = []
    for i in range(30):
        c = c_mid * 10 ** (-1.5 + 3 * i / 29)
        value = r0 + (a - r0) / (1 + (c_mid / c) ** b) + rng.gauss(0, 0.01)
        points.append({"compute": c, "value": min(max(value, 0.0), 1.0), "run": f"s{seed}"})
    return points


def straggler_rows(ranks: int = 64, steps: int = 200, slow_rank: int = 13, since: int = 100) -> str:
    """Per-rank step times as JSON lines: 8 ranks a node, 2% jitter, one rank 1.5x slower from `since`."""
    rng = random.Random(5)
    lines = []
    for step in range(steps):
        for rank in range(ranks):
            t = 0.5 * (1 + rng.gauss(0, 0.02)) * (1.5 if rank == slow_rank and step >= since else 1.0)
            lines.append(json.dumps({"rank": rank, "step": step, "step_time_s": round(t, 5), "node": f"n{rank // 8}"}))
    return "\n".join(lines)


@contextmanager
def exporter_endpoint() -> Iterator[str]:
    """A local dcgm-exporter stand-in serving the repository's captured metrics."""
    body = (FIXTURES / "exporter" / "dcgm-exporter.4xH100.synthetic.prom").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---- the workflows ---------------------------------------------------------------------------------------------------


async def node_health(rec: Recorder, exporter_url: str) -> None:
    smi = fixture("smi", "nvidia-smi-q.8xH100.550.synthetic.txt")
    kmsg = fixture("kmsg", "dmesg-T.log")
    await rec.call("gpu_health", {})  # live NVML: "unknown" on a host without a driver
    await rec.call("gpu_health", {"text": smi})
    await rec.call("gpu_health", {"text": fixture("triage", "query-gpu.7of8xH100.synthetic.csv")})
    await rec.call("scan_kernel_log", {"text": kmsg})
    await rec.call("scan_kernel_log", {"text": fixture("triage", "dmesg-T.8xH100.synthetic.log")})  # two Xids
    await rec.call("scan_kernel_log", {"source": "dmesg"}, may_fail=True)  # needs dmesg and the right to read it
    await rec.call("explain_xid", {"code": 79})
    await rec.call("explain_xid", {"code": 48})
    await rec.call("parse_nccl_tests", {"text": fixture("nccl", "all_reduce_perf.8xH100.pass.txt")})
    await rec.call("parse_nccl_tests", {"text": fixture("triage", "all_reduce_perf.7xH100.wrong.synthetic.txt")})
    await rec.call("parse_dcgm_diag", {"text": fixture("dcgm", "dcgmi-diag-r3.dcgm4.8xH100.json")})
    await rec.call(
        "triage_node",
        {
            "nvidia_smi_text": smi,
            "kernel_log_text": kmsg,
            "nccl_tests_text": fixture("nccl", "all_reduce_perf.8xH100.pass.txt"),
            "dcgm_text": fixture("dcgm", "dcgmi-diag-r3.dcgm4.8xH100.json"),
        },
    )
    await rec.call(
        "triage_node",
        {
            "nvidia_smi_text": fixture("triage", "query-gpu.7of8xH100.synthetic.csv"),
            "kernel_log_text": fixture("triage", "dmesg-T.8xH100.synthetic.log"),
            "dcgm_text": fixture("triage", "dcgmi-diag-r2.dcgm4.7xH100.synthetic.json"),
            "nccl_tests_text": fixture("triage", "all_reduce_perf.7xH100.wrong.synthetic.txt"),
        },
    )
    await rec.call("read_dcgm_exporter", {"url": exporter_url})


async def scaling(rec: Recorder) -> None:
    fits = []
    for label, (a, b, c_mid, seed) in {"recipe-a": (0.7, 1.5, 300.0, 1), "recipe-b": (0.6, 1.8, 150.0, 2)}.items():
        data = {"points": scalerl_curve(a, b, c_mid, seed)}
        fit = await rec.call(
            "fit_scaling_law", {"model": "scalerl", "data": data, "label": label, "compute_unit": "gpu_hours"}
        )
        fits.append(fit["fit_id"])
    await rec.call("predict_scaling", {"fit_id": fits[0], "compute": [5000.0], "target": 0.5})
    await rec.call("check_extrapolation", {"data": {"points": scalerl_curve(0.7, 1.5, 300.0, 3)}})
    await rec.call("compare_scaling_fits", {"fit_ids": fits})
    await rec.call("plot_scaling_fit", {"fit_ids": fits})
    await rec.call("list_scaling_fits", {})
    await rec.call(
        "predict_scaling",
        {"model": "scalerl", "compute": [10000.0], "parameters": {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.1}},
    )
    await rec.call("predict_scaling", {"model": "chinchilla", "compute": [1e21, 1e23]})
    await rec.call("convert_compute_units", {"value": 1000.0, "unit": "gpu_hours", "gpu": "H100-SXM"})


async def straggler(rec: Recorder) -> None:
    await rec.call("detect_stragglers", {"text": straggler_rows()})


async def network(rec: Recorder) -> None:
    from servers.diagnostics.netsim import build_fleet, make_scenario

    fleet = build_fleet(64)
    await rec.call("plan_network_probes", {"topology": fleet.topology})
    await rec.call("plan_network_probes", {"topology": fleet.topology, "mode": "rail"})
    for faults, seed in (({"leaf_down": 1}, 1), ({}, 2), ({"nic_down": 3}, 3), ({"link_lossy": 1}, 4)):
        scenario = make_scenario(64, faults, seed=seed, fleet=fleet)
        await rec.call("localize_network_fault", {"topology": fleet.topology, "probes": scenario.probes})
    scenario = make_scenario(64, {"nic_down": 1}, seed=5, fleet=fleet)
    text = "\n".join(json.dumps(p) for p in scenario.probes)
    await rec.call("localize_network_fault", {"topology": fleet.topology, "text": text})


async def overlap(rec: Recorder) -> None:
    await rec.call("list_shape_presets", {})
    await rec.call(
        "predict_overlap", {"pattern": "ag_gemm", "m": 8192, "n": 4096, "k": 4096, "world_size": 8, "gpu": "H100-SXM"}
    )
    await rec.call(
        "predict_overlap", {"pattern": "gemm_rs", "m": 8192, "n": 4096, "k": 4096, "world_size": 8, "gpu": "H100-SXM"}
    )


async def long_job(rec: Recorder) -> None:
    """A training job to its end with its logs, metrics and stragglers, a sweep, a cancelled job, and the jobs of
    the fleet and overlap workflows (bandwidth check, GEMM and collective benchmarks, tuning)."""
    await rec.call("list_backends", {})
    await rec.call("list_recipes", {})
    spec = {"recipe": "tiny-gpt", "args": ["--steps", "40"], "nproc_per_node": 2, "max_wall_s": 600}
    plan = await rec.call("plan_training_job", {"spec": spec})
    started = await rec.call("submit_training_job", {"spec": spec, "plan_token": plan["plan_token"]})
    job_id = started["job_id"]
    await rec.finish(job_id)
    await rec.call("get_job", {"job_id": job_id})
    await rec.call("read_job_logs", {"job_id": job_id, "process": "rank0"})
    await rec.call("read_job_metrics", {"job_id": job_id})
    await rec.call("detect_stragglers", {"job_id": job_id})
    await rec.call("list_jobs", {})
    sweep = await rec.call(
        "plan_sweep",
        {
            "spec": {"recipe": "tiny-gpt", "args": ["--steps", "2"], "nproc_per_node": 1},
            "grid": {"--lr": ["0.01", "0.02"]},
        },
    )
    submitted = await rec.call("submit_sweep", {"sweep_token": sweep["sweep_token"]})
    await rec.call("list_jobs", {"sweep_id": submitted["sweep_id"]})
    await rec.finish(submitted["sweep_id"])
    long_spec = {"recipe": "tiny-gpt", "args": ["--steps", "100000"], "nproc_per_node": 1, "max_wall_s": 600}
    plan = await rec.call("plan_training_job", {"spec": long_spec})
    started = await rec.call("submit_training_job", {"spec": long_spec, "plan_token": plan["plan_token"]})
    await rec.call("cancel_job", {"job_id": started["job_id"]})
    await rec.finish(started["job_id"])
    checked = await rec.call("check_collective_bandwidth", {"mode": "node", "nproc_per_node": 2})
    await rec.finish(checked["job_id"])
    await rec.call("run_dcgm_diag", {}, may_fail=True)  # needs dcgmi
    for tool, args in (
        ("benchmark_gemm", {"m": 256, "n": 256, "k": 256}),
        ("benchmark_collective", {"op": "all_gather", "world_size": 2}),
        ("tune_overlap", {"layers": [{"layer": "qkv", "pattern": "ag_gemm", "m": 256, "n": 256, "k": 256}],
                          "world_size": 2, "dtype": "fp32"}),
    ):  # fmt: skip
        job = await rec.call(tool, args)
        if job.get("job_id") and not (job.get("job") or {}).get("finished"):
            await rec.finish(job["job_id"])
            await rec.call("get_job", {"job_id": job["job_id"]})


Workflow = Callable[[Recorder], Awaitable[None]]


async def measure(*, jobs: bool, home: Path) -> list[Call]:
    """Every workflow against a fresh suite whose state lives in `home`; the calls made, with their sizes."""
    from mcp import Client

    from servers.core.mcp_layer import App
    from servers.core.settings import Settings
    from servers.suite import create_server

    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    with exporter_endpoint() as url:
        settings = Settings(home=home, allowed_roots=[REPO], exporter_urls=[url], cancel_grace_s=1.0)
        child_env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
        app = App(settings, owner="result-sizes", child_env=child_env)
        async with Client(create_server(app), mode="legacy") as client:
            rec = Recorder(client)

            async def health(r: Recorder) -> None:
                await node_health(r, url)

            steps: list[tuple[str, Workflow]] = [
                ("node health", health),
                ("scaling", scaling),
                ("straggler", straggler),
                ("network", network),
                ("overlap", overlap),
            ]
            if jobs:
                steps.append(("jobs", long_job))
            for name, workflow in steps:
                rec.workflow = name
                await workflow(rec)
            return rec.calls


def per_tool(calls: list[Call]) -> list[dict[str, Any]]:
    rows = []
    for tool in sorted({c.tool for c in calls}):
        mine = [c for c in calls if c.tool == tool]
        top = max(mine, key=lambda c: c.bytes)
        rows.append(
            {
                "tool": tool,
                "calls": len(mine),
                "max_bytes": top.bytes,
                "median_bytes": statistics.median(c.bytes for c in mine),
                "other_bytes": max(c.other_bytes for c in mine),
                "largest": f"{top.workflow}: {top.args}" + (" (error)" if top.error else ""),
            }
        )
    return sorted(rows, key=lambda r: -r["max_bytes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-jobs", action="store_true", help="skip the workflows that start jobs")
    parser.add_argument("--json", type=Path, help="write the calls and the per-tool table here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="result-sizes-") as folder:
        t0 = time.monotonic()
        calls = anyio.run(lambda: measure(jobs=not args.no_jobs, home=Path(folder) / "state"))
        wall = time.monotonic() - t0
    rows = per_tool(calls)
    over = [r for r in rows if r["max_bytes"] > GOAL_BYTES]
    all_bytes = [c.bytes for c in calls]
    print(f"{len(calls)} calls of {len(rows)} tools in {wall:.1f} s; goal: every default result <= {GOAL_BYTES:,} B")
    print(f"{'tool':<28}{'calls':>6}{'max B':>9}{'median B':>10}{'image B':>9}  largest call")
    for r in rows:
        flag = "  OVER" if r["max_bytes"] > GOAL_BYTES else ""
        print(
            f"{r['tool']:<28}{r['calls']:>6}{r['max_bytes']:>9,}{r['median_bytes']:>10,.0f}{r['other_bytes']:>9,}"
            f"  {r['largest']}{flag}"
        )
    print(
        f"all calls: max {max(all_bytes):,} B (~{max(all_bytes) // 4:,} tokens), median "
        f"{statistics.median(all_bytes):,.0f} B; {len(over)} tool(s) over the goal"
        + (f": {', '.join(r['tool'] for r in over)}" if over else "")
    )
    for c in calls:
        if c.error:
            print(f"note: {c.workflow}: {c.tool}({c.args}) answered with an error (measured all the same)")
    if args.json:
        args.json.write_text(json.dumps({"calls": [asdict(c) for c in calls], "tools": rows}, indent=1))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
