"""What every run reader returns: a RunData of Series (one per source key: steps, wall times and values), built
with bounded memory, with restarts, skipped values and partial reads counted and said.

Bounded memory: a SeriesBuilder keeps at most `cap` points of one key however many it is given. Past 2 x cap
points it keeps every other one and from then on takes one point in `stride` (a doubling stride), so the points
kept are evenly spaced in arrival order and the first is always kept; `Series.read` counts every point given and
`Series.stride` says how many were read per point kept. Plain Python (array of doubles): no numpy, so the servers
can import it at start.

Restarts: a run resumed from a checkpoint logs some steps again. A point whose step is below the last step of its
stream (a file, or a directory of event files: the reader says) starts a new attempt: every key's points from the
step it goes back to onwards are dropped (the later attempt supersedes them) and the restart is recorded. A point
whose step is not above the last one of its own key (a duplicated step) replaces that key's points from its step.
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass, field
from typing import Any

DEFAULT_CAP = 100_000  # points kept per key: servers/scaling's MAX_ROWS, so a fit gets what it could be given inline
MAX_KEYS = 2_000  # distinct source keys one read keeps (listed and read); the rest are counted
MAX_NOTES = 50


class RunError(ValueError):
    """A run source that cannot be read: the message says what was wrong and what is accepted."""


@dataclass(frozen=True)
class Restart:
    """Steps went back from `from_step` to `to_step`: a resumed or restarted run. `at_time` is the wall time of the
    first point of the new attempt (nan when unknown)."""

    from_step: int
    to_step: int
    at_time: float = math.nan


@dataclass
class Series:
    """One metric of a run as its source names it: steps (ascending after restart handling), wall times (unix
    seconds; nan when the source has none) and values (finite only: non-finite ones are counted, not kept)."""

    key: str
    steps: array = field(default_factory=lambda: array("q"))
    times: array = field(default_factory=lambda: array("d"))
    values: array = field(default_factory=lambda: array("d"))
    read: int = 0  # points given for this key, kept or not (non-finite included)
    nonfinite: int = 0  # NaN or infinite values given (not kept)
    stride: int = 1  # points read per point kept, past the cap (1: all kept)
    superseded: int = 0  # points dropped because a restart logged their steps again

    def __len__(self) -> int:
        return len(self.steps)

    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None


class SeriesBuilder:
    """Builds one Series with at most `cap` points kept (see the module's docstring)."""

    def __init__(self, key: str, cap: int = DEFAULT_CAP):
        if cap < 2:
            raise ValueError("cap must be at least 2")
        self.series = Series(key)
        self.cap = cap
        self._n = 0  # finite points given so far: the one-in-stride rule keeps those whose count is a multiple

    def add(self, step: int, time: float, value: float) -> None:
        s = self.series
        s.read += 1
        if not math.isfinite(value):
            s.nonfinite += 1
            return
        if s.steps and step <= s.steps[-1]:
            self.cut(step)
        n, self._n = self._n, self._n + 1
        if n % s.stride:
            return  # thinned: one point in `stride` is kept
        s.steps.append(int(step))
        s.times.append(float(time))
        s.values.append(float(value))
        if len(s.steps) >= 2 * self.cap:
            s.steps, s.times, s.values = s.steps[::2], s.times[::2], s.values[::2]
            s.stride *= 2

    def cut(self, step: int) -> None:
        """Drop the points kept at `step` or later (a later attempt logs them again)."""
        s = self.series
        at = bisect.bisect_left(s.steps, step)
        s.superseded += len(s.steps) - at
        del s.steps[at:], s.times[at:], s.values[at:]

    def done(self) -> Series:
        return self.series


@dataclass
class RunData:
    """One run read by one reader.

    reader: the reader's name (registry.py). source: where it came from, as shown to the agent. name: the run's
    label (an experiment name, a run id, the directory's name). series: by source key. keys: every key seen (the
    first MAX_KEYS; keys_dropped counts the rest). facts: what the run's own files say about it (gpus, nodes,
    params, max_steps, model, ...), each with where it was found in fact_sources. partial: why what was read is not
    the whole run (a truncated file, a run still being written, a cap), empty when it is. notes: anything else the
    agent should know about how it was read. rows_read/rows_skipped: records of the source read and skipped
    (skipped_reasons counts them by reason)."""

    reader: str
    source: str
    name: str
    series: dict[str, Series] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    keys_dropped: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    fact_sources: dict[str, str] = field(default_factory=dict)
    partial: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    rows_read: int = 0
    rows_skipped: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)

    def fact(self, name: str, value: Any, where: str) -> None:
        """Record a fact about the run (the first one found wins) and where it was found."""
        if value is not None and name not in self.facts:
            self.facts[name] = value
            self.fact_sources[name] = where

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)

    def skip(self, reason: str, count: int = 1) -> None:
        self.rows_skipped += count
        self.skipped_reasons[reason] = self.skipped_reasons.get(reason, 0) + count


