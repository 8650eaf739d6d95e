"""Strict tool arguments: the argument model every tool registered through mcp_layer.agent_tool validates with,
and the schema helpers it publishes (closed_schema, refer).

The SDK validates a tool's arguments with a pydantic model built from the function's signature, in lax mode:
unknown arguments are dropped silently, `true` passes as 1, "5" as 5. An agent learns nothing from that, so every
tool validates strictly instead (StrictArguments):
- unknown arguments, top level and nested (spec, data, ...), are refused, naming the accepted ones; the published
  inputSchema says additionalProperties: false on every object with properties;
- the JSON types are exact: a boolean is not a number, a string is not a number or a boolean, a number is not a
  string. A number with no fraction (5.0) counts as an integer, as JSON Schema has it;
- a string given for an argument that cannot be a string (a list or an object) is read as JSON, as the SDK does
  (Claude Desktop sends such arguments as JSON text); an argument that can be a string is never decoded;
- problems come back one line each, "field: what is wrong; accepted: ...".

StrictArguments subclasses the SDK's FuncMetadata (mcp.server.mcpserver.utilities.func_metadata, SDK 2.3): it
overrides validate_arguments, call_fn and convert_result, the methods the SDK's Tool.run calls.
"""

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic_core
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata, func_metadata
from pydantic import Field, PrivateAttr, ValidationError

from servers.core.errors import describe_schema, format_path, schema_alternatives, subschema, validation_problems

MAX_ARGUMENT_DEPTH = 64
MAX_INTEGER_BITS = 1024  # about 308 digits: larger than any bound of any tool
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


class _BadValueError(Exception):
    def __init__(self, path: list[str | int], problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


def _json_ready(value: Any, path: list[str | int]) -> Any:
    """`value` as plain JSON data, integral floats as ints. Raises _BadValueError for data nested deeper than
    MAX_ARGUMENT_DEPTH and integers longer than any bound a tool has (pydantic's JSON parser refuses them)."""
    if len(path) > MAX_ARGUMENT_DEPTH:
        raise _BadValueError(path[:1], f"nested deeper than {MAX_ARGUMENT_DEPTH} levels")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INTEGER_BITS:
        raise _BadValueError(path, f"an integer of {value.bit_length()} bits is far beyond any accepted value")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _json_ready(item, [*path, str(key)]) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item, [*path, i]) for i, item in enumerate(value)]
    return value


