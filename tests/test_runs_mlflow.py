"""The MLflow reader (servers/runs/mlflow_reader.py) on runs written by mlflow itself: MlflowClient logging into a
file store and an SQLite store in tmp_path, and a real `mlflow server` on 127.0.0.1 (one per module, stopped by
its process group) for the paging past 25,000 points and the URI forms. Nothing reaches beyond loopback."""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from servers.core.errors import InputError
from servers.core.settings import Settings
from servers.runs import mlflow_reader, registry
from servers.runs.registry import Target
from servers.runs.series import RunData, RunError

T0 = 1_700_000_000_000  # ms: the timestamps logged


def read(text: str, roots: list[Path], hosts: tuple[str, ...] = registry.DEFAULT_HOSTS, **kw: object) -> RunData:
    where = registry.target(text, roots=roots, hosts=hosts)
    assert registry.detect(where).name == "mlflow", text  # every reader asked, in order: this one claims it
    return registry.read_run(where, **kw)  # type: ignore[arg-type]


def log_points(client: MlflowClient, run_id: str, key: str, points: list[tuple[int, int, float]]) -> None:
    """(step, timestamp ms, value) points, in batches of 1,000 (the server's limit per log_batch)."""
    metrics = [Metric(key, value, stamp, step) for step, stamp, value in points]
    for at in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[at : at + 1000])


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store, made once (its migrations take seconds) and copied for each test."""
    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def sqlite_store(tmp_path: Path, empty_db: Path) -> tuple[Path, MlflowClient]:
    db = tmp_path / "mlflow.db"
    shutil.copyfile(empty_db, db)
    return db, MlflowClient(f"sqlite:///{db}")


def test_file_store_run_folder_facts_nonfinite_and_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    client = MlflowClient(store.as_uri())
    experiment = client.create_experiment("grpo")
    run = client.create_run(experiment, run_name="grpo-seed1")
    run_id = run.info.run_id
    for name, value in {
        "trainer/n_gpus_per_node": "8",  # verl's config, flattened with "/" by its MLflow logger
        "trainer/nnodes": "2",
        "actor_rollout_ref/model/path": "Qwen/Qwen2.5-0.5B",
        "trainer/total_training_steps": "40.0",
        "learning_rate": "1e-6",
    }.items():
        client.log_param(run_id, name, value)
    for step in range(20):
        client.log_metric(run_id, "critic/score/mean", 0.1 + 0.01 * step, timestamp=T0 + 1000 * step, step=step)
    client.log_metric(run_id, "critic/score/mean", math.nan, timestamp=T0 + 20_000, step=20)
    client.log_metric(run_id, "actor/kl", math.inf, timestamp=T0 + 20_000, step=20)
    client.log_metric(run_id, "actor/kl", 0.02, timestamp=T0 + 21_000, step=21)
    client.set_terminated(run_id)

    run_folder = store / experiment / run_id
    for text in (str(run_folder), str(store / experiment), str(store), f"{store.as_uri()}?run={run_id}"):
        data = read(text, [tmp_path])
        assert data.reader == "mlflow" and data.name == "grpo-seed1", text
        assert data.facts["run_id"] == run_id
    reward = data.series["critic/score/mean"]
    assert list(reward.steps) == list(range(20)) and reward.read == 21 and reward.nonfinite == 1
    assert reward.values[5] == pytest.approx(0.15)
    assert reward.times[3] == pytest.approx((T0 + 3000) / 1000)
    assert data.series["actor/kl"].nonfinite == 1 and list(data.series["actor/kl"].values) == [0.02]
    assert any("non-finite" in n for n in data.notes)
    assert data.facts["gpus_per_node"] == 8 and data.facts["nnodes"] == 2 and data.facts["gpus"] == 16
    assert data.facts["model"] == "Qwen/Qwen2.5-0.5B" and data.facts["max_steps"] == 40
    assert data.fact_sources["model"] == "mlflow param actor_rollout_ref/model/path"
    assert data.fact_sources["max_steps"] == "mlflow param trainer/total_training_steps"
    assert data.fact_sources["gpus"] == "mlflow param trainer/nnodes x mlflow param trainer/n_gpus_per_node"
    assert "learning_rate" not in data.facts
    assert data.partial == []
    assert data.source == f"{store.as_uri()}?run={run_id}" and read(data.source, [tmp_path]).facts["run_id"] == run_id
    only = read(str(run_folder), [tmp_path], keys=["actor/kl"])
    assert set(only.series) == {"actor/kl"} and set(only.keys) == {"critic/score/mean", "actor/kl"}
    unknown = read(str(run_folder), [tmp_path], keys=["reward"])  # not logged: no series, every logged key listed
    assert unknown.series == {} and set(unknown.keys) == {"critic/score/mean", "actor/kl"}


def test_sqlite_latest_run_is_chosen_and_said_and_run_query_picks(
    tmp_path: Path, sqlite_store: tuple[Path, MlflowClient]
) -> None:
    db, client = sqlite_store
    experiment = client.create_experiment("sweep")
    ids = []
    for number in range(3):
        run = client.create_run(experiment, run_name=f"lr-{number}", start_time=T0 + number * 60_000)
        log_points(client, run.info.run_id, "reward", [(s, T0 + s, float(number)) for s in range(5)])
        client.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)

    for text in (str(db), f"sqlite:///{db.relative_to(tmp_path)}", f"sqlite:///{db}"):  # relative, absolute
        latest = read(text, [tmp_path])
        assert latest.name == "lr-2" and list(latest.series["reward"].values) == [2.0] * 5
        note = next(n for n in latest.notes if n.startswith("no run id given"))
        assert ids[2] in note and ids[1] in note and ids[0] in note and "?run=RUN_ID" in note
    first = read(f"sqlite:///{db}?run={ids[0]}", [tmp_path])
    assert first.name == "lr-0" and not any(n.startswith("no run id") for n in first.notes)
    assert first.source == f"sqlite:///{db}?run={ids[0]}" and read(first.source, [tmp_path]).name == "lr-0"
    assert latest.source == f"sqlite:///{db}?run={ids[2]}"  # the run read, in a form that reads it again

    with pytest.raises(InputError, match=r"no MLflow run '0123456789abcdef0123456789abcdef'"):
        read(f"{db.as_uri()}?run=0123456789abcdef0123456789abcdef", [tmp_path])
    with pytest.raises(InputError, match="not an MLflow run id"):
        read(f"{db.as_uri()}?run=../../etc", [tmp_path])


def test_restart_stepless_key_running_and_empty_run(sqlite_store: tuple[Path, MlflowClient], tmp_path: Path) -> None:
    db, client = sqlite_store
    experiment = client.create_experiment("resume")
    run_id = client.create_run(experiment, run_name="resumed").info.run_id
    first = [(s, T0 + 1000 * s, float(s)) for s in range(10)]
    second = [(s, T0 + 100_000 + 1000 * s, 100.0 + s) for s in range(5, 15)]  # resumed from the step-5 checkpoint
    log_points(client, run_id, "loss", first + second)
    log_points(client, run_id, "reward", [(s, t + 1, -v) for s, t, v in first + second])  # every key resumes
    for n in range(4):  # mlflow.log_metric without a step logs every point at step 0
        client.log_metric(run_id, "tokens_per_s", 10.0 * n, timestamp=T0 + 500 * n)

    data = read(f"{db.as_uri()}?run={run_id}", [tmp_path])
    loss = data.series["loss"]
    assert list(loss.steps) == list(range(15)) and loss.superseded == 5
    assert list(loss.values) == [float(s) for s in range(5)] + [100.0 + s for s in range(5, 15)]
    reward = data.series["reward"]  # read before or after loss: the other key's restart leaves it whole
    assert list(reward.steps) == list(range(15)) and list(reward.values) == [-v for v in loss.values]
    assert [(r.from_step, r.to_step) for r in data.restarts] == [(9, 5)]
    assert data.restarts[0].at_time == pytest.approx((T0 + 105_000) / 1000)
    stepless = data.series["tokens_per_s"]
    assert list(stepless.steps) == [0, 1, 2, 3] and list(stepless.values) == [0.0, 10.0, 20.0, 30.0]
    assert any("without steps" in n and "tokens_per_s" in n for n in data.notes)
    assert data.partial == ["the run is still running (MLflow status RUNNING): what was logged so far"]

    empty = client.create_run(experiment, run_name="nothing-yet").info.run_id
    with pytest.raises(InputError, match="has no metrics logged yet"):
        read(f"{db.as_uri()}?run={empty}", [tmp_path])
    client.set_terminated(empty, status="FAILED")
    with pytest.raises(InputError, match="has no metrics logged: nothing to read"):
        read(f"{db.as_uri()}?run={empty}", [tmp_path])


def test_paging_reads_every_page(
    sqlite_store: tuple[Path, MlflowClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, client = sqlite_store
    run_id = client.create_run(client.create_experiment("paged")).info.run_id
    log_points(client, run_id, "reward", [(s, T0 + s, s / 100) for s in range(103)])
    monkeypatch.setattr(mlflow_reader, "PAGE", 10)
    asked: list[object] = []
    real = mlflow_reader._history

    def counting(*args: object) -> Iterator[list[object]]:
        for page in real(*args):  # type: ignore[arg-type]
            asked.append(len(page))
            yield page

    monkeypatch.setattr(mlflow_reader, "_history", counting)
    series = read(str(db), [tmp_path]).series["reward"]
    assert list(series.steps) == list(range(103)) and series.read == 103
    assert asked == [10] * 10 + [3]
    monkeypatch.setattr(mlflow_reader, "MAX_PAGES", 4)
    capped = read(str(db), [tmp_path])
    assert len(capped.series["reward"]) == 40 and any("only the first 40 points" in p for p in capped.partial)


def test_detection_and_uri_forms(tmp_path: Path) -> None:
    run_id = "0123456789abcdef0123456789abcdef"
    forms = {
        f"mlflow+http://127.0.0.1:5000/{run_id}": ("http://127.0.0.1:5000", run_id, None),
        f"mlflow+https://localhost/mlflow/{run_id}": ("https://localhost/mlflow", run_id, None),
        "mlflow+http://127.0.0.1:5000?run=my-run": ("http://127.0.0.1:5000", "my-run", None),
        "mlflow+http://127.0.0.1:5000": ("http://127.0.0.1:5000", None, None),
        f"http://127.0.0.1:5000/#/experiments/7/runs/{run_id}/model-metrics": ("http://127.0.0.1:5000", run_id, "7"),
        "http://127.0.0.1:5000/#/experiments/7": ("http://127.0.0.1:5000", None, "7"),
    }
    for text, (base, run, experiment) in forms.items():
        source = mlflow_reader._server_source(text)
        assert source is not None and (source.tracking_uri, source.run_id, source.experiment_id) == (
            base,
            run,
            experiment,
        ), text
        assert mlflow_reader.detect(Target(text, uri=text))
    for other in ("http://127.0.0.1:5000/metrics", "https://wandb.ai/team/p/runs/abc", "s3://bucket/x"):
        assert not mlflow_reader.detect(Target(other, uri=other)), other
    for bad, why in (
        (f"mlflow+http://user:secret@127.0.0.1:5000/{run_id}", "credentials in the URI are not accepted"),
        (f"mlflow+http://127.0.0.1:99999/{run_id}", "port is not a number"),
        ("mlflow+http://127.0.0.1:5000?run=a/b", "not an MLflow run id"),
        (f"mlflow+http://127.0.0.1:5000\\x.example/{run_id}", "may hold only a host name"),
        (f"mlflow+http://127.0.0.1:5000/a%20b/{run_id}", "may hold only letters"),
        ("http://127.0.0.1:5000/#/experiments/1;drop/runs/x", "not an MLflow experiment id"),
    ):
        with pytest.raises(InputError, match=why):
            registry.read_run(registry.target(bad, roots=[tmp_path]), reader="mlflow")
    plain = tmp_path / "notes.db"
    plain.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    (tmp_path / "folder").mkdir()
    for path in (plain, tmp_path / "folder"):
        assert not mlflow_reader.detect(Target(str(path), path=path))
        with pytest.raises(InputError, match="accepted: mlflow"):
            registry.read_run(Target(str(path), path=path), reader="mlflow")


URL_PARTS = st.sampled_from(
    [
        "mlflow+http://",
        "mlflow+https://",
        "http://",
        "127.0.0.1",
        "localhost",
        "evil.example",
        "@",
        ":",
        "5000",
        "/",
        "#/experiments/",
        "runs/",
        "?run=",
        "\\",
        "%40",
        "[::1]",
        "..",
        "0123456789abcdef0123456789abcdef",
        " ",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(URL_PARTS, min_size=1, max_size=10).map("".join))
def test_the_host_connected_to_is_the_host_checked(text: str) -> None:
    """Whatever the text, the tracking URI the client would be given names exactly the host check_host checks."""
    try:
        source = mlflow_reader._server_source(text)
    except RunError:
        return
    if source is not None:
        assert urlsplit(source.tracking_uri).hostname == urlsplit(text).hostname
        assert urlsplit(source.tracking_uri).port == urlsplit(text).port


@pytest.mark.timeout(30)
def test_host_outside_tracking_hosts_is_refused_before_connecting(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    connections: list[object] = []

    def record() -> None:
        try:
            while True:
                connections.append(listener.accept()[0])
        except OSError:
            return

    thread = threading.Thread(target=record, daemon=True)
    thread.start()
    run_id = "0123456789abcdef0123456789abcdef"
    try:
        for text in (f"mlflow+http://127.0.0.1:{port}/{run_id}", f"http://127.0.0.1:{port}/#/experiments/1"):
            with pytest.raises(InputError, match=r"host '127.0.0.1' is not an allowed tracking host; allowed: node-7"):
                read(text, [tmp_path], hosts=("node-7",))
        with pytest.raises(InputError, match=r"host 'tracking\.example\.invalid' is not an allowed tracking host"):
            read(f"mlflow+http://tracking.example.invalid:{port}/{run_id}", [tmp_path])
        with pytest.raises(InputError, match="allowed: none"):
            read(f"mlflow+http://127.0.0.1:{port}/{run_id}", [tmp_path], hosts=())
        thread.join(1.0)  # accept() times out: the thread ends
        assert connections == []
    finally:
        listener.close()
        for connection in connections:
            connection.close()  # type: ignore[attr-defined]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.timeout(60)
def test_server_not_listening_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    port = free_port()
    started = time.monotonic()
    with pytest.raises(InputError, match=rf"cannot reach an MLflow tracking server at http://127.0.0.1:{port}"):
        read(f"mlflow+http://127.0.0.1:{port}/0123456789abcdef0123456789abcdef", [tmp_path])
    assert time.monotonic() - started < 30
    assert (os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"], os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) == ("10", "1")


@pytest.mark.timeout(60)
def test_server_that_never_answers_fails_within_the_request_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")  # the reader's default is 10 s, 1 retry
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections queue and are never answered
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(InputError, match=rf"cannot reach an MLflow tracking server at http://127.0.0.1:{port}"):
            read(f"mlflow+http://127.0.0.1:{port}/0123456789abcdef0123456789abcdef", [tmp_path])
        assert time.monotonic() - started < 20


def test_tracking_hosts_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLM_INFRA_MCP_TRACKING_HOSTS", raising=False)
    assert Settings().tracking_hosts == ["127.0.0.1", "localhost", "::1"]
    monkeypatch.setenv("LLM_INFRA_MCP_TRACKING_HOSTS", "MLflow.lab, [fd00::7] 10.0.0.2,,mlflow.lab")
    assert Settings().tracking_hosts == ["mlflow.lab", "fd00::7", "10.0.0.2"]
    monkeypatch.setenv("LLM_INFRA_MCP_TRACKING_HOSTS", "")
    assert Settings().tracking_hosts == []
    for bad in ("http://mlflow.lab", "mlflow.lab:5000", "a/b", "*", "ab:5000"):
        monkeypatch.setenv("LLM_INFRA_MCP_TRACKING_HOSTS", bad)
        with pytest.raises(ValueError, match="is not a host name or IP address"):
            Settings()


@pytest.fixture(scope="module", autouse=True)
def server_process(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """`mlflow server` on 127.0.0.1 with an SQLite backend in a temporary folder, started when the module's first
    test starts (its start takes seconds, spent while the other tests run) if a selected test needs it; stopped by
    its process group."""
    if not any(
        "mlflow_server" in item.fixturenames for item in request.session.items if item.module is sys.modules[__name__]
    ):
        yield None
        return
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "PYTHONUNBUFFERED": "1"}
    log = (folder / "server.log").open("wb")
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--default-artifact-root", str(folder)]
    server = subprocess.Popen(
        command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        yield server, f"http://127.0.0.1:{port}", folder
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=1)  # uvicorn waits for the client's kept-alive connection: then it is killed
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=15)
        log.close()


@pytest.fixture(scope="module")
def mlflow_server(server_process: tuple[subprocess.Popen[bytes], str, Path]) -> tuple[str, Path]:
    """The server's address once it answers /health, and its SQLite backend."""
    server, base, folder = server_process
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as answer:
                if answer.status == 200:
                    return base, folder / "mlflow.db"
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"mlflow server did not start: {(folder / 'server.log').read_text()[-2000:]}")
        time.sleep(0.3)


