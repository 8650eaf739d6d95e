"""Cold start of each server over stdio, against a minimal MCPServer with one tool.

What is measured: for each server (scaling, diagnostics, overlap, launch, suite) and for the baseline
(benchmarks/minimal_server.py), the wall time from spawning a fresh Python process with the MCP SDK's stdio client
until the answer to tools/list arrives, i.e. interpreter start, imports, building the server, its lifespan (job
reconciliation), the initialize handshake (mode="legacy") and one tools/list. Closing the process is not timed.
The servers are started the way a client starts them, `python -m servers.cli serve NAME`; each gets its own
throwaway state directory (LLM_INFRA_MCP_HOME in a temporary directory, kept across its runs, as a real user's
would be), and their stderr goes to a log file there instead of the terminal.

Every round starts each server once, in an order that rotates from round to round, so that machine noise hits all
of them alike; one unmeasured warm-up round first lets the OS cache files and Python write its bytecode. The figure
compared is the median over the rounds; the ratio is a server's median over the baseline's median, and a server
passes when that ratio is at most --max-ratio (1.25 by default, issue 14). The exit status is 1 if any server fails.

Run it from the repository root:

    python benchmarks/startup.py --runs 7
    python benchmarks/startup.py --runs 15 --server suite --json startup.json
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

REPO_ROOT = Path(__file__).resolve().parents[1]
BASELINE = "baseline"
SERVER_NAMES = ("scaling", "diagnostics", "overlap", "launch", "suite")
RUN_TIMEOUT_S = 120.0


@dataclass
class Target:
    name: str
    args: list[str]
    home: Path
    samples_ms: list[float] = field(default_factory=list)
    tools: int = 0

    @property
    def stderr_log(self) -> Path:
        return self.home.parent / f"{self.name}.stderr.log"


def targets(names: list[str], tmp: Path) -> list[Target]:
    baseline = Target(BASELINE, [str(REPO_ROOT / "benchmarks" / "minimal_server.py")], tmp / BASELINE)
    return [baseline] + [Target(name, ["-m", "servers.cli", "serve", name], tmp / name) for name in names]


async def cold_start(target: Target) -> tuple[float, int]:
    """Spawn the server, initialize, list its tools: (milliseconds from spawn to the tools/list answer, tool count)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=target.args,
        env={"LLM_INFRA_MCP_HOME": str(target.home), "PATH": os.environ.get("PATH", "")},
        cwd=REPO_ROOT,
    )
    with target.stderr_log.open("a") as errlog, anyio.fail_after(RUN_TIMEOUT_S):
        client = Client(stdio_client(params, errlog=errlog), mode="legacy")
        start = time.perf_counter()
        async with client:
            tools = (await client.list_tools()).tools
            elapsed_ms = (time.perf_counter() - start) * 1000
    return elapsed_ms, len(tools)


async def measure(all_targets: list[Target], runs: int, warmup: int) -> None:
    for round_no in range(warmup + runs):
        shift = round_no % len(all_targets)
        for target in all_targets[shift:] + all_targets[:shift]:
            try:
                elapsed_ms, tools = await cold_start(target)
            except Exception as exc:
                tail = target.stderr_log.read_text(errors="replace")[-4000:] if target.stderr_log.exists() else ""
                raise SystemExit(
                    f"startup.py: {target.name} failed to start: {type(exc).__name__}: {exc}\n{tail}"
                ) from exc
            if round_no >= warmup:
                target.samples_ms.append(elapsed_ms)
                target.tools = tools


def report(all_targets: list[Target], max_ratio: float) -> tuple[list[dict], bool]:
    baseline_median = statistics.median(all_targets[0].samples_ms)
    rows, all_passed = [], True
    for target in all_targets:
        median = statistics.median(target.samples_ms)
        ratio = median / baseline_median
        passed = None if target.name == BASELINE else ratio <= max_ratio
        all_passed = all_passed and passed is not False
        rows.append(
            {
                "server": target.name,
                "median_ms": round(median, 1),
                "min_ms": round(min(target.samples_ms), 1),
                "ratio": round(ratio, 3),
                "tools": target.tools,
                "passed": passed,
                "samples_ms": [round(s, 1) for s in target.samples_ms],
            }
        )
    return rows, all_passed


def print_table(rows: list[dict], runs: int, max_ratio: float) -> None:
    print(f"cold start over stdio (spawn, initialize, tools/list); median of {runs} runs; limit {max_ratio:g}x")
    header = f"{'server':<12} {'median ms':>10} {'min ms':>9} {'ratio':>7} {'tools':>6}  result"
    print(header)
    print("-" * len(header))
    for row in rows:
        result = "-" if row["passed"] is None else ("PASS" if row["passed"] else "FAIL")
        print(
            f"{row['server']:<12} {row['median_ms']:>10.1f} {row['min_ms']:>9.1f} "
            f"{row['ratio']:>6.2f}x {row['tools']:>6}  {result}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="measured rounds (default 7)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    parser.add_argument("--max-ratio", type=float, default=1.25, help="largest allowed median ratio (default 1.25)")
    parser.add_argument(
        "--server", action="append", choices=SERVER_NAMES, dest="servers", help="only this server (repeatable)"
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be at least 1 and --warmup at least 0")

    with tempfile.TemporaryDirectory(prefix="llm-infra-startup-") as tmp:
        all_targets = targets(args.servers or list(SERVER_NAMES), Path(tmp))
        anyio.run(measure, all_targets, args.runs, args.warmup)
    rows, all_passed = report(all_targets, args.max_ratio)
    print_table(rows, args.runs, args.max_ratio)
    if args.json is not None:
        figures = {
            "runs": args.runs,
            "warmup": args.warmup,
            "max_ratio": args.max_ratio,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "servers": rows,
            "passed": all_passed,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
