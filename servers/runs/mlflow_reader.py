"""MLflow runs, read through the mlflow client (mlflow.tracking.MlflowClient), imported only when a run is read.

Sources (detection parses the text or looks at a directory listing / a file's first bytes; it never connects):

- a tracking server: ``mlflow+http://HOST:PORT[/PREFIX]/RUN_ID`` (or mlflow+https), or the UI address people copy,
  ``http://HOST:PORT/#/experiments/EXP/runs/RUN_ID``. The host must be one of the allowed tracking hosts
  (Target.check_host, setting tracking_hosts); it is checked before anything is imported or sent.
- a local store inside the roots: a file store directory (``mlruns/``: experiment folders with meta.yaml), one of
  its experiment or run folders, or an SQLite database (the ``mlflow.db`` file, or ``sqlite:///mlflow.db``).

``?run=RUN_ID`` picks a run in any form; without a run id the latest run (of the experiment, when one is named)
is read and a note says which and lists others. The metric history of each key is read in pages of PAGE points,
the tracking server's limit per request (GET_METRIC_HISTORY_MAX_RESULTS, 25,000 in MLflow 3), so every point comes
back however long the run, and at most one page is held at a time. A key logged without steps (every point at
step 0, mlflow.log_metric's default) is read in timestamp order with its point's index as its step, and said.
MLflow records step and timestamp (ms) with every value: time = timestamp / 1000.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from servers.runs.registry import Target
from servers.runs.series import MAX_KEYS, RunCollector, RunData, RunError

PAGE = 25_000  # points per metric-history request: the tracking server's limit (MLflow 3)
MAX_PAGES = 2_000  # pages read per key (50 million points); past it the read is partial
MAX_LISTED = 10  # other runs listed in the note when one is chosen
MAX_EXPERIMENTS = 500  # experiments searched for the latest run
MAX_META_BYTES = 1 << 16
MAX_LISTING = 2_000  # directory entries looked at when detecting a file store
REQUEST_TIMEOUT_S = "10"  # MLFLOW_HTTP_REQUEST_TIMEOUT unless set: a server that does not answer fails in seconds
REQUEST_RETRIES = "1"  # MLFLOW_HTTP_REQUEST_MAX_RETRIES unless set (MLflow's default of 7 backs off for minutes)
SQLITE_MAGIC = b"SQLite format 3\x00"
MLFLOW_TABLES = frozenset({"experiments", "runs", "metrics", "params"})
GENERATED_ID = re.compile(r"[0-9a-f]{32}")  # the run ids MLflow generates (uuid4 hex)
GIVEN_ID = re.compile(r"[A-Za-z0-9][\w-]{0,255}")  # what MLflow accepts as a run or experiment id
ACCEPTED = (
    "accepted: mlflow+http://HOST:PORT/RUN_ID, the UI address http://HOST:PORT/#/experiments/EXP/runs/RUN_ID, a "
    "local store (an mlruns/ directory, one of its experiment or run folders, an mlflow.db file or "
    "sqlite:///mlflow.db), each optionally with ?run=RUN_ID"
)

# MLflow params that say how the run was sized, by their name or its last part (verl logs its config flattened
# with "/": trainer/n_gpus_per_node; others with "."): fact name, integer?
PARAM_FACTS: dict[str, tuple[str, bool]] = {
    "actor_rollout_ref/model/path": ("model", False),
    "actor_rollout_ref.model.path": ("model", False),
    "n_gpus_per_node": ("gpus_per_node", True),
    "gpus_per_node": ("gpus_per_node", True),
    "nproc_per_node": ("gpus_per_node", True),
    "nnodes": ("nnodes", True),
    "num_nodes": ("nnodes", True),
    "num_machines": ("nnodes", True),
    "world_size": ("gpus", True),
    "num_processes": ("gpus", True),
    "n_gpus": ("gpus", True),
    "num_gpus": ("gpus", True),
    "max_steps": ("max_steps", True),
    "total_training_steps": ("max_steps", True),
    "num_parameters": ("params", True),
    "model_name_or_path": ("model", False),
    "model_name": ("model", False),
    "model_id": ("model", False),
}


@dataclass(frozen=True)
class Source:
    """Where the run lives: the tracking URI the client is given, the run (or experiment) asked for, and how the
    source is shown."""

    tracking_uri: str
    shown: str
    remote: bool
    run_id: str | None = None
    experiment_id: str | None = None
    file_store: bool = False


def detect(target: Target) -> bool:
    if target.uri is not None:
        try:
            return _server_source(target.uri) is not None
        except RunError:
            return True  # an MLflow form with a bad part: read() says what is wrong
    path = target.path
    if path is None:
        return False
    if path.is_file():
        return _is_mlflow_sqlite(path)
    return path.is_dir() and _store_layout(path) is not None


def read(target: Target, keys: set[str] | None, cap: int) -> RunData:
    source = _source(target)
    if source.remote:
        target.check_host()  # before mlflow is imported or a byte is sent
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    _bound_requests(source)
    try:
        client = MlflowClient(tracking_uri=source.tracking_uri)
        run_id, chosen = (source.run_id, None) if source.run_id else _latest(client, source)
        found = client.get_run(run_id)
        run = _run_data(found, source, chosen)
        _read_metrics(client, found, run, keys, cap)
    except (MlflowException, OSError) as exc:
        raise RunError(_explain(exc, source, source.run_id)) from None
    return run


def _source(target: Target) -> Source:
    if target.uri is not None:
        found = _server_source(target.uri)
        if found is None:
            raise RunError(f"{target.text!r} is not an MLflow run source; {ACCEPTED}")
        return found
    path = target.path
    if path is None:
        raise RunError(f"{target.text!r} is not an MLflow run source; {ACCEPTED}")
    run_id = _query_id(target.text, "run")
    if path.is_file():
        if not _is_mlflow_sqlite(path):
            raise RunError(f"{path} is not an MLflow SQLite database (no MLflow tables); {ACCEPTED}")
        return Source(f"sqlite:///{path}", str(path), False, run_id)
    layout = _store_layout(path) if path.is_dir() else None
    if layout is None:
        raise RunError(f"{path} is not an MLflow store (no experiment folders with meta.yaml); {ACCEPTED}")
    root, experiment_id, folder_run = layout
    return Source(root.as_uri(), str(path), False, run_id or folder_run, experiment_id, file_store=True)


def _server_source(uri: str) -> Source | None:
    """The Source for a tracking-server URI, None for a URI of another kind; RunError for an MLflow URI with a bad
    part (a port, credentials, a run id MLflow would refuse)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("mlflow+http", "mlflow+https"):
        segments = [s for s in parts.path.split("/") if s]
        run_id = segments.pop() if segments and GENERATED_ID.fullmatch(segments[-1]) else None
        experiment_id = None
        prefix = "/".join(segments)
        base_scheme = scheme.removeprefix("mlflow+")
    elif scheme in ("http", "https") and parts.fragment.startswith("/experiments/"):
        segments = [s for s in parts.fragment.split("?")[0].split("/") if s]
        experiment_id = _checked_id(segments[1], "experiment", uri) if len(segments) > 1 else None
        run_id = segments[3] if len(segments) > 3 and segments[2] == "runs" else None
        prefix = parts.path.strip("/")
        base_scheme = scheme
    else:
        return None
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise RunError(
            f"{uri!r}: credentials in the URI are not accepted (set MLFLOW_TRACKING_USERNAME/PASSWORD or "
            "MLFLOW_TRACKING_TOKEN for the server); " + ACCEPTED
        )
    if not re.fullmatch(r"[A-Za-z0-9._:\[\]-]+", parts.netloc or "-"):
        raise RunError(f"{uri!r}: the host part may hold only a host name or address and a port; {ACCEPTED}")
    if prefix and not re.fullmatch(r"[A-Za-z0-9._~/-]{1,200}", prefix):
        raise RunError(f"{uri!r}: the path before the run id may hold only letters, digits and ._~/-; {ACCEPTED}")
    try:
        port = parts.port
    except ValueError:
        raise RunError(f"{uri!r}: the port is not a number in 1-65535; {ACCEPTED}") from None
    if not parts.hostname or port == 0:
        raise RunError(f"{uri!r}: no host, or port 0; {ACCEPTED}")
    run_id = _query_id(uri, "run") or (_checked_id(run_id, "run", uri) if run_id else None)
    base = f"{base_scheme}://{parts.netloc}" + (f"/{prefix}" if prefix else "")
    shown = base + (f"/{run_id}" if run_id else "")
    return Source(base, shown, True, run_id, experiment_id)


