"""The one result type of the diagnostic checks (servers.diagnostics.findings): every bundled check's findings speak
one status and one severity alphabet; a check registered from a test (one function, one line) is joined by triage
like the bundled ones; each published alphabet is made from the one status by a total mapping."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from servers.core.errors import InputError
from servers.diagnostics import dcgm, findings, nccl_tests, snapshot, triage, xid
from servers.diagnostics.dcgm import parse_dcgm_diag
from servers.diagnostics.findings import (
    ATTENTION_RANK,
    CHECKS,
    DCGM_STATUS,
    DCGM_WORD,
    SEVERITY_RANK,
    STATUS_RANK,
    STATUSES,
    VERDICT_WORD,
    Check,
    CheckReport,
    Finding,
    GpuRef,
    Severity,
    Status,
    register_check,
    severity_status,
    worst_status,
)
from servers.diagnostics.health import NodeGpus
from servers.diagnostics.kmsg import scan_text
from servers.diagnostics.nccl_tests import parse_nccl_tests
from servers.diagnostics.smi import parse_nvidia_smi
from servers.diagnostics.triage import triage_node

FIXTURES = Path(__file__).parent / "fixtures" / "diagnostics"
DIAGNOSTICS = Path(__file__).parent.parent / "servers" / "diagnostics"
SEVERITIES = set(get_args(Severity))
STATUS_WORDS = set(get_args(Status))


def _bundled_inputs() -> Iterator[tuple[str, object]]:
    """Every bundled check's input from every fixture it reads."""
    smi = [p for p in sorted((FIXTURES / "smi").glob("*.[cxt]*")) if "noheader" not in p.name and p.suffix != ".md"]
    for path in [*smi, FIXTURES / "triage" / "query-gpu.7of8xH100.synthetic.csv"]:
        parsed = parse_nvidia_smi(path.read_text())
        yield "nvidia_smi", NodeGpus(gpus=parsed.gpus, warnings=tuple(parsed.warnings))
    yield "nvidia_smi", NodeGpus(gpus=None, missing="NVML: no driver on this host")
    for path in [*sorted((FIXTURES / "kmsg").glob("*.log")), FIXTURES / "triage" / "dmesg-T.8xH100.synthetic.log"]:
        yield "kernel_log", scan_text(path.read_text(), classify=xid.classify)
    for path in [*sorted((FIXTURES / "dcgm").glob("*.json")), *sorted((FIXTURES / "triage").glob("*.json"))]:
        yield "dcgm", parse_dcgm_diag(path.read_text())
    for path in [*sorted((FIXTURES / "nccl").glob("*.txt")), *sorted((FIXTURES / "triage").glob("*.txt"))]:
        yield "nccl_tests", parse_nccl_tests(path.read_text())


def test_every_bundled_checks_findings_speak_the_one_alphabet() -> None:
    seen: dict[str, set[tuple[str | None, str]]] = {}
    for name, value in _bundled_inputs():
        report = CHECKS[name].report(value)
        assert report.check == name
        for finding in report.findings:
            assert finding.check == name
            assert finding.severity in SEVERITIES
            assert finding.status is None or finding.status in STATUS_WORDS
            assert finding.rule and finding.what
            seen.setdefault(name, set()).add((finding.status, finding.severity))
    assert set(seen) == {"nvidia_smi", "kernel_log", "dcgm", "nccl_tests"}
    # the fixtures exercise bad news in every check, so the test would see a stray word
    for name in seen:
        assert any(status in ("unhealthy", "degraded") or severity != "info" for status, severity in seen[name]), name


