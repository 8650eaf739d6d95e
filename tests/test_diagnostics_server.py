"""The diagnostics tools through in-process MCP clients in both protocol eras: live NVML (absent here), captured
nvidia-smi in every format, kernel logs from text, files and a streamed large file, the Xid catalog, nccl-tests,
DCGM diagnostics, a dcgm-exporter on a real local HTTP server, and bad input of every kind."""

import http.server
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client

from tests.helpers import call_error as error
from tests.helpers import call_ok as ok

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diagnostics"


async def test_live_health_lists_the_gpus_or_says_clearly_there_is_no_driver(suite_client: Client) -> None:
    health = await ok(suite_client, "gpu_health", {})
    assert health["source"] == "nvml"
    if health["available"]:  # a machine with a GPU: real answers
        assert health["gpu_count"] == len(health["gpus"]) and health["driver_version"] and health["cuda_version"]
        assert all(g["gpu"]["uuid"] and g["gpu"]["pci_bus_id"] and g["gpu"]["memory_total_mib"] for g in health["gpus"])
    else:
        assert "NVML" in health["reason"] and health["gpu_count"] == 0
        assert health["node_status"] == "unknown" and not health["gpus"]


@pytest.mark.parametrize("name", sorted(p.name for p in (FIXTURES / "smi").iterdir() if p.suffix != ".md"))
async def test_captured_nvidia_smi_in_every_format(suite_client: Client, name: str, tmp_path: Path) -> None:
    source = FIXTURES / "smi" / name
    args: dict = {"path": str(tmp_path / name)}
    shutil.copy(source, tmp_path / name)  # inside the allowed roots
    if "noheader" in name:
        args["fields"] = [
            "index",
            "uuid",
            "temperature.gpu",
            "power.draw",
            "memory.used",
            "remapped_rows.pending",
            "ecc.errors.uncorrected.volatile.total",
        ]
    health = await ok(suite_client, "gpu_health", args)
    assert health["available"] and health["gpu_count"] >= 2 and health["format"] in ("q", "xml", "csv")
    gpus = [g["gpu"] for g in health["gpus"]]
    assert all(g.get("pci_bus_id") is None or g["pci_bus_id"] == g["pci_bus_id"].lower() for g in gpus)
    assert health["node_status"] in ("healthy", "degraded", "unhealthy", "unknown")
    assert sum(health["counts"].values()) == health["gpu_count"] == len(gpus)
    same = await ok(suite_client, "gpu_health", {"text": source.read_text(), "fields": args.get("fields")})
    assert same["gpus"] == health["gpus"] and same["driver_version"] == health["driver_version"]


async def test_health_of_a_node_with_faulty_gpus(suite_client: Client) -> None:
    text = (FIXTURES / "smi" / "nvidia-smi-q.8xH100.550.synthetic.txt").read_text()
    health = await ok(suite_client, "gpu_health", {"text": text})
    assert health["node_status"] == "unhealthy" and health["counts"].get("unhealthy", 0) >= 1
    checks = {f["check"] for g in health["gpus"] for f in g["findings"]}
    assert any("ecc" in c for c in checks) and any("remap" in c for c in checks)
    for gpu in health["gpus"]:
        for finding in gpu["findings"]:
            assert finding["evidence"] and finding["action"] and finding["severity"] in ("info", "warning", "critical")


async def test_kernel_log_from_text_path_and_the_catalog(suite_client: Client, tmp_path: Path) -> None:
    text = (FIXTURES / "kmsg" / "dmesg-T.log").read_text()
    scan = await ok(suite_client, "scan_kernel_log", {"text": text})
    [row] = [r for r in scan["summary"] if r["kind"] == "xid" and r["code"] == 48]
    assert row["count"] == 2 and row["uuid"] == "GPU-3b3b3b3b-0000-1111-2222-333344445555"
    assert row["severity"] == "critical" and row["pci_bus_id"] == "0000:3b:00"
    for name in sorted(p.name for p in (FIXTURES / "kmsg").iterdir()):
        shutil.copy(FIXTURES / "kmsg" / name, tmp_path / name)
        from_file = await ok(suite_client, "scan_kernel_log", {"path": str(tmp_path / name)})
        assert from_file["lines_read"] > 0