def _query_id(text: str, name: str) -> str | None:
    query = urlsplit(text).query if "?" in text else ""
    values = parse_qs(query).get(name)
    return _checked_id(values[-1], name, text) if values else None


def _checked_id(value: str, what: str, text: str) -> str:
    if not GIVEN_ID.fullmatch(value):
        raise RunError(f"{text!r}: {value[:80]!r} is not an MLflow {what} id (letters, digits, _ and -); {ACCEPTED}")
    return value


def _is_mlflow_sqlite(path: Path) -> bool:
    """An SQLite file holding MLflow's tables (opened read-only: never created, never migrated here)."""
    try:
        with path.open("rb") as handle:
            if handle.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                return False
        connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=1.0)
        try:
            rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            connection.close()
    except (OSError, sqlite3.Error):
        return False
    return MLFLOW_TABLES <= {row[0] for row in rows}


def _meta(folder: Path) -> dict[str, str]:
    """meta.yaml's top-level `key: value` lines (MLflow writes flat YAML), at most MAX_META_BYTES read."""
    try:
        with (folder / "meta.yaml").open("rb") as handle:
            text = handle.read(MAX_META_BYTES).decode("utf-8", "replace")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key and not key[0].isspace():
            out[key.strip()] = value.strip().strip("'\"")
    return out


