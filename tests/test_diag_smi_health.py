"""nvidia-smi parsing (-q text, -q -x XML, --query-gpu CSV), the health rules, and NVML snapshots (faked)."""

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.diagnostics import nvml
from servers.diagnostics.health import evaluate, evaluate_all
from servers.diagnostics.smi import normalise_bus_id, parse_nvidia_smi
from servers.diagnostics.snapshot import GpuSnapshot

FIXTURES = Path(__file__).parent / "fixtures" / "diagnostics" / "smi"
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"

Q_TEXT = FIXTURES / "nvidia-smi-q.8xH100.550.synthetic.txt"
XML = FIXTURES / "nvidia-smi-q-x.2xA100.525.synthetic.xml"
CSV_UNITS = FIXTURES / "query-gpu.4xH100.535.header-units.csv"
CSV_NOHEADER = FIXTURES / "query-gpu.2xL40S.noheader-nounits.csv"
CSV_590 = FIXTURES / "query-gpu.4xB200.590.header-units.csv"
NOHEADER_FIELDS = [
    "index",
    "uuid",
    "temperature.gpu",
    "power.draw",
    "memory.used",
    "remapped_rows.pending",
    "ecc.errors.uncorrected.volatile.total",
]


def checks(health: Any) -> dict[str, str]:
    return {f.check: f.severity for f in health.findings}


# ---------------------------------------------------------------------------------------------------------------------
# nvidia-smi -q text


@pytest.fixture(scope="module")
def q_parse():
    return parse_nvidia_smi(Q_TEXT.read_text())


def test_q_header_and_identity(q_parse) -> None:
    assert q_parse.format == "q"
    assert (q_parse.driver_version, q_parse.cuda_version) == ("550.90.07", "12.4")
    assert q_parse.warnings == []
    assert [g.index for g in q_parse.gpus] == list(range(8))
    assert [g.pci_bus_id for g in q_parse.gpus] == [
        "0000:18:00.0",
        "0000:2a:00.0",
        "0000:3a:00.0",
        "0000:5d:00.0",
        "0000:9a:00.0",
        "0000:ab:00.0",
        "0000:ba:00.0",
        "0000:db:00.0",
    ]
    assert q_parse.gpus[4].uuid == "GPU-e2b8c4d0-7f19-4a6c-95e3-0c1d8b4f6e05"
    assert all(g.name == "NVIDIA H100 80GB HBM3" and g.driver_version == "550.90.07" for g in q_parse.gpus)


def test_q_full_snapshot_of_the_dbe_gpu(q_parse) -> None:
    gpu = q_parse.gpus[1]
    assert dict(gpu) == {  # every field, the unknown ones too (model_dump leaves those out)
        "index": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-3c8d02a4-1e6b-4b9f-8d27-c4a1f5e60b02",
        "pci_bus_id": "0000:2a:00.0",
        "serial": "1650124001002",
        "vbios_version": "96.00.99.00.01",
        "driver_version": "550.90.07",
        "cuda_version": "12.4",
        "memory_total_mib": 81559.0,
        "memory_used_mib": 41210.0,
        "persistence_mode": True,
        "ecc_mode_enabled": True,
        "ecc_volatile_uncorrectable_sram": 0,
        "ecc_volatile_uncorrectable_dram": 2,
        "ecc_volatile_uncorrectable_total": 2,
        "ecc_aggregate_uncorrectable_sram": 0,
        "ecc_aggregate_uncorrectable_dram": 2,
        "ecc_aggregate_uncorrectable_total": 2,
        "ecc_volatile_correctable_total": 14,
        "ecc_aggregate_correctable_total": 131,
        "sram_threshold_exceeded": False,
        "retired_pages_sbe": None,
        "retired_pages_dbe": None,
        "retired_pages_pending": None,
        "remapped_rows_correctable": 1,
        "remapped_rows_uncorrectable": 2,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "reset_required": False,
        "drain_and_reset_recommended": False,
        "recovery_action": None,
        "clock_events": {
            "idle": False,
            "applications_clocks_setting": False,
            "sw_power_cap": False,
            "hw_slowdown": False,
            "hw_thermal_slowdown": False,
            "hw_power_brake_slowdown": False,
            "sync_boost": False,
            "sw_thermal_slowdown": False,
            "display_clock_setting": False,
        },
        "temperature_c": 47.0,
        "memory_temperature_c": 38.0,
        # T.Limit margins: 47 C now, 39 C below T.Limit (86 C); slowdown at T.Limit + 2, shutdown + 8, max op + 0
        "temperature_slowdown_c": 88.0,
        "temperature_shutdown_c": 94.0,
        "temperature_max_operating_c": 86.0,
        "power_draw_w": 402.17,
        "power_limit_w": 700.0,
        "pcie_gen_current": 5,
        "pcie_gen_max": 5,
        "pcie_width_current": 16,
        "pcie_width_max": 16,
        "nvlink_links_total": 18,
        "nvlink_links_down": [],
        "fabric_state": "Completed",
        "fabric_status": "Success",
        "utilization_gpu_pct": 64.0,
        "xid_errors": None,
        "unreachable": None,
        "unreachable_reason": None,
    }


