"""Reading real runs (issue 24): rows per second and peak memory of the run readers of servers/runs against the
baselines a user would reach for, measured in the same run, every measurement in a subprocess of its own.

(a) TensorBoard: one run directory of event files of a given size (default 1 GiB: 16 files of continuing steps,
8 scalar tags logged every step, as a long RL run logs them), read by servers/runs/tensorboard.py and by the
tensorboard package's EventAccumulator with size_guidance {"scalars": 0} (every point, not its default sample of
10,000 per tag). Both read the files with tensorboard's own record reader, which checks every record's CRC.
(b) JSON lines: 10M rows of verl's file-logger format {"step": N, "data": {4 keys}} read by servers/runs/verl.py,
and 10M rows of the suite's metrics.jsonl format read by servers/runs/suite.py, each against a plain loop of
json.loads over the lines that keeps nothing.

Measured per reader: seconds, points (scalar values) per second, rows (event records, lines) per second, and the
growth of its peak resident memory (ru_maxrss after reading minus after its imports). Targets checked (exit status
1 when one fails):
- every reader reads every point: its point count equals the baseline's and the count written;
- the TensorBoard reader is at least as fast as EventAccumulator (points/s ratio >= 1.0);
- the JSON-lines readers keep at most ~2 x cap points per key: their memory growth stays under MEMORY_SLACK plus
  what 2 x cap points per key take, whatever the number of rows (EventAccumulator's grows with the points);
- the JSON-lines readers read at least JSONL_SPEED_TARGET of the json.loads loop's rows per second (they parse the
  same lines and then thin, count and check every value).

The event files are written here, not by tensorboard's own writer, which computes its CRC-32C in pure Python (about
1 MB/s: 20 minutes for 1 GiB): each Event is serialised by tensorboard's protobuf (event_pb2) and framed as a
TFRecord (length, masked CRC-32C of the length, data, masked CRC-32C of the data) with a CRC computed by numpy over
many records at once; a sample is checked against tensorboard's own masked_crc32c, and both readers verify every
record. The data is written once into --cache and reused.

    python benchmarks/run_reading.py            # 1 GiB of event files, 10M rows (several minutes to write, ~15 to read)
    python benchmarks/run_reading.py --quick    # 32 MiB, 300k rows: a smoke run (about a minute)
    python benchmarks/run_reading.py --tb-bytes 268435456 --rows 2000000 --only tensorboard
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TAGS = (
    "train/reward",
    "train/kl",
    "train/entropy",
    "train/loss",
    "train/response_length",
    "train/lr",
    "perf/step_time",
    "perf/tokens",
)
VERL_KEYS = ("critic/score/mean", "response_length/mean", "actor/entropy", "timing_s/step")
SUITE_KEYS = ("loss", "lr", "tokens", "grad_norm")
TB_FILES = 16
CAP = 100_000  # servers/runs/series.py DEFAULT_CAP
MEMORY_SLACK = 64 * 2**20
JSONL_SPEED_TARGET = 0.25
CHUNK_STEPS = 20_000
RECORD_BYTES = 52  # one framed scalar Event of these tags, about


# ------------------------------------------------------------------------------------------------ writing the data


def _crc_table() -> Any:
    import numpy as np

    table = np.zeros(256, dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table[byte] = crc
    return table


def masked_crcs(rows: Any, table: Any) -> Any:
    """The masked CRC-32C (TFRecord's) of each row of a (records, length) uint8 array, computed a column at a time."""
    import numpy as np

    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for column in range(rows.shape[1]):
        crc = table[(crc ^ rows[:, column]) & 0xFF] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(0xA282EAD8)


def frame(payloads: list[bytes], table: Any) -> bytes:
    """TFRecords of `payloads`, in order: records of one length are checksummed together."""
    import numpy as np

    by_length: dict[int, list[int]] = {}
    for i, payload in enumerate(payloads):
        by_length.setdefault(len(payload), []).append(i)
    tails: list[bytes] = [b""] * len(payloads)
    heads: dict[int, bytes] = {}
    for length, where in by_length.items():
        rows = np.frombuffer(b"".join(payloads[i] for i in where), dtype=np.uint8).reshape(len(where), length)
        crcs = masked_crcs(rows, table).astype("<u4").tobytes()
        for j, i in enumerate(where):
            tails[i] = crcs[4 * j : 4 * j + 4]
        header = length.to_bytes(8, "little")
        head_crc = masked_crcs(np.frombuffer(header, dtype=np.uint8).reshape(1, 8), table).astype("<u4").tobytes()
        heads[length] = header + head_crc
    return b"".join(heads[len(p)] + p + tails[i] for i, p in enumerate(payloads))


def check_crc(table: Any) -> None:
    import numpy as np
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    for sample in (b"123456789", b"brain.Event:2", bytes(range(200))):
        mine = int(masked_crcs(np.frombuffer(sample, dtype=np.uint8).reshape(1, -1), table)[0])
        if mine != masked_crc32c(sample):
            raise SystemExit(f"the benchmark's CRC-32C disagrees with tensorboard's on {sample[:16]!r}")


def write_tensorboard(folder: Path, total_bytes: int) -> dict[str, Any]:
    """A run directory of TB_FILES event files of continuing steps, about `total_bytes` in all."""
    import numpy as np
    from tensorboard.compat.proto import event_pb2, summary_pb2

    table = _crc_table()
    check_crc(table)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = total_bytes // TB_FILES
    step = points = records = 0
    for index in range(TB_FILES):
        path = folder / f"events.out.tfevents.{1_700_000_000 + index:010d}.benchmark.1.0"
        with path.open("wb") as handle:
            head = event_pb2.Event(wall_time=1.7e9 + step, file_version="brain.Event:2").SerializeToString()
            handle.write(frame([head], table))
            written, records = handle.tell(), records + 1
            while written < per_file:
                steps = max(100, min(CHUNK_STEPS, (per_file - written) // (len(TAGS) * RECORD_BYTES) + 1))
                values = rng.standard_normal((steps, len(TAGS))).astype(np.float32).tolist()
                payloads = []
                for row in values:
                    for tag, value in zip(TAGS, row, strict=True):
                        payloads.append(
                            event_pb2.Event(
                                wall_time=1.7e9 + 0.5 * step,
                                step=step,
                                summary=summary_pb2.Summary(
                                    value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]
                                ),
                            ).SerializeToString()
                        )
                    step += 1
                data = frame(payloads, table)
                handle.write(data)
                written += len(data)
                points += len(payloads)
                records += len(payloads)
    return {
        "points": points,
        "records": records,
        "steps": step,
        "bytes": sum(p.stat().st_size for p in folder.iterdir()),
    }


def write_jsonl(path: Path, rows: int, kind: str) -> dict[str, Any]:
    keys = VERL_KEYS if kind == "verl" else SUITE_KEYS

    def lines() -> Iterator[str]:
        for i in range(rows):
            values = ", ".join(f'"{k}": {(i * 7919 + j * 104729) % 100003 / 1000.0}' for j, k in enumerate(keys))
            if kind == "verl":
                yield f'{{"step": {i}, "data": {{{values}}}}}\n'
            else:
                yield f'{{"step": {i}, "time": {1.7e9 + i:.3f}, {values}}}\n'

    with path.open("w") as handle:
        handle.writelines(lines())
    return {"points": rows * len(keys), "records": rows, "bytes": path.stat().st_size}


def cached(cache: Path, name: str, make: Any) -> tuple[Path, dict[str, Any]]:
    """`cache`/`name`, made by make(path) unless a finished copy is there (its .done file holds make's facts)."""
    path = cache / name
    done = cache / f"{name}.done"
    if done.is_file() and path.exists():
        return path, json.loads(done.read_text())
    cache.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
    started = time.perf_counter()
    print(f"# writing {path} ...", flush=True)
    facts = make(path)
    print(f"# written in {time.perf_counter() - started:.0f} s: {facts}", flush=True)
    done.write_text(json.dumps(facts))
    return path, facts


# ------------------------------------------------------------------------------------------------ one measurement


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def _resident() -> int:
    """Resident memory now (Linux /proc/self/statm); the peak so far where there is no /proc."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _maxrss()


def measure(kind: str, path: Path, cap: int) -> dict[str, Any]:
    """Read `path` with reader `kind` in this process; its counts, seconds and memory growth."""
    import tensorboard.backend.event_processing.event_file_loader  # imported before the baseline RSS
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.proto import event_pb2  # noqa: F401

    from servers.runs import suite, tensorboard, verl
    from servers.runs.registry import Target

    readers = {"tensorboard": tensorboard.read, "verl": verl.read, "suite": suite.read}
    base = _resident()
    started = time.perf_counter()
    if kind in readers:
        run = readers[kind](Target(str(path), path=path), None, cap)
        points = sum(s.read for s in run.series.values())
        kept = sum(len(s) for s in run.series.values())
        records, extra = run.rows_read, {"partial": run.partial, "skipped": run.rows_skipped}
    elif kind == "event_accumulator":
        accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
        accumulator.Reload()
        points = kept = sum(len(accumulator.Scalars(t)) for t in accumulator.Tags()["scalars"])
        records, extra = points, {}
    elif kind == "json_loads":
        points = records = 0
        with path.open("rb") as handle:
            for line in handle:
                row = json.loads(line)
                records += 1
                points += len(row["data"]) if "data" in row else len(row) - 2
        kept, extra = 0, {}
    else:
        raise SystemExit(f"unknown reader {kind!r}")
    seconds = time.perf_counter() - started
    return {"points": points, "kept": kept, "records": records, "seconds": seconds, "growth": _maxrss() - base, **extra}


def in_subprocess(kind: str, path: Path, cap: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", kind, str(path), "--cap", str(cap)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measuring {kind} on {path} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_of(repeat: int, kinds: tuple[str, str], path: Path, cap: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each reader of `kinds` run `repeat` times, interleaved (so that a busy spell of the machine falls on both);
    the fastest run of each, with the largest memory growth seen."""
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for _ in range(max(1, repeat)):
        for kind in kinds:
            results[kind].append(in_subprocess(kind, path, cap))
    best = []
    for kind in kinds:
        fastest = dict(min(results[kind], key=lambda r: r["seconds"]))
        fastest["growth"] = max(r["growth"] for r in results[kind])
        best.append(fastest)
    return best[0], best[1]


# ------------------------------------------------------------------------------------------------ the table


def row(name: str, result: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    rate = result["points"] / result["seconds"]
    ratio = f"{rate / (baseline['points'] / baseline['seconds']):.2f}" if baseline else "1.00"
    return (
        f"| {name} | {result['points']:,} | {result['kept']:,} | {result['seconds']:.1f} | {rate:,.0f} | "
        f"{result['records'] / result['seconds']:,.0f} | {ratio} | {result['growth'] / 2**20:,.0f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 MiB of event files and 300k rows: a smoke run")
    parser.add_argument("--tb-bytes", type=int, default=2**30, help="size of the TensorBoard directory (1 GiB)")
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of each JSON-lines file (10M)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each reader, interleaved; the fastest counts")
    parser.add_argument("--cap", type=int, default=CAP, help="points kept per key by the readers")
    parser.add_argument("--only", choices=("tensorboard", "jsonl"), help="one half of the benchmark")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "llm-infra-mcp-run-reading")
    parser.add_argument("--measure", nargs=2, metavar=("READER", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], Path(args.measure[1]), args.cap)))
        return 0
    if args.quick:
        args.tb_bytes, args.rows = 32 * 2**20, 300_000
    print(f"# run reading benchmark (Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs)")
    print(
        f"# cap {args.cap:,} points per key; MiB: peak RSS while reading minus RSS before (after imports); "
        f"s: the fastest of {args.repeat} interleaved run(s) of each"
    )
    print("| reader | points | kept | s | points/s | rows/s | ratio | MiB |")
    print("|---|---|---|---|---|---|---|---|")
    failures: list[str] = []
    bound = MEMORY_SLACK
    if args.only in (None, "tensorboard"):
        folder, facts = cached(args.cache, f"tb-{args.tb_bytes}", lambda p: write_tensorboard(p, args.tb_bytes))
        print(f"# TensorBoard: {facts['bytes'] / 2**20:,.0f} MiB, {facts['points']:,} points, {len(TAGS)} tags")
        accumulator, ours = best_of(args.repeat, ("event_accumulator", "tensorboard"), folder, args.cap)
        print(row("EventAccumulator (scalars: 0)", accumulator, None), flush=True)
        print(row("servers/runs/tensorboard.py", ours, accumulator), flush=True)
        if not ours["points"] == accumulator["points"] == facts["points"]:
            failures.append(f"TensorBoard points: ours {ours['points']:,}, EventAccumulator {accumulator['points']:,}")
        ratio = (ours["points"] / ours["seconds"]) / (accumulator["points"] / accumulator["seconds"])
        if ratio < 1.0:
            failures.append(f"the TensorBoard reader is slower than EventAccumulator ({ratio:.2f}x)")
        limit = bound + len(TAGS) * 2 * args.cap * 24
        if ours["growth"] > limit:
            failures.append(
                f"the TensorBoard reader grew by {ours['growth'] / 2**20:,.0f} MiB (> {limit / 2**20:,.0f})"
            )
        if ours.get("partial"):
            failures.append(f"the TensorBoard read is partial: {ours['partial']}")
    if args.only in (None, "jsonl"):
        for kind, keys in (("verl", VERL_KEYS), ("suite", SUITE_KEYS)):
            path, facts = cached(
                args.cache, f"{kind}-{args.rows}.jsonl", lambda p, k=kind: write_jsonl(p, args.rows, k)
            )
            print(
                f"# {kind} JSON lines: {facts['bytes'] / 2**20:,.0f} MiB, {facts['records']:,} rows, {len(keys)} keys"
            )
            loop, ours = best_of(args.repeat, ("json_loads", kind), path, args.cap)
            print(row("json.loads loop", loop, None), flush=True)
            print(row(f"servers/runs/{kind}.py", ours, loop), flush=True)
            if not ours["points"] == loop["points"] == facts["points"]:
                failures.append(f"{kind} points: ours {ours['points']:,}, json.loads {loop['points']:,}")
            ratio = (ours["records"] / ours["seconds"]) / (loop["records"] / loop["seconds"])
            if ratio < JSONL_SPEED_TARGET:
                failures.append(f"the {kind} reader reads {ratio:.2f}x the json.loads loop's rows/s")
            limit = bound + len(keys) * 2 * args.cap * 24
            if ours["growth"] > limit:
                failures.append(f"the {kind} reader grew by {ours['growth'] / 2**20:,.0f} MiB (> {limit / 2**20:,.0f})")
    print(
        "# ratio: points/s over the baseline above it; kept: points the reader holds (all, or 2 x cap per key at most)"
    )
    for failure in failures:
        print(f"FAIL: {failure}")
    print("all targets met" if not failures else f"{len(failures)} target(s) missed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
