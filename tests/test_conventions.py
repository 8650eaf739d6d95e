"""Every tool of the suite follows the project's conventions (a test that walks them all, so a new tool
cannot skip one): typed inputs with descriptions and bounds, an output schema, all four annotations,
snake_case names unique across the servers, a docstring written for an agent, and bad input answered
with a readable is_error result while the server keeps serving."""

import re
from typing import Any

import pytest
from mcp import Client
from mcp.types import Tool

from servers.core.mcp_layer import App
from servers.suite import PARTS, create_server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
JOB_TOOLS = {"get_job", "list_jobs", "wait_for_job", "cancel_job", "read_job_logs", "read_job_metrics"}


async def list_tools(server: Any, mode: str = "legacy") -> list[Tool]:
    async with Client(server, mode=mode) as client:
        return (await client.list_tools()).tools


@pytest.fixture
async def suite_tools(app: App, mode: str) -> list[Tool]:
    return await list_tools(create_server(app), mode)


async def test_names_are_snake_case_and_unique_across_servers(app: App) -> None:
    import importlib

    seen: dict[str, list[str]] = {}
    for part in PARTS:
        server = importlib.import_module(f"servers.{part.name}.server").create_server(app)
        for tool in await list_tools(server):
            seen.setdefault(tool.name, []).append(part.name)
    suite_names = [t.name for t in await list_tools(create_server(app))]
    assert len(suite_names) == len(set(suite_names)), "the suite registers a tool twice"
    assert set(suite_names) == set(seen), "the suite must carry exactly the tools of the four servers"
    for name, owners in seen.items():
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", name), name
        assert len(owners) == 1 or name in JOB_TOOLS, f"{name} is defined by {owners}"
    assert JOB_TOOLS <= set(suite_names)


def _schemas(schema: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives of a property schema, with $ref resolved and null dropped."""
    if "$ref" in schema:
        return _schemas(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
    if "anyOf" in schema:
        return [s for alt in schema["anyOf"] for s in _schemas(alt, defs) if s.get("type") != "null"]
    return [schema]


def _check_property(where: str, prop: dict[str, Any], defs: dict[str, Any], problems: list[str]) -> None:
    if "description" not in prop and not any("description" in s for s in _schemas(prop, defs)):
        problems.append(f"{where}: no description")
    for alt in _schemas(prop, defs):
        kind = alt.get("type")
        if kind in ("integer", "number") and "enum" not in alt:
            has_low = "minimum" in alt or "exclusiveMinimum" in alt
            has_high = "maximum" in alt or "exclusiveMaximum" in alt
            if not (has_low or has_high):
                problems.append(f"{where}: a number without bounds")
        if kind == "string" and not ({"enum", "const", "pattern", "maxLength", "format"} & set(alt)):
            problems.append(f"{where}: a string without a pattern, enum or maxLength")
        if kind == "array" and "maxItems" not in alt and "maxItems" not in prop:
            problems.append(f"{where}: an array without maxItems")
        if kind == "array" and "items" in alt:
            _check_items(f"{where}[]", alt["items"], defs, problems)
        if kind == "object" and "properties" in alt:
            for name, sub in alt["properties"].items():
                _check_property(f"{where}.{name}", sub, defs, problems)


def _check_items(where: str, items: dict[str, Any], defs: dict[str, Any], problems: list[str]) -> None:
    for alt in _schemas(items, defs):
        if alt.get("type") == "object" and "properties" in alt:
            for name, sub in alt["properties"].items():
                _check_property(f"{where}.{name}", sub, defs, problems)
        elif alt.get("type") in ("integer", "number") and not (
            {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & set(alt)
        ):
            problems.append(f"{where}: a number without bounds")
        elif alt.get("type") == "string" and not ({"enum", "pattern", "maxLength"} & set(alt)):
            problems.append(f"{where}: a string without a pattern, enum or maxLength")


def tool_problems(tools: list[Tool]) -> list[str]:
    problems: list[str] = []
    for tool in tools:
        if not tool.description or len(tool.description) < 80:
            problems.append(f"{tool.name}: the description is too short to tell an agent what, when, cost, returns")
        if not tool.output_schema or tool.output_schema.get("type") != "object":
            problems.append(f"{tool.name}: no object output schema")
        hints = tool.annotations
        if (
            hints is None
            or None in (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint)
            or not hints.title
        ):
            problems.append(f"{tool.name}: annotations incomplete ({hints})")
        elif hints.read_only_hint and hints.destructive_hint:
            problems.append(f"{tool.name}: read-only and destructive at once")
        defs = tool.input_schema.get("$defs", {})
        for name, prop in tool.input_schema.get("properties", {}).items():
            _check_property(f"{tool.name}.{name}", prop, defs, problems)
    return problems


async def test_every_tool_is_typed_described_annotated_and_has_an_output_schema(suite_tools: list[Tool]) -> None:
    problems = tool_problems(suite_tools)
    assert not problems, "\n".join(problems)


async def test_the_convention_check_catches_a_careless_tool() -> None:
    from mcp.server import MCPServer

    careless = MCPServer("careless")

    @careless.tool(structured_output=False)
    def lookup(count: int, name: str, sizes: list[float]) -> str:
        """Short."""
        return name * count

    problems = tool_problems(await list_tools(careless))
    for expected in (
        "description is too short",
        "no object output schema",
        "annotations incomplete",
        "lookup.count: no description",
        "lookup.count: a number without bounds",
        "lookup.name: a string without",
        "lookup.sizes: an array without maxItems",
        "lookup.sizes[]: a number without bounds",
    ):
        assert any(expected in p for p in problems), (expected, problems)


WRONG_VALUE = {
    "integer": "many",
    "number": "lots",
    "string": {"not": "a string"},
    "boolean": {"x": 1},
    "array": "not a list",
    "object": 17,
}


def _wrong_value(prop: dict[str, Any], defs: dict[str, Any]) -> Any:
    kinds = {alt.get("type") for alt in _schemas(prop, defs)}
    if "enum" in prop or any("enum" in alt for alt in _schemas(prop, defs)):
        return "no-such-choice"
    for kind in ("object", "array", "integer", "number", "boolean", "string"):
        if kind in kinds:
            return WRONG_VALUE[kind]
    return object.__name__


async def test_wrong_types_for_every_argument_give_readable_errors(app: App, mode: str) -> None:
    async with Client(create_server(app), mode=mode) as client:
        tools = (await client.list_tools()).tools
        for tool in tools:
            defs = tool.input_schema.get("$defs", {})
            for name, prop in tool.input_schema.get("properties", {}).items():
                args = {name: _wrong_value(prop, defs)}
                result = await client.call_tool(tool.name, args)
                text = result.content[0].text if result.content else ""
                assert result.is_error, f"{tool.name}({args}) was accepted"
                assert name in text and "Traceback" not in text, f"{tool.name}: {text!r}"
        # still serving
        assert len((await client.list_tools()).tools) == len(tools)
