"""Kernel-log scanner (servers/diagnostics/kmsg/): every line shape and timestamp form, PCI->UUID maps, floods,
escalation across boots, unknown codes, NVLink5 subcodes, robustness to junk, bounded memory, and a real log."""

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError, NotFoundError
from servers.diagnostics.kmsg import (
    DEFAULT_ACTION,
    FLOOD_THRESHOLD,
    KernelLogScan,
    normalize_pci,
    parse_prefix,
    scan_file,
    scan_kernel_log,
    scan_text,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "diagnostics" / "kmsg"
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
UUID_3B = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
UUID_5D = "GPU-11111111-2222-3333-4444-555555555555"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def catalog(known: dict[int, tuple[str, str]]):  # type: ignore[no-untyped-def]
    """A classifier that knows only the Xid/SXid codes given."""

    def classify(kind: str, code: int | None, message: str) -> tuple[str, str]:
        if code in known and kind in ("xid", "sxid"):
            return known[code]
        return "unknown", DEFAULT_ACTION

    return classify


def brief(scan: KernelLogScan) -> list[tuple]:
    return [(e.kind, e.code, e.pci_bus_id, e.line_number) for e in scan.events]


# ---------------------------------------------------------------------------------------------------------------
# line shapes


def test_every_line_shape_in_the_uptime_fixture() -> None:
    scan = scan_file(FIXTURES / "shapes-uptime.log")
    assert brief(scan) == [
        ("xid", 79, "0000:3b:00", 7),
        ("fallen_off_bus", None, "0000:3b:00.0", 8),
        ("xid", 13, "0000:5d:00", 10),
        ("xid", 31, "0000:5d:00", 11),
        ("xid", 43, "0000:5d:00", 12),
        ("xid", 63, "0000:9b:00", 13),
        ("xid", 149, "0000:c1:00", 14),
        ("xid", 149, "0000:c1:00", 15),
        ("recovery_action", 154, "0000:c1:00", 16),
        ("sxid", 20034, "0000:05:00.0", 17),
        ("sxid", 12028, "0000:07:00.0", 20),
        ("nccl_segfault", None, None, 21),
        ("fallen_off_bus", None, "0000:86:00.0", 24),
    ]
    assert scan.lines_read == 29
    assert scan.bytes_read == (FIXTURES / "shapes-uptime.log").stat().st_size
    # 2 boot markers, 2 GPU-at + 2 serial lines, 13 events, 2 SXid continuation lines, 2 more fallen-off-bus lines
    assert scan.matched_lines == 23
    assert scan.boots == 1 and all(e.boot == 0 for e in scan.events)
    assert scan.parse_errors == 0 and not scan.events_truncated

    xid79, fob, xid13, xid31, xid43, xid63, nvl_fatal, nvl_ber, rec, sx_fatal, sx_nonfatal, segv, fob3 = scan.events
    assert (xid79.pid, xid79.process, xid79.message) == (4113, "python3", "GPU has fallen off the bus.")
    assert (xid79.uptime_s, xid79.time) == (1203.11853, None)
    assert xid13.message.startswith("Graphics SM Warp Exception") and xid13.pid == 8841
    assert (xid31.pid, xid31.process) == (None, None) and xid31.message.startswith("Ch 00000008, intr")
    assert (xid43.pid, xid43.process, xid43.message) == (None, None, "Ch 00000010")
    assert xid63.pid is None and xid63.message.startswith("Row Remapper: New row")
    assert fob.message == "GPU 0000:3b:00.0: GPU has fallen off the bus." and fob.severity == "critical"
    assert fob3.message == (
        "The NVIDIA GPU 0000:86:00.0 (PCI ID: 10de:2330) installed in this system has fallen off the bus "
        "and is not responding to commands."
    )
    assert (fob3.uptime_s, fob3.line_number) == (3600.0, 24)
    assert (rec.recovery_action, rec.severity) == ("Drain and Reset", "critical")
    assert "drain" in rec.action.lower() and "reset" in rec.action.lower()
    assert (sx_fatal.device, sx_fatal.fatal, sx_fatal.link, sx_fatal.message) == (
        "nvidia-nvswitch3",
        True,
        48,
        "Fatal, Link 48 LTSSM Fault Up",
    )
    assert (sx_nonfatal.device, sx_nonfatal.fatal, sx_nonfatal.link) == ("nvidia-nvswitch0", False, 32)
    assert (segv.pid, segv.process, segv.device, segv.severity) == (12345, "python", "libnccl.so.2", "warning")
    assert segv.message.startswith("python[12345]: segfault at 0 ip")
    assert nvl_fatal.unit == "NETIR_LINK_EVT" and nvl_ber.unit == "NETIR_BER_EVENT"


def test_nvlink5_fields_and_subcode_bits_20_to_25() -> None:
    scan = scan_file(FIXTURES / "shapes-uptime.log")
    fatal, ber = (e for e in scan.events if e.code == 149)
    assert (fatal.unit, fatal.fatal, fatal.link, fatal.intrinfo, fatal.error_status, fatal.subcode) == (
        "NETIR_LINK_EVT",
        True,
        1,
        "0x004505c6",
        "0x00000000",
        (0x004505C6 >> 20) & 0x3F,
    )
    assert fatal.subcode == 4
    assert (ber.fatal, ber.link, ber.intrinfo, ber.subcode) == (False, 17, "0x0321a0f5", 50)
    row = next(s for s in scan.summary if s.code == 149)
    assert row.count == 2 and row.units == ["NETIR_LINK_EVT", "NETIR_BER_EVENT"]
    for intrinfo, subcode in (("0x03f00000", 63), ("0xffffffff", 63), ("0x00100000", 1), ("0x000fffff", 0)):
        line = f"NVRM: Xid (PCI:0000:c1:00): 145, RLW_REMAP Nonfatal XC1 i2 Link -1 ({intrinfo} 0x00000000)"
        (event,) = scan_text(line).events
        assert (event.unit, event.link, event.subcode) == ("RLW_REMAP", -1, subcode), intrinfo


def test_xid_154_records_the_new_recovery_action() -> None:
    text = "\n".join(
        [
            "[10.0] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset "
            "Required)",
            "[11.0] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x1 to 0x2",
            "[12.0] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) "
            "to 0x0 (None)",
        ]
    )
    scan = scan_text(text)
    assert [e.recovery_action for e in scan.events] == ["GPU Reset Required", "Node Reboot", "None"]
    assert [e.kind for e in scan.events] == ["recovery_action"] * 3
    assert [e.severity for e in scan.events] == ["critical", "critical", "info"]
    (row,) = scan.summary
    assert (row.kind, row.code, row.count, row.severity) == ("recovery_action", 154, 3, "critical")


def test_sxid_severity_and_data_lines_do_not_count_as_new_events() -> None:
    scan = scan_file(FIXTURES / "shapes-uptime.log")
    row = next(s for s in scan.summary if s.code == 20034)
    assert (row.count, row.pci_bus_id, row.first_line, row.last_line) == (1, "0000:05:00", 17, 17)


def test_only_nccl_segfaults_are_reported() -> None:
    text = (
        "[1.0] bash[999]: segfault at 8 ip 000055d1e2f3a4b5 sp 00007ffc1d2e3f40 error 4 in libc.so.6[7f0a+195000]\n"
        "[2.0] traps: python[77] general protection fault ip:7f1b2c3d sp:7ffd0000 error:0 in "
        "libnccl-net.so[7f1b0000+40000]\n"
        "[3.0] python[78]: segfault at 0 ip 00007f3a1c2b4d10 sp 00007ffd5e6f7a80 error 4 in libnccl.so.2[7f3a+1e4b]\n"
        "[4.0] NCCL INFO libnccl loaded fine\n"
    )
    scan = scan_text(text)
    assert [(e.kind, e.pid, e.process, e.device, e.line_number) for e in scan.events] == [
        ("nccl_segfault", 77, "python", "libnccl-net.so", 2),
        ("nccl_segfault", 78, "python", "libnccl.so.2", 3),
    ]
    (row,) = scan.summary
    assert (row.kind, row.code, row.pci_bus_id, row.count) == ("nccl_segfault", None, None, 2)


def test_fallen_off_the_bus_without_a_xid() -> None:
    multi = (
        "NVRM: The NVIDIA GPU 0000:86:00.0 (PCI ID: 10de:2330)\n"
        "NVRM: installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands.\n"
    )
    (event,) = scan_text(multi).events
    assert (event.kind, event.code, event.pci_bus_id, event.line_number) == ("fallen_off_bus", None, "0000:86:00.0", 1)
    one = "[Sun Feb 23 16:24:18 2025] NVRM: GPU 0000:3B:00.0: GPU has fallen off the bus.\n"
    (event,) = scan_text(one).events
    assert (event.kind, event.pci_bus_id, event.time) == ("fallen_off_bus", "0000:3b:00.0", "2025-02-23T16:24:18")
    # a lone last line: counted, no address
    (event,) = scan_text("NVRM: fallen off the bus and is not responding to commands.").events
    assert (event.kind, event.pci_bus_id) == ("fallen_off_bus", None)
    # "The NVIDIA GPU ... is not supported" is not a fall
    unsupported = "NVRM: The NVIDIA GPU 0000:86:00.0 (PCI ID: 10de:2330)\nNVRM: installed in this system is\n"
    assert scan_text(unsupported).events == []


# ---------------------------------------------------------------------------------------------------------------
# timestamps


@pytest.mark.parametrize(
    ("name", "times", "uptimes"),
    [
        ("dmesg-T.log", ["2025-03-03T09:15:02", "2025-03-03T10:00:00"], [None, None]),
        ("dmesg-iso.log", ["2025-01-21T04:41:44.285060+00:00", "2025-01-21T04:42:01.000001+00:00"], [None, None]),
        ("journald.log", ["May 18 19:02:39", "May 18 19:02:45", "May 18 19:03:02"], [None, 171167.621162, None]),
        ("short-iso.log", ["2025-01-21T04:41:44.285060+00:00", "2025-01-21T04:41:45+00:00"], [None, None]),
        ("no-prefix.log", [None, None], [None, None]),
    ],
)
def test_every_timestamp_form(name: str, times: list[str | None], uptimes: list[float | None]) -> None:
    scan = scan_file(FIXTURES / name)
    assert [e.time for e in scan.events] == times
    assert [e.uptime_s for e in scan.events] == uptimes


def test_timestamp_forms_exactly() -> None:
    tail = "NVRM: Xid (PCI:0000:3b:00): 13, x"
    cases = {
        f"[171167.621162] {tail}": (None, 171167.621162),
        f"[    5.104211] {tail}": (None, 5.104211),
        f"[Sun Feb 23 16:24:18 2025] {tail}": ("2025-02-23T16:24:18", None),
        f"[Sun Feb  2 06:24:18 2025] {tail}": ("2025-02-02T06:24:18", None),
        f"kern  :warn  : 2025-01-21T04:41:44,285060+00:00 {tail}": ("2025-01-21T04:41:44.285060+00:00", None),
        f"kern  :err   : [  171.5] {tail}": (None, 171.5),
        f"May 18 19:02:39 host kernel: {tail}": ("May 18 19:02:39", None),
        f"May  8 19:02:39 host kernel: [ 12.5] {tail}": ("May 8 19:02:39", 12.5),
        f"2025-01-21T04:41:44.285060+00:00 host kernel: {tail}": ("2025-01-21T04:41:44.285060+00:00", None),
        f"2025-01-21T04:41:44+0000 host kernel: {tail}": ("2025-01-21T04:41:44+00:00", None),
        f"2025-01-21 04:41:44Z host kernel: {tail}": ("2025-01-21T04:41:44Z", None),
        tail: (None, None),
    }
    for line, (time, uptime) in cases.items():
        got_time, got_uptime, start = parse_prefix(line)
        assert (got_time, got_uptime) == (time, uptime), line
        assert line[start:] == tail, line
        (event,) = scan_text(line).events
        assert (event.time, event.uptime_s, event.code) == (time, uptime, 13), line


def test_normalize_pci() -> None:
    assert normalize_pci("PCI:0000:3B:00") == "0000:3b:00"
    assert normalize_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci("3b:00") == "0000:3b:00"
    assert normalize_pci("0000:9b:0.1") == "0000:9b:00.1"
    assert normalize_pci("garbage)") == "garbage)"
    assert normalize_pci("") is None


# ---------------------------------------------------------------------------------------------------------------
# PCI to UUID


def test_pci_uuid_mapping_before_and_after_the_xid() -> None:
    scan = scan_file(FIXTURES / "shapes-uptime.log")
    by_line = {e.line_number: e for e in scan.events}
    assert by_line[7].uuid == UUID_3B  # map logged before the Xid (upper-case hex in the map line)
    assert by_line[8].uuid == UUID_3B  # the .0 function of the same device
    assert [by_line[n].uuid for n in (10, 11, 12)] == [UUID_5D] * 3  # map logged after
    assert by_line[13].uuid is None  # never mapped
    rows = {(s.kind, s.code, s.pci_bus_id): s for s in scan.summary}
    assert rows[("xid", 13, "0000:5d:00")].uuid == UUID_5D
    assert [(g.pci_bus_id, g.uuid, g.serial, g.line_number) for g in scan.gpus] == [
        ("0000:3b:00", UUID_3B, "1320223456789", 5),
        ("0000:5d:00", UUID_5D, "1320223450000", 27),
    ]


def test_a_gpu_swapped_between_boots_keeps_each_boots_uuid() -> None:
    text = (
        "[0.0] Linux version 6.8.0\n"
        "[10.0] NVRM: GPU at PCI:0000:3b:00: GPU-aaaaaaaa-0000-0000-0000-000000000000\n"
        "[11.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        "[0.0] Linux version 6.8.0\n"
        "[11.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE (double bit error) ECC error\n"
        "[12.0] NVRM: GPU at PCI:0000:3b:00: GPU-bbbbbbbb-0000-0000-0000-000000000000\n"
    )
    scan = scan_text(text)
    assert [(e.code, e.boot, e.uuid) for e in scan.events] == [
        (79, 0, "GPU-aaaaaaaa-0000-0000-0000-000000000000"),
        (48, 1, "GPU-bbbbbbbb-0000-0000-0000-000000000000"),
    ]


# ---------------------------------------------------------------------------------------------------------------
# floods, caps, escalation, unknown codes


def test_xid_45_flood_collapses_into_one_row() -> None:
    lines = [
        f"[{100 + i * 0.001:.6f}] NVRM: Xid (PCI:0000:3b:00): 45, pid={1000 + i % 7}, name=python, "
        "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x0"
        for i in range(5000)
    ]
    lines.append("[200.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.")
    scan = scan_kernel_log(lines, classify=catalog({45: ("info", "IGNORE"), 79: ("critical", "RESET_GPU")}))
    rows = {(s.code): s for s in scan.summary}
    assert set(rows) == {45, 79}
    flood = rows[45]
    assert (flood.count, flood.flood, flood.first_line, flood.last_line, flood.boots) == (5000, True, 1, 5000, 1)
    assert (flood.first_uptime_s, flood.last_uptime_s) == (100.0, 104.999)
    assert rows[79].flood is False and rows[79].count == 1
    assert scan.summary[0].code == 79  # worst severity first
    listed_45 = [e for e in scan.events if e.code == 45]
    assert len(listed_45) == FLOOD_THRESHOLD
    assert scan.events[-1].code == 79  # the flood did not crowd out the event after it
    assert scan.events_truncated and scan.events_omitted == 5000 - FLOOD_THRESHOLD
    assert scan.lines_read == 5001 and scan.matched_lines == 5001


def test_a_code_seen_more_than_100_times_is_a_flood_and_45_always_is() -> None:
    def xid_lines(code: int, n: int) -> list[str]:
        return [f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=x, m" for _ in range(n)]

    scan = scan_kernel_log(xid_lines(13, 101) + xid_lines(31, 100) + xid_lines(45, 1))
    assert {s.code: (s.count, s.flood) for s in scan.summary} == {13: (101, True), 31: (100, False), 45: (1, True)}


def test_max_events_caps_the_list_but_not_the_counts() -> None:
    lines = [f"NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid=1, name=x, m" for bus in range(40)]
    scan = scan_kernel_log(lines, max_events=3)
    assert len(scan.events) == 3 and scan.events_truncated and scan.events_omitted == 37
    assert len(scan.summary) == 40 and sum(s.count for s in scan.summary) == 40
    assert scan_kernel_log(lines, max_events=0).events == []


def test_escalation_when_a_reset_code_recurs_across_three_boots() -> None:
    classify = catalog({79: ("critical", "RESET_GPU"), 13: ("warning", "RESTART_APP")})
    scan = scan_file(FIXTURES / "reboots.log", classify=classify)
    assert scan.boots == 4
    # boot 0: lines 1-5; "Linux version" at 6 -> boot 1; "Booting Linux" at 10 and "Linux version" at 11 -> boot 2;
    # the uptime drops from 900 s to 12 s at line 16 with no marker -> boot 3
    assert [(e.code, e.boot) for e in scan.events] == [(79, 0), (13, 0), (79, 1), (79, 2), (13, 2), (13, 2), (79, 3)]
    rows = {s.code: s for s in scan.summary}
    assert (rows[79].count, rows[79].boots, rows[79].escalation) == (4, 4, "seen across 4 boots: hardware inspection")
    assert (rows[13].count, rows[13].boots, rows[13].escalation) == (3, 2, None)
    # two reboots only: not yet
    two = "".join(fixture("reboots.log").splitlines(keepends=True)[:9])
    assert scan_text(two, classify=classify).summary[0].escalation is None
    # an app-level code never escalates, however many boots
    app_only = "[0.0] Linux version 6.8\n[9.0] NVRM: Xid (PCI:0000:5d:00): 13, pid=1, name=x, m\n" * 4
    (row,) = scan_text(app_only, classify=classify).summary
    assert (row.boots, row.escalation) == (4, None)


def test_boot_markers_of_one_boot_count_once() -> None:
    text = (
        "[0.000000] Linux version 5.15.0-112-generic (buildd@lcy02) #122-Ubuntu\n"
        "[0.000000] Command line: BOOT_IMAGE=/boot/vmlinuz-5.15.0-112-generic ro\n"
        "[0.000000] KERNEL supported cpus:\n"
        "[9.000000] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, m\n"
        "[0.000000] SELinux:  Initializing.\n"
    )
    scan = scan_text(text)
    assert scan.boots == 1 and scan.events[0].boot == 0 and scan.matched_lines == 3


def test_unknown_codes_are_reported_with_their_raw_first_line() -> None:
    scan = scan_file(FIXTURES / "shapes-uptime.log", classify=catalog({79: ("critical", "RESET_GPU")}))
    unknown = {(u.kind, u.code): u for u in scan.unknown_codes}
    assert set(unknown) == {
        ("xid", 13),
        ("xid", 31),
        ("xid", 43),
        ("xid", 63),
        ("xid", 149),
        ("sxid", 20034),
        ("sxid", 12028),
    }
    assert unknown[("xid", 149)].line_number == 14
    assert unknown[("xid", 149)].line == (FIXTURES / "shapes-uptime.log").read_text().splitlines()[13]
    assert unknown[("sxid", 20034)].line.startswith("[ 3400.000000] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034")
    by_code = {e.code: e for e in scan.events if e.kind == "xid"}
    assert (by_code[79].severity, by_code[79].action) == ("critical", "RESET_GPU")
    assert (by_code[13].severity, by_code[13].action) == ("unknown", DEFAULT_ACTION)


def test_a_classifier_that_fails_does_not_fail_the_scan() -> None:
    def broken(kind: str, code: int | None, message: str) -> tuple[str, str]:
        raise RuntimeError("catalog down")

    scan = scan_file(FIXTURES / "shapes-uptime.log", classify=broken)
    assert len(scan.events) == 13
    assert {e.severity for e in scan.events if e.kind in ("xid", "sxid")} == {"unknown"}


def test_bad_arguments_raise_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="max_events"):
        scan_text("", max_events=-1)
    with pytest.raises(InputError, match="classify"):
        scan_text("", classify="nope")  # type: ignore[arg-type]
    with pytest.raises(NotFoundError, match="no such log file"):
        scan_file(tmp_path / "missing.log")


# ---------------------------------------------------------------------------------------------------------------
# input forms


class TrickleReader:
    """A binary reader that hands out a few bytes at a time, splitting lines and UTF-8 sequences anywhere."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step, self.at = data, step, 0

    def read(self, size: int = -1) -> bytes:
        piece = self.data[self.at : self.at + self.step]
        self.at += len(piece)
        return piece


def _signature(scan: KernelLogScan) -> tuple:
    return (
        [e.model_dump() for e in scan.events],
        [s.model_dump() for s in scan.summary],
        scan.lines_read,
        scan.matched_lines,
        scan.boots,
    )


def test_every_input_form_gives_the_same_answer(tmp_path: Path) -> None:
    text = fixture("shapes-uptime.log") + "[3900.0] café ünïcode line ✓\n" + fixture("reboots.log")
    path = tmp_path / "k.log"
    path.write_text(text)
    expected = _signature(scan_file(path))
    assert len(expected[0]) == 20
    forms = {
        "text": scan_text(text),
        "splitlines": scan_kernel_log(text.splitlines()),
        "keepends": scan_kernel_log(text.splitlines(keepends=True)),
        "text file object": scan_kernel_log(path.open(errors="replace")),
        "binary file object": scan_kernel_log(path.open("rb")),
        "StringIO": scan_kernel_log(io.StringIO(text)),
        "bytes": scan_kernel_log(text.encode()),
        "generator": scan_kernel_log(line for line in text.splitlines()),
        "crlf": scan_text(text.replace("\n", "\r\n")),
        "no final newline": scan_text(text.rstrip("\n")),
    }
    for step in (1, 7, 4096):
        forms[f"trickle {step}"] = scan_kernel_log(TrickleReader(text.encode(), step))  # type: ignore[arg-type]
    for name, scan in forms.items():
        assert _signature(scan) == expected, name


def test_an_oversized_line_is_cut_and_the_lines_after_it_still_count() -> None:
    giant = "x" * (3 << 20) + " NVRM: Xid (PCI:0000:3b:00): 13, hidden far out"
    text = "a\n" + giant + "\n[5.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    readers = [TrickleReader(text.encode(), step) for step in (1 << 20, 65536, 4 << 20)]
    for scan in [scan_text(text), *(scan_kernel_log(r) for r in readers)]:  # type: ignore[arg-type]
        assert brief(scan) == [("xid", 79, "0000:3b:00", 3)]
        assert scan.lines_read == 3


def test_a_reader_that_fails_midway_keeps_what_was_read() -> None:
    def lines() -> Iterator[str]:
        yield "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, m"
        raise OSError("disk went away")

    scan = scan_kernel_log(lines())
    assert [e.code for e in scan.events] == [13]
    assert scan.notes == ["reading stopped after line 1: OSError: disk went away"]


# ---------------------------------------------------------------------------------------------------------------
# robustness


FIXTURE_TEXTS = [p.read_text() for p in sorted(FIXTURES.glob("*.log"))]


@st.composite
def damaged_logs(draw: st.DrawFn) -> str | bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=4000))
    text = draw(st.sampled_from(FIXTURE_TEXTS))
    text = text[: draw(st.integers(0, len(text)))]
    for _ in range(draw(st.integers(0, 8))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "junk"]))
        if op == "insert":
            text = text[:at] + draw(st.text(max_size=40)) + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + draw(st.integers(0, 60)) :]
        else:
            text = text[:at] + draw(st.binary(max_size=40)).decode("utf-8", "replace") + text[at:]
    return text


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_logs(), st.integers(1, 64))
def test_scanning_never_raises(log: str | bytes, step: int) -> None:
    data = log if isinstance(log, bytes) else log.encode("utf-8", "surrogatepass")
    text = data.decode("utf-8", "replace")
    scans = [
        scan_text(text),
        scan_kernel_log(text.splitlines()),
        scan_kernel_log(data),
        scan_kernel_log(TrickleReader(data, step)),  # type: ignore[arg-type]
    ]
    newline_lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    for scan in scans:
        assert isinstance(scan, KernelLogScan)
        assert len(scan.events) <= 5000
        assert sum(s.count for s in scan.summary) == len(scan.events) + scan.events_omitted
        assert scan.parse_errors == 0
    assert scans[0].lines_read == newline_lines
    assert _signature(scans[2]) == _signature(scans[3]) == _signature(scans[0])


# ---------------------------------------------------------------------------------------------------------------
# bounded memory


def test_a_50_mb_stream_keeps_the_event_list_capped_and_counts_exact() -> None:
    ordinary = [
        'kernel: audit: type=1400 audit(1716051759.123:812): apparmor="DENIED" operation="open" pid=4113',
        "kernel: eth0: renamed from veth9a8b7c6 and some more words to make the line longer than most",
        "kernel: EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Opts: (null). Quota mode: none.",
        "kernel: perf: interrupt took too long (2512 > 2500), lowering kernel.perf_event_max_sample_rate to 79500",
    ]
    flood = "kernel: NVRM: Xid (PCI:0000:3b:00): 45, pid=77, name=python, Ch 00000010, preemptive cleanup"
    gpus = [
        f"kernel: NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid=88, name=python, Graphics Exception" for bus in range(8)
    ]
    target = 50 * 1024 * 1024
    expected = {"bytes": 0, "lines": 0, 45: 0, 13: 0}

    def stream() -> Iterator[str]:
        i = 0
        while expected["bytes"] < target:
            if i % 50 == 0:
                line, code = flood, 45
            elif i % 997 == 0:
                line, code = gpus[(i // 997) % 8], 13
            else:
                line, code = ordinary[i % 4], None
            if code is not None:
                expected[code] += 1
            expected["bytes"] += len(line) + 1
            expected["lines"] += 1
            i += 1
            yield line

    scan = scan_kernel_log(stream(), max_events=500)
    assert scan.lines_read == expected["lines"]
    assert len(scan.events) <= 500 and scan.events_truncated
    counts: dict[int | None, int] = {}
    for row in scan.summary:
        counts[row.code] = counts.get(row.code, 0) + row.count
    assert counts == {45: expected[45], 13: expected[13]}
    assert expected[45] > 10_000
    assert len(scan.summary) == 9
    assert next(s for s in scan.summary if s.code == 45).flood


# ---------------------------------------------------------------------------------------------------------------
# a real log


@pytest.mark.skipif(not (SAMPLES / "dmesg-xid-119.H100.log").is_file(), reason="shared samples not present")
def test_the_real_xid_119_log() -> None:
    path = SAMPLES / "dmesg-xid-119.H100.log"
    scan = scan_file(path)
    uuid = "GPU-509665ad-b600-ac93-3616-d754b23d636d"
    (row,) = scan.summary
    assert (row.kind, row.code, row.pci_bus_id, row.uuid) == ("xid", 119, "0000:9b:00", uuid)
    assert (row.count, row.first_time, row.last_time, row.boots) == (5, "2025-02-23T16:24:18", "2025-02-23T16:30:13", 1)
    assert (row.first_line, row.last_line, row.flood, row.rate_limited) == (3, 43, False, True)
    assert [(e.line_number, e.time, e.pid, e.process) for e in scan.events] == [
        (3, "2025-02-23T16:24:18", 2024380, "nvidia-smi"),
        (38, "2025-02-23T16:24:24", 2024380, "nvidia-smi"),
        (40, "2025-02-23T16:24:30", 2024380, "nvidia-smi"),
        (42, "2025-02-23T16:27:12", 1263500, "cache_mgr_main"),
        (43, "2025-02-23T16:30:13", 1240590, "gpud"),
    ]
    assert all(e.uuid == uuid and e.pci_bus_id == "0000:9b:00" and e.uptime_s is None for e in scan.events)
    assert scan.events[0].message.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP!")
    assert [(g.pci_bus_id, g.uuid, g.serial) for g in scan.gpus] == [("0000:9b:00", uuid, "1650124014249")]
    # the RPC history tables and the stack trace are NVRM / kernel noise, not events
    assert (scan.lines_read, scan.matched_lines, scan.boots, scan.parse_errors) == (43, 8, 1, 0)
    assert len(scan.notes) == 1 and "Rate limiting GSP RPC error prints" in scan.notes[0]
    assert [(u.code, u.line_number) for u in scan.unknown_codes] == [(119, 3)]


def test_the_line_matchers_name_each_shape_without_state() -> None:
    """matchers.match_line alone: what a candidate line is, before the scanner's state (boots, pending lines)."""
    from servers.diagnostics.kmsg.matchers import match_line

    shapes = [
        (match_line(line, fallen_off_bus_open=True) or ("none", None))[0]
        for line in fixture("shapes-uptime.log").splitlines()
    ]
    assert shapes[:8] == ["boot_marker", "boot_marker", "none", "none", "gpu_at", "serial", "xid", "fallen_off_bus"]
    assert {"sxid", "nccl_segfault", "fallen_off_bus_start", "fallen_off_bus_more"} <= set(shapes)
    assert match_line("[1.0] NVRM: installed in this system has", fallen_off_bus_open=False) is None
    assert match_line("[0.0] SELinux:  Initializing.", fallen_off_bus_open=False) is None


def test_the_boot_policy_alone() -> None:
    """policy.Boots: markers of one boot count once; an event before a marker, or a long gap, starts a new boot; an
    uptime going back by more than a minute is a marker too."""
    from servers.diagnostics.kmsg.policy import BOOT_MARKER_WINDOW, Boots

    boots = Boots()
    assert not boots.marker(1) and not boots.marker(2) and boots.boot == 0
    boots.event()
    assert boots.marker(3) and boots.boot == 1
    assert boots.marker(3 + BOOT_MARKER_WINDOW + 1) and boots.boot == 2
    assert not boots.uptime(500.0, 100) and not boots.uptime(450.0, 101) and boots.boot == 2
    assert not boots.uptime(10.0, 102) and boots.boot == 2  # a marker close to the last one, no event between
    boots.event()
    assert not boots.uptime(100.0, 103) and boots.uptime(1.0, 104) and boots.boot == 3


# ---------------------------------------------------------------------------------------------------------------
# exact counts at every size (issue 22, defect 10)


@pytest.mark.timeout(60)
def test_counts_stay_exact_when_the_result_must_shrink_to_its_byte_budget(tmp_path: Path) -> None:
    """The 1 GiB benchmark's failure ("xid: scanned 3599, generated 6356"), reproduced small: with 5,000 events
    listed, the result was over its byte budget, so fit() halved every list, the summary rows with them, and the
    rows not listed took their counts along. Here a dense 2 MiB log and a lowered budget force the same shrinking;
    the exact counts must not move, and the summary gives way only after the event list."""
    from benchmarks.diagnostics import count_check

    full, problems = count_check(tmp_path, 2, groups_per_block=400)
    assert problems == [] and full.summary_rows == len(full.summary) == 85 and len(full.events) == 1500
    assert full.counts == {"xid": 1569, "recovery_action": 75, "sxid": 70, "fallen_off_bus": 113, "nccl_segfault": 56}

    # a budget the summary fits in but not the events: the event list shrinks, every summary row stays
    shrunk, problems = count_check(tmp_path, 2, groups_per_block=400, max_result_bytes=120_000)
    assert problems == [] and len(shrunk.events) < 1500 and len(shrunk.summary) == 85 and shrunk.summary_omitted == 0
    # a budget the summary does not fit in either: rows go too (said in summary_omitted), the counts stay exact
    tiny, problems = count_check(tmp_path, 2, groups_per_block=400, max_result_bytes=30_000)
    assert problems == [] and tiny.summary_omitted > 0 and tiny.summary_omitted + len(tiny.summary) == 85
    assert tiny.counts == full.counts
    assert sum(row.count for row in tiny.summary) < sum(full.counts.values())  # what the benchmark used to sum


def test_events_past_the_summary_row_cap_are_still_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    from servers.diagnostics.kmsg import scanner

    monkeypatch.setattr(scanner, "MAX_SUMMARY_ROWS", 5)
    lines = [f"NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid=1, name=x, m" for bus in range(40)]
    scan = scan_kernel_log(lines)
    assert scan.summary_truncated and len(scan.summary) == 5
    assert scan.counts == {"xid": 40} and len(scan.events) + scan.events_omitted == 40


def test_a_bad_result_budget_is_an_input_error() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InputError, match="max_result_bytes"):
            scan_text("x", max_result_bytes=bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# the vectorised search (issue 22, defect 10: the scan's speed)

_PIECES = [
    "[  12.000001] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, m",
    "NVRM: GPU at PCI:0000:3b:00: GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 3",
    "python[5]: segfault at 0 ip 0 sp 0 error 4 in libnccl.so.2[7f+1e]",
    "[    0.000000] Linux version 5.15.0",
    "[    0.000000] Command line: BOOT_IMAGE=/vmlinuz",
    "ordinary kernel line without a trigger",
    "NVRNVRM SXiSXid libncclibnccl LinuLinux Command line Command line:",
    "Linux",
    "NVRM",
    "",
    "\u00e9\u00fc caf\u00e9",
    "mmmmmmmm ccccccc d d d d Co Co",
]


@st.composite
def trigger_logs(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(st.sampled_from(_PIECES) | st.text(max_size=30), max_size=60))
    text = "\n".join(parts) + draw(st.sampled_from(["", "\n"]))
    data = text.encode("utf-8", "surrogatepass")
    if draw(st.booleans()):  # filler, so that the numpy search runs over large blocks and dense keys
        data = draw(st.sampled_from([b"a", b"C", b"M\n", b"x y\n"])) * draw(st.integers(0, 70_000)) + b"\n" + data
    return data


def _reader_calls(data: bytes, vector_bytes: int, step: int) -> tuple[list[tuple[str, int]], int]:
    from servers.diagnostics.kmsg.matchers import TRIGGERS
    from servers.diagnostics.kmsg.reader import BlockReader

    calls: list[tuple[str, int]] = []
    reader = BlockReader(lambda line, number: calls.append((line, number)), TRIGGERS)
    reader.vector_bytes = vector_bytes
    reader.read(TrickleReader(data, step))
    reader.finish()
    return calls, reader.lines_read


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trigger_logs(), st.sampled_from([1 << 30, 65536, 100_000]))
def test_the_vectorised_search_hands_on_the_same_lines_as_find(data: bytes, step: int) -> None:
    """Every block searched with numpy (vector_bytes 0) or with find (never numpy): the same lines, numbers and
    count, for blocks cut anywhere by the reader."""
    assert _reader_calls(data, 0, step) == _reader_calls(data, 1 << 40, step)