def test_q_faulty_gpus_values(q_parse) -> None:
    remap, hot, nvlink, busy, na = (q_parse.gpus[i] for i in (2, 3, 4, 5, 6))
    assert (remap.remapped_rows_pending, remap.remapped_rows_uncorrectable, remap.ecc_aggregate_uncorrectable_dram) == (
        True,
        1,
        1,
    )
    assert remap.ecc_volatile_uncorrectable_total == 0
    assert hot.clock_events["hw_slowdown"] and hot.clock_events["hw_thermal_slowdown"]
    assert not hot.clock_events["hw_power_brake_slowdown"]
    assert (hot.pcie_width_current, hot.pcie_width_max, hot.temperature_c, hot.temperature_slowdown_c) == (
        8,
        16,
        85.0,
        88.0,
    )
    # the "Clocks Event Reasons Counters" section repeats the reason names with microseconds: not read as states
    assert hot.clock_events["sw_thermal_slowdown"] is False
    assert (nvlink.nvlink_links_total, nvlink.nvlink_links_down) == (18, [3, 11])
    assert busy.clock_events["sw_power_cap"] is True and busy.utilization_gpu_pct == 98.0
    # N/A -> None; the average power draw is N/A so the instantaneous reading is used
    assert na.memory_temperature_c is None and na.power_draw_w == 85.3
    assert na.persistence_mode is False
    assert q_parse.gpus[0].pcie_gen_current == 1 and q_parse.gpus[0].clock_events["idle"] is True


def test_q_findings_and_statuses(q_parse) -> None:
    healths = evaluate_all(q_parse.gpus)
    assert [h.status for h in healths] == [
        "healthy",
        "unhealthy",
        "degraded",
        "degraded",
        "unhealthy",
        "healthy",
        "healthy",
        "healthy",
    ]
    assert checks(healths[0]) == {}  # Gen1 of Gen5 while idle: power saving, not a fault
    assert checks(healths[1]) == {"ecc_uncorrectable_volatile": "critical", "ecc_uncorrectable_aggregate": "warning"}
    assert checks(healths[2]) == {"ecc_uncorrectable_aggregate": "warning", "row_remap_pending": "warning"}
    assert checks(healths[3]) == {
        "hw_thermal_slowdown": "warning",
        "temperature_near_slowdown": "warning",
        "pcie_width_degraded": "warning",
    }
    assert checks(healths[4]) == {"nvlink_down": "critical"}
    assert checks(healths[6]) == {"persistence_mode_off": "info"}
    dbe = healths[1].findings[0]
    assert "ecc_volatile_uncorrectable_total=2" in dbe.evidence and "reset" in dbe.action
    assert "nvlink_links_down=[3, 11]" in healths[4].findings[0].evidence


# ---------------------------------------------------------------------------------------------------------------------
# nvidia-smi -q -x


def test_xml_values_and_findings() -> None:
    parsed = parse_nvidia_smi(XML.read_text())
    assert parsed.format == "xml"
    assert (parsed.driver_version, parsed.cuda_version, len(parsed.gpus), parsed.warnings) == (
        "525.147.05",
        "12.0",
        2,
        [],
    )
    good, bad = parsed.gpus
    assert good.pci_bus_id == "0000:07:00.0" and bad.pci_bus_id == "0000:0f:00.0"
    assert bad.uuid == "GPU-a8d31e64-5c2b-49f0-b7e6-0d4c2a9f1e12" and bad.serial == "1323021045513"
    # older drivers: absolute temperature thresholds, "clocks_throttle_reasons", power_readings/enforced_power_limit
    assert (good.temperature_c, good.temperature_slowdown_c, good.temperature_shutdown_c) == (34.0, 89.0, 92.0)
    assert good.temperature_max_operating_c == 87.0 and good.memory_temperature_c == 41.0
    assert good.clock_events["idle"] is True and bad.clock_events["idle"] is False
    assert (good.power_draw_w, good.power_limit_w, bad.power_draw_w) == (61.27, 400.0, 377.04)
    assert (good.pcie_gen_current, good.pcie_gen_max, good.pcie_width_current) == (4, 4, 16)
    assert good.ecc_aggregate_correctable_total == 30 and good.retired_pages_dbe is None
    assert good.fabric_state is None  # N/A
    assert (bad.ecc_volatile_uncorrectable_sram, bad.ecc_volatile_uncorrectable_total) == (1, 1)
    assert (bad.ecc_aggregate_uncorrectable_sram, bad.ecc_aggregate_uncorrectable_dram) == (1, 4)
    assert bad.ecc_aggregate_uncorrectable_total == 5
    assert (bad.remapped_rows_uncorrectable, bad.remapped_rows_failure) == (8, True)
    good_h, bad_h = evaluate_all(parsed.gpus)
    assert good_h.status == "healthy" and good_h.findings == []
    assert bad_h.status == "unhealthy"
    assert checks(bad_h) == {
        "ecc_uncorrectable_volatile": "critical",
        "ecc_uncorrectable_aggregate": "critical",  # with a remap failure
        "ecc_sram_uncorrectable": "critical",
        "row_remap_failure": "critical",
    }


def test_xml_refuses_entities_and_inline_dtd() -> None:
    laughs = (
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>'
        "<nvidia_smi_log><gpu><uuid>&lol2;</uuid></gpu></nvidia_smi_log>"
    )
    with pytest.raises(InputError, match="ENTITY"):
        parse_nvidia_smi(laughs)
    external = '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><nvidia_smi_log/>'
    with pytest.raises(InputError, match="ENTITY"):
        parse_nvidia_smi(external)


def test_xml_truncated_keeps_complete_gpus_or_refuses() -> None:
    text = XML.read_text()
    second = text.index('<gpu id="00000000:0F:00.0">')
    cut = parse_nvidia_smi(text[: second + 400])
    assert len(cut.gpus) == 1 and cut.gpus[0].pci_bus_id == "0000:07:00.0"
    assert any("cut short" in w for w in cut.warnings)
    with pytest.raises(InputError, match="cut short"):
        parse_nvidia_smi(text[: text.index("<gpu ") + 300])
    with pytest.raises(InputError, match="nvidia_smi_log"):
        parse_nvidia_smi("<?xml version='1.0'?><html><body>hi</body></html>")
    with pytest.raises(InputError, match="no <gpu>"):
        parse_nvidia_smi("<nvidia_smi_log><driver_version>1</driver_version></nvidia_smi_log>")