async def test_a_large_log_is_streamed_and_floods_collapse(suite_client: Client, tmp_path: Path) -> None:
    big = tmp_path / "kern.log"
    ordinary = "[  100.000000] usb 1-1: new high-speed USB device number 2 using xhci_hcd\n" * 2000
    flood = "[  200.000000] NVRM: Xid (PCI:0000:18:00): 45, pid=77, name=python, Ch 00000010\n" * 1000
    with open(big, "w") as f:
        for _ in range(20):
            f.write(ordinary)
            f.write(flood)
        f.write("[  300.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=77, name=python, GPU has fallen off the bus.\n")
    scan = await ok(suite_client, "scan_kernel_log", {"path": str(big), "max_events": 50})
    rows = {(r["kind"], r["code"]): r for r in scan["summary"]}
    assert rows[("xid", 45)]["count"] == 20_000 and rows[("xid", 45)]["flood"]
    assert rows[("xid", 79)]["severity"] == "critical" and scan["events_truncated"]
    assert len(scan["events"]) <= 50 and scan["lines_read"] == 60_001


async def test_explain_xid_with_disagreements(suite_client: Client) -> None:
    x63 = await ok(suite_client, "explain_xid", {"code": 63})
    assert x63["known"] and x63["disagreement"]
    assert {d["about"] for d in x63["disagreements"]} == {"action", "severity"}
    x119 = await ok(suite_client, "explain_xid", {"code": 119})  # NVIDIA RESET_GPU vs gpud reboot + inspection
    [action] = x119["disagreements"]
    assert action["about"] == "action" and "RESET_GPU" in x119["disagreement"]
    assert {p["source"]: p["reading"] for p in action["positions"]} == {
        "nvidia": "reset_gpu",
        "gpud": "reboot_node+hardware_inspection",
    }
    x79 = await ok(suite_client, "explain_xid", {"code": 79})
    assert x79["consensus"]["severity"] == "critical"
    unknown = await ok(suite_client, "explain_xid", {"code": 998})
    assert not unknown["known"]
    assert "less than or equal to 999" in await error(suite_client, "explain_xid", {"code": 1000})
    [catalog] = (await suite_client.read_resource("infra://xid-catalog.json")).contents
    assert any(x["code"] == 63 for x in json.loads(catalog.text)["xids"])


async def test_nccl_tests_verdicts(suite_client: Client) -> None:
    passing = await ok(
        suite_client, "parse_nccl_tests", {"text": (FIXTURES / "nccl" / "all_reduce_perf.8xH100.pass.txt").read_text()}
    )
    assert passing["verdict"]["status"] == "PASS" and passing["rows"] and passing["avg_busbw_gbps"] > 0
    low = await ok(
        suite_client,
        "parse_nccl_tests",
        {"text": (FIXTURES / "nccl" / "all_reduce_perf.8xH100.below-floor.txt").read_text()},
    )
    assert low["verdict"]["status"] == "FAIL"
    ring = await ok(
        suite_client,
        "parse_nccl_tests",
        {"text": (FIXTURES / "nccl" / "all_reduce_perf.8xH100.no-algorithm-shown.txt").read_text()},
    )
    verdict = ring["verdict"]  # ring-level bandwidth, algorithm not shown: not a FAIL, and it says why
    assert verdict["status"] == "PASS" and verdict["nvls"] == "unknown" and verdict["expected_busbw_gbps"] == 370
    assert [(f["gbps"], f["assumes"], f["met"]) for f in verdict["floors"]] == [
        (460, "nvls", False),
        (370, "no_nvls", True),
    ]
    assert all(f["assumption"] and f["source"] for f in verdict["floors"])
    assert "if NVLS was on, DEGRADED" in verdict["text"]
    nvls = await ok(
        suite_client,
        "parse_nccl_tests",
        {"text": (FIXTURES / "nccl" / "all_reduce_perf.8xH100.nvls-available.txt").read_text()},
    )
    assert nvls["verdict"]["status"] == "DEGRADED" and nvls["verdict"]["nvls"] == "on"
    wrong = await ok(
        suite_client, "parse_nccl_tests", {"text": (FIXTURES / "nccl" / "all_reduce_perf.8xA100.wrong.txt").read_text()}
    )
    assert wrong["verdict"]["data_corruption"]
    custom = await ok(
        suite_client,
        "parse_nccl_tests",
        {"text": (FIXTURES / "nccl" / "all_gather_perf.8xH100.txt").read_text(), "expected_busbw_gbps": 10_000},
    )
    assert custom["verdict"]["expected_busbw_gbps"] == 10_000 and custom["verdict"]["status"] == "FAIL"


