"""A scripted stdio MCP client: start the suite, list what it offers, run a job and follow it to the end.

    python examples/first_job.py [--m 512 --n 512 --k 512 --dtype fp32 --iters 20]

It starts `llm-infra-mcp serve suite` as a subprocess (with this interpreter), exactly as Claude Desktop
would, and talks MCP to it over stdio. The job is a GEMM benchmark: on a machine without a GPU it runs on the
CPU (the timings then check the plumbing, not GPU performance). State goes where the settings say
(LLM_INFRA_MCP_HOME; by default ~/.local/state/llm-infra-mcp), so the job stays listed afterwards.
Exit status: 0 if the job succeeded.
"""

import argparse
import json
import os
import sys
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters


def show(title: str, text: str) -> None:
    print(f"\n== {title}\n{text}", flush=True)


async def call(client: Client, tool: str, args: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args, **kwargs)
    if result.is_error:
        raise SystemExit(f"{tool} failed: {result.content[0].text}")
    show(f"{tool}({json.dumps(args)})", result.content[0].text)
    return result.structured_content or {}


async def main(args: argparse.Namespace) -> int:
    env = {k: v for k, v in os.environ.items() if k.startswith("LLM_INFRA_MCP_")}
    server = StdioServerParameters(command=sys.executable, args=["-m", "servers.cli", "serve", "suite"], env=env)
    async with Client(server) as client:
        info = client.server_info
        show("server", f"{info.name} {info.version}" if info else "(no server info)")
        tools = (await client.list_tools()).tools
        show(
            f"{len(tools)} tools",
            "\n".join(f"- {t.name}: {t.annotations.title if t.annotations else ''}" for t in tools),
        )
        resources = (await client.list_resources()).resources
        templates = (await client.list_resource_templates()).resource_templates
        show(
            "resources",
            "\n".join(
                [f"- {r.uri} ({r.mime_type})" for r in resources]
                + [f"- {t.uri_template} (template)" for t in templates]
            ),
        )
        prompts = (await client.list_prompts()).prompts
        show("prompts", "\n".join(f"- {p.name}: {p.description}" for p in prompts))

        await call(client, "list_backends", {})
        gemm = {"m": args.m, "n": args.n, "k": args.k, "dtype": args.dtype, "iters": args.iters, "warmup": 3}
        # wait_s=0: take the job handle at once and follow the job, as an agent does with long work
        job = await call(client, "benchmark_gemm", {**gemm, "wait_s": 0})
        job_id = job["job_id"]

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            print(f"   ... {progress:.1f}/{total or 0:.0f} s waited: {message}", flush=True)

        while True:
            waited = await call(client, "wait_for_job", {"job_id": job_id, "wait_s": 30}, progress_callback=on_progress)
            if waited["job"]["finished"]:
                break
        await call(client, "read_job_logs", {"job_id": job_id})
        metrics = await call(client, "read_job_metrics", {"job_id": job_id, "keys": ["time_ms"], "limit": 5})
        final = waited["job"]
        show("result", json.dumps(final["result"], indent=2) if final["result"] else str(final["reason"]))
        show(
            "done",
            f"job {job_id} {final['state']}; {len(metrics['rows'])} metrics rows shown; "
            f"it stays readable as infra://jobs/{job_id}",
        )
        return 0 if final["state"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=512)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16", "fp8"])
    parser.add_argument("--iters", type=int, default=20)
    sys.exit(anyio.run(main, parser.parse_args()))
