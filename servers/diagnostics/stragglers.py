"""Stragglers: which ranks of a job are slow, from per-rank step times. Plain module (no MCP imports).

Input: rows ``{rank, step, step_time_s, node?, compute_s?, comm_s?}``, one per rank and step (pasted, or built from a
job's metrics file with ``rows_from_metrics``: the bundled recipes log every rank's own work per step as
``rank_work_s`` and its whole step as ``rank_step_s``, lists indexed by rank, averaged over the steps since the
previous metrics row).

Method, in order:

1. Signal. ``compute_s`` (a rank's own work, before it waits for the others) when every row has it, else
   ``step_time_s``. In synchronised data-parallel training every rank's step time is the slowest rank's (the others
   wait at the all-reduce), so only the own-work time can tell which rank is slow.
2. Per step, each rank against its peers (the other ranks of the step; with a pipeline layout, the other ranks of
   its pipeline stage, which do the same work): robust z = (t - median) / (1.4826 * MAD). The MAD is floored at the
   larger of ``mad_floor`` times the median (default 1%), so that identical times do not divide by zero, and the
   job's own step-to-step jitter (each rank's time over the step's median, median absolute change from one step to
   the next, over sqrt 2), so that on a noisy machine only deviations beyond its noise count. Peer groups of at most
   ``LOO_MAX_RANKS`` ranks compare each rank with the median and MAD of the others (leave-one-out: of two ranks, the
   median and MAD of both cannot single one out; with fewer than ``SMALL_GROUP_PEERS`` peers, whose MAD measures no
   spread between ranks, the MAD is also floored at ``SMALL_GROUP_MAD_FLOOR`` (3%) of the median); larger groups use
   all ranks, which assumes fewer than half of them are slow at a step. A rank is slow at a step when z >
   ``z_threshold`` (3.5) and it is at least ``min_slowdown`` (5%) slower than its peers' median.
3. Persistence: a straggler is slow in at least ``min_flagged`` (6) of its last ``window`` (10) scored steps; a rank
   that was so in an earlier window but is not now is ``was_slow``. A rank with fewer than ``window`` scored steps
   gets no such verdict: ``not_enough_steps``. Since which step: the first slow step of the stretch of windows that
   hold enough slow steps, refined by the rank's change point when one lies within a window of it.
4. Change points over time, per rank (the Greyhound rule, FALCON, ATC'25): the rank's median over its first
   ``change_iterations`` iterations (and at least ``MIN_BASELINE_ROWS`` rows, so that a warm-up row cannot set it) is
   its baseline; a change point is the first run of consecutive observations each at least ``change_slowdown`` (20%)
   slower than the baseline that covers at least ``change_iterations`` (10) iterations and ``MIN_RUN_ROWS`` rows. When
   rows come every k steps (averages over k iterations), one row covers k iterations; one noisy row of a 10-step
   average is then no change point. A rank that changed but is not slower than its peers is
   ``slowed``. Change points coincide when they lie within max(change_iterations, stride) iterations of the first of
   them; when at least two ranks and half the judged ones coincide, they slowed together (``changed_together``: a
   fleet-wide change: data, checkpointing, contention), and the ranks that changed apart from them are named. The job
   as a whole (per step, the median of the ranks that are not slow against their peers) is tested the same way:
   ``fleet_change_point``.
   Likely straggler: a rank (slowed, or was_slow) of the earliest group of coinciding change points (a group that is
   not half the judged ranks: it changed first), which since its change point (at least ``window`` scored steps) was
   at least ``min_slowdown`` slower than its peers' median in ``min_flagged`` of its last ``window`` steps and over
   all of them, but not beyond its peers' noise (the z-score of step 2): evidence, not a confirmed straggler. With two
   ranks the peer comparison is weakest (each rank's one peer gives no spread: only the floors set the scale).
5. Aggregation: to nodes (a node whose ranks are all stragglers: drain it), and with a layout (tp, pp, dp sizes and
   the rank order, fastest-varying first; Megatron's default is tp-dp-pp) to tensor-, data- and pipeline-parallel
   groups and to pipeline stages (a stage slower than the others on all its ranks is an imbalance: rebalance layers).
6. The job as a whole (``job_slowdown``): a change point (the rule of step 4) in its step time, per step the median
   over ranks, and where the added time went, from the ranks that are not slow: into slow ranks (the others wait for
   them), into every rank's own work (compute: at least half of the added time), or into the rest of the step
   (communication: the backward pass and the gradient all-reduce that every rank of a synchronised collective
   shares, so step times cannot name the rank; the network probes can).
7. Action per straggler: drain the node when all its ranks are slow; else compute-bound or communication-bound when
   compute_s and comm_s are both logged (the larger excess over its peers' median), or compute-bound when the
   own-work signal found it; else rebalance.

Every verdict count adds up to the number of ranks (the report refuses to be built otherwise). Bounded input:
``MAX_ROWS`` rows, ``MAX_RANKS`` ranks, ``MAX_CELLS`` steps x ranks; bad rows raise InputError naming the rows and what
is accepted.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servers.core.errors import InputError, given, validation_problems
from servers.core.models import Model
from servers.diagnostics.bounds import MAX_NOTES, MAX_STR, cap_notes, clip_str, fit, pick, scaled

if TYPE_CHECKING:
    import numpy as np

MAX_ROWS = 1_000_000
MAX_RANKS = 65_536
MAX_CELLS = 8_000_000  # distinct steps x distinct ranks held as one matrix (64 MB of float64)
MAX_STEP = 10**12
MAX_SECONDS = 1e7  # a step of over 115 days is a unit mistake
MAX_TEXT_CHARS = 256 * 2**20
MAX_PROBLEMS = 10  # bad rows named in one error
MAX_LISTED = 200  # ranks listed per verdict (stragglers, was_slow, slowed)
MAX_RANK_IDS_LISTED = 256  # rank numbers listed for not_enough_steps
MAX_AGGREGATES = 100  # nodes, groups, stages listed
MAX_MEMBERS_LISTED = 64  # ranks listed per node or group
LOO_MAX_RANKS = 8
# A rank with one or two peers: their MAD measures no spread between ranks, yet identical hardware differs by a few
# percent (on this 2-core machine two clean ranks differed by 10-11% for a whole run, one core busier than the other).
# Below SMALL_GROUP_PEERS peers the MAD is floored at this fraction of the median too (a modelling choice: a rank
# must be at least ~16% slower than its one peer to count as slow at a step, with z_threshold 3.5).
SMALL_GROUP_PEERS = 3
SMALL_GROUP_MAD_FLOOR = 0.03
MAD_TO_SIGMA = 1.4826
ABS_MAD_FLOOR_S = 1e-9
MIN_JITTER_DIFFS = 10
MIN_BASELINE_ROWS = 3  # a change point's baseline is the median of at least this many rows
MIN_RUN_ROWS = 3  # and its slow run at least this many: one row's average cannot show that each iteration was slow
SYNCHRONISED_SPREAD = 0.002  # peers' MAD under 0.2% of the median: step times of a synchronised job

ROW_FIELDS = ("rank", "step", "step_time_s", "node", "compute_s", "comm_s")
ROW_ACCEPTED = (
    "an object {rank: integer >= 0, step: integer >= 0, step_time_s: seconds > 0, node?: string, compute_s?: "
    "seconds >= 0, comm_s?: seconds >= 0}, one per rank and step"
)
TEXT_ACCEPTED = (
    "accepted: a JSON list of row objects, JSON lines (one row object per line), or CSV with a header naming rank, "
    "step, step_time_s and optionally node, compute_s, comm_s"
)

Verdict = Literal["straggler", "likely_straggler", "was_slow", "slowed", "ok", "not_enough_steps"]
VERDICTS: tuple[Verdict, ...] = ("straggler", "likely_straggler", "was_slow", "slowed", "ok", "not_enough_steps")
Signal = Literal["step_time_s", "compute_s"]
SignalChoice = Literal["auto", "step_time_s", "compute_s"]
Attribution = Literal["compute", "communication", "unknown"]
JobAttribution = Literal["stragglers", "compute", "communication", "unknown"]
Dim = Literal["tp", "dp", "pp"]
M = TypeVar("M", bound=BaseModel)


# ---------------------------------------------------------------------------------------------------------------------
# inputs


class StepRow(Model):
    """One rank's time for one step."""

    rank: int = Field(ge=0, lt=MAX_RANKS)
    step: int = Field(ge=0, le=MAX_STEP)
    step_time_s: float = Field(gt=0, le=MAX_SECONDS, description="the rank's whole step, seconds")
    node: str | None = Field(default=None, max_length=MAX_STR)
    compute_s: float | None = Field(default=None, ge=0, le=MAX_SECONDS, description="its own work, before waiting")
    comm_s: float | None = Field(default=None, ge=0, le=MAX_SECONDS, description="its time in communication")


class StragglerParams(Model):
    """The thresholds, with their defaults; every report states the ones it used."""

    model_config = ConfigDict(extra="forbid")

    z_threshold: float = Field(default=3.5, gt=0, le=100, description="robust z above which a rank is slow at a step")
    min_slowdown: float = Field(
        default=0.05, ge=0, le=10, description="and at least this fraction slower than its peers' median"
    )
    window: int = Field(default=10, ge=3, le=1000, description="persistence window: the last W scored steps")
    min_flagged: int = Field(default=6, ge=1, le=1000, description="slow in at least K of the window's steps")
    mad_floor: float = Field(default=0.01, ge=0, le=1, description="MAD floor as a fraction of the median")
    change_slowdown: float = Field(
        default=0.20, gt=0, le=10, description="change point: this fraction slower than the rank's own baseline"
    )
    change_iterations: int = Field(
        default=10, ge=2, le=100_000, description="change point: for at least this many consecutive iterations"
    )

    @model_validator(mode="after")
    def _k_within_window(self) -> StragglerParams:
        if self.min_flagged > self.window:
            raise ValueError(f"min_flagged ({self.min_flagged}) must be at most window ({self.window})")
        return self