def test_the_vectorised_search_on_many_hits_and_on_few() -> None:
    """Over FEW_HITS trigger words in a block (every fourth line an Xid) the lines are numbered all at once; under
    it, gap by gap: both give every line with its number."""
    from servers.diagnostics.kmsg.reader import FEW_HITS

    xid = "[1.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception\n"
    filler = "ordinary line\n" * 3
    for n in (FEW_HITS // 2, FEW_HITS * 8):
        data = ((filler + xid) * n).encode()
        calls, lines = _reader_calls(data, 0, 1 << 30)
        assert lines == 4 * n
        assert [number for _, number in calls] == [4 * (i + 1) for i in range(n)]
        assert all(line == xid.rstrip("\n") for line, _ in calls)
        assert calls == _reader_calls(data, 1 << 40, 1 << 30)[0]


def test_a_trigger_key_is_its_rarest_byte_or_pair() -> None:
    from servers.diagnostics.kmsg.reader import key_of

    filler = b"x" * 10_000
    assert key_of(b"NVRM", filler + b"NNNN VV RRR M") == (3, 1)  # M: the rarest byte, and rare enough
    assert key_of(b"SXid", b"SSSS" + b"x" * 100) == (1, 1)  # X never occurs
    # every byte of libnccl is common here, so the key is its rarest adjacent pair: "bn" never occurs
    assert key_of(b"libnccl", b"lib ncc nccl lil bin nnn " * 50) == (2, 2)
    assert key_of(b"ab", b"") == (0, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 70_000), max_size=40), st.integers(0, 70_000))
