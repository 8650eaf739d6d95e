"""Streaming a JSON-lines log with bounded memory: one line at a time, each at most MAX_LINE_BYTES (longer lines
are skipped and counted, never held whole), bad lines counted by reason, a last line without its newline taken as
a record still being written (the read is then partial). Shared by the verl and suite readers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servers.runs.series import RunData, RunError

MAX_LINE_BYTES = 1 << 20  # verl logs a few hundred keys per step; 1 MiB is far above any real line
CHUNK = 1 << 16


def first_object(path: Path, limit: int = 1 << 16) -> dict[str, Any] | None:
    """The first non-blank line of `path` as a JSON object, reading at most `limit` bytes; None otherwise."""
    try:
        with path.open("rb") as handle:
            head = handle.read(limit)
    except OSError:
        return None
    for line in head.splitlines():
        if line.strip():
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def objects(path: Path, run: RunData) -> Iterator[dict[str, Any]]:
    """Each line of `path` that is a JSON object, in order. Lines that are not (bad JSON, not an object, longer
    than MAX_LINE_BYTES) are skipped and counted in run.skip; a cut-off last line makes the read partial."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise RunError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    with handle:
        number = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # skip the rest of the long line without keeping it
                    raw = handle.readline(CHUNK)
                run.skip(f"line longer than {MAX_LINE_BYTES // 2**20} MiB")
                continue
            if not raw.strip():
                continue
            run.rows_read += 1
            last = not raw.endswith(b"\n")
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):
                if last:
                    run.partial.append(
                        f"the last line of {path.name} is cut off: the run is still being written or the file was "
                        "truncated; every complete line was read"
                    )
                    run.skip("cut-off last line")
                else:
                    run.skip("not JSON")
                continue
            if not isinstance(value, dict):
                run.skip("not a JSON object")
                continue
            yield value


def step_of(raw: Any) -> int | None:
    """A logged step as an int (an integral float counts), or None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return None
