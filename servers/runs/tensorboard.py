"""TensorBoard event files (OpenRLHF, ROLL, NeMo-RL, TRL and transformers with report_to tensorboard, torch's
SummaryWriter, TensorFlow), read with the tensorboard package's own record reader (RawEventFileLoader, which checks
every record's CRC) and its Event protobuf; every scalar point is read, not EventAccumulator's default sample of
10,000 per tag.

What is read: scalar values, written the TF1 way (Summary.Value.simple_value) or the TF2/torch way (a tensor of one
numeric element, of the scalars plugin or of none). Histograms, images, text, graphs and hparams are not metrics
and are passed over.

Directories and names: as in TensorBoard, every directory holding event files is one run of its own (one stream:
steps going back within it are a restart, series.py). When all the event files are in one directory (the given
one or one below it, as transformers' runs/<date_host>/ is), tags are read as they are ("train/reward"). When
several directories hold event files, each tag is prefixed with its directory's path relative to the given one,
as TensorBoard names its runs: tag "reward" in subdirectory "seed1/train" is read as "seed1/train/reward"; tags of
files directly in the given directory keep their name. A prefixed name equal to another directory's key is
skipped and counted.

Files of one directory are read in the order of their names, numbers compared as numbers
(events.out.tfevents.<unix seconds>.<host>.<pid>.<n>: oldest first), so that a run resumed into a new file is a
restart (its steps go back) and the later file's points supersede the earlier ones. A later file whose first tag
the directory's earlier files do not have is another writer beside them (torch's add_hparams into the same
directory, an evaluator), a stream of its own: its lower steps are no restart.

Damage: a record cut off at the end of a file (a run still being written, a copy cut short) is read up to the
cut and the read is partial; a damaged record (a CRC that does not match) stops the reader in that file, as it
stops TensorBoard: the bytes after it are not read, which the read says (partial, rows_skipped). Bounded: at most
MAX_DIRS directories walked and MAX_FILES event files read, symbolic links are not followed, and the collector
keeps at most `cap` points per key and MAX_KEYS keys.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servers.runs.registry import Target
from servers.runs.series import MAX_KEYS, RunCollector, RunData, RunError

MARK = "tfevents"
MAX_DIRS = 20_000  # directories walked below the given one
MAX_FILES = 10_000  # event files read
MAX_PARTIAL = 10  # per-file messages in RunData.partial; the rest are summed up in one
VERIFY_LIMIT = 1 << 26  # the largest record whose CRC is checked to tell a damaged one from a file still growing
_DIGITS = re.compile(r"(\d+)")

# TensorProto dtype -> (its repeated field, struct format of one element in tensor_content). DT_HALF and
# DT_BFLOAT16 keep their 16 bits in half_val and are decoded apart.
_DTYPES: dict[int, tuple[str, str]] = {
    1: ("float_val", "<f"),  # DT_FLOAT
    2: ("double_val", "<d"),  # DT_DOUBLE
    3: ("int_val", "<i"),  # DT_INT32
    4: ("int_val", "<B"),  # DT_UINT8
    5: ("int_val", "<h"),  # DT_INT16
    6: ("int_val", "<b"),  # DT_INT8
    9: ("int64_val", "<q"),  # DT_INT64
    17: ("int_val", "<H"),  # DT_UINT16
    22: ("uint32_val", "<I"),  # DT_UINT32
    23: ("uint64_val", "<Q"),  # DT_UINT64
    19: ("half_val", "<e"),  # DT_HALF
    14: ("half_val", "<H"),  # DT_BFLOAT16: the upper 16 bits of a float32
}
_SCALAR_PLUGINS = ("", "scalars")


def detect(target: Target) -> bool:
    path = target.path
    if path is None:
        return False
    if path.is_file():
        return MARK in path.name
    if not path.is_dir():
        return False
    return any(files for _, files in _walk(path, MAX_DIRS, notes=None))


def _walk(root: Path, limit: int, notes: list[str] | None) -> Iterator[tuple[Path, list[Path]]]:
    """(directory, its event files) for each directory at or below `root` holding any, in sorted order of the
    directories' relative paths; symbolic links are not followed; at most `limit` directories are looked at."""
    for seen, (here, dirs, files) in enumerate(os.walk(root, followlinks=False), 1):
        if seen > limit:
            if notes is not None:
                notes.append(f"only the first {limit:,} directories below {root} were searched for event files")
            return
        dirs.sort()
        folder = Path(here)
        events = [folder / f for f in files if MARK in f]
        events = [p for p in events if not p.is_symlink() and p.is_file()]
        if events:
            yield folder, sorted(events, key=_file_order)


