"""A cost model for overlapping a tensor-parallel GEMM with its collective (AllGather+GEMM, GEMM+ReduceScatter,
GEMM+AllReduce), plain domain code with no MCP imports.

Shapes follow the Flux convention: m, n, k are the global GEMM dimensions.

- ``ag_gemm`` (column parallel): each rank holds m/world_size rows of A [m, k] and the weight slice [k, n/world_size];
  A is all-gathered (the whole m*k array is the collective's size) and each rank computes m x n/world_size x k.
- ``gemm_rs`` (row parallel): each rank holds A [m, k/world_size] and B [k/world_size, n], computes a partial
  [m, n] and reduce-scatters it to [m/world_size, n].
- ``gemm_ar``: the same partial, all-reduced.

Three pieces, each a textbook model with constants stated below:

1. Collective: ``T = alpha + S * f / B_bus`` (nccl-tests bus-bandwidth factors f; ring latency alpha from NCCL's
   tuning constants; the protocol is the one with the smallest predicted time, as NCCL's own tuner chooses).
2. GEMM: a roofline, ``max(flops / (eta * peak), bytes / (hbm_fraction * HBM bandwidth))`` where eta is the
   large-shape efficiency reduced by tile padding, wave quantisation and a short-K factor.
3. Overlap over C chunks of the row dimension: ``T = t_c + (C-1) * max(t_g, t_c) + t_g``, a two-stage pipeline.

Everything is a prediction to compare with measurements, not a measurement; `Calibration` replaces the two
most uncertain constants (GEMM efficiency, bus bandwidth) with measured values.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Literal

from pydantic import ConfigDict, Field

from servers.core.dtypes import DTYPES, ELEMENT_BYTES, GEMM_OUTPUT_BYTES
from servers.core.errors import InputError
from servers.core.gpus import DTYPE_SYNONYMS, GpuSpec, find_gpu
from servers.core.models import Model

Pattern = Literal["ag_gemm", "gemm_rs", "gemm_ar"]
PATTERNS: tuple[str, ...] = ("ag_gemm", "gemm_rs", "gemm_ar")
Interconnect = Literal["nvlink", "pcie", "infiniband", "infinity_fabric"]
INTERCONNECTS: tuple[str, ...] = ("nvlink", "pcie", "infiniband", "infinity_fabric")
Collective = Literal["all_gather", "reduce_scatter", "all_reduce"]
Protocol = Literal["LL", "LL128", "Simple"]

MAX_WORLD_SIZE = 1024
MAX_DIM = 2**24
MAX_CHUNKS = 1024

# ---------------------------------------------------------------------------------------------------------------
# Constants. Each one says where it comes from; the ones marked "tunable" were checked against the Flux numbers in
# the project's reference note (benchmarks/overlap_predict.py) and kept inside their physically sensible range.
# ---------------------------------------------------------------------------------------------------------------

# Bytes per element of the GEMM inputs (and of the all-gathered A) and of the GEMM output / communicated partials
# (servers/core/dtypes.py): fp8 GEMMs take e4m3 inputs and write bf16, so gemm_rs / gemm_ar communicate 2 bytes.

# Large-shape GEMM efficiency before the tile / wave / short-K losses below (tunable, 0.7-0.85 is the sensible
# range). Basis: torch GEMMs of M=4096 N=6144 K=12288 ran at 0.74 of peak on H800 and 0.81 on A800 (Flux report),
# and 8192^3 at 0.78-0.81 on an H200; after this model's wave and K losses (about 0.95 for those shapes), 0.80
# reproduces them within about 10%. fp8 kernels reach a smaller share of their (doubled) peak, and the 32-bit
# paths have no measurement here: those two are guesses to replace with a Calibration.
GEMM_EFFICIENCY: dict[str, float] = {"bf16": 0.80, "fp16": 0.80, "fp8": 0.65, "tf32": 0.75, "fp32": 0.75}
# Output tile the wave-quantisation estimate assumes (a typical cuBLAS/CUTLASS tile for 16-bit on Ampere/Hopper).
TILE_M = 128
TILE_N = 128
# A K loop of k elements pays prologue/epilogue worth about this many K elements: efficiency k / (k + K_OVERHEAD).
K_OVERHEAD = 128
# When there are fewer output tiles than SMs, libraries split K; each split keeps at least this many K elements.
SPLIT_K_MIN = 512
# Fraction of the datasheet HBM bandwidth a streaming kernel reaches (an H200 device copy measured 4.3 of 4.8 TB/s).
HBM_FRACTION = 0.90
# Smallest time of any GEMM kernel (launch, prologue and epilogue), microseconds; an order of magnitude only.
GEMM_FLOOR_US = 3.0
# Streaming multiprocessors (compute units for AMD) per GPU, from the vendors' architecture documents; the
# catalog does not carry them. A GPU missing here (GB200, whose per-GPU count is not in the reference notes)
# gets DEFAULT_SMS and an assumption line saying so.
SM_COUNT: dict[str, int] = {
    "A100-SXM-80GB": 108,
    "A800-SXM-80GB": 108,
    "H100-SXM": 132,
    "H100-PCIe": 114,
    "H800-SXM": 132,
    "H200-SXM": 132,
    "H20": 78,
    "B200": 148,
    "L40S": 142,
    "MI300X": 304,
}
DEFAULT_SMS = 132

# Achievable share of the per-direction link rate that a ring collective's bus bandwidth reaches.
# nvlink 0.80: 8x H100 ring all-reduce reaches about 370 GB/s busbw of 450 (nccl-tests issue 212), and H800
# gets about 160 of 200 GB/s one way (DeepEP measured 153-158); the Flux H800 all-gather implies 151.
# pcie 0.65: 8x H100 PCIe without NVSwitch reach 35-45 GB/s busbw on a 64 GB/s link.
# infinity_fabric: no measurement in the reference notes; the NVLink figure is used unvalidated.
LINK_FRACTION: dict[str, float] = {"nvlink": 0.80, "pcie": 0.65, "infinity_fabric": 0.80}
# InfiniBand NDR 400 Gb/s is 50 GB/s per direction; NCCL maintainers report 46-48 GB/s per NIC (nccl-tests issue
# 290). The model assumes one such NIC per GPU (rail-optimised nodes); HDR 200G halves it.
INFINIBAND_GB_S = 47.0
# PCIe per-lane, per-direction rate in GB/s by generation (x16 Gen5 is the familiar ~64 GB/s).
PCIE_LANE_GB_S: dict[int, float] = {3: 1.0, 4: 2.0, 5: 4.0, 6: 8.0}
# GPUs one NVLink domain holds (HGX boards: 8; GB200 NVL72: 72). Beyond it the default interconnect is infiniband.
NVLINK_DOMAIN: dict[str, int] = {"GB200": 72}
DEFAULT_DOMAIN = 8
GPUS_PER_NODE = 8

# NCCL ring tuning constants (src/graph/tuning.cc), microseconds: alpha = base + steps * hw.
RING_BASE_US: dict[str, float] = {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}
RING_HW_US: dict[str, dict[str, float]] = {
    "nvlink": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
    "pcie": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
    "network": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
}
# Share of the bus bandwidth each protocol reaches. LL packs 4 data bytes with a 4-byte flag per 8-byte line, so at
# most half, and 25-50% is reported: 0.35 sits inside that range, toward its low end, so that LL wins only for
# messages below about a megabyte on NVLink, as NCCL's tuner does. LL128 carries 120 data bytes per 128-byte
# line (about 95%); Simple runs at about the full rate.
PROTOCOL_BW: dict[str, float] = {"LL": 0.35, "LL128": 0.95, "Simple": 1.0}
# NCCL enables LL128 by default only over NVLink; over PCIe and the network the model offers LL and Simple.
PROTOCOLS_FOR: dict[str, tuple[str, ...]] = {
    "nvlink": ("LL", "LL128", "Simple"),
    "infinity_fabric": ("LL", "LL128", "Simple"),
    "pcie": ("LL", "Simple"),
    "infiniband": ("LL", "Simple"),
}

# Pipelining overheads (tunable; applied only when C >= 2, since C = 1 is the sequential schedule):
# D_SPLIT: a chunked GEMM loses some efficiency (more, smaller tiles and tails); 5%.
# D_CONTENTION: SM-based communication and the GEMM share SMs, L2 and HBM; 10% on the bandwidth term.
D_SPLIT = 0.05
D_CONTENTION = 0.10
# A calibrated fraction of peak is taken as what a GEMM of this size (all three dimensions) reaches.
CALIBRATION_REF_DIM = 8192
# Overlap counts as worth it when the best chunking is at least this much faster than sequential.
WORTH_IT_SPEEDUP = 1.05

_BUS_FACTOR_NOTE = "nccl-tests bus factor (n-1)/n for all_gather and reduce_scatter, 2(n-1)/n for all_reduce"


class Calibration(Model):
    """Measured values that replace the model's two most uncertain constants."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gemm_efficiency: float | None = Field(
        default=None, gt=0, le=1, description="fraction of the dense peak a large GEMM reached on this GPU"
    )
    bus_bandwidth_gbps: float | None = Field(
        default=None, gt=0, le=100_000, description="measured nccl-tests style busbw in GB/s at large sizes"
    )
    source: str = Field(default="user supplied", max_length=2000, description="where the measurements came from")