# ---------------------------------------------------------------------------------------------------------------------
# --query-gpu CSV


def test_csv_header_with_units() -> None:
    parsed = parse_nvidia_smi(CSV_UNITS.read_text())
    assert (parsed.format, parsed.driver_version, len(parsed.gpus), parsed.warnings) == ("csv", "535.154.05", 4, [])
    g0, g1, g2, g3 = parsed.gpus
    assert g0.uuid == "GPU-71e0c3a2-9b4d-4f18-a6c2-5d8e1f0b3a21" and g0.pci_bus_id == "0000:19:00.0"
    assert (g0.memory_total_mib, g0.memory_used_mib, g0.power_draw_w, g0.power_limit_w) == (81559.0, 575.0, 70.12, 700)
    # the active bitmask (0x1: idle) and the per-reason cells are both used
    assert g0.clock_events["idle"] is True and g0.clock_events["hw_slowdown"] is False
    assert g1.clock_events["sw_power_cap"] is True
    assert g0.retired_pages_pending is None  # [N/A]
    assert (g2.memory_used_mib, g2.utilization_gpu_pct, g2.power_draw_w, g2.reset_required) == (None, None, None, True)
    # [Unknown Error], [Not Supported], [Requested functionality has been deprecated]: None, never 0
    assert g3.temperature_c is None and g3.power_draw_w is None and g3.ecc_volatile_uncorrectable_total is None
    assert g3.reset_required is None and g3.clock_events == {}
    healths = evaluate_all(parsed.gpus)
    assert [h.status for h in healths] == ["healthy", "degraded", "unhealthy", "unknown"]
    assert checks(healths[1]) == {"power_above_limit": "warning", "pcie_gen_degraded": "warning"}
    assert checks(healths[2]) == {"reset_required": "critical"}
    assert healths[3].findings == []


def test_csv_noheader_needs_fields() -> None:
    text = CSV_NOHEADER.read_text()
    with pytest.raises(InputError, match="fields"):
        parse_nvidia_smi(text)
    parsed = parse_nvidia_smi(text, fields=NOHEADER_FIELDS)
    assert parsed.format == "csv" and parsed.driver_version is None
    g0, g1 = parsed.gpus
    assert (g0.index, g0.uuid, g0.temperature_c, g0.power_draw_w, g0.memory_used_mib) == (
        0,
        "GPU-5a0e7c3d-1b9f-4e26-8c4a-f7d2b6e01931",
        45.0,
        312.5,
        40211.0,
    )
    assert (g1.power_draw_w, g1.remapped_rows_pending, g1.ecc_volatile_uncorrectable_total) == (None, True, 0)
    assert [h.status for h in evaluate_all(parsed.gpus)] == ["healthy", "degraded"]
    # field names with units, and query aliases (gpu_uuid), are accepted too
    aliased = parse_nvidia_smi("0, GPU-x, 575 MiB\n", fields=["index", "gpu_uuid", "memory.used [MiB]"])
    assert aliased.gpus[0].uuid == "GPU-x" and aliased.gpus[0].memory_used_mib == 575.0


def test_csv_590_recovery_action_and_fabric() -> None:
    parsed = parse_nvidia_smi(CSV_590.read_text())
    assert (parsed.driver_version, len(parsed.gpus)) == ("590.48.01", 4)
    g0, g1, g2, g3 = parsed.gpus
    assert (g0.recovery_action, g0.fabric_state, g0.fabric_status) == ("None", "Completed", "Success")
    assert g1.recovery_action == "Drain and Reset"
    assert (g2.fabric_state, g2.fabric_status) == ("In Progress", None)
    assert g3.clock_events["hw_slowdown"] and g3.clock_events["hw_power_brake_slowdown"]
    assert g3.sram_threshold_exceeded is True and g3.power_draw_w == 996.31 and g3.power_limit_w == 1000.0
    assert g1.ecc_volatile_uncorrectable_dram == 3 and g1.ecc_volatile_uncorrectable_total == 3
    healths = evaluate_all(parsed.gpus)
    assert [h.status for h in healths] == ["healthy", "unhealthy", "unhealthy", "unhealthy"]
    recovery = next(f for f in healths[1].findings if f.check == "recovery_action")
    assert recovery.severity == "critical" and "Drain and Reset" in recovery.what and "reset" in recovery.action
    assert checks(healths[2]) == {"fabric_not_ready": "critical"}
    assert checks(healths[3]) == {"ecc_sram_threshold_exceeded": "critical", "hw_power_brake_slowdown": "warning"}


def test_csv_short_row_is_a_warning() -> None:
    lines = CSV_UNITS.read_text().splitlines()
    parsed = parse_nvidia_smi("\n".join([*lines[:3], lines[3][:40]]))
    assert len(parsed.gpus) == 2
    assert any("line 4" in w and "skipped" in w for w in parsed.warnings)


# ---------------------------------------------------------------------------------------------------------------------
# errors and truncation


