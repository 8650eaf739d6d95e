"""The GPU catalog (resources/gpus.json) and its loader (servers/core/gpus.py)."""

from __future__ import annotations

import copy
import json

import pytest
from pydantic import ValidationError

from servers.core.errors import InputError
from servers.core.gpus import (
    DTYPES,
    GpuSpec,
    find_gpu,
    gpu_names,
    load_gpu_catalog,
    parse_gpu_catalog,
    peak_tflops,
)
from servers.core.paths import resources_dir

REQUIRED = [
    "A100-SXM-80GB",
    "A800-SXM-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H800-SXM",
    "H20",
    "H200-SXM",
    "B200",
    "L40S",
]

# Figures from the project's reference note (shared/reference/hardware.md), which the catalog must carry unchanged.
# None means the note gives no such figure ("-").
HARDWARE_MD = {
    "A100-SXM-80GB": {"bf16": 312, "fp8": None, "hbm_gb": 80, "hbm_tb_s": 2.0, "bidir": 600},
    "A800-SXM-80GB": {"bf16": 312, "fp8": None, "hbm_gb": 80, "hbm_tb_s": 2.0, "bidir": 400},
    "H100-SXM": {"bf16": 989, "fp8": 1979, "hbm_gb": 80, "hbm_tb_s": 3.35, "bidir": 900, "unidir": 450},
    "H800-SXM": {"bf16": 989, "fp8": 1979, "hbm_gb": 80, "hbm_tb_s": 3.35, "bidir": 400},
    "H200-SXM": {"bf16": 989, "fp8": 1979, "hbm_gb": 141, "hbm_tb_s": 4.8, "bidir": 900},
    "B200": {"bf16": 2250, "fp8": 4500, "hbm_tb_s": 8.0, "bidir": 1800},
}


@pytest.fixture(scope="module")
def catalog() -> list[GpuSpec]:
    return load_gpu_catalog()


def _raw_document() -> dict:
    with (resources_dir() / "gpus.json").open(encoding="utf-8") as handle:
        return json.load(handle)


# --- the file ---------------------------------------------------------------------------------------------------


def test_catalog_parses(catalog: list[GpuSpec]) -> None:
    raw = _raw_document()
    assert raw["schema_version"] == 1
    assert raw["description"].strip()
    assert len(catalog) == len(raw["gpus"]) >= len(REQUIRED)
    assert all(isinstance(gpu, GpuSpec) for gpu in catalog)


def test_every_entry_has_every_field_spelled_out() -> None:
    # null is allowed, but a missing key would silently become a default in some other reader.
    expected = set(GpuSpec.model_fields)
    for entry in _raw_document()["gpus"]:
        assert set(entry) == expected, entry["name"]


def test_load_is_cached_but_returns_a_fresh_list(catalog: list[GpuSpec]) -> None:
    again = load_gpu_catalog()
    assert again == catalog
    assert again is not catalog
    assert again[0] is catalog[0]


def test_every_entry_has_sources_and_notes(catalog: list[GpuSpec]) -> None:
    for gpu in catalog:
        assert gpu.sources, gpu.name
        for source in gpu.sources:
            assert source.what.strip() and source.source.strip(), gpu.name
        assert gpu.notes.strip(), gpu.name


def test_the_catalog_cites_only_what_a_client_can_read() -> None:
    """Issue 22, defect 11: the resource cited 'shared/reference/hardware.md', a file no client can open. Every file
    path in its description, sources and notes is part of a URL; no 'reference note' stands in for a source."""
    import re

    from servers.core.resources import _describe

    doc = _raw_document()
    texts = [doc["description"], _describe(resources_dir() / "gpus.json")]
    for gpu in doc["gpus"]:
        texts += [gpu["notes"], *(f"{s['what']} {s['source']}" for s in gpu["sources"])]
    path = re.compile(r"(?<![\w/.:-])(?:[\w.-]+/)+[\w.-]+\.(?:md|py|json|csv|txt)\b")
    for text in texts:
        bare = re.sub(r"https?://\S+", "", text)
        assert not path.search(bare), text
        assert "reference note" not in text and "shared/" not in bare, text


def test_required_gpus_present(catalog: list[GpuSpec]) -> None:
    names = [gpu.name for gpu in catalog]
    assert len(names) == len(set(names))
    for name in REQUIRED:
        assert name in names
    assert gpu_names() == names