class Layout(Model):
    """How ranks map to parallel groups: sizes and the order of the dimensions, fastest-varying first."""

    model_config = ConfigDict(extra="forbid")

    tp: int = Field(default=1, ge=1, le=MAX_RANKS, description="tensor-parallel size")
    pp: int = Field(default=1, ge=1, le=MAX_RANKS, description="pipeline-parallel size (stages)")
    dp: int | None = Field(default=None, ge=1, le=MAX_RANKS, description="data-parallel size; default ranks/(tp*pp)")
    order: str = Field(
        default="tp-dp-pp",
        max_length=16,
        description="the dimensions fastest-varying first, e.g. tp-dp-pp (Megatron's default: tp fastest, pp "
        "slowest) or tp-pp-dp",
    )

    @model_validator(mode="after")
    def _order_is_a_permutation(self) -> Layout:
        dims = self.order.replace(",", "-").split("-")
        if sorted(dims) != ["dp", "pp", "tp"]:
            raise ValueError(f"order {self.order!r} must name tp, dp and pp once each, e.g. 'tp-dp-pp'")
        return self

    def dims(self) -> list[Dim]:
        return [d for d in self.order.replace(",", "-").split("-")]  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------------------------------
# outputs


class ChangePoint(Model):
    since_step: int = Field(description="the first iteration of the first slow observation")
    until_step: int = Field(description="the last step of the slow run")
    iterations: int = Field(description="iterations the slow run covers")
    baseline_s: float = Field(description="the median over the first change_iterations iterations (>= 3 rows)")
    median_s: float = Field(description="the median over the slow run")
    ratio: float = Field(description="median_s / baseline_s")
    ongoing: bool = Field(description="the run reaches the last observation")


class RankEvidence(Model):
    rank: int
    node: str | None = None
    verdict: Verdict
    median_s: float | None = Field(default=None, description="the rank's median signal over its slow stretch")
    fleet_median_s: float | None = Field(
        default=None, description="the median of all ranks (per step, then over the same steps)"
    )
    ratio: float | None = Field(default=None, description="median_s / fleet_median_s")
    since_step: int | None = Field(default=None, description="the first slow step of the stretch")
    until_step: int | None = Field(default=None, description="the last slow step of the stretch")
    flagged_in_last_window: int = Field(description="slow steps among its last `window` scored steps")
    steps_flagged: int = Field(description="slow steps in all")
    steps_scored: int = Field(description="steps at which it was compared with its peers")
    max_z: float | None = None
    median_z: float | None = Field(default=None, description="median robust z over the stretch")
    compute_ratio: float | None = Field(default=None, description="its compute_s over the fleet's, same steps")
    comm_ratio: float | None = Field(default=None, description="its comm_s over the fleet's, same steps")
    attribution: Attribution = "unknown"
    change_point: ChangePoint | None = None
    coordinates: dict[str, int] | None = Field(default=None, description="tp, dp, pp index when a layout is given")
    rows_since_change: int | None = Field(
        default=None, description="likely_straggler: scored rows from its change point on"
    )
    rows_slower_since_change: int | None = Field(
        default=None, description="likely_straggler: of those, rows >= min_slowdown slower than its peers' median"
    )
    next_change_step: int | None = Field(
        default=None, description="likely_straggler: the next other rank's change point (None: no other changed)"
    )
    action: str


class NodeAggregate(Model):
    node: str
    ranks: int
    ranks_judged: int = Field(description="ranks with enough steps for a verdict")
    stragglers: int
    all_slow: bool = Field(description="every judged rank of the node is a straggler")
    straggler_ranks: list[int] = Field(description=f"at most {MAX_MEMBERS_LISTED}")
    median_ratio: float | None = Field(default=None, description="median ratio of its stragglers")
    action: str


class GroupAggregate(Model):
    kind: Literal["tp", "dp", "pp"] = Field(description="tp: a tensor-parallel group, dp, pp likewise")
    label: str = Field(description="the coordinates it shares, e.g. 'tp group (dp=1, pp=0)'")
    ranks: list[int] = Field(description=f"its ranks, at most {MAX_MEMBERS_LISTED}")
    size: int
    stragglers: list[int]
    all_slow: bool
    nodes: list[str] = Field(default_factory=list, description="the nodes its ranks run on, when known")
    note: str


class StageAggregate(Model):
    stage: int
    ranks: int
    ratio: float | None = Field(description="the stage's median over the fleet's median (per step, then median)")
    imbalanced: bool = Field(description="ratio >= 1 + min_slowdown: the stage is slower on all its ranks")
    stragglers: int
    note: str


class TogetherChange(Model):
    """Ranks whose change points coincide: within tolerance_iterations of the first of them."""

    ranks: list[int] = Field(description=f"at most {MAX_RANK_IDS_LISTED}")
    ranks_total: int
    first_step: int = Field(description="the earliest of their change points")
    last_step: int = Field(description="the latest of their change points")
    tolerance_iterations: int = Field(description="max(change_iterations, stride)")


class JobSlowdown(Model):
    """The whole job's step time changed (a change point in the per-step median over ranks), and where the added
    time went: the ranks' own work (compute_s) or the rest of the step (step_time_s - compute_s: what follows the own
    work, the backward pass and the gradient all-reduce, and the wait for the others)."""

    change_point: ChangePoint = Field(description="of the job's step time: the per-step median over ranks")
    own_work_ratio: float | None = Field(
        default=None, description="the ranks' own work (per step, median over ranks that are not stragglers) over its "
        "baseline, median over the same steps"
    )  # fmt: skip
    rest_ratio: float | None = Field(default=None, description="the rest of the step likewise")
    own_work_share: float | None = Field(
        default=None, description="of the time the step gained, the share the own work gained (0..1)"
    )
    attribution: JobAttribution = Field(
        description="stragglers: slow ranks make the others wait; compute: every rank's own work slowed; "
        "communication: the own work did not, the rest of the step did (a slow link, NIC or switch); unknown: no "
        "compute_s to tell"
    )
    action: str


class StragglerReport(Model):
    verdict: Literal["stragglers", "likely_stragglers", "no_stragglers", "not_enough_steps"]
    summary: str
    first_action: str
    signal: Signal
    signal_reason: str
    rows: int
    ranks: int
    steps: int = Field(description="distinct steps in the rows")
    steps_scored: int = Field(description="steps at which at least one rank could be compared with its peers")
    stride: int = Field(description="iterations between logged steps (median gap); each row covers this many")
    counts: dict[str, int] = Field(description="ranks per verdict; they add up to ranks")
    fleet_median_s: float | None = None
    fleet_change_point: ChangePoint | None = Field(
        default=None, description="a change point in the job's per-step median: the whole job slowed"
    )
    changed_together: TogetherChange | None = Field(
        default=None, description="slowed ranks (at least 2 and half the judged) whose change points coincide"
    )
    job_slowdown: JobSlowdown | None = Field(
        default=None, description="the job's step time changed, and where the added time went"
    )
    stragglers: list[RankEvidence] = Field(default_factory=list, description="slowest first")
    stragglers_omitted: int = 0
    likely_stragglers: list[RankEvidence] = Field(
        default_factory=list,
        description="slower than its peers since its own change point, which came first, but not beyond their noise",
    )
    likely_stragglers_omitted: int = 0
    was_slow: list[RankEvidence] = Field(default_factory=list)
    was_slow_omitted: int = 0
    slowed: list[RankEvidence] = Field(default_factory=list)
    slowed_omitted: int = 0
    not_enough_steps_ranks: list[int] = Field(default_factory=list)
    not_enough_steps_omitted: int = 0
    nodes_total: int = 0
    nodes: list[NodeAggregate] = Field(default_factory=list, description="nodes with a straggler, all-slow first")
    nodes_omitted: int = 0
    groups: list[GroupAggregate] = Field(default_factory=list, description="parallel groups with a straggler")
    groups_omitted: int = 0
    stages: list[StageAggregate] = Field(default_factory=list, description="pipeline stages, when pp > 1")
    layout: Layout | None = None
    parameters: StragglerParams
    method: list[str]
    warnings: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _counts_add_up(self) -> StragglerReport:
        if set(self.counts) != set(VERDICTS) or sum(self.counts.values()) != self.ranks:
            raise ValueError(f"verdict counts {self.counts} do not add up to {self.ranks} ranks")
        for verdict, listed, omitted in (
            ("straggler", self.stragglers, self.stragglers_omitted),
            ("likely_straggler", self.likely_stragglers, self.likely_stragglers_omitted),
            ("was_slow", self.was_slow, self.was_slow_omitted),
            ("slowed", self.slowed, self.slowed_omitted),
        ):
            if len(listed) + omitted != self.counts[verdict] or any(e.verdict != verdict for e in listed):
                raise ValueError(f"the {verdict} list does not match its count")
        if len(self.not_enough_steps_ranks) + self.not_enough_steps_omitted != self.counts["not_enough_steps"]:
            raise ValueError("the not_enough_steps list does not match its count")
        if self.verdict == "stragglers" and not self.counts["straggler"]:
            raise ValueError("verdict stragglers without a straggler")
        if self.verdict == "likely_stragglers" and (self.counts["straggler"] or not self.counts["likely_straggler"]):
            raise ValueError("verdict likely_stragglers needs a likely straggler and no confirmed one")
        return self


# ---------------------------------------------------------------------------------------------------------------------
# reading rows


@dataclass
class _Table:
    rank: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    step_time: list[float] = field(default_factory=list)
    compute: list[float | None] = field(default_factory=list)
    comm: list[float | None] = field(default_factory=list)
    node_of: dict[int, str] = field(default_factory=dict)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_seconds(value: Any, name: str, where: str, *, positive: bool) -> tuple[float | None, str | None]:
    rule = "> 0" if positive else ">= 0"
    accepted = f"accepted: a finite number of seconds {rule} (at most {MAX_SECONDS:g})"
    if not _is_number(value):
        return None, f"{where}.{name}: got {given(value)}; {accepted}"
    number = float(value)
    if not math.isfinite(number):
        return None, f"{where}.{name}: got {number} (not a finite number); {accepted}"
    if number < 0 or (positive and number == 0):
        return None, f"{where}.{name}: got {number:g} ({'negative' if number < 0 else 'zero'}); {accepted}"
    if number > MAX_SECONDS:
        return None, f"{where}.{name}: got {number:g} (too large: seconds, not milliseconds?); {accepted}"
    return number, None


