"""The GPU catalog: dense peak throughput, memory and link figures per GPU, read from resources/gpus.json.

Plain domain code (no MCP imports). Look a GPU up with `find_gpu`, which accepts the catalog name, any alias or an
nvidia-smi product name, ignoring case, spaces, dashes and underscores; read a peak with `peak_tflops`.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from servers.core.dtypes import DTYPES, Dtype
from servers.core.errors import InputError
from servers.core.models import Model
from servers.core.paths import resources_dir

CATALOG_FILE = "gpus.json"
SCHEMA_VERSION = 1

# Spellings a caller might use for a dtype, keyed by their normalised form (see _key).
DTYPE_SYNONYMS: dict[str, Dtype] = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
    "tensorfloat32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "float8": "fp8",
    "e4m3": "fp8",
}

# Leading vendor words that nvidia-smi / rocm-smi put in front of product names.
_VENDOR_PREFIXES: tuple[str, ...] = ("nvidia", "amd")

_SEPARATORS = re.compile(r"[\s\-_]+")
_MODEL_TOKEN = re.compile(r"[a-z]*\d+")


class GpuSource(Model):
    """Where one figure (or group of figures) in an entry comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    what: str = Field(min_length=1, description="which figures this source backs")
    source: str = Field(min_length=1, description="the data sheet or publication, with a URL a reader can open")


class GpuSpec(Model):
    """One GPU's peak figures. Tensor throughputs are dense (no 2:4 sparsity), in TFLOP/s; None means no such peak."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="canonical short key, e.g. 'H100-SXM'")
    aliases: tuple[str, ...] = Field(default=(), description="lowercase names a user or nvidia-smi might give")
    vendor: str = Field(min_length=1)
    architecture: str = Field(min_length=1)
    form_factor: str = Field(min_length=1)
    bf16_tflops: PositiveFloat | None
    fp16_tflops: PositiveFloat | None
    fp8_tflops: PositiveFloat | None
    tf32_tflops: PositiveFloat | None
    fp32_tflops: PositiveFloat | None
    hbm_gb: PositiveFloat = Field(description="device memory in GB (GDDR on cards without HBM)")
    hbm_tb_s: PositiveFloat = Field(description="device memory bandwidth in TB/s")
    memory_type: str = Field(min_length=1)
    interconnect: Literal["nvlink", "pcie", "infinity_fabric"]
    gpu_gpu_bidirectional_gb_s: PositiveFloat = Field(description="per-GPU link bandwidth, both directions summed")
    gpu_gpu_unidirectional_gb_s: PositiveFloat = Field(description="per-GPU link bandwidth, one direction")
    nvlink_generation: PositiveInt | None
    pcie_generation: PositiveInt
    pcie_lanes: PositiveInt
    tdp_w: PositiveFloat | None
    sources: tuple[GpuSource, ...] = Field(min_length=1)
    notes: str = ""

    @field_validator("aliases")
    @classmethod
    def _aliases_lowercase(cls, aliases: tuple[str, ...]) -> tuple[str, ...]:
        for alias in aliases:
            if not alias.strip() or alias != alias.strip().lower():
                raise ValueError(f"alias {alias!r} must be non-empty, lowercase and without surrounding spaces")
        return aliases

    @model_validator(mode="after")
    def _consistent(self) -> GpuSpec:
        if self.gpu_gpu_unidirectional_gb_s > self.gpu_gpu_bidirectional_gb_s:
            raise ValueError(f"{self.name}: unidirectional link bandwidth exceeds the bidirectional figure")
        if (self.interconnect == "nvlink") != (self.nvlink_generation is not None):
            raise ValueError(f"{self.name}: nvlink_generation must be set exactly when interconnect is 'nvlink'")
        return self

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for `dtype`; see the module-level `peak_tflops`."""
        return peak_tflops(self, dtype)

    def available_dtypes(self) -> list[Dtype]:
        """The dtypes this GPU has a peak for, in the order fp32, tf32, bf16, fp16, fp8."""
        return [d for d in DTYPES if getattr(self, f"{d}_tflops") is not None]