@pytest.mark.parametrize("name", sorted(HARDWARE_MD))
def test_figures_match_reference_note(name: str) -> None:
    gpu = find_gpu(name)
    expected = HARDWARE_MD[name]
    assert gpu.bf16_tflops == expected["bf16"]
    assert gpu.fp16_tflops == expected["bf16"]  # the note gives one BF16/FP16 column
    assert gpu.fp8_tflops == expected["fp8"]
    assert gpu.hbm_tb_s == expected["hbm_tb_s"]
    assert gpu.gpu_gpu_bidirectional_gb_s == expected["bidir"]
    if "hbm_gb" in expected:
        assert gpu.hbm_gb == expected["hbm_gb"]
    if "unidir" in expected:
        assert gpu.gpu_gpu_unidirectional_gb_s == expected["unidir"]


def test_reference_note_details() -> None:
    assert 180 <= find_gpu("B200").hbm_gb <= 192  # the note gives 180-192 GB
    assert find_gpu("B200").nvlink_generation == 5
    assert find_gpu("H100-SXM").nvlink_generation == 4
    assert find_gpu("A100-SXM-80GB").nvlink_generation == 3
    assert find_gpu("H800-SXM").gpu_gpu_unidirectional_gb_s <= 200
    assert "400" in find_gpu("H800-SXM").notes


def test_pcie_only_parts() -> None:
    for name in ("L40S", "H100-PCIe"):
        gpu = find_gpu(name)
        assert gpu.interconnect == "pcie"
        assert gpu.nvlink_generation is None
        assert gpu.form_factor == "PCIe"
    l40s = find_gpu("L40S")
    assert (l40s.bf16_tflops, l40s.fp8_tflops, l40s.hbm_gb, l40s.hbm_tb_s) == (362.05, 733, 48, 0.864)
    assert l40s.pcie_generation == 4 and l40s.memory_type == "GDDR6"
    assert find_gpu("H100-PCIe").pcie_generation == 5


def test_h20_figures() -> None:
    h20 = find_gpu("H20")
    assert (h20.bf16_tflops, h20.fp8_tflops, h20.hbm_gb, h20.hbm_tb_s) == (148, 296, 96, 4.0)
    assert h20.gpu_gpu_bidirectional_gb_s == 900


# --- sanity properties over every entry --------------------------------------------------------------------------


def test_sanity_properties(catalog: list[GpuSpec]) -> None:
    for gpu in catalog:
        if gpu.fp8_tflops is not None and gpu.bf16_tflops is not None:
            assert gpu.fp8_tflops >= gpu.bf16_tflops, gpu.name
        if gpu.bf16_tflops is not None and gpu.fp32_tflops is not None:
            assert gpu.bf16_tflops >= gpu.fp32_tflops, gpu.name
        if gpu.tf32_tflops is not None and gpu.bf16_tflops is not None:
            assert gpu.bf16_tflops >= gpu.tf32_tflops, gpu.name
        assert gpu.gpu_gpu_unidirectional_gb_s <= gpu.gpu_gpu_bidirectional_gb_s, gpu.name
        assert gpu.bf16_tflops is not None and gpu.fp32_tflops is not None, gpu.name
        assert (gpu.interconnect == "nvlink") == (gpu.nvlink_generation is not None), gpu.name
        assert gpu.pcie_lanes > 0 and gpu.pcie_generation >= 4, gpu.name
        # memory bandwidth is quoted in TB/s, not GB/s
        assert 0.1 < gpu.hbm_tb_s < 20, gpu.name


def test_aliases_are_lowercase(catalog: list[GpuSpec]) -> None:
    for gpu in catalog:
        for alias in gpu.aliases:
            assert alias == alias.strip().lower(), (gpu.name, alias)


# --- find_gpu ----------------------------------------------------------------------------------------------------


