"""References to code as "module:attribute" strings, imported when first used: how every registry (backends, checks,
scaling laws) names the code of an entry without importing it at start-up. Standard library only."""

import importlib
from typing import Any


def resolve(reference: Any) -> Any:
    """What a "module:attribute" reference names (the attribute may be dotted: "module:Class.method"), imported now;
    anything that is not a string is returned as it is (the object itself was given)."""
    if not isinstance(reference, str):
        return reference
    module, _, attribute = reference.partition(":")
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target
