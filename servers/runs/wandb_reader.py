"""W&B runs without network: an offline run's transaction log, or an exported history (CSV or parquet).

Sources:

- An offline run (``WANDB_MODE=offline``): ``wandb/offline-run-<time>-<id>/run-<id>.wandb``, the run directory, or
  the ``wandb/`` directory holding several runs (the latest by the time in its name is read; the others are listed
  in a note). Online runs keep the same file in ``wandb/run-<time>-<id>/``; it reads the same way.
- An exported history: a ``.csv`` or ``.parquet`` file with a ``_step`` column, the shape of ``run.history()`` /
  ``run.scan_history()`` saved with pandas. Time is ``_timestamp`` (unix seconds), else ``_runtime`` (seconds since
  the run started; noted). A CSV without a ``_step`` column is not claimed (the suite's own data files are CSVs).

Sampling: W&B's ``run.history()`` returns a sample of the run (500 rows by default), while ``scan_history()`` and
the run's exported history are the full series (shared/reference/runs.md, from the W&B docs). This reader reads
every record of the file it is given; give it a full export, not a sampled ``history()``, when the run is online.

The ``.wandb`` file: a 7-byte header (``:W&B``, magic 0xBEE1 little-endian, version 0), then the LevelDB log
format (google/leveldb doc/log_format.md): 32 KiB blocks of records, each a 7-byte header (checksum uint32, length
uint16, type uint8: FULL 1, FIRST 2, MIDDLE 3, LAST 4) and its data; a block's last < 7 bytes are zero padding.
The checksum is zlib's CRC-32 of the type byte then the data (W&B's, where LevelDB uses CRC-32C). Each record's
data is a ``wandb.proto.wandb_internal_pb2.Record``, decoded with the installed wandb package. Sources of the
format: wandb's former ``wandb/sdk/internal/datastore.py`` (its Python reader; the installed wandb 0.31 ships none:
its Go ``wandb-core`` writes and reads the file), checked against files written by wandb 0.31 in the tests.

What is read: history records (``_step``, ``_timestamp``, ``_runtime`` and the logged keys; values are JSON in
``value_json``; a nested dict logged as ``{"a": {"b": 1}}`` arrives as ``nested_key`` [a, b] and is named ``a.b``,
as W&B's backend flattens it: only slash-named keys make sections in its UI, per the review of wandb/wandb#8132);
config (in the run record and later config records: facts such as GPUs, nodes, model and max steps, each with
the source "wandb config KEY"); the run's display name and id; the exit record. A file whose last record is cut
off (a run still being written, a truncated copy) reads up to the cut and says partial; a run without an exit
record is said to be still running or killed; a damaged block is skipped and counted. In exports a NaN is how
pandas and W&B mark a key not logged at that step, so NaN cells are treated as absent; infinities are counted.
"""

from __future__ import annotations

import csv
import json
import math
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servers.runs.registry import Target
from servers.runs.series import MAX_KEYS, RunCollector, RunData, RunError, number

HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
HEADER_LEN = 7
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAX_RECORD_BYTES = 16 << 20  # one history row of a few thousand keys is far below; larger is skipped
MAX_LISTED = 10_000  # directory entries looked at when searching for runs
MAX_NAMED = 10  # other runs named in the note
MAX_CONFIG_LEAVES = 5_000
MAX_DEPTH = 8  # nesting followed in a config or a history value
MAX_LINE_CHARS = 1 << 20  # a CSV line longer than this is skipped, never held whole
RESERVED = ("_step", "_timestamp")
RUN_DIR = re.compile(r"^(?:offline-)?run-(\d{8}_\d{6})-([A-Za-z0-9]+)$")
ACCEPTS = (
    "a W&B offline run (wandb/offline-run-*/, its run-*.wandb file, or the wandb/ directory: the latest run) or an "
    "exported history (.csv or .parquet with a _step column)"
)

