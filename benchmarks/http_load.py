"""The suite over streamable HTTP under concurrent load: latency of one cheap tool call alone and with N calls in
flight at once, every answer checked.

It starts `llm-infra-mcp serve suite --transport http` on a free loopback port (its own state directory), opens
one MCP session, and times predict_scaling on parameters given (a pure computation, so the figures measure the
transport and the server, not the work): --runs calls one after another (the baseline), then --concurrency calls
at once, --rounds times. Prints p50, p90, p99 and max of the per-call latency of each, their ratio, and the
throughput; exits 1 if any answer is wrong or missing.

    python benchmarks/http_load.py [--concurrency 100] [--rounds 5] [--runs 50]
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mcp import Client  # noqa: E402

PARAMETERS = {"A": 0.6, "B": 0.5, "D": 1.0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(url: str, args: argparse.Namespace) -> int:
    wrong = 0
    async with Client(url) as client:

        async def one(i: int, out: list[float]) -> None:
            nonlocal wrong
            compute = 10.0 * (i + 1)
            start = time.perf_counter()
            result = await client.call_tool(
                "predict_scaling",
                {"model": "power_law", "compute": [compute], "parameters": PARAMETERS},
            )
            out.append(time.perf_counter() - start)
            value = None if result.is_error else result.structured_content["values"][0]["value"]
            if value is None or abs(value - (0.6 - compute**-0.5)) > 1e-9:
                wrong += 1

        for i in range(5):  # warm-up
            await one(i, [])
        alone: list[float] = []
        for i in range(args.runs):
            await one(i, alone)
        loaded: list[float] = []
        started = time.perf_counter()
        for _ in range(args.rounds):
            async with anyio.create_task_group() as group:
                for i in range(args.concurrency):
                    group.start_soon(one, i, loaded)
        elapsed = time.perf_counter() - started
    print(f"{'':<22}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}{'calls':>8}")
    for name, values in (("one at a time", alone), (f"{args.concurrency} at once", loaded)):
        print(
            f"{name:<22}{statistics.median(values) * 1e3:>9.1f}{quantile(values, 0.9) * 1e3:>9.1f}"
            f"{quantile(values, 0.99) * 1e3:>9.1f}{max(values) * 1e3:>9.1f}{len(values):>8}"
        )
    total = args.concurrency * args.rounds
    print(
        f"p99 under load / p50 alone: {quantile(loaded, 0.99) / statistics.median(alone):.1f}x; throughput "
        f"{total / elapsed:.0f} calls/s; wrong or missing answers: {wrong + total - len(loaded)}"
    )
    return 1 if wrong or len(loaded) != total else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LLM_INFRA_MCP_HOME": home, "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "servers.cli", "serve", "suite", "--transport", "http", "--port", str(port)]
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    time.sleep(0.1)
            return anyio.run(measure, f"http://127.0.0.1:{port}/mcp", args)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
