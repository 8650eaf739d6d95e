"""Every tool of the suite follows the project's conventions (a test that walks them all, so a new tool
cannot skip one): typed inputs with descriptions and bounds, an output schema, all four annotations,
snake_case names unique across the servers, a docstring written for an agent, and bad input answered
with a readable is_error result while the server keeps serving."""

import json
import re
from typing import Any

import pytest
from mcp import Client
from mcp.types import Tool

from servers.core.arguments import StrictArguments
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


def enforced_schemas(server: Any) -> dict[str, dict[str, Any]]:
    """The input schema each tool enforces (tools/list publishes it without the caps: servers.core.schemas)."""
    found = {}
    for tool in server._tool_manager.list_tools():
        if isinstance(tool.fn_metadata, StrictArguments):
            tool.fn_metadata.ensure_built()
            found[tool.name] = tool.fn_metadata.input_schema
    return found


def tool_problems(tools: list[Tool], enforced: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """What a tool breaks of the conventions. Bounds are checked on the schema the server enforces."""
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
            or not tool.title
        ):
            problems.append(f"{tool.name}: annotations incomplete ({hints})")
        elif hints.read_only_hint and hints.destructive_hint:
            problems.append(f"{tool.name}: read-only and destructive at once")
        schema = (enforced or {}).get(tool.name, tool.input_schema)
        defs = schema.get("$defs", {})
        for name, prop in schema.get("properties", {}).items():
            _check_property(f"{tool.name}.{name}", prop, defs, problems)
        published = tool.input_schema.get("properties", {})
        if set(published) != set(schema.get("properties", {})):
            problems.append(
                f"{tool.name}: publishes arguments {sorted(published)}, takes {sorted(schema['properties'])}"
            )
    return problems


async def test_every_tool_is_typed_described_annotated_and_has_an_output_schema(app: App, mode: str) -> None:
    server = create_server(app)
    problems = tool_problems(await list_tools(server, mode), enforced_schemas(server))
    assert not problems, "\n".join(problems)


async def test_an_object_published_by_reference_is_published_in_full_by_the_tool_it_names(app: App) -> None:
    """spec and data travel between tools: listed in full once, elsewhere "the same object as <tool>'s <name>"."""
    tools = {tool.name: tool for tool in await list_tools(create_server(app))}
    referred = 0
    for tool in tools.values():
        for name, prop in tool.input_schema.get("properties", {}).items():
            found = re.search(r"the same object as (\w+)'s (\w+)$", prop.get("description", ""))
            if not found:
                continue
            owner, field = found.groups()
            assert field == name and owner in tools, (tool.name, name, found.group(0))
            full = tools[owner].input_schema["properties"][name]
            assert "$ref" in full or "properties" in full, (owner, name, full)
            referred += 1
    assert referred >= 3  # submit_training_job.spec, plan_sweep.spec, check_extrapolation.data


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


# ---- strict inputs: unknown arguments, exact JSON types, readable one-line errors ----------------------------------

LINE = re.compile(r"^[A-Za-z_][\w.\[\]…]*: \S.*$")


def error_lines(text: str, tool: str) -> list[str]:
    """The problems of an is_error text, one per line; each must read "field: what is wrong; accepted: ..."."""
    assert "errors.pydantic.dev" not in text and "validation error for" not in text and "Traceback" not in text, text
    lines = text.removeprefix(f"Error executing tool {tool}: ").splitlines()
    for line in lines:
        assert LINE.match(line), f"{tool}: not one problem per line: {line!r}"
    return lines