class ChunkEstimate(Model):
    """The pipelined schedule with a given number of chunks."""

    chunks: int = Field(ge=1, description="pieces the row dimension is cut into")
    t_chunk_gemm_ms: float = Field(ge=0, description="one chunk's GEMM (t_g), overheads included")
    t_chunk_comm_ms: float = Field(ge=0, description="one chunk's collective (t_c), latency included")
    t_overlap_ms: float = Field(ge=0, description="t_c + (C-1)*max(t_g, t_c) + t_g; sequential when C = 1")
    exposed_comm_ms: float = Field(description="t_overlap - t_gemm: communication (and overhead) left visible")
    efficiency: float | None = Field(
        description="(t_gemm + t_comm - t_overlap) / t_comm; 1 = fully hidden, None without communication"
    )
    speedup: float = Field(gt=0, description="(t_gemm + t_comm) / t_overlap")


class OverlapPrediction(Model):
    """What the cost model predicts for one tensor-parallel GEMM and its collective."""

    pattern: Pattern
    m: int
    n: int
    k: int
    world_size: int
    dtype: str
    gpu: str = Field(description="catalog name")
    interconnect: Interconnect
    collective: Collective | None = Field(description="None when world_size is 1")
    t_gemm_ms: float = Field(description="the undivided per-rank GEMM")
    t_comm_ms: float = Field(description="the undivided collective")
    t_sequential_ms: float = Field(description="t_gemm + t_comm")
    t_overlap_ms: float = Field(description="the pipelined schedule at best_chunks")
    best_chunks: int
    by_chunks: list[ChunkEstimate] = Field(description="chunk counts 1, 2, 4, ... up to max_chunks (powers of two)")
    efficiency: float | None = Field(description="overlap efficiency at best_chunks (None without communication)")
    speedup: float = Field(description="t_sequential / t_overlap at best_chunks")
    gemm_shape: tuple[int, int, int] = Field(description="per-rank GEMM (rows, cols, inner)")
    gemm_tflops: float = Field(description="per-rank TFLOP/s the predicted undivided GEMM reaches")
    gemm_bound: Literal["compute", "memory"]
    bus_bandwidth_gbps: float = Field(description="bus bandwidth the collective is modelled with (GB/s)")
    bytes_communicated: int = Field(description="the collective's size S: the whole array, as nccl-tests counts it")
    protocol: Protocol | None = Field(description="NCCL protocol predicted for the undivided collective")
    worth_it: bool
    advice: str
    assumptions: list[str]
    calibrated: bool