def _file_order(path: Path) -> tuple[str | int, ...]:
    """The name with its runs of digits compared as numbers: events.out.tfevents.<unix seconds>.<host>.<pid>.<n>
    sorts by time first, then by host, process and the writer's counter (10 after 9)."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(_DIGITS.split(path.name)))


def _tensor_scalar(tensor: Any) -> float | None:
    """The value of a tensor holding one numeric element; None for any other tensor (strings, bools, several
    elements, an empty one)."""
    dims = tensor.tensor_shape.dim
    if any(d.size != 1 for d in dims):
        return None
    kind = _DTYPES.get(tensor.dtype)
    if kind is None:
        return None
    name, fmt = kind
    repeated = getattr(tensor, name)
    if len(repeated) > 1:
        return None  # several values whatever its shape says
    if repeated:
        raw = repeated[0]
        if name != "half_val":
            return float(raw)
        bits = struct.pack("<H", raw & 0xFFFF)
        return float(struct.unpack("<e", bits)[0] if fmt == "<e" else struct.unpack("<f", b"\0\0" + bits)[0])
    content = tensor.tensor_content
    if len(content) != struct.calcsize(fmt):
        return None
    if tensor.dtype == 14:
        return float(struct.unpack("<f", b"\0\0" + content)[0])
    return float(struct.unpack(fmt, content)[0])


class _Stream:
    """One directory of event files: its stream name, its keys' prefix and what is known of its tags."""

    def __init__(self, name: str, prefix: str):
        self.name = name
        self.prefix = prefix
        self.keys: dict[str, str | None] = {}  # tag -> source key (None: skipped, its name collides)
        self.plugins: dict[str, str] = {}  # tag -> the plugin named by its first metadata


class _Reader:
    def __init__(self, run: RunData, collect: RunCollector):
        from google.protobuf.message import DecodeError
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat import tf
        from tensorboard.compat.proto.event_pb2 import Event

        self.run = run
        self.collect = collect
        self.loader = RawEventFileLoader
        self.event = Event
        self.decode_error = DecodeError
        self.read_errors = (OSError, tf.errors.OpError)  # a file gone or unreadable (the reader's own errors)
        self.owner: dict[str, str] = {}  # source key -> the stream that has it
        self.damaged: list[str] = []

    def key(self, stream: _Stream, tag: str) -> str | None:
        key = stream.prefix + tag
        if key not in self.owner and len(self.owner) >= MAX_KEYS:
            return key  # past the collector's limit of keys: it counts the key as dropped
        owner = self.owner.setdefault(key, stream.name)
        if owner != stream.name:
            self.run.note(f"tag {tag!r} of {stream.name!r} is named {key!r} like a key of {owner!r}: skipped")
            return None
        return key

    def file(self, path: Path, stream: _Stream) -> None:
        run, collect, parse = self.run, self.collect, self.event.FromString
        keys_of, name = stream.keys, stream.name
        consumed, first = 0, True
        try:
            for raw in self.loader(str(path)).Load():
                consumed += len(raw) + 16  # length (8), its CRC (4), the data, its CRC (4)
                run.rows_read += 1
                try:
                    event = parse(raw)
                except self.decode_error:  # a record whose CRC matches but which is no Event
                    run.skip("a record that is not an Event")
                    continue
                if not event.HasField("summary"):
                    continue  # file_version, graphs, session logs
                step, time = event.step, event.wall_time
                for value in event.summary.value:
                    if value.WhichOneof("value") == "simple_value":
                        number: float | None = value.simple_value
                    else:
                        number = self.tensor_value(value, stream)
                        if number is None:
                            continue
                    tag = value.tag
                    try:
                        key = keys_of[tag]
                    except KeyError:
                        if first and keys_of:
                            name = self.own_writer(path, stream)
                        key = self.key(stream, tag)
                        if len(keys_of) < MAX_KEYS:  # a file of countless tags costs no more memory
                            keys_of[tag] = key
                    first = False
                    if key is not None:
                        collect.add(key, step, time, number, stream=name)
                    else:
                        run.skip("a tag whose name collides with another directory's")
        except self.read_errors as exc:
            self.damaged.append(f"{path.name} could not be read past byte {consumed:,} ({type(exc).__name__})")
            run.skip("unreadable event file")
            return
        self.tail(path, consumed)

    def own_writer(self, path: Path, stream: _Stream) -> str:
        """The stream of a file whose first tag its directory's earlier files do not have: another writer beside
        the first (torch's add_hparams into the same directory, an evaluator), not a restart of it."""
        self.run.note(
            f"event file {path.name} of {stream.name!r} starts with a tag the earlier files do not have: read as "
            "another writer's, so its steps do not count as a restart"
        )
        return f"{stream.name}|{path.name}"

    def tensor_value(self, value: Any, stream: _Stream) -> float | None:
        """The scalar a Summary.Value holds as a tensor (TF2, torch's new_style), or None."""
        if value.WhichOneof("value") != "tensor":
            return None
        tag = value.tag
        if value.HasField("metadata") and tag not in stream.plugins and len(stream.plugins) < MAX_KEYS:
            stream.plugins[tag] = value.metadata.plugin_data.plugin_name
        if stream.plugins.get(tag, "") not in _SCALAR_PLUGINS:
            return None
        return _tensor_scalar(value.tensor)

    def tail(self, path: Path, consumed: int) -> None:
        """Say why reading `path` stopped before its end, if it did: a record cut off, or a damaged one."""
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

        try:
            size = path.stat().st_size
            if consumed >= size:
                return
            with path.open("rb") as handle:
                handle.seek(consumed)
                header = handle.read(12)
                length = struct.unpack("<Q", header[:8])[0] if len(header) == 12 else -1
                framed = length >= 0 and struct.unpack("<I", header[8:])[0] == masked_crc32c(header[:8])
                cut = len(header) < 12 or (framed and consumed + 16 + length > size)
                grew = False
                if framed and not cut and length <= VERIFY_LIMIT:
                    data = handle.read(length + 4)
                    grew = struct.unpack("<I", data[-4:])[0] == masked_crc32c(data[:-4])
        except OSError as exc:
            self.damaged.append(f"{path.name} could not be checked past byte {consumed:,} ({exc.strerror})")
            return
        where = f"{path.name} (byte {consumed:,} of {size:,})"
        if cut:
            self.run.skip("cut-off last record")
            self.damaged.append(
                f"the last record of {where} is cut off: the run is still being written or the file was truncated; "
                "every complete record before it was read"
            )
        elif grew:
            self.damaged.append(f"{where} grew while it was read (a run still being written): read up to that byte")
        else:
            self.run.skip("damaged record")
            self.damaged.append(
                f"a damaged record in {where}: its CRC does not match; TensorBoard's reader stops there, so the "
                f"{size - consumed:,} bytes after it were not read"
            )