def test_the_published_alphabets_are_the_one_alphabet_or_made_from_it_by_its_mapping() -> None:
    assert get_args(snapshot.Finding.model_fields["severity"].annotation) == get_args(Severity)
    assert get_args(snapshot.GpuHealth.model_fields["status"].annotation) == get_args(Status)
    assert get_args(triage.GpuTriage.model_fields["verdict"].annotation) == get_args(Status)
    assert get_args(triage.TriageEvidence.model_fields["severity"].annotation) == get_args(Severity)
    assert get_args(nccl_tests.NcclVerdict.model_fields["severity"].annotation) == get_args(Severity)
    assert set(get_args(nccl_tests.NcclVerdict.model_fields["status"].annotation)) == set(VERDICT_WORD.values())
    assert set(get_args(dcgm.DcgmGpuSummary.model_fields["status"].annotation)) == set(DCGM_WORD.values())
    assert get_args(xid.RecoveryAction.model_fields["severity"].annotation) == get_args(Severity)
    assert set(get_args(xid.FindingSeverity)) == SEVERITIES | {"unknown"}  # an uncatalogued code's


def test_no_diagnostics_module_declares_its_own_severity_or_status_alphabet() -> None:
    """Severity and the healthy/degraded alphabet are written once, in findings.py."""
    own = []
    for path in sorted(DIAGNOSTICS.rglob("*.py")):
        if path == DIAGNOSTICS / "findings.py":
            continue
        text = path.read_text()
        for match in re.finditer(r"Literal\[([^\]]*)\]", text):
            words = set(re.findall(r"[\"']([^\"']*)[\"']", match.group(1)))
            if words in (SEVERITIES, STATUS_WORDS) or {"healthy", "unhealthy"} <= words:
                own.append(f"{path.relative_to(DIAGNOSTICS)}: {match.group(0)}")
        own += [f"{path.relative_to(DIAGNOSTICS)}: {m}" for m in re.findall(r"(?m)^Severity = .*$", text)]
    assert own == []


# ---------------------------------------------------------------------------------------------------------------------
# a check registered from the test


def toy_report(value: dict[str, object]) -> CheckReport:
    """A toy probe: one GPU it judges, by its bus id, and one finding about the node."""
    gpu = GpuRef(bus_id=str(value["bus"]))
    return CheckReport(
        check="toy",
        findings=[
            Finding("toy", "toy_burn", "unhealthy", "critical", "toy burn-in failed", "42 errors", "Replace it.", gpu),
            Finding("toy", "toy_fan", None, "warning", "toy says a fan is slow", action="Check the fan."),
        ],
        summary="toy: 1 GPU judged",
        lists_every_gpu=bool(value.get("all")),
        missing_means="the toy probe never saw {it}",
    )


@pytest.fixture
def toy() -> Iterator[Check]:
    check = register_check(Check("toy", "toy probe", toy_report))  # the one registration line
    try:
        yield check
    finally:
        CHECKS.pop("toy")


def test_a_registered_check_is_joined_by_triage_like_the_bundled_ones(toy: Check) -> None:
    smi = (FIXTURES / "smi" / "query-gpu.4xH100.535.header-units.csv").read_text()
    buses = [findings.normalise_bus_id(g.pci_bus_id) for g in parse_nvidia_smi(smi).gpus]
    result = triage_node(nvidia_smi=smi, others={"toy": {"bus": buses[1]}})
    judged = next(g for g in result.gpus if g.bus_id == buses[1])
    assert judged.seen_by == ["nvidia_smi", "toy"]
    assert judged.source_verdicts["toy"] == "unhealthy" and judged.verdict == "unhealthy"
    assert judged.evidence[0].source == "toy" and judged.evidence[0].what == "toy burn-in failed (42 errors)"
    assert judged.action == "Replace it."
    before = triage_node(nvidia_smi=smi)
    assert {g.bus_id: g.verdict for g in before.gpus}[buses[1]] != "unhealthy"
    assert result.verdict == "unhealthy" and result.counts["unhealthy"] == before.counts["unhealthy"] + 1
    assert [e.what for e in result.node_evidence] == ["toy says a fan is slow"]
    assert {s.source: s.summary for s in result.sources}["toy"] == "toy: 1 GPU judged"
    assert "toy probe" in result.summary
    others = [g for g in result.gpus if g.bus_id != buses[1]]
    assert others and all("toy" not in g.seen_by for g in others)