def _read_rows(rows: Sequence[Any]) -> _Table:
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise InputError(f"rows: got {given(rows)}; accepted: a list of rows, each {ROW_ACCEPTED}")
    if not rows:
        raise InputError(f"rows: the list is empty; accepted: a list of rows, each {ROW_ACCEPTED}")
    if len(rows) > MAX_ROWS:
        raise InputError(f"rows: {len(rows)} rows; at most {MAX_ROWS} are accepted (give fewer steps or ranks)")
    table = _Table()
    problems: list[str] = []
    seen: dict[tuple[int, int], int] = {}
    for i, raw in enumerate(rows):
        if len(problems) >= MAX_PROBLEMS:
            problems.append(f"stopped after {MAX_PROBLEMS} problems (rows[{i}] onwards not checked)")
            break
        where = f"rows[{i}]"
        row = raw.model_dump(exclude_none=True) if isinstance(raw, StepRow) else raw
        if not isinstance(row, Mapping):
            problems.append(f"{where}: got {given(row)}; accepted: {ROW_ACCEPTED}")
            continue
        unknown = [str(k) for k in row if k not in ROW_FIELDS]
        if unknown:
            problems.append(f"{where}.{clip_str(unknown[0], 40)}: unknown field; accepted: {', '.join(ROW_FIELDS)}")
            continue
        missing = [k for k in ("rank", "step", "step_time_s") if row.get(k) is None]
        if missing:
            problems.append(f"{where}.{missing[0]}: required field missing; accepted: {ROW_ACCEPTED}")
            continue
        rank, step = row["rank"], row["step"]
        if not _is_int(rank) or not 0 <= rank < MAX_RANKS:
            problems.append(f"{where}.rank: got {given(rank)}; accepted: an integer from 0 to {MAX_RANKS - 1}")
            continue
        if not _is_int(step) or not 0 <= step <= MAX_STEP:
            problems.append(f"{where}.step: got {given(step)}; accepted: an integer from 0 to {MAX_STEP}")
            continue
        step_time, problem = _check_seconds(row["step_time_s"], "step_time_s", where, positive=True)
        if problem:
            problems.append(problem)
            continue
        extras: dict[str, float | None] = {}
        problem = None
        for name in ("compute_s", "comm_s"):
            value = row.get(name)
            if value is None:
                extras[name] = None
                continue
            extras[name], problem = _check_seconds(value, name, where, positive=False)
            if problem:
                problems.append(problem)
                break
        if problem:
            continue
        node = row.get("node")
        if node is not None:
            if not isinstance(node, str) or not node.strip() or len(node) > MAX_STR:
                problems.append(f"{where}.node: got {given(node)}; accepted: a node name of 1 to {MAX_STR} characters")
                continue
            known = table.node_of.setdefault(rank, node)
            if known != node:
                problems.append(f"{where}.node: rank {rank} is on {known!r} in an earlier row, here on {node!r}")
                continue
        key = (rank, step)
        first = seen.setdefault(key, i)
        if first != i:
            problems.append(
                f"{where}: duplicate (rank {rank}, step {step}), first at rows[{first}]; accepted: one row per rank "
                "and step"
            )
            continue
        table.rank.append(rank)
        table.step.append(step)
        table.step_time.append(step_time)  # type: ignore[arg-type]
        table.compute.append(extras["compute_s"])
        table.comm.append(extras["comm_s"])
    if problems:
        raise InputError("; ".join(problems))
    return table


def parse_rows_text(text: str) -> list[dict[str, Any]]:
    """Rows from pasted text: a JSON list of objects, JSON lines, or CSV with a header (see TEXT_ACCEPTED)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"the rows text is empty; {TEXT_ACCEPTED}")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"the rows text is {len(text)} characters; at most {MAX_TEXT_CHARS} are read")
    body = text.lstrip("\ufeff \t\r\n")
    if body.startswith("["):
        try:
            rows = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"the rows text starts with '[' but is not valid JSON ({exc}); {TEXT_ACCEPTED}") from None
        if not isinstance(rows, list):
            raise InputError(f"the JSON is not a list of row objects; {TEXT_ACCEPTED}")
        return rows
    if body.startswith("{"):
        rows = []
        for number, line in enumerate(body.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError):
                raise InputError(f"line {number} is not a JSON object; {TEXT_ACCEPTED}") from None
        return rows
    reader = csv.reader(io.StringIO(body))
    try:
        header = [h.strip() for h in next(reader)]
    except (StopIteration, csv.Error):
        raise InputError(f"no header row; {TEXT_ACCEPTED}") from None
    unknown = [h for h in header if h not in ROW_FIELDS]
    if unknown or not {"rank", "step", "step_time_s"} <= set(header):
        raise InputError(
            f"the CSV header {', '.join(header[:8])!r} must name rank, step and step_time_s (and optionally node, "
            f"compute_s, comm_s), nothing else; {TEXT_ACCEPTED}"
        )
    rows = []
    try:
        for number, cells in enumerate(reader, start=2):
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise InputError(f"CSV line {number} has {len(cells)} cells, the header {len(header)}")
            row: dict[str, Any] = {}
            for name, cell in zip(header, cells, strict=True):
                cell = cell.strip()
                if not cell:
                    continue
                if name == "node":
                    row[name] = cell
                elif name in ("rank", "step"):
                    row[name] = int(cell) if cell.lstrip("-").isdigit() and len(cell) < 20 else cell
                else:
                    try:
                        row[name] = float(cell)
                    except ValueError:
                        row[name] = cell
            rows.append(row)
    except csv.Error as exc:
        raise InputError(f"the CSV could not be read ({exc}); {TEXT_ACCEPTED}") from None
    return rows


def load_rows(text: str, *, ranks_per_node: int | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows from text of either kind: straggler rows (see parse_rows_text), or a job's metrics JSON lines as the
    bundled recipes write them (objects with rank_step_s; see rows_from_metrics). Returns (rows, warnings)."""
    rows = parse_rows_text(text)
    if any(isinstance(r, Mapping) and "rank_step_s" in r for r in rows[:1000]):
        return rows_from_metrics(rows, ranks_per_node=ranks_per_node)
    if ranks_per_node is not None:
        raise InputError("ranks_per_node applies to a job's metrics (rank_step_s lists); these rows name their node")
    return rows, []