class GpuCatalog(Model):
    """The whole gpus.json document."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1]
    description: str = Field(min_length=1)
    gpus: tuple[GpuSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unambiguous(self) -> GpuCatalog:
        _build_index(self.gpus)  # raises on duplicate names or an alias claimed by two GPUs
        return self


def _key(text: str) -> str:
    """Lowercase and drop spaces, dashes and underscores, so 'H100_SXM', 'h100 sxm' and 'H100-SXM' compare equal."""
    return _SEPARATORS.sub("", text.strip().lower())


def _lookup_keys(text: str) -> list[str]:
    """The normalised key of `text`, plus the same key without a leading vendor word ('nvidia', 'amd')."""
    key = _key(text)
    keys = [key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            keys.append(key[len(prefix) :])
    return keys


def _model_token(key: str) -> str:
    """The leading letters+digits of a normalised key ('h100' of 'h100sxm5'), or the whole key if it has none."""
    match = _MODEL_TOKEN.match(key)
    return match.group(0) if match else key


def _build_index(gpus: tuple[GpuSpec, ...]) -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    names: set[str] = set()
    for gpu in gpus:
        if gpu.name in names:
            raise ValueError(f"GPU name {gpu.name!r} appears twice in the catalog")
        names.add(gpu.name)
        for label in (gpu.name, *gpu.aliases):
            for key in _lookup_keys(label):
                owner = index.setdefault(key, gpu)
                if owner.name != gpu.name:
                    raise ValueError(f"{label!r} of {gpu.name} normalises to {key!r}, already used by {owner.name}")
    return index


def parse_gpu_catalog(data: object) -> GpuCatalog:
    """Validate an already-decoded gpus.json document (raises pydantic.ValidationError when it is malformed)."""
    return GpuCatalog.model_validate(data)


@lru_cache(maxsize=1)
def _catalog() -> GpuCatalog:
    path = resources_dir() / CATALOG_FILE
    with path.open(encoding="utf-8") as handle:
        return parse_gpu_catalog(json.load(handle))


@lru_cache(maxsize=1)
def _index() -> dict[str, GpuSpec]:
    return _build_index(_catalog().gpus)


def load_gpu_catalog() -> list[GpuSpec]:
    """All catalogued GPUs, in file order. The file is read and validated once per process."""
    return list(_catalog().gpus)


def gpu_names() -> list[str]:
    """The canonical names, in file order."""
    return [gpu.name for gpu in _catalog().gpus]


def find_gpu(name: str) -> GpuSpec:
    """The GPU whose name or alias matches `name`, ignoring case, spaces, dashes, underscores and a vendor prefix.

    nvidia-smi product names such as 'NVIDIA H100 80GB HBM3' or 'NVIDIA A100-SXM4-80GB' are accepted.
    Raises InputError listing the accepted names when nothing matches.
    """
    if not isinstance(name, str) or not _key(name):
        raise InputError(f"a GPU name is required; accepted names: {', '.join(gpu_names())}")
    index = _index()
    for key in _lookup_keys(name):
        if key in index:
            return index[key]
    accepted = ", ".join(gpu_names())
    hint = ""
    query = _lookup_keys(name)[-1]
    close = difflib.get_close_matches(query, list(index), n=1, cutoff=0.75)
    # Only suggest a near miss of the same model ('h100sx' -> H100-SXM), never another model ('a100 pcie' -> H100-PCIe).
    if close and _model_token(query) == _model_token(_lookup_keys(close[0])[-1]):
        hint = f" The nearest catalogued entry is {index[close[0]].name}; check it is the same part before using it."
    raise InputError(
        f"unknown GPU {name!r}.{hint} Accepted names: {accepted}. Aliases such as 'h100', 'nvidia h100 80gb hbm3' "
        "and nvidia-smi product names also work; case, spaces, dashes and underscores are ignored."
    )


def peak_tflops(spec: GpuSpec, dtype: str) -> float:
    """Dense peak TFLOP/s of `spec` for `dtype` (fp32, tf32, bf16, fp16 or fp8; 'bfloat16' etc. also accepted).

    Raises InputError for an unknown dtype, or when this GPU has no peak for it (e.g. fp8 on A100), naming the
    dtypes it does have.
    """
    canonical = DTYPE_SYNONYMS.get(_key(dtype)) if isinstance(dtype, str) else None
    if canonical is None:
        raise InputError(f"unknown dtype {dtype!r}; accepted dtypes: {', '.join(DTYPES)}")
    value = getattr(spec, f"{canonical}_tflops")
    if value is None:
        have = ", ".join(spec.available_dtypes()) or "none"
        raise InputError(f"{spec.name} ({spec.architecture}) has no {canonical} peak; its catalogued dtypes: {have}")
    return float(value)