# ---------------------------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------------------------


def normalize_dtype(dtype: str) -> str:
    """The canonical dtype name for `dtype` ('bfloat16' -> 'bf16'), or InputError listing the accepted ones."""
    key = dtype.strip().lower().replace("-", "").replace("_", "") if isinstance(dtype, str) else None
    canonical = DTYPE_SYNONYMS.get(key or "")
    if canonical is None:
        raise InputError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    return canonical


def split_problems(pattern: str, m: int, n: int, k: int, world_size: int) -> list[str]:
    """Why the pattern's shards do not split evenly across `world_size` ranks (empty when they do).

    ag_gemm shards the rows of A (m) and the weight's columns (n); gemm_rs shards k and scatters the rows of the
    output (m); gemm_ar shards k only.
    """
    if world_size <= 1:
        return []
    needs = {"ag_gemm": ("m", "n"), "gemm_rs": ("m", "k"), "gemm_ar": ("k",)}[pattern]
    values = {"m": m, "n": n, "k": k}
    return [
        f"{dim}={values[dim]} is not divisible by world_size {world_size}"
        for dim in needs
        if values[dim] % world_size != 0
    ]


def _check_int(name: str, value: Any, low: int, high: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"{name} must be an integer from {low} to {high} ({meaning}); got {value!r}")
    return value


def _resolve_interconnect(spec: GpuSpec, interconnect: str | None, world_size: int) -> tuple[str, list[str]]:
    notes: list[str] = []
    domain = NVLINK_DOMAIN.get(spec.name, DEFAULT_DOMAIN)
    if interconnect is None:
        chosen = spec.interconnect
        if world_size > domain:
            notes.append(
                f"world_size {world_size} exceeds one {spec.interconnect} domain of {domain} GPUs, so the ring is "
                "modelled over InfiniBand"
            )
            chosen = "infiniband"
        return chosen, notes
    key = interconnect.strip().lower().replace("-", "_").replace(" ", "_") if isinstance(interconnect, str) else ""
    aliases = {"ib": "infiniband", "network": "infiniband", "nvswitch": "nvlink", "xgmi": "infinity_fabric"}
    key = aliases.get(key, key)
    if key not in INTERCONNECTS:
        raise InputError(f"unknown interconnect {interconnect!r}; accepted: {', '.join(INTERCONNECTS)} (or omit it)")
    if key == "nvlink" and spec.interconnect != "nvlink":
        raise InputError(
            f"{spec.name} has no NVLink (catalog interconnect {spec.interconnect}); use pcie or infiniband"
        )
    if key == "infinity_fabric" and spec.interconnect != "infinity_fabric":
        raise InputError(f"{spec.name} has no Infinity Fabric links; use {spec.interconnect}, pcie or infiniband")
    if key in ("nvlink", "infinity_fabric") and world_size > domain:
        notes.append(
            f"{key} was asked for with {world_size} GPUs, more than the usual domain of {domain}: the model assumes "
            "one switched domain that large"
        )
    return key, notes