def _store_layout(path: Path) -> tuple[Path, str | None, str | None] | None:
    """(store root, experiment id, run id) for a file store, one of its experiment folders or one of its run
    folders; None when `path` is none of them."""
    meta = _meta(path)
    if "run_id" in meta or "run_uuid" in meta:
        run_id = meta.get("run_id") or meta.get("run_uuid") or path.name
        return path.parent.parent, meta.get("experiment_id") or path.parent.name, run_id
    if "experiment_id" in meta and "artifact_location" in meta:
        return path.parent, meta["experiment_id"], None
    try:
        with os.scandir(path) as entries:
            for number, entry in enumerate(entries):
                if number >= MAX_LISTING:
                    break
                if entry.is_dir() and "experiment_id" in _meta(Path(entry.path)):
                    return path, None, None
    except OSError:
        return None
    return None


def _bound_requests(source: Source) -> None:
    """Bound the client's HTTP waits (unless the environment sets them) and let it open a file store, which MLflow
    3 refuses unless MLFLOW_ALLOW_FILE_STORE is set (it is kept for reading old ./mlruns folders)."""
    if source.remote:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", REQUEST_TIMEOUT_S)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", REQUEST_RETRIES)
    if source.file_store:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def _latest(client: Any, source: Source) -> tuple[str, str]:
    """The latest run (of the experiment asked for, else of every experiment searched) and a note saying so."""
    if source.experiment_id is not None:
        experiment_ids = [source.experiment_id]
        more = False
    else:
        experiments = client.search_experiments(max_results=MAX_EXPERIMENTS + 1)
        experiment_ids = [e.experiment_id for e in experiments[:MAX_EXPERIMENTS]]
        more = len(experiments) > MAX_EXPERIMENTS
    runs = (
        client.search_runs(experiment_ids, order_by=["attributes.start_time DESC"], max_results=MAX_LISTED + 1)
        if experiment_ids
        else []
    )
    where = f"experiment {source.experiment_id}" if source.experiment_id is not None else source.shown
    if not runs:
        if source.experiment_id is not None:
            _check_experiment(client, source)
        raise RunError(f"{where} holds no MLflow run; {ACCEPTED}")
    first = runs[0]
    if len(runs) == 1:
        return first.info.run_id, f"no run id given: read the only run of {where}"
    others = ", ".join(f"{r.info.run_id} ({r.info.run_name or 'no name'})" for r in runs[1 : MAX_LISTED + 1])
    shown = "at least " if len(runs) > MAX_LISTED or more else ""
    return first.info.run_id, (
        f"no run id given: read the latest of {shown}{len(runs)} runs of {where}, {first.info.run_id} "
        f"({first.info.run_name or 'no name'}); others, latest first: {others}"
        + (f" (only the first {MAX_EXPERIMENTS} experiments were searched)" if more else "")
        + "; pick one with ?run=RUN_ID"
    )


