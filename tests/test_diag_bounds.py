"""Adversarial inputs to the diagnostics and overlap tools (issue 9, defects 14-16).

14: extreme but schema-valid inputs (world_size 1, empty lists, port 99999, numbers of thousands of digits, tiny
    floats) give results that validate against their own output schema, or clear input errors; never an internal
    error.
15: big inputs (10 MB of nccl-tests rows, thousands of GPUs, floods of kernel-log events, huge DCGM documents and
    exporter pages, huge benchmark timings) give results of bounded size with exact counts of what is not listed.
16: read_dcgm_exporter fetches only URLs the setting exporter_urls allows (exact scheme, host, port, path prefix; no
    user-info or dot-segment tricks), and never quotes a response that is not Prometheus text. Real HTTP server on
    127.0.0.1.
"""

import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import jsonschema
import pytest
from mcp import Client

from servers.core.errors import InputError
from servers.core.mcp_layer import App
from servers.core.settings import Settings
from tests.helpers import call_error, create_test_suite

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diagnostics"
MIB = 2**20
HUGE = "9" * 5000  # Python refuses int() of more than 4300 digits


async def checked(client: Client, tool: str, args: dict[str, Any]) -> tuple[dict[str, Any], str, int]:
    """Call a tool that must succeed; (structured content, text, size of the structured content as JSON).

    The content must be strict JSON (no NaN or Infinity) and validate against the tool's own output schema."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text
    text = result.content[0].text
    assert text and "Traceback" not in text
    content = result.structured_content
    raw = json.dumps(content, allow_nan=False)
    schema = {t.name: t for t in (await client.list_tools()).tools}[tool].output_schema
    jsonschema.validate(content, schema)
    return content, text, len(raw.encode())


async def refused(client: Client, tool: str, args: dict[str, Any]) -> str:
    """Call a tool that must refuse with a clear input error (not an internal error)."""
    text = await call_error(client, tool, args)
    assert "internal error" not in text, text
    return text


@pytest.fixture
async def client(app: App) -> AsyncIterator[Client]:
    """One protocol era, for the big inputs (suite_client runs both eras)."""
    async with Client(create_test_suite(app), mode="auto") as c:
        yield c


# ---------------------------------------------------------------------------------------------------------------------
# 14: extreme inputs


async def test_predict_overlap_with_world_size_1_is_an_answer(suite_client: Client) -> None:
    for pattern in ("ag_gemm", "gemm_rs", "gemm_ar"):
        args = {"pattern": pattern, "m": 1, "n": 1, "k": 1, "world_size": 1, "max_chunks": 1}
        result, text, _ = await checked(suite_client, "predict_overlap", args)
        p = result["prediction"]
        assert p["collective"] is None and p["efficiency"] is None and p["t_comm_ms"] == 0 and p["best_chunks"] == 1
        assert "E=n/a" in text and "nothing to overlap" in text


async def test_predict_overlap_at_the_bounds_stays_finite(suite_client: Client) -> None:
    top = 1 << 24
    for args in (
        {"pattern": "ag_gemm", "m": top, "n": top, "k": top, "world_size": 1024, "max_chunks": 256},
        {"pattern": "gemm_ar", "m": top, "n": top, "k": 1024, "world_size": 1024, "max_chunks": 256, "gpu": "GB200"},
        {"pattern": "gemm_rs", "m": 1024, "n": 1, "k": 1024, "world_size": 1024, "dtype": "fp8", "gpu": "H100-SXM"},
        {"pattern": "gemm_ar", "m": 1, "n": 1, "k": 2, "world_size": 2, "max_chunks": 256, "interconnect": "pcie"},
    ):
        result, _, size = await checked(suite_client, "predict_overlap", args)
        assert result["prediction"]["t_overlap_ms"] > 0 and size < 64 * 1024


async def test_tune_overlap_with_no_layers_says_what_is_accepted(suite_client: Client) -> None:
    text = await refused(suite_client, "tune_overlap", {"layers": []})
    assert "layers: the list is empty" in text and "1 to 32 layers" in text and "llama3-8b" in text


async def test_exporter_port_out_of_range_is_an_input_error(suite_client: Client) -> None:
    text = await refused(suite_client, "read_dcgm_exporter", {"url": "http://127.0.0.1:99999/metrics"})
    assert "port 99999 is outside 1-65535" in text


@pytest.mark.parametrize(
    "text",
    [
        f"{HUGE} 1 float sum -1 1 1 1 0 1 1 1 0",
        f"1024 {HUGE} float sum -1 1 1 1 {HUGE} 1 1 1 0",
        f"# Out of bounds values : {HUGE}\n1024 256 float sum -1 1 1 1 0 1 1 1 0",
        f"#  Rank {HUGE} Group  0 Pid 1 on h device  0 [0x07] NVIDIA A100\n1024 256 float sum -1 1 1 1 0 1 1 1 0",
        f"# nccl-tests version 2.13 nccl-library={HUGE}\n1024 256 float sum -1 1 1 1 0 1 1 1 0",
        f"# nThread 1 nGpus 1 minBytes {HUGE} maxBytes 2\n1024 256 float sum -1 1 1 1 0 1 1 1 0",
        "# Avg bus bandwidth : 1e999\n1024 256 float sum -1 1e308 1e308 1e999 0 nan inf -inf 0",
    ],
)
async def test_nccl_tests_with_absurd_numbers(suite_client: Client, text: str) -> None:
    result = await suite_client.call_tool("parse_nccl_tests", {"text": text})
    assert "internal error" not in result.content[0].text
    if not result.is_error:
        json.dumps(result.structured_content, allow_nan=False)


async def test_nccl_tests_with_a_tiny_expected_bandwidth(suite_client: Client) -> None:
    body = (FIXTURES / "nccl" / "all_reduce_perf.8xH100.pass.txt").read_text()
    result, _, _ = await checked(suite_client, "parse_nccl_tests", {"text": body, "expected_busbw_gbps": 5e-324})
    assert result["verdict"]["status"] == "PASS"


def _dcgm(results: list[dict[str, Any]], **root: Any) -> str:
    return json.dumps(
        {"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "t", "results": results}]}]}}
        | root
    )


@pytest.mark.parametrize(
    "text",
    [
        _dcgm([{"entity_id": HUGE, "status": "Pass"}]),
        _dcgm([{"gpu_ids": f"0,{HUGE},\u00b2", "status": "Fail"}]),
        _dcgm([{"entity_id": "\u00b2", "status": "Pass", "warnings": [{"warning": "w", "error_id": "\u00b3"}]}]),
        _dcgm([{"entity_id": 10**30, "status": "Pass", "warnings": [{"warning": "w", "error_id": 10**40}]}]),
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "t", "results": [{"entity_id": '
        + HUGE
        + "}]}]}]}}",
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "t", "results": [{"entity_id": 1e999, '
        '"status": "Pass", "info": NaN}]}]}]}, "Warning": Infinity}',
        _dcgm([{"gpu_ids": [[[[[[[[1]]]]]]]], "status": "Pass"}]),
    ],
)
async def test_dcgm_with_absurd_numbers(suite_client: Client, text: str) -> None:
    result = await suite_client.call_tool("parse_dcgm_diag", {"text": text})
    message = result.content[0].text
    assert "internal error" not in message and "set_int_max_str_digits" not in message, message
    if not result.is_error:
        json.dumps(result.structured_content, allow_nan=False)


async def test_nvidia_smi_csv_with_absurd_values(suite_client: Client) -> None:
    csv = (
        "index, name, temperature.gpu, power.draw [W], power.limit [W]\n"
        f"0, {'N' * 100_000}, 1e308, 999999999999999 W, 0.000000000001 W\n"
        f"{HUGE}, x, 50, 1 W, 1 W\n"
    )
    result, _, size = await checked(suite_client, "gpu_health", {"text": csv})
    assert size < 64 * 1024  # the 100 000-character name is clipped
    names = [g["gpu"]["name"] for g in result["gpus"]]
    assert any(n and len(n) <= 256 and n.endswith("\u2026") for n in names)


# ---------------------------------------------------------------------------------------------------------------------
# 15: bounded results


def _nccl_big(target_bytes: int) -> tuple[str, int]:
    lines = (FIXTURES / "nccl" / "all_reduce_perf.8xH100.pass.txt").read_text().splitlines()
    head = [ln for ln in lines[:16]]
    rows = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    body: list[str] = []
    size = 0
    while size < target_bytes:
        for row in rows:
            body.append(row)
            size += len(row) + 1
    # one corrupt row at the very end: the verdict must see it, and the listing must keep it
    body.append("  268435456  67108864  float  sum  -1  1114.84  240.78  421.37  3  1117.08  240.30  420.53  0")
    tail = [ln for ln in lines if ln.startswith("# Out of bounds") or ln.startswith("# Avg")]
    return "\n".join(head + body + tail) + "\n", len(body)


async def test_parse_nccl_tests_of_10_mb_is_bounded(client: Client) -> None:
    text, nrows = _nccl_big(10 * MIB)
    report, summary, size = await checked(client, "parse_nccl_tests", {"text": text})
    assert size < MIB
    assert report["rows_total"] == nrows and report["rows_omitted"] == nrows - len(report["rows"])
    assert 0 < len(report["rows"]) <= 256
    assert report["verdict"]["data_corruption"] and report["verdict"]["wrong_elements"] == 3
    assert any(r["out_of_place"]["wrong"] == 3 for r in report["rows"])  # what the verdict used is listed
    best = report["verdict"]["measured_at_bytes"]
    assert any(r["size_bytes"] == best for r in report["rows"])
    assert f"{report['rows_omitted']} of {nrows} result rows" in summary


async def test_thousands_of_gpus_are_counted_not_all_listed(client: Client) -> None:
    header = "index, uuid, temperature.gpu, power.draw [W], power.limit [W], ecc.errors.uncorrected.volatile.total\n"
    rows = [
        f"{i}, GPU-{i:08d}-0000-0000-0000-000000000000, 40, 100 W, 700 W, {1 if i == 19_999 else 0}"
        for i in range(20_000)
    ]
    csv = header + "\n".join(rows) + "\n"
    for detail, most in ((True, 128), (False, 100)):  # the default answer lists what ~12 KB holds
        health, text, size = await checked(client, "gpu_health", {"text": csv, "detail": detail})
        listed = len(health["gpus"])
        assert size < MIB and health["gpu_count"] == 20_000 and (listed == 128 if detail else 10 < listed < most)
        assert sum(health["counts"].values()) == 20_000 and health["gpus_omitted"] == 20_000 - listed
        assert health["node_status"] == "unhealthy" and health["counts"]["unhealthy"] == 1
        assert any(g["gpu"]["index"] == 19_999 and g["status"] == "unhealthy" for g in health["gpus"])  # listed
    assert f"listed {listed} of 20000 GPUs" in text


async def test_kernel_log_flood_of_distinct_gpus_is_bounded(client: Client) -> None:
    long_tail = "x" * 900
    lines = []
    for i in range(3000):
        bus = f"{i // 256:04x}:{i % 256:02x}:00"
        lines.append(f"[{i}.000000] NVRM: Xid (PCI:{bus}): {13 + i % 200}, pid={i}, name=python, {long_tail}")
        lines.append(f"[{i}.000001] NVRM: GPU at PCI:{bus}: GPU-{i:08x}-1111-2222-3333-444455556666")
    scan, text, size = await checked(client, "scan_kernel_log", {"text": "\n".join(lines), "max_events": 500})
    assert size < MIB
    assert scan["summary_rows"] == 3000 and scan["summary_omitted"] == 3000 - len(scan["summary"])
    assert len(scan["events"]) <= 500 and scan["events_omitted"] == 3000 - len(scan["events"])
    assert len(scan["gpus"]) + scan["gpus_omitted"] == 3000
    assert "more counted but not listed" in text and "pair(s) not listed" in text
    assert "less than or equal to 500" in await call_error(client, "scan_kernel_log", {"text": "x", "max_events": 501})


async def test_huge_dcgm_document_is_bounded(client: Client) -> None:
    results = [
        {
            "entity_group": "GPU",
            "entity_id": i % 2000,
            "status": "Fail" if i == 3_999 else "Pass",
            "warnings": [{"warning": "w" * 2000, "error_id": 28}] + [{"warning": "w" * 200, "error_id": 28}] * 9,
            "info": ["i" * 100] * 10,
        }
        for i in range(4_000)
    ]
    text = json.dumps(
        {"DCGM Diagnostic": {"test_categories": [{"category": "c", "tests": [{"name": "memory", "results": results}]}]}}
    )
    report, summary, size = await checked(client, "parse_dcgm_diag", {"text": text})
    assert size < MIB and report["verdict"] == "fail"
    assert report["results_total"] == 4_000 and report["results_omitted"] == 4_000 - len(report["results"])
    assert any(r["status"] == "fail" for r in report["results"])  # the failure is listed
    assert all(len(r["warnings"]) == 8 and r["warnings_omitted"] == 2 for r in report["results"])
    assert all(len(w["text"]) <= 500 for r in report["results"] for w in r["warnings"])
    assert len(report["gpus"]) + report["gpus_omitted"] == 2000
    assert any(g["gpu_id"] == 1999 and g["status"] == "fail" for g in report["gpus"])
    assert "results" in summary and "Not listed" in summary


def test_overlap_raw_timings_are_capped() -> None:
    from servers.overlap.overlap_bench import RAW_ITERS, RAW_RANKS, OverlapSpec, _summarize, _without_raw_times, finite

    spec = OverlapSpec(pattern="ag_gemm", m=64, n=64, k=64, world_size=64, iters=10_000, backend="gloo")
    times = [0.5] * 10_000
    entries = [
        {
            "method": "sequential",
            "chunks": None,
            "available": True,
            "times_ms": times,
            "max_abs_diff": 0.0,
            "max_abs_ref": 1.0,
        },
        {
            "method": "chunked",
            "chunks": 2,
            "available": True,
            "times_ms": times,
            "max_abs_diff": float("nan"),
            "max_abs_ref": 1.0,
        },
    ]
    ranks = [{"t_gemm_ms": [0.2], "t_comm_ms": [0.3], "comm_bytes": 4096, "entries": entries} for _ in range(64)]
    result = finite(_summarize(spec, "gloo", ranks))
    raw = json.dumps(result, allow_nan=False)
    assert len(raw) < 64 * 1024
    for row in result["methods"]:
        assert len(row["raw_times_ms"]) == RAW_RANKS and all(len(r) == RAW_ITERS for r in row["raw_times_ms"])
        assert row["raw_times_omitted"] == 64 * 10_000 - RAW_RANKS * RAW_ITERS
    assert result["methods"][1]["max_abs_diff"] is None and result["methods"][1]["passed"] is False
    tuned = _without_raw_times(result["methods"][0])
    assert tuned["raw_times_ms"] == [] and tuned["raw_times_omitted"] == 64 * 10_000


# ---------------------------------------------------------------------------------------------------------------------
# 16: the exporter allow-list and what is quoted back

SECRET = "SECRET-7f3a9c"
FIXTURE_BODY = (FIXTURES / "exporter" / "dcgm-exporter.4xH100.synthetic.prom").read_bytes()


def _many_gpus(n: int) -> bytes:
    lines = []
    for i in range(n):
        labels = f'gpu="{i}",UUID="GPU-{i:08d}",pci_bus_id="00000000:{i % 256:02X}:00.0",Hostname="node-{i // 8}"'
        for name, value in (("DCGM_FI_DEV_GPU_TEMP", 40), ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1 if i == n - 1 else 0)):
            lines.append(f"{name}{{{labels}}} {value}")
    # one GPU with thousands of distinct DCGM metric names
    lines += [f'DCGM_FI_X_{j}{{gpu="0",UUID="GPU-00000000",Hostname="node-0"}} {j}' for j in range(5000)]
    return ("\n".join(lines) + "\n").encode()


MANY = _many_gpus(3000)


class Handler(BaseHTTPRequestHandler):
    hits: ClassVar[Counter[str]] = Counter()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "text/plain; version=0.0.4", **headers: str) -> None:
        self.send_response(status, headers.pop("reason", None))
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        Handler.hits[self.path] += 1
        secret = f"<html>{SECRET} token={SECRET}</html>\n".encode()
        routes = {
            "/metrics": lambda: self._send(200, FIXTURE_BODY),
            "/metrics/many": lambda: self._send(200, MANY),
            "/metrics/json": lambda: self._send(200, json.dumps({"token": SECRET}).encode(), "application/json"),
            "/metrics/html": lambda: self._send(200, secret * 20),
            "/metrics/mostly-html": lambda: self._send(200, b"up 1\n" + secret * 5),
            "/metrics/other": lambda: self._send(200, f'app_secret{{token="{SECRET}"}} 1\n'.encode()),
            "/metrics/moved": lambda: self._send(302, b"", Location=f"http://{SECRET}.example/metrics"),
            "/metrics/fail": lambda: self._send(500, secret, reason=f"Broken {SECRET}"),
        }
        routes.get(self.path.split("?")[0], lambda: self._send(404, secret))()


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture
async def exporter_client(base: str, tmp_path: Path) -> AsyncIterator[Client]:
    settings = Settings(home=tmp_path / "state", allowed_roots=[tmp_path], exporter_urls=[f"{base}/metrics"])
    async with Client(create_test_suite(App(settings, owner="test")), mode="auto") as c:
        yield c


def test_exporter_urls_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLM_INFRA_MCP_EXPORTER_URLS", raising=False)
    assert Settings().exporter_urls == [
        "http://127.0.0.1:9400/metrics",
        "http://localhost:9400/metrics",
        "http://[::1]:9400/metrics",
    ]
    monkeypatch.setenv("LLM_INFRA_MCP_EXPORTER_URLS", " http://node-7:9400/metrics, https://node-8:9401 http://[::1]:1")
    assert Settings().exporter_urls == ["http://node-7:9400/metrics", "https://node-8:9401", "http://[::1]:1"]
    monkeypatch.setenv("LLM_INFRA_MCP_EXPORTER_URLS", "")
    assert Settings().exporter_urls == []
    for bad in ("ftp://node:21", "node-7:9400", "http://user@node:9400", "http://node:99999", "http://n:1/m?x=1"):
        monkeypatch.setenv("LLM_INFRA_MCP_EXPORTER_URLS", bad)
        with pytest.raises(ValueError, match="exporter URL"):
            Settings()


async def test_default_settings_refuse_other_local_services(suite_client: Client, base: str) -> None:
    before = sum(Handler.hits.values())
    text = await refused(suite_client, "read_dcgm_exporter", {"url": f"{base}/metrics"})
    assert "is not an allowed exporter URL" in text and "LLM_INFRA_MCP_EXPORTER_URLS" in text
    assert "http://127.0.0.1:9400/metrics" in text  # what is accepted now
    assert sum(Handler.hits.values()) == before  # nothing was fetched


async def test_empty_allow_list_switches_reading_off(base: str, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "state", allowed_roots=[tmp_path], exporter_urls=[])
    async with Client(create_test_suite(App(settings, owner="test")), mode="auto") as c:
        text = await refused(c, "read_dcgm_exporter", {"url": f"{base}/metrics"})
    assert "switched off" in text and "LLM_INFRA_MCP_EXPORTER_URLS" in text


@pytest.mark.parametrize(
    "suffix",
    [
        "/metricsx",  # a prefix of the path, not a segment
        "/other",
        "/metrics/../admin",  # normalised to /admin
        "/metrics/%2e%2e/admin",
        "/metrics%2F..%2Fadmin",
        "/metrics/%2fadmin",
        "/",
    ],
)
async def test_paths_outside_the_allowed_prefix_are_refused(exporter_client: Client, base: str, suffix: str) -> None:
    before = sum(Handler.hits.values())
    await refused(exporter_client, "read_dcgm_exporter", {"url": base + suffix})
    assert sum(Handler.hits.values()) == before


async def test_host_port_scheme_and_userinfo_tricks_are_refused(exporter_client: Client, base: str) -> None:
    port = int(base.rsplit(":", 1)[1])
    before = sum(Handler.hits.values())
    for url in (
        f"http://127.0.0.1:{port}@127.0.0.2:{port}/metrics",  # user info "127.0.0.1:PORT", host 127.0.0.2
        f"http://127.0.0.1:{port}\\@127.0.0.2:{port}/metrics",
        f"http://user:pw@127.0.0.1:{port}/metrics",  # the right host, but user info is never accepted
        f"http://localhost:{port}/metrics",  # another spelling of the host is another host
        f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}/metrics",
        f"https://127.0.0.1:{port}/metrics",
        "http://127.0.0.1/metrics",
        f"http://127.1:{port}/metrics",
        f"http://2130706433:{port}/metrics",
    ):
        text = await refused(exporter_client, "read_dcgm_exporter", {"url": url})
        assert "user name" in text or "not an allowed exporter URL" in text, (url, text)
    assert sum(Handler.hits.values()) == before


async def test_allowed_urls_are_read(exporter_client: Client, base: str) -> None:
    summary, _, _ = await checked(exporter_client, "read_dcgm_exporter", {"url": f"{base}/metrics"})
    assert len(summary["gpus"]) == 4 and summary["status"] == "unhealthy"
    port = int(base.rsplit(":", 1)[1])
    again, _, _ = await checked(exporter_client, "read_dcgm_exporter", {"url": f"http://127.0.0.1:{port}/metrics?x=1"})
    assert len(again["gpus"]) == 4
    # below the allowed path: fetched, and the 404 body is not quoted
    text = await refused(exporter_client, "read_dcgm_exporter", {"url": f"{base}/metrics/nothing"})
    assert "HTTP 404 Not Found" in text and SECRET not in text


@pytest.mark.parametrize(
    ("path", "expect"),
    [
        ("/metrics/json", "application/json, not Prometheus text"),
        ("/metrics/html", "not Prometheus text exposition"),
        ("/metrics/mostly-html", "not Prometheus text exposition"),
        ("/metrics/moved", "HTTP 302 Found (a redirect; redirects are not followed)"),
        ("/metrics/fail", "HTTP 500 Internal Server Error"),
    ],
)
async def test_responses_are_never_quoted(exporter_client: Client, base: str, path: str, expect: str) -> None:
    text = await refused(exporter_client, "read_dcgm_exporter", {"url": base + path})
    assert expect in text and SECRET not in text


async def test_prometheus_text_of_another_service_shows_no_values(exporter_client: Client, base: str) -> None:
    summary, text, _ = await checked(exporter_client, "read_dcgm_exporter", {"url": f"{base}/metrics/other"})
    assert summary["gpus"] == [] and "no DCGM metrics were found" in text
    assert SECRET not in json.dumps(summary) and SECRET not in text


async def test_an_exporter_page_of_thousands_of_gpus_is_bounded(exporter_client: Client, base: str) -> None:
    summary, text, size = await checked(exporter_client, "read_dcgm_exporter", {"url": f"{base}/metrics/many"})
    assert size < MIB
    assert sum(summary["counts"].values()) == 3000 and summary["gpus_omitted"] == 3000 - len(summary["gpus"])
    assert len(summary["gpus"]) <= 64
    assert summary["status"] == "unhealthy" and summary["counts"]["unhealthy"] == 1
    assert any(g["gpu"] == "2999" and g["health"]["status"] == "unhealthy" for g in summary["gpus"])  # listed
    gpu0 = next((g for g in summary["gpus"] if g["gpu"] == "0"), None)
    if gpu0 is not None:
        assert len(gpu0["metrics"]) == 128 and gpu0["metrics_omitted"] == 5002 - 128
    assert "more GPU(s) counted above but not listed" in text


async def test_scrape_checks_the_list_before_connecting(base: str) -> None:
    from servers.diagnostics.exporter import check_allowed, scrape

    allowed = [f"{base}/metrics"]
    assert str(check_allowed(f"{base}/metrics/sub", allowed)) == f"{base}/metrics/sub"
    with pytest.raises(InputError, match="not an allowed exporter URL"):
        check_allowed(f"{base}/metrics", ["http://127.0.0.1:9400/metrics"])
    assert check_allowed("http://node-7/metrics", ["http://node-7:80"]).host == "node-7"  # default ports compare
    assert check_allowed("https://NODE-7:443/m", ["https://node-7/"]).host == "node-7"
    with pytest.raises(InputError):
        check_allowed("http://node-7:8080/metrics", ["http://node-7"])
    before = sum(Handler.hits.values())
    with pytest.raises(InputError, match="not an allowed exporter URL"):
        await scrape(f"{base}/secret", allowed=allowed)
    assert sum(Handler.hits.values()) == before