def _pcie_gb_s(spec: GpuSpec) -> float:
    if spec.interconnect == "pcie":
        return spec.gpu_gpu_unidirectional_gb_s
    return PCIE_LANE_GB_S.get(spec.pcie_generation, 4.0) * spec.pcie_lanes


def link_bus_bandwidth(spec: GpuSpec, interconnect: str) -> tuple[float, str]:
    """Achievable ring bus bandwidth in GB/s for `interconnect` on `spec`, with the reasoning as text."""
    if interconnect == "infiniband":
        return INFINIBAND_GB_S, f"InfiniBand: {INFINIBAND_GB_S:g} GB/s per NDR 400G NIC, one NIC per GPU"
    if interconnect == "pcie":
        raw = _pcie_gb_s(spec)
        frac = LINK_FRACTION["pcie"]
        return raw * frac, f"PCIe Gen{spec.pcie_generation} x{spec.pcie_lanes}: {frac:g} x {raw:g} GB/s per direction"
    raw = spec.gpu_gpu_unidirectional_gb_s
    frac = LINK_FRACTION[interconnect]
    return raw * frac, f"{interconnect}: {frac:g} x {raw:g} GB/s per direction (catalog), achievable ring busbw"


# ---------------------------------------------------------------------------------------------------------------
# Collective model
# ---------------------------------------------------------------------------------------------------------------


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    n = world_size
    return 2.0 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n


def _latency_us(collective: str, world_size: int, interconnect: str, intra: str, protocol: str) -> float:
    """NCCL ring latency: base + steps * hop latency; over InfiniBand only node-crossing steps use the network."""
    steps = 2 * (world_size - 1) if collective == "all_reduce" else world_size - 1
    if interconnect != "infiniband":
        return RING_BASE_US[protocol] + steps * RING_HW_US[intra][protocol]
    nodes = math.ceil(world_size / GPUS_PER_NODE)
    # A ring of at most one node's worth of GPUs explicitly put on the network: one GPU per node, every step
    # crosses it. Otherwise NCCL's count: one network crossing per node per ring pass (two passes for all_reduce).
    passes = 2 if collective == "all_reduce" else 1
    inter_steps = steps if nodes == 1 else passes * (nodes - 1)
    return (
        RING_BASE_US[protocol]
        + inter_steps * RING_HW_US["network"][protocol]
        + (steps - inter_steps) * RING_HW_US[intra][protocol]
    )


def collective_parts(
    collective: str, size_bytes: float, world_size: int, interconnect: str, intra: str, bus_gbps: float
) -> tuple[float, float, str]:
    """(latency_s, bandwidth_s, protocol) of the protocol with the smallest predicted time, as NCCL's tuner picks."""
    if world_size <= 1 or size_bytes <= 0:
        return 0.0, 0.0, "Simple"
    factor = bus_factor(collective, world_size)
    best: tuple[float, float, str] | None = None
    for protocol in PROTOCOLS_FOR[interconnect]:
        lat = _latency_us(collective, world_size, interconnect, intra, protocol) * 1e-6
        bw = size_bytes * factor / (bus_gbps * 1e9 * PROTOCOL_BW[protocol])
        if best is None or lat + bw < best[0] + best[1]:
            best = (lat, bw, protocol)
    assert best is not None
    return best


# ---------------------------------------------------------------------------------------------------------------
# GEMM model
# ---------------------------------------------------------------------------------------------------------------


