"""What an agent pays for the suite's tools before its first call: the size of tools/list, per tool and in all.

Two figures, as issue 14 states its goals (compact JSON, UTF-8 bytes; ~4 bytes a token):
- model-visible: name + description + input schema of every tool (what a client puts in the model's context),
  goal <= 32 KB;
- the whole tools/list result on the wire (output schemas, annotations and titles included), goal <= 60 KB.
Also the largest tools and the share of output schemas. Exit status 1 when a goal is missed.

    python benchmarks/tools_size.py [--top 15] [--toolsets scaling,launch]
"""

import argparse
import json
import os
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VISIBLE_GOAL = 32 * 1024
WIRE_GOAL = 60 * 1024


def compact(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="the largest tools listed")
    parser.add_argument("--toolsets", default="", help="LLM_INFRA_MCP_TOOLSETS for this measurement")
    args = parser.parse_args()
    os.environ["LLM_INFRA_MCP_TOOLSETS"] = args.toolsets
    from servers.suite import create_server

    tools = anyio.run(create_server().list_tools)
    rows = []
    for tool in tools:
        data = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
        visible = compact({"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema})
        rows.append((tool.name, visible, compact(data.get("outputSchema") or {}), compact(data)))
    wire = compact({"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]})
    visible = sum(r[1] for r in rows)
    outputs = sum(r[2] for r in rows)
    print(f"{len(tools)} tools{' (toolsets ' + args.toolsets + ')' if args.toolsets else ''}")
    print(f"{'tool':<30}{'visible B':>11}{'output schema B':>17}{'on the wire B':>15}")
    for name, vis, out, whole in sorted(rows, key=lambda r: -r[3])[: args.top]:
        print(f"{name:<30}{vis:>11,}{out:>17,}{whole:>15,}")
    print(
        f"model-visible {visible:,} B (~{visible // 4:,} tokens; goal {VISIBLE_GOAL:,}): "
        f"{'met' if visible <= VISIBLE_GOAL else 'NOT met'}"
    )
    print(
        f"tools/list on the wire {wire:,} B, output schemas {outputs:,} B of it (goal {WIRE_GOAL:,}): "
        f"{'met' if wire <= WIRE_GOAL else 'NOT met'}"
    )
    return 0 if visible <= VISIBLE_GOAL and wire <= WIRE_GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