def _check_experiment(client: Any, source: Source) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_experiment(source.experiment_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
            raise RunError(f"{source.shown}: no MLflow experiment {source.experiment_id!r} there; {ACCEPTED}") from None
        raise


def _run_data(found: Any, source: Source, chosen: str | None) -> RunData:
    info = found.info
    name = info.run_name or found.data.tags.get("mlflow.runName") or info.run_id
    run = RunData("mlflow", _canonical(source, info.run_id), name)
    if chosen:
        run.note(chosen)
    run.fact("run_id", info.run_id, "the MLflow run")
    run.fact("experiment_id", info.experiment_id, "the MLflow run")
    if info.status in ("RUNNING", "SCHEDULED"):
        run.partial.append(f"the run is still running (MLflow status {info.status}): what was logged so far")
    elif info.status in ("FAILED", "KILLED"):
        run.note(f"the run ended {info.status} in MLflow: its metrics stop where it stopped")
    _param_facts(found.data.params, run)
    return run


def _canonical(source: Source, run_id: str) -> str:
    """The source of this one run in a form this reader reads back: mlflow+http://HOST:PORT/RUN_ID for a server,
    the store's URI with ?run=RUN_ID for a local store."""
    if source.remote:
        tail = f"/{run_id}" if GENERATED_ID.fullmatch(run_id) else f"?run={run_id}"
        return f"mlflow+{source.tracking_uri}{tail}"
    return f"{source.tracking_uri}?run={run_id}"


def _param_facts(params: dict[str, str], run: RunData) -> None:
    """Facts from the params that state the run's size (gpus, nodes, model, steps), each with its param's name."""
    for raw_name in sorted(params)[:10_000]:
        name = raw_name.lower()
        spec = PARAM_FACTS.get(name) or PARAM_FACTS.get(re.split(r"[./]", name)[-1])
        if spec is None:
            continue
        fact, integral = spec
        text = str(params[raw_name]).strip()[:500]
        value: int | str | None = text or None
        if integral:
            value = int(text.split(".")[0]) if re.fullmatch(r"\d{1,12}(\.0*)?", text) else None
        run.fact(fact, value, f"mlflow param {raw_name}")
    gpus_per_node, nnodes = run.facts.get("gpus_per_node"), run.facts.get("nnodes")
    if isinstance(gpus_per_node, int) and isinstance(nnodes, int):
        run.fact(
            "gpus",
            gpus_per_node * nnodes,
            f"{run.fact_sources['nnodes']} x {run.fact_sources['gpus_per_node']}",
        )


def _read_metrics(client: Any, found: Any, run: RunData, keys: set[str] | None, cap: int) -> None:
    logged = list(found.data.metrics)
    if not logged:
        still = " yet (it is still running)" if run.partial else ""
        raise RunError(f"the MLflow run {run.source} has no metrics logged{still}: nothing to read")
    listed = logged[:MAX_KEYS]
    run.keys_dropped = len(logged) - len(listed)
    collect = RunCollector(run, keys, cap)
    for key in listed:
        collect.seen(key)
    wanted = [k for k in listed if keys is None or k in keys]
    stepless: list[str] = []
    for key in wanted:
        _read_key(client, found.info.run_id, key, collect, run, stepless)
    done = collect.done()
    if stepless:
        shown = ", ".join(stepless[:10]) + (f" and {len(stepless) - 10} more" if len(stepless) > 10 else "")
        done.note(
            f"{len(stepless)} key(s) were logged without steps (every point at step 0): {shown}; their points are "
            "read in timestamp order, with each point's index as its step"
        )


def _read_key(client: Any, run_id: str, key: str, collect: RunCollector, run: RunData, stepless: list[str]) -> None:
    index = 0
    use_index: bool | None = None
    for page in _history(client, run_id, key, run):
        if use_index is None and page:
            use_index = len(page) > 1 and all(m.step == 0 for m in page)
            if use_index:
                stepless.append(key)
        for metric in page:
            run.rows_read += 1
            step = index if use_index else int(metric.step)
            index += 1
            time = metric.timestamp / 1000.0 if metric.timestamp else math.nan
            collect.add(key, step, time, float(metric.value), stream=key)


def _history(client: Any, run_id: str, key: str, run: RunData) -> Iterator[list[Any]]:
    """The metric history of `key`, page by page. The tracking server and the SQL store page (max_results and
    page_token); the file store reads its whole file per request, so it is asked once."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    if store is None or type(store).__name__ == "FileStore":
        yield list(client.get_metric_history(run_id, key))
        return
    token = None
    for _ in range(MAX_PAGES):
        page = store.get_metric_history(run_id, key, max_results=PAGE, page_token=token)
        yield list(page)
        token = getattr(page, "token", None)
        if not token:
            return
    run.partial.append(f"{key}: only the first {MAX_PAGES * PAGE:,} points were read (MAX_PAGES)")


def _explain(exc: BaseException, source: Source, run_id: str | None) -> str:
    """A clear error for what the client raised: a run that is not there, a server that does not answer, an
    address that is not an MLflow server."""
    message = " ".join(str(exc).split())[:400]
    code = getattr(exc, "error_code", "")
    if code == "RESOURCE_DOES_NOT_EXIST" or ("not found" in message.lower() and run_id):
        what = f"run {run_id!r}" if run_id else "run or experiment"
        return f"{source.shown}: no MLflow {what} there ({message}); {ACCEPTED}"
    if source.remote and (isinstance(exc, OSError) or "failed with exception" in message or "Max retries" in message):
        return (
            f"cannot reach an MLflow tracking server at {source.tracking_uri}: {message} (is `mlflow server` running "
            "there? requests wait MLFLOW_HTTP_REQUEST_TIMEOUT seconds)"
        )
    return f"reading the MLflow run at {source.shown} failed: {message}"
