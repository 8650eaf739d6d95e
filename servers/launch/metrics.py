"""The metrics contract between a training script and the launch server, in the standard library only.

A script finds the path of a JSON-lines file in the environment variable ``LLM_INFRA_MCP_METRICS``; rank 0 appends
one object per logged step: ``{"step": int, "time": unix seconds, ...}`` with any of loss, lr, grad_norm, tokens,
tokens_per_s, mfu, pass_rate, compute_flops, compute_gpu_hours and split ("train" or "eval"). Values that are not
finite numbers (nan, inf) are written as null, so every line is strict JSON.

This file has no dependencies beyond Python itself: copy it next to a training script or import it.

- ``MetricsWriter``: append rows (only rank 0 by default), one flushed line per call.
- ``read_metrics``: read such a file back, skipping (and counting) lines that are not valid rows.
- ``read_tensorboard``: read scalar summaries from TensorBoard event files without TensorFlow or TensorBoard,
  grouped into the same row shape; ``write_tensorboard_scalars`` writes a minimal event file (for tests and tools).
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

METRICS_ENV = "LLM_INFRA_MCP_METRICS"
CHECKPOINT_ENV = "LLM_INFRA_MCP_CHECKPOINT_DIR"


def _clean(value: Any) -> Any:
    """A JSON-safe version of `value`: non-finite floats become None, scalar tensors/arrays their Python number."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # numpy and torch scalars
    if callable(item):
        try:
            return _clean(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


class MetricsWriter:
    """Appends metric rows to a JSON-lines file.

    path: the file; by default the value of LLM_INFRA_MCP_METRICS. With neither, the writer is disabled (``log``
    still returns the row, so a script can print it). rank: this process's rank, by default the RANK environment
    variable (0 when unset). Only rank 0 writes unless all_ranks=True.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, rank: int | None = None, all_ranks: bool = False):
        if path is None:
            path = os.environ.get(METRICS_ENV) or None
        self.path: Path | None = Path(path) if path is not None else None
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else int(rank)
        self.enabled = self.path is not None and (all_ranks or self.rank == 0)
        self._handle: TextIO | None = None

    def log(self, step: int, **values: Any) -> dict[str, Any]:
        """Append {"step", "time", **values} as one line and flush it. Returns the row as written."""
        row: dict[str, Any] = {"step": int(step), "time": time.time()}
        for key, value in values.items():
            if key in ("step", "time"):
                raise ValueError(f"{key!r} is set by the writer; pass the other values only")
            row[key] = _clean(value)
        if self.enabled:
            if self._handle is None:
                assert self.path is not None
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open across calls)
            self._handle.write(json.dumps(row, allow_nan=False) + "\n")  # one write per row
            self._handle.flush()
        return row

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """(rows, skipped): every line that is a JSON object with an integer "step", in file order, and the number of
    non-blank lines that were not (bad JSON, a cut-off last line, no step). A missing file reads as ([], 0)."""
    rows: list[dict[str, Any]] = []
    skipped = 0
    try:
        handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except FileNotFoundError:
        return rows, 0
    with handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            step = row.get("step") if isinstance(row, dict) else None
            if isinstance(step, float) and step.is_integer():
                row["step"] = step = int(step)
            if not isinstance(step, int) or isinstance(step, bool):
                skipped += 1
                continue
            rows.append(row)
    return rows, skipped


# ------------------------------------------------------------------------------------------------ TensorBoard
#
# An event file is a sequence of TFRecords: uint64 length (little endian), uint32 masked CRC-32C of the length
# bytes, the data, uint32 masked CRC-32C of the data. The data is a serialised tensorflow.Event protobuf, of
# which we read: wall_time (1, double), step (2, int64), summary (5) -> value (1, repeated) -> tag (1, string),
# simple_value (2, float), and for TF2-style scalars tensor (8) -> dtype (1), tensor_content (4), float_val (5),
# double_val (6).


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _read_records(data: bytes) -> Iterator[bytes]:
    """The payloads of the TFRecords in `data`; stops at a truncated or corrupt frame, skips a bad data CRC."""
    pos = 0
    while pos + 12 <= len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if length_crc != _masked_crc(header) or pos + 12 + length + 4 > len(data):
            return  # a damaged length or a record still being written: nothing after it can be framed
        payload = data[pos + 12 : pos + 12 + length]
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        pos += 16 + length
        if data_crc == _masked_crc(payload):
            yield payload


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) for each field of a protobuf message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


def _tensor_scalar(buf: bytes) -> float | None:
    dtype = 0
    content = b""
    values: list[float] = []
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 4 and wire == 2:
            content = value
        elif number == 5:  # float_val: packed (wire 2) or one at a time (wire 5)
            values.extend(struct.unpack(f"<{len(value) // 4}f", value))
        elif number == 6:  # double_val
            values.extend(struct.unpack(f"<{len(value) // 8}d", value))
    if values:
        return float(values[0])
    if dtype == 1 and len(content) >= 4:  # DT_FLOAT
        return float(struct.unpack("<f", content[:4])[0])
    if dtype == 2 and len(content) >= 8:  # DT_DOUBLE
        return float(struct.unpack("<d", content[:8])[0])
    return None


def _parse_event(buf: bytes) -> tuple[float, int, dict[str, float]]:
    wall_time = 0.0
    step = 0
    scalars: dict[str, float] = {}
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 1:
            wall_time = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            step = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 5 and wire == 2:
            for vnum, vwire, vbuf in _fields(value):
                if vnum != 1 or vwire != 2:
                    continue
                tag: str | None = None
                scalar: float | None = None
                for f, w, v in _fields(vbuf):
                    if f == 1 and w == 2:
                        tag = v.decode("utf-8", errors="replace")
                    elif f == 2 and w == 5:
                        scalar = float(struct.unpack("<f", v)[0])
                    elif f == 8 and w == 2 and scalar is None:
                        scalar = _tensor_scalar(v)
                if tag is not None and scalar is not None:
                    scalars[tag] = scalar
    return wall_time, step, scalars


def _event_files(logdir: Path) -> list[Path]:
    if logdir.is_file():
        return [logdir]
    return sorted(p for p in logdir.rglob("*tfevents*") if p.is_file())


def read_tensorboard(logdir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Scalar summaries of every event file under `logdir` (or of one file), as rows {"step", "time", tag: value}
    sorted by step; "time" is the latest wall time seen for that step. When a tag is logged twice at one step
    (a restarted run), the later record wins. Non-finite values come back as None."""
    by_step: dict[int, dict[str, Any]] = {}
    for path in _event_files(Path(logdir)):
        for record in _read_records(path.read_bytes()):
            try:
                wall_time, step, scalars = _parse_event(record)
            except (ValueError, struct.error):
                continue
            if not scalars:
                continue  # file_version records, graphs, histograms, images
            row = by_step.setdefault(step, {"step": step, "time": wall_time})
            row["time"] = max(row["time"], wall_time)
            for tag, value in scalars.items():
                row[tag] = value if math.isfinite(value) else None
    return [by_step[s] for s in sorted(by_step)]


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _encode_varint(len(payload)) + payload


def _record(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", _masked_crc(header)) + payload + struct.pack("<I", _masked_crc(payload))


def write_tensorboard_scalars(path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write a minimal TensorBoard event file: a file_version record, then one Event per row with a simple_value
    per numeric key other than "step" and "time" (time defaults to now). Returns the path written."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    chunks = [
        _record(_key(1, 1) + struct.pack("<d", time.time()) + _len_field(3, b"brain.Event:2")),
    ]
    for row in rows:
        values = b""
        for tag, value in row.items():
            if tag in ("step", "time") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            values += _len_field(1, _len_field(1, str(tag).encode()) + _key(2, 5) + struct.pack("<f", value))
        event = (
            _key(1, 1)
            + struct.pack("<d", float(row.get("time", time.time())))
            + _key(2, 0)
            + _encode_varint(int(row["step"]))
            + _len_field(5, values)
        )
        chunks.append(_record(event))
    out.write_bytes(b"".join(chunks))
    return out
