"""Per-backend options (as TorchX's run options): a training spec carries the fields every backend reads, and
`options`, validated against the chosen backend's own options model (its BackendInfo.options in the registry).

- `validate(backend, options)`: the normalised options (what a spec stores), or a ValueError naming, for an option
  the backend does not take, which backend takes it and what this one accepts;
- `given_options(spec, backend)`: what a backend's plan() reads, the spec's "options" mapping checked for names the
  backend does not take (the backend checks the values itself, as it checks every field it is handed);
- `describe(backend)`: the options of one backend in a few words each, for list_backends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from servers.core.models import Model
from servers.engines import registry

MAX_OPTIONS = 32
MAX_OPTIONS_BYTES = 16384  # JSON: the largest model (SkyPilot's 32 pip requirements) is well below


class Options(Model):
    """The base of a backend's options model: unknown names are refused."""

    model_config = ConfigDict(defer_build=True, extra="forbid")


def model_of(backend: str) -> type[BaseModel] | None:
    """The options model of a registered backend; None when it takes no options."""
    model = registry.get(backend).options_model()
    return model if model is not None else None


def accepted(backend: str) -> tuple[str, ...]:
    model = model_of(backend)
    return tuple(model.model_fields) if model is not None else ()


def owners(name: str) -> tuple[str, ...]:
    """The registered backends that take an option of this name."""
    return tuple(backend for backend in registry.names() if name in accepted(backend))


def _accepted_text(backend: str) -> str:
    names = accepted(backend)
    return f"accepted for {backend}: {', '.join(names) if names else 'no options'}"


def misplaced(backend: str, names: list[str] | tuple[str, ...]) -> list[str]:
    """One line per name in `names` that `backend` does not take ("name: ..."), saying which backend takes it."""
    own = set(accepted(backend))
    lines = []
    for name in names:
        if name in own:
            continue
        takers = owners(name)
        shown = name if name.isidentifier() and len(name) <= 64 else repr(name[:64])
        where = f"a {' and '.join(takers)} option, not a {backend} one" if takers else "not an option of any backend"
        lines.append(f"{shown}: {where}; {_accepted_text(backend)}")
    return lines


def validate(
    backend: str, options: Mapping[str, Any], *, within: str = "options", join: str = "\n", strict: bool = False
) -> dict[str, Any]:
    """The options as `backend`'s model accepts them, the defaults left out (so that {} and {"partition": None}
    are one spec); a ValueError otherwise, one problem per line (`join`), each naming where (`within`: "options"
    or "" when the caller's error names the field already)."""
    lines = _problems(backend, options, strict)
    if lines:
        raise ValueError(join.join(_placed(within, line) for line in lines))
    model = model_of(backend)
    return (
        model.model_validate(dict(options), strict=strict).model_dump(mode="json", exclude_defaults=True)
        if model
        else {}
    )


def _placed(within: str, line: str) -> str:
    """A problem line ("name: ..." or ": ..." for the whole) under the field it belongs to."""
    if line.startswith(": "):
        return f"{within}{line}" if within else line[2:]
    return f"{within}.{line}" if within else line


def _problems(backend: str, options: Mapping[str, Any], strict: bool = False) -> list[str]:
    """What is wrong with `options` for `backend`: ': ...' for the whole, 'name: ...' for one option."""
    if len(options) > MAX_OPTIONS:
        return [f": {len(options)} given; accepted: at most {MAX_OPTIONS}"]
    try:
        size = len(json.dumps(options, default=str))
    except (TypeError, ValueError, RecursionError):
        return [": not JSON data"]
    if size > MAX_OPTIONS_BYTES:
        return [f": {size} bytes of JSON; accepted: at most {MAX_OPTIONS_BYTES}"]
    lines = misplaced(backend, [str(k) for k in options])
    model = model_of(backend)
    if lines or model is None:
        return lines
    try:
        model.model_validate(dict(options), strict=strict)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()))
            value = error.get("input")
            shown = "" if isinstance(value, dict | list) else f" (got {str(value)[:80]!r})"
            lines.append(f"{where}: {str(error.get('msg', 'invalid')).removeprefix('Value error, ')}{shown}")
        return lines or [": invalid"]
    return []


def full(backend: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every option of `backend`, the defaults filled in (what training.plan hands the backend's plan)."""
    model = model_of(backend)
    if model is None:
        return {}
    return model.model_validate(dict(options or {})).model_dump(mode="json")


def given_options(spec: Mapping[str, Any], backend: str) -> dict[str, Any]:
    """The spec's "options" for `backend`'s plan(): a mapping whose names the backend takes (ValueError naming the
    misplaced ones otherwise); the values are the backend's to check."""
    options = spec.get("options")
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ValueError(f"options: {type(options).__name__} given; accepted: an object ({_accepted_text(backend)})")
    problems = misplaced(backend, [str(k) for k in options])
    if problems:
        raise ValueError("\n".join(f"options.{line}" for line in problems))
    return dict(options)


def describe(backend: str) -> dict[str, str]:
    """name -> "type: description" for each option of `backend` (empty when it takes none)."""
    model = model_of(backend)
    if model is None:
        return {}
    out = {}
    properties = model.model_json_schema()["properties"]
    for name, info in model.model_fields.items():
        kind = _type_text(properties.get(name, {}))
        out[name] = f"{kind}: {info.description}" if info.description else kind
    return out


def _type_text(schema: Mapping[str, Any]) -> str:
    """'string', 'boolean', 'TrainJob|PyTorchJob', 'list of string'... from a property's JSON schema."""
    if "enum" in schema:
        return "|".join(str(v) for v in schema["enum"])
    if "const" in schema:
        return str(schema["const"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            kinds = [_type_text(s) for s in schema[key] if s.get("type") != "null"]
            return "|".join(kinds) if kinds else "null"
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type_text(schema.get('items', {}))}"
    return str(kind or "any")