# config leaf names (the last dotted part) that state a fact about the run; the first found, shallowest first, wins
FACT_KEYS: dict[str, str] = {
    "n_gpus_per_node": "gpus_per_node",  # verl trainer.n_gpus_per_node
    "gpus_per_node": "gpus_per_node",
    "nproc_per_node": "gpus_per_node",
    "nnodes": "nnodes",  # verl trainer.nnodes, torchrun
    "num_nodes": "nnodes",
    "num_machines": "nnodes",  # accelerate
    "world_size": "gpus",
    "num_processes": "gpus",  # accelerate
    "n_gpus": "gpus",
    "num_gpus": "gpus",
    "gpus": "gpus",
    "max_steps": "max_steps",  # transformers TrainingArguments
    "total_training_steps": "max_steps",  # verl trainer.total_training_steps
    "model_name_or_path": "model",
    "model_name": "model",
    "model": "model",
    "_name_or_path": "model",
    "params": "params",
    "num_params": "params",
    "n_params": "params",
    "num_parameters": "params",
}
FULL_FACT_KEYS = {"actor_rollout_ref.model.path": "model"}  # verl: its model is a nested path
COUNT_FACTS = ("gpus_per_node", "nnodes", "gpus", "max_steps", "params")


# ---- detection ---------------------------------------------------------------------------------------------


def detect(target: Target) -> bool:
    path = target.path
    if path is None:
        return False
    if path.is_file():
        return _is_log(path) or _is_export(path)
    return bool(_run_files(path))


