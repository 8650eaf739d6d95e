"""The input and output models of the network tools (plan_network_probes, localize_network_fault) and their
bounds: plain pydantic, no numpy, so that the diagnostics server can publish the tools' schemas without importing
the numerical code (servers/diagnostics/netloc.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from servers.core.models import Model
from servers.diagnostics.bounds import RESULT_GOAL_BYTES
from servers.diagnostics.bounds import summary_text as bounded_summary

MAX_NODES = 16_384
MAX_NICS_PER_NODE = 32
MAX_SWITCHES = 65_536
MAX_UPLINKS = 1_024
MAX_NAME = 256
MAX_RAIL = 1_023
MAX_PROBES = 1_000_000
MAX_PLAN_LIMIT = 1_000_000  # pairs one plan call lists (a tool should list far fewer)
MAX_PLAN_OFFSET = 10_000_000  # how deep full_mesh / rail pairs can be paged
MAX_SUSPECTS_LISTED = 500  # ~1 KB each: a full page stays under the 768 KiB result bound
MAX_NAMES_LISTED = 100
MAX_PROBLEMS = 10  # problem lines one InputError lists
MAX_STEPS = 256  # faulty components one layer's search may name
MAX_AMBIGUOUS_LISTED = 16
# What a call with the default listing returns (issue 22, defect 9): the whole result, structured content and text
# summary as compact JSON, stays under RESULT_GOAL_BYTES (~4k tokens); an agent asks for more with limit / offset.
SUMMARY_MAX_BYTES = 3 * 1024  # the text summary's share of it (summary_text clips to it)
DEFAULT_BUDGET_BYTES = RESULT_GOAL_BYTES - SUMMARY_MAX_BYTES - 512  # the structured content's share (512: framing)
DEFAULT_PLAN_PAIRS = 100  # pairs a plan lists by default (~95 B each)
DEFAULT_FAULTY_LISTED = 20  # faulty suspects a default localization lists at most (~0.9 KB each)
DEFAULT_NEAR_MISSES = 3  # near misses (not faulty) a default localization lists after the faulty ones

DEFAULT_LOSS_THRESHOLD = 0.01
DEFAULT_LATENCY_FACTOR = 2.0
DEFAULT_BANDWIDTH_FACTOR = 0.5
LATENCY_BASELINE_QUANTILE = 0.05
BANDWIDTH_BASELINE_QUANTILE = 0.95
MIN_CLASS_PROBES = 8  # a class with fewer probes takes its layer's baseline
NOISE_FLOOR, NOISE_CEIL = 0.002, 0.25
COST_EXTRA_NATS = 3.0
TIE_NATS = 1.0

Mode = Literal["full_mesh", "rail", "skeleton"]
ComponentKind = Literal["nic", "node", "leaf", "spine", "leaf_spine_link"]
Layer = Literal["overlay", "underlay"]
PairReason = Literal["dp_ring", "tp_ring", "pp", "cross_leaf", "fill", "rail", "full_mesh"]
Symptom = Literal["down", "lossy", "slow", "low_bandwidth", "mixed", "none"]
LayerVerdict = Literal["underlay", "overlay", "unknown", "not_applicable"]

KINDS: tuple[ComponentKind, ...] = ("nic", "node", "leaf", "spine", "leaf_spine_link")
PROBE_FIELDS = ("src_nic", "dst_nic", "latency_us", "loss_rate", "bandwidth_gbps", "layer", "spine")
PROBE_ACCEPTED = (
    "an object {src_nic, dst_nic, latency_us (number >= 0 or null), loss_rate (0 to 1), "
    "bandwidth_gbps? (number >= 0), layer? ('overlay' or 'underlay'), spine? (a spine name)}"
)
TOPOLOGY_ACCEPTED = (
    '{"nodes": [{"name", "nics": [{"name", "rail", "leaf"}]}], '
    '"switches": [{"name", "tier": "leaf"|"spine", "uplinks": [spine names]}]}'
)


def summary_text(lines: list[str], limit: int = SUMMARY_MAX_BYTES) -> str:
    """The network tools' summary, cut to its share of a default answer (bounds.summary_text)."""
    return bounded_summary(lines, limit)


def link_name(leaf: str, spine: str) -> str:
    """The name of the link between a leaf and a spine, as suspects and coverage name it."""
    return f"{leaf}~{spine}"