def _object_schemas(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append(node)
        for key, value in node.items():
            if key in ("properties", "$defs"):
                for sub in value.values():
                    found += _object_schemas(sub)
            elif key not in ("enum", "const", "default", "examples"):
                found += _object_schemas(value)
    elif isinstance(node, list):
        for item in node:
            found += _object_schemas(item)
    return found


async def test_every_input_schema_is_closed(suite_tools: list[Tool]) -> None:
    """tools/list says additionalProperties: false on every object with properties, nested models included."""
    for tool in suite_tools:
        assert tool.input_schema.get("additionalProperties") is False, tool.name
        for schema in _object_schemas(tool.input_schema):
            assert schema.get("additionalProperties") is False, (tool.name, schema.get("title"))


async def test_unknown_arguments_are_refused_naming_the_accepted_ones(app: App) -> None:
    async with Client(create_server(app)) as client:
        for tool in (await client.list_tools()).tools:
            result = await client.call_tool(tool.name, {"no_such_argument": 1})
            assert result.is_error, f"{tool.name} accepted an unknown argument"
            lines = error_lines(result.content[0].text, tool.name)
            [line] = [line for line in lines if line.startswith("no_such_argument:")]
            accepted = list(tool.input_schema.get("properties", {}))
            assert line == f"no_such_argument: unknown argument; accepted: {', '.join(accepted) or 'no arguments'}"


async def test_unknown_nested_fields_are_refused(app: App) -> None:
    """Every argument that is an object with fields (spec, data, ...) refuses a field it does not have."""
    checked = 0
    server = create_server(app)
    enforced = enforced_schemas(server)  # an object published by reference has its fields here
    async with Client(server) as client:
        for tool in (await client.list_tools()).tools:
            schema = enforced[tool.name]
            defs = schema.get("$defs", {})
            for name, prop in schema.get("properties", {}).items():
                fields = [f for alt in _schemas(prop, defs) for f in alt.get("properties", {})]
                if not fields:
                    continue
                result = await client.call_tool(tool.name, {name: {"no_such_field": 1}})
                lines = error_lines(result.content[0].text, tool.name)
                assert f"{name}.no_such_field: unknown field; accepted: {', '.join(fields)}" in lines, lines
                checked += 1
    # Only objects that travel between tools are nested: spec (plan_training_job, submit_training_job, plan_sweep),
    # data (fit_scaling_law, check_extrapolation), topology (plan_network_probes, localize_network_fault), 7 today;
    # the benchmarks (gemm, collective, overlap, tune) take flat arguments
    assert checked >= 5


def _numbers(tool: Tool) -> list[str]:
    defs = tool.input_schema.get("$defs", {})
    return [
        name
        for name, prop in tool.input_schema.get("properties", {}).items()
        if any(alt.get("type") in ("integer", "number") for alt in _schemas(prop, defs))
        and not any(alt.get("type") == "string" for alt in _schemas(prop, defs))
    ]


@pytest.mark.parametrize(("given", "kind"), [(True, "a boolean"), (False, "a boolean"), ("5", "a string")])
async def test_booleans_and_strings_are_not_numbers(app: App, given: Any, kind: str) -> None:
    checked = 0
    async with Client(create_server(app)) as client:
        for tool in (await client.list_tools()).tools:
            for name in _numbers(tool):
                result = await client.call_tool(tool.name, {name: given})
                assert result.is_error, f"{tool.name} took {name}={given!r}"
                lines = error_lines(result.content[0].text, tool.name)
                assert any(line.startswith(f"{name}: got ") and f"({kind}); accepted: " in line for line in lines), (
                    tool.name,
                    lines,
                )
                checked += 1
    assert checked >= 30


async def test_nested_numbers_are_strict_too(app: App) -> None:
    async with Client(create_server(app)) as client:
        layer = {"layer": "a", "pattern": "ag_gemm", "m": 1, "n": 1, "k": "1"}
        points = {"points": [{"compute": True}]}
        cases = [
            ("plan_training_job", {"spec": {"recipe": "tiny-gpt", "nproc_per_node": True}}, "spec.nproc_per_node"),
            (
                "fit_scaling_law",
                {"model": "scalerl", "data": points},
                "data.points[0].compute",
            ),
            ("tune_overlap", {"layers": [layer]}, "layers[0].k"),
        ]
        for tool, args, where in cases:
            result = await client.call_tool(tool, args)
            assert result.is_error, (tool, args)
            lines = error_lines(result.content[0].text, tool)
            assert any(line.startswith(f"{where}: got ") for line in lines), lines


async def test_lenient_where_json_is_lenient(app: App) -> None:
    """5.0 is an integer (JSON Schema says so); an object or list sent as JSON text is read (Claude Desktop does
    that); a string argument is never decoded, even when it holds JSON."""
    async with Client(create_server(app)) as client:
        listed = await client.call_tool("list_jobs", {"limit": 5.0, "offset": 0.0})
        assert not listed.is_error, listed.content[0].text
        spec = json.dumps({"recipe": "tiny-gpt", "nproc_per_node": 1})
        planned = await client.call_tool("plan_training_job", {"spec": spec})
        assert not planned.is_error, planned.content[0].text
        pasted = await client.call_tool("parse_dcgm_diag", {"text": '{"not": "dcgm"}'})
        assert pasted.is_error and "got" not in pasted.content[0].text  # the parser read it as text
        fraction = await client.call_tool("list_jobs", {"limit": 5.5})
        assert fraction.is_error and "limit: got 5.5 (a number)" in fraction.content[0].text


async def test_too_deep_and_too_long_arguments_are_refused(app: App) -> None:
    async with Client(create_server(app)) as client:
        deep: Any = 1
        for _ in range(100):
            deep = [deep]
        result = await client.call_tool("read_job_metrics", {"job_id": "j-1", "keys": deep})
        assert result.is_error
        assert "keys: nested deeper than 64 levels" in error_lines(result.content[0].text, "read_job_metrics")[0]
        result = await client.call_tool("list_jobs", {"limit": 10**400})
        assert result.is_error and "limit: an integer of" in result.content[0].text
        assert "accepted: an integer from 1 to 200" in result.content[0].text


async def test_path_tools_answer_path_attacks_with_input_errors(app: App, tmp_path: Any) -> None:
    """A 300-byte name, a symlink loop, a symlink out of the roots: clear input errors from every tool that takes
    a path, never an internal error, and never where the symlink leads."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    hidden = tmp_path.parent / f"{tmp_path.name}-hidden-target"
    hidden.mkdir(exist_ok=True)
    (tmp_path / "out").symlink_to(hidden)
    attacks = {"a" * 300: "at most 255 bytes", "loop/x": "symlink loop", "out/x": "outside the allowed roots"}
    checked = 0
    async with Client(create_server(app)) as client:
        for tool in (await client.list_tools()).tools:
            if "path" not in tool.input_schema.get("properties", {}):
                continue
            for path, expected in attacks.items():
                result = await client.call_tool(tool.name, {"path": path})
                text = result.content[0].text
                assert result.is_error and expected in text, (tool.name, path, text)
                assert "internal error" not in text and hidden.name not in text, text
            checked += 1
        for path, expected in attacks.items():
            fit = await client.call_tool("fit_scaling_law", {"model": "scalerl", "data": {"path": path}})
            assert fit.is_error and expected in fit.content[0].text, fit.content[0].text
    assert checked >= 4


def test_domain_validation_errors_read_one_line_per_problem() -> None:
    """A ValidationError raised by domain code (no tool schema at hand) reads the same way."""
    from pydantic import BaseModel, Field, ValidationError

    from servers.core.errors import validation_problems

    class Inner(BaseModel):
        size: int = Field(ge=1)

    class Outer(BaseModel):
        name: str | list[str]
        inner: Inner
        items: list[Inner] = []

    with pytest.raises(ValidationError) as caught:
        Outer.model_validate({"name": 5, "inner": {"size": 0}, "items": [{"size": "x"}, {}]})
    lines = validation_problems(caught.value.errors(), root=caught.value.title)
    assert lines == [
        "name: got 5 (an integer)",
        "inner.size: input should be greater than or equal to 1 (got 0)",
        'items[0].size: got "x" (a string)',
        "items[1].size: required field missing",
    ]


# One word, one meaning (DESIGN.md "Tool vocabulary"): how long a call waits is wait_s, a job's limit max_wall_s.
BANNED_ARGUMENTS = {
    "timeout_s": "wait_s (how long this call waits) or max_wall_s (a job's wall-time limit)",
    "timeout": "wait_s or max_wall_s",
    "wall_s": "max_wall_s",
    "max_wait_s": "wait_s",
}


async def test_one_word_one_meaning(suite_tools: list[Tool]) -> None:
    problems = []
    for tool in suite_tools:
        properties = tool.input_schema.get("properties", {})
        for name in properties:
            if name in BANNED_ARGUMENTS:
                problems.append(f"{tool.name}.{name}: say {BANNED_ARGUMENTS[name]}")
        starts_job = (tool.output_schema or {}).get("title") == "JobView"
        if starts_job and tool.name not in JOB_TOOLS:
            for needed in ("wait_s", "max_wall_s"):
                if needed not in properties and "spec" not in properties:
                    problems.append(f"{tool.name}: starts a job but has no {needed}")
    assert not problems, "\n".join(problems)