def test_find_every_name_and_alias(catalog: list[GpuSpec]) -> None:
    for gpu in catalog:
        assert find_gpu(gpu.name) is gpu
        for alias in gpu.aliases:
            assert find_gpu(alias) is gpu, alias


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM-80GB"),
        ("NVIDIA H200", "H200-SXM"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A800-SXM4-80GB", "A800-SXM-80GB"),
        ("NVIDIA B200", "B200"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_find_nvidia_smi_product_names(query: str, expected: str) -> None:
    assert find_gpu(query).name == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("h100", "H100-SXM"),
        ("H100", "H100-SXM"),
        ("h100-sxm", "H100-SXM"),
        ("H100_SXM", "H100-SXM"),
        ("h100 sxm5", "H100-SXM"),
        ("  H100   SXM  ", "H100-SXM"),
        ("h100_pcie", "H100-PCIe"),
        ("a100-sxm-80gb", "A100-SXM-80GB"),
        ("A100 SXM 80GB", "A100-SXM-80GB"),
        ("a100", "A100-SXM-80GB"),
        ("h800", "H800-SXM"),
        ("h200-sxm", "H200-SXM"),
        ("l40s", "L40S"),
        ("gb200", "GB200"),
        ("mi300x", "MI300X"),
        ("nvidia-h20", "H20"),
    ],
)
def test_find_normalises_case_and_separators(query: str, expected: str) -> None:
    assert find_gpu(query).name == expected


@pytest.mark.parametrize("query", ["TPU v5e", "NVIDIA A100 80GB PCIe", "h100x", "rtx 4090", "nvidia"])
def test_unknown_gpu_lists_accepted_names(query: str) -> None:
    with pytest.raises(InputError) as err:
        find_gpu(query)
    message = str(err.value)
    assert repr(query) in message
    for name in REQUIRED:
        assert name in message


def test_unknown_gpu_hint_stays_within_the_model_number() -> None:
    with pytest.raises(InputError, match="nearest catalogued entry is H100-SXM"):
        find_gpu("h100 sx")
    with pytest.raises(InputError) as err:
        find_gpu("NVIDIA A100 80GB PCIe")  # not catalogued; must not point at the H100 PCIe card
    assert "nearest catalogued entry is H100" not in str(err.value)


@pytest.mark.parametrize("query", ["", "   ", "-_-"])
def test_empty_gpu_name_is_an_input_error(query: str) -> None:
    with pytest.raises(InputError, match="H100-SXM"):
        find_gpu(query)


def test_input_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        find_gpu("no such gpu")


# --- peak_tflops -------------------------------------------------------------------------------------------------


def test_peak_tflops_values() -> None:
    h100 = find_gpu("h100")
    assert peak_tflops(h100, "bf16") == 989
    assert peak_tflops(h100, "fp8") == 1979
    assert peak_tflops(h100, "BF16") == 989
    assert peak_tflops(h100, "bfloat16") == 989
    assert peak_tflops(h100, "float16") == 989
    assert h100.peak_tflops("fp8") == 1979
    assert isinstance(peak_tflops(h100, "fp16"), float)


def test_peak_tflops_every_listed_dtype(catalog: list[GpuSpec]) -> None:
    for gpu in catalog:
        for dtype in gpu.available_dtypes():
            assert peak_tflops(gpu, dtype) > 0
        assert set(gpu.available_dtypes()) <= set(DTYPES)


def test_peak_tflops_a100_fp8_errors() -> None:
    a100 = find_gpu("NVIDIA A100-SXM4-80GB")
    with pytest.raises(InputError) as err:
        peak_tflops(a100, "fp8")
    message = str(err.value)
    assert "A100-SXM-80GB" in message and "fp8" in message
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        assert dtype in message


def test_peak_tflops_unknown_dtype() -> None:
    with pytest.raises(InputError, match="fp32, tf32, bf16, fp16, fp8"):
        peak_tflops(find_gpu("h100"), "int4")


# --- validation of malformed catalogs ----------------------------------------------------------------------------


def test_parser_rejects_duplicate_alias() -> None:
    doc = _raw_document()
    doc["gpus"][1]["aliases"] = [*doc["gpus"][1]["aliases"], "H100-SXM".lower()]
    with pytest.raises(ValidationError, match="already used"):
        parse_gpu_catalog(doc)


def test_parser_rejects_missing_sources_and_bad_links() -> None:
    doc = _raw_document()
    no_sources = copy.deepcopy(doc)
    no_sources["gpus"][0]["sources"] = []
    with pytest.raises(ValidationError):
        parse_gpu_catalog(no_sources)
    backwards = copy.deepcopy(doc)
    backwards["gpus"][0]["gpu_gpu_unidirectional_gb_s"] = 10_000
    with pytest.raises(ValidationError, match="unidirectional"):
        parse_gpu_catalog(backwards)
    unknown_field = copy.deepcopy(doc)
    unknown_field["gpus"][0]["bf16_tflops_sparse"] = 1
    with pytest.raises(ValidationError):
        parse_gpu_catalog(unknown_field)