@pytest.mark.parametrize(
    "text",
    ["", "   \n\t\n", "\x00\x01\x02\x03garbage\x00" * 10, "hello world\nthis is not nvidia-smi", "\ufffd" * 500],
)
def test_unusable_input_says_which_formats(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_nvidia_smi(text)
    assert "nvidia-smi -q" in str(info.value) and "--query-gpu" in str(info.value)


def test_binary_bytes_are_refused() -> None:
    with pytest.raises(InputError, match="binary"):
        parse_nvidia_smi(bytes(range(256)) * 8)


def test_q_truncated_output_warns() -> None:
    text = Q_TEXT.read_text()
    third = text.index("GPU 00000000:3A:00.0")
    cut = parse_nvidia_smi(text[: third + 2000])
    assert len(cut.gpus) == 3
    assert any("Attached GPUs" in w and "8" in w for w in cut.warnings)
    assert any("cut short" in w for w in cut.warnings)
    # the GPUs before the cut are intact
    assert cut.gpus[1].ecc_volatile_uncorrectable_dram == 2


def test_q_without_gpu_block_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no 'GPU"):
        parse_nvidia_smi("==============NVSMI LOG==============\nDriver Version : 550.90.07\nAttached GPUs : 0\n")


def test_normalise_bus_id() -> None:
    assert normalise_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert normalise_bus_id("0000:1b:00.0") == "0000:1b:00.0"
    assert normalise_bus_id("00000001:AB:1F.7") == "0001:ab:1f.7"
    assert normalise_bus_id("1b:00.0") == "0000:1b:00.0"
    assert normalise_bus_id("[N/A]") is None and normalise_bus_id("GPU-1234") is None


FIXTURE_TEXTS = [p.read_text() for p in (Q_TEXT, XML, CSV_UNITS, CSV_590)]


def _parse_or_input_error(text: str, fields: list[str] | None = None) -> None:
    try:
        parsed = parse_nvidia_smi(text, fields=fields)
    except InputError:
        return
    evaluate_all(parsed.gpus)  # whatever was parsed can be judged


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(FIXTURE_TEXTS) - 1), cut=st.floats(0, 1))
def test_random_truncation_raises_only_input_error(which: int, cut: float) -> None:
    text = FIXTURE_TEXTS[which]
    _parse_or_input_error(text[: int(len(text) * cut)])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(FIXTURE_TEXTS) - 1),
    edits=st.lists(st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=8)), min_size=1, max_size=20),
)
def test_random_byte_corruption_raises_only_input_error(which: int, edits: list[tuple[float, bytes]]) -> None:
    data = bytearray(FIXTURE_TEXTS[which].encode())
    for where, junk in edits:
        at = int(where * (len(data) - 1))
        data[at : at + len(junk)] = junk
    _parse_or_input_error(data.decode("utf-8", errors="replace"))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=2000), with_fields=st.booleans())
def test_arbitrary_text_raises_only_input_error(text: str, with_fields: bool) -> None:
    _parse_or_input_error(text, NOHEADER_FIELDS if with_fields else None)


@settings(max_examples=100, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from([*CSV_NOHEADER.read_text().splitlines(), "[N/A], , ,", ",,,,,,", '"a,b", 1, 2, 3, 4, 5, 6']),
        max_size=6,
    )
)
def test_noheader_csv_fragments_raise_only_input_error(lines: list[str]) -> None:
    _parse_or_input_error("\n".join(lines), NOHEADER_FIELDS)


# ---------------------------------------------------------------------------------------------------------------------
# the real samples (../shared/samples beside the checkout): what a person reading them sees


@pytest.mark.skipif(not (SAMPLES / "nvidia-smi-q.8xH100.535.183.01.txt").is_file(), reason="shared samples absent")
def test_real_q_sample_8xh100() -> None:
    parsed = parse_nvidia_smi((SAMPLES / "nvidia-smi-q.8xH100.535.183.01.txt").read_text())
    assert (parsed.format, parsed.driver_version, parsed.cuda_version, parsed.warnings) == (
        "q",
        "535.183.01",
        "12.2",
        [],
    )
    assert len(parsed.gpus) == 8
    assert [g.pci_bus_id for g in parsed.gpus] == [
        "0000:53:00.0",
        "0000:64:00.0",
        "0000:75:00.0",
        "0000:86:00.0",
        "0000:97:00.0",
        "0000:a8:00.0",
        "0000:b9:00.0",
        "0000:ca:00.0",
    ]
    assert parsed.gpus[0].uuid == "GPU-566e6f65-c38e-b12f-4824-6944218668b9"
    assert parsed.gpus[0].serial == "1655022005478"
    assert parsed.gpus[7].uuid == "GPU-7e78e6c8-c71c-66c7-9ded-f8836cecab32"
    first = parsed.gpus[0]
    assert first.name == "NVIDIA H100 80GB HBM3" and first.vbios_version == "96.00.74.00.01"
    assert (first.memory_total_mib, first.memory_used_mib, first.power_draw_w, first.power_limit_w) == (
        81559.0,
        0.0,
        71.97,
        700.0,
    )
    # 36 C with 50 C of margin to T.Limit; slowdown -2 C past it, shutdown -8 C
    assert (first.temperature_c, first.temperature_slowdown_c, first.temperature_shutdown_c) == (36.0, 88.0, 94.0)
    assert first.retired_pages_dbe is None and first.remapped_rows_pending is False
    assert (first.fabric_state, first.fabric_status) == ("Completed", "Success")
    third = parsed.gpus[2]  # GPU 00000000:75:00.0 reads SW Power Cap, HW Power Brake and SW Thermal active
    assert third.uuid == "GPU-973565ff-45cf-12ea-4e91-33386720f7bb"
    assert {k for k, v in third.clock_events.items() if v} == {
        "sw_power_cap",
        "hw_power_brake_slowdown",
        "sw_thermal_slowdown",
    }
    assert third.memory_used_mib == 9221.0 and third.power_draw_w == 118.01
    healths = evaluate_all(parsed.gpus)
    assert [h.status for h in healths] == ["healthy", "healthy", "degraded"] + ["healthy"] * 5
    assert checks(healths[2]) == {"hw_power_brake_slowdown": "warning", "sw_thermal_slowdown": "info"}