# ---- input models ------------------------------------------------------------------------------------------------


class NicSpec(Model):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=MAX_NAME)
    rail: int = Field(ge=0, le=MAX_RAIL)
    leaf: str = Field(min_length=1, max_length=MAX_NAME)


class NodeSpec(Model):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=MAX_NAME)
    nics: list[NicSpec] = Field(min_length=1, max_length=MAX_NICS_PER_NODE)


class SwitchSpec(Model):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=MAX_NAME)
    tier: Literal["leaf", "spine"]
    uplinks: list[Annotated[str, Field(max_length=MAX_NAME)]] = Field(
        default_factory=list, max_length=MAX_UPLINKS, description="A leaf's spines"
    )


class Topology(Model):
    model_config = ConfigDict(extra="forbid")
    nodes: list[NodeSpec] = Field(min_length=1, max_length=MAX_NODES)
    switches: list[SwitchSpec] = Field(min_length=1, max_length=MAX_SWITCHES)


class ProbeRow(Model):
    model_config = ConfigDict(extra="forbid")
    src_nic: str = Field(min_length=1, max_length=MAX_NAME)
    dst_nic: str = Field(min_length=1, max_length=MAX_NAME)
    latency_us: float | None = Field(ge=0, allow_inf_nan=False, description="null: all lost")
    loss_rate: float = Field(ge=0, le=1, allow_inf_nan=False)
    bandwidth_gbps: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    layer: Layer | None = Field(default=None, description="overlay: container path")
    spine: str | None = Field(default=None, max_length=MAX_NAME, description="Spine crossed")


class Thresholds(Model):
    model_config = ConfigDict(extra="forbid")
    loss_threshold: float = Field(
        default=DEFAULT_LOSS_THRESHOLD, ge=0, lt=1, description="A probe is bad when its loss_rate is above this"
    )
    latency_factor: float = Field(
        default=DEFAULT_LATENCY_FACTOR,
        gt=1,
        le=1000,
        description="Bad when latency > this x its class baseline (5th percentile of same-leaf / cross-leaf)",
    )
    bandwidth_factor: float = Field(
        default=DEFAULT_BANDWIDTH_FACTOR,
        gt=0,
        lt=1,
        description="Bad when bandwidth < this x its class baseline (95th percentile)",
    )
    min_failed: int = Field(default=2, ge=1, le=1000, description="Bad probes a faulty component needs at least")
    min_spine_leaf_pairs: int = Field(
        default=3, ge=1, le=1000, description="Distinct leaf pairs among a faulty spine's bad probes"
    )
    noise_rate: float | None = Field(
        default=None, gt=0, lt=0.5, description="Chance a probe is bad with no fault; estimated when not given"
    )
    min_score: float | None = Field(
        default=None, gt=0, le=1e6, description="Likelihood gain (nats) a faulty component needs; default log(M)+3"
    )


# ---- output models -----------------------------------------------------------------------------------------------


class ProbePair(Model):
    src_nic: str
    dst_nic: str
    via_spine: str | None = Field(description="Pin the probe to this spine (cross-leaf pairs); null on one leaf")
    reason: PairReason


class CoverageCount(Model):
    total: int
    covered: int
    not_covered: int
    not_covered_names: list[str] = Field(description=f"At most {MAX_NAMES_LISTED}")


class Coverage(Model):
    complete: bool = Field(description="Every NIC, node, leaf, spine and leaf-spine link is crossed by some probe")
    nic: CoverageCount
    node: CoverageCount
    leaf: CoverageCount
    spine: CoverageCount
    leaf_spine_link: CoverageCount


class Layout(Model):
    tp: int
    pp: int
    dp: int
    given: bool = Field(description="False when the default (tp = NICs per node, pp = 1, dp = nodes) was used")


class ProbesPerNic(Model):
    min: int
    median: float
    max: int


class ProbePlan(Model):
    mode: Mode
    count: int = Field(description="Pairs in this plan (one probe each per round)")
    full_mesh_count: int = Field(description="Pairs a full mesh would probe, for comparison")
    rail_count: int = Field(description="Pairs the rail mode would probe")
    ratio_to_full_mesh: float = Field(description="count / full_mesh_count")
    layout: Layout | None = None
    pairs: list[ProbePair] = Field(
        description=f"From offset: limit of them, or by default up to {DEFAULT_PLAN_PAIRS} within ~16 KB"
    )
    offset: int
    next_offset: int | None
    has_more: bool
    coverage: Coverage
    probes_per_nic: ProbesPerNic | None = Field(default=None, description="Skeleton only (exact)")
    notes: list[str] = Field(default_factory=list)


