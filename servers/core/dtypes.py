"""One dtype vocabulary for every tool (DESIGN.md "Tool vocabulary"): the names, their element sizes, their torch
types, and the names nccl-tests prints for them.

tf32 is not a storage type: it is fp32 data multiplied with TF32 tensor-core math (10-bit mantissa inputs, fp32
accumulation), so it stores and moves 4 bytes. fp8 is e4m3 (torch.float8_e4m3fn); an fp8 GEMM (torch._scaled_mm)
writes bf16. No torch at import: `torch_dtype` imports it when called.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
DTYPES: tuple[Dtype, ...] = get_args(Dtype)
DTYPE_NOTE = "tf32: sm_80+; fp8: e4m3, bf16 out, sm_89+"
DtypeArg = Annotated[Dtype, Field(description=DTYPE_NOTE)]  # a tool argument or model field of the one list

# Bytes per element as stored (GEMM inputs, all-gathered activations, collective buffers).
ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# Bytes per element of a GEMM's output (and so of the partials gemm_rs / gemm_ar communicate): fp8 writes bf16.
GEMM_OUTPUT_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}

# The name nccl-tests prints in its `type` column for each of ours (tf32 data is fp32 on the wire).
NCCL_TYPE_NAMES: dict[str, str] = {
    "fp32": "float",
    "tf32": "float",
    "bf16": "bfloat16",
    "fp16": "half",
    "fp8": "f8e4m3",
}
# Element sizes of the type names nccl-tests prints (and their common spellings), for reading its tables.
NCCL_TYPE_BYTES: dict[str, int] = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "fp8": 1,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp16": 2,
    "int32": 4,
    "int": 4,
    "uint32": 4,
    "float": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
    "float64": 8,
}

_TORCH_NAMES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}


def torch_dtype(dtype: str) -> Any:
    """The torch storage type of `dtype` (tf32 -> torch.float32, fp8 -> torch.float8_e4m3fn)."""
    import torch

    return getattr(torch, _TORCH_NAMES[dtype])


def gemm_output_torch_dtype(dtype: str) -> Any:
    """The torch type a GEMM of `dtype` inputs writes: bf16 for fp8 (torch._scaled_mm), else the input's type."""
    return torch_dtype("bf16" if dtype == "fp8" else dtype)


def set_matmul_math(dtype: str) -> None:
    """Make this process's fp32 matmuls match `dtype`: TF32 tensor-core math for tf32, full fp32 otherwise (torch's
    default). Called in the worker or rank before its GEMMs."""
    import torch

    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