@pytest.mark.skipif(not (SAMPLES / "nvidia-smi-query-gpu.H100.590.48.01.csv.txt").is_file(), reason="samples absent")
def test_real_query_gpu_sample_590() -> None:
    parsed = parse_nvidia_smi((SAMPLES / "nvidia-smi-query-gpu.H100.590.48.01.csv.txt").read_text())
    assert (parsed.format, parsed.driver_version, len(parsed.gpus), parsed.warnings) == ("csv", "590.48.01", 1, [])
    gpu = parsed.gpus[0]
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000" and gpu.pci_bus_id == "0000:00:09.0"
    assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.vbios_version == "96.00.A5.00.01"
    assert (gpu.recovery_action, gpu.fabric_state, gpu.fabric_status) == ("None", "Completed", "Success")
    assert (gpu.temperature_c, gpu.memory_temperature_c, gpu.power_draw_w, gpu.power_limit_w) == (41, 48, 69.85, 700)
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_width_current, gpu.pcie_width_max) == (5, 5, 16, 16)
    assert gpu.clock_events["idle"] is True and gpu.sram_threshold_exceeded is False
    assert gpu.retired_pages_sbe is None and gpu.retired_pages_pending is None  # [N/A]
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_failure, gpu.ecc_volatile_uncorrectable_total) == (
        False,
        False,
        0,
    )
    assert gpu.temperature_slowdown_c is None  # --query-gpu gives the T.Limit margin, not the thresholds
    health = evaluate(gpu)
    assert health.status == "healthy" and health.findings == []


# ---------------------------------------------------------------------------------------------------------------------
# health rules on hand-made snapshots

KNOWN = {"temperature_c": 40.0, "ecc_volatile_uncorrectable_total": 0, "remapped_rows_pending": False}


def judge(**fields: Any) -> Any:
    return evaluate(GpuSnapshot(**{**KNOWN, **fields}))


def test_status_healthy_needs_key_fields() -> None:
    assert judge().status == "healthy"
    assert evaluate(GpuSnapshot()).status == "unknown"
    assert evaluate(GpuSnapshot(temperature_c=40)).status == "unknown"  # no ECC / remap information
    assert evaluate(GpuSnapshot(persistence_mode=False)).status == "unknown"  # info does not make it healthy


@pytest.mark.parametrize(
    ("fields", "check", "severity"),
    [
        ({"ecc_volatile_uncorrectable_dram": 1}, "ecc_uncorrectable_volatile", "critical"),
        ({"ecc_aggregate_uncorrectable_total": 3}, "ecc_uncorrectable_aggregate", "warning"),
        (
            {"ecc_aggregate_uncorrectable_total": 3, "remapped_rows_failure": True},
            "ecc_uncorrectable_aggregate",
            "critical",
        ),
        ({"ecc_aggregate_uncorrectable_sram": 1}, "ecc_sram_uncorrectable", "critical"),
        ({"sram_threshold_exceeded": True}, "ecc_sram_threshold_exceeded", "critical"),
        ({"remapped_rows_pending": True}, "row_remap_pending", "warning"),
        ({"remapped_rows_failure": True}, "row_remap_failure", "critical"),
        ({"retired_pages_pending": True}, "retired_pages_pending", "warning"),
        ({"retired_pages_sbe": 12, "retired_pages_dbe": 48}, "retired_pages_high", "critical"),
        ({"reset_required": True}, "reset_required", "critical"),
        ({"drain_and_reset_recommended": True}, "drain_and_reset_recommended", "critical"),
        ({"recovery_action": "Reboot"}, "recovery_action", "critical"),
        ({"recovery_action": "GPU_RESET"}, "recovery_action", "critical"),
        ({"clock_events": {"hw_slowdown": True}}, "hw_slowdown", "warning"),
        ({"clock_events": {"hw_slowdown": True, "hw_thermal_slowdown": True}}, "hw_thermal_slowdown", "warning"),
        ({"clock_events": {"hw_power_brake_slowdown": True}}, "hw_power_brake_slowdown", "warning"),
        ({"clock_events": {"sw_thermal_slowdown": True}}, "sw_thermal_slowdown", "info"),
        (
            {"clock_events": {"sw_thermal_slowdown": True}, "temperature_c": 88, "temperature_max_operating_c": 87},
            "sw_thermal_slowdown",
            "warning",
        ),
        ({"temperature_c": 89, "temperature_slowdown_c": 89}, "temperature_at_slowdown", "critical"),
        ({"temperature_c": 84, "temperature_slowdown_c": 89}, "temperature_near_slowdown", "warning"),
        ({"power_draw_w": 701.5, "power_limit_w": 700}, "power_above_limit", "warning"),
        ({"pcie_width_current": 8, "pcie_width_max": 16}, "pcie_width_degraded", "warning"),
        ({"pcie_gen_current": 3, "pcie_gen_max": 5, "utilization_gpu_pct": 40}, "pcie_gen_degraded", "warning"),
        (
            {"pcie_gen_current": 1, "pcie_gen_max": 5, "utilization_gpu_pct": 0, "clock_events": {"idle": False}},
            "pcie_gen_degraded",
            "warning",
        ),
        ({"persistence_mode": False}, "persistence_mode_off", "info"),
        ({"fabric_state": "In Progress"}, "fabric_not_ready", "critical"),
        ({"fabric_state": "Completed", "fabric_status": "Failure"}, "fabric_error", "critical"),
        ({"xid_errors": 79}, "xid_reported", "warning"),
    ],
)
def test_each_rule(fields: dict[str, Any], check: str, severity: str) -> None:
    health = judge(**fields)
    found = checks(health)
    assert found.get(check) == severity, found
    finding = next(f for f in health.findings if f.check == check)
    assert finding.evidence and finding.action and finding.what
    expected = {"critical": "unhealthy", "warning": "degraded", "info": "healthy"}[severity]
    assert health.status == expected or (severity != "critical" and health.status == "unhealthy")