def test_a_registered_check_that_lists_every_gpu_says_what_missing_from_it_means(toy: Check) -> None:
    smi = (FIXTURES / "smi" / "query-gpu.4xH100.535.header-units.csv").read_text()
    bus = findings.normalise_bus_id(parse_nvidia_smi(smi).gpus[0].pci_bus_id)
    result = triage_node(nvidia_smi=smi, others={"toy": {"bus": bus, "all": True}})
    assert any("not in the toy probe: the toy probe never saw them" in w for w in result.warnings)
    alone = triage_node(others={"toy": {"bus": "0000:3b:00"}})  # no bundled source at all
    assert alone.gpu_count == 1 and alone.gpus[0].verdict == "unhealthy" and alone.gpus[0].seen_by == ["toy"]


def test_triage_refuses_an_input_for_no_registered_check(toy: Check) -> None:
    with pytest.raises(InputError, match=r"'nope' is not a registered check.*accepted: toy"):
        triage_node(others={"nope": {}})
    with pytest.raises(InputError, match="'dcgm' is not a registered check taking its input there"):
        triage_node(others={"dcgm": "{}"})


def test_a_check_name_must_be_registered_and_new(toy: Check) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_check(Check("toy", "again", toy_report))
    triage.TriageEvidence(source="toy", severity="info", what="x")
    with pytest.raises(ValidationError, match="not a registered check"):
        triage.TriageEvidence(source="nope", severity="info", what="x")
    # what tools/list publishes is the bundled checks, however many a process registers
    schema = triage.TriageEvidence.model_json_schema()["properties"]["source"]
    assert schema["enum"] == ["nvidia_smi", "kernel_log", "dcgm", "nccl_tests"] and schema["type"] == "string"


def test_a_check_that_returns_another_shape_is_refused() -> None:
    with pytest.raises(TypeError, match="not its CheckReport"):
        Check("odd", "odd", lambda value: {"status": "PASS"}).report(None)


# ---------------------------------------------------------------------------------------------------------------------
# the mappings


def test_every_mapping_is_total_and_the_dcgm_words_read_back() -> None:
    for status in STATUS_WORDS:
        assert VERDICT_WORD[status] and DCGM_WORD[status]
        assert DCGM_STATUS[DCGM_WORD[status]] == status
        assert nccl_tests.VERDICT_STATUS[VERDICT_WORD[status]] == status
        assert status in STATUS_RANK and status in ATTENTION_RANK and status in STATUSES
    assert len(set(VERDICT_WORD.values())) == len(set(DCGM_WORD.values())) == len(STATUS_WORDS)  # one-to-one
    for severity in SEVERITIES:
        assert severity_status(severity) in STATUS_WORDS and severity in SEVERITY_RANK
    assert [severity_status(s) for s in ("info", "warning", "critical")] == ["healthy", "degraded", "unhealthy"]
    # DCGM's own ranking is the status ranking through the mapping
    assert dcgm._RANK == {"fail": 3, "warn": 2, "pass": 1, "skip": 0}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(sorted(STATUS_WORDS)), max_size=8))
def test_property_the_worst_status_is_the_worst_in_every_published_alphabet(statuses: list[Status]) -> None:
    worst = worst_status(statuses)
    if not statuses or all(s == "unknown" for s in statuses):
        assert worst == "unknown"
    else:
        assert worst != "unknown" and all(STATUS_RANK[worst] >= STATUS_RANK[s] for s in statuses)
    # the same worst in DCGM's words, ranked by DCGM's own order
    words = [DCGM_WORD[s] for s in statuses]
    assert max(words, key=lambda w: dcgm._RANK[w], default="skip") == DCGM_WORD[worst]