def _accepts_string(schema: dict[str, Any], defs: dict[str, Any]) -> bool:
    for alt in schema_alternatives(schema, defs):
        kind = alt.get("type")
        if kind == "string" or (kind is None and not ({"properties", "items", "enum", "const"} & set(alt))):
            return True
        if any(isinstance(v, str) for v in alt.get("enum", [])) or isinstance(alt.get("const"), str):
            return True
    return False


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` with additionalProperties: false on every object schema that lists its properties."""

    def close(node: Any) -> Any:
        if isinstance(node, list):
            return [close(item) for item in node]
        if not isinstance(node, dict):
            return node
        closed: dict[str, Any] = {}
        for key, value in node.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                closed[key] = {name: close(sub) for name, sub in value.items()}  # names map to schemas
            elif key in ("enum", "const", "default", "examples"):
                closed[key] = value  # data, not schemas
            else:
                closed[key] = close(value)
        if "properties" in closed and "additionalProperties" not in closed:
            closed["additionalProperties"] = False
        return closed

    return close(schema)


class _Rejected(dict[str, Any]):
    """What StrictArguments.validate_arguments returns for arguments it refuses: call_fn raises the problems.

    (The SDK turns a ValidationError from validate_arguments into pydantic's multi-line dump and anything else into
    an opaque crash; a ToolError raised by call_fn reaches the agent with its text.)
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__()
        self.problems = problems


class _NotBuiltYet(ArgModelBase):
    """The argument model of a tool registered from the schema cache, until its first call builds the real one."""


class StrictArguments(FuncMetadata):
    """The SDK's FuncMetadata with strict, readable argument validation (see the module docstring).

    `output_schema` is what tools/list publishes (servers.core.schemas.published_output); results are validated
    against `output_model`, the full model. A tool registered from the schema cache starts without its models
    (`_source` set): the first call, or a read of its full output schema, builds them (a few milliseconds)."""

    tool_name: str
    input_schema: dict[str, Any] = Field(default_factory=dict)
    full_output_schema: dict[str, Any] | None = None
    text_fields: frozenset[str] = frozenset()
    _source: tuple[Callable[..., Any], tuple[str, ...]] | None = PrivateAttr(default=None)
    _loader: Callable[[str], Tool] | None = PrivateAttr(default=None)
    _real_fn: Callable[..., Any] | None = PrivateAttr(default=None)

    @classmethod
    def from_metadata(
        cls,
        name: str,
        meta: FuncMetadata,
        published_output_schema: dict[str, Any] | None,
        schema: dict[str, Any] | None = None,
    ) -> "StrictArguments":
        """`schema`: the closed input schema of `meta.arg_model` when the caller has it already."""
        schema = schema if schema is not None else closed_schema(meta.arg_model.model_json_schema(by_alias=True))
        defs = schema.get("$defs", {})
        return cls(
            arg_model=meta.arg_model,
            output_schema=published_output_schema,
            output_model=meta.output_model,
            wrap_output=meta.wrap_output,
            tool_name=name,
            input_schema=schema,
            full_output_schema=meta.output_schema,
            text_fields=frozenset(
                key for key, prop in schema.get("properties", {}).items() if _accepts_string(prop, defs)
            ),
        )

    @classmethod
    def deferred(
        cls, name: str, fn: Callable[..., Any], skip: tuple[str, ...], published_output_schema: dict[str, Any] | None
    ) -> "StrictArguments":
        meta = cls(arg_model=_NotBuiltYet, output_schema=published_output_schema, tool_name=name)
        meta._source = (fn, skip)
        return meta

    @classmethod
    def of_part(
        cls, name: str, loader: Callable[[str], Tool], published_output_schema: dict[str, Any] | None
    ) -> "StrictArguments":
        """A tool of a part not registered yet (register_part_later): `loader(name)` registers the part and gives
        the real tool, whose function and models this one then uses."""
        meta = cls(arg_model=_NotBuiltYet, output_schema=published_output_schema, tool_name=name)
        meta._loader = loader
        return meta

    def ensure_built(self) -> None:
        if self._loader is not None:
            real = self._loader(self.tool_name)
            assert isinstance(real.fn_metadata, StrictArguments)
            real.fn_metadata.ensure_built()
            built = real.fn_metadata
            self._real_fn = real.fn
            self._loader = None
        elif self._source is not None:
            fn, skip = self._source
            built = StrictArguments.from_metadata(
                self.tool_name, func_metadata(fn, skip_names=skip), self.output_schema
            )
            self._source = None
        else:
            return
        for field in ("arg_model", "output_model", "wrap_output", "input_schema", "full_output_schema", "text_fields"):
            setattr(self, field, getattr(built, field))

    def _decode(self, name: str, value: Any) -> Any:
        if not isinstance(value, str) or name in self.text_fields:
            return value
        try:
            decoded = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return decoded if isinstance(decoded, dict | list) else value

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        self.ensure_built()
        names = {field.alias or name: name for name, field in self.arg_model.model_fields.items()}
        problems = [
            f"{key}: unknown argument; accepted: {', '.join(names) or 'no arguments'}"
            for key in arguments_to_validate
            if key not in names
        ]
        try:
            data = _json_ready(
                {key: self._decode(key, value) for key, value in arguments_to_validate.items() if key in names}, []
            )
            text = pydantic_core.to_json(data, inf_nan_mode="constants")
        except _BadValueError as exc:
            defs = self.input_schema.get("$defs", {})
            target = subschema(self.input_schema, exc.path, defs)
            accepted = f"; accepted: {describe_schema(target, defs)}" if target is not None else ""
            return _Rejected([*problems, f"{format_path(exc.path)}: {exc.problem}{accepted}"])
        except (ValueError, TypeError, RecursionError) as exc:
            return _Rejected([*problems, f"arguments: not JSON data ({type(exc).__name__})"])
        try:
            model = self.arg_model.model_validate_json(text, strict=True, extra="forbid")
        except ValidationError as exc:
            return _Rejected(problems + validation_problems(exc.errors(), data, self.input_schema))
        if problems:
            return _Rejected(problems)
        return model.model_dump_one_level()

    async def call_fn(
        self,
        fn: Callable[..., Any | Awaitable[Any]],
        fn_is_async: bool,
        arguments: dict[str, Any],
        arguments_to_pass_directly: dict[str, Any] | None = None,
    ) -> Any:
        if isinstance(arguments, _Rejected):
            raise ToolError("\n".join(arguments.problems))
        return await super().call_fn(self._real_fn or fn, fn_is_async, arguments, arguments_to_pass_directly)

    def convert_result(self, result: Any) -> Any:
        self.ensure_built()
        return super().convert_result(result)


def refer(schema: dict[str, Any], same_as: dict[str, str]) -> dict[str, Any]:
    """`schema` with each property named in `same_as` published as "the same object as <tool>'s" instead of in
    full (the object travels between tools and is listed in full once); $defs no longer used are dropped."""
    properties = dict(schema.get("properties", {}))
    for name, other in same_as.items():
        if name not in properties:
            raise ValueError(f"same_as names {name!r}, which is not an argument")
        said = properties[name].get("description", "").rstrip(".")
        properties[name] = {
            "type": "object",
            "description": f"{said + '; ' if said else ''}the same object as {other}'s {name}",
        }
    out = {**schema, "properties": properties}
    text = json.dumps({k: v for k, v in out.items() if k != "$defs"})
    defs = dict(schema.get("$defs", {}))
    used: set[str] = set()
    pending = [n for n in defs if f'"#/$defs/{n}"' in text]
    while pending:
        name = pending.pop()
        if name in used:
            continue
        used.add(name)
        inner = json.dumps(defs[name])
        pending += [n for n in defs if n not in used and f'"#/$defs/{n}"' in inner]
    if used:
        out["$defs"] = {n: d for n, d in defs.items() if n in used}
    else:
        out.pop("$defs", None)
    return out
