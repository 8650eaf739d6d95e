"""Tensor-parallel GEMM shapes of common models' layers, for the overlap cost model and benchmarks.

Plain domain code (no MCP imports). Shapes use the Flux convention of `servers.overlap.cost_model`: m, n, k are
global, and m is the token count of one micro-batch (seq_len * micro_batch), or for MoE experts the average
number of tokens one expert receives. Per layer:

- qkv (ag_gemm): k = hidden, n = (heads + 2 * kv_heads) * head_dim (fused Q, K and V projections)
- attn_out (gemm_rs): k = heads * head_dim, n = hidden
- mlp_up_gate (ag_gemm): k = hidden, n = 2 * intermediate (fused gate and up projections of a SwiGLU MLP)
- mlp_down (gemm_rs): k = intermediate, n = hidden

The configuration numbers are those of each model's published Hugging Face config.json (named in `source`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from pydantic import ConfigDict, Field

from servers.core.errors import InputError
from servers.core.models import Model
from servers.overlap.cost_model import split_problems

MAX_TOKENS = 2**24


class LayerShape(Model):
    """One tensor-parallel GEMM of a layer."""

    model_config = ConfigDict(frozen=True)

    layer: str = Field(description="qkv, attn_out, mlp_up_gate, mlp_down, or their expert / shared variants")
    pattern: Literal["ag_gemm", "gemm_rs", "gemm_ar"]
    m: int = Field(ge=1, description="rows: tokens (or average tokens per expert)")
    n: int = Field(ge=1, description="global output columns")
    k: int = Field(ge=1, description="global inner dimension")
    note: str = Field(description="how the numbers follow from the configuration")


class ShapePreset(Model):
    """A model's tensor-parallel GEMM shapes at one token count."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="the key get_preset accepts")
    model: str
    source: str = Field(description="where the configuration numbers come from")
    config: dict[str, int] = Field(description="the configuration values the shapes are computed from")
    tokens: int = Field(ge=1, description="seq_len * micro_batch")
    layers: list[LayerShape]

    def divisible_by(self, world_size: int) -> list[str]:
        """The layers that do not split evenly across `world_size` tensor-parallel ranks, each with the reason.

        Checks the GEMM dimensions the pattern shards (see cost_model.split_problems) and, for attention
        layers, whether the query heads divide evenly and whether KV heads must be replicated.
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= 1024:
            raise InputError(f"world_size must be an integer from 1 to 1024; got {world_size!r}")
        found: list[str] = []
        heads = self.config.get("num_attention_heads")
        kv_heads = self.config.get("num_key_value_heads")
        for layer in self.layers:
            reasons = split_problems(layer.pattern, layer.m, layer.n, layer.k, world_size)
            if layer.layer in ("qkv", "attn_out") and heads and heads % world_size:
                reasons.append(f"{heads} query heads do not divide across {world_size} ranks")
            if layer.layer == "qkv" and kv_heads and world_size > 1 and kv_heads % world_size:
                if world_size % kv_heads == 0:
                    reasons.append(
                        f"{kv_heads} KV heads are fewer than {world_size} ranks: frameworks replicate them, so the "
                        "per-rank N is larger than N / world_size"
                    )
                else:
                    reasons.append(f"{kv_heads} KV heads neither divide nor replicate evenly over {world_size} ranks")
            if reasons:
                found.append(f"{layer.layer}: " + "; ".join(reasons))
        return found


def _dense_layers(
    tokens: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int
) -> list[LayerShape]:
    return [
        LayerShape(
            layer="qkv",
            pattern="ag_gemm",
            m=tokens,
            n=(heads + 2 * kv_heads) * head_dim,
            k=hidden,
            note=f"n = ({heads} + 2 x {kv_heads}) heads x {head_dim}; k = hidden",
        ),
        LayerShape(
            layer="attn_out",
            pattern="gemm_rs",
            m=tokens,
            n=hidden,
            k=heads * head_dim,
            note=f"k = {heads} heads x {head_dim}; n = hidden",
        ),
        LayerShape(
            layer="mlp_up_gate",
            pattern="ag_gemm",
            m=tokens,
            n=2 * intermediate,
            k=hidden,
            note=f"n = 2 x intermediate {intermediate} (gate and up fused); k = hidden",
        ),
        LayerShape(
            layer="mlp_down",
            pattern="gemm_rs",
            m=tokens,
            n=hidden,
            k=intermediate,
            note=f"k = intermediate {intermediate}; n = hidden",
        ),
    ]


def _mlp_pair(prefix: str, m: int, hidden: int, intermediate: int, how_m: str) -> list[LayerShape]:
    return [
        LayerShape(
            layer=f"{prefix}_up_gate",
            pattern="ag_gemm",
            m=m,
            n=2 * intermediate,
            k=hidden,
            note=f"m = {how_m}; n = 2 x {intermediate} (gate and up fused); k = hidden",
        ),
        LayerShape(
            layer=f"{prefix}_down",
            pattern="gemm_rs",
            m=m,
            n=hidden,
            k=intermediate,
            note=f"m = {how_m}; k = {intermediate}; n = hidden",
        ),
    ]


def _dense(name: str, model: str, source: str, cfg: dict[str, int], tokens: int) -> ShapePreset:
    return ShapePreset(
        name=name,
        model=model,
        source=source,
        config=cfg,
        tokens=tokens,
        layers=_dense_layers(
            tokens,
            cfg["hidden_size"],
            cfg["intermediate_size"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
            cfg["head_dim"],
        ),
    )


def _mixtral(tokens: int) -> ShapePreset:
    cfg = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    per_expert = math.ceil(tokens * cfg["num_experts_per_tok"] / cfg["num_local_experts"])
    how = f"tokens x top-{cfg['num_experts_per_tok']} / {cfg['num_local_experts']} experts, on average (rounded up)"
    return ShapePreset(
        name="mixtral-8x7b-experts",
        model="Mixtral 8x7B (expert MLPs)",
        source=(
            "mistralai/Mixtral-8x7B-v0.1 config.json (hidden_size 4096, intermediate_size 14336, "
            "num_local_experts 8, num_experts_per_tok 2). Only the expert MLPs are listed: its attention "
            "(32 heads, 8 KV heads, head_dim 128) has the same shapes as the llama3-8b preset. Each expert sees "
            "tokens x 2 / 8 rows on average with balanced routing; real routing is uneven."
        ),
        config=cfg,
        tokens=tokens,
        layers=_mlp_pair("expert", per_expert, cfg["hidden_size"], cfg["intermediate_size"], how),
    )


def _deepseek_v3(tokens: int) -> ShapePreset:
    cfg = {
        "hidden_size": 7168,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
    }
    per_expert = math.ceil(tokens * cfg["num_experts_per_tok"] / cfg["n_routed_experts"])
    how = f"tokens x top-{cfg['num_experts_per_tok']} / {cfg['n_routed_experts']} experts, on average (rounded up)"
    shared_intermediate = cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
    return ShapePreset(
        name="deepseek-v3-experts",
        model="DeepSeek-V3 (routed and shared expert MLPs)",
        source=(
            "deepseek-ai/DeepSeek-V3 config.json (hidden_size 7168, moe_intermediate_size 2048, n_routed_experts "
            "256, num_experts_per_tok 8, n_shared_experts 1) and the DeepSeek-V3 technical report. Attention is "
            "multi-head latent attention, whose low-rank down/up projections do not map onto the qkv / attn_out "
            "pattern, so only the MoE MLPs are given (the first three dense layers are also left out). Routed "
            "experts see tokens x 8 / 256 rows on average with balanced routing; in practice experts are usually "
            "spread by expert parallelism rather than split by TP."
        ),
        config=cfg,
        tokens=tokens,
        layers=[
            *_mlp_pair("expert", per_expert, cfg["hidden_size"], cfg["moe_intermediate_size"], how),
            *_mlp_pair("shared", tokens, cfg["hidden_size"], shared_intermediate, "every token"),
        ],
    )


def _builders() -> dict[str, Callable[[int], ShapePreset]]:
    return {
        "llama3-8b": lambda t: _dense(
            "llama3-8b",
            "Llama 3 8B",
            "meta-llama/Meta-Llama-3-8B config.json",
            {
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
            },
            t,
        ),
        "llama3-70b": lambda t: _dense(
            "llama3-70b",
            "Llama 3 70B",
            "meta-llama/Meta-Llama-3-70B config.json (head_dim = hidden / heads = 128)",
            {
                "hidden_size": 8192,
                "intermediate_size": 28672,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "head_dim": 128,
            },
            t,
        ),
        "llama3.1-405b": lambda t: _dense(
            "llama3.1-405b",
            "Llama 3.1 405B",
            "meta-llama/Llama-3.1-405B config.json and the Llama 3 paper (arXiv 2407.21783), head_dim 128",
            {
                "hidden_size": 16384,
                "intermediate_size": 53248,
                "num_attention_heads": 128,
                "num_key_value_heads": 8,
                "head_dim": 128,
            },
            t,
        ),
        "qwen2.5-72b": lambda t: _dense(
            "qwen2.5-72b",
            "Qwen2.5 72B",
            "Qwen/Qwen2.5-72B config.json (head_dim = hidden / heads = 128; the QKV bias does not change shapes)",
            {
                "hidden_size": 8192,
                "intermediate_size": 29568,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "head_dim": 128,
            },
            t,
        ),
        "mixtral-8x7b-experts": _mixtral,
        "deepseek-v3-experts": _deepseek_v3,
    }


PRESET_NAMES: tuple[str, ...] = tuple(_builders())


def _tokens(seq_len: int, micro_batch: int) -> int:
    for label, value in (("seq_len", seq_len), ("micro_batch", micro_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{label} must be a positive integer; got {value!r}")
    tokens = seq_len * micro_batch
    if tokens > MAX_TOKENS:
        raise InputError(f"seq_len * micro_batch must be at most {MAX_TOKENS}; got {tokens}")
    return tokens


def get_preset(name: str, seq_len: int = 4096, micro_batch: int = 1) -> ShapePreset:
    """The preset `name` at seq_len * micro_batch tokens; InputError listing the names when it is unknown."""
    tokens = _tokens(seq_len, micro_batch)
    key = name.strip().lower().replace("_", "-").replace(" ", "-") if isinstance(name, str) else ""
    builder = _builders().get(key)
    if builder is None:
        raise InputError(f"unknown preset {name!r}; accepted: {', '.join(PRESET_NAMES)}")
    return builder(tokens)


def list_presets(seq_len: int = 4096, micro_batch: int = 1) -> list[ShapePreset]:
    """Every preset at seq_len * micro_batch tokens."""
    return [get_preset(name, seq_len, micro_batch) for name in PRESET_NAMES]
