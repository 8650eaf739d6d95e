"""A simulator of rail-optimised fat trees, injected network faults and the probes a prober would report, for the
tests and benchmarks of servers/diagnostics/netloc.py. Plain module (no MCP imports).

The fleet: ``nodes`` nodes (64 to 16,384 as the issue asks; down to 2 for tests) of ``nics_per_node`` NICs (8), NIC i
on rail i; nodes in pods of ``nodes_per_leaf`` (32): one leaf per rail per pod; spines in ``planes`` groups. With
the default ``planes=1`` every leaf uplinks to every spine (a DGX SuperPOD-like spine layer: cross-rail pairs route
too); ``planes=nics_per_node`` gives rail-only planes (leaves of rail r uplink only to plane r's spines). Spines per
plane: by default clamp(leaves per plane / 8, 4, 16).

Faults (each names the component as netloc names it, with the kind the localizer should report):
- ``nic_down``: the NIC loses every packet (NIC); ``nic_lossy``: it drops ``loss`` of packets, 5% by default (NIC);
  ``nic_slow``: its probes take ``slow_factor`` (3x) as long (NIC);
- ``node_down``: every NIC of the node is dead and its prober reports nothing (node);
- ``leaf_down``: the leaf loses every packet (leaf); ``link_lossy``: one leaf-spine link drops ``loss`` (link);
- ``spine_slow``: probes through the spine take ``slow_factor`` as long (spine);
- ``overlay_nic``: the NIC's overlay path (container network) loses every packet, the underlay is fine (NIC, overlay).
Faults of one scenario sit on disjoint components (no NIC fault under a faulty leaf or node, no link fault on a
faulty spine, ...), so that each is observable.

Probes: for every pair of a plan (src, dst, via spine), ``rounds`` probes of ``packets`` packets each (per layer when
``layers`` is given). A cross-leaf probe goes through its pair's via spine when there is one, else a spine drawn
uniformly among those the two leaves share (ECMP); the row names that spine when ``record_route``. Loss is drawn
binomially from the path's packet loss; latency is a class base (same leaf 3 us, cross leaf 5 us, overlay +1.5 us)
times lognormal jitter (5%) times the slow factors on the path; a probe that lost every packet has no latency. Noise:
each probe with chance ``noise_rate`` (3%) is lossy (2-50% extra loss) or slow (2.2-6x) by chance. Missing: each
row is dropped with chance ``missing_rate`` (2%). Everything is seeded: faults from random.Random(seed), per-probe
draws from numpy's PCG64(seed).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from servers.core.errors import InputError
from servers.diagnostics.netloc import MAX_NODES, link_name, plan_pairs

FaultKind = Literal[
    "nic_down", "nic_lossy", "nic_slow", "node_down", "leaf_down", "link_lossy", "spine_slow", "overlay_nic"
]
FAULT_KINDS: tuple[FaultKind, ...] = (
    "nic_down",
    "nic_lossy",
    "nic_slow",
    "node_down",
    "leaf_down",
    "link_lossy",
    "spine_slow",
    "overlay_nic",
)
TRUTH_KIND = {
    "nic_down": "nic",
    "nic_lossy": "nic",
    "nic_slow": "nic",
    "node_down": "node",
    "leaf_down": "leaf",
    "link_lossy": "leaf_spine_link",
    "spine_slow": "spine",
    "overlay_nic": "nic",
}
BASE_SAME_LEAF_US = 3.0
BASE_CROSS_LEAF_US = 5.0
OVERLAY_EXTRA_US = 1.5
JITTER_SIGMA = 0.05
BASE_BANDWIDTH_GBPS = 390.0


@dataclass
class Fleet:
    """A generated fat tree: the topology in netloc's format and integer views of it."""

    nodes: int
    nics_per_node: int
    nodes_per_leaf: int
    pods: int
    planes: int
    spines_per_plane: int
    topology: dict[str, Any]
    node_names: list[str]
    nic_names: list[str]
    nic_index: dict[str, int]
    nic_node: np.ndarray
    nic_rail: np.ndarray
    nic_leaf: np.ndarray
    leaf_names: list[str]
    leaf_plane: np.ndarray
    spine_names: list[str]  # plane-major: spine id = plane * spines_per_plane + j
    spine_index: dict[str, int]

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_names)

    def leaf_nics(self, leaf: int) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.nic_leaf == leaf)]

    def link(self, leaf: int, spine: int) -> str:
        return link_name(self.leaf_names[leaf], self.spine_names[spine])

    def plane_spines(self, plane: int) -> range:
        return range(plane * self.spines_per_plane, (plane + 1) * self.spines_per_plane)