class ProbeRef(Model):
    src_nic: str
    dst_nic: str
    loss_rate: float
    latency_us: float | None
    layer: Layer | None
    spine: str | None


class LayerEvidence(Model):
    failed: int
    passed: int
    faulty: bool


class Evidence(Model):
    failed: int = Field(description="Bad probes whose path surely crosses it")
    passed: int = Field(description="Good probes whose path surely crosses it")
    failed_ambiguous: int = Field(description="Bad cross-leaf probes that may have crossed it (ECMP, no route)")
    passed_ambiguous: int
    failed_by: dict[str, int] = Field(description="Bad probes by symptom: loss, latency, bandwidth")
    fail_probability: float | None = Field(description="Fitted chance a probe through it is bad (faulty ones)")
    median_failed_loss: float | None
    median_latency_ratio: float | None = Field(description="Bad probes' latency over their class baseline (median)")
    leaf_pairs: int | None = Field(description="Distinct leaf pairs among its bad probes (spines and links)")
    by_layer: dict[str, LayerEvidence]
    examples: list[ProbeRef] = Field(description="Up to 3 bad probes through it")


class Suspect(Model):
    kind: ComponentKind
    name: str
    faulty: bool
    score: float = Field(description="Likelihood gain in nats of calling it faulty (given the other faulty ones)")
    symptom: Symptom
    layer_verdict: LayerVerdict
    ambiguous_with: list[str] = Field(default_factory=list, description="ECMP alternatives it cannot be told from")
    node: str | None = None
    leaf: str | None = None
    spine: str | None = None
    rail: int | None = None
    evidence: Evidence


class ClassBaseline(Model):
    layer: str
    path_class: Literal["same_leaf", "cross_leaf"]
    probes: int
    latency_us: float | None
    bandwidth_gbps: float | None


class ProbeSummary(Model):
    total: int
    bad: int
    bad_by: dict[str, int]
    by_layer: dict[str, int]
    same_leaf: int
    cross_leaf: int
    with_route: int = Field(description="Cross-leaf probes naming their spine (exact path)")
    ecmp_ambiguous: int = Field(description="Cross-leaf probes without a spine (ambiguous path)")


class NotCovered(Model):
    counts: dict[str, int] = Field(description="Components per kind that no probe crosses (cannot be judged)")
    ecmp_only: dict[str, int] = Field(description="Spines and links crossed only by probes without a route")
    names: list[str] = Field(description=f"At most {MAX_NAMES_LISTED} of the not covered")


class Localization(Model):
    faulty_count: int
    suspects: list[Suspect] = Field(
        description="Faulty first (highest score first), then the nearest misses; from offset, limit of them, "
        f"or by default the faulty (up to {DEFAULT_FAULTY_LISTED}) and {DEFAULT_NEAR_MISSES} more within ~16 KB"
    )
    suspects_total: int
    offset: int
    next_offset: int | None
    has_more: bool
    layer_verdict: Literal["underlay", "overlay", "both", "none", "not_applicable"]
    probes: ProbeSummary
    baselines: list[ClassBaseline]
    noise_rate: dict[str, float] = Field(description="Per layer: the noise rate used (estimated unless given)")
    min_score: float
    thresholds: Thresholds
    not_covered: NotCovered
    method: str
    ecmp: str
    warnings: list[str] = Field(default_factory=list)


METHOD = (
    "Greedy maximum-likelihood explanation of bad probes: each faulty component makes a probe through it bad with a "
    "fitted probability (0.15-0.999, partial faults included), any probe is bad by chance at the noise rate; "
    "components are added while the gain in log-likelihood exceeds min_score = log(components) + 3 nats, redundant "
    "picks are dropped, each named switch or node is tried away (the search goes on without it; the better set is "
    "kept), the noise rate is re-estimated and the search repeated. Bad = loss above loss_threshold, "
    "latency above latency_factor x the class baseline (5th percentile per layer and same-leaf / cross-leaf), or "
    "bandwidth below bandwidth_factor x the class baseline (95th percentile)."
)
