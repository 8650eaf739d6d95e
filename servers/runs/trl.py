"""TRL (and any transformers Trainer) runs: trainer_state.json's log_history, one dict per logged step.

What is read: an output directory holding trainer_state.json (Trainer.save_state writes it at the end), else its
latest checkpoint-N/trainer_state.json (written at each save), or the file itself. log_history entries carry a
"step" and the values logged at it: GRPO's reward, reward_std, rewards/<fn>/mean, completions/mean_length, kl,
entropy, num_tokens, step_time, loss, learning_rate, grad_norm; eval entries eval_*; the last one train_runtime,
train_samples_per_second, train_loss. Every numeric key is a series under its own name; entries without a step
are skipped and counted; steps going back (a log_history spliced from two attempts) are restarts (series.py).

Bounded: the file is one JSON document, so it is refused above MAX_STATE_BYTES. NaN and Infinity literals (which
json.dumps writes) are counted as non-finite, not kept.

Wall time: log_history has none. When the output directory has TensorBoard event files (report_to tensorboard
writes them under runs/), each step's wall time is taken from them (the earliest event at that step) through the
tensorboard reader; else the times are unknown (nan) and the mean step time is given as a fact, train_runtime /
global_step. A run still in progress with no trainer_state.json yet is read from those event files alone (keys
without the Trainer's "train/" prefix), and said to be partial; detection leaves such a directory to the
tensorboard reader, so this needs the reader named (a launched job's declared run source names it).

Facts: max_steps, num_train_epochs, global_step, logging_steps, train_batch_size (per device),
num_input_tokens_seen; train_runtime from the last entry; gradient_accumulation_steps, GRPO's sizes and device
"cpu" (use_cpu) from the arguments the Trainer logs as TensorBoard text; the global batch from the Trainer's count
of samples, and from it num_processes (`_batch_fact`); from the saved model's config.json: model_type, hidden_size,
num_hidden_layers, vocab_size, intermediate_size; params counted from model.safetensors' header (shapes only, the
weights are not read), else estimated from config.json (PARAMS_FORMULA). The model is the checkpoint's, else the
output directory's, else initial-model/ (the random weights the trl-grpo recipe saves). training_args.bin is a
pickle and is never opened.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from servers.core.refs import resolve
from servers.runs.jsonlines import step_of
from servers.runs.registry import Target
from servers.runs.series import RunCollector, RunData, RunError, number

STATE = "trainer_state.json"
MAX_STATE_BYTES = 32 * 2**20  # one JSON document, parsed whole: ~30k logged steps of a GRPO run (~1 kB each)
MAX_CONFIG_BYTES = 1 << 20
MAX_HEADER_BYTES = 16 * 2**20  # a safetensors header lists names, dtypes and shapes: a few MB for the largest models
MAX_SHARDS = 512
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STATE_FACTS = ("max_steps", "num_train_epochs", "global_step", "logging_steps", "train_batch_size")
CONFIG_FACTS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
TB_PREFIX = "train/"
MAX_ARGS_EVENTS = 20  # the Trainer logs its arguments as text in the first events of a file
ARGS_FACTS = ("gradient_accumulation_steps", "per_device_train_batch_size", "num_generations", "max_completion_length")
ACCEPTS = "a TRL/transformers Trainer output directory, a checkpoint-N folder, or a trainer_state.json file"


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint-N folder with the largest N that holds a trainer_state.json, or None."""
    found: list[tuple[int, Path]] = []
    try:
        for child in directory.iterdir():
            m = _CHECKPOINT.match(child.name)
            if m and (child / STATE).is_file():
                found.append((int(m.group(1)), child))
    except OSError:
        return None
    return max(found)[1] if found else None


def state_file(path: Path) -> Path | None:
    """The trainer_state.json that `path` (the file, an output directory or a checkpoint) stands for."""
    if path.is_file():
        return path if path.name == STATE else None
    if (path / STATE).is_file():
        return path / STATE
    checkpoint = latest_checkpoint(path)
    return checkpoint / STATE if checkpoint is not None else None


def _event_dir(directory: Path) -> Path | None:
    runs = directory / "runs"
    if runs.is_dir():
        try:
            if any("tfevents" in p.name for p in runs.rglob("*") if p.is_file()):
                return runs
        except OSError:
            return None
    return None


def detect(target: Target) -> bool:
    path = target.path
    if path is None:
        return False
    return state_file(path) is not None  # a run with event files only is the tensorboard reader's, unless named