@pytest.mark.parametrize(
    "fields",
    [
        {"recovery_action": "None"},
        {"retired_pages_sbe": 10, "retired_pages_dbe": 2},
        {"temperature_c": 83.9, "temperature_slowdown_c": 89},
        {"power_draw_w": 700, "power_limit_w": 700},
        {"pcie_gen_current": 1, "pcie_gen_max": 5, "utilization_gpu_pct": 0, "clock_events": {"idle": True}},
        {"pcie_gen_current": 1, "pcie_gen_max": 5},  # nothing says the GPU is busy
        {"fabric_state": "Completed", "fabric_status": "Success"},
        {"clock_events": {"sw_power_cap": True, "idle": False}},
        {"xid_errors": 0},
    ],
)
def test_no_finding(fields: dict[str, Any]) -> None:
    health = judge(**fields)
    assert [f for f in health.findings if f.severity != "info"] == [], checks(health)
    assert health.status == "healthy"


def test_recovery_action_is_named_with_its_action() -> None:
    finding = judge(recovery_action="Drain P2P").findings[0]
    assert "Drain P2P" in finding.what and "P2P" in finding.action and finding.evidence == "recovery_action=Drain P2P"


def test_nvlink_down_only_where_nvlink_applies() -> None:
    all_down = {"nvlink_links_total": 12, "nvlink_links_down": list(range(12))}
    # an H100 PCIe card without a bridge reports every link inactive: a known false positive, not flagged
    assert "nvlink_down" not in checks(judge(name="NVIDIA H100 PCIe", **all_down))
    assert "nvlink_down" not in checks(judge(name="Some Unknown GPU", **all_down))
    assert checks(evaluate(GpuSnapshot(**KNOWN, **all_down), interconnect_expected="nvlink"))["nvlink_down"] == (
        "critical"
    )
    # an SXM part (catalog: NVLink) with links down, or any GPU with some links up and some down
    assert checks(judge(name="NVIDIA H100 80GB HBM3", **all_down))["nvlink_down"] == "critical"
    partial = {"nvlink_links_total": 18, "nvlink_links_down": [2]}
    assert checks(judge(name="Some Unknown GPU", **partial))["nvlink_down"] == "critical"
    told_pcie = evaluate(GpuSnapshot(**KNOWN, name="NVIDIA H100 80GB HBM3", **partial), interconnect_expected="pcie")
    assert "nvlink_down" not in checks(told_pcie)
    with pytest.raises(InputError, match="interconnect_expected"):
        evaluate(GpuSnapshot(), interconnect_expected="infiniband")


def test_unknown_fields_never_trigger() -> None:
    health = evaluate(GpuSnapshot(name="NVIDIA H100 80GB HBM3"))
    assert health.findings == [] and health.status == "unknown"


# ---------------------------------------------------------------------------------------------------------------------
# NVML


def test_nvml_without_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    snapshots, reason = nvml.read_snapshots()
    assert snapshots == [] and reason is not None and "NVML could not start" in reason


class _Pci:
    busId = b"00000000:1B:00.0"  # noqa: N815 - pynvml's field name


class _Memory:
    total = 80 * 2**30
    used = 512 * 2**20


class _Utilization:
    gpu = 97


def test_nvml_snapshot_mapping_with_fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    # Anything not faked below must fail as "uninitialised" (and so read as unknown), never reach a real library.
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    unc, vol = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC

    def nvlink_state(handle: object, link: int) -> int:
        if link >= 18:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link == 5 else 1

    def thresholds(handle: object, kind: int) -> int:
        known = {pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 90, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 95}
        if kind not in known:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return known[kind]

    fakes = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "550.90.07",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: ("handle", i),
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetUUID": lambda h: "GPU-feedface-0000-4000-8000-000000000001",
        "nvmlDeviceGetPciInfo": lambda h: _Pci(),
        "nvmlDeviceGetMemoryInfo": lambda h: _Memory(),
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 2 if (kind, counter) == (unc, vol) else 0,
        "nvmlDeviceGetRemappedRows": lambda h: (0, 2, 1, 0),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x48,
        "nvmlDeviceGetTemperature": lambda h, sensor: 71,
        "nvmlDeviceGetTemperatureThreshold": thresholds,
        "nvmlDeviceGetPowerUsage": lambda h: 350_500,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
        "nvmlDeviceGetUtilizationRates": lambda h: _Utilization(),
        "nvmlDeviceGetNvLinkState": nvlink_state,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)
    snapshots, reason = nvml.read_snapshots()
    assert reason is None and len(snapshots) == 1
    gpu = snapshots[0]
    assert (gpu.index, gpu.name, gpu.pci_bus_id, gpu.driver_version, gpu.cuda_version) == (
        0,
        "NVIDIA H100 80GB HBM3",
        "0000:1b:00.0",
        "550.90.07",
        "12.4",
    )
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (81920.0, 512.0)
    assert (gpu.ecc_volatile_uncorrectable_total, gpu.ecc_aggregate_uncorrectable_total) == (2, 0)
    assert (gpu.remapped_rows_uncorrectable, gpu.remapped_rows_pending, gpu.remapped_rows_failure) == (2, True, False)
    assert gpu.clock_events["hw_slowdown"] and gpu.clock_events["hw_thermal_slowdown"]
    assert not gpu.clock_events["idle"]
    assert (gpu.temperature_c, gpu.temperature_slowdown_c, gpu.temperature_shutdown_c) == (71.0, 90.0, 95.0)
    assert (gpu.power_draw_w, gpu.power_limit_w, gpu.utilization_gpu_pct) == (350.5, 700.0, 97.0)
    assert (gpu.nvlink_links_total, gpu.nvlink_links_down) == (18, [5])
    # queries the fake does not answer are unknown, not zero
    assert gpu.serial is None and gpu.pcie_gen_current is None and gpu.retired_pages_dbe is None
    assert gpu.temperature_max_operating_c is None and gpu.fabric_state is None and gpu.recovery_action is None
    assert gpu.ecc_volatile_uncorrectable_dram is None and gpu.persistence_mode is None
    health = evaluate(gpu)
    assert checks(health) == {
        "ecc_uncorrectable_volatile": "critical",
        "row_remap_pending": "warning",
        "hw_thermal_slowdown": "warning",
        "nvlink_down": "critical",
    }


