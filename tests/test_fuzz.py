"""Schema-driven fuzz of every tool of the suite at a small size (benchmarks/fuzz.py runs it large).

Arguments come from each tool's inputSchema with a fixed seed: valid, boundary and invalid values, unknown and
missing fields. The suite must answer every call: no crash, no internal error, no result that breaks its own output
schema, no unreadable error. Tools that start jobs get wait_s 0 and their jobs are cancelled at once.
"""

from pathlib import Path

import pytest
from mcp import Client

from benchmarks import fuzz
from servers.suite import create_server
from tests.conftest import CHILD_ENV

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]
SEED = 20240917
CASES = 60  # per tool
JOB_CASES = 12  # per tool that starts jobs


async def test_fuzz_every_tool(tmp_path: Path) -> None:
    pools = fuzz.make_pools(tmp_path / "root")
    app = fuzz.fuzz_app(tmp_path / "state", pools.root)
    app._child_env = CHILD_ENV
    async with Client(create_server(app)) as client:
        reports = await fuzz.fuzz(client, pools, cases=CASES, job_cases=JOB_CASES, seed=SEED)
        assert len((await client.list_tools()).tools) == len(reports)  # every tool fuzzed, and still serving
    calls = sum(r.calls for r in reports)
    ok = sum(r.ok for r in reports)
    assert calls >= CASES * len(reports) * 0.7 and ok >= calls * 0.1, (calls, ok)  # the fuzz reaches the tools' work
    findings = [str(f) for r in reports for f in r.findings]
    assert not findings, f"{len(findings)} finding(s):\n" + "\n".join(findings)


def test_cases_are_deterministic(tmp_path: Path) -> None:
    from mcp.types import Tool

    pools = fuzz.make_pools(tmp_path / "root")
    tool = Tool(
        name="t",
        input_schema={
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 1, "maximum": 10},
                "s": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
                "spec": {"$ref": "#/$defs/S"},
            },
            "required": ["n"],
            "$defs": {"S": {"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0}}}},
        },
    )
    first = fuzz.cases_for(tool, 1, 50, pools, max_len=100, max_items=8)
    assert first == fuzz.cases_for(tool, 1, 50, pools, max_len=100, max_items=8)
    assert first != fuzz.cases_for(tool, 2, 50, pools, max_len=100, max_items=8)
    kinds = {fuzz.kind_of(case.get("n")) for case in first}
    assert {"integer"} < kinds  # valid and wrong types both
    unknown_top = [case for case in first if set(case) - {"n", "s", "spec"}]
    unknown_nested = [case for case in first if isinstance(case.get("spec"), dict) and set(case["spec"]) - {"x"}]
    assert unknown_top and unknown_nested
    assert any(isinstance(case.get("spec"), str) for case in first)  # objects as JSON text