def test_where_finds_exactly_what_flatnonzero_does(positions: list[int], size: int) -> None:
    import numpy as np

    from servers.diagnostics.kmsg.reader import _where

    mask = np.zeros(size, dtype=bool)
    mask[[p for p in positions if p < size]] = True
    assert _where(mask).tolist() == np.flatnonzero(mask).tolist()
    dense = np.ones(size, dtype=bool)
    assert _where(dense).tolist() == list(range(size))


# ---------------------------------------------------------------------------------------------------------------
# what matched when nothing is an event (issue 22, defect 11)

DMESG_ISO_HEAD = (
    "2026-12-01T20:53:39,000000+00:00 Linux version 6.18.44-fc-v669 (builder@sandboxing) (gcc (GCC) 15.3.0) #1 SMP\n"
    "2026-12-01T20:53:39,000000+00:00 Command line: console=ttyS0 quiet reboot=k panic=1 nvproxy.enable=1\n"
    "2026-12-01T20:53:39,000000+00:00 [Firmware Bug]: TSC doesn't count with P0 frequency!\n"
    "2026-12-01T20:53:39,332565+00:00 pps_core: LinuxPPS API ver. 1 registered\n"
)


def test_a_log_whose_matched_lines_are_no_event_says_what_they_were() -> None:
    """scan_kernel_log with source dmesg on a host without GPUs said "matched_lines": 2 with no event and no note:
    the two lines were the boot markers of `dmesg --time-format=iso`."""
    scan = scan_text(DMESG_ISO_HEAD)
    assert (scan.matched_lines, scan.events, scan.counts, scan.boots) == (2, [], {}, 1)
    (note,) = scan.notes
    assert note.startswith("no GPU fault in this log: the 2 recognised line(s) are 2 boot markers (first, line 1: ")
    assert "Linux version 6.18.44" in note and "none of them an Xid" in note
    with_map = scan_text(DMESG_ISO_HEAD + "[5.0] NVRM: GPU at PCI:0000:3b:00: " + UUID_3B + "\n")
    assert with_map.matched_lines == 3 and "1 PCI-to-UUID line (first, line 5: " in with_map.notes[0]
    # with an event there is nothing to explain: no such note
    assert scan_text(DMESG_ISO_HEAD + "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, m\n").notes == []