def test_an_unreachable_gpu_is_unhealthy() -> None:
    health = evaluate(GpuSnapshot(index=3, unreachable=True))
    assert health.status == "unhealthy" and health.findings[0].check == "gpu_unreachable"


# ---------------------------------------------------------------------------------------------------------------------
# GPUs nvidia-smi or NVML lists but cannot reach (issue 22, defect 6)

Q_LOST = FIXTURES / "nvidia-smi-q.8xH100.535.lost-3b.synthetic.txt"
CSV_LOST = FIXTURES / "query-gpu.4xH100.550.lost-gpu.header-units.csv"
LOST_3B = "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"


def _statuses(gpus: list[GpuSnapshot]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for health in evaluate_all(gpus):
        counts[health.status] = counts.get(health.status, 0) + 1
    return counts


def _assert_fallen_off(health: Any, line: str) -> None:
    assert health.status == "unhealthy" and health.gpu.unreachable is True
    [finding] = [f for f in health.findings if f.check == "gpu_unreachable"]
    assert finding.severity == "critical" and line in finding.evidence
    assert "fallen off the bus" in finding.what
    assert all(word in finding.action for word in ("Drain", "Xid 79", "reboot", "reseat"))


def test_a_lost_gpu_line_in_q_output_is_an_unhealthy_gpu_counted_with_the_others() -> None:
    """The reproduction: 7 blocks and the lost line gave '7 GPU(s) ... 6 healthy, 1 unhealthy' and a garbled line."""
    parsed = parse_nvidia_smi(Q_LOST.read_text())
    assert parsed.format == "q" and parsed.driver_version == "535.216.01"
    assert len(parsed.gpus) == 8 and _statuses(parsed.gpus) == {"healthy": 6, "unhealthy": 2}
    assert parsed.warnings == []  # no 'garbled line', no 'Attached GPUs says 8 but only 7 blocks'
    lost = parsed.gpus[2]
    assert (lost.index, lost.pci_bus_id, lost.driver_version) == (2, "0000:3b:00.0", "535.216.01")
    assert lost.unreachable_reason == f"nvidia-smi: {LOST_3B}"
    assert [g.index for g in parsed.gpus] == list(range(8))  # the lost GPU takes its place in PCI bus order
    assert [g.pci_bus_id for g in parsed.gpus][3:5] == ["0000:5d:00.0", "0000:9a:00.0"]
    _assert_fallen_off(evaluate(lost), LOST_3B)


@pytest.mark.parametrize(
    ("line", "bus"),
    [
        ("Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error", "0000:0b:00.0"),
        ("Unable to determine the device handle for GPU00000000:3B:00.0: Unknown Error", "0000:3b:00.0"),
        (
            "Unable to determine the device handle for gpu 0000:3b:00.0: GPU is lost.  Reboot the system to recover "
            "this GPU",
            "0000:3b:00.0",
        ),
    ],
)
@pytest.mark.parametrize("where", ["top", "between blocks", "end"])
def test_every_spelling_of_the_lost_line_anywhere_in_q_output(line: str, bus: str, where: str) -> None:
    text = Q_LOST.read_text().replace(LOST_3B + "\n", "")
    if where == "top":
        text = line + "\n" + text
    elif where == "end":
        text = text + line + "\n"
    else:
        text = text.replace("GPU 00000000:5D:00.0\n", line + "\nGPU 00000000:5D:00.0\n")
    parsed = parse_nvidia_smi(text)
    assert len(parsed.gpus) == 8 and parsed.warnings == []
    [lost] = [g for g in parsed.gpus if g.unreachable]
    assert lost.pci_bus_id == bus
    health = evaluate(lost)
    _assert_fallen_off(health, " ".join(line.split()))
    assert ("asks for a reboot" in health.findings[0].what) == ("Reboot the system" in line)


def test_the_lost_line_alone_is_that_gpu() -> None:
    """Plain `nvidia-smi` prints only this line when a GPU has fallen off the bus."""
    parsed = parse_nvidia_smi("Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error\n")
    assert parsed.format == "message" and len(parsed.gpus) == 1
    [gpu] = parsed.gpus
    assert (gpu.index, gpu.pci_bus_id, gpu.unreachable) == (None, "0000:0b:00.0", True)
    _assert_fallen_off(evaluate(gpu), "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error")


def test_repeated_lost_lines_are_one_gpu_and_a_report_at_that_address_is_marked() -> None:
    text = Q_LOST.read_text() + LOST_3B + "\n" + LOST_3B.replace("3B", "9A") + "\n"
    parsed = parse_nvidia_smi(text)
    assert len(parsed.gpus) == 8  # 3B once; 9A has a report, marked unreachable there
    [at_9a] = [g for g in parsed.gpus if g.pci_bus_id == "0000:9a:00.0"]
    assert at_9a.unreachable and "also printed a report" in (at_9a.unreachable_reason or "")
    assert at_9a.ecc_volatile_uncorrectable_total == 1  # what the report said is kept
    assert _statuses(parsed.gpus) == {"healthy": 6, "unhealthy": 2}


def test_a_lost_gpu_in_query_gpu_csv() -> None:
    parsed = parse_nvidia_smi(CSV_LOST.read_text())
    assert parsed.format == "csv" and parsed.warnings == []  # not 'line has 1 cell(s) but the header has 11'
    assert len(parsed.gpus) == 4 and _statuses(parsed.gpus) == {"healthy": 3, "unhealthy": 1}
    assert [g.index for g in parsed.gpus] == [0, 1, 3, None]  # explicit indexes kept; the lost one's is unknown
    lost = parsed.gpus[3]
    assert lost.pci_bus_id == "0000:9b:00.0" and lost.driver_version == "550.127.05"
    _assert_fallen_off(evaluate(lost), "for gpu 0000:9b:00.0: GPU is lost. Reboot the system to recover this GPU")
    header = CSV_LOST.read_text().splitlines()[0]
    only = parse_nvidia_smi(f"{header}\n{LOST_3B}\n")  # every GPU queried was unreachable
    assert only.format == "csv" and [g.pci_bus_id for g in only.gpus] == ["0000:3b:00.0"]


def test_gpu_is_lost_in_a_gpus_cells_marks_it_unreachable() -> None:
    text = "index, pci.bus_id, temperature.gpu, ecc.errors.uncorrected.volatile.total\n0, 00000000:1B:00.0, 40, 0\n"
    text += "1, 00000000:43:00.0, [GPU is lost], [GPU is lost]\n"
    gpus = parse_nvidia_smi(text).gpus
    assert [g.unreachable for g in gpus] == [None, True] and gpus[1].temperature_c is None
    assert checks(evaluate(gpus[1])) == {"gpu_unreachable": "critical"}
    xml = XML.read_text().replace("<gpu_temp>34 C</gpu_temp>", "<gpu_temp>GPU is lost</gpu_temp>", 1)
    assert xml != XML.read_text()
    assert [g.unreachable for g in parse_nvidia_smi(xml).gpus] == [True, None]


def test_a_lost_gpu_line_before_xml_output() -> None:
    text = "Unable to determine the device handle for GPU 0000:C1:00.0: Unknown Error\n" + XML.read_text()
    parsed = parse_nvidia_smi(text)
    assert parsed.format == "xml" and len(parsed.gpus) == 3
    assert [(g.index, g.pci_bus_id, g.unreachable) for g in parsed.gpus][2] == (2, "0000:c1:00.0", True)


def test_no_devices_were_found_is_said() -> None:
    alone = parse_nvidia_smi("No devices were found\n")
    assert alone.format == "message" and alone.gpus == []
    [warning] = alone.warnings
    assert "No devices were found" in warning and "lspci -d 10de:" in warning and "Xid 79" in warning
    header = CSV_UNITS.read_text().splitlines()[0]
    with_header = parse_nvidia_smi(f"{header}\nNo devices were found\n")
    assert with_header.format == "csv" and with_header.gpus == [] and with_header.warnings == alone.warnings


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    buses=st.lists(st.integers(0, 0xFF), min_size=1, max_size=6, unique=True),
    positions=st.lists(st.floats(0, 1), min_size=6, max_size=6),
)
def test_property_every_lost_line_is_one_more_unhealthy_gpu(buses: list[int], positions: list[float]) -> None:
    """Wherever nvidia-smi's lost lines fall in a report, each distinct address not already reported adds one GPU,
    unhealthy and unreachable, and every GPU is still counted once."""
    lines = Q_LOST.read_text().replace(LOST_3B + "\n", "").splitlines()
    reported = {"18", "2a", "5d", "9a", "ab", "ba", "db"}
    for bus, where in zip(buses, positions, strict=False):
        at = int(where * len(lines))
        lines.insert(at, f"Unable to determine the device handle for GPU 0000:{bus:02X}:00.0: Unknown Error")
    parsed = parse_nvidia_smi("\n".join(lines))
    new = {f"{b:02x}" for b in buses} - reported
    assert len(parsed.gpus) == 7 + len(new)
    assert len({g.pci_bus_id for g in parsed.gpus}) == len(parsed.gpus)
    lost = [g for g in parsed.gpus if g.unreachable]
    assert {g.pci_bus_id for g in lost} == {f"0000:{b:02x}:00.0" for b in buses}
    assert all(h.status == "unhealthy" for h in evaluate_all(lost))


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, handle: Any, **more: Any) -> None:
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    fakes = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "550.90.07",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",
        **more,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)