class RunCollector:
    """Builds a RunData from points given one at a time: one SeriesBuilder per wanted key (all keys when `keys` is
    None, up to MAX_KEYS), restarts shared across keys. Readers feed it and call done()."""

    def __init__(self, run: RunData, keys: set[str] | None, cap: int = DEFAULT_CAP):
        self.run = run
        self.wanted = keys
        self.cap = cap
        self._builders: dict[str, SeriesBuilder] = {}
        self._seen: dict[str, None] = {}
        self._restarts: dict[tuple[int, int], Restart] = {}
        self._dropped: set[str] = set()
        self._last: dict[str, int] = {}  # the last step seen in each stream
        self._stream: dict[str, str] = {}  # the stream of each key's builder (a restart cuts its stream's keys)

    def add(self, key: str, step: int, time: float, value: float, stream: str = "") -> None:
        last = self._last.get(stream)
        if last is not None and step < last:
            self.restart(last, step, time, stream)
        self._last[stream] = step
        if key not in self._seen:
            if len(self._seen) >= MAX_KEYS:
                if key not in self._dropped:
                    self._dropped.add(key)
                    self.run.keys_dropped += 1
                return
            self._seen[key] = None
        if self.wanted is not None and key not in self.wanted:
            return
        builder = self._builders.get(key)
        if builder is None:
            builder = self._builders[key] = SeriesBuilder(key, self.cap)
            self._stream[key] = stream
        builder.add(step, time, value)

    def restart(self, from_step: int, to_step: int, time: float, stream: str | None = None) -> None:
        """Steps went back from `from_step` to `to_step`: the points from `to_step` on of every key of `stream`
        (of every key when None) are superseded; other streams (another directory of event files) keep theirs."""
        key = (int(from_step), int(to_step))
        if key not in self._restarts:
            self._restarts[key] = Restart(key[0], key[1], time)
        for name, builder in self._builders.items():
            if stream is None or self._stream.get(name) == stream:
                builder.cut(to_step)

    def seen(self, key: str) -> None:
        """Count a key as seen (listed in RunData.keys) without a point: a key whose values are all text, say."""
        if key not in self._seen and len(self._seen) < MAX_KEYS:
            self._seen[key] = None

    def done(self) -> RunData:
        run = self.run
        run.keys = list(self._seen)
        run.series = {k: b.done() for k, b in self._builders.items()}
        run.restarts = list(self._restarts.values())
        thinned = {k: s.stride for k, s in run.series.items() if s.stride > 1}
        if thinned:
            worst = max(thinned.values())
            run.note(
                f"{len(thinned)} key(s) had more than {2 * self.cap:,} points; each was thinned to at most "
                f"{2 * self.cap:,} evenly spaced in order (one point kept in up to {worst}); Series.read counts all"
            )
        nonfinite = {k: s.nonfinite for k, s in run.series.items() if s.nonfinite}
        if nonfinite:
            shown = ", ".join(f"{k} ({n})" for k, n in list(nonfinite.items())[:5])
            run.note(f"non-finite values (NaN or infinity) were left out: {shown}")
        if run.restarts:
            shown = ", ".join(f"step {r.from_step} back to {r.to_step}" for r in run.restarts[:5])
            superseded = sum(s.superseded for s in run.series.values())
            run.note(
                f"{len(run.restarts)} restart(s) or resume(s) found ({shown}); the later attempt's points replace "
                f"the earlier ones from the step it went back to ({superseded} point(s) superseded)"
            )
        return run


def number(raw: Any) -> float | None:
    """A logged value as a float (bools and text are not numbers; nan and inf are kept, for the collector to
    count), or None when it is not a number."""
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, (int, float)):
        try:
            return float(raw)
        except OverflowError:
            return math.inf
    return None