@pytest.mark.timeout(150)
def test_server_history_past_one_page_and_uri_forms(mlflow_server: tuple[str, Path], tmp_path: Path) -> None:
    base, backend = mlflow_server
    client = MlflowClient(base)
    experiment = client.create_experiment("long")
    run = client.create_run(experiment, run_name="long-run", start_time=T0)
    run_id = run.info.run_id
    client.log_param(run_id, "world_size", "4")
    client.log_metric(run_id, "kl", 0.5, timestamp=T0, step=0)
    client.log_metric(run_id, "kl", math.nan, timestamp=T0, step=1)  # NaN over the REST API (JSON "NaN")
    points = mlflow_reader.PAGE + 5_001
    # the long history straight into the server's store (seconds faster than 31 log_batch requests here)
    log_points(
        MlflowClient(f"sqlite:///{backend}"), run_id, "reward", [(s, T0 + 10 * s, s / points) for s in range(points)]
    )
    log_points(client, run_id, "kl", [(s, T0 + 10 * s, 0.5) for s in range(1000, points, 1000)])

    port = base.rsplit(":", 1)[1]
    data = read(f"mlflow+http://127.0.0.1:{port}/{run_id}", [tmp_path])
    reward = data.series["reward"]
    assert reward.read == points and len(reward) == points and reward.stride == 1
    assert list(reward.steps[:3]) == [0, 1, 2] and reward.steps[-1] == points - 1
    assert reward.values[-1] == pytest.approx((points - 1) / points)
    assert reward.times[-1] == pytest.approx((T0 + 10 * (points - 1)) / 1000)
    assert (
        data.name == "long-run" and data.facts["gpus"] == 4 and data.fact_sources["gpus"] == "mlflow param world_size"
    )
    assert (
        data.source == f"mlflow+http://127.0.0.1:{port}/{run_id}"
        and data.rows_read == points + len(range(0, points, 1000)) + 1
    )
    assert "still running" in data.partial[0]

    client.set_terminated(run_id)
    ui = read(f"http://localhost:{port}/#/experiments/{experiment}/runs/{run_id}", [tmp_path], keys=["kl"])
    assert set(ui.series) == {"kl"} and len(ui.series["kl"]) == len(range(0, points, 1000)) and ui.partial == []
    assert ui.series["kl"].nonfinite == 1 and ui.source == f"mlflow+http://localhost:{port}/{run_id}"
    latest = read(f"http://127.0.0.1:{port}/#/experiments/{experiment}", [tmp_path], keys=["kl"])
    assert latest.facts["run_id"] == run_id and "read the only run of experiment" in latest.notes[0]
    with pytest.raises(InputError, match="no MLflow experiment '999' there"):
        read(f"http://127.0.0.1:{port}/#/experiments/999", [tmp_path])
    with pytest.raises(InputError, match="no MLflow run 'ffffffffffffffffffffffffffffffff'"):
        read(f"mlflow+http://127.0.0.1:{port}/{'f' * 32}", [tmp_path])
