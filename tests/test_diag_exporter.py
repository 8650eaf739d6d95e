"""dcgm-exporter: Prometheus text parsing, the per-GPU DCGM summary, and scraping a real HTTP server."""

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.diagnostics.exporter import parse_prometheus_text, scrape, summarise_dcgm

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

FIXTURE = Path(__file__).parent / "fixtures" / "diagnostics" / "exporter" / "dcgm-exporter.4xH100.synthetic.prom"
BODY = FIXTURE.read_bytes()


# ---------------------------------------------------------------------------------------------------------------------
# Prometheus text


def test_parse_prometheus_text_forms() -> None:
    text = "\n".join(
        [
            "# HELP up Whether the target is up.",
            "# TYPE up gauge",
            "up 1",
            'with_labels{a="x",b="y"} 2.5',
            'trailing_comma{a="x",} 3',
            "empty_labels{} 4",
            r'escaped{msg="say \"hi\"",path="C:\\dir",nl="a\nb"} 5',
            'spaced { a = "1" , b="2" }  6',
            "with_ts 7 1741079564123",
            "nan_value NaN",
            "pos_inf +Inf",
            "neg_inf -Inf",
            "sci 1.5e3",
            "# EOF",
            "",
            "garbage line here",
            'unterminated{a="x} 1',
            "no_value",
            "bad_value{} twelve",
            "1starts_with_digit 3",
        ]
    )
    samples = parse_prometheus_text(text)
    by_name = {s.name: s for s in samples}
    assert samples.skipped_lines == 5
    assert by_name["up"].value == 1 and by_name["up"].labels == {}
    assert by_name["with_labels"].labels == {"a": "x", "b": "y"} and by_name["with_labels"].value == 2.5
    assert by_name["trailing_comma"].labels == {"a": "x"}
    assert by_name["empty_labels"].labels == {}
    assert by_name["escaped"].labels == {"msg": 'say "hi"', "path": "C:\\dir", "nl": "a\nb"}
    assert by_name["spaced"].labels == {"a": "1", "b": "2"} and by_name["spaced"].value == 6
    assert by_name["with_ts"].timestamp_ms == 1741079564123
    assert math.isnan(by_name["nan_value"].value)
    assert by_name["pos_inf"].value == math.inf and by_name["neg_inf"].value == -math.inf
    assert by_name["sci"].value == 1500.0


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=3000))
def test_parse_prometheus_text_never_raises(text: str) -> None:
    samples = parse_prometheus_text(text)
    summary = summarise_dcgm(samples)
    assert summary.samples == len(samples)


@settings(max_examples=100, deadline=None)
@given(edits=st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=6)), min_size=1, max_size=25))
def test_corrupted_exporter_text_never_raises(edits: list[tuple[float, bytes]]) -> None:
    data = bytearray(BODY)
    for where, junk in edits:
        at = int(where * (len(data) - 1))
        data[at : at + 3] = junk
    samples = parse_prometheus_text(data.decode("utf-8", errors="replace"))
    summary = summarise_dcgm(samples)
    assert summary.samples == len(samples) and summary.skipped_lines == samples.skipped_lines
    assert summary.status in {"healthy", "degraded", "unhealthy", "unknown"}


# ---------------------------------------------------------------------------------------------------------------------
# DCGM summary