def rows_from_metrics(
    metrics_rows: Iterable[Mapping[str, Any]], *, ranks_per_node: int | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Straggler rows from a job's metrics rows as the bundled recipes write them: each train row's ``rank_step_s``
    (list by rank) is step_time_s and ``rank_work_s`` compute_s (``rank_comm_s`` comm_s, where a script logs it).
    With ranks_per_node, rank r runs on "node{r // ranks_per_node}" (torchrun's placement). A step logged twice (a
    resumed run logs the steps after its checkpoint again) keeps the later row. Returns (rows, warnings)."""
    if ranks_per_node is not None and (not _is_int(ranks_per_node) or not 1 <= ranks_per_node <= MAX_RANKS):
        raise InputError(f"ranks_per_node: got {given(ranks_per_node)}; accepted: an integer from 1 to {MAX_RANKS}")
    by_step: dict[int, Mapping[str, Any]] = {}
    repeated = skipped_cells = without = bad_lists = 0
    for row in metrics_rows:
        if not isinstance(row, Mapping) or row.get("split") not in (None, "train"):
            continue
        step = row.get("step")
        if not _is_int(step) or step < 0:
            continue
        if not isinstance(row.get("rank_step_s"), list):
            without += 1
            continue
        if step in by_step:
            repeated += 1
        by_step[step] = row
    out: list[dict[str, Any]] = []
    for step in sorted(by_step):
        row = by_step[step]
        step_s = row["rank_step_s"]
        work = row.get("rank_work_s")
        comm = row.get("rank_comm_s")
        work = work if isinstance(work, list) and len(work) == len(step_s) else None
        comm = comm if isinstance(comm, list) and len(comm) == len(step_s) else None
        if len(step_s) > MAX_RANKS:
            bad_lists += 1
            continue
        for rank, value in enumerate(step_s):
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                skipped_cells += 1
                continue
            cell: dict[str, Any] = {"rank": rank, "step": step, "step_time_s": float(value)}
            if work is not None:
                w = work[rank]
                if not _is_number(w) or not math.isfinite(w) or w < 0:
                    skipped_cells += 1
                    continue
                cell["compute_s"] = float(w)
            if comm is not None and _is_number(comm[rank]) and math.isfinite(comm[rank]) and comm[rank] >= 0:
                cell["comm_s"] = float(comm[rank])
            if ranks_per_node is not None:
                cell["node"] = f"node{rank // ranks_per_node}"
            out.append(cell)
    warnings = []
    if repeated:
        warnings.append(f"{repeated} step(s) were logged more than once (a resumed run?): the later row was kept")
    if skipped_cells:
        warnings.append(f"{skipped_cells} rank time(s) were null, non-finite or not positive and were left out")
    if bad_lists:
        warnings.append(f"{bad_lists} row(s) list more than {MAX_RANKS} ranks and were left out")
    if not out:
        reason = (
            f"{without} train row(s) have no rank_step_s"
            if without
            else "no train rows with per-rank times (rank_step_s, rank_work_s)"
        )
        raise InputError(
            f"the metrics hold no per-rank step times: {reason}; the bundled recipes log them (tiny-gpt, tiny-grpo); "
            "another script must log rank_step_s (and rank_work_s) as lists indexed by rank"
        )
    return out, warnings


# ---------------------------------------------------------------------------------------------------------------------
# numerics


def _row_median(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the median of the values that are not NaN (NaN for a row without any), and their count."""
    import numpy as np

    count = np.sum(~np.isnan(a), axis=1)
    ordered = np.sort(a, axis=1)  # NaN sorts last
    rows = np.arange(a.shape[0])
    lo = np.clip((count - 1) // 2, 0, None)
    hi = np.clip(count // 2, 0, None)
    if a.shape[1] == 0:
        return np.full(a.shape[0], np.nan), count
    median = (ordered[rows, lo] + ordered[rows, hi]) / 2.0
    median[count == 0] = np.nan
    return median, count


def _median_mad(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import numpy as np

    median, count = _row_median(a)
    mad, _ = _row_median(np.abs(a - median[:, None]))
    return median, mad, count


def _finite_median(values: np.ndarray) -> float | None:
    import numpy as np

    values = values[~np.isnan(values)]
    return float(np.median(values)) if values.size else None


def _jitter(sig: np.ndarray, step_median: np.ndarray) -> float:
    """The job's step-to-step noise, as a MAD in relative units: median |d log(t / step median)| / sqrt(2) over every
    rank's consecutive steps (dividing by the step's median removes what all ranks share; a rank's one-off level
    shift is a single difference and does not move the median). 0 with fewer than MIN_JITTER_DIFFS differences."""
    import numpy as np

    if sig.shape[0] < 2:
        return 0.0
    relative = np.log(sig / step_median[:, None])
    diffs = np.abs(np.diff(relative, axis=0))
    diffs = diffs[np.isfinite(diffs)]
    if diffs.size < MIN_JITTER_DIFFS:
        return 0.0
    return float(np.median(diffs)) / math.sqrt(2.0)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) inclusive of each run of True."""
    import numpy as np

    padded = np.concatenate(([0], mask.astype(np.int8), [0]))
    edges = np.diff(padded)
    starts = np.nonzero(edges == 1)[0]
    ends = np.nonzero(edges == -1)[0] - 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _change_point(
    values: np.ndarray, steps: np.ndarray, stride: int, params: StragglerParams
) -> tuple[ChangePoint | None, bool]:
    """The Greyhound rule on one series (in step order): (the first change point or None, whether the series is long
    enough to tell)."""
    import numpy as np

    if values.size < 2:
        return None, False
    gaps = np.diff(steps)
    cover = np.concatenate(([stride], np.minimum(gaps, stride))).astype(np.int64)
    covered = np.cumsum(cover)
    # Observations in the baseline: those covering the first change_iterations iterations, and at least
    # MIN_BASELINE_ROWS, so that when one row covers that many (a row every 10 steps) a warm-up row does not set it.
    prefix = max(int(np.searchsorted(covered, params.change_iterations)) + 1, MIN_BASELINE_ROWS)
    if values.size - prefix < MIN_RUN_ROWS or covered[-1] - covered[prefix - 1] < params.change_iterations:
        return None, False
    baseline = float(np.median(values[:prefix]))
    if baseline <= 0:
        return None, True
    slow = values[prefix:] >= (1.0 + params.change_slowdown) * baseline
    for start, end in _runs(slow):
        a, b = prefix + start, prefix + end
        iterations = int(cover[a : b + 1].sum())
        if iterations >= params.change_iterations and b - a + 1 >= MIN_RUN_ROWS:
            run_median = float(np.median(values[a : b + 1]))
            return (
                ChangePoint(
                    since_step=int(steps[a] - cover[a] + 1),
                    until_step=int(steps[b]),
                    iterations=iterations,
                    baseline_s=baseline,
                    median_s=run_median,
                    ratio=run_median / baseline,
                    ongoing=b == values.size - 1,
                ),
                True,
            )
    return None, True


# ---------------------------------------------------------------------------------------------------------------------
# detection


def _coordinates(layout: Layout, ranks: list[int]) -> tuple[Layout, dict[int, dict[str, int]]]:
    world = len(ranks)
    dp = layout.dp if layout.dp is not None else world // (layout.tp * layout.pp)
    if layout.tp * layout.pp * dp != world or ranks != list(range(world)):
        raise InputError(
            f"layout: tp={layout.tp} x pp={layout.pp} x dp={layout.dp if layout.dp is not None else dp} does not "
            f"match the rows' {world} ranks ({ranks[0]}..{ranks[-1]}); accepted: sizes whose product is the number "
            "of ranks, and rows for every rank 0..N-1"
        )
    layout = layout.model_copy(update={"dp": dp})
    sizes = {"tp": layout.tp, "pp": layout.pp, "dp": dp}
    coords: dict[int, dict[str, int]] = {}
    for rank in ranks:
        rest = rank
        where: dict[str, int] = {}
        for dim in layout.dims():
            where[dim] = rest % sizes[dim]
            rest //= sizes[dim]
        coords[rank] = {"tp": where["tp"], "dp": where["dp"], "pp": where["pp"]}
    return layout, coords


def _peer_reference(
    matrix: np.ndarray, peer_groups: list[list[int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Per cell: its peers' median and MAD at that step, and whether it can be scored; and method notes."""
    import numpy as np

    median = np.full(matrix.shape, np.nan)
    mad = np.full(matrix.shape, np.nan)
    scorable = np.zeros(matrix.shape, dtype=bool)
    notes: set[str] = set()
    present = ~np.isnan(matrix)
    for columns in peer_groups:
        block = matrix[:, columns]
        if len(columns) <= LOO_MAX_RANKS:
            notes.add("leave-one-out (each rank against the median and MAD of its other peers)")
            for j, column in enumerate(columns):
                others = np.delete(block, j, axis=1)
                m, d, n = _median_mad(others)
                small = n < SMALL_GROUP_PEERS
                if small.any():
                    notes.add(
                        f"with fewer than {SMALL_GROUP_PEERS} peers the MAD is floored at {SMALL_GROUP_MAD_FLOOR:g} x "
                        "median as well (so few peers show no spread between ranks)"
                    )
                    d = np.where(small, np.fmax(d, SMALL_GROUP_MAD_FLOOR * m), d)
                median[:, column], mad[:, column] = m, d
                scorable[:, column] = present[:, column] & (n >= 1)
        else:
            notes.add("all peers (median and MAD of every rank of the step, itself included)")
            m, d, n = _median_mad(block)
            median[:, columns] = m[:, None]
            mad[:, columns] = d[:, None]
            scorable[:, columns] = present[:, columns] & (n >= 3)[:, None]
    return median, mad, scorable, sorted(notes)


def _stretch(flags: np.ndarray, window: int, minimum: int, *, at_end: bool) -> tuple[int, int] | None:
    """(first, last) index of the slow stretch: the trailing windows that hold >= minimum flags (at_end), or the last
    such stretch anywhere; first and last are flagged observations. None when no window holds enough."""
    import numpy as np

    counts = np.convolve(flags.astype(np.int64), np.ones(window, dtype=np.int64), mode="valid")
    good = counts >= minimum
    if at_end:
        if not good[-1]:
            return None
        last_window = good.size - 1
    else:
        hits = np.nonzero(good)[0]
        if hits.size == 0:
            return None
        last_window = int(hits[-1])
    first_window = last_window
    while first_window > 0 and good[first_window - 1]:
        first_window -= 1
    window_flags = np.nonzero(flags[first_window : first_window + window])[0]
    first = first_window + int(window_flags[0])
    tail_flags = np.nonzero(flags[last_window : last_window + window])[0]
    last = last_window + int(tail_flags[-1])
    return first, last


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _fmt(value: float | None, digits: int = 2) -> str:
    return "?" if value is None else f"{value:.{digits}f}"


@dataclass
class _Scores:
    """Everything the verdicts are made from: matrices are steps x ranks, NaN where a rank logged nothing."""

    ranks: list[int]
    steps: np.ndarray
    signal: Signal
    reason: str
    stride: int
    sig: np.ndarray
    step_time: np.ndarray
    peers_median: np.ndarray  # per cell: the median of its peers at that step
    peers_mad: np.ndarray
    z: np.ndarray
    scorable: np.ndarray
    flagged: np.ndarray
    step_median: np.ndarray  # per step: the median of every rank
    jitter: float
    compute: np.ndarray | None
    compute_peers: np.ndarray | None
    comm: np.ndarray | None
    comm_peers: np.ndarray | None
    peers_text: str
    reference_notes: list[str]


def _choose_signal(table: _Table, signal: SignalChoice, notes: list[str]) -> tuple[Signal, str]:
    total = len(table.rank)
    with_compute = sum(v is not None for v in table.compute)
    if signal == "compute_s":
        if with_compute != total:
            raise InputError(
                f"signal: compute_s was asked for but {total - with_compute} of {total} rows have no compute_s; "
                "accepted: auto or step_time_s, or rows that all carry compute_s"
            )
        return "compute_s", "compute_s, as asked"
    if signal == "step_time_s":
        return "step_time_s", "step_time_s, as asked"
    if with_compute == total:
        return "compute_s", (
            "compute_s (every row has it): a rank's own work, before it waits for the others; in synchronised "
            "training every rank's step time is the slowest rank's"
        )
    if with_compute:
        notes.append(f"only {with_compute} of {total} rows have compute_s: the step times were compared instead")
    return "step_time_s", "step_time_s (compute_s is not in every row)"


def _score(
    table: _Table,
    signal: SignalChoice,
    params: StragglerParams,
    coords: dict[int, dict[str, int]] | None,
    layout: Layout | None,
    notes: list[str],
) -> _Scores:
    import numpy as np

    ranks = sorted(set(table.rank))
    steps = sorted(set(table.step))
    if len(ranks) * len(steps) > MAX_CELLS:
        raise InputError(
            f"rows: {len(steps)} distinct steps x {len(ranks)} ranks = {len(steps) * len(ranks)} cells; at most "
            f"{MAX_CELLS} are accepted (give a range of steps, or every k-th step)"
        )
    chosen, reason = _choose_signal(table, signal, notes)
    step_arr = np.asarray(steps, dtype=np.int64)
    rank_arr = np.asarray(ranks, dtype=np.int64)
    at_row = np.searchsorted(step_arr, np.asarray(table.step, dtype=np.int64))
    at_col = np.searchsorted(rank_arr, np.asarray(table.rank, dtype=np.int64))

    def matrix_of(values: Sequence[float | None]) -> np.ndarray | None:
        if all(v is None for v in values):
            return None
        out = np.full((len(steps), len(ranks)), np.nan)
        out[at_row, at_col] = np.asarray([np.nan if v is None else v for v in values], dtype=float)
        return out

    step_m = matrix_of(table.step_time)
    compute_m = matrix_of(table.compute)
    comm_m = matrix_of(table.comm)
    sig = compute_m if chosen == "compute_s" else step_m
    assert sig is not None and step_m is not None
    gaps = np.diff(step_arr)
    stride = max(1, int(np.median(gaps))) if gaps.size else 1

    if layout is not None and coords is not None and layout.pp > 1:
        by_stage: dict[int, list[int]] = {}
        for column, rank in enumerate(ranks):
            by_stage.setdefault(coords[rank]["pp"], []).append(column)
        peer_groups = [by_stage[s] for s in sorted(by_stage)]
        peers_text = "the other ranks of its pipeline stage at the same step"
    else:
        peer_groups = [list(range(len(ranks)))]
        peers_text = "the other ranks at the same step"

    with np.errstate(invalid="ignore", divide="ignore"):
        peers_median, peers_mad, scorable, reference_notes = _peer_reference(sig, peer_groups)
        step_median, _ = _row_median(sig)
        jitter = _jitter(sig, step_median)
        floor = max(params.mad_floor, jitter)
        scale = MAD_TO_SIGMA * np.maximum(np.maximum(peers_mad, floor * peers_median), ABS_MAD_FLOOR_S)
        z = (sig - peers_median) / scale
        flagged = scorable & (z > params.z_threshold) & (sig >= (1.0 + params.min_slowdown) * peers_median)
        compute_peers = _peer_reference(compute_m, peer_groups)[0] if compute_m is not None else None
        comm_peers = _peer_reference(comm_m, peer_groups)[0] if comm_m is not None else None
    return _Scores(
        ranks=ranks,
        steps=step_arr,
        signal=chosen,
        reason=reason,
        stride=stride,
        sig=sig,
        step_time=step_m,
        peers_median=peers_median,
        peers_mad=peers_mad,
        z=z,
        scorable=scorable,
        flagged=flagged,
        step_median=step_median,
        jitter=jitter,
        compute=compute_m,
        compute_peers=compute_peers,
        comm=comm_m,
        comm_peers=comm_peers,
        peers_text=peers_text,
        reference_notes=reference_notes,
    )


def _first_iteration(steps: np.ndarray, index: int, stride: int) -> int:
    """The first iteration a row covers: a row every k steps averages the k iterations up to its step."""
    previous = int(steps[index - 1]) if index > 0 else int(steps[index]) - stride
    return int(steps[index]) - min(int(steps[index]) - previous, stride) + 1


def _median_ratio(values: np.ndarray, reference: np.ndarray) -> float | None:
    """median(values) / median(reference) over the cells where both are known."""
    import numpy as np

    known = ~np.isnan(values) & ~np.isnan(reference)
    if not known.any():
        return None
    return _ratio(float(np.median(values[known])), float(np.median(reference[known])))


def _judge(
    s: _Scores, column: int, params: StragglerParams, node: str | None, coordinates: dict[str, int] | None
) -> tuple[Verdict, RankEvidence | None]:
    """One rank's verdict, and its evidence when it is not ok / not_enough_steps."""
    import numpy as np

    rank = s.ranks[column]
    scored = np.nonzero(s.scorable[:, column])[0]
    flags = s.flagged[scored, column]
    present = np.nonzero(~np.isnan(s.sig[:, column]))[0]
    change, _ = _change_point(s.sig[present, column], s.steps[present], s.stride, params)
    enough = scored.size >= params.window
    stretch = _stretch(flags, params.window, params.min_flagged, at_end=True) if enough else None
    verdict: Verdict = "straggler"
    if stretch is None and enough:
        stretch = _stretch(flags, params.window, params.min_flagged, at_end=False)
        verdict = "was_slow"
    if stretch is None:
        if change is not None:
            verdict = "slowed"
        else:
            return ("ok" if enough else "not_enough_steps"), None

    if stretch is not None:
        first, last = stretch
        cells = scored[first : last + 1]
        since, until = _first_iteration(s.steps, int(cells[0]), s.stride), int(s.steps[cells[-1]])
        # The persistence stretch starts at the first slow step of its first window, a window's worth of
        # uncertainty; a change point within that distance dates the start more precisely.
        if change is not None and abs(change.since_step - since) <= params.window * s.stride:
            since = change.since_step
            cells = scored[(s.steps[scored] >= since) & (s.steps[scored] <= until)]
    else:
        assert change is not None
        since, until = change.since_step, change.until_step
        cells = present[(s.steps[present] >= since) & (s.steps[present] <= until)]
    own = s.sig[cells, column]
    peers = s.peers_median[cells, column]
    rank_median = _finite_median(own)
    peers_median = _finite_median(peers)
    zs = s.z[cells, column]
    zs = zs[np.isfinite(zs)]
    compute_ratio = comm_ratio = None
    if s.compute is not None and s.compute_peers is not None:
        compute_ratio = _median_ratio(s.compute[cells, column], s.compute_peers[cells, column])
    if s.comm is not None and s.comm_peers is not None:
        comm_ratio = _median_ratio(s.comm[cells, column], s.comm_peers[cells, column])
    attribution: Attribution = "unknown"
    if s.compute is not None and s.comm is not None and s.compute_peers is not None and s.comm_peers is not None:
        compute_excess = (_finite_median(s.compute[cells, column]) or 0.0) - (
            _finite_median(s.compute_peers[cells, column]) or 0.0
        )
        comm_excess = (_finite_median(s.comm[cells, column]) or 0.0) - (
            _finite_median(s.comm_peers[cells, column]) or 0.0
        )
        if max(compute_excess, comm_excess) > 0:
            attribution = "compute" if compute_excess >= comm_excess else "communication"
    elif s.signal == "compute_s":
        attribution = "compute"
    evidence = RankEvidence(
        rank=rank,
        node=node,
        verdict=verdict,
        median_s=rank_median,
        fleet_median_s=peers_median,
        ratio=_ratio(rank_median, peers_median),
        since_step=since,
        until_step=until,
        flagged_in_last_window=int(flags[-params.window :].sum()),
        steps_flagged=int(flags.sum()),
        steps_scored=int(scored.size),
        max_z=float(zs.max()) if zs.size else None,
        median_z=float(np.median(zs)) if zs.size else None,
        compute_ratio=compute_ratio,
        comm_ratio=comm_ratio,
        attribution=attribution,
        change_point=change,
        coordinates=coordinates,
        action="",
    )
    return verdict, evidence


def _node_aggregates(
    ranks: list[int], node_of: dict[int, str], verdicts: dict[int, Verdict], evidence: dict[int, RankEvidence]
) -> tuple[list[NodeAggregate], int]:
    import numpy as np

    members_of: dict[str, list[int]] = {}
    for rank in ranks:
        if rank in node_of:
            members_of.setdefault(node_of[rank], []).append(rank)
    nodes: list[NodeAggregate] = []
    for node, members in members_of.items():
        judged = [r for r in members if verdicts[r] != "not_enough_steps"]
        slow = [r for r in members if verdicts[r] == "straggler"]
        if not slow:
            continue
        all_slow = len(slow) == len(judged)
        ratios = [evidence[r].ratio for r in slow if evidence[r].ratio is not None]
        median_ratio = float(np.median(ratios)) if ratios else None
        if all_slow and len(members) > 1:
            action = (
                f"Drain node {node}: all its {len(members)} ranks are slow ({_fmt(median_ratio)}x their peers), so "
                "the cause is the host (CPU, memory, PCIe, cooling, power or its NIC), not one GPU; run triage_node "
                "on it and restart the job without it."
            )
        elif all_slow:
            action = (
                f"Drain node {node}: its only rank is slow ({_fmt(median_ratio)}x its peers); with one rank per node "
                "the GPU and the host cannot be told apart: run triage_node on it."
            )
        else:
            action = (
                f"{len(slow)} of {len(members)} ranks of node {node} are slow: a GPU-level cause, not the host (see "
                "each rank's action); run triage_node on the node."
            )
        nodes.append(
            NodeAggregate(
                node=node,
                ranks=len(members),
                ranks_judged=len(judged),
                stragglers=len(slow),
                all_slow=all_slow,
                straggler_ranks=slow[:MAX_MEMBERS_LISTED],
                median_ratio=median_ratio,
                action=action,
            )
        )
    nodes.sort(key=lambda n: (not n.all_slow, -n.stragglers, n.node))
    return nodes, len(members_of)


def _group_aggregates(
    layout: Layout, coords: dict[int, dict[str, int]], node_of: dict[int, str], verdicts: dict[int, Verdict]
) -> list[GroupAggregate]:
    sizes = {"tp": layout.tp, "dp": layout.dp or 1, "pp": layout.pp}
    groups: list[GroupAggregate] = []
    for kind in ("tp", "dp", "pp"):
        if sizes[kind] < 2:
            continue
        members_of: dict[tuple[tuple[str, int], ...], list[int]] = {}
        for rank in sorted(coords):
            key = tuple((d, coords[rank][d]) for d in ("tp", "dp", "pp") if d != kind)
            members_of.setdefault(key, []).append(rank)
        for key, members in sorted(members_of.items()):
            slow = [r for r in members if verdicts[r] == "straggler"]
            if not slow:
                continue
            judged = [r for r in members if verdicts[r] != "not_enough_steps"]
            all_slow = len(slow) == len(judged)
            on = sorted({node_of[r] for r in members if r in node_of})
            label = f"{kind} group (" + ", ".join(f"{d}={i}" for d, i in key) + ")"
            if kind == "tp" and all_slow:
                note = (
                    "every rank of this tensor-parallel group is slow: TP ranks wait for each other inside every "
                    "layer, so one slow GPU or a slow NVLink among them slows them all; look on "
                    + (", ".join(on[:8]) if on else "their nodes")
                    + " (triage_node, nvidia-smi nvlink -e)"
                )
            elif kind == "pp" and all_slow:
                note = "every stage of this pipeline is slow: the path its stages share (nodes, network) is suspect"
            elif all_slow:
                note = f"every rank of this {kind} group is slow"
            else:
                note = f"{len(slow)} of {len(members)} ranks slow"
            groups.append(
                GroupAggregate(
                    kind=kind,  # type: ignore[arg-type]
                    label=label,
                    ranks=members[:MAX_MEMBERS_LISTED],
                    size=len(members),
                    stragglers=slow[:MAX_MEMBERS_LISTED],
                    all_slow=all_slow,
                    nodes=on[:MAX_MEMBERS_LISTED],
                    note=note,
                )
            )
    groups.sort(key=lambda g: (not g.all_slow, -len(g.stragglers), g.kind, g.label))
    return groups


def _stage_aggregates(
    s: _Scores, layout: Layout, coords: dict[int, dict[str, int]], verdicts: dict[int, Verdict], params: StragglerParams
) -> list[StageAggregate]:
    import numpy as np

    stages = []
    with np.errstate(invalid="ignore", divide="ignore"):
        for stage in range(layout.pp):
            columns = [c for c, r in enumerate(s.ranks) if coords[r]["pp"] == stage]
            stage_median, _ = _row_median(s.sig[:, columns])
            ratio = _finite_median(stage_median / s.step_median)
            imbalanced = ratio is not None and ratio >= 1.0 + params.min_slowdown
            note = (
                f"stage {stage} is {_fmt(ratio)}x the job's median on all its ranks: the pipeline is imbalanced; "
                "rebalance layers across stages (move layers off this stage)"
                if imbalanced
                else f"stage {stage}: {_fmt(ratio)}x the job's median"
            )
            stages.append(
                StageAggregate(
                    stage=stage,
                    ranks=len(columns),
                    ratio=ratio,
                    imbalanced=imbalanced,
                    stragglers=sum(1 for c in columns if verdicts[s.ranks[c]] == "straggler"),
                    note=note,
                )
            )
    return stages


def _action(
    item: RankEvidence,
    drained: dict[str, NodeAggregate],
    slow_tp: dict[int, GroupAggregate],
    together: set[int] | None = None,
) -> str:
    rank, node = item.rank, item.node
    where = f" on {node}" if node else ""
    if item.verdict == "likely_straggler":
        return (
            f"Likely straggler, not confirmed: rank {rank}{where} slowed first and stays slower than its peers, within "
            "their noise; more steps (or more ranks to compare with) would confirm it. Meanwhile: "
            + _action(item.model_copy(update={"verdict": "straggler"}), drained, slow_tp)
        )
    if item.verdict == "was_slow":
        return (
            f"None now: rank {rank}{where} was slow from step {item.since_step} to {item.until_step} and is not in its "
            "last window; watch it (recurring episodes point at thermal or power throttling)."
        )
    if item.verdict == "slowed":
        if together is not None and rank in together:
            return (
                f"None for this rank alone: it slowed against its own baseline from step {item.since_step} together "
                "with the others (see changed_together and fleet_change_point)."
            )
        return (
            f"None for this rank alone: it slowed against its own baseline from step {item.since_step}, not together "
            "with the others and not beyond its peers; watch it."
        )
    if node is not None and node in drained:
        return drained[node].action
    if rank in slow_tp:
        return f"{slow_tp[rank].label}: {slow_tp[rank].note}."
    if item.attribution == "compute":
        return (
            f"Rank {rank}{where} is compute-bound: its own work is {_fmt(item.compute_ratio or item.ratio)}x its "
            "peers'; its GPU (or the CPU and data loading feeding it) is slow: check clocks, temperature and power "
            f"(triage_node{' on ' + node if node else ''}), then replace or exclude it, or give it less work "
            "(rebalance) until then."
        )
    if item.attribution == "communication":
        return (
            f"Rank {rank}{where} is communication-bound: it spends {_fmt(item.comm_ratio)}x its peers' time in "
            "communication; check its NIC and links (check_collective_bandwidth on its node, plan_network_probes "
            "and localize_network_fault)."
        )
    return (
        f"Rebalance: give rank {rank}{where} less work or move it to another GPU ({_fmt(item.ratio)}x its peers' "
        "median); log compute_s and comm_s per rank to tell compute from communication."
    )


def _validated(model: type[M], value: Any, name: str) -> M:
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        schema = model.model_json_schema()
        lines = validation_problems(exc.errors(), value, schema, root=name)
        raise InputError(
            "; ".join(f"{name}: {line}" if not line.startswith(name) else line for line in lines)
        ) from None


def _ranks_text(ranks: Sequence[int], limit: int = 8) -> str:
    """Sorted ranks as ranges ("0-7, 9"), at most `limit` ranges, then how many ranks more."""
    ordered = sorted(ranks)
    spans: list[tuple[int, int]] = []
    for rank in ordered:
        if spans and rank == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], rank)
        else:
            spans.append((rank, rank))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:limit])
    rest = sum(b - a + 1 for a, b in spans[limit:])
    return ("rank " if len(ordered) == 1 else "ranks ") + text + (f" and {rest} more" if rest else "")


