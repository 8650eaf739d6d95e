"""What a tool publishes in tools/list, made small without making it untrue (issue 14: the whole list is read by a
model before its first call, ~4 bytes a token).

- `published_input`: the input schema pydantic generates, without what a model does not need: titles (the
  property name says it), defaults that mean "not given" (null, false, "", [], {}), the null alternative of an
  optional argument (leaving it out is the way to say "none"; an explicit null is still accepted), the abuse
  caps (string and list lengths of 64 and more, upper bounds of 1000 and more), the natural floors (minimum 0 or
  1, exclusiveMinimum 0: a count or an amount), patterns (identifier syntax, which the values a model passes come
  from earlier results or from the descriptions), and what is left empty without them. The server still enforces
  every one of them and names it in its error. Kept: types, enums, small upper bounds, other lower bounds,
  short list caps, required, additionalProperties: false, descriptions, meaningful defaults.
- `published_output`: the output schema at its top level: its model's name (title), every property with its JSON
  type(s) and enum, `required`; nested objects and lists of objects as {"type": "object"} / {"type": "array"}
  (their full schema is the resource infra://tools/{name}/output-schema). A result still validates against it;
  the server validates every result against the full model before it is sent.
- `description_text`: a docstring without its code indentation, paragraphs as lines (tool descriptions, and the
  descriptions in published input schemas, where a model's docstring is its description).

Plain functions over JSON data, no MCP imports.
"""

import inspect
import re
from typing import Any

_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_DATA = ("enum", "const", "default", "examples")
_EMPTY_DEFAULTS: tuple[Any, ...] = (None, False, "", [], {})
_CAP_KEYS = ("maxLength", "maxItems", "maxProperties")
_CAP_AT = 64
_UPPER_KEYS = ("maximum", "exclusiveMaximum")
_UPPER_AT = 1000
_FLOORS = {"minimum": (0, 1), "exclusiveMinimum": (0,)}  # the lower-bound keys, and the floors a name implies
_FAR = 1e6  # a lower bound this far from zero guards, like a cap
_NULL = {"type": "null"}


def description_text(doc: str) -> str:
    """A docstring as one line per paragraph: no indentation, lines of a paragraph joined by spaces."""
    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(doc))
    return "\n".join(" ".join(line.strip() for line in p.splitlines() if line.strip()) for p in paragraphs).strip()


def _is_empty_default(value: Any) -> bool:
    return any(value == empty and type(value) is type(empty) for empty in _EMPTY_DEFAULTS)


def _is_cap(key: str, value: Any) -> bool:
    """A constraint that guards the input rather than guides the caller (the server's error quotes it)."""
    if key == "pattern":
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if key in _CAP_KEYS:
        return value >= _CAP_AT
    if key in _UPPER_KEYS:
        return value >= _UPPER_AT
    if key in _FLOORS:
        return value in _FLOORS[key] or abs(value) >= _FAR
    return False


def published_input(schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema as published (see the module's docstring)."""
    return _compact_input(schema)


def _compact_input(node: Any) -> Any:
    if isinstance(node, list):
        return [_compact_input(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _MAPS and isinstance(value, dict):
            out[key] = {name: _compact_input(sub) for name, sub in value.items()}
        elif key == "title" and isinstance(value, str):
            continue
        elif key == "description" and isinstance(value, str):
            out[key] = description_text(value)  # a model's docstring keeps its line breaks and indentation
        elif key == "default":
            if not _is_empty_default(value):
                out[key] = value
        elif key in _DATA:
            out[key] = value
        elif _is_cap(key, value):
            continue
        else:
            compacted = _compact_input(value)
            if compacted == {} and key in ("propertyNames", "items", "additionalProperties") and value != {}:
                continue  # nothing left of it but what any value meets
            out[key] = compacted
    alternatives = out.get("anyOf")
    if (
        isinstance(alternatives, list)
        and len(alternatives) == 2
        and _NULL in alternatives
        and "default" in node
        and node["default"] is None
    ):
        # Optional with "not given" as its default: publish the value's own schema (null still accepted).
        (other,) = [alt for alt in alternatives if alt != _NULL]
        del out["anyOf"]
        out = {**other, **out} if "$ref" not in other else {**out, "$ref": other["$ref"]}
    return out


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while "$ref" in node and seen < 16:
        target = defs.get(str(node["$ref"]).rsplit("/", 1)[-1])
        if not isinstance(target, dict):
            return {}
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        seen += 1
    return node


def _types(node: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> list[str] | None:
    """The JSON types a (sub)schema allows, or None where any value is allowed."""
    node = _resolve(node, defs)
    if depth > 8:
        return None
    kind = node.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [str(k) for k in kind]
    for combo in ("anyOf", "oneOf"):
        if isinstance(node.get(combo), list):
            found: list[str] = []
            for alt in node[combo]:
                sub = _types(alt, defs, depth + 1) if isinstance(alt, dict) else None
                if sub is None:
                    return None
                found += [t for t in sub if t not in found]
            return found
    if "properties" in node:
        return ["object"]
    if "enum" in node or "const" in node:
        values = node.get("enum", [node.get("const")])
        names = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
        found = []
        for value in values:
            name = names.get(type(value), "object" if isinstance(value, dict) else "array")
            if name not in found:
                found.append(name)
        return found
    return None


def _shape(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A property's published output schema: its types, its enum, the item type of a list of scalars."""
    resolved = _resolve(node, defs)
    types = _types(resolved, defs)
    if types is None:
        return {}
    if "integer" in types and "number" in types:
        types = [t for t in types if t != "integer"]
    shape: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
    enum = resolved.get("enum")
    if isinstance(enum, list) and len(enum) <= 16:
        shape["enum"] = enum
    elif "const" in resolved:
        shape["const"] = resolved["const"]
    if "array" in types:
        items = resolved.get("items")
        if not isinstance(items, dict):
            for alt in resolved.get("anyOf", []):
                if isinstance(alt, dict) and isinstance(_resolve(alt, defs).get("items"), dict):
                    items = _resolve(alt, defs)["items"]
        if isinstance(items, dict):
            item_types = _types(items, defs)
            if item_types is not None and "object" not in item_types and "array" not in item_types:
                shape["items"] = {"type": item_types[0] if len(item_types) == 1 else item_types}
    return shape


def published_output(schema: dict[str, Any]) -> dict[str, Any]:
    """The output schema as published: its top level (see the module's docstring)."""
    defs = schema.get("$defs", {})
    root = _resolve(schema, defs)
    out: dict[str, Any] = {"type": "object"}
    if isinstance(root.get("title"), str):
        out["title"] = root["title"]  # the model's name: JobView says "a job handle" to a client in few bytes
    properties = root.get("properties")
    if isinstance(properties, dict):
        out["properties"] = {name: _shape(sub, defs) for name, sub in properties.items() if isinstance(sub, dict)}
    if isinstance(root.get("required"), list):
        out["required"] = list(root["required"])
    return out