def read(target: Target, keys: set[str] | None, cap: int) -> RunData:
    path = target.path
    if path is None or not path.exists():
        raise RunError(f"{target.text!r} is not a TensorBoard directory or event file")
    notes: list[str] = []
    if path.is_file():
        if MARK not in path.name:
            raise RunError(f"{path} is not a TensorBoard event file (its name has no {MARK!r})")
        folders = [(path.parent, [path])]
    else:
        folders = list(_walk(path, MAX_DIRS, notes))
        if not folders:
            raise RunError(
                f"no TensorBoard event files (*{MARK}*) in {path} or below it; give a log directory that holds "
                "them (searched recursively) or one event file"
            )
    root = path if path.is_dir() else path.parent
    if len(folders) == 1:
        base = folders[0][0]
        run = RunData("tensorboard", str(path), base.name or str(base))
    else:
        run = RunData("tensorboard", str(path), root.name or str(root))
    for text in notes:
        run.partial.append(text)
    reader = _Reader(run, RunCollector(run, keys, cap))
    files = 0
    for folder, events in folders:
        relative = folder.relative_to(root).as_posix()
        prefix = "" if len(folders) == 1 or relative == "." else relative + "/"
        stream = _Stream(relative, prefix)
        for event_file in events:
            files += 1
            if files > MAX_FILES:
                break
            reader.file(event_file, stream)
    if files > MAX_FILES:
        total = sum(len(e) for _, e in folders)
        run.partial.append(f"only the first {MAX_FILES:,} of {total:,} event files were read")
    if len(folders) > 1:
        run.note(f"{len(folders)} directories of event files (runs): keys are prefixed with their relative path")
    damaged = reader.damaged
    run.partial.extend(damaged[:MAX_PARTIAL])
    if len(damaged) > MAX_PARTIAL:
        run.partial.append(f"{len(damaged) - MAX_PARTIAL} more event file(s) were not read to their end")
    return reader.collect.done()
