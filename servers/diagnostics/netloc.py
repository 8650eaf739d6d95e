"""Network probe planning and fault localization on a two-tier (leaf/spine) rail-optimised fat tree. Plain module
(no MCP imports).

Formats (the issue's, as JSON-able dicts or the pydantic models below):
- topology: ``{"nodes": [{"name", "nics": [{"name", "rail", "leaf"}]}], "switches": [{"name", "tier": "leaf" |
  "spine", "uplinks": [spine names]}]}``. A leaf's uplinks are spines; spines have none. Two leaves reach each
  other through any spine both list (ECMP).
- probes: rows ``{src_nic, dst_nic, latency_us, loss_rate, bandwidth_gbps?, layer?: "overlay" | "underlay",
  spine?}``. ``latency_us`` may be null (a probe that lost every packet has none). ``spine`` is an optional
  extension: the spine a cross-leaf probe crossed, when the prober knows it (traceroute, the ``route`` column of a
  probe table, or a probe pinned to the ``via_spine`` that plan_network_probes gives, by source routing or a source
  port known to hash there). Without it a cross-leaf probe's spine is ambiguous (below).
- A probe table in the column layout of SkeletonHunter's RDMA ping records (``src_real_ip``/``src_ip``, ``latency``,
  ``loss_rate``, ``agent_type``, ``dial``, ``route``, ``src_asw``, ``src_dsw``, ``src_node_id``, ...) is read by
  parse_probes_text, and topology_from_probe_table derives a topology from its endpoint columns.

Planning (plan_network_probes). ``full_mesh``: every pair of NICs on different nodes that can reach each other
(O(N^2)); ``rail``: those on the same rail; ``skeleton`` (O(N)): the pairs the training traffic itself uses, from
the parallel layout (tp, pp, dp; Megatron rank order, tensor-parallel fastest, then data, then pipeline; one GPU per
NIC, GPU i of a node on its NIC of the i-th lowest rail): per data-parallel (and cross-node tensor-parallel) group a
ring over its nodes on each rail its GPUs use, pipeline neighbours, cross-node pairs aligned to one rail as NCCL's
PXN sends them; then for every leaf ``cross_leaf_per_uplink`` probes through each of its uplinks to other leaves,
each pinned to that spine, so that every leaf, spine and leaf-spine link is crossed; then fill probes until every
NIC is in ``min_probes_per_nic`` probes. Every cross-leaf pair of every mode gets a ``via_spine``. Coverage says
which NICs, nodes, leaves, spines and leaf-spine links no probe crosses.

Localization (localize_network_fault) and why this method. A probe is bad when its loss rate is above
``loss_threshold`` (default 0.01: more than 1 packet in 100), its latency above ``latency_factor`` (default 2.0)
times its class baseline, or its bandwidth below ``bandwidth_factor`` (default 0.5) times its class baseline. A class
is (layer, same leaf or cross leaf); its latency baseline is the 5th percentile of the class's latencies (its
bandwidth baseline the 95th), so that up to ~95% of a class may be bad without moving it. Components: NICs, nodes,
leaves, spines, leaf-spine links; each probe crosses its two NICs, their nodes, their leaves and, across leaves, a
spine and two leaf-spine links. Each component c, if faulty, makes a probe through it bad with probability q_c
(fitted per component: 0.15 to 0.999, so that partial faults, a NIC with 5% loss or 3x latency, are modelled as well
as dead ones); any probe is bad by chance with the noise rate e (estimated from the probes no suspect explains, or
given). So P(probe good) = (1 - e) * prod over its faulty components of (1 - q_c), and the fault set is the one that
maximises this likelihood minus a cost per faulty component of log(number of components) + 3 nats (a Bonferroni
style bar: noise alone almost never pays it, a real fault pays it with three or four bad probes). The search is
greedy (add the component of largest likelihood gain, re-fit, repeat; then drop any pick that the later picks made
redundant; then try each named switch or node away: without it, and never it, the search goes on from the other picks,
and the set of higher penalised likelihood is kept, since a leaf or spine can explain the bad probes of two of its
faulty parts in one pick; then re-estimate e and search again): the 007 / NetBouncer / Sherlock family of greedy
explanations of failed paths weighted by the passed ones, with the weighting made a likelihood so that noise, partial
failures, several simultaneous faults and missing probes (fewer terms, nothing else) are handled by one rule.
NNLS tomography was not chosen: it needs a continuous per-link metric, treats a dead NIC and noise on the same scale,
and does not say when to stop. Every suspect needs at least ``min_failed`` bad probes; a spine also needs bad probes
between at least ``min_spine_leaf_pairs`` distinct leaf pairs (a fault seen between one pair of leaves is their link,
not the spine). Score = the likelihood gain in nats; faulty when it clears the cost (``min_score`` in the result).

ECMP. A cross-leaf probe without ``spine`` may have crossed any of the k spines its two leaves share. Each of those
spines and its two leaf-spine links is put on the probe's path with weight 1/k: P(good) has the factor (1 - q/k),
which is the exact average over uniform ECMP when one of them is faulty. Blame is spread, and a spine is only named
when its failures span many leaf pairs. In a full leaf-spine mesh all k spines then explain ambiguous failures
equally: the suspect chosen lists the others in ``ambiguous_with``, and the result says to probe with routes.
Stored without the expansion: an ambiguous probe is a member of three rows of an ECMP table (its two leaves' uplink
groups, whose row holds the k spines; each end's leaf with the other end's group, whose row holds that leaf's k
links), so memory is probes x path length plus the table, not probes x k. Leaves with one spine in common have one
path: that spine is taken as known.

Overlay and underlay. When probes carry both layers, each layer is localized on its own; a suspect faulty in the
underlay is an underlay fault (overlay probes ride on it), one faulty in the overlay only while underlay probes
through it pass is an overlay fault (container network, virtual NIC, vSwitch rules), ``unknown`` when the underlay
does not cross it. Probes without ``layer`` form their own group.

Bounds: at most 16,384 nodes (32 NICs each), 65,536 switches, 1,024 uplinks per leaf, and per call 1,000,000 probes
and 16,000,000 path entries, counted before anything of that size is allocated. A probe holds at most 9 (its NICs,
nodes and leaves, a known spine and its two links; an ambiguous one 6 and its 3 table memberships), so 1,000,000
probes always fit, with an ECMP table of up to 7,000,000 entries (the sum over its rows of the spines shared: small
unless many leaves have distinct uplink sets); a call over the bound is refused with its numbers. About 300 MB of
arrays at 1,000,000 probes. Only components with at least ``min_failed`` bad probes are candidates; their gains (8
fits each) are computed once per search, and after each pick only the terms of the bad probes through it are
updated, so the time is linear in probes: ~0.75 s for the 130k probes of a 4,096-node fleet, ~3 s for 510k at
16,384 nodes (reading the rows included), on one core. numpy is imported with this module.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import ValidationError

from servers.core.errors import InputError, validation_problems
from servers.diagnostics.bounds import MAX_RESULT_BYTES, fit, scaled

# ---- bounds and defaults -----------------------------------------------------------------------------------------
from servers.diagnostics.netmodels import (  # noqa: F401 (re-exported: the models are part of this API)
    BANDWIDTH_BASELINE_QUANTILE,
    COST_EXTRA_NATS,
    DEFAULT_BANDWIDTH_FACTOR,
    DEFAULT_BUDGET_BYTES,
    DEFAULT_FAULTY_LISTED,
    DEFAULT_LATENCY_FACTOR,
    DEFAULT_LOSS_THRESHOLD,
    DEFAULT_NEAR_MISSES,
    DEFAULT_PLAN_PAIRS,
    KINDS,
    LATENCY_BASELINE_QUANTILE,
    MAX_AMBIGUOUS_LISTED,
    MAX_NAME,
    MAX_NAMES_LISTED,
    MAX_NICS_PER_NODE,
    MAX_NODES,
    MAX_PLAN_LIMIT,
    MAX_PLAN_OFFSET,
    MAX_PROBES,
    MAX_PROBLEMS,
    MAX_RAIL,
    MAX_STEPS,
    MAX_SUSPECTS_LISTED,
    MAX_SWITCHES,
    MAX_UPLINKS,
    METHOD,
    MIN_CLASS_PROBES,
    NOISE_CEIL,
    NOISE_FLOOR,
    PROBE_ACCEPTED,
    PROBE_FIELDS,
    TIE_NATS,
    TOPOLOGY_ACCEPTED,
    ClassBaseline,
    ComponentKind,
    Coverage,
    CoverageCount,
    Evidence,
    Layer,
    LayerEvidence,
    LayerVerdict,
    Layout,
    Localization,
    Mode,
    NicSpec,
    NodeSpec,
    NotCovered,
    PairReason,
    ProbePair,
    ProbePlan,
    ProbeRef,
    ProbeRow,
    ProbesPerNic,
    ProbeSummary,
    Suspect,
    SwitchSpec,
    Symptom,
    Thresholds,
    Topology,
    link_name,
)

QGRID = np.array([0.15, 0.3, 0.5, 0.7, 0.85, 0.95, 0.99, 0.999])


# ---- topology index ----------------------------------------------------------------------------------------------


@dataclass
class _Index:
    """Integer ids for everything in a validated topology. Components: NICs, nodes, leaves, spines, links, in that
    order in one id space (offsets below)."""

    nic_names: list[str]
    nic_id: dict[str, int]
    nic_node: np.ndarray
    nic_leaf: np.ndarray
    nic_rail: np.ndarray
    node_names: list[str]
    node_nics: list[list[int]]  # each node's NICs, by (rail, name)
    leaf_names: list[str]
    leaf_id: dict[str, int]
    leaf_uplinks: list[list[int]]  # spine ids, as listed
    leaf_nics: list[list[int]]
    spine_names: list[str]
    spine_id: dict[str, int]
    spine_leaves: list[list[int]]
    link_leaf: np.ndarray
    link_spine: np.ndarray
    link_keys: np.ndarray  # sorted leaf * n_spines + spine
    link_ids_sorted: np.ndarray
    leaf_group: np.ndarray  # leaves with the same uplink set share a group; -1: no uplinks
    group_uplinks: list[tuple[int, ...]]  # sorted spine ids per group
    _shared: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)

    @property
    def n_nics(self) -> int:
        return len(self.nic_names)

    @property
    def n_nodes(self) -> int:
        return len(self.node_names)

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_names)

    @property
    def n_spines(self) -> int:
        return len(self.spine_names)

    @property
    def n_links(self) -> int:
        return len(self.link_leaf)

    @property
    def offsets(self) -> dict[ComponentKind, int]:
        o_node = self.n_nics
        o_leaf = o_node + self.n_nodes
        o_spine = o_leaf + self.n_leaves
        o_link = o_spine + self.n_spines
        return {"nic": 0, "node": o_node, "leaf": o_leaf, "spine": o_spine, "leaf_spine_link": o_link}

    @property
    def n_components(self) -> int:
        return self.n_nics + self.n_nodes + self.n_leaves + self.n_spines + self.n_links

    def shared(self, a: int, b: int) -> tuple[int, ...]:
        """The spines leaves a and b share (sorted ids); () when they share none."""
        ga, gb = int(self.leaf_group[a]), int(self.leaf_group[b])
        if ga < 0 or gb < 0:
            return ()
        key = (ga, gb) if ga <= gb else (gb, ga)
        found = self._shared.get(key)
        if found is None:
            found = tuple(sorted(set(self.group_uplinks[ga]) & set(self.group_uplinks[gb])))
            self._shared[key] = found
        return found

    def links(self, leaves: np.ndarray, spines: np.ndarray) -> np.ndarray:
        keys = leaves.astype(np.int64) * max(1, self.n_spines) + spines.astype(np.int64)
        pos = np.searchsorted(self.link_keys, keys)
        return self.link_ids_sorted[np.minimum(pos, len(self.link_keys) - 1)]

    def describe(self, cid: int) -> tuple[ComponentKind, str, dict[str, Any]]:
        off = self.offsets
        if cid < off["node"]:
            node = self.node_names[int(self.nic_node[cid])]
            leaf = self.leaf_names[int(self.nic_leaf[cid])]
            return "nic", self.nic_names[cid], {"node": node, "leaf": leaf, "rail": int(self.nic_rail[cid])}
        if cid < off["leaf"]:
            return "node", self.node_names[cid - off["node"]], {}
        if cid < off["spine"]:
            return "leaf", self.leaf_names[cid - off["leaf"]], {}
        if cid < off["leaf_spine_link"]:
            return "spine", self.spine_names[cid - off["spine"]], {}
        k = cid - off["leaf_spine_link"]
        leaf, spine = self.leaf_names[int(self.link_leaf[k])], self.spine_names[int(self.link_spine[k])]
        return "leaf_spine_link", link_name(leaf, spine), {"leaf": leaf, "spine": spine}

    def kind_of(self, cids: np.ndarray) -> np.ndarray:
        """Kind index (position in KINDS) per component id."""
        off = self.offsets
        edges = np.array([off["node"], off["leaf"], off["spine"], off["leaf_spine_link"]])
        return np.searchsorted(edges, cids, side="right")


def _raise(problems: list[str]) -> None:
    if problems:
        shown = problems[:MAX_PROBLEMS]
        if len(problems) > MAX_PROBLEMS:
            shown.append(f"... and {len(problems) - MAX_PROBLEMS} more problems")
        raise InputError("\n".join(shown))


@lru_cache(maxsize=1)
def _topology_schema() -> dict[str, Any]:
    return Topology.model_json_schema()


class _Nic(NamedTuple):
    name: str
    rail: int
    leaf: str


class _Node(NamedTuple):
    name: str
    nics: list[_Nic]


class _Switch(NamedTuple):
    name: str
    tier: str
    uplinks: list[str]


class _Topo(NamedTuple):
    nodes: list[_Node]
    switches: list[_Switch]


def _name_ok(value: Any) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_NAME


def _fast_topology(topology: Mapping[str, Any]) -> _Topo | None:
    """A plain-dict topology that is well formed, without building pydantic models (131k NICs at 16k nodes);
    None when anything is off (pydantic then says what)."""
    nodes, switches = topology.get("nodes"), topology.get("switches")
    if set(topology) != {"nodes", "switches"} or type(nodes) is not list or type(switches) is not list:
        return None
    if not nodes or not switches:
        return None
    out_nodes: list[_Node] = []
    for node in nodes:
        if type(node) is not dict or node.keys() != {"name", "nics"} or not _name_ok(node["name"]):
            return None
        nics = node["nics"]
        if type(nics) is not list or not 0 < len(nics) <= MAX_NICS_PER_NODE:
            return None
        out_nics = []
        for nic in nics:
            if type(nic) is not dict or nic.keys() != {"name", "rail", "leaf"}:
                return None
            name, rail, leaf = nic["name"], nic["rail"], nic["leaf"]
            if not (_name_ok(name) and _name_ok(leaf) and type(rail) is int and 0 <= rail <= MAX_RAIL):
                return None
            out_nics.append(_Nic(name, rail, leaf))
        out_nodes.append(_Node(node["name"], out_nics))
    out_switches: list[_Switch] = []
    for sw in switches:
        if type(sw) is not dict or not {"name", "tier"} <= sw.keys() <= {"name", "tier", "uplinks"}:
            return None
        ups = sw.get("uplinks", [])
        if not _name_ok(sw["name"]) or sw["tier"] not in ("leaf", "spine") or type(ups) is not list:
            return None
        if len(ups) > MAX_UPLINKS or not all(type(u) is str for u in ups):
            return None
        out_switches.append(_Switch(sw["name"], sw["tier"], list(ups)))
    return _Topo(out_nodes, out_switches)


def _as_topology(topology: Topology | Mapping[str, Any]) -> Topology | _Topo:
    if isinstance(topology, Topology):
        return topology
    if not isinstance(topology, Mapping):
        raise InputError(f"topology: got {type(topology).__name__}; accepted: an object {TOPOLOGY_ACCEPTED}")
    nodes = topology.get("nodes")
    if isinstance(nodes, list) and len(nodes) > MAX_NODES:
        raise InputError(f"topology.nodes: {len(nodes):,} nodes; accepted: at most {MAX_NODES:,} per call")
    switches = topology.get("switches")
    if isinstance(switches, list) and len(switches) > MAX_SWITCHES:
        raise InputError(f"topology.switches: {len(switches):,} switches; accepted: at most {MAX_SWITCHES:,}")
    fast = _fast_topology(topology)
    if fast is not None:
        return fast
    try:
        return Topology.model_validate(topology)
    except ValidationError as exc:
        lines = validation_problems(exc.errors(), dict(topology), _topology_schema(), root="topology")
        _raise([line if line.startswith("topology") else f"topology.{line}" for line in lines])
    raise AssertionError("unreachable")


def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A cycle in the uplink graph (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}
    for start in graph:
        if state.get(start):
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = []
        while stack:
            name, i = stack.pop()
            if i == 0:
                state[name] = 1
                path.append(name)
            nexts = graph.get(name, [])
            if i < len(nexts):
                stack.append((name, i + 1))
                nxt = nexts[i]
                if state.get(nxt) == 1:
                    return [*path[path.index(nxt) :], nxt]
                if not state.get(nxt) and nxt in graph:
                    stack.append((nxt, 0))
            else:
                state[name] = 2
                path.pop()
    return None


def build_index(topology: Topology | Mapping[str, Any]) -> _Index:
    """Validate a topology and index it; InputError lists every problem (at most 10), each with what is accepted."""
    topo = _as_topology(topology)
    problems: list[str] = []
    switch_tier: dict[str, str] = {}
    for i, sw in enumerate(topo.switches):
        if sw.name in switch_tier:
            problems.append(f"topology.switches[{i}].name: duplicate switch name {sw.name!r}; accepted: unique names")
        switch_tier.setdefault(sw.name, sw.tier)
    graph = {sw.name: list(sw.uplinks) for sw in topo.switches}
    cycle = _find_cycle(graph)
    if cycle:
        problems.append(
            "topology.switches: switch cycle " + " -> ".join(cycle) + "; accepted: a two-tier tree, leaves whose "
            "uplinks are spines and spines without uplinks"
        )
    for i, sw in enumerate(topo.switches):
        where = f"topology.switches[{i}]"
        if sw.tier == "spine" and sw.uplinks:
            problems.append(
                f"{where}.uplinks: spine {sw.name!r} lists uplinks {sw.uplinks[:3]}; accepted: none (two tiers: leaves "
                "uplink to spines, spines uplink to nothing)"
            )
            continue
        seen: set[str] = set()
        for up in sw.uplinks:
            if up in seen:
                problems.append(f"{where}.uplinks: {up!r} listed twice; accepted: each spine once")
            seen.add(up)
            tier = switch_tier.get(up)
            if tier is None:
                problems.append(f"{where}.uplinks: unknown switch {up!r}; accepted: names of spines in switches")
            elif tier != "spine" and not cycle:
                problems.append(
                    f"{where}.uplinks: {up!r} is a leaf, not a spine; accepted: a leaf's uplinks are spines"
                )
    nic_names: list[str] = []
    nic_id: dict[str, int] = {}
    node_names: list[str] = []
    node_seen: set[str] = set()
    for i, node in enumerate(topo.nodes):
        if node.name in node_seen:
            problems.append(f"topology.nodes[{i}].name: duplicate node name {node.name!r}; accepted: unique names")
        node_seen.add(node.name)
        node_names.append(node.name)
        for j, nic in enumerate(node.nics):
            where = f"topology.nodes[{i}].nics[{j}]"
            if nic.name in nic_id:
                problems.append(f"{where}.name: duplicate NIC name {nic.name!r}; accepted: NIC names unique overall")
            else:
                nic_id[nic.name] = len(nic_names)
            nic_names.append(nic.name)
            tier = switch_tier.get(nic.leaf)
            if tier is None:
                problems.append(f"{where}.leaf: unknown switch {nic.leaf!r}; accepted: the name of a leaf in switches")
            elif tier != "leaf":
                problems.append(f"{where}.leaf: {nic.leaf!r} is a spine; accepted: a NIC is cabled to a leaf")
    for name in sorted(node_seen & set(switch_tier))[:MAX_PROBLEMS]:
        problems.append(f"topology: {name!r} is both a node and a switch; accepted: distinct names")
    for name in sorted(set(nic_id) & (node_seen | set(switch_tier)))[:MAX_PROBLEMS]:
        problems.append(f"topology: {name!r} is both a NIC and a node or switch; accepted: distinct names")
    _raise(problems)

    leaf_names = [sw.name for sw in topo.switches if sw.tier == "leaf"]
    spine_names = [sw.name for sw in topo.switches if sw.tier == "spine"]
    leaf_id = {n: i for i, n in enumerate(leaf_names)}
    spine_id = {n: i for i, n in enumerate(spine_names)}
    leaf_uplinks = [[spine_id[u] for u in sw.uplinks] for sw in topo.switches if sw.tier == "leaf"]
    n_nics = len(nic_names)
    nic_node = np.empty(n_nics, dtype=np.int32)
    nic_leaf = np.empty(n_nics, dtype=np.int32)
    nic_rail = np.empty(n_nics, dtype=np.int32)
    node_nics: list[list[int]] = []
    k = 0
    for n, node in enumerate(topo.nodes):
        ids = []
        for nic in node.nics:
            nic_node[k], nic_leaf[k], nic_rail[k] = n, leaf_id[nic.leaf], nic.rail
            ids.append(k)
            k += 1
        node_nics.append(sorted(ids, key=lambda x: (int(nic_rail[x]), nic_names[x])))
    leaf_nics: list[list[int]] = [[] for _ in leaf_names]
    for i in range(n_nics):
        leaf_nics[int(nic_leaf[i])].append(i)
    spine_leaves: list[list[int]] = [[] for _ in spine_names]
    link_leaf, link_spine = [], []
    for a, ups in enumerate(leaf_uplinks):
        for s in ups:
            spine_leaves[s].append(a)
            link_leaf.append(a)
            link_spine.append(s)
    link_leaf_a = np.array(link_leaf, dtype=np.int32)
    link_spine_a = np.array(link_spine, dtype=np.int32)
    keys = link_leaf_a.astype(np.int64) * max(1, len(spine_names)) + link_spine_a
    order = np.argsort(keys, kind="stable")
    groups: dict[tuple[int, ...], int] = {}
    leaf_group = np.full(len(leaf_names), -1, dtype=np.int32)
    for a, ups in enumerate(leaf_uplinks):
        if ups:
            leaf_group[a] = groups.setdefault(tuple(sorted(ups)), len(groups))
    return _Index(
        nic_names=nic_names,
        nic_id=nic_id,
        nic_node=nic_node,
        nic_leaf=nic_leaf,
        nic_rail=nic_rail,
        node_names=node_names,
        node_nics=node_nics,
        leaf_names=leaf_names,
        leaf_id=leaf_id,
        leaf_uplinks=leaf_uplinks,
        leaf_nics=leaf_nics,
        spine_names=spine_names,
        spine_id=spine_id,
        spine_leaves=spine_leaves,
        link_leaf=link_leaf_a,
        link_spine=link_spine_a,
        link_keys=keys[order],
        link_ids_sorted=order.astype(np.int64),
        leaf_group=leaf_group,
        group_uplinks=list(groups),
    )


# ---- probe planning ----------------------------------------------------------------------------------------------


def _mix(a: int, b: int) -> int:
    """A 32-bit hash of a pair of ids (xor-shift-multiply: spreads ids that differ by multiples of a power of two)."""
    x = (a * 0x9E3779B1 ^ (b + 0x7F4A7C15) * 0x85EBCA77) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    x ^= x >> 12
    x = (x * 0x297A2D39) & 0xFFFFFFFF
    return x ^ (x >> 15)


def _via(idx: _Index, a: int, b: int) -> int:
    """The spine a cross-leaf pair is pinned to (a hash of the pair picks one of the shared spines), -1 on one leaf,
    -2 when the leaves share none."""
    la, lb = int(idx.nic_leaf[a]), int(idx.nic_leaf[b])
    if la == lb:
        return -1
    shared = idx.shared(la, lb)
    return shared[_mix(min(a, b), max(a, b)) % len(shared)] if shared else -2


def _routable(idx: _Index, a: int, b: int) -> bool:
    la, lb = int(idx.nic_leaf[a]), int(idx.nic_leaf[b])
    return la == lb or bool(idx.shared(la, lb))


def _resolve_layout(idx: _Index, tp: int | None, pp: int | None, dp: int | None) -> Layout:
    world = idx.n_nics
    per_node = {len(n) for n in idx.node_nics}
    default_tp = per_node.pop() if len(per_node) == 1 else 1
    if tp is None and pp is None and dp is None:
        return Layout(tp=default_tp, pp=1, dp=world // default_tp, given=False)
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= world):
            raise InputError(
                f"{name}: got {value!r}; accepted: a positive integer up to the {world} GPUs (one per NIC)"
            )
    if dp is None:
        tp = tp if tp is not None else default_tp
        pp = pp if pp is not None else 1
        dp = world // (tp * pp) if world % (tp * pp) == 0 else 0
    elif tp is None:
        pp = pp if pp is not None else 1
        tp = world // (pp * dp) if world % (pp * dp) == 0 else 0
    elif pp is None:
        pp = world // (tp * dp) if world % (tp * dp) == 0 else 0
    if not (tp and pp and dp) or tp * pp * dp != world:
        raise InputError(
            f"tp x pp x dp must equal the {world} GPUs of the topology (one per NIC); got tp={tp or '?'}, "
            f"pp={pp or '?'}, dp={dp or '?'}; accepted: sizes whose product is {world} (a missing one is derived)"
        )
    return Layout(tp=tp, pp=pp, dp=dp, given=True)


class _PairSet:
    def __init__(self, idx: _Index) -> None:
        self.idx = idx
        self.seen: set[tuple[int, int, int]] = set()
        self.pairs: list[tuple[int, int, int, PairReason]] = []
        self.degree = np.zeros(idx.n_nics, dtype=np.int64)

    def add(self, a: int, b: int, reason: PairReason, via: int | None = None) -> bool:
        if a == b or self.idx.nic_node[a] == self.idx.nic_node[b]:
            return False
        if not _routable(self.idx, a, b):
            return False
        spine = _via(self.idx, a, b) if via is None else via
        key = (a, b, spine) if a < b else (b, a, spine)
        if key in self.seen:
            return False
        self.seen.add(key)
        self.pairs.append((a, b, spine, reason))
        self.degree[a] += 1
        self.degree[b] += 1
        return True


def _rail_aligned(idx: _Index, src: int, dst_node: int) -> int:
    """The NIC of dst_node on src's rail (NCCL's PXN sends cross-node traffic on the destination-rail NIC), or the NIC
    in the same position when the node has no NIC on that rail."""
    rail = int(idx.nic_rail[src])
    nics = idx.node_nics[dst_node]
    for nic in nics:
        if int(idx.nic_rail[nic]) == rail:
            return nic
    pos = idx.node_nics[int(idx.nic_node[src])].index(src)
    return nics[pos % len(nics)]


def _ring_over_nodes(pairs: _PairSet, gpus: list[int], reason: PairReason) -> None:
    """A ring collective over `gpus` (NIC ids, rank order): consecutive nodes talk on each rail the group uses."""
    idx = pairs.idx
    by_node: dict[int, list[int]] = {}
    for g in gpus:
        by_node.setdefault(int(idx.nic_node[g]), []).append(g)
    nodes = list(by_node)
    if len(nodes) < 2:
        return
    hops = list(zip(nodes, nodes[1:] + nodes[:1], strict=True)) if len(nodes) > 2 else [(nodes[0], nodes[1])]
    for n1, n2 in hops:
        for g in by_node[n1]:
            pairs.add(g, _rail_aligned(idx, g, n2), reason)


def _skeleton(
    idx: _Index, layout: Layout, cross_leaf_per_uplink: int, min_probes_per_nic: int
) -> tuple[list[tuple[int, int, int, PairReason]], np.ndarray]:
    pairs = _PairSet(idx)
    gpus = [nic for nics in idx.node_nics for nic in nics]
    tp, pp, dp = layout.tp, layout.pp, layout.dp

    def rank(t: int, d: int, p: int) -> int:
        return t + tp * (d + dp * p)

    for p in range(pp):
        for t in range(tp):
            _ring_over_nodes(pairs, [gpus[rank(t, d, p)] for d in range(dp)], "dp_ring")
        for d in range(dp):
            _ring_over_nodes(pairs, [gpus[rank(t, d, p)] for t in range(tp)], "tp_ring")
    for p in range(pp - 1):
        for d in range(dp):
            for t in range(tp):
                a, b = gpus[rank(t, d, p)], gpus[rank(t, d, p + 1)]
                if idx.nic_node[a] != idx.nic_node[b]:
                    pairs.add(a, _rail_aligned(idx, a, int(idx.nic_node[b])), "pp")
    # Cross-leaf probes: from every leaf through each uplink to other leaves under that spine. For a given (uplink
    # index, m) the source -> target map is a shift round the ring of leaves under the spine, so every link carries
    # cross_leaf_per_uplink probes out and as many in, each to or from a different leaf (two links of one spine are
    # told apart only by probes that cross one and not the other).
    received = [0] * idx.n_leaves
    rings: dict[int, tuple[list[int], dict[int, int]]] = {}
    for a, ups in enumerate(idx.leaf_uplinks):
        src_nics = idx.leaf_nics[a]
        if not src_nics:
            continue
        j = 0
        for s_i, s in enumerate(ups):
            if s not in rings:
                members = [b for b in idx.spine_leaves[s] if idx.leaf_nics[b]]
                rings[s] = (members, {b: i for i, b in enumerate(members)})
            ring, where = rings[s]
            if len(ring) < 2:
                continue
            pos = where.get(a, 0)
            for m in range(cross_leaf_per_uplink):
                shift = 1 + (m + s_i * cross_leaf_per_uplink) % (len(ring) - 1)
                b = ring[(pos + shift) % len(ring)]
                if b == a:
                    b = ring[(pos + shift + 1) % len(ring)]
                src = src_nics[j % len(src_nics)]
                j += 1
                dsts = idx.leaf_nics[b]
                dst = dsts[received[b] % len(dsts)]
                for tries in range(len(dsts)):
                    dst = dsts[(received[b] + tries) % len(dsts)]
                    if idx.nic_node[dst] != idx.nic_node[src]:
                        break
                received[b] += 1
                pairs.add(src, dst, "cross_leaf", via=s)
    # Fill: NICs in fewer than min_probes_per_nic probes get probes to and from same-rail NICs further round the rail
    # (both directions: the prober of a dead node reports nothing, so each NIC should also be probed by others).
    by_rail: dict[int, list[int]] = {}
    for nic in gpus:
        by_rail.setdefault(int(idx.nic_rail[nic]), []).append(nic)
    position = {nic: i for nics in by_rail.values() for i, nic in enumerate(nics)}
    for nic in gpus:
        if pairs.degree[nic] >= min_probes_per_nic:
            continue
        ring = by_rail[int(idx.nic_rail[nic])]
        others = ring if len(ring) > 1 else gpus
        start = position[nic] if len(ring) > 1 else gpus.index(nic)
        for dist in range(2, min(len(others), 64)):
            if pairs.degree[nic] >= min_probes_per_nic:
                break
            pairs.add(others[(start - dist) % len(others)], nic, "fill")
            if pairs.degree[nic] >= min_probes_per_nic:
                break
            pairs.add(nic, others[(start + dist) % len(others)], "fill")
    return pairs.pairs, pairs.degree


def _mesh_count(idx: _Index, rail_only: bool) -> int:
    """Pairs of NICs on different nodes that can reach each other (same rail only when rail_only)."""
    rails = sorted({int(r) for r in idx.nic_rail}) if rail_only else [None]
    total = 0
    n_groups = len(idx.group_uplinks)
    spine_groups: list[set[int]] = [set() for _ in idx.spine_names]
    for g, ups in enumerate(idx.group_uplinks):
        for s in ups:
            spine_groups[s].add(g)
    reach = [sorted(set().union(*(spine_groups[s] for s in ups))) for ups in idx.group_uplinks]
    for rail in rails:
        mask = np.ones(idx.n_nics, bool) if rail is None else idx.nic_rail == rail
        per_leaf = np.bincount(idx.nic_leaf[mask], minlength=idx.n_leaves).astype(np.int64)
        grouped = idx.leaf_group >= 0
        per_group = np.bincount(idx.leaf_group[grouped], weights=per_leaf[grouped], minlength=n_groups).astype(np.int64)
        quad = sum(int(per_group[g]) * int(per_group[reach[g]].sum()) for g in range(n_groups))
        quad += int((per_leaf[~grouped] ** 2).sum())
        total += (quad - int(per_leaf.sum())) // 2
    for nics in idx.node_nics:
        for i, a in enumerate(nics):
            for b in nics[i + 1 :]:
                if (not rail_only or idx.nic_rail[a] == idx.nic_rail[b]) and _routable(idx, a, b):
                    total -= 1
    return total


def _iter_mesh(idx: _Index, rail_only: bool, offset: int, limit: int) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    if limit <= 0:
        return out
    skip = offset
    node, leaf, rail = idx.nic_node, idx.nic_leaf, idx.nic_rail
    n = idx.n_nics
    group = idx.leaf_group
    spine_groups: list[set[int]] = [set() for _ in idx.spine_names]
    for g, ups in enumerate(idx.group_uplinks):
        for s in ups:
            spine_groups[s].add(g)
    reach = [
        np.array(sorted(set().union(*(spine_groups[s] for s in ups))), dtype=np.int64) for ups in idx.group_uplinks
    ]
    nic_group = group[leaf]
    for a in range(n - 1):
        b = np.arange(a + 1, n)
        ok = node[b] != node[a]
        if rail_only:
            ok &= rail[b] == rail[a]
        same_leaf = leaf[b] == leaf[a]
        ga = int(nic_group[a])
        cross = np.isin(nic_group[b], reach[ga]) if ga >= 0 else np.zeros(len(b), bool)
        ok &= same_leaf | cross
        partners = b[ok]
        if skip >= len(partners):
            skip -= len(partners)
            continue
        for bb in partners[skip:]:
            out.append((a, int(bb), _via(idx, a, int(bb))))
            if len(out) >= limit:
                return out
        skip = 0
    return out


def _coverage_from_pairs(idx: _Index, pairs: Sequence[tuple[int, int, int, Any]]) -> Coverage:
    nic = np.zeros(idx.n_nics, bool)
    spine = np.zeros(idx.n_spines, bool)
    link = np.zeros(idx.n_links, bool)
    if pairs:
        arr = np.array([(p[0], p[1], p[2]) for p in pairs], dtype=np.int64)
        nic[arr[:, 0]] = True
        nic[arr[:, 1]] = True
        cross = arr[:, 2] >= 0
        if cross.any():
            s = arr[cross, 2]
            spine[s] = True
            link[idx.links(idx.nic_leaf[arr[cross, 0]], s)] = True
            link[idx.links(idx.nic_leaf[arr[cross, 1]], s)] = True
    return _coverage(idx, nic, spine, link)


def _coverage_mesh(idx: _Index, rail_only: bool) -> Coverage:
    """Analytic coverage of full_mesh / rail: a NIC is covered when it has a partner; a link (and its spine) when
    another leaf under the spine has NICs (on a rail the leaf has, for rail mode)."""
    nic = np.zeros(idx.n_nics, bool)
    rails_of_leaf = [set(int(idx.nic_rail[n]) for n in nics) for nics in idx.leaf_nics]

    # NIC a has a partner when some reachable leaf holds a NIC (same rail) on another node; its own leaf first, the
    # leaves under its spines lazily (almost always the first leaf looked at answers).
    def partner(a: int, leaf: int) -> bool:
        return any(
            idx.nic_node[o] != idx.nic_node[a] and (not rail_only or idx.nic_rail[o] == idx.nic_rail[a])
            for o in idx.leaf_nics[leaf]
        )

    for a in range(idx.n_nics):
        la = int(idx.nic_leaf[a])
        nic[a] = partner(a, la) or any(
            partner(a, b) for s in idx.leaf_uplinks[la] for b in idx.spine_leaves[s] if b != la
        )
    spine = np.zeros(idx.n_spines, bool)
    link = np.zeros(idx.n_links, bool)
    for k in range(idx.n_links):
        a, s = int(idx.link_leaf[k]), int(idx.link_spine[k])
        for b in idx.spine_leaves[s]:
            if (
                b != a
                and idx.leaf_nics[b]
                and idx.leaf_nics[a]
                and (not rail_only or rails_of_leaf[a] & rails_of_leaf[b])
            ):
                link[k] = True
                spine[s] = True
                break
    return _coverage(idx, nic, spine, link)


def _count(names: Sequence[str], covered: np.ndarray) -> CoverageCount:
    missing = np.flatnonzero(~covered)
    return CoverageCount(
        total=len(names),
        covered=int(covered.sum()),
        not_covered=len(missing),
        not_covered_names=[names[i] for i in missing[:MAX_NAMES_LISTED]],
    )


def _coverage(idx: _Index, nic: np.ndarray, spine: np.ndarray, link: np.ndarray) -> Coverage:
    node = np.zeros(idx.n_nodes, bool)
    node[idx.nic_node[nic]] = True
    leaf = np.zeros(idx.n_leaves, bool)
    leaf[idx.nic_leaf[nic]] = True
    link_names = [
        link_name(idx.leaf_names[a], idx.spine_names[s]) for a, s in zip(idx.link_leaf, idx.link_spine, strict=True)
    ]
    counts = {
        "nic": _count(idx.nic_names, nic),
        "node": _count(idx.node_names, node),
        "leaf": _count(idx.leaf_names, leaf),
        "spine": _count(idx.spine_names, spine),
        "leaf_spine_link": _count(link_names, link),
    }
    return Coverage(complete=all(c.not_covered == 0 for c in counts.values()), **counts)


def plan_network_probes(
    topology: Topology | Mapping[str, Any],
    mode: Mode = "skeleton",
    *,
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    cross_leaf_per_uplink: int = 2,
    min_probes_per_nic: int = 4,
    limit: int | None = None,
    offset: int = 0,
) -> ProbePlan:
    """The pairs of NICs to probe, their count (against full mesh and rail), and what they cover.

    ``full_mesh``: all NIC pairs on different nodes that can reach each other; ``rail``: those on the same rail;
    ``skeleton``: the training traffic's pairs from the layout (tp, pp, dp; default tp = NICs per node, pp = 1,
    dp = nodes), plus ``cross_leaf_per_uplink`` pinned probes per leaf uplink and fill probes up to
    ``min_probes_per_nic``. Pairs are listed from ``offset``: ``limit`` of them (the whole result within
    MAX_RESULT_BYTES), or by default up to DEFAULT_PLAN_PAIRS within DEFAULT_BUDGET_BYTES (an agent's default call
    stays small; next_offset says where the next page starts)."""
    if mode not in ("full_mesh", "rail", "skeleton"):
        raise InputError(f"mode: got {mode!r}; accepted: 'full_mesh', 'rail' or 'skeleton'")
    budget = MAX_RESULT_BYTES if limit is not None else DEFAULT_BUDGET_BYTES
    limit = DEFAULT_PLAN_PAIRS if limit is None else limit
    for name, value, low, high in (
        ("limit", limit, 0, MAX_PLAN_LIMIT),
        ("offset", offset, 0, MAX_PLAN_OFFSET),
        ("cross_leaf_per_uplink", cross_leaf_per_uplink, 0, 64),
        ("min_probes_per_nic", min_probes_per_nic, 0, 64),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InputError(f"{name}: got {value!r}; accepted: an integer from {low:,} to {high:,}")
    idx = build_index(topology)
    if mode != "skeleton" and any(v is not None for v in (tp, pp, dp)):
        raise InputError(f"tp/pp/dp: a layout applies to mode 'skeleton' only; got mode {mode!r}")
    full = _mesh_count(idx, rail_only=False)
    rail = _mesh_count(idx, rail_only=True)
    notes: list[str] = []
    layout = None
    per_nic = None
    if mode == "skeleton":
        layout = _resolve_layout(idx, tp, pp, dp)
        all_pairs, degree = _skeleton(idx, layout, cross_leaf_per_uplink, min_probes_per_nic)
        count = len(all_pairs)
        chosen = [(a, b, v, r) for a, b, v, r in all_pairs[offset : offset + limit]]
        coverage = _coverage_from_pairs(idx, all_pairs)
        per_nic = ProbesPerNic(
            min=int(degree.min()) if len(degree) else 0,
            median=float(np.median(degree)) if len(degree) else 0.0,
            max=int(degree.max()) if len(degree) else 0,
        )
        if not layout.given:
            notes.append(
                f"layout: none given; assumed tp={layout.tp} (one node), pp=1, dp={layout.dp}: a data-parallel ring "
                "per rail over all nodes"
            )
    else:
        count = full if mode == "full_mesh" else rail
        listed = _iter_mesh(idx, mode == "rail", offset, min(limit, max(0, count - offset)))
        chosen = [(a, b, v, mode) for a, b, v in listed]  # type: ignore[misc]
        coverage = _coverage_mesh(idx, mode == "rail")
        notes.append("spine and link coverage of full_mesh / rail: reachable by some pair (the pairs are not listed)")
    pairs = [
        ProbePair(
            src_nic=idx.nic_names[a],
            dst_nic=idx.nic_names[b],
            via_spine=idx.spine_names[v] if v >= 0 else None,
            reason=r,
        )
        for a, b, v, r in chosen
    ]
    if not coverage.complete:
        notes.append("not every component is crossed by a probe: see coverage.*.not_covered_names")
    whole = ProbePlan(
        mode=mode,
        count=count,
        full_mesh_count=full,
        rail_count=rail,
        ratio_to_full_mesh=count / full if full else 0.0,
        layout=layout,
        pairs=pairs,
        offset=offset,
        next_offset=None,
        has_more=False,
        coverage=coverage,
        probes_per_nic=per_nic,
        notes=notes,
    )

    def build(scale: float) -> ProbePlan:
        """The plan listing fewer pairs (and not-covered names) as scale shrinks; the page still ends where it
        says (next_offset), so paging on gives every pair."""
        listed = pairs if scale >= 1 else pairs[: scaled(len(pairs), scale) if pairs else 0]
        end = offset + len(listed)
        names = scaled(MAX_NAMES_LISTED, scale)
        cover = coverage.model_copy(
            update={
                kind: getattr(coverage, kind).model_copy(
                    update={"not_covered_names": getattr(coverage, kind).not_covered_names[:names]}
                )
                for kind in KINDS
            }
        )
        return whole.model_copy(
            update={"pairs": listed, "next_offset": end if end < count else None, "has_more": end < count,
                    "coverage": cover}
        )  # fmt: skip

    return fit(build, budget)


def plan_pairs(
    topology: Topology | Mapping[str, Any],
    mode: Mode = "skeleton",
    *,
    tp: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    cross_leaf_per_uplink: int = 2,
    min_probes_per_nic: int = 4,
    max_pairs: int = 5_000_000,
) -> list[tuple[str, str, str | None]]:
    """Every pair of a plan as (src_nic, dst_nic, via_spine), for a prober or the simulator (no paging).
    InputError when the plan has more than max_pairs pairs."""
    idx = build_index(topology)
    if mode == "skeleton":
        layout = _resolve_layout(idx, tp, pp, dp)
        raw = [(a, b, v) for a, b, v, _ in _skeleton(idx, layout, cross_leaf_per_uplink, min_probes_per_nic)[0]]
    else:
        count = _mesh_count(idx, mode == "rail")
        if count > max_pairs:
            raise InputError(f"mode {mode!r}: {count:,} pairs; accepted: at most {max_pairs:,} (use skeleton)")
        raw = _iter_mesh(idx, mode == "rail", 0, count)
    names, spines = idx.nic_names, idx.spine_names
    return [(names[a], names[b], spines[v] if v >= 0 else None) for a, b, v in raw]


# ---- probe input -------------------------------------------------------------------------------------------------


@dataclass
class _Probes:
    src: np.ndarray
    dst: np.ndarray
    latency: np.ndarray  # NaN: none
    loss: np.ndarray
    bandwidth: np.ndarray  # NaN: none
    layer: np.ndarray  # 0: none given, 1: underlay, 2: overlay
    spine: np.ndarray  # -1: not given (or same leaf)

    def __len__(self) -> int:
        return len(self.src)


LAYER_NAMES = ("unspecified", "underlay", "overlay")
_LAYER_CODE = {None: 0, "underlay": 1, "overlay": 2}


def _number(value: Any, where: str, what: str, *, low: float, high: float | None, nullable: bool) -> float:
    if value is None:
        if nullable:
            return math.nan
        raise InputError(f"{where}: missing; accepted: {what}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: got {type(value).__name__} {str(value)[:40]!r}; accepted: {what}")
    v = float(value)
    if math.isnan(v) or math.isinf(v) or v < low or (high is not None and v > high):
        raise InputError(f"{where}: got {value!r}; accepted: {what}")
    return v


def _row_error(where: str, get: Mapping[str, Any], key: str) -> InputError:
    """The message for a value the fast path did not accept (the slow path says what is wrong with it)."""
    if key not in get:
        what = "a number from 0 to 1" if key == "loss_rate" else "a number >= 0, or null when all were lost"
        return InputError(f"{where}.{key}: missing; accepted: {what}")
    try:
        if key == "loss_rate":
            _number(get[key], f"{where}.{key}", "a number from 0 to 1", low=0, high=1, nullable=False)
        else:
            _number(get[key], f"{where}.{key}", "a number >= 0 or null", low=0, high=None, nullable=True)
    except InputError as exc:
        return exc
    return InputError(f"{where}.{key}: not accepted")


_NUMBER = frozenset({float, int})
_NUMBER_OR_NONE = frozenset({float, int, type(None)})
_LAYERS = frozenset({None, "overlay", "underlay"})


def _numbers(values: list[Any], *, nullable: bool, high: float | None) -> np.ndarray | None:
    """values as floats (None -> NaN when nullable), or None when any is of another type, NaN, infinite or out of
    [0, high]."""
    if not {type(v) for v in values} <= (_NUMBER_OR_NONE if nullable else _NUMBER):
        return None
    arr = np.array(values, dtype=float)
    finite = np.isfinite(arr)
    if int((~finite).sum()) != (values.count(None) if nullable else 0):
        return None
    given = arr[finite]
    if (given < 0).any() or (high is not None and (given > high).any()):
        return None
    return arr


def _load_fast(idx: _Index, probes: Sequence[Any]) -> _Probes | None:
    """Rows that are plain dicts with accepted keys and values, read a column at a time; None when any row needs a
    look of its own (the per-row path then says which one and why)."""
    allowed = frozenset(PROBE_FIELDS)
    nic_id = idx.nic_id
    try:
        if not all(type(r) is dict and r.keys() <= allowed and "latency_us" in r for r in probes):
            return None
        src = np.array([nic_id.get(r.get("src_nic"), -1) for r in probes], np.int64)
        dst = np.array([nic_id.get(r.get("dst_nic"), -1) for r in probes], np.int64)
        layers = [r.get("layer") for r in probes]
        if not set(layers) <= _LAYERS:
            return None
        spine_names = [r.get("spine") for r in probes]
        spine_set = set(spine_names)
    except TypeError:  # an unhashable name
        return None
    if (src < 0).any() or (dst < 0).any() or (src == dst).any():
        return None
    loss = _numbers([r.get("loss_rate") for r in probes], nullable=False, high=1.0)
    lat = _numbers([r["latency_us"] for r in probes], nullable=True, high=None)
    bw = _numbers([r.get("bandwidth_gbps") for r in probes], nullable=True, high=None)
    if loss is None or lat is None or bw is None:
        return None
    layer = np.array([_LAYER_CODE[x] for x in layers], np.int8) if len(set(layers)) > 1 or layers[0] else None
    if spine_set == {None}:
        spine = np.full(len(probes), -1, np.int64)
    else:
        if not all(x is None or type(x) is str for x in spine_set):
            return None
        spine_id = idx.spine_id
        spine = np.array([-1 if x is None else spine_id.get(x, -2) for x in spine_names], np.int64)
        if (spine == -2).any():
            return None
    la, lb = idx.nic_leaf[src].astype(np.int64), idx.nic_leaf[dst].astype(np.int64)
    cross = la != lb
    known = spine >= 0
    if (known & ~cross).any():
        return None
    if known.any():
        s = spine[known]
        for leaves in (la[known], lb[known]):
            keys = leaves * max(1, idx.n_spines) + s
            pos = np.minimum(np.searchsorted(idx.link_keys, keys), len(idx.link_keys) - 1)
            if not (idx.link_keys[pos] == keys).all():
                return None
    unknown = cross & ~known
    if unknown.any():
        ga, gb = idx.leaf_group[la[unknown]].astype(np.int64), idx.leaf_group[lb[unknown]].astype(np.int64)
        if (ga < 0).any() or (gb < 0).any():
            return None
        width = len(idx.group_uplinks) + 1
        for key in np.unique(np.minimum(ga, gb) * width + np.maximum(ga, gb)):
            g, h = divmod(int(key), width)
            if not set(idx.group_uplinks[g]) & set(idx.group_uplinks[h]):
                return None
    return _Probes(
        src=src.astype(np.int32),
        dst=dst.astype(np.int32),
        latency=lat,
        loss=loss,
        bandwidth=bw,
        layer=layer if layer is not None else np.zeros(len(probes), np.int8),
        spine=spine.astype(np.int32),
    )


def _load_probes(idx: _Index, probes: Sequence[ProbeRow | Mapping[str, Any]]) -> _Probes:
    if isinstance(probes, str | bytes) or not isinstance(probes, Sequence):
        raise InputError(f"probes: got {type(probes).__name__}; accepted: a list of rows, each {PROBE_ACCEPTED}")
    n = len(probes)
    if n == 0:
        raise InputError(f"probes: empty; accepted: at least one probe row, each {PROBE_ACCEPTED}")
    if n > MAX_PROBES:
        raise InputError(f"probes: {n:,} rows; accepted: at most {MAX_PROBES:,} per call (split by time window)")
    fast = _load_fast(idx, probes)
    if fast is not None:
        return fast
    src: list[int] = []
    dst: list[int] = []
    lat: list[float] = []
    loss: list[float] = []
    bw: list[float] = []
    layer: list[int] = []
    spine: list[int] = []
    problems: list[str] = []
    nic_id, spine_id = idx.nic_id, idx.spine_id
    nic_leaf = idx.nic_leaf.tolist()
    examples = ", ".join(repr(x) for x in idx.nic_names[:3])
    allowed = frozenset(PROBE_FIELDS)
    shared_of: dict[tuple[int, int], tuple[int, ...]] = {}
    nan = math.nan
    for i, row in enumerate(probes):
        try:
            if type(row) is dict and row.keys() <= allowed:
                get: Mapping[str, Any] = row
            elif isinstance(row, ProbeRow):
                get = row.__dict__
            elif isinstance(row, Mapping):
                extra = [k for k in row if k not in allowed]
                if extra:
                    raise InputError(
                        f"probes[{i}]: unknown field {str(extra[0])[:40]!r}; accepted: {', '.join(PROBE_FIELDS)}"
                    )
                get = row
            else:
                raise InputError(f"probes[{i}]: got {type(row).__name__}; accepted: {PROBE_ACCEPTED}")
            a_name, b_name = get.get("src_nic"), get.get("dst_nic")
            a = nic_id.get(a_name) if type(a_name) is str else None
            b = nic_id.get(b_name) if type(b_name) is str else None
            if a is None or b is None:
                key, name = ("src_nic", a_name) if a is None else ("dst_nic", b_name)
                shown = "missing" if name is None else f"unknown NIC {str(name)[:60]!r}"
                raise InputError(
                    f"probes[{i}].{key}: {shown}; accepted: a NIC name from the topology ({examples}, ...)"
                )
            if a == b:
                raise InputError(f"probes[{i}]: src_nic and dst_nic are both {a_name!r}; accepted: two different NICs")
            v = get.get("loss_rate")
            if (type(v) is float or type(v) is int) and 0.0 <= v <= 1.0:
                loss_v = float(v)
            else:
                raise _row_error(f"probes[{i}]", get, "loss_rate")
            v = get.get("latency_us", False)
            if v is None:
                lat_v = nan
            elif (type(v) is float or type(v) is int) and 0.0 <= v < math.inf:
                lat_v = float(v)
            else:
                raise _row_error(f"probes[{i}]", get, "latency_us")
            v = get.get("bandwidth_gbps")
            if v is None:
                bw_v = nan
            else:
                bw_v = _number(
                    v, f"probes[{i}].bandwidth_gbps", "a number >= 0 or null", low=0, high=None, nullable=True
                )
            lay = get.get("layer")
            code = _LAYER_CODE.get(lay) if lay is None or type(lay) is str else None
            if code is None:
                raise InputError(f"probes[{i}].layer: got {str(lay)[:40]!r}; accepted: 'overlay', 'underlay' or null")
            la, lb = nic_leaf[a], nic_leaf[b]
            sp = get.get("spine")
            s = -1
            if la != lb:
                shared = shared_of.get((la, lb))
                if shared is None:
                    shared = shared_of[(la, lb)] = idx.shared(la, lb)
                if not shared:
                    raise InputError(
                        f"probes[{i}]: {a_name!r} (leaf {idx.leaf_names[la]!r}) and {b_name!r} "
                        f"(leaf {idx.leaf_names[lb]!r}) share no spine, so no path joins them; accepted: probes "
                        "between NICs on one leaf or on leaves with a common spine"
                    )
                if sp is not None:
                    found = spine_id.get(sp) if type(sp) is str else None
                    if found is None or found not in shared:
                        raise InputError(
                            f"probes[{i}].spine: {str(sp)[:60]!r} is not a spine both leaves uplink to; accepted: "
                            f"one of {[idx.spine_names[x] for x in shared[:5]]}{' ...' if len(shared) > 5 else ''} "
                            "or null"
                        )
                    s = found
            elif sp is not None:
                raise InputError(
                    f"probes[{i}].spine: {str(sp)[:60]!r} given for a probe within one leaf; accepted: null"
                )
        except InputError as exc:
            problems.append(str(exc))
            if len(problems) > MAX_PROBLEMS:
                problems.append("... (more rows not checked)")
                break
            continue
        src.append(a)
        dst.append(b)
        loss.append(loss_v)
        lat.append(lat_v)
        bw.append(bw_v)
        layer.append(code)
        spine.append(s)
    _raise(problems)
    return _Probes(
        src=np.array(src, np.int32),
        dst=np.array(dst, np.int32),
        latency=np.array(lat, float),
        loss=np.array(loss, float),
        bandwidth=np.array(bw, float),
        layer=np.array(layer, np.int8),
        spine=np.array(spine, np.int32),
    )


# ---- localization ------------------------------------------------------------------------------------------------


MAX_INCIDENCE = 16_000_000  # path entries one call may hold (module docstring, Bounds): at most 9 per probe
PATH_COLUMNS = 9  # a probe's exact components: its NICs, their nodes, their leaves, a known spine and its two links


def _ranges(start: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """The positions start[s] .. start[s + 1] - 1 of every s in sel, concatenated (a gather from CSR rows)."""
    lo = start[sel]
    n = start[sel + 1] - lo
    ends = np.cumsum(n)
    return np.repeat(lo - ends + n, n) + np.arange(int(ends[-1]) if len(ends) else 0)


class _Routes(NamedTuple):
    """A layer's probes as paths, worked out before the incidence is allocated (sizes only: O(probes) memory).
    ``spine``: the spine crossed, known from the row or because the two leaves share only one (-1: same leaf or
    ECMP-ambiguous). ECMP-ambiguous probes (cross leaf, k >= 2 shared spines, none named) are members of three
    rows of an ECMP table: their pair of leaf groups (the row's components: the k spines) and each end's (leaf, other
    end's group) (the k links from that leaf to those spines)."""

    a: np.ndarray
    b: np.ndarray
    na: np.ndarray
    nb: np.ndarray
    la: np.ndarray
    lb: np.ndarray
    spine: np.ndarray
    amb_at: np.ndarray  # positions (in the layer's rows) of the ECMP-ambiguous probes
    gp_of: np.ndarray  # per ambiguous probe: its leaf-group pair row
    gp_shared: list[tuple[int, ...]]  # per leaf-group pair row: the spines shared
    lh_of: np.ndarray  # (2, ambiguous): each end's (leaf, other group) row, numbered from 0
    lh_leaf: np.ndarray  # per (leaf, other group) row: the leaf
    lh_gp: np.ndarray  # per (leaf, other group) row: its leaf-group pair row
    exact: int  # entries of weight 1
    table: int  # ECMP table entries: sum over its rows of the spines shared

    @property
    def rows(self) -> int:
        return len(self.gp_shared) + len(self.lh_leaf)

    @property
    def work(self) -> int:
        return self.exact + 3 * len(self.amb_at) + self.table


def _routes(idx: _Index, pr: _Probes, rows: np.ndarray) -> _Routes:
    a, b = pr.src[rows].astype(np.int64), pr.dst[rows].astype(np.int64)
    la, lb = idx.nic_leaf[a].astype(np.int64), idx.nic_leaf[b].astype(np.int64)
    na, nb = idx.nic_node[a].astype(np.int64), idx.nic_node[b].astype(np.int64)
    cross = la != lb
    spine = np.where(cross, pr.spine[rows].astype(np.int64), -1)
    width = len(idx.group_uplinks) + 1
    amb_at = np.flatnonzero(cross & (spine < 0))
    gp_shared: list[tuple[int, ...]] = []
    gp_of = np.zeros(0, np.int64)
    if len(amb_at):
        ga, gb = idx.leaf_group[la[amb_at]].astype(np.int64), idx.leaf_group[lb[amb_at]].astype(np.int64)
        _, first, inv = np.unique(
            np.minimum(ga, gb) * width + np.maximum(ga, gb), return_index=True, return_inverse=True
        )
        shared = [idx.shared(int(la[amb_at[f]]), int(lb[amb_at[f]])) for f in first]
        single = np.array([s[0] if len(s) == 1 else -1 for s in shared], np.int64)
        spine[amb_at] = single[inv]  # leaves with one spine in common: one path, known
        wide = np.flatnonzero(single < 0)
        renumber = np.full(len(shared), -1, np.int64)
        renumber[wide] = np.arange(len(wide))
        keep = single[inv] < 0
        amb_at, gp_of = amb_at[keep], renumber[inv[keep]]
        gp_shared = [shared[i] for i in wide]
    if len(amb_at):
        ga, gb = idx.leaf_group[la[amb_at]].astype(np.int64), idx.leaf_group[lb[amb_at]].astype(np.int64)
        lh = np.concatenate([la[amb_at] * width + gb, lb[amb_at] * width + ga])
        lh_keys, lh_first, lh_inv = np.unique(lh, return_index=True, return_inverse=True)
        lh_of = lh_inv.reshape(2, len(amb_at))
        lh_leaf = lh_keys // width
        lh_gp = np.concatenate([gp_of, gp_of])[lh_first]
    else:
        lh_of, lh_leaf, lh_gp = np.zeros((2, 0), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    gp_k = np.array([len(s) for s in gp_shared], np.int64)
    exact = 4 * len(rows) + int((na != nb).sum()) + int(cross.sum()) + 3 * int((spine >= 0).sum())
    table = int(gp_k.sum() + gp_k[lh_gp].sum()) if len(gp_k) else 0
    return _Routes(a, b, na, nb, la, lb, spine, amb_at, gp_of, gp_shared, lh_of, lh_leaf, lh_gp, exact, table)


def _check_work(n_probes: int, routes: Sequence[_Routes]) -> None:
    """Refuse, before anything of the size of the incidence is allocated, a call whose incidence exceeds
    MAX_INCIDENCE entries, with the numbers."""
    exact = sum(r.exact for r in routes)
    amb = sum(len(r.amb_at) for r in routes)
    table = sum(r.table for r in routes)
    work = exact + 3 * amb + table
    if work <= MAX_INCIDENCE:
        return
    rows = sum(r.rows for r in routes)
    k = max((len(s) for r in routes for s in r.gp_shared), default=0)
    raise InputError(
        f"probes: {n_probes:,} probes make {work:,} path entries, over the bound: {exact:,} NIC, node, leaf and known "
        f"spine and link entries ({exact / max(1, n_probes):.1f} per probe), 3 per ECMP-ambiguous probe ({amb:,}), "
        f"and an ECMP table of {table:,} entries ({rows:,} rows: leaf-group pairs and (leaf, other leaf's group) "
        f"pairs the ambiguous probes join, each with its shared spines, up to {k:,}); accepted: at most "
        f"{MAX_INCIDENCE:,} entries per call ({MAX_PROBES:,} probes fit with an ECMP table of up to "
        f"{MAX_INCIDENCE - PATH_COLUMNS * MAX_PROBES:,} entries): split the probes (by time window or by leaves) or "
        "name the spine each cross-leaf probe crossed"
    )


@dataclass
class _Incidence:
    """Probe -> component incidence of one layer (probe ids are into the whole probe set). Exact part: one entry
    (probe, component) of weight 1 per component on a probe's path (at most PATH_COLUMNS), kept probe-major
    (``path``) and sorted by component. ECMP part (_Routes): each ambiguous probe is a member of three table rows, and
    each component of a row is on its members' paths with weight 1/k. So the size is about probes x path length plus
    the table, not probes x shared spines."""

    rows: np.ndarray  # the layer's probes, ascending
    path: np.ndarray  # (PATH_COLUMNS, probes) int32: each probe's exact components, -1: none
    path_rows: np.ndarray  # (3, probes) int32: each probe's ECMP table rows, -1: none
    probe: np.ndarray  # exact entries sorted by component (stable: a NIC's probes as source, then as destination)
    comp: np.ndarray
    member: np.ndarray  # ECMP members (probe ids) by table row
    member_row: np.ndarray
    member_start: np.ndarray  # row r's members: member[member_start[r] : member_start[r + 1]]
    row_k: np.ndarray  # shared spines per table row
    row_comp: np.ndarray  # the components of the rows, row after row (row r has row_k[r])
    sorted_comp: np.ndarray  # row_comp sorted, and each one's row
    sorted_row: np.ndarray

    def table_rows(self, cc: int) -> np.ndarray:
        """The ECMP table rows that hold component cc."""
        key = np.int32(cc)  # a needle of the array's type: another one makes searchsorted copy the whole array
        lo, hi = np.searchsorted(self.sorted_comp, key), np.searchsorted(self.sorted_comp, key, side="right")
        return self.sorted_row[lo:hi].astype(np.int64)

    def through(self, cc: int) -> tuple[np.ndarray, np.ndarray]:
        """The probes whose path has component cc, and its weight on each (1, or 1/k when ECMP-ambiguous)."""
        key = np.int32(cc)
        lo, hi = np.searchsorted(self.comp, key), np.searchsorted(self.comp, key, side="right")
        rws = self.table_rows(cc)
        lens = self.member_start[rws + 1] - self.member_start[rws]
        probes = np.concatenate([self.probe[lo:hi], self.member[_ranges(self.member_start, rws)]])
        weights = np.concatenate([np.ones(hi - lo), np.repeat(1.0 / self.row_k[rws], lens)])
        return probes.astype(np.int64), weights


def _incidence(idx: _Index, rows: np.ndarray, rt: _Routes) -> _Incidence:
    off = idx.offsets
    n = len(rows)
    path = np.full((PATH_COLUMNS, n), -1, np.int32)
    path[0], path[1] = rt.a, rt.b
    path[2], path[3] = off["node"] + rt.na, off["leaf"] + rt.la
    path[4] = np.where(rt.na != rt.nb, off["node"] + rt.nb, -1)
    path[5] = np.where(rt.la != rt.lb, off["leaf"] + rt.lb, -1)
    known = np.flatnonzero(rt.spine >= 0)
    s = rt.spine[known]
    path[6, known] = off["spine"] + s
    path[7, known] = off["leaf_spine_link"] + idx.links(rt.la[known], s)
    path[8, known] = off["leaf_spine_link"] + idx.links(rt.lb[known], s)
    flat = path.ravel()  # column after column: the order of the entries within a component (sources first)
    valid = flat >= 0
    comp = flat[valid]
    probe = np.tile(rows.astype(np.int32), PATH_COLUMNS)[valid]
    del flat, valid
    order = np.argsort(comp, kind="stable")
    comp, probe = comp[order], probe[order]
    del order
    # The ECMP table: leaf-group pair rows, then (leaf, other group) rows.
    n_gp = len(rt.gp_shared)
    gp_k = np.array([len(x) for x in rt.gp_shared], np.int64)
    row_k = np.concatenate([gp_k, gp_k[rt.lh_gp]]) if n_gp else np.zeros(0, np.int64)
    if n_gp:
        gp_spines = np.concatenate([np.array(x, np.int64) for x in rt.gp_shared])
        gp_start = np.concatenate([[0], np.cumsum(gp_k)])
        lh_spines = gp_spines[_ranges(gp_start, rt.lh_gp)]
        lh_links = idx.links(np.repeat(rt.lh_leaf, gp_k[rt.lh_gp]), lh_spines)
        row_comp = np.concatenate([off["spine"] + gp_spines, off["leaf_spine_link"] + lh_links]).astype(np.int32)
    else:
        row_comp = np.zeros(0, np.int32)
    entry_row = np.repeat(np.arange(len(row_k), dtype=np.int32), row_k)
    order = np.argsort(row_comp, kind="stable")
    sorted_comp, sorted_row = row_comp[order], entry_row[order]
    path_rows = np.full((3, n), -1, np.int32)
    path_rows[0, rt.amb_at] = rt.gp_of
    path_rows[1, rt.amb_at] = n_gp + rt.lh_of[0]
    path_rows[2, rt.amb_at] = n_gp + rt.lh_of[1]
    m_row = path_rows[:, rt.amb_at].ravel()
    m_probe = np.tile(rows[rt.amb_at].astype(np.int32), 3)
    order = np.argsort(m_row, kind="stable")
    member, member_row = m_probe[order], m_row[order]
    member_start = np.searchsorted(member_row, np.arange(len(row_k) + 1))
    return _Incidence(
        rows=rows,
        path=path,
        path_rows=path_rows,
        probe=probe,
        comp=comp,
        member=member,
        member_row=member_row,
        member_start=member_start,
        row_k=row_k,
        row_comp=row_comp,
        sorted_comp=sorted_comp,
        sorted_row=sorted_row,
    )


@dataclass
class _Bad:
    bad: np.ndarray
    by_loss: np.ndarray
    by_latency: np.ndarray
    by_bandwidth: np.ndarray
    latency_ratio: np.ndarray
    baselines: list[ClassBaseline]
    warnings: list[str]


def _classify(idx: _Index, pr: _Probes, th: Thresholds) -> _Bad:
    same = idx.nic_leaf[pr.src] == idx.nic_leaf[pr.dst]
    cls = pr.layer.astype(np.int64) * 2 + (~same).astype(np.int64)
    by_loss = pr.loss > th.loss_threshold
    lat_base = np.full(6, math.nan)
    bw_base = np.full(6, math.nan)
    baselines: list[ClassBaseline] = []
    warnings: list[str] = []
    usable_lat = np.isfinite(pr.latency) & (pr.loss < 1.0)
    usable_bw = np.isfinite(pr.bandwidth)
    for layer in range(3):
        in_layer = pr.layer == layer
        if not in_layer.any():
            continue
        layer_lat = pr.latency[in_layer & usable_lat]
        layer_bw = pr.bandwidth[in_layer & usable_bw]
        for crossing in (0, 1):
            c = layer * 2 + crossing
            members = cls == c
            if not members.any():
                continue
            lats = pr.latency[members & usable_lat]
            bws = pr.bandwidth[members & usable_bw]
            if len(lats) >= MIN_CLASS_PROBES:
                lat_base[c] = float(np.quantile(lats, LATENCY_BASELINE_QUANTILE))
            elif len(layer_lat):
                lat_base[c] = float(np.quantile(layer_lat, LATENCY_BASELINE_QUANTILE))
                warnings.append(
                    f"{LAYER_NAMES[layer]} {'cross' if crossing else 'same'}-leaf probes: {len(lats)} latencies, "
                    "too few for a class baseline; the layer's baseline is used"
                )
            if len(bws) >= MIN_CLASS_PROBES:
                bw_base[c] = float(np.quantile(bws, BANDWIDTH_BASELINE_QUANTILE))
            elif len(layer_bw):
                bw_base[c] = float(np.quantile(layer_bw, BANDWIDTH_BASELINE_QUANTILE))
            baselines.append(
                ClassBaseline(
                    layer=LAYER_NAMES[layer],
                    path_class="cross_leaf" if crossing else "same_leaf",
                    probes=int(members.sum()),
                    latency_us=None if math.isnan(lat_base[c]) else round(lat_base[c], 4),
                    bandwidth_gbps=None if math.isnan(bw_base[c]) else round(bw_base[c], 4),
                )
            )
    base = lat_base[cls]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(np.isfinite(pr.latency) & (base > 0), pr.latency / base, math.nan)
        by_latency = np.nan_to_num(ratio, nan=0.0) > th.latency_factor
        bwb = bw_base[cls]
        by_bw = np.isfinite(pr.bandwidth) & (bwb > 0) & (pr.bandwidth < th.bandwidth_factor * bwb)
    return _Bad(
        bad=by_loss | by_latency | by_bw,
        by_loss=by_loss,
        by_latency=by_latency,
        by_bandwidth=by_bw,
        latency_ratio=ratio,
        baselines=baselines,
        warnings=warnings,
    )


@dataclass
class _Pick:
    comp: int
    q: float
    score: float
    ambiguous_with: list[int] = field(default_factory=list)


@dataclass
class _LayerResult:
    picks: list[_Pick]
    near: dict[int, float]  # component -> best gain, for components not picked
    noise: float


class _Sums:
    """Sums by key of values given per entry (keys < n): a bincount over the keys present (np.unique, for a few
    entries) or over all n (for many: linear, no sort)."""

    def __init__(self, keys: np.ndarray, n: int) -> None:
        self.dense = len(keys) > n // 4
        if self.dense:
            self.keys, self.inv = np.arange(n), keys
        else:
            self.keys, self.inv = np.unique(keys, return_inverse=True)

    def sums(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.inv, weights=values, minlength=len(self.keys))

    def add_to(self, out: np.ndarray, values: np.ndarray) -> None:
        if self.dense:
            out += self.sums(values)
        else:
            out[self.keys] += self.sums(values)


def _leaf_pairs(idx: _Index, pr: _Probes, rows: np.ndarray) -> int:
    """Distinct (unordered) leaf pairs of the probes `rows`, in time linear in them when the pairs fit a bitmap."""
    la, lb = idx.nic_leaf[pr.src[rows]].astype(np.int64), idx.nic_leaf[pr.dst[rows]].astype(np.int64)
    keys = np.minimum(la, lb) * idx.n_leaves + np.maximum(la, lb)
    if idx.n_leaves**2 <= max(1 << 20, 4 * len(keys)):
        seen = np.zeros(idx.n_leaves**2, bool)
        seen[keys] = True
        return int(np.count_nonzero(seen))
    return len(np.unique(keys))


def _layer_candidates(
    idx: _Index, inc: _Incidence, bad: np.ndarray, th: Thresholds
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The components with at least min_failed bad probes through them (no other can be named faulty): their ids,
    every component's count of bad probes, and each ECMP table row's."""
    n_rows = len(inc.row_k)
    exact_bad = bad[inc.probe]
    member_bad = bad[inc.member]
    row_bad = np.bincount(inc.member_row[member_bad], minlength=n_rows)
    bad_counts = np.bincount(inc.comp[exact_bad], minlength=idx.n_components)
    if n_rows:
        ecmp_bad = np.bincount(inc.row_comp, weights=np.repeat(row_bad, inc.row_k), minlength=idx.n_components)
        bad_counts = bad_counts + np.rint(ecmp_bad).astype(np.int64)
    return np.flatnonzero(bad_counts >= th.min_failed), bad_counts, row_bad


class _LayerFit:
    """The greedy fit of one layer over its candidates: the incidence restricted to them, the log-likelihood gain of
    each candidate at each loss rate of QGRID, and the search that names components one at a time."""

    def __init__(
        self,
        idx: _Index,
        inc: _Incidence,
        layer_rows: np.ndarray,
        bad: np.ndarray,
        n_probes: int,
        th: Thresholds,
        cost: float,
        pr: _Probes,
        candidates: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        cand_ids, bad_counts, row_bad = candidates
        self.idx, self.inc, self.bad, self.n_probes, self.th, self.cost, self.pr = idx, inc, bad, n_probes, th, cost, pr
        self.cand_ids = cand_ids
        self.n_rows = n_rows = len(inc.row_k)
        self.n_cand = n_cand = len(cand_ids)
        remap = np.full(idx.n_components, -1, np.int32)
        remap[cand_ids] = np.arange(n_cand, dtype=np.int32)
        # Exact entries of candidates (still sorted by candidate: remap is increasing); only the bad ones depend on
        # the fit (a good probe adds log(1 - q w) whatever else is on its path).
        ec = remap[inc.comp]
        keep = ec >= 0
        self.p, self.c, self.b = p, c, b = inc.probe[keep], ec[keep], bad[inc.probe][keep]
        del ec, keep
        self.starts = np.searchsorted(c, np.arange(n_cand + 1))
        self.n_good = np.bincount(c[~b], minlength=n_cand).astype(float)
        # The bad probes of the layer, numbered: their exact candidates and ECMP rows, probe-major, for the updates.
        bad_at = np.flatnonzero(bad[layer_rows])
        self.bad_probe = bad_probe = layer_rows[bad_at].astype(np.int64)
        self.bad_index = bad_index = np.full(n_probes, -1, np.int32)
        bad_index[bad_probe] = np.arange(len(bad_probe), dtype=np.int32)
        bad_path = inc.path[:, bad_at]
        self.bad_path = np.where(bad_path >= 0, remap[np.maximum(bad_path, 0)], -1)
        self.bad_path_rows = inc.path_rows[:, bad_at]
        self.eb_c, self.eb_i = c[b], bad_index[p[b]]
        # ECMP table entries of candidates, row after row (a candidate's own rows: inc.table_rows).
        self.row_w = row_w = 1.0 / np.maximum(inc.row_k, 1)
        t_c = remap[inc.row_comp]
        t_keep = t_c >= 0
        self.t_c = t_c[t_keep]
        self.t_r = t_r = np.repeat(np.arange(n_rows, dtype=np.int32), inc.row_k)[t_keep]
        del t_keep
        self.t_start = np.searchsorted(t_r, np.arange(n_rows + 1))
        member_bad = bad[inc.member]
        self.mb_row = mb_row = inc.member_row[member_bad].astype(np.int64)
        self.mb_probe = inc.member[member_bad].astype(np.int64)
        self.mb_start = np.searchsorted(mb_row, np.arange(n_rows + 1))
        self.mb_w = row_w[mb_row]
        self.row_good = (np.diff(inc.member_start) - row_bad).astype(float)
        self.n_bad = bad_counts[cand_ids]
        self.kinds = idx.kind_of(cand_ids)
        self.spine_kind = KINDS.index("spine")
        self.aggregate_kinds = np.asarray([KINDS.index(k) for k in ("leaf", "spine", "node")])
        self.layer_rows = layer_rows
        self.logq = np.log1p(-QGRID)

    def gains(self, good: np.ndarray) -> np.ndarray:
        n_cand, n_rows, mb_row = self.n_cand, self.n_rows, self.mb_row
        gi = good[self.bad_probe]
        base = np.log1p(-gi)
        gm = good[self.mb_probe]
        mbase = np.log1p(-gm)
        out = np.empty((len(QGRID), n_cand))
        for k, q in enumerate(QGRID):
            term = np.log1p(-gi * (1.0 - q)) - base
            out[k] = np.bincount(self.eb_c, weights=term[self.eb_i], minlength=n_cand) + self.n_good * self.logq[k]
            if n_rows:
                row = np.bincount(mb_row, weights=np.log1p(-gm * (1.0 - q * self.mb_w)) - mbase, minlength=n_rows)
                row += self.row_good * np.log(1.0 - q * self.row_w)
                out[k] += np.bincount(self.t_c, weights=row[self.t_r], minlength=n_cand)
        return out

    def update(self, out: np.ndarray, which: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        """Gains after the bad probes `which` (numbers) went from P(good) `old` to `new`: only their terms change."""
        m = len(which)
        if not m:
            return
        ents = self.bad_path[:, which].ravel()
        valid = ents >= 0
        cols = _Sums(ents[valid], self.n_cand)
        owner = np.tile(np.arange(m), PATH_COLUMNS)[valid]
        rws = self.bad_path_rows[:, which].ravel()
        r_valid = rws >= 0
        rws, r_owner = rws[r_valid].astype(np.int64), np.tile(np.arange(m), 3)[r_valid]
        urows = _Sums(rws, self.n_rows)
        t_start = self.t_start
        epos = _ranges(t_start, urows.keys)
        e_row = np.repeat(np.arange(len(urows.keys)), t_start[urows.keys + 1] - t_start[urows.keys])
        ucols = _Sums(self.t_c[epos], self.n_cand)
        w = self.row_w[rws]
        go, gn = old[r_owner], new[r_owner]
        for k, q in enumerate(QGRID):
            d = np.log1p(-new * (1.0 - q)) - np.log1p(-new) - (np.log1p(-old * (1.0 - q)) - np.log1p(-old))
            cols.add_to(out[k], d[owner])
            if len(rws):
                f = 1.0 - q * w
                d2 = np.log1p(-gn * f) - np.log1p(-gn) - (np.log1p(-go * f) - np.log1p(-go))
                ucols.add_to(out[k], urows.sums(d2)[e_row])

    def through(self, cc: int) -> tuple[np.ndarray, np.ndarray]:
        return self.inc.through(int(self.cand_ids[cc]))

    def one_gain(self, good: np.ndarray, cc: int) -> tuple[float, float]:
        sl = slice(self.starts[cc], self.starts[cc + 1])
        gi = good[self.p[sl][self.b[sl]]]
        base = np.log1p(-gi)
        rws = self.inc.table_rows(int(self.cand_ids[cc]))
        at = _ranges(self.mb_start, rws)
        gm, wm = good[self.mb_probe[at]], self.mb_w[at]
        mbase = np.log1p(-gm)
        good_rows, w_rows = self.row_good[rws], self.row_w[rws]
        best, best_q = -math.inf, float(QGRID[-1])
        for q in QGRID:
            v = float((np.log1p(-gi * (1.0 - q)) - base).sum()) + self.n_good[cc] * math.log(1.0 - q)
            if len(rws):
                v += float((np.log1p(-gm * (1.0 - q * wm)) - mbase).sum())
                v += float((good_rows * np.log(1.0 - q * w_rows)).sum())
            if v > best:
                best, best_q = v, float(q)
        return best, best_q

    def leaf_pairs(self, cc: int) -> int:
        probes, _ = self.through(cc)
        rows = probes[self.bad[probes]]
        return _leaf_pairs(self.idx, self.pr, rows)

    def apply(self, good: np.ndarray, cc: int, q: float, sign: int, out: np.ndarray | None = None) -> None:
        probes, w = self.through(cc)
        f = 1.0 - q * w
        which = self.bad_index[probes]
        hit = which >= 0
        old = good[probes[hit]]
        good[probes] *= f if sign > 0 else 1.0 / f  # a component is on a probe's path once
        if out is not None:
            self.update(out, which[hit], old, good[probes[hit]])

    def _next(self, best: np.ndarray, blocked: np.ndarray) -> int | None:
        """The best candidate that may be named (an argmax at a time, not a sort per step), or None."""
        th = self.th
        while True:
            cc = int(np.argmax(best))
            if best[cc] <= self.cost:
                return None
            if self.n_bad[cc] < th.min_failed or (
                self.kinds[cc] == self.spine_kind and self.leaf_pairs(cc) < th.min_spine_leaf_pairs
            ):
                blocked[cc] = True
                best[cc] = -math.inf
                continue
            return cc

    def _greedy(self, good: np.ndarray, g: np.ndarray, blocked: np.ndarray) -> list[_Pick]:
        """Name components one at a time (the largest gain first) until none pays the cost; updates good and g."""
        picks: list[_Pick] = []
        for _ in range(MAX_STEPS):
            best = g.max(axis=0)
            best_q = QGRID[g.argmax(axis=0)]
            best[blocked] = -math.inf
            chosen = self._next(best, blocked)
            if chosen is None:
                break
            ties: list[int] = []
            if len(self.inc.table_rows(int(self.cand_ids[chosen]))):  # ECMP-ambiguous probes cross it (weight 1/k)
                near = np.flatnonzero((best >= best[chosen] - TIE_NATS) & (self.kinds == self.kinds[chosen]) & ~blocked)
                ties = [int(x) for x in near if x != chosen][:MAX_AMBIGUOUS_LISTED]
            picks.append(_Pick(chosen, float(best_q[chosen]), float(best[chosen]), ties))
            blocked[chosen] = True
            self.apply(good, chosen, float(best_q[chosen]), +1, g)
        return picks

    def _prune(self, good: np.ndarray, picks: list[_Pick]) -> list[_Pick]:
        """Drop picks the later ones made redundant; re-fit each given the others."""
        kept: list[_Pick] = []
        for pick in picks:
            self.apply(good, pick.comp, pick.q, -1)
            gain, q = self.one_gain(good, pick.comp)
            if gain > self.cost:
                self.apply(good, pick.comp, q, +1)
                kept.append(_Pick(pick.comp, q, gain, pick.ambiguous_with))
        return kept

    def objective(self, good: np.ndarray, n_picks: int) -> float:
        """The layer's log-likelihood under P(good) `good`, less the cost of n_picks named components."""
        g = good[self.layer_rows]
        b = self.bad[self.layer_rows]
        return float(np.log1p(-g[b]).sum() + np.log(g[~b]).sum()) - self.cost * n_picks

    def _refine(self, good: np.ndarray, kept: list[_Pick]) -> tuple[list[_Pick], np.ndarray]:
        """The greedy names the one component that explains most first, and a switch (a leaf, a spine, a node) can
        explain the bad probes of two of its parts better than either part alone, at the price of the good probes
        through it. So each named switch or node is also tried away: without it (and never it), the search goes
        on from the other picks; the set with the higher penalised likelihood is kept."""
        for pick in [p for p in kept if self.kinds[p.comp] in self.aggregate_kinds]:
            if pick.comp not in {p.comp for p in kept}:
                continue
            trial = good.copy()
            self.apply(trial, pick.comp, pick.q, -1)
            others = [p for p in kept if p.comp != pick.comp]
            blocked = np.zeros(self.n_cand, bool)
            blocked[[p.comp for p in kept]] = True
            extra = self._greedy(trial, self.gains(trial), blocked)
            alternative = self._prune(trial, others + extra)
            if self.objective(trial, len(alternative)) > self.objective(good, len(kept)) + TIE_NATS:
                good, kept = trial, alternative
        return kept, good

    def search(self, noise: float) -> tuple[list[_Pick], np.ndarray]:
        good = np.full(self.n_probes, 1.0 - noise)
        blocked = np.zeros(self.n_cand, bool)
        g = self.gains(good)  # kept up to date pick by pick (update): a pick changes only the probes through it
        kept = self._prune(good, self._greedy(good, g, blocked))
        return self._refine(good, kept)


def _layer_search(
    idx: _Index,
    inc: _Incidence,
    layer_rows: np.ndarray,
    bad: np.ndarray,
    n_probes: int,
    th: Thresholds,
    cost: float,
    pr: _Probes,
) -> _LayerResult:
    """The components of one layer named faulty, at the noise rate given or estimated from the probes the picks
    leave unexplained (re-fitted up to twice), and the best gain of each candidate not named."""
    candidates = _layer_candidates(idx, inc, bad, th)
    base_noise = float(bad[layer_rows].mean()) if len(layer_rows) else 0.0
    noise = th.noise_rate if th.noise_rate is not None else min(NOISE_CEIL, max(NOISE_FLOOR, base_noise))
    if len(candidates[0]) == 0:
        return _LayerResult([], {}, noise)
    layer = _LayerFit(idx, inc, layer_rows, bad, n_probes, th, cost, pr, candidates)
    cand_ids = layer.cand_ids
    picks, good = layer.search(noise)
    if th.noise_rate is None:
        for _ in range(2):
            explained = np.zeros(n_probes, bool)
            for pick in picks:
                explained[layer.through(pick.comp)[0]] = True
            rest = layer_rows[~explained[layer_rows]]
            estimate = min(NOISE_CEIL, max(NOISE_FLOOR, float(bad[rest].mean()) if len(rest) else NOISE_FLOOR))
            if abs(math.log(estimate / noise)) < 0.2:
                break
            noise = estimate
            picks, good = layer.search(noise)
    final = layer.gains(good)
    best = final.max(axis=0)
    picked = {pk.comp for pk in picks}
    near = {int(cand_ids[cc]): float(best[cc]) for cc in np.flatnonzero(best > 0) if int(cc) not in picked}
    out = [_Pick(int(cand_ids[pk.comp]), pk.q, pk.score, [int(cand_ids[t]) for t in pk.ambiguous_with]) for pk in picks]
    return _LayerResult(out, near, noise)


def _symptom(by: Mapping[str, int], median_loss: float | None) -> Symptom:
    total = sum(by.values())
    if total == 0:
        return "none"
    if by["loss"] >= 0.8 * total and median_loss is not None and median_loss >= 0.95:
        return "down"
    for key, name in (("loss", "lossy"), ("latency", "slow"), ("bandwidth", "low_bandwidth")):
        if by[key] >= 0.8 * total:
            return name  # type: ignore[return-value]
    return "mixed"


def _layer_verdict(picks: Mapping[int, _Pick], multi: bool, underlay_crosses: bool) -> LayerVerdict:
    """underlay: faulty in the underlay; overlay: faulty in the overlay only, while underlay probes cross it and pass;
    unknown: faulty in the overlay and no underlay probe crosses it; not_applicable otherwise."""
    if not multi or not picks:
        return "not_applicable"
    if 1 in picks:
        return "underlay"
    if 2 in picks:
        return "overlay" if underlay_crosses else "unknown"
    return "not_applicable"


def _thresholds(thresholds: Thresholds | Mapping[str, Any] | None) -> Thresholds:
    if thresholds is None:
        return Thresholds()
    if isinstance(thresholds, Thresholds):
        return thresholds
    try:
        return Thresholds.model_validate(thresholds)
    except ValidationError as exc:
        lines = validation_problems(exc.errors(), dict(thresholds), Thresholds.model_json_schema(), root="thresholds")
        _raise([line if line.startswith("thresholds") else f"thresholds.{line}" for line in lines])
        raise AssertionError("unreachable") from None


@dataclass
class _Layers:
    """Each layer's incidence and search, merged: one suspect per component, the faulty ones first."""

    present: list[int]
    incidences: dict[int, _Incidence]
    results: dict[int, _LayerResult]
    faulty_in: dict[int, dict[int, _Pick]]  # component -> the layers it was named faulty in
    near: dict[int, float]  # component -> its best gain in any layer, for those named in none
    ranked: list[int]


def _search_layers(idx: _Index, pr: _Probes, cls: _Bad, th: Thresholds, cost: float) -> _Layers:
    n = len(pr)
    present = [layer for layer in range(3) if (pr.layer == layer).any()]
    layer_rows = {layer: np.flatnonzero(pr.layer == layer) for layer in present}
    routes = {layer: _routes(idx, pr, rows) for layer, rows in layer_rows.items()}
    _check_work(n, list(routes.values()))  # before the incidence is allocated
    incidences: dict[int, _Incidence] = {}
    results: dict[int, _LayerResult] = {}
    for layer, rows in layer_rows.items():
        inc = _incidence(idx, rows, routes.pop(layer))
        incidences[layer] = inc
        results[layer] = _layer_search(idx, inc, rows, cls.bad, n, th, cost, pr)
    faulty_in: dict[int, dict[int, _Pick]] = {}
    for layer, res in results.items():
        for pick in res.picks:
            faulty_in.setdefault(pick.comp, {})[layer] = pick
    near: dict[int, float] = {}
    for res in results.values():
        for comp, gain in res.near.items():
            if comp not in faulty_in:
                near[comp] = max(gain, near.get(comp, -math.inf))
    faulty_sorted = sorted(faulty_in, key=lambda cc: -max(pk.score for pk in faulty_in[cc].values()))
    near_sorted = sorted(near, key=lambda cc: -near[cc])
    return _Layers(present, incidences, results, faulty_in, near, faulty_sorted + near_sorted)


def _suspect(idx: _Index, pr: _Probes, cls: _Bad, lay: _Layers, cc: int, crossed_underlay: np.ndarray) -> Suspect:
    """One listed component with its evidence, from every layer's full incidence."""
    multi = 1 in lay.present and 2 in lay.present
    kind, name, extra = idx.describe(cc)
    failed = passed = failed_amb = passed_amb = 0
    by = {"loss": 0, "latency": 0, "bandwidth": 0}
    bad_rows: list[np.ndarray] = []
    by_layer: dict[str, LayerEvidence] = {}
    for layer, inc in lay.incidences.items():
        rows, wts = inc.through(cc)
        exact = wts == 1.0
        bad_here = cls.bad[rows]
        f_exact, p_exact = int((bad_here & exact).sum()), int((~bad_here & exact).sum())
        failed += f_exact
        passed += p_exact
        failed_amb += int((bad_here & ~exact).sum())
        passed_amb += int((~bad_here & ~exact).sum())
        rb = rows[bad_here]
        bad_rows.append(rb)
        by["loss"] += int(cls.by_loss[rb].sum())
        by["latency"] += int((cls.by_latency[rb] & ~cls.by_loss[rb]).sum())
        by["bandwidth"] += int((cls.by_bandwidth[rb] & ~cls.by_loss[rb] & ~cls.by_latency[rb]).sum())
        by_layer[LAYER_NAMES[layer]] = LayerEvidence(
            failed=int(bad_here.sum()), passed=int((~bad_here).sum()), faulty=layer in lay.faulty_in.get(cc, {})
        )
    all_bad = np.concatenate(bad_rows) if bad_rows else np.zeros(0, np.int64)
    losses = pr.loss[all_bad]
    ratios = cls.latency_ratio[all_bad]
    ratios = ratios[np.isfinite(ratios)]
    median_loss = float(np.median(losses)) if len(losses) else None
    pairs_count = None
    if kind in ("spine", "leaf_spine_link") and len(all_bad):
        pairs_count = _leaf_pairs(idx, pr, all_bad)
    picks = lay.faulty_in.get(cc, {})
    score = max(pk.score for pk in picks.values()) if picks else lay.near.get(cc, 0.0)
    ambiguous = sorted({idx.describe(t)[1] for pk in picks.values() for t in pk.ambiguous_with})
    examples = [
        ProbeRef(
            src_nic=idx.nic_names[int(pr.src[r])],
            dst_nic=idx.nic_names[int(pr.dst[r])],
            loss_rate=float(pr.loss[r]),
            latency_us=None if math.isnan(pr.latency[r]) else float(pr.latency[r]),
            layer=None if pr.layer[r] == 0 else LAYER_NAMES[int(pr.layer[r])],  # type: ignore[arg-type]
            spine=idx.spine_names[int(pr.spine[r])] if pr.spine[r] >= 0 else None,
        )
        for r in all_bad[:3]
    ]
    return Suspect(
        kind=kind,
        name=name,
        faulty=bool(picks),
        score=round(score, 3),
        symptom=_symptom(by, median_loss),
        layer_verdict=_layer_verdict(picks, multi, bool(crossed_underlay[cc])),
        ambiguous_with=ambiguous[:MAX_AMBIGUOUS_LISTED],
        node=extra.get("node"),
        leaf=extra.get("leaf"),
        spine=extra.get("spine"),
        rail=extra.get("rail"),
        evidence=Evidence(
            failed=failed,
            passed=passed,
            failed_ambiguous=failed_amb,
            passed_ambiguous=passed_amb,
            failed_by=by,
            fail_probability=round(max(pk.q for pk in picks.values()), 4) if picks else None,
            median_failed_loss=median_loss,
            median_latency_ratio=round(float(np.median(ratios)), 4) if len(ratios) else None,
            leaf_pairs=pairs_count,
            by_layer=by_layer,
            examples=examples,
        ),
    )


def _not_covered(idx: _Index, incidences: Mapping[int, _Incidence]) -> NotCovered:
    """Coverage of the probes: components no probe crosses, and spines and links only ECMP-ambiguous ones cross."""
    crossed_exact = np.zeros(idx.n_components, bool)
    crossed_any = np.zeros(idx.n_components, bool)
    for inc in incidences.values():
        crossed_any[inc.comp] = True
        crossed_any[inc.row_comp] = True
        crossed_exact[inc.comp] = True
    kinds_all = idx.kind_of(np.arange(idx.n_components))
    counts = {k: int((~crossed_any & (kinds_all == i)).sum()) for i, k in enumerate(KINDS)}
    ecmp_only = {
        k: int((crossed_any & ~crossed_exact & (kinds_all == i)).sum())
        for i, k in enumerate(KINDS)
        if k in ("spine", "leaf_spine_link")
    }
    missing_names = [idx.describe(int(cc))[1] for cc in np.flatnonzero(~crossed_any)[:MAX_NAMES_LISTED]]
    return NotCovered(counts=counts, ecmp_only=ecmp_only, names=missing_names)


def _probe_summary(pr: _Probes, cls: _Bad, present: Sequence[int], same: np.ndarray) -> ProbeSummary:
    bad_by = {
        "loss": int(cls.by_loss.sum()),
        "latency": int((cls.by_latency & ~cls.by_loss).sum()),
        "bandwidth": int((cls.by_bandwidth & ~cls.by_loss & ~cls.by_latency).sum()),
    }
    return ProbeSummary(
        total=len(pr),
        bad=int(cls.bad.sum()),
        bad_by=bad_by,
        by_layer={LAYER_NAMES[layer]: int((pr.layer == layer).sum()) for layer in present},
        same_leaf=int(same.sum()),
        cross_leaf=int((~same).sum()),
        with_route=int(((pr.spine >= 0) & ~same).sum()),
        ecmp_ambiguous=int(((pr.spine < 0) & ~same).sum()),
    )


def localize_network_fault(
    topology: Topology | Mapping[str, Any],
    probes: Sequence[ProbeRow | Mapping[str, Any]],
    thresholds: Thresholds | Mapping[str, Any] | None = None,
    *,
    limit: int | None = None,
    offset: int = 0,
) -> Localization:
    """Ranked suspects (NIC, node, leaf, spine, leaf-spine link) with a faulty verdict, score and evidence, from
    probes over a topology; overlay vs underlay when the probes carry both layers. See the module docstring.

    Suspects are listed from ``offset``: ``limit`` of them (the whole result within MAX_RESULT_BYTES), or by default
    the faulty ones (at most DEFAULT_FAULTY_LISTED) and DEFAULT_NEAR_MISSES more, within DEFAULT_BUDGET_BYTES."""
    for name, value, high in (("limit", limit, MAX_SUSPECTS_LISTED), ("offset", offset, 10**9)):
        if value is None and name == "limit":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise InputError(f"{name}: got {value!r}; accepted: an integer from 0 to {high:,}")
    th = _thresholds(thresholds)
    idx = build_index(topology)
    pr = _load_probes(idx, probes)
    cls = _classify(idx, pr, th)
    cost = th.min_score if th.min_score is not None else math.log(idx.n_components) + COST_EXTRA_NATS
    lay = _search_layers(idx, pr, cls, th, cost)
    faulty_in, ranked = lay.faulty_in, lay.ranked
    if limit is None:  # the faulty ones, then a few near misses
        end = min(max(offset, len(faulty_in)) + DEFAULT_NEAR_MISSES, offset + DEFAULT_FAULTY_LISTED)
        listed = ranked[offset:end]
    else:
        listed = ranked[offset : offset + limit]
    multi = 1 in lay.present and 2 in lay.present
    crossed_underlay = np.zeros(idx.n_components, bool)
    if 1 in lay.incidences:
        crossed_underlay[lay.incidences[1].comp] = True
        crossed_underlay[lay.incidences[1].row_comp] = True
    suspects = [_suspect(idx, pr, cls, lay, cc, crossed_underlay) for cc in listed]

    warnings = list(cls.warnings)
    same = idx.nic_leaf[pr.src] == idx.nic_leaf[pr.dst]
    summary = _probe_summary(pr, cls, lay.present, same)
    if summary.ecmp_ambiguous and any(s.ambiguous_with for s in suspects if s.faulty):
        warnings.append(
            "some faulty spines or links could not be told from their ECMP alternatives (listed in ambiguous_with): "
            "probe with the spine known (plan_network_probes' via_spine, traceroute or the route column)"
        )
    if not multi:
        overall = "not_applicable"
    else:
        verdicts = {_layer_verdict(faulty_in[cc], multi, bool(crossed_underlay[cc])) for cc in faulty_in}
        verdicts &= {"underlay", "overlay"}
        overall = "none" if not verdicts else ("both" if len(verdicts) == 2 else verdicts.pop())
    whole = Localization(
        faulty_count=len(faulty_in),
        suspects=suspects,
        suspects_total=len(ranked),
        offset=offset,
        next_offset=None,
        has_more=False,
        layer_verdict=overall,  # type: ignore[arg-type]
        probes=summary,
        baselines=cls.baselines,
        noise_rate={LAYER_NAMES[layer]: round(res.noise, 5) for layer, res in lay.results.items()},
        min_score=round(cost, 3),
        thresholds=th,
        not_covered=_not_covered(idx, lay.incidences),
        method=METHOD,
        ecmp=(
            f"{summary.with_route} cross-leaf probes named their spine (exact path); {summary.ecmp_ambiguous} did "
            "not: each of the k spines their leaves share, and its two leaf-spine links, is on such a probe's path "
            "with weight 1/k (P(good) gets the factor 1 - q/k, the average over uniform ECMP); a spine is named "
            f"faulty only with bad probes between at least {th.min_spine_leaf_pairs} distinct leaf pairs, and a "
            "pick that its ECMP alternatives explain as well lists them in ambiguous_with"
        ),
        warnings=warnings,
    )

    def build(scale: float) -> Localization:
        """The result listing fewer suspects (the lowest ranked go first) and not-covered names as scale shrinks;
        next_offset says where the next page starts."""
        shown = suspects if scale >= 1 else suspects[: scaled(len(suspects), scale) if suspects else 0]
        end = offset + len(shown)
        return whole.model_copy(
            update={
                "suspects": shown,
                "next_offset": end if end < len(ranked) else None,
                "has_more": end < len(ranked),
                "not_covered": whole.not_covered.model_copy(
                    update={"names": whole.not_covered.names[: scaled(MAX_NAMES_LISTED, scale)]}
                ),
            }
        )

    return fit(build, MAX_RESULT_BYTES if limit is not None else DEFAULT_BUDGET_BYTES)


# ---- reading probe tables and topologies -------------------------------------------------------------------------

# SkeletonHunter's RDMA ping record columns -> the probe row (the physical NIC is the real IP; the overlay IP of a
# container may repeat across hosts).
# What plan_network_probes' `text` documents of a probe table (keep the two in step): the columns read per side.
PROBE_TABLE_ACCEPTED = (
    "a probe table CSV with per side (src_, dst_) the columns ip (or real_ip), node_id, asw (its leaf) and "
    "optionally dsw (a spine the leaf uplinks to)"
)
TABLE_COLUMNS = {"src_real_ip", "dst_real_ip", "src_ip", "dst_ip", "latency", "agent_type", "dial", "route"}
FAILED_DIALS = {"fail", "failed", "failure", "timeout", "error", "unreachable", "lost"}


@dataclass
class ProbeTable:
    rows: list[dict[str, Any]]
    source_format: Literal["json", "jsonl", "csv", "probe_table_csv"]
    notes: list[str]


def _float_cell(value: Any, where: str, what: str) -> float | None:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise InputError(f"{where}: got {str(value)[:40]!r}; accepted: {what}") from None


def _split_route(route: str) -> list[str]:
    return [t for t in re.split(r"[\s,;>|]+", route) if t]


def _map_row(raw: Mapping[str, Any], where: str, spines: set[str] | None, counters: Counter[str]) -> dict[str, Any]:
    if "src_nic" in raw or "dst_nic" in raw:
        row: dict[str, Any] = {}
        for key in PROBE_FIELDS:
            if key in raw:
                value = raw[key]
                if isinstance(value, str) and value.strip() == "" and key != "src_nic" and key != "dst_nic":
                    value = None
                row[key] = value
        for key in ("latency_us", "loss_rate", "bandwidth_gbps"):
            if isinstance(row.get(key), str):
                row[key] = _float_cell(row[key], f"{where}.{key}", "a number")
        if isinstance(row.get("layer"), str):
            row["layer"] = row["layer"].strip().lower() or None
        counters.update(k for k in raw if k not in PROBE_FIELDS)
        return row
    src = raw.get("src_real_ip") or raw.get("src_ip")
    dst = raw.get("dst_real_ip") or raw.get("dst_ip")
    loss = _float_cell(raw.get("loss_rate"), f"{where}.loss_rate", "a number from 0 to 1")
    latency = _float_cell(raw.get("latency"), f"{where}.latency", "a number (microseconds)")
    dial = str(raw.get("dial") or "").strip().lower()
    if dial in FAILED_DIALS:
        loss, latency = 1.0, None
        counters["dial:failed"] += 1
    agent = str(raw.get("agent_type") or "").strip().lower()
    layer = agent if agent in ("overlay", "underlay") else None
    if agent and layer is None:
        counters[f"agent_type:{agent[:20]}"] += 1
    row = {"src_nic": src, "dst_nic": dst, "latency_us": latency, "loss_rate": loss}
    if layer:
        row["layer"] = layer
    route = str(raw.get("route") or "").strip()
    if route and spines is not None:
        hops = [h for h in _split_route(route) if h in spines]
        if len(hops) == 1:
            row["spine"] = hops[0]
        else:
            counters["route:unresolved"] += 1
    return row


def parse_probes_text(
    text: str,
    fmt: Literal["auto", "json", "jsonl", "csv"] = "auto",
    *,
    spines: Iterable[str] | None = None,
) -> ProbeTable:
    """Probe rows from pasted text or a file's content: a JSON list (or {"probes": [...]}), JSON lines, or CSV with
    the issue's columns or with SkeletonHunter's probe-table columns (src_real_ip or src_ip -> src_nic, latency ->
    latency_us, agent_type -> layer, a failed dial -> loss 1, a route hop that is one of `spines` -> spine).
    Unknown columns are dropped and named in the notes; values are checked by localize_network_fault."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("probes text: empty; accepted: JSON, JSON lines or CSV probe rows")
    spine_set = set(spines) if spines is not None else None
    body = text.lstrip("\ufeff").strip()
    if fmt == "auto":
        fmt = "json" if body.startswith("[") else ("jsonl" if body.startswith("{") else "csv")
        if fmt == "jsonl" and "\n" not in body:
            fmt = "json"
    counters: Counter[str] = Counter()
    raws: list[Any]
    kind: Literal["json", "jsonl", "csv", "probe_table_csv"] = fmt  # type: ignore[assignment]
    if fmt == "json":
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            raise InputError(f"probes text: not JSON ({exc.msg} at line {exc.lineno}); accepted: a JSON list") from None
        if isinstance(data, dict) and isinstance(data.get("probes"), list):
            data = data["probes"]
        if not isinstance(data, list):
            raise InputError('probes text: JSON that is not a list; accepted: a list of rows or {"probes": [...]}')
        raws = data
    elif fmt == "jsonl":
        raws = []
        for number, line in enumerate(body.splitlines(), 1):
            if not line.strip():
                continue
            try:
                raws.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"probes line {number}: not JSON ({exc.msg}); accepted: one JSON object per line"
                ) from None
            if len(raws) > MAX_PROBES:
                break
    elif fmt == "csv":
        reader = csv.DictReader(io.StringIO(body))
        header = set(reader.fieldnames or [])
        if not (
            {"src_nic", "dst_nic"} <= header
            or ({"src_ip", "dst_ip"} <= header or {"src_real_ip", "dst_real_ip"} <= header)
        ):
            raise InputError(
                f"probes CSV header: {sorted(header)[:8]}; accepted: columns src_nic, dst_nic, latency_us, loss_rate "
                "(bandwidth_gbps, layer, spine optional) or a probe table with src_ip/dst_ip (or src_real_ip/"
                "dst_real_ip), latency, loss_rate"
            )
        if "src_nic" not in header:
            kind = "probe_table_csv"
        raws = []
        for row in reader:
            raws.append(row)
            if len(raws) > MAX_PROBES:
                break
    else:
        raise InputError(f"format: got {fmt!r}; accepted: 'auto', 'json', 'jsonl' or 'csv'")
    if len(raws) > MAX_PROBES:
        raise InputError(f"probes: more than {MAX_PROBES:,} rows; accepted: at most {MAX_PROBES:,} per call")
    rows = []
    for i, raw in enumerate(raws):
        if not isinstance(raw, Mapping):
            raise InputError(f"probes[{i}]: got {type(raw).__name__}; accepted: {PROBE_ACCEPTED}")
        rows.append(_map_row(raw, f"probes[{i}]", spine_set, counters))
    notes = []
    dropped = sorted(k for k in counters if ":" not in k)
    if dropped and kind != "probe_table_csv":
        notes.append(f"columns not used: {', '.join(dropped[:10])}{' ...' if len(dropped) > 10 else ''}")
    if counters["dial:failed"]:
        notes.append(f"{counters['dial:failed']} rows with a failed dial read as loss 1")
    if counters["route:unresolved"]:
        notes.append(f"{counters['route:unresolved']} routes named no single known spine; read as ECMP-ambiguous")
    others = [k for k in counters if k.startswith("agent_type:")]
    if others:
        notes.append(f"agent_type values other than overlay/underlay read as no layer: {others[:5]}")
    return ProbeTable(rows=rows, source_format=kind, notes=notes)


def parse_topology_text(text: str) -> dict[str, Any]:
    """A topology from JSON text (the issue's format); checked by build_index when used."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"topology text: empty; accepted: JSON {TOPOLOGY_ACCEPTED}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"topology text: not JSON ({exc.msg} at line {exc.lineno}); accepted: {TOPOLOGY_ACCEPTED}"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"topology text: JSON {type(data).__name__}; accepted: an object {TOPOLOGY_ACCEPTED}")
    return data


def topology_from_probe_table(text: str) -> dict[str, Any]:
    """A topology derived from a probe table's endpoint columns (SkeletonHunter layout): NIC = real IP (or IP),
    node = node_id (or node_sn), leaf = asw (access switch), spine = dsw; rails numbered by NIC order in a node
    (the table does not say which rail a NIC is on)."""
    reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    header = set(reader.fieldnames or [])
    need = {"src_asw", "dst_asw"}
    if not need <= header:
        raise InputError(
            f"topology text: neither JSON nor a probe table (its CSV header has no {sorted(need - header)}); "
            f"accepted: topology JSON {TOPOLOGY_ACCEPTED}, or {PROBE_TABLE_ACCEPTED}"
        )
    nic_node: dict[str, str] = {}
    nic_leaf: dict[str, str] = {}
    uplinks: dict[str, set[str]] = {}
    spines: set[str] = set()
    problems: list[str] = []
    for i, row in enumerate(reader):
        if i >= MAX_PROBES:
            raise InputError(f"probe table: more than {MAX_PROBES:,} rows")
        for side in ("src", "dst"):
            nic = (row.get(f"{side}_real_ip") or row.get(f"{side}_ip") or "").strip()
            node = (row.get(f"{side}_node_id") or row.get(f"{side}_node_sn") or "").strip()
            leaf = (row.get(f"{side}_asw") or "").strip()
            spine = (row.get(f"{side}_dsw") or "").strip()
            if not nic or not node or not leaf:
                problems.append(f"row {i + 2}: {side} NIC, node or asw empty; accepted: rows naming all three")
                continue
            if nic_node.setdefault(nic, node) != node or nic_leaf.setdefault(nic, leaf) != leaf:
                problems.append(f"row {i + 2}: NIC {nic!r} appears on two nodes or leaves")
            ups = uplinks.setdefault(leaf, set())
            if spine:
                ups.add(spine)
                spines.add(spine)
    _raise(problems)
    clash = spines & set(uplinks)
    if clash:
        raise InputError(f"probe table: {sorted(clash)[:3]} is both an asw and a dsw; accepted: distinct switch names")
    nodes: dict[str, list[str]] = {}
    for nic, node in nic_node.items():
        nodes.setdefault(node, []).append(nic)
    return {
        "nodes": [
            {
                "name": node,
                "nics": [{"name": nic, "rail": r, "leaf": nic_leaf[nic]} for r, nic in enumerate(sorted(nics))],
            }
            for node, nics in nodes.items()
        ],
        "switches": [{"name": leaf, "tier": "leaf", "uplinks": sorted(ups)} for leaf, ups in uplinks.items()]
        + [{"name": s, "tier": "spine", "uplinks": []} for s in sorted(spines)],
    }