def _load_state(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise RunError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    if size > MAX_STATE_BYTES:
        raise RunError(
            f"{path} is {size / 2**20:.1f} MiB; a trainer_state.json is read whole and is accepted up to "
            f"{MAX_STATE_BYTES // 2**20} MiB (raise logging_steps, or read the run's TensorBoard event files)"
        )
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise RunError(
            f"{path} is not valid JSON ({str(exc)[:120]}): cut off while being written, or damaged; accepted: the "
            "trainer_state.json a transformers Trainer writes (an object with a log_history list)"
        ) from None
    except OSError as exc:
        raise RunError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    if not isinstance(data, dict) or not isinstance(data.get("log_history"), list):
        raise RunError(
            f"{path} has no log_history list; accepted: the trainer_state.json a transformers Trainer writes (an "
            'object with "log_history": [{"step": N, ...}, ...])'
        )
    return data


def read(target: Target, keys: set[str] | None, cap: int) -> RunData:
    path = target.path
    if path is None:
        raise RunError(f"{target.text!r} is not a path; a TRL run is an output directory or its trainer_state.json")
    found = state_file(path)
    if found is None:
        if path.is_dir() and _event_dir(path) is not None:
            return _read_events_only(path, keys, cap)
        if path.is_file():
            raise RunError(f"{path} is not a trainer_state.json; accepted: {ACCEPTS}")
        raise RunError(f"{path} holds no trainer_state.json (nor checkpoint-N/trainer_state.json); accepted: {ACCEPTS}")
    state = _load_state(found)
    run_dir = found.parent
    output_dir = run_dir.parent if _CHECKPOINT.match(run_dir.name) else run_dir
    run = RunData("trl", str(found), output_dir.name or str(output_dir))
    if path.is_dir() and run_dir != path:
        run.note(f"read {run_dir.name}/{STATE}, the latest checkpoint's (the output directory has none of its own)")
    for name in STATE_FACTS:
        value = state.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            run.fact(name, value, f"{found.name}: {name}")
    tokens = state.get("num_input_tokens_seen")
    if isinstance(tokens, int) and tokens > 0:
        run.fact("num_input_tokens_seen", tokens, f"{found.name}: num_input_tokens_seen")
    entries = _entries(state["log_history"], run)
    times = _wall_times(output_dir, entries, run)
    collect = RunCollector(run, keys, cap)
    for step, entry in entries:
        at = times.get(step, math.nan)
        for key, raw in entry.items():
            if key == "step":
                continue
            value = number(raw)
            if value is None:
                collect.seen(str(key))
                continue
            collect.add(str(key), step, at, value)
            if key == "train_runtime" and math.isfinite(value):
                run.fact("train_runtime", value, f"{found.name}: log_history's last entry, train_runtime (s)")
    _step_time_facts(run, bool(times))
    _args_facts(output_dir, run)
    _batch_fact(run, entries)
    _model_facts(run_dir, output_dir, run)
    return collect.done()


def _entries(history: list[Any], run: RunData) -> list[tuple[int, dict[str, Any]]]:
    entries: list[tuple[int, dict[str, Any]]] = []
    for entry in history:
        run.rows_read += 1
        if not isinstance(entry, dict):
            run.skip("log_history entry that is not an object")
            continue
        step = step_of(entry.get("step"))
        if step is None:
            run.skip("log_history entry without an integer step")
            continue
        entries.append((step, entry))
    return entries


def _step_time_facts(run: RunData, timed: bool) -> None:
    runtime, steps = run.facts.get("train_runtime"), run.facts.get("global_step")
    if not timed:
        run.note(
            "per-step wall time is unknown: trainer_state.json has none and the output directory has no TensorBoard "
            "event files (report_to tensorboard writes them)"
        )
        if isinstance(runtime, float) and isinstance(steps, int) and steps > 0:
            run.fact("mean_step_s", runtime / steps, "train_runtime / global_step")


def _batch_fact(run: RunData, entries: list[tuple[int, dict[str, Any]]]) -> None:
    """The global batch (samples per optimizer step over every process and accumulation step), from the Trainer's
    own count of samples in its last entry: train_samples_per_second x train_runtime / max_steps. Left out unless
    it comes within 2% of a whole number (both are rounded, and a run set by epochs counts samples its own way)."""
    last = next((e for _, e in reversed(entries) if "train_samples_per_second" in e), None)
    steps = run.facts.get("max_steps")
    if last is None or not isinstance(steps, int) or steps <= 0:
        return
    rate, runtime = number(last.get("train_samples_per_second")), number(last.get("train_runtime"))
    if rate is None or runtime is None or not (math.isfinite(rate) and math.isfinite(runtime)):
        return
    batch = rate * runtime / steps
    whole = round(batch)
    if whole >= 1 and abs(batch - whole) <= 0.02 * whole:
        run.fact("global_batch_size", whole, "train_samples_per_second x train_runtime / max_steps (log_history)")
        per_device, accumulation = run.facts.get("train_batch_size"), run.facts.get("gradient_accumulation_steps")
        known = isinstance(per_device, int) and isinstance(accumulation, int) and per_device > 0 and accumulation > 0
        if known and whole % (per_device * accumulation) == 0:
            run.fact(
                "num_processes",
                whole // (per_device * accumulation),
                "global_batch_size / (train_batch_size x gradient_accumulation_steps)",
            )


def _args_facts(output_dir: Path, run: RunData) -> None:
    """The training arguments the Trainer logs as TensorBoard text ("args", its TrainingArguments as JSON: the
    readable copy of training_args.bin, which is a pickle and never opened), from the newest event file: the
    first MAX_ARGS_EVENTS events only."""
    events = _event_dir(output_dir)
    if events is None:
        return
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError:
        return
    files = sorted((p for p in itertools.islice(events.rglob("*tfevents*"), 1000) if p.is_file()), key=_mtime)
    if not files:
        return
    try:
        for event in itertools.islice(EventFileLoader(str(files[-1])).Load(), MAX_ARGS_EVENTS):
            for value in event.summary.value:
                if value.tag == "args/text_summary" and value.tensor.string_val:
                    raw = value.tensor.string_val[0]
                    args = json.loads(raw) if len(raw) <= MAX_CONFIG_BYTES else None
                    if isinstance(args, dict):
                        where = f"the Trainer's arguments logged in {files[-1].name} (TensorBoard text 'args')"
                        for name in ARGS_FACTS:
                            found = args.get(name)
                            if isinstance(found, int) and not isinstance(found, bool):
                                run.fact(name, found, where)
                        if args.get("use_cpu") is True:  # False proves nothing: a machine without GPUs runs on CPU
                            run.fact("device", "cpu", f"use_cpu in {where}")
                    return
    except Exception as exc:  # a damaged event file: the facts are extras, the read goes on without them
        run.note(f"the Trainer's arguments could not be read from {files[-1].name}: {type(exc).__name__}")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _wall_times(output_dir: Path, entries: list[tuple[int, dict[str, Any]]], run: RunData) -> dict[int, float]:
    """{step: wall time} from the output directory's TensorBoard event files (the earliest event at each step of
    the three keys logged most often, as the Trainer names them there: train/KEY), empty when there are none or
    they cannot be read (said in a note). Bounded: those keys, at most one point per logged entry each."""
    events = _event_dir(output_dir)
    if events is None or not entries:
        return {}
    counts: dict[str, int] = {}
    for _, entry in entries:
        for key, raw in entry.items():
            if key != "step" and number(raw) is not None:
                counts[key] = counts.get(key, 0) + 1
    common = sorted(counts, key=lambda k: -counts[k])[:3]
    wanted = {TB_PREFIX + k for k in common} | set(common)
    try:
        tb = resolve("servers.runs.tensorboard:read")(Target(str(events), path=events), wanted, len(entries) + 2)
    except (ImportError, AttributeError) as exc:
        run.note(f"the TensorBoard event files under {events} were not read for wall times ({exc})")
        return {}
    except ValueError as exc:  # RunError, or an InputError of the reader
        run.note(f"the TensorBoard event files under {events} could not be read for wall times: {exc}")
        return {}
    times: dict[int, float] = {}
    for series in tb.series.values():
        for step, at in zip(series.steps, series.times, strict=True):
            if math.isfinite(at) and (step not in times or at < times[step]):
                times[step] = at
    if times:
        run.fact("wall_time_source", str(events), "TensorBoard event files: the earliest event at each step")
    return times


def _read_events_only(output_dir: Path, keys: set[str] | None, cap: int) -> RunData:
    """A run with no trainer_state.json yet: its TensorBoard event files, with the Trainer's train/ prefix cut."""
    events = _event_dir(output_dir)
    assert events is not None
    wanted = None if keys is None else {TB_PREFIX + k for k in keys} | keys
    tb = resolve("servers.runs.tensorboard:read")(Target(str(events), path=events), wanted, cap)
    run = RunData("trl", str(output_dir), output_dir.name or str(output_dir))
    run.partial.append(
        f"{output_dir} has no trainer_state.json yet (the Trainer writes it at each checkpoint and at the end): "
        "read from its TensorBoard event files under runs/, the run is still being written or stopped early"
    )
    run.series = {k.removeprefix(TB_PREFIX): s for k, s in tb.series.items()}
    for series in run.series.values():
        series.key = series.key.removeprefix(TB_PREFIX)
    run.keys = [k.removeprefix(TB_PREFIX) for k in tb.keys]
    run.keys_dropped, run.restarts = tb.keys_dropped, tb.restarts
    run.rows_read, run.rows_skipped, run.skipped_reasons = tb.rows_read, tb.rows_skipped, tb.skipped_reasons
    run.partial.extend(tb.partial)
    for note in tb.notes:
        run.note(note)
    _model_facts(output_dir, output_dir, run)
    return run


def _json_object(path: Path, limit: int) -> dict[str, Any] | None:
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _model_facts(run_dir: Path, output_dir: Path, run: RunData) -> None:
    """config.json and the parameter count of the model saved beside the state (the checkpoint's, else the
    output directory's, else the initial model's)."""
    for folder in dict.fromkeys((run_dir, output_dir, output_dir / "initial-model")):
        config = _json_object(folder / "config.json", MAX_CONFIG_BYTES)
        if config is None:
            continue
        where = f"{folder.relative_to(output_dir) if folder != output_dir else '.'}/config.json"
        for name in CONFIG_FACTS:
            value = config.get(name)
            if isinstance(value, (int, str)) and not isinstance(value, bool):
                run.fact(name, value, where)
        counted = count_safetensors(folder)
        if counted is not None:
            run.fact("params", counted[0], f"{counted[1]} header (tensor shapes summed)")
        else:
            estimate = estimate_params(config)
            if estimate is not None:
                run.fact("params", estimate, f"{where}, estimated: {PARAMS_FORMULA}")
        return


def _header(path: Path) -> dict[str, Any] | None:
    """A safetensors file's JSON header (8-byte little-endian length, then JSON), bounded; None if malformed."""
    try:
        with path.open("rb") as handle:
            head = handle.read(8)
            if len(head) != 8:
                return None
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                return None
            data = json.loads(handle.read(length))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _tensor_count(header: dict[str, Any]) -> int | None:
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        total += math.prod(shape)
    return total


def count_safetensors(folder: Path) -> tuple[int, str] | None:
    """(parameters, which file) from model.safetensors, or the shards its index names; None if absent or
    malformed. Only the headers are read."""
    single = folder / "model.safetensors"
    if single.is_file():
        header = _header(single)
        count = _tensor_count(header) if header is not None else None
        return (count, "model.safetensors") if count is not None else None
    index = _json_object(folder / "model.safetensors.index.json", MAX_CONFIG_BYTES)
    weight_map = index.get("weight_map") if index is not None else None
    if not isinstance(weight_map, dict):
        return None
    shards = sorted({str(v) for v in weight_map.values()})
    if not shards or len(shards) > MAX_SHARDS or any("/" in s or "\\" in s or s.startswith(".") for s in shards):
        return None
    total = 0
    for shard in shards:
        header = _header(folder / shard)
        count = _tensor_count(header) if header is not None else None
        if count is None:
            return None
        total += count
    return total, f"{len(shards)} safetensors shard(s)"


PARAMS_FORMULA = (
    "L x (2h x q + 2h x kv + 3h x i + 2h) + V x h x (2 untied, 1 tied) + h, plus L x (q + 2kv) attention biases "
    "for qwen2 and L x (q + 2kv + h) with attention_bias (a gated-MLP decoder: L layers, width h, q = heads x head "
    "dim, kv = key/value heads x head dim, i intermediate size, V vocabulary)"
)


def estimate_params(config: dict[str, Any]) -> int | None:
    """Parameters of a Llama-style decoder from its config.json (PARAMS_FORMULA: exact for Llama and Qwen2, an
    estimate for other gated-MLP decoders), or None when a size is missing."""
    sizes = [config.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return None
    h, layers, vocab, inter = (int(v) for v in sizes)  # type: ignore[arg-type]
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or (h // heads if isinstance(heads, int) and heads > 0 else None)
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int):
        return None
    if not isinstance(heads, int):
        return None
    q, kv = heads * head_dim, kv_heads * head_dim
    tied = config.get("tie_word_embeddings") is True  # Llama's and Qwen2's default is untied
    biases = (
        q + 2 * kv + h
        if config.get("attention_bias") is True
        else q + 2 * kv
        if config.get("model_type") == "qwen2"
        else 0
    )
    return layers * (2 * h * q + 2 * h * kv + 3 * h * inter + 2 * h + biases) + vocab * h * (1 if tied else 2) + h
