"""Bounds on what one diagnostics result lists. Plain module (no MCP imports).

A client validates a tool's structured content against its output schema before it reads it; tens of MiB of
rows take the SDK's client past a minute, longer than clients wait. So every result lists at most a few hundred
items per list, counts the rest exactly (``*_omitted`` fields, said in the text summary too), clips free text
taken from the input, and, as a last guard, lists fewer items until its JSON fits MAX_RESULT_BYTES.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel

MAX_RESULT_BYTES = 768 * 1024  # structured content of one result, as JSON; the text summary comes on top
MAX_STR = 256  # characters kept of a name, label or identifier read from the input
MAX_LINE_TEXT = 500  # characters kept of a message or line quoted from the input
MAX_NOTES = 50  # warnings / errors / notes listed per result
# A tool's default answer (issue 22, defect 9): its structured content and text summary together, as compact JSON,
# stay under RESULT_GOAL_BYTES (~4k tokens); an agent asks for the rest (a limit, detail=true).
RESULT_GOAL_BYTES = 16 * 1024
DEFAULT_CONTENT_BYTES = 12 * 1024  # the structured content's share of a default answer; the text has the rest

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def clip(text: str | None, limit: int = MAX_STR) -> str | None:
    """text cut to `limit` characters (the last one an ellipsis when cut); None stays None."""
    if text is None or len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "\u2026"


def clip_str(text: str, limit: int = MAX_STR) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "\u2026"


def json_bytes(model: BaseModel) -> int:
    return len(model.model_dump_json().encode())


def summary_text(lines: Sequence[str], limit: int, tail: str = "the structured content has it all") -> str:
    """The lines joined, cut (whole lines first, then characters) until their JSON string is at most `limit` bytes;
    a cut summary ends with a line saying so and where the rest is (a tool's text summary is read whole by a model:
    it gets a budget too)."""

    def size(text: str) -> int:
        return len(json.dumps(text, ensure_ascii=False).encode())

    text = "\n".join(lines)
    if size(text) <= limit:
        return text
    ending = f"\n... (summary cut; {tail})"
    kept: list[str] = []
    for line in lines:
        if size("\n".join([*kept, line]) + ending) > limit:
            break
        kept.append(line)
    if not kept:  # one line longer than the limit: its characters, cut by halves
        line = lines[0]
        while line and size(line + ending) > limit:
            line = line[: len(line) // 2]
        kept = [line]
    return "\n".join(kept) + ending


def scaled(cap: int, scale: float) -> int:
    """`cap` shrunk by `scale` (0 < scale <= 1), at least 1."""
    return max(1, math.floor(cap * scale))


def fit(build: Callable[[float], M], budget: int = MAX_RESULT_BYTES) -> M:
    """build(scale) makes a result whose list caps are multiplied by scale; the largest scale that fits (halving
    from 1 until one fits, then a few bisection steps back up between it and the last that did not: a result lists
    close to as much as its budget holds, not down to half of it)."""
    scale = 1.0
    while True:
        model = build(scale)
        if json_bytes(model) <= budget:
            break
        if scale <= 1 / 1024:
            return model
        scale /= 2
    if scale == 1.0:
        return model
    low, high = scale, 2 * scale  # low fits, high does not
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        candidate = build(middle)
        if json_bytes(candidate) <= budget:
            low, model = middle, candidate
        else:
            high = middle
    return model


_BISECTIONS = 6


def pick(items: Sequence[T], limit: int, rank: Callable[[T], int] | None = None) -> tuple[list[T], int]:
    """At most `limit` items in their original order, those of highest `rank` taken before the others (ties: the
    earlier first); and how many were left out."""
    if len(items) <= limit:
        return list(items), 0
    if rank is None:
        return list(items[:limit]), len(items) - limit
    order = sorted(range(len(items)), key=lambda i: (-rank(items[i]), i))
    return [items[i] for i in sorted(order[:limit])], len(items) - limit


def cap_notes(notes: Sequence[str], limit: int = MAX_NOTES, text_limit: int = MAX_LINE_TEXT) -> list[str]:
    """At most `limit` notes, each clipped; when some are left out, the last entry says how many."""
    clipped = [clip_str(n, text_limit) for n in notes[: limit if len(notes) <= limit else max(0, limit - 1)]]
    if len(notes) > limit:
        clipped.append(f"... and {len(notes) - len(clipped)} more not listed")
    return clipped


def safe_int(token: str, max_digits: int = 18) -> int | None:
    """An ASCII decimal integer of at most max_digits digits (optional sign), else None (Python refuses to convert
    strings of more than 4300 digits, and no counter here has more than 18)."""
    digits = token[1:] if token[:1] in ("+", "-") else token
    if not digits or len(digits) > max_digits or not (digits.isascii() and digits.isdigit()):
        return None
    return int(token)


def omitted_note(listed: int, omitted: int, what: str) -> str:
    """'' when nothing was left out, else ' (listed N of M WHAT; K more not listed)'."""
    if not omitted:
        return ""
    return f" (listed {listed} of {listed + omitted} {what}; {omitted} more not listed)"