def test_this_machines_dmesg_says_what_matched() -> None:
    """The reproduction itself, where this machine's dmesg is readable and has no GPU event."""
    import shutil
    import subprocess

    if shutil.which("dmesg") is None:
        pytest.skip("no dmesg here")
    done = subprocess.run(["dmesg", "--time-format=iso"], capture_output=True, timeout=30, check=False)
    if done.returncode != 0:
        pytest.skip("dmesg is not readable here")
    scan = scan_text(done.stdout.decode(errors="replace"))
    if scan.counts:
        pytest.skip("this machine's kernel log has GPU events")
    explained = [n for n in scan.notes if n.startswith("no GPU fault in this log")]
    assert len(explained) == (1 if scan.matched_lines else 0)


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_the_tool_says_what_matched_and_the_exact_counts(suite_client) -> None:  # type: ignore[no-untyped-def]
    """What an agent reads from scan_kernel_log: the note for a log with no event, the per-kind counts otherwise."""
    quiet = await suite_client.call_tool("scan_kernel_log", {"text": DMESG_ISO_HEAD})
    assert not quiet.is_error
    text = quiet.content[0].text
    assert text.startswith("2 GPU-related line(s) in 4 lines") and "note: no GPU fault in this log" in text
    assert "2 boot markers" in text and quiet.structured_content["counts"] == {}
    lines = [f"NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid=1, name=x, m" for bus in range(40)]
    busy = await suite_client.call_tool("scan_kernel_log", {"text": "\n".join(lines), "max_events": 5})
    assert busy.structured_content["counts"] == {"xid": 40} and len(busy.structured_content["events"]) == 5
    assert "events in the whole log: 40 xid" in busy.content[0].text


def test_bytes_given_whole_are_searched_in_bounded_blocks() -> None:
    """A log given as one bytes object is searched CHUNK_BYTES at a time: the memory of the vectorised search (its
    masks and positions; numpy's buffers are traced by tracemalloc) is a block's, the same for 8 and 32 MiB."""
    import tracemalloc

    from servers.diagnostics.kmsg import CHUNK_BYTES

    line = b"[ 1.0] ordinary kernel line, words: Commander Linus says NV and SX are fine\n"  # dense keys, no trigger
    xid = b"[2.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, m\n"
    scan_kernel_log(line * 2000 + xid)  # numpy imported and warm before the measure
    peaks = []
    for mib in (8, 32):
        data = line * ((mib << 20) // len(line)) + xid
        tracemalloc.start()
        try:
            scan = scan_kernel_log(data)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert scan.counts == {"xid": 1} and scan.events[0].line_number == scan.lines_read == data.count(b"\n")
    assert peaks[1] < 6 * CHUNK_BYTES and peaks[1] - peaks[0] < CHUNK_BYTES // 2, peaks