def test_nvml_a_handle_that_fails_with_gpu_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def handle(index: int) -> tuple[str, int]:
        if index == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return ("handle", index)

    _fake_nvml(monkeypatch, handle)
    snapshots, reason = nvml.read_snapshots()
    assert reason is None and [g.unreachable for g in snapshots] == [None, True]
    lost = snapshots[1]
    assert (lost.index, lost.driver_version, lost.cuda_version) == (1, "550.90.07", "12.4")
    assert lost.unreachable_reason == "NVML, GPU index 1: nvmlDeviceGetHandleByIndex: GPU is lost"
    _assert_fallen_off(evaluate(lost), "GPU is lost")


def test_nvml_queries_that_answer_gpu_is_lost_after_the_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def gone(*args: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    _fake_nvml(
        monkeypatch,
        lambda i: ("handle", i),
        nvmlDeviceGetPciInfo=lambda h: _Pci(),
        nvmlDeviceGetMemoryInfo=gone,
        nvmlDeviceGetTemperature=gone,
    )
    snapshots, reason = nvml.read_snapshots()
    assert reason is None and all(g.unreachable for g in snapshots)
    assert snapshots[0].pci_bus_id == "0000:1b:00.0"  # NVML still gave the address
    assert "nvmlDeviceGetMemoryInfo: GPU is lost" in (snapshots[0].unreachable_reason or "")
    assert {evaluate(g).status for g in snapshots} == {"unhealthy"}  # not "unknown" with every field None


def test_live_gpus_without_driver_says_so_in_one_phrase(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    live = nvml.live_gpus()
    assert not live.available and live.snapshots == []
    assert live.missing is not None and live.missing.startswith("NVML not available here: no usable NVIDIA driver")