def _gemm_efficiency(m: int, n: int, k: int, sms: int, eta: float, whole_waves: bool) -> float:
    """eta reduced by tile padding, SM occupancy (wave quantisation) and the short-K factor.

    whole_waves=True (one standalone kernel): the last partial wave idles the remaining SMs.
    whole_waves=False (a chunk inside a pipeline): the next chunk's tiles fill the tail, so only a chunk too small
    to occupy every SM loses (its fill fraction).
    """
    tiles_m, tiles_n = math.ceil(m / TILE_M), math.ceil(n / TILE_N)
    tiles = tiles_m * tiles_n
    padding = (m * n) / (tiles_m * TILE_M * tiles_n * TILE_N)
    splits = 1
    if tiles < sms:
        splits = max(1, min(sms // tiles, k // SPLIT_K_MIN))
    units = tiles * splits
    occupancy = units / (math.ceil(units / sms) * sms) if whole_waves else min(1.0, units / sms)
    short_k = k / (k + K_OVERHEAD)
    return eta * padding * occupancy * short_k


def gemm_time(
    m: int, n: int, k: int, spec: GpuSpec, dtype: str, eta: float, *, whole_waves: bool = True
) -> tuple[float, str, float]:
    """(seconds, 'compute' or 'memory', efficiency used) for an m x n x k GEMM on `spec` under the roofline."""
    sms = SM_COUNT.get(spec.name, DEFAULT_SMS)
    peak = spec.peak_tflops(dtype) * 1e12
    eff = _gemm_efficiency(m, n, k, sms, eta, whole_waves)
    t_compute = 2.0 * m * n * k / (eff * peak)
    moved = (m * k + k * n) * ELEMENT_BYTES[dtype] + m * n * GEMM_OUTPUT_BYTES[dtype]
    t_memory = moved / (spec.hbm_tb_s * 1e12 * HBM_FRACTION)
    bound = "compute" if t_compute >= t_memory else "memory"
    return max(t_compute, t_memory) + GEMM_FLOOR_US * 1e-6, bound, eff


# ---------------------------------------------------------------------------------------------------------------
# The prediction
# ---------------------------------------------------------------------------------------------------------------


def pipeline_time(t_g: float, t_c: float, chunks: int) -> float:
    """Two-stage pipeline over `chunks` pieces: the first stage once, the slower stage C-1 times, the last once."""
    if chunks <= 1:
        return t_g + t_c
    return t_c + (chunks - 1) * max(t_g, t_c) + t_g


def _chunk_counts(max_chunks: int, m: int) -> list[int]:
    counts = [1]
    while counts[-1] * 2 <= min(max_chunks, m):
        counts.append(counts[-1] * 2)
    return counts


def _gemm_efficiency_used(spec: GpuSpec, dtype: str, calibration: Calibration | None) -> tuple[float, str]:
    """The large-shape GEMM efficiency the model uses (its default, or the calibration's), and how it was set."""
    eta = GEMM_EFFICIENCY[dtype]
    eta_note = f"large-shape GEMM efficiency {eta:g} of the {dtype} dense peak (model default)"
    if calibration is not None and calibration.gemm_efficiency is not None:
        # A measured fraction of peak on large shapes already includes this model's shape losses for such shapes
        # (about 5%): divide them out, using an 8192^3 GEMM as the representative large shape.
        sms_ref = SM_COUNT.get(spec.name, DEFAULT_SMS)
        reference = _gemm_efficiency(CALIBRATION_REF_DIM, CALIBRATION_REF_DIM, CALIBRATION_REF_DIM, sms_ref, 1.0, True)
        eta = min(1.0, calibration.gemm_efficiency / reference)
        eta_note = (
            f"large-shape GEMM efficiency {calibration.gemm_efficiency:.3g} of peak from calibration "
            f"({calibration.source}), i.e. {eta:.3g} before the shape losses"
        )
    return eta, eta_note


def _bus_bandwidth_used(spec: GpuSpec, ic: str, world_size: int, calibration: Calibration | None) -> tuple[float, str]:
    """The collective's bus bandwidth (the link's, the intra-node link's when slower across nodes, or the
    calibration's), and where it came from."""
    bus_gbps, bus_note = link_bus_bandwidth(spec, ic)
    if ic == "infiniband" and world_size > GPUS_PER_NODE:
        intra_gbps, _ = link_bus_bandwidth(spec, "pcie" if spec.interconnect == "pcie" else spec.interconnect)
        if intra_gbps < bus_gbps:
            bus_gbps, bus_note = intra_gbps, bus_note + f"; limited by the intra-node link to {intra_gbps:.4g} GB/s"
    if calibration is not None and calibration.bus_bandwidth_gbps is not None:
        bus_gbps = calibration.bus_bandwidth_gbps
        bus_note = f"bus bandwidth {bus_gbps:.4g} GB/s from calibration ({calibration.source})"
    return bus_gbps, bus_note


def _chunk_estimate(
    chunks: int,
    t_gemm: float,
    t_comm: float,
    shape: tuple[int, int, int],
    spec: GpuSpec,
    dtype: str,
    eta: float,
    comm: tuple[str, float, int, str, str, float],
) -> ChunkEstimate:
    """The pipelined schedule with `chunks` chunks (1: the sequential one). comm: (collective, bytes, world size,
    interconnect, intra-node link, bus bandwidth)."""
    rows, cols, inner = shape
    collective, size, ws, ic, intra, bus_gbps = comm
    if chunks == 1:
        t_g, t_c = t_gemm, t_comm
    else:
        chunk_rows = math.ceil(rows / chunks)
        t_chunk, _, _ = gemm_time(chunk_rows, cols, inner, spec, dtype, eta, whole_waves=False)
        t_g = max(t_gemm / chunks, t_chunk) * (1 + D_SPLIT)
        c_lat, c_bw, _ = collective_parts(collective, size / chunks, ws, ic, intra, bus_gbps)
        t_c = c_lat + c_bw * (1 + D_CONTENTION)
    t_total = pipeline_time(t_g, t_c, chunks)
    return ChunkEstimate(
        chunks=chunks,
        t_chunk_gemm_ms=t_g * 1e3,
        t_chunk_comm_ms=t_c * 1e3,
        t_overlap_ms=t_total * 1e3,
        exposed_comm_ms=(t_total - t_gemm) * 1e3,
        efficiency=(t_gemm + t_comm - t_total) / t_comm if t_comm > 0 else None,
        speedup=(t_gemm + t_comm) / t_total,
    )


def predict_overlap(
    pattern: Pattern,
    m: int,
    n: int,
    k: int,
    world_size: int,
    dtype: str = "bf16",
    gpu: str = "H100-SXM",
    interconnect: str | None = None,
    max_chunks: int = 16,
    calibration: Calibration | None = None,
) -> OverlapPrediction:
    """Predict the sequential and chunk-pipelined time of one tensor-parallel GEMM and its collective.

    Raises InputError for an unknown pattern, GPU, dtype or interconnect, a dtype the GPU has no peak for,
    shapes out of range or that do not split across `world_size`, and bad chunk counts.
    """
    if pattern not in PATTERNS:
        raise InputError(f"unknown pattern {pattern!r}; accepted: {', '.join(PATTERNS)}")
    for name, value in (("m", m), ("n", n), ("k", k)):
        _check_int(name, value, 1, MAX_DIM, "a global GEMM dimension")
    _check_int("world_size", world_size, 1, MAX_WORLD_SIZE, "tensor-parallel ranks; 1 means no communication")
    _check_int("max_chunks", max_chunks, 1, MAX_CHUNKS, "the largest chunk count tried")
    problems = split_problems(pattern, m, n, k, world_size)
    if problems:
        raise InputError(
            f"{pattern} cannot split this shape across {world_size} ranks: {'; '.join(problems)}. "
            "ag_gemm needs m and n divisible by world_size, gemm_rs needs m and k, gemm_ar needs k"
        )
    spec = find_gpu(gpu)
    dtype = normalize_dtype(dtype)
    spec.peak_tflops(dtype)  # raises InputError naming the dtypes this GPU has
    ic, assumptions = _resolve_interconnect(spec, interconnect, world_size)
    intra = "pcie" if spec.interconnect == "pcie" or ic == "pcie" else "nvlink"

    calibrated = calibration is not None and (
        calibration.gemm_efficiency is not None or calibration.bus_bandwidth_gbps is not None
    )
    eta, eta_note = _gemm_efficiency_used(spec, dtype, calibration)
    bus_gbps, bus_note = _bus_bandwidth_used(spec, ic, world_size, calibration)

    ws = world_size
    if pattern == "ag_gemm":
        rows, cols, inner = m, n // ws, k
        collective: str = "all_gather"
        size = m * k * ELEMENT_BYTES[dtype]
    else:
        rows, cols, inner = m, n, k // ws
        collective = "reduce_scatter" if pattern == "gemm_rs" else "all_reduce"
        size = m * n * GEMM_OUTPUT_BYTES[dtype]

    t_gemm, bound, eff = gemm_time(rows, cols, inner, spec, dtype, eta)
    lat, bw, protocol = collective_parts(collective, size, ws, ic, intra, bus_gbps)
    t_comm = lat + bw

    by_chunks = [
        _chunk_estimate(
            chunks, t_gemm, t_comm, (rows, cols, inner), spec, dtype, eta, (collective, size, ws, ic, intra, bus_gbps)
        )
        for chunks in (_chunk_counts(max_chunks, rows) if ws > 1 else [1])
    ]
    best = min(by_chunks, key=lambda e: (e.t_overlap_ms, e.chunks))
    speedup = best.speedup
    worth_it = ws > 1 and best.chunks > 1 and speedup >= WORTH_IT_SPEEDUP

    sms = SM_COUNT.get(spec.name)
    assumptions += [
        f"per-rank GEMM {rows} x {cols} x {inner} ({dtype}); {eta_note}, reduced by {TILE_M}x{TILE_N} tile padding, "
        f"wave quantisation over {sms or DEFAULT_SMS} SMs"
        + ("" if sms else " (SM count not known for this GPU: default)")
        + f" and a short-K factor k/(k+{K_OVERHEAD}); net {eff:.3g}",
        f"memory roofline at {HBM_FRACTION:g} of {spec.hbm_tb_s:g} TB/s; every GEMM kernel takes at least "
        f"{GEMM_FLOOR_US:g} us",
        f"{bus_note}; {_BUS_FACTOR_NOTE}",
        f"NCCL ring latency constants for {ic} (tuning.cc); protocol = the one with the least predicted time "
        f"among {', '.join(PROTOCOLS_FOR[ic])} (LL at {PROTOCOL_BW['LL']:g}, LL128 at {PROTOCOL_BW['LL128']:g} "
        "of the bus bandwidth); NVLS and tree algorithms are not modelled",
        f"chunking splits the {rows} rows into C = 1, 2, 4, ... (powers of two up to {max_chunks}); for C >= 2 each "
        f"chunk GEMM costs {1 + D_SPLIT:g}x its share and each chunk collective pays its own latency plus "
        f"{1 + D_CONTENTION:g}x its bandwidth time (SM/HBM contention); C = 1 is the sequential schedule",
    ]
    if dtype == "fp8":
        assumptions.append(
            "fp8: e4m3 inputs (ag_gemm gathers 1-byte A) and bf16 output, so gemm_rs / gemm_ar communicate "
            "2-byte partials"
        )
    if ws == 1:
        assumptions.append("world_size 1: there is no collective, so nothing to overlap")

    advice = _advice(pattern, ws, t_gemm, t_comm, best, worth_it, cols, rows)
    return OverlapPrediction(
        pattern=pattern,
        m=m,
        n=n,
        k=k,
        world_size=ws,
        dtype=dtype,
        gpu=spec.name,
        interconnect=ic,  # type: ignore[arg-type]
        collective=collective if ws > 1 else None,  # type: ignore[arg-type]
        t_gemm_ms=t_gemm * 1e3,
        t_comm_ms=t_comm * 1e3,
        t_sequential_ms=(t_gemm + t_comm) * 1e3,
        t_overlap_ms=best.t_overlap_ms,
        best_chunks=best.chunks,
        by_chunks=by_chunks,
        efficiency=best.efficiency,
        speedup=speedup,
        gemm_shape=(rows, cols, inner),
        gemm_tflops=2.0 * rows * cols * inner / t_gemm / 1e12,
        gemm_bound=bound,  # type: ignore[arg-type]
        bus_bandwidth_gbps=bus_gbps,
        bytes_communicated=size if ws > 1 else 0,
        protocol=protocol if ws > 1 else None,  # type: ignore[arg-type]
        worth_it=worth_it,
        advice=advice,
        assumptions=assumptions,
        calibrated=calibrated,
    )


def _advice(
    pattern: str, ws: int, t_gemm: float, t_comm: float, best: ChunkEstimate, worth_it: bool, cols: int, rows: int
) -> str:
    if ws == 1:
        return "world_size 1 has no communication, so there is nothing to overlap; run the GEMM alone."
    ratio = t_comm / t_gemm
    if worth_it:
        text = (
            f"Overlap pays: {best.chunks} chunks give {best.t_overlap_ms:.3g} ms against "
            f"{(t_gemm + t_comm) * 1e3:.3g} ms sequential ({best.speedup:.2f}x, hiding "
            f"{100 * (best.efficiency or 0):.0f}% of the communication)."
        )
        if ratio > 1:
            text += (
                " The collective is longer than the GEMM, so at best the GEMM hides inside it; "
                "moving fewer bytes (fp8 gathers, a smaller TP group) helps more than finer chunks."
            )
        return text
    ceiling = (t_gemm + t_comm) / max(t_gemm, t_comm)
    if ceiling < WORTH_IT_SPEEDUP:
        if t_comm <= t_gemm:
            return (
                f"Not worth it: communication is only {100 * ratio:.1f}% of the GEMM, so even perfect overlap "
                f"would be {ceiling:.3f}x at best; keep the sequential schedule."
            )
        return (
            f"Not worth it: the GEMM is only {100 / ratio:.1f}% of the collective, so even perfect overlap would be "
            f"{ceiling:.3f}x at best; the collective dominates, so cut the bytes or the latency instead."
        )
    narrow = "N per rank" if pattern == "ag_gemm" else "M"
    text = (
        f"Not worth it: at best {best.speedup:.2f}x with {best.chunks} chunk(s). Per-chunk costs (collective "
        f"latency on every chunk, smaller and less efficient GEMM pieces) eat the gain, as happens when the GEMM is "
        f"small ({narrow} = {cols if pattern == 'ag_gemm' else rows}) or memory-bound; keep it sequential or "
        "grow the micro-batch."
    )
    if ratio > 1:
        text += f" The collective is {ratio:.1f}x the GEMM, so only the GEMM's {t_gemm * 1e3:.3g} ms could ever hide."
    return text


# ---------------------------------------------------------------------------------------------------------------
# Calibration from stored benchmark results
# ---------------------------------------------------------------------------------------------------------------

LARGE_GEMM_MIN_DIM = 2048
LARGE_COLLECTIVE_BYTES = 64 * 2**20
_COLLECTIVE_OPS = {"all_gather", "allgather", "reduce_scatter", "reducescatter", "all_reduce", "allreduce"}


def _matches_gpu(result: dict[str, Any], spec: GpuSpec) -> bool:
    named = result.get("gpu_catalog_name") or result.get("gpu")
    if isinstance(named, str) and named:
        try:
            return find_gpu(named).name == spec.name
        except InputError:
            return False
    device = result.get("device_name")
    if isinstance(device, str) and device and device.lower() != "cpu":
        try:
            return find_gpu(device).name == spec.name
        except InputError:
            return False
    return False


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _collective_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for item in results:
        if not isinstance(item, dict):
            continue
        nested = item.get("rows")
        if isinstance(nested, list):
            parent = {key: value for key, value in item.items() if key != "rows"}
            rows.extend({**parent, **row} for row in nested if isinstance(row, dict))
        else:
            rows.append(item)
    return rows


def _row_busbw(row: dict[str, Any]) -> float | None:
    for key in ("busbw", "busbw_gbps", "bus_bandwidth_gbps"):
        value = _number(row.get(key))
        if value is not None:
            return value
    values = [
        _number(part.get("busbw_gbps") or part.get("busbw"))
        for part in (row.get("out_of_place"), row.get("in_place"))
        if isinstance(part, dict)
    ]
    present = [v for v in values if v is not None]
    return max(present) if present else None


def calibration_from_measurements(
    gemm_results: list[dict[str, Any]],
    collective_results: list[dict[str, Any]],
    gpu: str,
    dtype: str = "bf16",
) -> Calibration | None:
    """A Calibration from stored benchmark results for `gpu`, or None when none of them applies.

    GEMM results (as the gemm_benchmark job stores them: device_name or gpu_catalog_name, dtype, m, n, k,
    fraction_of_peak or tflops) count when they ran on this GPU with `dtype` and every dimension is at least
    2048; the median fraction of peak becomes gemm_efficiency. Collective rows (busbw in GB/s, size in bytes, op;
    a result with a 'rows' list is flattened) count when they are all_gather / reduce_scatter / all_reduce rows
    of at least 64 MiB, not on CPU, and not from another GPU; the median busbw becomes bus_bandwidth_gbps.
    """
    spec = find_gpu(gpu)
    dtype = normalize_dtype(dtype)
    fractions: list[float] = []
    for result in gemm_results:
        if not isinstance(result, dict) or not _matches_gpu(result, spec):
            continue
        try:
            if normalize_dtype(str(result.get("dtype", ""))) != dtype:
                continue
        except InputError:
            continue
        dims = [result.get(key) for key in ("m", "n", "k")]
        if not all(isinstance(d, int) and d >= LARGE_GEMM_MIN_DIM for d in dims):
            continue
        fraction = _number(result.get("fraction_of_peak"))
        if fraction is None:
            tflops = _number(result.get("tflops"))
            peak = getattr(spec, f"{dtype}_tflops")
            fraction = tflops / peak if tflops is not None and peak else None
        if fraction is not None and fraction <= 1.0:
            fractions.append(fraction)

    bandwidths: list[float] = []
    for row in _collective_rows(collective_results):
        op = str(row.get("op") or row.get("collective") or "").lower()
        if op and op not in _COLLECTIVE_OPS:
            continue
        if str(row.get("device", "")).lower() == "cpu" or str(row.get("backend", "")).lower() == "gloo":
            continue
        device = row.get("device_name") or row.get("gpu_catalog_name")
        if isinstance(device, str) and device and not _matches_gpu(row, spec):
            continue
        size = _number(row.get("size") if row.get("size") is not None else row.get("size_bytes"))
        busbw = _row_busbw(row)
        if size is not None and size >= LARGE_COLLECTIVE_BYTES and busbw is not None:
            bandwidths.append(busbw)

    if not fractions and not bandwidths:
        return None
    parts = []
    if fractions:
        parts.append(f"median fraction of peak over {len(fractions)} {dtype} GEMM(s) with all dims >= 2048")
    if bandwidths:
        parts.append(f"median busbw over {len(bandwidths)} collective row(s) of >= 64 MiB")
    return Calibration(
        gemm_efficiency=statistics.median(fractions) if fractions else None,
        bus_bandwidth_gbps=statistics.median(bandwidths) if bandwidths else None,
        source=f"{spec.name}: " + "; ".join(parts),
    )


def why_uncalibrated(
    gemm_results: list[dict[str, Any]], collective_results: list[dict[str, Any]], gpu: str, dtype: str = "bf16"
) -> str:
    """Why calibration_from_measurements found nothing to calibrate `gpu` with: what is stored, and what counts."""
    spec = find_gpu(gpu)
    dtype = normalize_dtype(dtype)
    gemms = [r for r in gemm_results if isinstance(r, dict)]
    on_gpu = [r for r in gemms if _matches_gpu(r, spec)]
    rows = _collective_rows(collective_results)
    rows_on_gpu = [r for r in rows if _matches_gpu(r, spec)]
    return (
        f"no calibration: of {len(gemms)} stored gemm_benchmark result(s), {len(on_gpu)} ran on {spec.name}, none "
        f"of them {dtype} with every dimension >= {LARGE_GEMM_MIN_DIM}; of {len(rows)} stored collective row(s), "
        f"{len(rows_on_gpu)} ran on {spec.name}, none of them an all_gather, reduce_scatter or all_reduce of >= "
        f"{LARGE_COLLECTIVE_BYTES // 2**20} MiB. Run benchmark_gemm (all dims >= {LARGE_GEMM_MIN_DIM}) and "
        f"benchmark_collective (up to >= {LARGE_COLLECTIVE_BYTES // 2**20} MiB) on a {spec.name} to calibrate"
    )
