"""Schema-driven fuzz of every tool of the suite, through an in-process MCP client.

For each tool, arguments are generated from its published inputSchema with a fixed seed: valid values (inside the
bounds, from the enums, matching the patterns, with files, pasted outputs and ids the suite knows), boundary values
(at and just past every bound, empty and full strings and lists, huge and tiny numbers) and invalid ones (wrong JSON
types, unknown fields at the top and nested, missing required fields, JSON text for objects). Every answer is
checked:

- crash: the call raised, hung, or the SDK answered with its generic "Error executing tool X" (an exception the
  tool did not turn into a readable error, or a result its own output schema refuses);
- internal: an is_error result saying "internal error" (the tool caught a bug of its own);
- schema: a successful result whose structured content breaks the tool's outputSchema;
- unreadable: an error with a traceback or pydantic's raw dump in it.

Tools that start jobs get wait_s 0 and every job they start is cancelled at once. Arguments travel as JSON through
the client, so NaN and infinities arrive as null (the stdio tests send those).

    python benchmarks/fuzz.py --cases 300 --seed 0          # every tool, 300 cases each
    python benchmarks/fuzz.py --cases 50 --tool fit_scaling_law

tests/test_fuzz.py runs the same fuzz at a small size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from mcp import Client  # noqa: E402
from mcp.types import Tool  # noqa: E402

from servers.core.mcp_layer import App  # noqa: E402
from servers.core.settings import Settings  # noqa: E402

KINDS = ("crash", "internal", "schema", "unreadable")
MAKERS = ("plan_training_job", "fit_scaling_law")
# Arguments of which a tool takes exactly one (DESIGN.md: text, path, job_id; points, path, job_id; ...)
EXCLUSIVE = [
    ("points", "path", "job_id"),
    ("text", "path", "job_id"),
    ("nvidia_smi_text", "nvidia_smi_path", "live_nvml"),
    ("recipe", "script"),
    ("preset", "layers"),
    ("compute", "at"),
]
CALL_TIMEOUT_S = 120.0
# Arguments that make a call wait or work for long: valid values are capped (values outside the schema still go).
CAPS: dict[str, float] = {
    "wait_s": 0,
    "http_timeout_s": 1,
    "bootstrap": 20,
    "iters": 3,
    "warmup": 1,
    "width": 480,
    "height": 360,
    "max_wall_s": 30,
    "rank_timeout_s": 5,
}
WRONG_TYPES: list[Any] = [None, True, False, 0, -1, 1.5, "x", "", "5", [], {}, [1], {"a": 1}]
WEIRD_TEXT = [
    "",
    " ",
    "\x00",
    "a\nb",
    "é",
    "日本語",
    "🦜",
    "\u202e",
    "../",
    "%s%n",
    "null",
    "true",
    "0",
    "-1",
    "1e309",
    "[]",
    "{}",
    '{"a": 1}',
]
TEXT_FIXTURES = [
    "diagnostics/nccl/all_reduce_perf.8xH100.pass.txt",
    "diagnostics/nccl/all_reduce_perf.8xH100.truncated.txt",
    "diagnostics/kmsg/dmesg-T.log",
    "diagnostics/kmsg/journald.log",
    "diagnostics/dcgm/dcgmi-diag-r3.dcgm4.8xH100.json",
    "diagnostics/exporter/dcgm-exporter.4xH100.synthetic.prom",
    "diagnostics/smi/nvidia-smi-q-x.2xA100.525.synthetic.xml",
]


# ---- values from a schema ------------------------------------------------------------------------------------


def alternatives(schema: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    if "$ref" in schema:
        return alternatives(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return [alt for sub in schema[key] for alt in alternatives(sub, defs)]
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return alternatives(schema["allOf"][0], defs)
    return [schema]


def json_types(schema: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    kinds = set()
    for alt in alternatives(schema, defs):
        if "enum" in alt or "const" in alt:
            kinds |= {type(v).__name__ for v in alt.get("enum", [alt.get("const")])}
        elif "type" in alt:
            kinds.add(alt["type"])
        else:
            kinds.add("any")
    return kinds


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def accepts_kind(kinds: set[str], value: Any) -> bool:
    kind = kind_of(value)
    if "any" in kinds or kind in kinds:
        return True
    names = {"null": "NoneType", "boolean": "bool", "integer": "int", "number": "float", "string": "str"}
    if names.get(kind) in kinds:
        return True
    return kind == "integer" and "number" in kinds


@dataclass
class Pools:
    """Values the fuzz draws strings from, by argument name (files in the root, pasted outputs, ids seen)."""

    root: Path
    by_name: dict[str, list[Any]] = field(default_factory=dict)
    ids: dict[str, list[str]] = field(default_factory=lambda: {"job_id": [], "fit_id": [], "plan_token": []})

    def learn(self, content: Any) -> None:
        """Remember the ids a result names, so that later calls can use real ones."""
        if isinstance(content, dict):
            for key, value in content.items():
                if key in self.ids and isinstance(value, str) and value not in self.ids[key]:
                    self.ids[key].append(value)
                else:
                    self.learn(value)
        elif isinstance(content, list):
            for item in content:
                self.learn(item)


def make_pools(root: Path) -> Pools:
    root.mkdir(parents=True, exist_ok=True)
    fixtures = REPO_ROOT / "tests" / "fixtures"
    texts = [s for s in WEIRD_TEXT]
    for name in TEXT_FIXTURES:
        source = fixtures / name
        if source.is_file():
            texts.append(source.read_text(errors="replace")[:20000])
            shutil.copy(source, root / source.name)
    rng = random.Random(7)
    curve = "\n".join(
        f"{10 * 1.5**i:.6g},{0.6 - 0.5 * (10 * 1.5**i) ** -0.4 + rng.gauss(0, 0.005):.6g}" for i in range(12)
    )
    (root / "curve.csv").write_text("compute,value\n" + curve + "\n")
    grid = [(n, d) for n in (1e7, 3e7, 1e8, 3e8) for d in (1e9, 3e9, 1e10)]
    chinchilla = [(n, d, 1.7 + 400 / n**0.34 + 410 / d**0.28) for n, d in grid]
    (root / "loss.jsonl").write_text(
        "".join(
            json.dumps({"params": n, "tokens": d, "loss": 1.7 + 400 / n**0.34 + 410 / d**0.28}) + "\n" for n, d in grid
        )
    )
    (root / "empty.csv").write_text("")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (root / "train.py").write_text("print('hello')\n")
    (root / "sub").mkdir(exist_ok=True)
    for link, target in (("loop", "loop"), ("outside", "/etc")):
        if not (root / link).is_symlink():
            (root / link).symlink_to(target)
    paths = [str(p) for p in sorted(root.iterdir()) if p.name not in ("loop", "outside")] + [
        "curve.csv",
        "sub",
        "missing.csv",
        "../outside.csv",
        "/etc/passwd",
        "a" * 300,
        "loop/x",
        "outside/passwd",
        "~",
        "~nosuchuser/x",
        "",
        ".",
        "sub/../curve.csv",
    ]
    closed = _closed_port()
    urls = [
        f"http://127.0.0.1:{closed}/metrics",
        "http://127.0.0.1:99999/metrics",
        "http://127.0.0.1:0/",
        "http://[::1]:1/metrics",
        "https://127.0.0.1:1/",
        "http://",
        "http://user@127.0.0.1:1/",
        "ftp://127.0.0.1/x",
        "not a url",
    ]
    return Pools(
        root=root,
        by_name={
            "path": paths,
            "script": paths,
            "workdir": paths,
            "text": texts,
            "nvidia_smi_text": texts,
            "kernel_log_text": texts,
            "dcgm_text": texts,
            "nccl_tests_text": texts,
            "url": urls,
            "gpu": ["H100-SXM", "A100-SXM-80GB", "h100", "B200", "L40S", "no-such-gpu", ""],
            "recipe": ["tiny-gpt", "tiny-grpo", "no-such-recipe"],
            "preset": ["llama3-8b", "llama3-70b", "mixtral-8x7b-experts", "nope"],
            "unit": ["flops", "gpu_hours", "pflop_days", "GPU-hours", "nope"],
            "compute_unit": ["flops", "gpu_hours", "nope"],
            "process": ["main", "supervisor", "rank0", "rank1", "nope"],
            "parameters": [
                {"A": 0.6, "B": 0.5, "D": 1.0},
                {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.1},
                {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28},
                {"A": 0.6},
            ],
            "points": [
                [{"compute": float(c), "value": float(v)} for c, v in (row.split(",") for row in curve.splitlines())],
                [{"params": n, "tokens": d, "loss": loss} for n, d, loss in chinchilla],
                [{"compute": 1.0, "value": 0.5}] * 3,
                [{"compute": 100.0}, {"compute": 1e6}],  # points to evaluate a law at
                [{"params": 1e8, "tokens": 2e9}],
            ],
        },
    )


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Generator:
    """Values for a schema: valid ones, ones at the boundaries, wrong ones."""

    def __init__(self, rng: random.Random, defs: dict[str, Any], pools: Pools, *, max_len: int, max_items: int):
        self.rng = rng
        self.defs = defs
        self.pools = pools
        self.max_len = max_len
        self.max_items = max_items
        self.optional_p = 0.3  # how often an optional field is given (0: only required ones and one of each group)

    # valid
    def valid(self, schema: dict[str, Any], name: str | None = None, depth: int = 0) -> Any:
        alts = alternatives(schema, self.defs)
        non_null = [a for a in alts if a.get("type") != "null"]
        if not non_null or (len(alts) > len(non_null) and self.rng.random() < 0.1):
            return None
        return self._valid_one(self.rng.choice(non_null), name, depth)

    def _valid_one(self, alt: dict[str, Any], name: str | None, depth: int) -> Any:
        rng = self.rng
        if "enum" in alt:
            return rng.choice(alt["enum"])
        if "const" in alt:
            return alt["const"]
        kind = alt.get("type")
        if kind == "boolean":
            return rng.random() < 0.5
        if kind in ("integer", "number"):
            return self._number(alt, kind == "integer")
        if kind == "string":
            return self._string(alt, name)
        if kind == "array":
            fitting = [v for v in self.pools.by_name.get(name or "", []) if self._fits_items(v, alt)]
            if fitting and rng.random() < 0.7:
                return rng.choice(fitting)
            if "prefixItems" in alt:
                return [self.valid(item, name, depth + 1) for item in alt["prefixItems"]]
            low = alt.get("minItems", 0)
            high = min(alt.get("maxItems", 4), max(low, 4))
            return [self.valid(alt.get("items", {}), name, depth + 1) for _ in range(rng.randint(low, high))]
        if kind == "object" or "properties" in alt:
            pooled = [v for v in self.pools.by_name.get(name or "", []) if isinstance(v, dict)]
            if pooled and rng.random() < 0.7:
                return dict(rng.choice(pooled))
            return self._object(alt, depth)
        return rng.choice([0, 1.5, "x", True, None, [], {}])

    def _fits_items(self, value: Any, alt: dict[str, Any]) -> bool:
        """Whether a pooled list's objects have only fields the array's items have."""
        if not isinstance(value, list):
            return False
        fields = {f for item in alternatives(alt.get("items", {}), self.defs) for f in item.get("properties", {})}
        return all(isinstance(v, dict) and set(v) <= fields for v in value)

    def _number(self, alt: dict[str, Any], integer: bool) -> float | int:
        rng = self.rng
        low = alt.get("minimum", alt.get("exclusiveMinimum"))
        high = alt.get("maximum", alt.get("exclusiveMaximum"))
        low = -1000 if low is None else low
        high = max(low, (low + 1000) if high is None else high)
        if "exclusiveMinimum" in alt and "minimum" not in alt:
            low = low + (1 if integer else max(abs(low) * 1e-9, 1e-12))
        if "exclusiveMaximum" in alt and "maximum" not in alt:
            high = high - (1 if integer else max(abs(high) * 1e-9, 1e-12))
        pick = rng.random()
        if pick < 0.3:
            value = low
        elif pick < 0.45:
            value = high
        elif pick < 0.75 or low <= 0 or high / max(low, 1e-300) < 100:
            value = rng.uniform(low, min(high, low + 100))
        else:  # log-uniform across a wide range
            value = math.exp(rng.uniform(math.log(max(low, 1e-300)), math.log(high)))
        value = min(max(value, low), high)
        return round(value) if integer else value

    def _string(self, alt: dict[str, Any], name: str | None) -> str:
        rng = self.rng
        high = alt.get("maxLength", 64)
        low = alt.get("minLength", 0)
        pattern = alt.get("pattern")
        name = name or ""
        ids = self.pools.ids.get(name) or self.pools.ids.get(name.removesuffix("s"), [])  # fit_ids: fit ids
        pool = list(self.pools.by_name.get(name, [])) + list(ids)
        if pattern:
            candidates = [p for p in pool if isinstance(p, str) and re.search(pattern, p)]
            for _ in range(30):
                guess = self._from_charset(pattern, rng.randint(1, 16))
                if re.search(pattern, guess) and low <= len(guess) <= high:
                    candidates.append(guess)
                    break
            if candidates:
                return rng.choice(candidates)
        if pool and rng.random() < 0.75:
            return str(rng.choice(pool))[: min(high, self.max_len)]
        length = rng.randint(low, max(low, min(high, 24)))
        return "".join(rng.choice("abcxyz019_-. éß日🦜") for _ in range(length))

    def _from_charset(self, pattern: str, length: int) -> str:
        rng = self.rng
        if pattern.startswith("^fit-"):
            stamp = f"{rng.randint(20200101, 20301231)}-{rng.randint(0, 235959):06d}"
            return f"fit-{stamp}-{rng.getrandbits(24):06x}"
        if pattern.startswith("^https?://"):
            return rng.choice(self.pools.by_name["url"])
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_-" + ("ABCXYZ." if "A-Z" in pattern else "")
        return "".join(rng.choice(alphabet) for _ in range(length))

    def _object(self, alt: dict[str, Any], depth: int) -> dict[str, Any]:
        props = alt.get("properties", {})
        required = set(alt.get("required", []))
        value = {}
        for key, sub in props.items():
            if key in required or (depth < 4 and self.rng.random() < self.optional_p):
                value[key] = self.valid(sub, key, depth + 1)
        decided: set[str] = set()
        for group in EXCLUSIVE:  # "exactly one of": keep one, given
            members = [key for key in group if key in props]
            if len(members) > 1 and not decided & set(members):
                decided |= set(members)
                keep = self.rng.choice(members)
                for key in members:
                    value.pop(key, None)
                value[keep] = None
                for _ in range(5):
                    value[keep] = self.valid(props[keep], keep, depth + 1)
                    if value[keep] is not None:
                        break
        extra = alt.get("additionalProperties")
        if isinstance(extra, dict) and not props:
            for _ in range(self.rng.randint(0, 3)):
                value[self.rng.choice(["A", "key", "LD_PRELOAD", "PATH", "x" * 200, "é"])] = self.valid(extra)
        return value

    # boundary
    def boundary(self, schema: dict[str, Any], name: str | None = None) -> Any:
        rng = self.rng
        alt = rng.choice(alternatives(schema, self.defs))
        kind = alt.get("type")
        if "enum" in alt:
            choice = rng.choice(alt["enum"])
            return rng.choice([str(choice).upper(), f" {choice}", str(choice)[:-1], choice])
        if kind in ("integer", "number"):
            edges: list[Any] = [0, -1, 1, 10**30, -(10**30), 2**63, -(2**63), 2**53 + 1]
            if kind == "number":
                edges += [1e308, -1e308, 5e-324, 1e-300, -0.0, 0.1]
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if key in alt:
                    bound = alt[key]
                    step = 1 if kind == "integer" else max(abs(bound) * 1e-12, 1e-300)
                    edges += [bound, bound - step, bound + step]
            return rng.choice(edges)
        if kind == "string":
            high = alt.get("maxLength")
            options = ["", " ", "\x00", "x" * min(self.max_len, 10_000), "é" * 300]
            if high is not None:
                options += ["y" * min(high, self.max_len), "z" * min(high + 1, self.max_len + 1)]
            if name in self.pools.by_name:
                options += self.pools.by_name[name]
            return rng.choice(options)
        if kind == "array":
            high = alt.get("maxItems", 8)
            item = alt.get("items", {})
            count = rng.choice([0, 1, min(high, self.max_items), min(high + 1, self.max_items + 1)])
            one = self.valid(item, name)
            return [one if rng.random() < 0.5 else self.valid(item, name) for _ in range(count)]
        if kind == "object" or "properties" in alt:
            full = {key: self.valid(sub, key) for key, sub in alt.get("properties", {}).items()}
            return rng.choice([{}, full])
        return rng.choice(WRONG_TYPES)

    # invalid
    def wrong_type(self, schema: dict[str, Any]) -> Any:
        kinds = json_types(schema, self.defs)
        options = [v for v in WRONG_TYPES if not accepts_kind(kinds, v)]
        return self.rng.choice(options or WRONG_TYPES)


def _cap(value: Any, schema: dict[str, Any], defs: dict[str, Any], key: str | None = None) -> Any:
    """Valid values of the arguments in CAPS, capped; everything else (values outside the schema too) as it is."""
    if isinstance(value, dict):
        props: dict[str, Any] = {}
        for alt in alternatives(schema, defs):
            props.update(alt.get("properties", {}))
        return {k: _cap(v, props.get(k, {}), defs, k) for k, v in value.items()}
    if isinstance(value, list):
        items = next((a["items"] for a in alternatives(schema, defs) if isinstance(a.get("items"), dict)), {})
        return [_cap(v, items, defs, key) for v in value]
    if key not in CAPS or isinstance(value, bool) or not isinstance(value, int | float) or value <= CAPS[key]:
        return value
    for alt in alternatives(schema, defs):
        if alt.get("type") not in ("integer", "number"):
            continue
        low, high = alt.get("minimum", -math.inf), alt.get("maximum", math.inf)
        if "exclusiveMinimum" in alt:
            low = alt["exclusiveMinimum"] + (1 if alt["type"] == "integer" else 0.01)
        if low <= value <= high:
            capped = max(CAPS[key], low)
            return round(capped) if alt["type"] == "integer" else capped
    return value


def mutate(gen: Generator, value: Any, schema: dict[str, Any], name: str, mode: str) -> Any:
    """`value` with one place in it replaced: by a boundary value, a wrong type, or an unknown field."""
    rng = gen.rng
    alts = alternatives(schema, gen.defs)
    objects = [a for a in alts if "properties" in a]
    arrays = [a for a in alts if a.get("type") == "array" and isinstance(a.get("items"), dict)]
    if isinstance(value, dict) and objects and value and rng.random() < 0.6:
        key = rng.choice(list(value))
        sub = objects[0]["properties"].get(key, {})
        return {**value, key: mutate(gen, value[key], sub, key, mode)}
    if isinstance(value, list) and arrays and value and rng.random() < 0.6:
        i = rng.randrange(len(value))
        return [*value[:i], mutate(gen, value[i], arrays[0]["items"], name, mode), *value[i + 1 :]]
    if mode == "unknown" and isinstance(value, dict) and objects:
        return {**value, rng.choice(["extra", "no_such_field", "Model", "__proto__"]): 1}
    if mode == "boundary":
        return gen.boundary(schema, name)
    return gen.wrong_type(schema)


def cases_for(tool: Tool, seed: int, count: int, pools: Pools, *, max_len: int, max_items: int) -> list[dict[str, Any]]:
    """`count` argument sets for one tool, in turn: minimal valid (required fields only), at a boundary, valid,
    wrong-typed, structurally wrong (unknown or missing fields, JSON text for objects)."""
    rng = random.Random(seed * 1_000_003 + zlib.crc32(tool.name.encode()))
    schema = tool.input_schema
    defs = schema.get("$defs", {})
    gen = Generator(rng, defs, pools, max_len=max_len, max_items=max_items)
    props = schema.get("properties", {})
    required = schema.get("required", [])
    cases = []
    for i in range(count):
        mode = ("minimal", "boundary", "valid", "wrong", "structure")[i % 5]
        gen.optional_p = 0.0 if mode == "minimal" else 0.3
        base = _cap(gen.valid(schema), schema, defs)
        if "wait_s" in props:  # never wait for a job started here (a mutation below may still break wait_s)
            base["wait_s"] = 0
        mode = "valid" if mode == "minimal" else mode
        if mode == "valid" or not props:
            args = base
            if not props and mode != "valid":
                args = {**base, "unexpected": rng.choice(WRONG_TYPES)}
        elif mode in ("boundary", "wrong"):
            key = rng.choice(list(props))
            args = {**base, key: mutate(gen, base.get(key, gen.valid(props[key], key)), props[key], key, mode)}
            if mode == "boundary":
                args = _cap(args, schema, defs)
        else:
            choice = rng.random()
            if choice < 0.3:
                args = {**base, rng.choice(["extra", "waitS", "job-id", "Wait_s"]): rng.choice(WRONG_TYPES)}
            elif choice < 0.55 and required:
                args = {k: v for k, v in base.items() if k != rng.choice(required)}
            elif choice < 0.8:
                key = rng.choice(list(props))
                args = {**base, key: mutate(gen, base.get(key, {}), props[key], key, "unknown")}
            else:  # objects and lists as JSON text, as Claude Desktop sends them
                args = {k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in base.items()}
        cases.append(args)
    return cases


# ---- running and checking ------------------------------------------------------------------------------------


@dataclass
class Finding:
    tool: str
    kind: str
    arguments: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.tool}({self.arguments}): {self.detail}"


@dataclass
class ToolReport:
    tool: str
    calls: int = 0
    ok: int = 0
    refused: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)


def short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def starts_jobs(tool: Tool) -> bool:
    return "wait_s" in tool.input_schema.get("properties", {})


async def check_call(client: Client, tool: Tool, args: dict[str, Any], validator: Any) -> tuple[str, str, Any]:
    """('ok' | 'refused' | one of KINDS, detail, structured content) for one call."""
    try:
        with anyio.fail_after(CALL_TIMEOUT_S):
            result = await client.call_tool(tool.name, args)
    except TimeoutError:
        return "crash", f"no answer within {CALL_TIMEOUT_S:.0f} s", None
    except Exception as exc:  # the client refuses a result that breaks the output schema, or a protocol error came
        text = f"{type(exc).__name__}: {exc}"
        return ("schema" if "structured content" in text else "crash"), text[:500], None
    text = " ".join(block.text for block in result.content if block.type == "text")
    if result.is_error:
        if "internal error" in text.lower():
            return "internal", text[:500], None
        if text.strip() == f"Error executing tool {tool.name}" or not text.strip():
            return "crash", text[:500] or "an empty error", None
        if "Traceback" in text or "errors.pydantic.dev" in text or "validation error for" in text:
            return "unreadable", text[:500], None
        return "refused", text, None
    if not text.strip():
        return "schema", "no text summary", None
    if validator is not None:
        errors = sorted(validator.iter_errors(result.structured_content), key=lambda e: list(e.path))
        if errors:
            return "schema", f"{list(errors[0].path)}: {errors[0].message[:300]}", None
    return "ok", text, result.structured_content


async def cancel_active(client: Client) -> None:
    page = await client.call_tool("list_jobs", {"limit": 200})
    for job in (page.structured_content or {}).get("jobs", []):
        if not job.get("finished", job.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED", "LOST")):
            await client.call_tool("cancel_job", {"job_id": job["job_id"]})


async def fuzz(
    client: Client,
    pools: Pools,
    *,
    cases: int,
    job_cases: int,
    seed: int,
    tools: Sequence[str] = (),
    max_len: int = 5000,
    max_items: int = 64,
    progress: bool = False,
) -> list[ToolReport]:
    """Fuzz every tool the client lists (or only `tools`); one report per tool."""
    from jsonschema import Draft202012Validator

    listed = (await client.list_tools()).tools
    names = {t.name for t in listed}
    reports = []
    # Tools that make things other tools read go first (a plan token, fits, jobs), so that later tools meet real
    # ids (the pools learn them from the results); within that, by name.
    ordered = sorted(listed, key=lambda t: (t.name not in MAKERS, not starts_jobs(t), t.name))
    for tool in ordered:
        if tools and tool.name not in tools:
            continue
        report = ToolReport(tool.name)
        validator = Draft202012Validator(tool.output_schema) if tool.output_schema else None
        jobs = starts_jobs(tool)
        started = time.monotonic()
        for args in cases_for(tool, seed, job_cases if jobs else cases, pools, max_len=max_len, max_items=max_items):
            outcome, detail, content = await check_call(client, tool, args, validator)
            report.calls += 1
            if outcome == "ok":
                report.ok += 1
                pools.learn(content)
            elif outcome == "refused":
                report.refused += 1
            else:
                report.findings.append(Finding(tool.name, outcome, short(args), detail))
            if outcome in ("ok", "refused") and jobs and "cancel_job" in names:
                await cancel_active(client)
        if jobs and "cancel_job" in names:
            await cancel_active(client)
        report.seconds = time.monotonic() - started
        reports.append(report)
        if progress:
            print(
                f"{tool.name:28s} {report.calls:5d} calls {report.ok:5d} ok {report.refused:5d} refused "
                f"{len(report.findings):4d} findings {report.seconds:7.1f} s",
                flush=True,
            )
    return reports


def fuzz_app(home: Path, root: Path, **settings: Any) -> App:
    return App(Settings(home=home, allowed_roots=[root], cancel_grace_s=1.0, **settings), owner="fuzz")


async def main_async(args: argparse.Namespace) -> int:
    from servers.suite import create_server

    with tempfile.TemporaryDirectory(prefix="llm-infra-fuzz-") as tmp:
        base = Path(tmp)
        pools = make_pools(base / "root")
        app = fuzz_app(base / "state", pools.root)
        started = time.monotonic()
        async with Client(create_server(app)) as client:
            reports = await fuzz(
                client,
                pools,
                cases=args.cases,
                job_cases=args.job_cases,
                seed=args.seed,
                tools=args.tool or (),
                max_len=args.max_len,
                max_items=args.max_items,
                progress=True,
            )
        elapsed = time.monotonic() - started
    findings = [f for r in reports for f in r.findings]
    totals = {kind: sum(1 for f in findings if f.kind == kind) for kind in KINDS}
    calls = sum(r.calls for r in reports)
    print(
        f"\n{len(reports)} tools, {calls} calls in {elapsed:.1f} s (seed {args.seed}): "
        f"{sum(r.ok for r in reports)} ok, {sum(r.refused for r in reports)} refused, "
        + ", ".join(f"{n} {kind}" for kind, n in totals.items())
    )
    seen: set[tuple[str, str, str]] = set()
    for finding in findings:
        key = (finding.tool, finding.kind, re.sub(r"\d+", "N", finding.detail)[:120])
        if key not in seen:
            seen.add(key)
            print(f"- {finding}")
    return 1 if findings else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="argument sets per tool")
    parser.add_argument("--job-cases", type=int, default=40, help="argument sets per tool that starts jobs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool", action="append", help="only this tool (repeatable)")
    parser.add_argument("--max-len", type=int, default=200_000, help="longest boundary string")
    parser.add_argument("--max-items", type=int, default=2000, help="longest boundary list")
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    return anyio.run(main_async, args)


if __name__ == "__main__":
    raise SystemExit(main())