def test_summarise_fixture() -> None:
    samples = parse_prometheus_text(BODY.decode())
    assert samples.skipped_lines == 2
    pod = next(s for s in samples if "pod" in s.labels)
    assert pod.labels["pod"] == 'llama-"sft"-0' and pod.labels["err_msg"] == "a\\b"
    summary = summarise_dcgm(samples)
    assert summary.samples == 61 and summary.dcgm_samples == 60 and summary.skipped_lines == 2
    assert [g.gpu for g in summary.gpus] == ["0", "1", "2", "3"]
    assert [g.health.status for g in summary.gpus] == ["healthy", "unhealthy", "degraded", "degraded"]
    assert summary.status == "unhealthy"
    assert summary.counts == {"healthy": 1, "unhealthy": 1, "degraded": 2}
    assert any("not valid Prometheus text" in w for w in summary.warnings)
    g0, g1, g2, g3 = summary.gpus
    assert g0.hostname == "gpu-node-07" and g0.model_name == "NVIDIA H100 80GB HBM3"
    assert g0.uuid == "GPU-6d2a8f14-0c7e-4b3a-9e51-a4f8c2d0b761" and g0.pci_bus_id == "0000:18:00.0"
    snap = g0.health.gpu
    assert (snap.index, snap.temperature_c, snap.memory_temperature_c, snap.power_draw_w) == (0, 34.0, 41.0, 71.402)
    assert (snap.utilization_gpu_pct, snap.memory_used_mib, snap.xid_errors, snap.driver_version) == (
        0.0,
        1.0,
        0,
        "550.90.07",
    )
    assert snap.clock_events["idle"] is True and snap.clock_events["hw_slowdown"] is False
    assert g1.tensor_active == pytest.approx(0.412873) and g1.nvlink_bandwidth_total == 91823.0
    s1 = g1.health.gpu
    assert (s1.ecc_volatile_uncorrectable_total, s1.ecc_volatile_correctable_total, s1.xid_errors) == (1, 17, 79)
    assert (s1.ecc_aggregate_uncorrectable_total, s1.remapped_rows_uncorrectable) == (1, 1)
    findings = {f.check: f for f in g1.health.findings}
    assert findings["ecc_uncorrectable_volatile"].severity == "critical"
    assert findings["xid_reported"].severity == "warning" and "explain_xid(79)" in findings["xid_reported"].action
    # DCGM_FI_DEV_CLOCKS_EVENT_REASONS 72 = 0x48: HW slowdown + HW thermal slowdown
    s2 = g2.health.gpu
    assert {k for k, v in s2.clock_events.items() if v} == {"hw_slowdown", "hw_thermal_slowdown"}
    assert {f.check: f.severity for f in g2.health.findings} == {"hw_thermal_slowdown": "warning"}
    assert g3.tensor_active is None and g3.metrics["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] is None  # NaN
    assert (g3.health.gpu.remapped_rows_pending, g3.health.gpu.remapped_rows_failure) == (True, False)
    assert {f.check for f in g3.health.findings} == {"row_remap_pending"}
    assert "4 GPU(s)" in summary.text and "gpu-node-07 GPU 1: unhealthy" in summary.text


def test_summary_without_dcgm_metrics() -> None:
    for text in ("", "go_goroutines 12\nprocess_open_fds 9\n", "\x00\x01binary\xff garbage {{{"):
        summary = summarise_dcgm(parse_prometheus_text(text))
        assert summary.gpus == [] and summary.status == "unknown"
        assert "no DCGM metrics were found" in summary.text
    unlabelled = summarise_dcgm(parse_prometheus_text("DCGM_FI_DEV_GPU_TEMP 40\n"))
    assert unlabelled.gpus == [] and "gpu or UUID label" in unlabelled.text


# ---------------------------------------------------------------------------------------------------------------------
# scraping a real HTTP server

GARBAGE = bytes((i * 37 + 11) % 256 for i in range(4096))
RELEASE = threading.Event()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, *, length: bool = True, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if length:
            self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, BODY)
        elif self.path == "/hang":
            RELEASE.wait(20)
            self._send(200, BODY)
        elif self.path == "/garbage":
            self._send(200, GARBAGE)
        elif self.path == "/big":
            self._send(200, b"x" * 50_000)
        elif self.path == "/big-undeclared":  # no Content-Length: the cap must hold while streaming
            self.close_connection = True
            self._send(200, b"DCGM_FI_DEV_GPU_TEMP 1\n" * 5_000, length=False)
        elif self.path == "/moved":
            self._send(302, b"", extra={"Location": "/metrics"})
        else:
            self._send(404, b"not found")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        RELEASE.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


async def test_scrape_and_summarise(server: str) -> None:
    body = await scrape(f"{server}/metrics", allowed=[server])
    assert body == BODY.decode()
    summary = summarise_dcgm(parse_prometheus_text(body))
    assert [g.health.status for g in summary.gpus] == ["healthy", "unhealthy", "degraded", "degraded"]


async def test_scrape_timeout(server: str) -> None:
    with pytest.raises(InputError, match=r"did not answer within 0\.5 s"):
        await scrape(f"{server}/hang", allowed=[server], timeout_s=0.5)


async def test_scrape_garbage_finds_no_dcgm_metrics(server: str) -> None:
    body = await scrape(f"{server}/garbage", allowed=[server])
    summary = summarise_dcgm(parse_prometheus_text(body))
    assert summary.gpus == [] and "no DCGM metrics were found" in summary.text


async def test_scrape_size_cap(server: str) -> None:
    with pytest.raises(InputError, match="larger than 10000 bytes"):
        await scrape(f"{server}/big", allowed=[server], max_bytes=10_000)
    with pytest.raises(InputError, match="larger than 10000 bytes"):
        await scrape(f"{server}/big-undeclared", allowed=[server], max_bytes=10_000)
    assert len(await scrape(f"{server}/big", allowed=[server], max_bytes=50_000)) == 50_000


async def test_scrape_http_errors(server: str) -> None:
    with pytest.raises(InputError, match="HTTP 404 Not Found"):
        await scrape(f"{server}/nothing-here", allowed=[server])
    with pytest.raises(InputError, match=r"HTTP 302 Found \(a redirect; redirects are not followed\)"):
        await scrape(f"{server}/moved", allowed=[server])


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/metrics", "file:///etc/passwd", "localhost:9400/metrics", "", "http://", "gopher://x"]
)
async def test_scrape_refuses_non_http_urls(url: str) -> None:
    with pytest.raises(InputError):
        await scrape(url, allowed=["http://127.0.0.1", "ftp://127.0.0.1", "gopher://x", "file:///etc"])


async def test_scrape_connection_refused() -> None:
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(InputError, match="could not connect"):
        await scrape(f"http://127.0.0.1:{port}/metrics", allowed=[f"http://127.0.0.1:{port}"], timeout_s=5)