def _changes_text(changes: Sequence[tuple[int, int]], limit: int = 8) -> str:
    """(rank, change step) pairs as "rank 0 from step 101, rank 1 from step 131", earliest first, bounded."""
    ordered = sorted(changes, key=lambda rc: (rc[1], rc[0]))
    text = ", ".join(f"rank {r} from step {c}" for r, c in ordered[:limit])
    return text + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def _earliest_group(changes: Mapping[int, int], tolerance: int) -> list[int]:
    """The ranks whose change points lie within `tolerance` iterations of the earliest one."""
    first = min(changes.values())
    return sorted(r for r, c in changes.items() if c <= first + tolerance)


def _together(changes: Mapping[int, int], tolerance: int) -> list[int]:
    """The largest set of ranks whose change points lie within `tolerance` iterations of the first of them (the
    earliest such set on ties)."""
    import bisect

    order = sorted(changes.items(), key=lambda rc: (rc[1], rc[0]))
    values = [c for _, c in order]
    best, best_end = 0, 0
    for i, c in enumerate(values):
        end = bisect.bisect_right(values, c + tolerance)
        if end - i > best_end - best:
            best, best_end = i, end
    return sorted(r for r, _ in order[best:best_end])


def _likely(
    s: _Scores, column: int, item: RankEvidence, params: StragglerParams, next_change: int | None
) -> RankEvidence | None:
    """The rank as a likely straggler, or None: from its change point on (at least `window` scored rows) it was at
    least min_slowdown slower than its peers' median in at least min_flagged of its last `window` rows, and by that
    much over all of them (the median ratio), without the z-score (its peers' noise kept it under z_threshold)."""
    import numpy as np

    change = item.change_point
    if change is None:
        return None
    scored = np.nonzero(s.scorable[:, column])[0]
    cells = scored[s.steps[scored] >= change.since_step]
    if cells.size < params.window:
        return None
    own = s.sig[cells, column]
    peers = s.peers_median[cells, column]
    slower = own >= (1.0 + params.min_slowdown) * peers
    rank_median, peers_median = _finite_median(own), _finite_median(peers)
    ratio = _ratio(rank_median, peers_median)
    if int(slower[-params.window :].sum()) < params.min_flagged or ratio is None or ratio < 1.0 + params.min_slowdown:
        return None
    zs = s.z[cells, column]
    zs = zs[np.isfinite(zs)]
    return item.model_copy(
        update={
            "verdict": "likely_straggler",
            "median_s": rank_median,
            "fleet_median_s": peers_median,
            "ratio": ratio,
            "since_step": change.since_step,
            "until_step": int(s.steps[cells[-1]]),
            "max_z": float(zs.max()) if zs.size else None,
            "median_z": float(np.median(zs)) if zs.size else None,
            "rows_since_change": int(cells.size),
            "rows_slower_since_change": int(slower.sum()),
            "next_change_step": next_change,
        }
    )


