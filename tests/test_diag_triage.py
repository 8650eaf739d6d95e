"""Node triage (servers.diagnostics.triage): the bus-id normaliser, sources joined per GPU, disagreement and
missing-GPU warnings, the GSP 'GPUn' note, the first action; the project's own fixtures and the shared real
samples (read in place, never copied)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.diagnostics import triage
from servers.diagnostics.findings import bus_number, normalise_bus_id
from servers.diagnostics.health import evaluate_all
from servers.diagnostics.smi import parse_nvidia_smi
from servers.diagnostics.snapshot import GpuSnapshot
from servers.diagnostics.triage import NodeTriage, triage_node

FIXTURES = Path(__file__).parent / "fixtures" / "diagnostics"
NODE = FIXTURES / "triage"
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def by_bus(report: NodeTriage) -> dict[str | None, triage.GpuTriage]:
    return {g.bus_id: g for g in report.gpus}


# ---------------------------------------------------------------------------------------------------------------------
# normalise_bus_id


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("00000000:9B:00.0", "0000:9b:00"),  # nvidia-smi
        ("0000:9b:00", "0000:9b:00"),  # kernel log
        ("PCI:0000:9b:00", "0000:9b:00"),  # kernel log, with the prefix
        ("pci:0000:9B:00.0", "0000:9b:00"),
        ("9b:00.0", "0000:9b:00"),  # no domain
        ("9B:0.0", "0000:9b:00"),
        ("  0000:9b:00.1 ", "0000:9b:00"),  # another function of the same device
        ("0001:01:00.0", "0001:01:00"),
        ("00010000:01:00.0", "10000:01:00"),  # a VMD domain is not folded onto 0000
        ("0:1:2", "0000:01:02"),
    ],
)
def test_normalise_bus_id(value: str, expected: str) -> None:
    assert normalise_bus_id(value) == expected


@pytest.mark.parametrize(
    "value", [None, "", "0x9b", "GPU-c0ffee18", "zz:00.0", "0000:9b:00.8", "1:2:3:4", "0000:9b", "0000:9b:000.0", 7]
)
def test_normalise_bus_id_refuses_what_is_not_a_pci_address(value: object) -> None:
    assert normalise_bus_id(value) is None  # type: ignore[arg-type]


@settings(derandomize=True, max_examples=200, deadline=None)
@given(
    domain=st.integers(min_value=0, max_value=0xFFFF),
    bus=st.integers(min_value=0, max_value=0xFF),
    device=st.integers(min_value=0, max_value=0x1F),
    function=st.integers(min_value=0, max_value=7),
)
def test_property_every_spelling_of_an_address_is_one_gpu(domain: int, bus: int, device: int, function: int) -> None:
    spellings = [
        f"{domain:08X}:{bus:02X}:{device:02X}.{function}",  # nvidia-smi
        f"{domain:04x}:{bus:02x}:{device:02x}",  # kernel log
        f"PCI:{domain:04x}:{bus:02x}:{device:02x}",
        f"{domain:x}:{bus:x}:{device:x}.0",
    ]
    keys = {normalise_bus_id(s) for s in spellings}
    assert keys == {f"{domain:04x}:{bus:02x}:{device:02x}"}
    assert {bus_number(s) for s in spellings} == {bus}


def test_bus_number_of_old_nccl_tests_device_lines() -> None:
    assert [bus_number(v) for v in ("0x9b", "9B", "0x07", "0000:9b:00", "x", None, "0x123")] == [
        0x9B,
        0x9B,
        7,
        0x9B,
        None,
        None,
        None,
    ]


# ---------------------------------------------------------------------------------------------------------------------
# the project's node: four sources, one story


@pytest.fixture(scope="module")
def node() -> NodeTriage:
    return triage_node(
        nvidia_smi=read(NODE / "query-gpu.7of8xH100.synthetic.csv"),
        kernel_log=read(NODE / "dmesg-T.8xH100.synthetic.log"),
        dcgm=read(NODE / "dcgmi-diag-r2.dcgm4.7xH100.synthetic.json"),
        nccl_tests=read(NODE / "all_reduce_perf.7xH100.wrong.synthetic.txt"),
    )


def test_every_source_is_joined_per_gpu_on_the_bus_id(node: NodeTriage) -> None:
    assert node.node == "gpu-node-07"  # from the nccl-tests host
    assert node.gpu_count == 8 and node.gpus_omitted == 0
    assert [g.bus_id for g in node.gpus] == [
        "0000:18:00",
        "0000:2a:00",
        "0000:3a:00",
        "0000:5d:00",
        "0000:9a:00",
        "0000:ba:00",
        "0000:db:00",
        "0000:ab:00",  # not in nvidia-smi: no index, listed last
    ]
    gpus = by_bus(node)
    first = gpus["0000:18:00"]
    assert (first.index, first.dcgm_gpu_id, first.nccl_ranks) == (0, 0, [0])
    assert first.uuid == "GPU-c0ffee18-7a21-4d3e-9b00-000000000018" and first.serial == "1654122070018"
    assert first.seen_by == ["nvidia_smi", "kernel_log", "dcgm", "nccl_tests"]
    assert gpus["0000:db:00"].index == 6 and gpus["0000:db:00"].dcgm_gpu_id == 6  # DCGM joined on the serial
    assert not any("0000:07:00" in (g.bus_id or "") for g in node.gpus)  # the SXid's address is the NVSwitch's


def test_one_verdict_per_gpu_from_every_source(node: NodeTriage) -> None:
    gpus = by_bus(node)
    assert {b: g.verdict for b, g in gpus.items()} == {
        "0000:18:00": "healthy",
        "0000:2a:00": "healthy",
        "0000:3a:00": "unhealthy",  # ECC + remap pending (nvidia-smi), memory fail (DCGM), Xid 94 (log)
        "0000:5d:00": "degraded",  # Xid 13
        "0000:9a:00": "unhealthy",  # Xid 48 in the log, clean now
        "0000:ba:00": "healthy",
        "0000:db:00": "degraded",  # DCGM pcie warning
        "0000:ab:00": "unhealthy",  # Xid 119, and gone from nvidia-smi
    }
    assert gpus["0000:3a:00"].source_verdicts == {
        "nvidia_smi": "unhealthy",
        "kernel_log": "degraded",
        "dcgm": "unhealthy",
    }
    evidence = gpus["0000:3a:00"].evidence
    assert [e.source for e in evidence if e.severity == "critical"] == ["nvidia_smi", "dcgm"]
    assert any(e.source == "dcgm" and "PENDING_ROW_REMAP" in e.what for e in evidence)
    assert any(e.source == "kernel_log" and e.what.startswith("Xid 94: 1 line(s)") for e in evidence)
    assert node.counts == {"unhealthy": 3, "degraded": 2, "unknown": 0, "healthy": 3}
    assert node.verdict == "unhealthy"


def test_a_kernel_log_gpu_not_in_the_capture_is_warned_about_and_drained(node: NodeTriage) -> None:
    gone = by_bus(node)["0000:ab:00"]
    assert gone.seen_by == ["kernel_log"] and gone.missing_from == ["nvidia_smi", "dcgm"]
    assert gone.index is None and gone.uuid == "GPU-c0ffeeab-7a21-4d3e-9b00-0000000000ab"
    [warning] = [w for w in node.warnings if w.startswith("GPU 0000:ab:00")]
    assert (
        "is in the kernel log (Xid 119 (critical)) but not in the nvidia-smi output or the DCGM diagnostic" in warning
    )
    assert "fallen off the bus" in warning
    assert node.first_action.startswith("Drain and reboot the node: GPU 0000:ab:00 is reported by the kernel log")
    assert "nvidia-smi does not list it" in node.first_action


def test_sources_that_disagree_are_warned_about(node: NodeTriage) -> None:
    [warning] = [w for w in node.warnings if w.startswith("Sources disagree")]
    assert warning.startswith(
        "Sources disagree on GPU 0000:9a:00 (nvidia-smi index 4): nvidia-smi output healthy, kernel log unhealthy "
        "(Xid 48 (critical)), DCGM diagnostic healthy."
    )
    assert len(node.warnings) == 2


def test_the_drivers_gpu_number_in_gsp_messages_is_not_the_nvidia_smi_index(node: NodeTriage) -> None:
    [note] = node.notes
    assert "'GPU5' in GSP messages" in note and "not nvidia-smi index 5" in note
    assert "ties it to PCI 0000:ab:00, which is not in the nvidia-smi capture" in note
    assert "nvidia-smi index 5 is 0000:ba:00, a different GPU" in note


def test_node_level_findings(node: NodeTriage) -> None:
    assert [(e.source, e.severity) for e in node.node_evidence] == [
        ("nccl_tests", "critical"),
        ("kernel_log", "warning"),
        ("kernel_log", "warning"),
    ]
    assert "data corruption, 12 wrong elements" in node.node_evidence[0].what
    assert node.node_evidence[1].what.startswith("NVSwitch SXid 12028")
    assert node.node_evidence[2].what.startswith("NCCL segfault")
    sources = {s.source: s for s in node.sources}
    assert all(s.given for s in sources.values())
    assert (sources["nvidia_smi"].gpus, sources["kernel_log"].gpus, sources["dcgm"].gpus) == (7, 8, 7)


def test_without_the_missing_gpu_two_unhealthy_gpus_drain_the_node() -> None:
    report = triage_node(
        nvidia_smi=read(NODE / "query-gpu.7of8xH100.synthetic.csv"),
        dcgm=read(NODE / "dcgmi-diag-r2.dcgm4.7xH100.synthetic.json"),
        nccl_tests=read(NODE / "all_reduce_perf.7xH100.wrong.synthetic.txt"),
    )
    assert report.counts["unhealthy"] == 1 and report.warnings == [] and report.notes == []
    assert report.first_action.startswith("Drain the node: 1 GPU(s) are unhealthy (0000:3a:00 (nvidia-smi index 2))")


# ---------------------------------------------------------------------------------------------------------------------
# other inputs


def test_nvidia_smi_q_and_nccl_tests_join_and_keep_the_health_verdicts() -> None:
    text = read(FIXTURES / "smi" / "nvidia-smi-q.8xH100.550.synthetic.txt")
    report = triage_node(nvidia_smi=text, nccl_tests=read(FIXTURES / "nccl" / "all_reduce_perf.8xH100.pass.txt"))
    health = evaluate_all(parse_nvidia_smi(text).gpus)
    assert [g.verdict for g in report.gpus] == [h.status for h in health]
    assert [g.nccl_ranks for g in report.gpus] == [[i] for i in range(8)]
    assert [(e.source, e.severity) for e in report.node_evidence] == [("nccl_tests", "info")]
    assert report.warnings == []
    assert report.first_action.startswith("Drain the node: 2 GPU(s) are unhealthy")


def test_old_nccl_tests_bus_numbers_join_when_unique() -> None:
    report = triage_node(
        nvidia_smi=read(FIXTURES / "smi" / "nvidia-smi-q.8xH100.550.synthetic.txt"),
        nccl_tests=read(FIXTURES / "nccl" / "all_reduce_perf.8xH100.below-floor.txt"),  # [0x18] style
    )
    assert [g.nccl_ranks for g in report.gpus] == [[i] for i in range(8)]
    assert report.node_evidence[0].severity == "warning" and "FAIL" in report.node_evidence[0].what


def test_the_node_verdict_says_what_nccl_tests_says_of_the_node() -> None:
    """A bandwidth FAIL (a warning by severity) makes the node unhealthy, as nccl-tests' own verdict says, not
    'degraded'; healthy GPUs do not soften it."""
    from servers.diagnostics.nccl_tests import parse_nccl_tests

    text = read(FIXTURES / "nccl" / "all_reduce_perf.8xH100.below-floor.txt")
    assert parse_nccl_tests(text).verdict.status == "FAIL"
    report = triage_node(nccl_tests=text)
    assert report.verdict == "unhealthy"


def test_live_snapshots_and_dcgm_ids_joined_by_index_when_no_serial_ties_them() -> None:
    snapshots = [
        GpuSnapshot(
            index=i, pci_bus_id=f"0000:{0x10 + i:02x}:00.0", ecc_volatile_uncorrectable_total=0, temperature_c=40
        )
        for i in range(8)
    ]
    report = triage_node(snapshots=snapshots, dcgm=read(FIXTURES / "dcgm" / "dcgmi-diag-r2.dcgm3.8xA100.json"))
    assert [g.dcgm_gpu_id for g in report.gpus] == list(range(8))
    assert [g.verdict for g in report.gpus] == ["healthy"] * 5 + ["unhealthy"] + ["healthy"] * 2  # GPU 5 memory
    assert report.gpus[5].serial == "1324021034515"  # DCGM's serial attached to the GPU
    assert any("DCGM GPU ids were matched to nvidia-smi indexes" in n for n in report.notes)
    assert any("Sources disagree on GPU 0000:15:00" in w for w in report.warnings)


def test_a_kernel_log_alone() -> None:
    report = triage_node(kernel_log=read(NODE / "dmesg-T.8xH100.synthetic.log"), node="gpu-node-07")
    assert report.gpu_count == 8 and all(g.missing_from == [] for g in report.gpus)
    gpus = by_bus(report)
    assert gpus["0000:18:00"].verdict == "unknown"  # logged at load, no error: silence is no verdict
    assert gpus["0000:ab:00"].verdict == "unhealthy"
    assert not any(w.startswith("GPU ") for w in report.warnings)
    [note] = report.notes
    assert "ties it to PCI 0000:ab:00." in note and "nvidia-smi capture" not in note
    assert report.first_action.startswith("Drain the node: 2 GPU(s) are unhealthy")


def test_an_identity_conflict_at_one_address_is_warned_about() -> None:
    log = "[  10.0] NVRM: GPU at PCI:0000:18:00: GPU-00000000-1111-2222-3333-444444444444\n"
    report = triage_node(nvidia_smi=read(NODE / "query-gpu.7of8xH100.synthetic.csv"), kernel_log=log)
    [warning] = [w for w in report.warnings if "UUID" in w]
    assert warning.startswith("GPU 0000:18:00 (nvidia-smi index 0): the kernel log says UUID GPU-00000000-1111")


def test_listing_is_bounded_unhealthy_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triage, "MAX_GPUS_LISTED", 2)
    monkeypatch.setattr(triage, "MAX_EVIDENCE", 1)
    report = triage_node(nvidia_smi=read(FIXTURES / "smi" / "nvidia-smi-q.8xH100.550.synthetic.txt"))
    assert report.gpu_count == 8 and len(report.gpus) == 2 and report.gpus_omitted == 6
    assert [g.verdict for g in report.gpus] == ["unhealthy", "unhealthy"]
    assert sum(report.counts.values()) == 8
    assert all(len(g.evidence) == 1 for g in report.gpus)
    data = report.model_dump()
    data["counts"]["healthy"] += 1
    with pytest.raises(ValueError, match="do not add up"):
        NodeTriage.model_validate(data)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "no source given; accepted: any of nvidia-smi output"),
        ({"nvidia_smi": "x", "snapshots": []}, "nvidia_smi: give captured nvidia-smi text, snapshots or why they"),
        ({"snapshots": [], "snapshots_missing": "no driver"}, "nvidia_smi: give captured nvidia-smi text, snapshots"),
        ({"nvidia_smi": "hello"}, "nvidia_smi: unrecognised nvidia-smi output"),
        (
            {"dcgm": "not json", "nccl_tests": ""},
            "dcgm: this is not DCGM JSON.*; nccl_tests: the nccl-tests output is empty",
        ),
    ],
)
def test_bad_input_names_every_source_that_cannot_be_read(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        triage_node(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------------
# the shared real samples (checked in place)

needs_samples = pytest.mark.skipif(not (SAMPLES / "dmesg-xid-119.H100.log").is_file(), reason="no shared samples here")


@needs_samples
def test_real_samples_a_log_gpu_not_in_the_capture() -> None:
    """The real dmesg names 0000:9b:00 ('GPU4' in its GSP lines); the real nvidia-smi -q capture has no such GPU
    (its index 4 is 0000:97:00)."""
    report = triage_node(
        nvidia_smi=read(SAMPLES / "nvidia-smi-q.8xH100.535.183.01.txt"),
        kernel_log=read(SAMPLES / "dmesg-xid-119.H100.log"),
    )
    gone = by_bus(report)["0000:9b:00"]
    assert gone.missing_from == ["nvidia_smi"] and gone.verdict == "unhealthy"
    assert any(w.startswith("GPU 0000:9b:00 is in the kernel log (Xid 119 (critical))") for w in report.warnings)
    [note] = report.notes
    assert "'GPU4' in GSP messages" in note and "nvidia-smi index 4 is 0000:97:00, a different GPU" in note
    assert report.first_action.startswith("Drain and reboot the node: GPU 0000:9b:00")
    assert report.gpu_count == 9


# ---------------------------------------------------------------------------------------------------------------------
# a GPU nvidia-smi cannot reach (issue 22, defect 6); live NVML absent (defect 7)

SMI = FIXTURES / "smi"
LOST_Q = SMI / "nvidia-smi-q.8xH100.535.lost-3b.synthetic.txt"
XID_79_AT_3B = (
    "[Mon Feb 10 04:38:51 2025] NVRM: Xid (PCI:0000:3b:00): 79, pid=48211, name=python, GPU has fallen off the bus.\n"
    "[Mon Feb 10 04:38:51 2025] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
)


class _Host:
    """What nvml.live_gpus returns on a host, without touching the real NVML."""

    def __init__(self, reason: str | None, gpus: int = 0) -> None:
        from servers.diagnostics.nvml import LiveGpus

        self.live = LiveGpus(snapshots=[GpuSnapshot(index=i) for i in range(gpus)], reason=reason)
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        return self.live


def test_a_gpu_nvidia_smi_cannot_reach_is_unhealthy_and_joins_the_kernel_logs_xid_79() -> None:
    report = triage_node(nvidia_smi=read(LOST_Q), kernel_log=XID_79_AT_3B)
    assert report.gpu_count == 8 and report.counts == {"unhealthy": 2, "degraded": 0, "unknown": 0, "healthy": 6}
    lost = by_bus(report)["0000:3b:00"]
    assert lost.index == 2 and lost.verdict == "unhealthy"
    assert lost.seen_by == ["nvidia_smi", "kernel_log"] and lost.missing_from == []
    assert lost.source_verdicts == {"nvidia_smi": "unhealthy", "kernel_log": "unhealthy"}
    assert "Unable to determine the device handle for GPU0000:3B:00.0" in lost.evidence[0].what
    assert any("Xid 79" in e.what for e in lost.evidence)
    assert not any("not in the nvidia-smi" in w for w in report.warnings)  # one GPU, not a second one 'missing'
    # the GPU that cannot be reset on its own comes first, before the ECC one at 9a
    assert report.first_action.startswith("Drain the node: 2 GPU(s) are unhealthy (0000:3b:00")
    assert "First, 0000:3b:00 (nvidia-smi index 2): Drain the node" in report.first_action
    assert "1 listed but unreachable" in report.sources[0].summary


def test_nvidia_smi_that_reaches_no_gpu_is_not_told_to_add_nvidia_smi() -> None:
    report = triage_node(nvidia_smi="No devices were found\n", kernel_log=XID_79_AT_3B)
    [gpu] = report.gpus
    assert gpu.bus_id == "0000:3b:00" and gpu.missing_from == ["nvidia_smi"] and gpu.verdict == "unhealthy"
    assert report.first_action.startswith("Drain and reboot the node: GPU 0000:3b:00")
    assert any("No devices were found" in w for w in report.warnings)
    alone = triage_node(nvidia_smi="No devices were found\n")
    assert alone.verdict == "unknown" and "reaches no GPU on the node" in alone.first_action
    assert "add nvidia-smi" not in alone.first_action


def test_live_nvml_that_cannot_be_read_leaves_the_gpu_part_unknown_and_the_rest_proceeds() -> None:
    missing = "NVML not available here: no usable NVIDIA driver on this host: NVML could not start (Not Found)"
    report = triage_node(snapshots_missing=missing, kernel_log=XID_79_AT_3B)
    [gpu] = report.gpus
    assert gpu.bus_id == "0000:3b:00" and gpu.verdict == "unhealthy" and gpu.missing_from == []
    assert report.sources[0].given and report.sources[0].summary == f"unknown: {missing}"
    assert f"the GPU part is unknown: {missing}" in report.warnings
    assert "from kernel log." in report.summary  # not 'from nvidia-smi output, kernel log'
    only = triage_node(snapshots_missing=missing)
    assert only.verdict == "unknown" and only.gpu_count == 0
    assert only.first_action == f"Unknown: {missing}; give nvidia-smi -q output captured on the node."
    assert "from no source that could be read" in only.summary


@pytest.mark.parametrize(
    ("host", "said"),
    [
        (None, "Unknown: the sources given judge no GPU; give nvidia-smi -q output from the node."),
        (
            "no usable NVIDIA driver on this host: NVML could not start (Not Found)",
            "Unknown: the sources given judge no GPU and this host has no live GPU source (NVML not available here: "
            "no usable NVIDIA driver on this host: NVML could not start (Not Found)); give nvidia-smi -q output from "
            "the node.",
        ),
        (
            "",  # NVML works here, with 8 GPUs
            "Unknown: the sources given judge no GPU; NVML reads 8 GPU(s) on this host: if this is the node, ask "
            "again with live NVML, else give nvidia-smi -q output from the node.",
        ),
    ],
)
def test_without_a_gpu_source_the_first_action_says_what_is_missing_here(host: str | None, said: str) -> None:
    """Before: 'add nvidia-smi -q output (or run on the node for NVML)', while it already ran on the node."""
    probe = None if host is None else _Host(host or None, gpus=8)
    report = triage_node(kernel_log="[    1.000000] nothing about GPUs here\n", nvml_here=probe)  # type: ignore[arg-type]
    assert report.first_action == said
    assert "run on the node" not in report.first_action
    judged = triage_node(nvidia_smi=read(LOST_Q), nvml_here=_Host("unused"))  # type: ignore[arg-type]
    assert "Unknown" not in judged.first_action


def test_the_nvml_probe_is_read_only_when_no_gpu_is_judged() -> None:
    probe = _Host("no driver")
    triage_node(kernel_log=XID_79_AT_3B, nvml_here=probe)  # type: ignore[arg-type]
    assert probe.calls == 0
    triage_node(kernel_log="[    1.000000] quiet\n", nvml_here=probe)  # type: ignore[arg-type]
    assert probe.calls == 1


def test_nvidia_smi_without_the_key_fields_is_told_so() -> None:
    text = "index, pci.bus_id, name\n0, 00000000:1B:00.0, NVIDIA H100 80GB HBM3\n"
    report = triage_node(nvidia_smi=text)
    assert report.verdict == "unknown" and "lacks the key fields" in report.first_action


# ---------------------------------------------------------------------------------------------------------------------
# through the MCP tools, in process


def _no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_tools_report_the_lost_gpu(suite_client: object) -> None:
    from tests.helpers import call_ok

    client = suite_client
    result = await client.call_tool("gpu_health", {"text": read(LOST_Q)})  # type: ignore[attr-defined]
    text = result.content[0].text
    assert not result.is_error and text.startswith("8 GPU(s) from text, driver 535.216.01")
    assert "node unhealthy: 6 healthy, 2 unhealthy" in text and "garbled" not in text
    assert "- GPU 2 0000:3b:00.0: unhealthy" in text and "fallen off the bus" in text
    health = result.structured_content
    assert health["gpu_count"] == 8 and health["counts"] == {"healthy": 6, "unhealthy": 2}
    [lost] = [g for g in health["gpus"] if g["gpu"].get("unreachable")]
    assert lost["gpu"]["unreachable_reason"].startswith("nvidia-smi: Unable to determine the device handle")
    report = await call_ok(client, "triage_node", {"nvidia_smi_text": read(LOST_Q), "kernel_log_text": XID_79_AT_3B})
    [gpu] = [g for g in report["gpus"] if g["bus_id"] == "0000:3b:00"]
    assert gpu["seen_by"] == ["nvidia_smi", "kernel_log"] and gpu["verdict"] == "unhealthy"
    assert report["counts"]["unhealthy"] == 2 and report["gpu_count"] == 8


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_tools_without_a_driver_degrade_the_same_way(
    suite_client: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: triage_node with live_nvml on a host without a driver was a hard error."""
    from tests.helpers import call_ok

    _no_driver(monkeypatch)
    client = suite_client
    health = await call_ok(client, "gpu_health", {})
    assert not health["available"] and health["node_status"] == "unknown"
    missing = health["reason"]
    assert missing.startswith("NVML not available here: no usable NVIDIA driver on this host")
    report = await call_ok(client, "triage_node", {"live_nvml": True, "kernel_log_text": XID_79_AT_3B})
    assert report["sources"][0]["summary"] == f"unknown: {missing}"  # the same words as gpu_health's
    assert report["verdict"] == "unhealthy" and [g["bus_id"] for g in report["gpus"]] == ["0000:3b:00"]
    only = await call_ok(client, "triage_node", {"live_nvml": True})
    assert only["verdict"] == "unknown" and only["first_action"].startswith(f"Unknown: {missing}")
    quiet = await call_ok(client, "triage_node", {"kernel_log_text": "[    1.000000] quiet\n"})
    assert f"this host has no live GPU source ({missing})" in quiet["first_action"]
    assert "run on the node" not in quiet["first_action"]
