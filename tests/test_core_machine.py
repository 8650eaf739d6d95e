"""The one dtype vocabulary (servers/core/dtypes.py) and the machine's memory reading (servers/core/machine.py)."""

from pathlib import Path

import pytest

from servers.core import dtypes, machine
from servers.core.gpus import DTYPES as CATALOG_DTYPES


def test_one_dtype_list_with_sizes_and_torch_types() -> None:
    import torch

    assert dtypes.DTYPES == ("fp32", "tf32", "bf16", "fp16", "fp8") == CATALOG_DTYPES
    tables = (dtypes.ELEMENT_BYTES, dtypes.GEMM_OUTPUT_BYTES, dtypes.NCCL_TYPE_NAMES)
    assert all(set(table) == set(dtypes.DTYPES) for table in tables)
    for name in dtypes.DTYPES:
        stored = dtypes.torch_dtype(name)
        assert stored.itemsize == dtypes.ELEMENT_BYTES[name]
        assert dtypes.gemm_output_torch_dtype(name).itemsize == dtypes.GEMM_OUTPUT_BYTES[name]
        assert dtypes.NCCL_TYPE_BYTES[dtypes.NCCL_TYPE_NAMES[name]] == dtypes.ELEMENT_BYTES[name]
    assert dtypes.torch_dtype("tf32") is torch.float32  # TF32 is a math mode on fp32 data
    assert dtypes.gemm_output_torch_dtype("fp8") is torch.bfloat16  # torch._scaled_mm writes bf16


def test_meminfo_is_read_once_in_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:       16318412 kB\nMemAvailable:    9036540 kB\nHugePages_Total:       0\nodd line\n")
    monkeypatch.setattr(machine, "MEMINFO", fake)
    assert machine.meminfo() == {"MemTotal": 16318412 * 1024, "MemAvailable": 9036540 * 1024, "HugePages_Total": 0}
    assert machine.host_memory_available() == 9036540 * 1024
    monkeypatch.setattr(machine, "MEMINFO", tmp_path / "missing")
    assert machine.meminfo() == {} and machine.host_memory_available() is None
