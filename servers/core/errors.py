"""Errors that domain code raises for the MCP layer to turn into readable tool errors, and the wording of
validation problems (one line each) that the MCP layer sends back."""

import json
from collections.abc import Mapping, Sequence
from typing import Any


class InputError(ValueError):
    """Bad input from a caller; the message says what was wrong and what is accepted."""


class NotFoundError(InputError):
    """A named thing (job, fit, file) does not exist; the message says how to find the valid names."""


class QuotaError(InputError):
    """A request would exceed a configured quota; the message names the quota and its setting."""


# ---- readable validation errors -----------------------------------------------------------------------------------
# One line per problem, "field: what is wrong; accepted: ...", from pydantic's error list and the tool's JSON schema:
# never pydantic's own dump (several lines per problem, the input repeated, a URL).

_TYPE_ERRORS = ("_type", "_parsing", "model_attributes_type", "literal_error", "enum", "is_instance_of")
_PREFIXES = ("Value error, ", "Assertion failed, ")


def json_kind(value: Any) -> str:
    """What a JSON value is, in words: 'a boolean', 'a string', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def short_value(value: Any, limit: int = 40) -> str:
    """A value as JSON, cut to `limit` characters (huge integers are counted, not printed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<{len(str(abs(value))) if value.bit_length() < 10_000 else 'thousands of'} digits>"
    try:
        text = json.dumps(value, ensure_ascii=True, default=str)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def given(value: Any) -> str:
    """A value and its JSON kind, for "got ...": 'true (a boolean)', '"5" (a string)', 'null'."""
    return "null" if value is None else f"{short_value(value)} ({json_kind(value)})"


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def schema_alternatives(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> list[dict[str, Any]]:
    """A schema's alternatives with $ref resolved and anyOf/oneOf flattened (null included)."""
    if depth > 16 or not isinstance(schema, dict):
        return []
    if "$ref" in schema:
        target = defs.get(str(schema["$ref"]).rsplit("/", 1)[-1], {})
        return schema_alternatives(target, defs, depth + 1)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return [alt for sub in schema[key] for alt in schema_alternatives(sub, defs, depth + 1)]
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return schema_alternatives(schema["allOf"][0], defs, depth + 1)
    return [schema]


def subschema(schema: dict[str, Any], path: Sequence[str | int], defs: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of the value at `path` inside a value of `schema`, or None where the schema does not say."""
    current: dict[str, Any] | None = schema
    for part in path:
        if current is None:
            return None
        found = None
        for alt in schema_alternatives(current, defs):
            if isinstance(part, str) and part in alt.get("properties", {}):
                found = alt["properties"][part]
            elif isinstance(part, str) and isinstance(alt.get("additionalProperties"), dict):
                found = alt["additionalProperties"]
            elif isinstance(part, int) and "prefixItems" in alt and part < len(alt["prefixItems"]):
                found = alt["prefixItems"][part]
            elif isinstance(part, int) and isinstance(alt.get("items"), dict):
                found = alt["items"]
            if found is not None:
                break
        current = found
    return current


def field_names(schema: dict[str, Any] | None, defs: dict[str, Any]) -> list[str]:
    """The property names an object schema accepts (all its alternatives together)."""
    names: list[str] = []
    for alt in schema_alternatives(schema or {}, defs):
        names += [name for name in alt.get("properties", {}) if name not in names]
    return names


def describe_schema(schema: dict[str, Any] | None, defs: dict[str, Any], depth: int = 0) -> str:
    """What a schema accepts, in a few words: 'an integer from 1 to 200', 'one of "fp32", "bf16"', ..."""
    if not schema:
        return "any JSON value"
    parts: list[str] = []
    for alt in schema_alternatives(schema, defs):
        text = _describe_one(alt, defs, depth)
        if text not in parts:
            parts.append(text)
    return " or ".join(parts) or "any JSON value"


def _describe_one(schema: dict[str, Any], defs: dict[str, Any], depth: int) -> str:
    if "enum" in schema:
        values = ", ".join(short_value(v) for v in schema["enum"][:12])
        return f"one of {values}" + (", ..." if len(schema["enum"]) > 12 else "")
    if "const" in schema:
        return f"exactly {short_value(schema['const'])}"
    kind = schema.get("type")
    if kind == "null":
        return "null"
    if kind == "boolean":
        return "true or false"
    if kind in ("integer", "number"):
        noun = "an integer" if kind == "integer" else "a number"
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and high is not None:
            return f"{noun} from {_number(low)} to {_number(high)}"
        conditions = []
        if low is not None:
            conditions.append(f">= {_number(low)}")
        if "exclusiveMinimum" in schema:
            conditions.append(f"> {_number(schema['exclusiveMinimum'])}")
        if high is not None:
            conditions.append(f"<= {_number(high)}")
        if "exclusiveMaximum" in schema:
            conditions.append(f"< {_number(schema['exclusiveMaximum'])}")
        return " ".join([noun, " and ".join(conditions)]).strip()
    if kind == "string":
        text = "a string"
        low, high = schema.get("minLength"), schema.get("maxLength")
        if low and high:
            text += f" of {low} to {high} characters"
        elif high is not None:
            text += f" of at most {high} characters"
        elif low:
            text += f" of at least {low} characters"
        if "pattern" in schema:
            text += f" matching {schema['pattern']}"
        if "format" in schema:
            text += f" ({schema['format']})"
        return text
    if kind == "array":
        low, high = schema.get("minItems"), schema.get("maxItems")
        text = "a list"
        if low and high:
            text += f" of {low} to {high} items"
        elif high is not None:
            text += f" of at most {high} items"
        elif low:
            text += f" of at least {low} items"
        if depth < 2 and isinstance(schema.get("items"), dict):
            text += f", each {describe_schema(schema['items'], defs, depth + 1)}"
        return text
    if kind == "object" or "properties" in schema:
        names = list(schema.get("properties", {}))
        if names:
            shown = ", ".join(names[:24]) + (", ..." if len(names) > 24 else "")
            return f"an object with the fields {shown}"
        values = schema.get("additionalProperties")
        if isinstance(values, dict) and values and depth < 2:
            return f"an object whose values are {describe_schema(values, defs, depth + 1)}"
        return "an object"
    return "any JSON value"


def _looks_like_union_tag(part: str) -> bool:
    # pydantic names the union member that failed in the location: 'int', 'list[str]', 'function-after[...]', ...
    return "[" in part or "-" in part or part in {"str", "int", "float", "bool", "list", "dict", "none", "tuple"}


def _data_path(loc: Sequence[str | int], data: Any, error_type: str) -> list[str | int]:
    """pydantic's location, kept to the keys and indexes that exist in the data (union member tags dropped)."""
    path: list[str | int] = []
    current = data
    for i, part in enumerate(loc):
        in_data = (isinstance(current, dict) and isinstance(part, str) and part in current) or (
            isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        )
        if in_data:
            current = current[part]
        keep = (
            in_data
            or (data is None and not (isinstance(part, str) and _looks_like_union_tag(part)))
            or (i == len(loc) - 1 and error_type == "missing" and isinstance(part, str))
        )
        if keep:
            path.append(part)
    return path


def format_path(path: Sequence[str | int], root: str = "arguments") -> str:
    """`spec.layers[0].m`; a very deep path keeps its first and last parts."""
    if len(path) > 10:
        return f"{format_path(path[:4], root)}…{format_path(path[-2:], root).lstrip('.')}"
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or root


def _problem(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid")).replace("\n", " ")
    for prefix in _PREFIXES:
        message = message.removeprefix(prefix)
    return message[:1].lower() + message[1:]


def validation_problems(
    errors: Sequence[Mapping[str, Any]],
    data: Any = None,
    schema: dict[str, Any] | None = None,
    *,
    root: str = "arguments",
) -> list[str]:
    """One line per problem ("field: what is wrong; accepted: ..."), from pydantic's `errors()`.

    `data` is the validated input (to drop union member names from the locations and to say what was given),
    `schema` the JSON schema the input was meant to follow (to say what is accepted).
    """
    defs = (schema or {}).get("$defs", {})
    grouped: dict[tuple[str | int, ...], list[Mapping[str, Any]]] = {}
    for error in errors:
        path = tuple(_data_path(tuple(error.get("loc", ())), data, str(error.get("type", ""))))
        grouped.setdefault(path, []).append(error)
    lines = []
    for path, group in grouped.items():
        where = format_path(path, root)
        types = [str(e.get("type", "")) for e in group]
        noun = "argument" if len(path) == 1 else "field"
        if "extra_forbidden" in types:
            parent = subschema(schema, path[:-1], defs) if schema else None
            names = field_names(parent, defs)
            accepted = ", ".join(names) if names else "no fields"
            lines.append(f"{where}: unknown {noun}; accepted: {accepted}")
            continue
        target = subschema(schema, path, defs) if schema else None
        accepted = f"; accepted: {describe_schema(target, defs)}" if target is not None else ""
        if "missing" in types:
            lines.append(f"{where}: required {noun} missing{accepted}")
            continue
        value = group[0].get("input")
        if all(t.endswith(_TYPE_ERRORS) for t in types):
            lines.append(f"{where}: got {given(value)}{accepted}")
            continue
        specific = next(e for e in group if not str(e.get("type", "")).endswith(_TYPE_ERRORS))
        shown = "" if isinstance(value, dict | list) else f" (got {short_value(value)})"
        lines.append(f"{where}: {_problem(specific)}{shown}{accepted}")
    return lines or ["arguments: invalid"]