def _likely_phrase(e: RankEvidence, params: StragglerParams) -> str:
    change = e.change_point
    assert change is not None
    node = f" ({e.node})" if e.node else ""
    following = (
        f"the next rank's at step {e.next_change_step}" if e.next_change_step is not None else "no other rank changed"
    )
    return (
        f"rank {e.rank}{node} {_fmt(e.ratio)}x its peers since its own change point at step {change.since_step} "
        f"({_fmt(change.ratio)}x its baseline; it came first: {following}), at least {params.min_slowdown:.0%} slower "
        f"than its peers in {e.rows_slower_since_change} of {e.rows_since_change} rows since, but beyond their noise "
        f"(z > {params.z_threshold:g}) in {e.flagged_in_last_window} of its last {params.window} "
        f"({params.min_flagged} needed for a straggler)"
    )


def _straggler_phrase(e: RankEvidence) -> str:
    text = f"rank {e.rank}{' (' + e.node + ')' if e.node else ''} {_fmt(e.ratio)}x its peers since step {e.since_step}"
    change = e.change_point
    if change is not None and change.since_step != e.since_step:
        text += f" ({_fmt(change.ratio)}x its own baseline from step {change.since_step})"
    return text


@dataclass
class _Judged:
    """Each rank's verdict and evidence, and its change point compared with the other ranks'."""

    verdicts: dict[int, Verdict]
    evidence: dict[int, RankEvidence]
    judged_total: int
    tolerance: int  # change points coincide within this many iterations
    changes: dict[int, int]  # rank -> step of its change point
    slowed_changes: dict[int, int]  # the same, of the ranks judged slowed
    together_ranks: list[int]  # the slowed ranks whose change points coincide, when they are half the job