def build_fleet(
    nodes: int,
    *,
    nics_per_node: int = 8,
    nodes_per_leaf: int = 32,
    planes: int = 1,
    spines_per_plane: int | None = None,
) -> Fleet:
    """A rail-optimised two-tier fat tree (see the module docstring)."""
    for name, value, low, high in (
        ("nodes", nodes, 2, MAX_NODES),
        ("nics_per_node", nics_per_node, 1, 32),
        ("nodes_per_leaf", nodes_per_leaf, 1, 1024),
        ("planes", planes, 1, nics_per_node),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InputError(f"{name}: got {value!r}; accepted: an integer from {low} to {high}")
    pods = math.ceil(nodes / nodes_per_leaf)
    leaves_per_plane = pods * math.ceil(nics_per_node / planes)
    spines = spines_per_plane if spines_per_plane is not None else min(16, max(4, leaves_per_plane // 8))
    if isinstance(spines, bool) or not isinstance(spines, int) or not 1 <= spines <= 512:
        raise InputError(f"spines_per_plane: got {spines!r}; accepted: an integer from 1 to 512")
    node_names = [f"node{i:05d}" for i in range(nodes)]
    leaf_names = [f"leaf-p{p:03d}-r{r}" for p in range(pods) for r in range(nics_per_node)]
    leaf_plane = np.array([r % planes for _ in range(pods) for r in range(nics_per_node)], dtype=np.int32)
    spine_names = [f"spine-p{pl}-{j:02d}" for pl in range(planes) for j in range(spines)]
    nic_names: list[str] = []
    nic_node, nic_rail, nic_leaf = [], [], []
    topo_nodes = []
    for i, node in enumerate(node_names):
        pod = i // nodes_per_leaf
        nics = []
        for r in range(nics_per_node):
            name = f"{node}-nic{r}"
            leaf = pod * nics_per_node + r
            nics.append({"name": name, "rail": r, "leaf": leaf_names[leaf]})
            nic_names.append(name)
            nic_node.append(i)
            nic_rail.append(r)
            nic_leaf.append(leaf)
        topo_nodes.append({"name": node, "nics": nics})
    switches = [
        {
            "name": leaf,
            "tier": "leaf",
            "uplinks": [spine_names[s] for s in range(int(leaf_plane[k]) * spines, (int(leaf_plane[k]) + 1) * spines)],
        }
        for k, leaf in enumerate(leaf_names)
    ] + [{"name": s, "tier": "spine", "uplinks": []} for s in spine_names]
    return Fleet(
        nodes=nodes,
        nics_per_node=nics_per_node,
        nodes_per_leaf=nodes_per_leaf,
        pods=pods,
        planes=planes,
        spines_per_plane=spines,
        topology={"nodes": topo_nodes, "switches": switches},
        node_names=node_names,
        nic_names=nic_names,
        nic_index={n: i for i, n in enumerate(nic_names)},
        nic_node=np.array(nic_node, dtype=np.int32),
        nic_rail=np.array(nic_rail, dtype=np.int32),
        nic_leaf=np.array(nic_leaf, dtype=np.int32),
        leaf_names=leaf_names,
        leaf_plane=leaf_plane,
        spine_names=spine_names,
        spine_index={n: i for i, n in enumerate(spine_names)},
    )


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    component: str  # the name netloc reports it by
    truth_kind: str  # nic, node, leaf, spine, leaf_spine_link
    loss: float  # packet loss it adds on paths through it (1.0: down)
    latency_factor: float  # latency multiplier on paths through it
    overlay_only: bool = False
    target: tuple[int, ...] = field(default=(), compare=False)  # ids: (nic,), (node,), (leaf,), (spine,), (leaf, spine)


def inject_faults(
    fleet: Fleet,
    kinds: Mapping[str, int] | Sequence[str],
    rng: random.Random,
    *,
    loss: float = 0.05,
    slow_factor: float = 3.0,
) -> list[Fault]:
    """Faults of the given kinds ({kind: count} or a list of kinds), on disjoint components, drawn with `rng`."""
    wanted: list[str] = [k for k, n in kinds.items() for _ in range(n)] if isinstance(kinds, Mapping) else list(kinds)
    unknown = [k for k in wanted if k not in FAULT_KINDS]
    if unknown:
        raise InputError(f"fault kind {unknown[0]!r}; accepted: {', '.join(FAULT_KINDS)}")
    bad_nodes: set[int] = set()
    bad_leaves: set[int] = set()
    bad_spines: set[int] = set()
    link_leaves: set[int] = set()
    link_spines: set[int] = set()
    nic_leaves: set[int] = set()
    faults: list[Fault] = []
    n_nics = len(fleet.nic_names)
    for kind in wanted:
        for _ in range(10_000):
            if kind in ("nic_down", "nic_lossy", "nic_slow", "overlay_nic"):
                nic = rng.randrange(n_nics)
                node, leaf = int(fleet.nic_node[nic]), int(fleet.nic_leaf[nic])
                if node in bad_nodes or leaf in bad_leaves:
                    continue
                bad_nodes.add(node)
                nic_leaves.add(leaf)
                f_loss = {"nic_down": 1.0, "nic_lossy": loss, "nic_slow": 0.0, "overlay_nic": 1.0}[kind]
                factor = slow_factor if kind == "nic_slow" else 1.0
                faults.append(
                    Fault(kind, fleet.nic_names[nic], "nic", f_loss, factor, kind == "overlay_nic", (nic,))  # type: ignore[arg-type]
                )
                break
            if kind == "node_down":
                node = rng.randrange(fleet.nodes)
                leaves = {int(x) for x in fleet.nic_leaf[fleet.nic_node == node]}
                if node in bad_nodes or leaves & bad_leaves:
                    continue
                bad_nodes.add(node)
                nic_leaves |= leaves
                faults.append(Fault("node_down", fleet.node_names[node], "node", 1.0, 1.0, False, (node,)))
                break
            if kind == "leaf_down":
                leaf = rng.randrange(fleet.n_leaves)
                if leaf in bad_leaves or leaf in nic_leaves or leaf in link_leaves:
                    continue
                bad_leaves.add(leaf)
                faults.append(Fault("leaf_down", fleet.leaf_names[leaf], "leaf", 1.0, 1.0, False, (leaf,)))
                break
            if kind == "link_lossy":
                leaf = rng.randrange(fleet.n_leaves)
                spine = rng.choice(list(fleet.plane_spines(int(fleet.leaf_plane[leaf]))))
                if leaf in bad_leaves or leaf in link_leaves or spine in bad_spines or spine in link_spines:
                    continue
                link_leaves.add(leaf)
                link_spines.add(spine)
                faults.append(
                    Fault("link_lossy", fleet.link(leaf, spine), "leaf_spine_link", loss, 1.0, False, (leaf, spine))
                )
                break
            if kind == "spine_slow":
                spine = rng.randrange(len(fleet.spine_names))
                if spine in bad_spines or spine in link_spines:
                    continue
                bad_spines.add(spine)
                faults.append(Fault("spine_slow", fleet.spine_names[spine], "spine", 0.0, slow_factor, False, (spine,)))
                break
        else:
            raise InputError(f"cannot place another {kind!r} fault on disjoint components of this fleet")
    return faults


def truth(faults: Sequence[Fault]) -> set[tuple[str, str]]:
    """The (kind, name) pairs a perfect localization reports as faulty."""
    return {(f.truth_kind, f.component) for f in faults}


def simulate_probes(
    fleet: Fleet,
    pairs: Sequence[tuple[str, str, str | None]],
    faults: Sequence[Fault] = (),
    *,
    seed: int = 0,
    rounds: int = 2,
    packets: int = 100,
    noise_rate: float = 0.03,
    missing_rate: float = 0.02,
    layers: Sequence[Literal["underlay", "overlay"]] | None = None,
    record_route: bool = True,
    with_bandwidth: bool = False,
) -> list[dict[str, Any]]:
    """Probe rows in netloc's format for `pairs` (src_nic, dst_nic, via_spine) under `faults`."""
    if not pairs:
        return []
    rng = np.random.Generator(np.random.PCG64(seed))
    src = np.array([fleet.nic_index[a] for a, _, _ in pairs], dtype=np.int64)
    dst = np.array([fleet.nic_index[b] for _, b, _ in pairs], dtype=np.int64)
    via = np.array([fleet.spine_index[v] if v is not None else -1 for _, _, v in pairs], dtype=np.int64)
    layer_list: list[str | None] = list(layers) if layers else [None]
    reps = rounds * len(layer_list)
    src, dst, via = np.tile(src, reps), np.tile(dst, reps), np.tile(via, reps)
    layer_of = np.repeat(np.arange(len(layer_list)), rounds * len(pairs))
    n = len(src)
    la, lb = fleet.nic_leaf[src].astype(np.int64), fleet.nic_leaf[dst].astype(np.int64)
    na, nb = fleet.nic_node[src].astype(np.int64), fleet.nic_node[dst].astype(np.int64)
    cross = la != lb
    plane_a, plane_b = fleet.leaf_plane[la], fleet.leaf_plane[lb]
    if (cross & (plane_a != plane_b)).any():
        raise InputError("a pair joins leaves of different spine planes: no path; accepted: pairs the fleet can route")
    spp = fleet.spines_per_plane
    spine = np.where(via >= 0, via, plane_a * spp + rng.integers(0, spp, n))
    spine = np.where(cross, spine, -1)
    n_spines = len(fleet.spine_names)

    # Per-component packet survival and latency factors.
    surv = {
        k: np.ones(size)
        for k, size in (
            ("nic", len(fleet.nic_names)),
            ("node", fleet.nodes),
            ("leaf", fleet.n_leaves),
            ("spine", n_spines),
        )
    }
    fac = {k: np.ones(len(v)) for k, v in surv.items()}
    link_surv = np.ones(fleet.n_leaves * n_spines)
    overlay_surv = np.ones(len(fleet.nic_names))
    down_nodes: set[int] = set()
    for f in faults:
        if f.kind == "overlay_nic":
            overlay_surv[f.target[0]] *= 1.0 - f.loss
            continue
        kind = {"nic": "nic", "node": "node", "leaf": "leaf", "spine": "spine"}.get(f.truth_kind)
        if kind is None:
            link_surv[f.target[0] * n_spines + f.target[1]] *= 1.0 - f.loss
            continue
        surv[kind][f.target[0]] *= 1.0 - f.loss
        fac[kind][f.target[0]] *= f.latency_factor
        if f.kind == "node_down":
            down_nodes.add(f.target[0])
    s_ok = np.maximum(spine, 0)
    p = surv["nic"][src] * surv["nic"][dst] * surv["node"][na] * surv["leaf"][la]
    p *= np.where(na != nb, surv["node"][nb], 1.0)
    p *= np.where(
        cross,
        surv["leaf"][lb] * surv["spine"][s_ok] * link_surv[la * n_spines + s_ok] * link_surv[lb * n_spines + s_ok],
        1.0,
    )
    factor = fac["nic"][src] * fac["nic"][dst] * fac["node"][na] * fac["leaf"][la]
    factor *= np.where(na != nb, fac["node"][nb], 1.0)
    factor *= np.where(cross, fac["leaf"][lb] * fac["spine"][s_ok], 1.0)
    is_overlay = np.array([layer_list[i] == "overlay" for i in range(len(layer_list))])[layer_of]
    p *= np.where(is_overlay, overlay_surv[src] * overlay_surv[dst], 1.0)
    # Noise: a few probes lossy or slow by chance.
    noisy = rng.random(n) < noise_rate
    lossy_noise = noisy & (rng.random(n) < 0.5)
    p *= np.where(lossy_noise, 1.0 - rng.uniform(0.02, 0.5, n), 1.0)
    factor *= np.where(noisy & ~lossy_noise, rng.uniform(2.2, 6.0, n), 1.0)
    lost = rng.binomial(packets, np.clip(1.0 - p, 0.0, 1.0))
    loss = lost / packets
    base = np.where(cross, BASE_CROSS_LEAF_US, BASE_SAME_LEAF_US) + np.where(is_overlay, OVERLAY_EXTRA_US, 0.0)
    latency = base * np.exp(rng.normal(0.0, JITTER_SIGMA, n)) * factor
    bandwidth = (
        BASE_BANDWIDTH_GBPS * np.exp(rng.normal(0.0, 0.02, n)) / factor * np.maximum(0.05, 1.0 - 10.0 * (1.0 - p))
    )
    keep = rng.random(n) >= missing_rate
    if down_nodes:
        keep &= ~np.isin(na, np.array(sorted(down_nodes)))
    rows: list[dict[str, Any]] = []
    names, spines = fleet.nic_names, fleet.spine_names
    for i in np.flatnonzero(keep):
        all_lost = lost[i] >= packets
        row: dict[str, Any] = {
            "src_nic": names[src[i]],
            "dst_nic": names[dst[i]],
            "latency_us": None if all_lost else round(float(latency[i]), 3),
            "loss_rate": round(float(loss[i]), 4),
        }
        if with_bandwidth:
            row["bandwidth_gbps"] = 0.0 if all_lost else round(float(bandwidth[i]), 2)
        layer = layer_list[layer_of[i]]
        if layer is not None:
            row["layer"] = layer
        if record_route and spine[i] >= 0:
            row["spine"] = spines[spine[i]]
        rows.append(row)
    return rows


@dataclass
class Scenario:
    fleet: Fleet
    pairs: list[tuple[str, str, str | None]]
    faults: list[Fault]
    probes: list[dict[str, Any]]
    truth: set[tuple[str, str]]


def make_scenario(
    nodes: int,
    faults: Mapping[str, int] | Sequence[str] = (),
    *,
    seed: int = 0,
    mode: Literal["skeleton", "rail", "full_mesh"] = "skeleton",
    fleet: Fleet | None = None,
    pairs: list[tuple[str, str, str | None]] | None = None,
    rounds: int = 2,
    noise_rate: float = 0.03,
    missing_rate: float = 0.02,
    layers: Sequence[Literal["underlay", "overlay"]] | None = None,
    record_route: bool = True,
    with_bandwidth: bool = False,
    loss: float = 0.05,
    slow_factor: float = 3.0,
    **fleet_options: Any,
) -> Scenario:
    """A fleet (built unless given), the plan's pairs (planned unless given), faults, probes and the ground truth."""
    fleet = fleet if fleet is not None else build_fleet(nodes, **fleet_options)
    pairs = pairs if pairs is not None else plan_pairs(fleet.topology, mode)
    injected = inject_faults(fleet, faults, random.Random(seed), loss=loss, slow_factor=slow_factor)
    probes = simulate_probes(
        fleet,
        pairs,
        injected,
        seed=seed,
        rounds=rounds,
        noise_rate=noise_rate,
        missing_rate=missing_rate,
        layers=layers,
        record_route=record_route,
        with_bandwidth=with_bandwidth,
    )
    return Scenario(fleet=fleet, pairs=pairs, faults=injected, probes=probes, truth=truth(injected))