async def test_dcgm_diag_json_in_both_layouts(suite_client: Client) -> None:
    for name, layout in (("dcgmi-diag-r2.dcgm3.8xA100.json", "3.x"), ("dcgmi-diag-r3.dcgm4.8xH100.json", "4.x")):
        report = await ok(suite_client, "parse_dcgm_diag", {"text": (FIXTURES / "dcgm" / name).read_text()})
        assert report["layout"] == layout and report["results"]
        assert report["verdict"] in ("pass", "fail", "warn", "skip", "error")


async def test_run_dcgm_diag_says_when_dcgm_is_missing(suite_client: Client) -> None:
    if shutil.which("dcgmi"):
        pytest.skip("DCGM is installed here")
    assert "dcgmi" in await error(suite_client, "run_dcgm_diag", {"level": 1})


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/metrics":
            body = (FIXTURES / "exporter" / "dcgm-exporter.4xH100.synthetic.prom").read_bytes()
        elif self.path == "/garbage":
            body = bytes(range(256)) * 64
        elif self.path == "/hang":
            time.sleep(5)
            body = b""
        else:
            self.send_response(404)
            self.end_headers()
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the hanging endpoint), as it should

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def exporter_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_dcgm_exporter_over_real_http(exporter_url: str, tmp_path: Path, mode: str) -> None:
    from servers.core.mcp_layer import App
    from servers.core.settings import Settings
    from tests.helpers import create_test_suite

    settings = Settings(home=tmp_path / "state", allowed_roots=[tmp_path], exporter_urls=[exporter_url])
    async with Client(create_test_suite(App(settings, owner="test")), mode=mode) as client:
        summary = await ok(client, "read_dcgm_exporter", {"url": exporter_url + "/metrics"})
        assert len(summary["gpus"]) == 4
        garbage = await error(client, "read_dcgm_exporter", {"url": exporter_url + "/garbage"})
        assert "not Prometheus text" in garbage and "\\x" not in garbage
        hang = await error(client, "read_dcgm_exporter", {"url": exporter_url + "/hang", "http_timeout_s": 1})
        assert "did not answer within 1 s" in hang
        assert "404" in await error(client, "read_dcgm_exporter", {"url": exporter_url + "/nope"})
        assert "should match pattern" in await error(client, "read_dcgm_exporter", {"url": "file:///etc/passwd"})


async def test_bad_inputs(suite_client: Client, tmp_path: Path) -> None:
    assert "exactly one" in await error(suite_client, "scan_kernel_log", {})
    assert "outside the allowed roots" in await error(suite_client, "scan_kernel_log", {"path": "/etc/hostname"})
    empty = await suite_client.call_tool("gpu_health", {"text": "   \n"})
    assert empty.is_error and "whitespace" in empty.content[0].text
    binary = tmp_path / "smi.txt"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    assert "binary" in await error(suite_client, "gpu_health", {"path": str(binary)})
    assert "nvidia-smi" in await error(suite_client, "gpu_health", {"text": "hello world"})
    garbled = "<?xml version='1.0'?><nvidia_smi_log><driver_version>535</driver_version><gpu id='0000:3b:00.0'"
    await error(suite_client, "gpu_health", {"text": garbled})
    truncated = (FIXTURES / "smi" / "nvidia-smi-q.8xH100.550.synthetic.txt").read_text()[:3000]
    result = await suite_client.call_tool("gpu_health", {"text": truncated})
    assert "Traceback" not in result.content[0].text
    assert "nccl" in (await error(suite_client, "parse_nccl_tests", {"text": "not an nccl-tests output"})).lower()
    assert await error(suite_client, "parse_dcgm_diag", {"text": '{"something": 1}'})
    junk = await ok(suite_client, "scan_kernel_log", {"text": "\x00\xff binary \x01 junk"})
    assert junk["summary"] == []
    assert (await suite_client.list_tools()).tools  # still serving