def _judge_ranks(
    s: _Scores, table: _Table, params: StragglerParams, coords: dict[int, dict[str, int]] | None
) -> _Judged:
    """Each rank's verdict, then its change point over time against the other ranks'. They coincide when they lie
    within `tolerance` iterations of the first of them. The ranks of the earliest such group, when it is not most of
    the job, changed first: one that has stayed slower than its peers since is a likely straggler even where its
    peers' noise kept its z-score under the threshold."""
    ranks = s.ranks
    verdicts: dict[int, Verdict] = {}
    evidence: dict[int, RankEvidence] = {}
    for column, rank in enumerate(ranks):
        verdicts[rank], item = _judge(s, column, params, table.node_of.get(rank), coords[rank] if coords else None)
        if item is not None:
            evidence[rank] = item
    judged_total = sum(1 for v in verdicts.values() if v != "not_enough_steps")

    tolerance = max(params.change_iterations, s.stride)
    changes = {
        r: e.change_point.since_step
        for r, e in evidence.items()
        if e.change_point is not None and verdicts[r] != "not_enough_steps"
    }
    if changes and len(ranks) > 1:
        early = _earliest_group(changes, tolerance)
        if not (len(early) >= 2 and 2 * len(early) >= judged_total):
            later = [c for r, c in changes.items() if r not in early]
            next_change = min(later) if later else None
            for rank in early:
                # was_slow: slow beyond the noise earlier; still slower than its peers now, it is not "was" slow
                if verdicts[rank] not in ("slowed", "was_slow"):
                    continue
                likely = _likely(s, ranks.index(rank), evidence[rank], params, next_change)
                if likely is not None:
                    verdicts[rank], evidence[rank] = "likely_straggler", likely
    slowed_changes = {r: c for r, c in changes.items() if verdicts[r] == "slowed"}
    together_ranks = _together(slowed_changes, tolerance) if len(slowed_changes) >= 2 else []
    if not (len(together_ranks) >= 2 and 2 * len(together_ranks) >= judged_total):
        together_ranks = []
    return _Judged(verdicts, evidence, judged_total, tolerance, changes, slowed_changes, together_ranks)


@dataclass
class _Aggregates:
    nodes: list[NodeAggregate]
    nodes_total: int
    groups: list[GroupAggregate]
    stages: list[StageAggregate]


def _aggregate(
    s: _Scores,
    table: _Table,
    layout: Layout | None,
    coords: dict[int, dict[str, int]] | None,
    j: _Judged,
    params: StragglerParams,
    notes: list[str],
) -> _Aggregates:
    """The verdicts by node, by parallel group and by pipeline stage; then each rank's action, which depends on its
    node's and its group's."""
    ranks = s.ranks
    nodes, nodes_total = _node_aggregates(ranks, table.node_of, j.verdicts, j.evidence)
    if nodes_total and len(table.node_of) < len(ranks):
        notes.append(f"{len(ranks) - len(table.node_of)} rank(s) have no node: they are not aggregated to nodes")
    groups: list[GroupAggregate] = []
    stages: list[StageAggregate] = []
    if layout is not None and coords is not None:
        groups = _group_aggregates(layout, coords, table.node_of, j.verdicts)
        if layout.pp > 1:
            stages = _stage_aggregates(s, layout, coords, j.verdicts, params)
    drained = {n.node: n for n in nodes if n.all_slow}
    slow_tp = {r: g for g in groups if g.kind == "tp" and g.all_slow for r in g.ranks}
    for item in j.evidence.values():
        item.action = _action(item, drained, slow_tp, set(j.together_ranks))
    return _Aggregates(nodes, nodes_total, groups, stages)


def _steady_columns(s: _Scores, j: _Judged) -> list[int]:
    """The columns of the ranks that are not slow against their peers (not straggler, likely_straggler, was_slow)."""
    return [c for c, r in enumerate(s.ranks) if j.verdicts[r] not in ("straggler", "likely_straggler", "was_slow")]


def _fleet_change(s: _Scores, j: _Judged, params: StragglerParams) -> ChangePoint | None:
    """The job as a whole: the change point of the per-step median of the ranks that are not slow against their
    peers."""
    import numpy as np

    with np.errstate(invalid="ignore", divide="ignore"):
        steady = _steady_columns(s, j)
        # One steady rank is not a fleet: its own change point is already in its verdict.
        fleet_series = _row_median(s.sig[:, steady])[0] if len(steady) >= 2 else np.full(len(s.steps), np.nan)
    known = np.nonzero(~np.isnan(fleet_series))[0]
    fleet_change, _ = _change_point(fleet_series[known], s.steps[known], s.stride, params)
    return fleet_change


def _job_slowdown(s: _Scores, j: _Judged, params: StragglerParams) -> JobSlowdown | None:
    """A change point in the job's step time (per step, the median over ranks), and where the added time went: into
    the slow ranks (the others wait for them), every rank's own work, or the rest of the step (communication)."""
    import numpy as np

    with np.errstate(invalid="ignore", divide="ignore"):
        series = _row_median(s.step_time)[0]
    known = np.nonzero(~np.isnan(series))[0]
    change, _ = _change_point(series[known], s.steps[known], s.stride, params)
    if change is None:
        return None
    slow_ranks = [
        e for e in j.evidence.values()
        if e.verdict in ("straggler", "likely_straggler") and (e.since_step or 0) <= change.until_step
    ]  # fmt: skip
    own_ratio = rest_ratio = share = None
    attribution: JobAttribution = "unknown"
    if s.compute is not None:
        steady = _steady_columns(s, j)
        columns = steady or list(range(len(s.ranks)))
        with np.errstate(invalid="ignore", divide="ignore"):
            work = _row_median(s.compute[:, columns])[0]
            rest = _row_median((s.step_time - s.compute)[:, columns])[0]
        base = s.steps < change.since_step
        run = (s.steps >= change.since_step) & (s.steps <= change.until_step)
        medians = [_finite_median(m[sel]) for m in (work, rest, series) for sel in (base, run)]
        if all(v is not None for v in medians):
            w0, w1, r0, r1, t0, t1 = (float(v) for v in medians)  # type: ignore[arg-type]
            own_ratio, rest_ratio = _ratio(w1, w0), _ratio(r1, r0)
            added = t1 - t0
            share = min(1.0, max(0.0, (w1 - w0) / added)) if added > 0 else None
    if slow_ranks:
        attribution = "stragglers"
        named = _ranks_text(sorted(e.rank for e in slow_ranks))
        action = f"The job waits for its slow rank(s) ({named}): act on them (see stragglers)."
    elif share is None:
        action = (
            "The whole job slowed; log each rank's own work (compute_s) to tell compute from communication, and "
            "compare with the network probes (run_network_probes) and the nodes' health."
        )
    elif share >= 0.5:
        attribution = "compute"
        action = (
            f"Every rank's own work slowed ({_fmt(own_ratio)}x, {share:.0%} of the time the step gained): a "
            "fleet-wide compute cause (clocks, thermal throttling, a co-located job, a new data or model shape), not "
            "one rank; check the nodes' health."
        )
    else:
        attribution = "communication"
        action = (
            f"The ranks' own work changed {_fmt(own_ratio)}x ({share:.0%} of the time the step gained), the rest "
            f"of the step {_fmt(rest_ratio)}x: most of the time went into communication (the gradient all-reduce "
            "and what waits on it), which every rank of a synchronised collective shares, so step times cannot name "
            "the rank; find the slow link, NIC or switch with the network probes (plan_network_probes, "
            "run_network_probes, localize_network_fault)."
        )
    return JobSlowdown(
        change_point=change,
        own_work_ratio=own_ratio,
        rest_ratio=rest_ratio,
        own_work_share=share,
        attribution=attribution,
        action=action,
    )


def _together_change(j: _Judged, notes: list[str]) -> TogetherChange | None:
    """The slowed ranks that changed together (a fleet-wide change), with a note; or a note that half the job
    slowed, but not together."""
    together_ranks, tolerance, judged_total = j.together_ranks, j.tolerance, j.judged_total
    if together_ranks:
        first_step = min(j.slowed_changes[r] for r in together_ranks)
        last_step = max(j.slowed_changes[r] for r in together_ranks)
        apart = [(r, c) for r, c in j.changes.items() if r not in set(together_ranks)]
        notes.append(
            f"{len(together_ranks)} of {judged_total} judged ranks slowed against their own baseline together "
            f"({_ranks_text(together_ranks)}, change points from step {first_step} to {last_step}, within "
            f"{tolerance} iterations of each other): a fleet-wide change (data, checkpointing, network contention, a "
            "co-located job), not a straggler" + (f"; apart from them: {_changes_text(apart)}" if apart else "")
        )
        return TogetherChange(
            ranks=together_ranks[:MAX_RANK_IDS_LISTED],
            ranks_total=len(together_ranks),
            first_step=first_step,
            last_step=last_step,
            tolerance_iterations=tolerance,
        )
    if len(j.slowed_changes) >= 2 and 2 * len(j.slowed_changes) >= judged_total:
        notes.append(
            f"{len(j.slowed_changes)} of {judged_total} judged ranks slowed against their own baseline, but not "
            f"together (no half of them within {tolerance} iterations of each other): "
            f"{_changes_text(list(j.slowed_changes.items()))}"
        )
    return None


def _job_notes(s: _Scores, stages: Sequence[StageAggregate], notes: list[str]) -> None:
    """What the size of the job, its step times' spread and its stages limit in the verdicts."""
    import numpy as np

    ranks = s.ranks
    if len(ranks) == 1:
        notes.append("one rank only: no peers to compare with; only change points over time were looked for")
    elif len(ranks) == 2:
        notes.append(
            "two ranks: each one's only peer is the other, so a step's peer spread is nothing but the floors "
            "(mad_floor, the job's jitter) and a borderline slow rank can stay under z_threshold; the change points "
            "over time and the rows it was slower (likely_straggler) carry the evidence"
        )
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = _finite_median((s.peers_mad / s.peers_median)[s.scorable])
    if s.signal == "step_time_s" and len(ranks) > 1 and spread is not None and spread < SYNCHRONISED_SPREAD:
        notes.append(
            f"the step times are nearly equal on every rank (median spread {spread:.2%}): in synchronised training "
            "every rank waits for the slowest, so step times cannot tell which rank is slow; log each rank's own "
            "work as compute_s (the bundled recipes log it as rank_work_s)"
        )
    if any(stage.imbalanced for stage in stages):
        notes.append("pipeline stages are imbalanced (see stages); ranks were compared within their own stage")


@dataclass
class _Listed:
    """The evidence by verdict, in the order the report lists it."""

    stragglers: list[RankEvidence]
    likely: list[RankEvidence]
    was_slow: list[RankEvidence]
    slowed: list[RankEvidence]
    not_enough: list[int]