def _is_log(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(HEADER_LEN) == HEADER
    except OSError:
        return False


def _is_export(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "_step" in _csv_header(path)
    if suffix == ".parquet":
        return _parquet_has_step(path)
    return False


def _csv_header(path: Path, limit: int = 1 << 16) -> list[str]:
    try:
        with path.open("rb") as handle:
            head = handle.read(limit)
    except OSError:
        return []
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").lstrip("\ufeff")
    try:
        return next(csv.reader([first]), [])
    except csv.Error:
        return []


def _parquet_has_step(path: Path, limit: int = 1 << 20) -> bool:
    """Whether the parquet footer (its schema, thrift-encoded, at the end of the file) names a _step column: a
    cheap check without pyarrow; read() checks the schema for real."""
    try:
        with path.open("rb") as handle:
            if handle.read(4) != b"PAR1":
                return False
            handle.seek(0, 2)
            size = handle.tell()
            if size < 12:
                return False
            handle.seek(size - 8)
            length, magic = struct.unpack("<I4s", handle.read(8))
            if magic != b"PAR1" or length > min(limit, size - 12):
                return False
            handle.seek(size - 8 - length)
            return b"_step" in handle.read(length)
    except OSError:
        return False


def _run_files(path: Path) -> list[Path]:
    """The .wandb files of the runs at `path`: a run directory's own, else those of the run directories in it (a
    wandb/ directory), else those under path/wandb. Symbolic links (wandb's latest-run) are not followed."""
    own = _logs_in(path)
    if own:
        return own[:1]
    for folder in (path, path / "wandb"):
        found: list[Path] = []
        for child in _entries(folder):
            if RUN_DIR.match(child.name) and not child.is_symlink() and child.is_dir():
                found.extend(_logs_in(child)[:1])
        if found:
            return found
    return []


def _entries(folder: Path) -> list[Path]:
    try:
        if not folder.is_dir() or folder.is_symlink():
            return []
        out: list[Path] = []
        for child in folder.iterdir():
            out.append(child)
            if len(out) >= MAX_LISTED:
                break
        return out
    except OSError:
        return []


def _logs_in(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in _entries(folder)
        if p.name.startswith("run-") and p.suffix == ".wandb" and not p.is_symlink() and p.is_file() and _is_log(p)
    )


def _started(log: Path) -> tuple[str, float]:
    match = RUN_DIR.match(log.parent.name)
    try:
        mtime = log.stat().st_mtime
    except OSError:
        mtime = 0.0
    return (match.group(1) if match else "", mtime)


# ---- reading -----------------------------------------------------------------------------------------------


def read(target: Target, keys: set[str] | None, cap: int) -> RunData:
    path = target.path
    if path is None:
        raise RunError(f"{target.text!r} is not a path; accepted: {ACCEPTS}")
    if path.is_file():
        if _is_log(path):
            return _read_log(path, None, keys, cap)
        suffix = path.suffix.lower()
        if suffix == ".csv":
            return _read_csv(path, keys, cap)
        if suffix == ".parquet":
            return _read_parquet(path, keys, cap)
        raise RunError(f"{path} is not a W&B transaction log (no :W&B header) nor an export; accepted: {ACCEPTS}")
    logs = _run_files(path)
    if not logs:
        raise RunError(f"{path} holds no W&B run (no run-*.wandb file, nor offline-run-*/ directories); {ACCEPTS}")
    logs.sort(key=_started)
    return _read_log(logs[-1], logs[:-1], keys, cap)


def _read_log(path: Path, others: list[Path] | None, keys: set[str] | None, cap: int) -> RunData:
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb  # the wandb package's record definitions

    run = RunData("wandb", str(path), path.parent.name or path.stem)
    if others:
        shown = ", ".join(p.parent.name for p in others[-MAX_NAMED:][::-1])
        more = f" and {len(others) - MAX_NAMED} more" if len(others) > MAX_NAMED else ""
        run.note(f"read the latest of {len(others) + 1} runs, {path.parent.name}; the others: {shown}{more}")
    collect = RunCollector(run, keys, cap)
    state = _LogState()
    for data in _records(path, run):
        record = pb.Record()
        try:
            record.ParseFromString(data)
        except DecodeError:
            run.skip("undecodable record")
            continue
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run.rows_read += 1
            _history(record.history, collect, run)
        elif kind == "run":
            _run_record(record.run, run, state)
        elif kind == "config":
            _config(record.config.update, run, state)
        elif kind == "exit":
            state.exited = True
            if record.exit.exit_code:
                run.note(f"the run exited with code {record.exit.exit_code}")
    if run.rows_read == 0 and not state.any_record:
        cut = " (it is cut off: a run just started, or a truncated copy)" if run.partial else ""
        raise RunError(f"{path} holds no complete W&B run or history record{cut}; accepted: {ACCEPTS}")
    if not state.exited:
        run.partial.append(
            "the run has no exit record: it is still running (what was logged so far), or its process was killed"
        )
    _derive_gpus(run)
    return collect.done()


class _LogState:
    def __init__(self) -> None:
        self.exited = False
        self.any_record = False
        self.config_leaves = 0  # config values looked at (at most MAX_CONFIG_LEAVES)


def _records(path: Path, run: RunData) -> Iterator[bytes]:
    """The data of each whole record of the transaction log, in order (see the module's docstring). Damaged
    blocks are skipped and counted; a record cut off at the end of the file makes the read partial."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise RunError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    with handle:
        if handle.read(HEADER_LEN) != HEADER:
            raise RunError(f"{path} does not start with the W&B header (:W&B, 0xBEE1, version 0); {ACCEPTS}")
        pending: bytearray | None = None
        oversized = False  # the record being assembled passed MAX_RECORD_BYTES: its fragments are dropped
        for kind, data in _fragments(handle, run, path):
            if kind is None:  # a damaged block or the cut: what was being assembled is lost
                pending, oversized = None, False
            elif kind == FULL:
                pending, oversized = None, False
                yield data
            elif kind == FIRST:
                pending, oversized = bytearray(data), False
            elif kind in (MIDDLE, LAST) and (pending is not None or oversized):
                if pending is not None and len(pending) + len(data) > MAX_RECORD_BYTES:
                    run.skip(f"record over {MAX_RECORD_BYTES >> 20} MiB")
                    pending, oversized = None, True
                if pending is not None:
                    pending += data
                if kind == LAST:
                    whole, pending, oversized = pending, None, False
                    if whole is not None:
                        yield bytes(whole)
            else:
                run.skip("record fragment without its start")
                pending, oversized = None, False
        if pending is not None:
            _cut(run, path)


def _fragments(handle: Any, run: RunData, path: Path) -> Iterator[tuple[int | None, bytes]]:
    """(type, data) of each checked record fragment, block after block; (None, b"") where a damaged block's rest
    or a cut-off end was left out (said in run.partial)."""
    first = True
    while True:
        start = HEADER_LEN if first else 0  # the file's header takes the first bytes of block 0
        block = handle.read(BLOCK - start)
        first = False
        if not block:
            return
        short = len(block) < BLOCK - start  # the file's last block
        pos = 0
        while pos + HEADER_LEN <= len(block):
            crc, length, kind = struct.unpack_from("<IHB", block, pos)
            if crc == 0 and length == 0 and kind == 0:
                break  # zero padding: the rest of the block
            end = pos + HEADER_LEN + length
            data = block[pos + HEADER_LEN : end]
            if end > len(block) or zlib.crc32(data, zlib.crc32(bytes((kind,)))) & 0xFFFFFFFF != crc:
                if short and end >= len(block):
                    _cut(run, path)
                else:
                    _damaged(run, path, "a record runs past its block" if end > len(block) else "checksum mismatch")
                yield None, b""
                break
            pos = end
            yield kind, data
        else:
            if short and pos < len(block) and any(block[pos:]):
                _cut(run, path)
                yield None, b""
        if short:
            return


def _damaged(run: RunData, path: Path, why: str) -> None:
    run.skip(f"damaged block ({why})")
    reason = f"{path.name} has damaged blocks, skipped: the records in them are missing (rows_skipped counts them)"
    if reason not in run.partial:
        run.partial.append(reason)


def _cut(run: RunData, path: Path) -> None:
    reason = (
        f"the last record of {path.name} is cut off: the run is still being written or the file was truncated; "
        "every complete record was read"
    )
    if reason not in run.partial:
        run.partial.append(reason)
        run.skip("cut-off last record")


def _item_value(item: Any) -> Any:
    """A history or config item's value: its JSON (value_json), else the typed form wandb may also write."""
    if item.value_json:
        try:
            return json.loads(item.value_json)
        except (ValueError, RecursionError):
            return None
    try:
        kind = item.WhichOneof("value")
    except ValueError:  # a config item: value_json only
        return None
    if kind in ("number", "integer"):
        return getattr(item, kind)
    if kind == "json":
        try:
            return json.loads(item.json)
        except (ValueError, RecursionError):
            return None
    return None


def _history_value(item: Any) -> Any:
    """A history item's value; a plain number (most of them: "0.5", "3", "NaN", "Infinity") without a JSON parse."""
    text = item.value_json
    if text and text[0] not in '"{[tfn':
        try:
            return float(text)
        except ValueError:
            pass
    return _item_value(item)


def _item_key(item: Any) -> str:
    return ".".join(item.nested_key) if len(item.nested_key) else item.key


def _leaves(key: str, value: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for a value, following nested dicts (not W&B media, which carry a _type)."""
    if isinstance(value, dict) and "_type" not in value and depth < MAX_DEPTH:
        for sub, inner in value.items():
            yield from _leaves(f"{key}.{sub}" if key else str(sub), inner, depth + 1)
    else:
        yield key, value


def _history(history: Any, collect: RunCollector, run: RunData) -> None:
    row: dict[str, Any] = {}
    for item in history.item:
        for key, value in _leaves(_item_key(item), _history_value(item)):
            row[key] = value
    step_value = number(row.get("_step"))
    if step_value is not None and math.isfinite(step_value) and step_value.is_integer():
        step = int(step_value)
    elif history.HasField("step"):
        step = int(history.step.num)
    else:
        run.skip("history row without a step")
        return
    stamp = number(row.get("_timestamp"))
    time = stamp if stamp is not None and math.isfinite(stamp) else math.nan
    for key, raw in row.items():
        if key in RESERVED or key.startswith("_wandb"):
            continue
        value = number(raw)
        if value is None:
            collect.seen(key)
            continue
        collect.add(key, step, time, value)


def _run_record(record: Any, run: RunData, state: _LogState) -> None:
    state.any_record = True
    if record.display_name:
        run.name = record.display_name
    if record.run_id:
        run.fact("run_id", record.run_id, "wandb run record")
    if record.project:
        run.fact("project", record.project, "wandb run record")
    if record.resumed:
        run.note("the run is a resumed one: this file holds what was logged after the resume")
    _config(record.config.update, run, state)


def _config(updates: Any, run: RunData, state: _LogState) -> None:
    state.any_record = True
    found: list[tuple[int, str, Any]] = []
    for item in updates:
        key = _item_key(item)
        if key.startswith("_wandb"):
            continue
        for leaf, value in _leaves(key, _item_value(item)):
            if state.config_leaves >= MAX_CONFIG_LEAVES:
                break
            state.config_leaves += 1
            found.append((leaf.count("."), leaf, value))
    for _, leaf, value in sorted(found, key=lambda f: f[0]):
        name = FULL_FACT_KEYS.get(leaf) or FACT_KEYS.get(leaf.rsplit(".", 1)[-1])
        if name is None or name in run.facts:
            continue
        if name in COUNT_FACTS:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                continue
        elif not isinstance(value, str) or not value:
            continue
        where = f"wandb config {leaf}"
        if name == "gpus" and leaf.rsplit(".", 1)[-1] in ("world_size", "num_processes"):
            where += " (one GPU per process assumed)"
        run.fact(name, value, where)


def _derive_gpus(run: RunData) -> None:
    nodes, per_node = run.facts.get("nnodes"), run.facts.get("gpus_per_node")
    if "gpus" not in run.facts and isinstance(nodes, int) and isinstance(per_node, int):
        where = f"{run.fact_sources['nnodes']} x {run.fact_sources['gpus_per_node'].removeprefix('wandb config ')}"
        run.fact("gpus", nodes * per_node, where)


# ---- exported histories ------------------------------------------------------------------------------------


def _time_column(names: list[str], run: RunData) -> str | None:
    if "_timestamp" in names:
        return "_timestamp"
    if "_runtime" in names:
        run.note("wall times are _runtime, seconds since the run started (the export has no _timestamp)")
        return "_runtime"
    run.note("the export has no _timestamp nor _runtime column: wall times are unknown")
    return None


def _export_value(raw: float, key: str, collect: RunCollector, step: int, time: float) -> None:
    if math.isnan(raw):
        return  # a key not logged at this step (pandas and W&B mark it NaN)
    collect.add(key, step, time, raw)


def _read_csv(path: Path, keys: set[str] | None, cap: int) -> RunData:
    run = RunData("wandb", str(path), path.stem)
    collect = RunCollector(run, keys, cap)
    try:
        handle = path.open(newline="", encoding="utf-8-sig", errors="replace")
    except OSError as exc:
        raise RunError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    with handle:
        reader = csv.reader(_lines(handle, run))
        try:
            names = next(reader, [])
        except csv.Error as exc:
            raise RunError(f"{path}: its header row is not CSV ({exc}); accepted: {ACCEPTS}") from None
        if "_step" not in names:
            raise RunError(f"{path} has no _step column; accepted: {ACCEPTS}")
        at_step = names.index("_step")
        time_name = _time_column(names, run)
        at_time = names.index(time_name) if time_name else None
        columns = [(i, n) for i, n in enumerate(names) if n not in RESERVED and not n.startswith("_wandb")]
        for name in (n for _, n in columns):
            collect.seen(name)
        while True:
            try:
                row = next(reader, None)
            except csv.Error:
                run.skip("not a CSV row (a field over the csv module's limit, or a bad quote)")
                continue
            if row is None:
                break
            if not row:
                continue
            run.rows_read += 1
            if len(row) != len(names):
                run.skip("row with another number of fields than the header (cut off, or damaged)")
                continue
            step = _int(row[at_step])
            if step is None:
                run.skip("no integer _step")
                continue
            time = _float(row[at_time]) if at_time is not None else None
            time = time if time is not None and math.isfinite(time) else math.nan
            for i, name in columns:
                value = _float(row[i])
                if value is not None:
                    _export_value(value, name, collect, step, time)
    if run.rows_read == 0:
        raise RunError(f"{path} has a _step column but no rows")
    return collect.done()


def _lines(handle: Any, run: RunData) -> Iterator[str]:
    """The lines of a text file, each at most MAX_LINE_CHARS: a longer one is skipped (read on, not kept)."""
    while True:
        line = handle.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            while line and not line.endswith("\n"):
                line = handle.readline(1 << 16)
            run.skip(f"line longer than {MAX_LINE_CHARS >> 20} MiB")
            continue
        yield line


def _float(cell: str) -> float | None:
    cell = cell.strip()
    if not cell:
        return None
    try:
        return float(cell)
    except ValueError:
        return None


def _int(cell: str) -> int | None:
    value = _float(cell)
    if value is None or not math.isfinite(value) or not value.is_integer():
        return None
    return int(value)


def _read_parquet(path: Path, keys: set[str] | None, cap: int) -> RunData:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise RunError(
            f"reading {path.name} (parquet) needs the Python package 'pyarrow', which is not installed here: pip "
            "install 'llm-infra-mcp[runs]' (or pyarrow); a .csv export reads without it"
        ) from None

    run = RunData("wandb", str(path), path.stem)
    try:
        table = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise RunError(f"{path} is not a readable parquet file ({str(exc)[:160]}); accepted: {ACCEPTS}") from None
    schema = table.schema_arrow
    names = list(schema.names)
    if "_step" not in names:
        raise RunError(f"{path} has no _step column; accepted: {ACCEPTS}")
    time_name = _time_column(names, run)
    collect = RunCollector(run, keys, cap)
    numeric: list[str] = []
    for field in schema:
        if field.name in RESERVED or field.name.startswith("_wandb"):
            continue
        collect.seen(field.name)
        kind = field.type
        asked = keys is None or field.name in keys
        if (pa.types.is_integer(kind) or pa.types.is_floating(kind)) and asked and len(numeric) < MAX_KEYS:
            numeric.append(field.name)
    wanted = ["_step", *([time_name] if time_name else []), *numeric]
    try:
        for batch in table.iter_batches(batch_size=8192, columns=list(dict.fromkeys(wanted))):
            _parquet_batch(batch, time_name, numeric, collect, run, pa)
    except (OSError, pa.ArrowException) as exc:
        run.partial.append(f"{path.name} could not be read to its end ({str(exc)[:160]}); the rows before were read")
    if run.rows_read == 0 and not run.partial:
        raise RunError(f"{path} has a _step column but no rows")
    return collect.done()


def _seconds(column: Any, pa: Any) -> list[Any]:
    """A time column as seconds: numbers as they are, a timestamp column (pandas datetimes) converted."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        scale = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[kind.unit]
        return [None if v is None else v / scale for v in column.cast(pa.int64()).to_pylist()]
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return column.to_pylist()
    return [None] * len(column)


def _parquet_batch(
    batch: Any, time_name: str | None, numeric: list[str], collect: RunCollector, run: RunData, pa: Any
) -> None:
    steps = batch.column("_step").to_pylist()
    times = _seconds(batch.column(time_name), pa) if time_name else [None] * len(steps)
    values = {name: batch.column(name).to_pylist() for name in numeric}
    for row, raw_step in enumerate(steps):
        run.rows_read += 1
        step = raw_step if isinstance(raw_step, int) else None
        if isinstance(raw_step, float) and math.isfinite(raw_step) and raw_step.is_integer():
            step = int(raw_step)
        if step is None:
            run.skip("no integer _step")
            continue
        stamp = times[row]
        time = float(stamp) if isinstance(stamp, (int, float)) and math.isfinite(stamp) else math.nan
        for name in numeric:
            raw = values[name][row]
            if raw is not None:
                _export_value(float(raw), name, collect, step, time)