def _listed(s: _Scores, j: _Judged) -> _Listed:
    def slowest(verdict: Verdict) -> list[RankEvidence]:
        return sorted((e for e in j.evidence.values() if e.verdict == verdict), key=lambda e: (-(e.ratio or 0), e.rank))

    return _Listed(
        stragglers=slowest("straggler"),
        likely=slowest("likely_straggler"),
        was_slow=slowest("was_slow"),
        slowed=sorted((e for e in j.evidence.values() if e.verdict == "slowed"), key=lambda e: e.rank),
        not_enough=[r for r in s.ranks if j.verdicts[r] == "not_enough_steps"],
    )


Overall = Literal["stragglers", "likely_stragglers", "no_stragglers", "not_enough_steps"]


def _overall(
    s: _Scores,
    counts: Mapping[Verdict, int],
    listed: _Listed,
    nodes: Sequence[NodeAggregate],
    fleet_change: ChangePoint | None,
    params: StragglerParams,
) -> tuple[Overall, str, str]:
    """The job's verdict, its summary and the first thing to do."""
    ranks = s.ranks
    stragglers, likely_stragglers = listed.stragglers, listed.likely
    likely_text = "; ".join(_likely_phrase(e, params) for e in likely_stragglers[:3]) + (
        f"; and {len(likely_stragglers) - 3} more" if len(likely_stragglers) > 3 else ""
    )
    overall: Overall
    if counts["straggler"]:
        overall = "stragglers"
        shown = ", ".join(_straggler_phrase(e) for e in stragglers[:5])
        more = f" and {len(stragglers) - 5} more" if len(stragglers) > 5 else ""
        summary = f"{counts['straggler']} straggler(s) among {len(ranks)} ranks: {shown}{more}."
        if likely_stragglers:
            summary += f" {len(likely_stragglers)} likely straggler(s) too: {likely_text}."
        first_action = next((n.action for n in nodes if n.all_slow), stragglers[0].action)
    elif counts["likely_straggler"]:
        overall = "likely_stragglers"
        summary = (
            f"No confirmed straggler among {len(ranks)} ranks (judged on {s.signal}), but "
            f"{len(likely_stragglers)} likely straggler(s): {likely_text}."
        )
        first_action = likely_stragglers[0].action
    elif not counts["ok"] and not counts["was_slow"] and counts["not_enough_steps"]:
        overall = "not_enough_steps"
        most_scored = int(s.scorable.sum(axis=0).max()) if ranks else 0
        summary = (
            f"Not enough steps: at most {most_scored} scored step(s) per rank, and a verdict needs {params.window} "
            "(window); no straggler is claimed. Log more steps (or every step), or lower window (at least 3)."
        )
        first_action = "Collect more steps before judging stragglers."
    else:
        overall = "no_stragglers"
        summary = f"No straggler among {len(ranks)} ranks (judged on {s.signal})."
        if counts["was_slow"]:
            summary += f" {counts['was_slow']} rank(s) were slow earlier and recovered."
        if counts["not_enough_steps"]:
            summary += f" {counts['not_enough_steps']} rank(s) have too few steps to judge."
        first_action = "None: no rank is persistently slower than its peers."
    if fleet_change is not None:
        summary += f" The job as a whole slowed {_fmt(fleet_change.ratio)}x from step {fleet_change.since_step}" + (
            " (ongoing)." if fleet_change.ongoing else f" to step {fleet_change.until_step}."
        )
    return overall, summary, first_action


def _method(s: _Scores, params: StragglerParams, tolerance: int) -> list[str]:
    """The method as it was applied: the signal, the references and every threshold."""
    return [
        f"signal: {s.reason}",
        f"per step, each rank against {s.peers_text}: robust z = (t - median) / (1.4826 * MAD), MAD floored at "
        f"max(mad_floor {params.mad_floor:g}, the job's step-to-step jitter {s.jitter:.3g}) x median; "
        + "; ".join(s.reference_notes),
        f"slow at a step: z > {params.z_threshold:g} and at least {params.min_slowdown:.0%} above the peers' median",
        f"straggler: slow in >= {params.min_flagged} of its last {params.window} scored steps; was_slow: so in an "
        "earlier window only; not_enough_steps: fewer than window scored steps",
        f"change point (Greyhound rule): >= {params.change_slowdown:.0%} slower than its own median over its first "
        f"{params.change_iterations} iterations (>= {MIN_BASELINE_ROWS} rows), for >= {params.change_iterations} "
        f"consecutive iterations and >= {MIN_RUN_ROWS} rows (a row covers {s.stride} iteration(s))",
        f"change points coincide when within {tolerance} iterations (max(change_iterations, stride)) of the first of "
        "them; slowed together (a fleet-wide change): at least 2 ranks and half the judged ones coincide",
        "likely_straggler: a slowed or was_slow rank of the earliest group of change points, when that group is not "
        f"half the judged ranks, which since its change point (>= {params.window} scored rows) was >= "
        f"{params.min_slowdown:.0%} slower than its peers' median in >= {params.min_flagged} of its last "
        f"{params.window} rows and over all of them (median), without the z-score",
    ]


def detect_stragglers(
    rows: Sequence[Mapping[str, Any] | StepRow],
    *,
    layout: Layout | Mapping[str, Any] | None = None,
    signal: SignalChoice = "auto",
    params: StragglerParams | Mapping[str, Any] | None = None,
    warnings: Sequence[str] = (),
) -> StragglerReport:
    """Find the slow ranks of a job from per-rank step times; see the module docstring for the method.

    rows: {rank, step, step_time_s, node?, compute_s?, comm_s?}; layout: {tp, pp, dp?, order?}; signal: which time
    to compare (auto: compute_s when every row has it); params: thresholds (StragglerParams). `warnings` are carried
    into the report (e.g. from rows_from_metrics). Raises InputError for bad rows or arguments."""
    import numpy as np

    params = _validated(StragglerParams, params or {}, "params")
    layout = _validated(Layout, layout, "layout") if layout is not None else None
    if signal not in ("auto", "step_time_s", "compute_s"):
        raise InputError(f"signal: got {given(signal)}; accepted: one of auto, step_time_s, compute_s")
    table = _read_rows(rows)
    notes = list(warnings)
    coords: dict[int, dict[str, int]] | None = None
    if layout is not None:
        layout, coords = _coordinates(layout, sorted(set(table.rank)))
    s = _score(table, signal, params, coords, layout, notes)
    judged = _judge_ranks(s, table, params, coords)
    counts = {v: 0 for v in VERDICTS}
    for verdict in judged.verdicts.values():
        counts[verdict] += 1
    agg = _aggregate(s, table, layout, coords, judged, params, notes)
    fleet_change = _fleet_change(s, judged, params)
    job_slowdown = _job_slowdown(s, judged, params) if len(s.ranks) > 1 else None
    changed_together = _together_change(judged, notes)
    _job_notes(s, agg.stages, notes)
    listed = _listed(s, judged)
    scored_steps = np.any(s.scorable, axis=1)
    fleet_median = _finite_median(s.step_median[scored_steps]) if scored_steps.any() else None
    overall, summary, first_action = _overall(s, counts, listed, agg.nodes, fleet_change, params)
    if job_slowdown is not None and job_slowdown.attribution != "stragglers":
        cp = job_slowdown.change_point
        summary += (
            f" Its step time rose {_fmt(cp.ratio)}x from step {cp.since_step}"
            + (" (ongoing)" if cp.ongoing else f" to step {cp.until_step}")
            + f": {job_slowdown.attribution if job_slowdown.attribution != 'unknown' else 'cause unknown'}."
        )
        if overall == "no_stragglers":
            first_action = job_slowdown.action
    method = _method(s, params, judged.tolerance)

    def build(scale: float) -> StragglerReport:
        s_listed, s_omitted = pick(listed.stragglers, scaled(MAX_LISTED, scale))
        l_listed, l_omitted = pick(listed.likely, scaled(MAX_LISTED, scale))
        w_listed, w_omitted = pick(listed.was_slow, scaled(MAX_LISTED, scale))
        c_listed, c_omitted = pick(listed.slowed, scaled(MAX_LISTED, scale))
        n_listed, n_omitted = pick(listed.not_enough, scaled(MAX_RANK_IDS_LISTED, scale))
        node_listed, node_omitted = pick(agg.nodes, scaled(MAX_AGGREGATES, scale))
        group_listed, group_omitted = pick(agg.groups, scaled(MAX_AGGREGATES, scale))
        return StragglerReport(
            verdict=overall,
            summary=summary,
            first_action=first_action,
            signal=s.signal,
            signal_reason=s.reason,
            rows=len(table.rank),
            ranks=len(s.ranks),
            steps=len(s.steps),
            steps_scored=int(scored_steps.sum()),
            stride=s.stride,
            counts=counts,
            fleet_median_s=fleet_median,
            fleet_change_point=fleet_change,
            changed_together=changed_together,
            job_slowdown=job_slowdown,
            stragglers=s_listed,
            stragglers_omitted=s_omitted,
            likely_stragglers=l_listed,
            likely_stragglers_omitted=l_omitted,
            was_slow=w_listed,
            was_slow_omitted=w_omitted,
            slowed=c_listed,
            slowed_omitted=c_omitted,
            not_enough_steps_ranks=n_listed,
            not_enough_steps_omitted=n_omitted,
            nodes_total=agg.nodes_total,
            nodes=node_listed,
            nodes_omitted=node_omitted,
            groups=group_listed,
            groups_omitted=group_omitted,
            stages=agg.stages[: scaled(MAX_AGGREGATES, scale)],
            layout=layout,
            parameters=params,
            method=method,
            warnings=cap_notes(notes, scaled(MAX_NOTES, scale)),
        )

    return fit(build)


def detect_stragglers_in_metrics(
    metrics_rows: Iterable[Mapping[str, Any]],
    *,
    ranks_per_node: int | None = None,
    layout: Layout | Mapping[str, Any] | None = None,
    signal: SignalChoice = "auto",
    params: StragglerParams | Mapping[str, Any] | None = None,
) -> StragglerReport:
    """detect_stragglers on a job's metrics rows (as servers.launch.metrics.read_metrics returns them)."""
    rows, notes = rows_from_metrics(metrics_rows, ranks_per_node=ranks_per_node)
    return detect_stragglers(rows, layout=layout, signal=signal, params=params, warnings=notes)
