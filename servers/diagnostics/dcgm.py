"""DCGM diagnostics (`dcgmi diag -r 1..4 -j`): parse the JSON of DCGM 3.x and 4.x, tell whether dcgmi is here, and
run the diagnostic as a job. Plain module (no MCP imports).

Layouts read:
- DCGM 3.x: {"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results": [{"gpu_ids"
  (or "gpu_id"): "0" or "0,1,...", "status": "Pass", "warnings": [{"warning", "error_id", ...} or text],
  "info": text or [text]}]}]}], "version", ...}}; the software (Deployment) tests have one result for all GPUs.
- DCGM 4.x: {"DCGM Diagnostic": {"test_categories": [... "tests": [{"name", "results": [{"entity_group": "GPU",
  "entity_group_id", "entity_id", "status", "warnings": [{"warning", "error_id", "error_category",
  "error_severity"}], "info": [...]}], "test_summary": {"status", "info"}}]]}, "entity_groups": [...],
  "metadata": {"version", "Driver Version Detected"}}.
Statuses are normalised to pass, fail, warn and skip ("Not Run" and "Skipped" are skip); the verdict is fail
if any result fails, else warn if any warns, else pass; error when the document holds no results.

Levels: r1 software checks (seconds); r2 adds memory and PCIe (about 2 min); r3 adds the diagnostic, memory
bandwidth, targeted stress and power tests (10-15 min); r4 adds memtest and pulse test (over an hour).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from typing import Any, Literal

from pydantic import Field

from servers.core.errors import InputError
from servers.core.models import Model
from servers.diagnostics.bounds import MAX_LINE_TEXT, MAX_NOTES, cap_notes, clip, clip_str, fit, pick, safe_int, scaled
from servers.diagnostics.findings import DCGM_STATUS, STATUS_RANK, CheckReport, DcgmWord, Finding, GpuRef, Severity

Overall = Literal["pass", "fail", "warn", "skip", "error"]

ROOT_KEY_4X = "DCGM Diagnostic"
ROOT_KEY_3X = "DCGM GPU Diagnostic"
DRIVER_KEY = "Driver Version Detected"
MAX_TEXT_CHARS = 50_000_000

INSTALL_HINT = (
    "install DCGM (datacenter-gpu-manager, e.g. 'apt-get install datacenter-gpu-manager-4-cuda12' or the "
    "datacenter-gpu-manager package for DCGM 3) and start the host engine (systemctl start nvidia-dcgm)"
)
LEVEL_EXPECTED_S = {1: 30, 2: 150, 3: 900, 4: 5400}
LEVEL_DEFAULT_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 14400}
MAX_TIMEOUT_S = 48 * 3600
# Most items a report lists; counts, statuses and the verdict cover everything. Failed and warned results first.
MAX_RESULTS = 256
MAX_TESTS = 128
MAX_GPUS = 128
MAX_PER_RESULT = 8  # warnings, info lines and entity ids of one result; summary_info lines of one test
MAX_NAMES = 32  # test names in one GPU's failed / warned / skipped lists
MAX_NAME = 128  # characters of a test, category or status name
MAX_IDS = 1024  # entity ids read from one result (DCGM numbers the GPUs of one node)
MAX_LISTED_IDS = 64  # entity ids listed per result

_STATUS = {
    "pass": "pass",
    "passed": "pass",
    "ok": "pass",
    "success": "pass",
    "fail": "fail",
    "failed": "fail",
    "failure": "fail",
    "error": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "skip",
    "notrun": "skip",
    "not_run": "skip",
    "not applicable": "skip",
    "n/a": "skip",
    "na": "skip",
    "not supported": "skip",
}
# fail > warn > pass > skip, as their statuses rank
_RANK: dict[DcgmWord, int] = {word: STATUS_RANK[status] for word, status in DCGM_STATUS.items()}
_LIST_FIRST = {"fail": 2, "warn": 1}  # which results, tests and GPUs a capped report lists first

# dcgm_errors.h: dcgmErrorSeverity_t and dcgmErrorCategory_t
ERROR_SEVERITY = {
    0: "NONE",
    1: "MONITOR (can run work, monitor it)",
    2: "ISOLATE (cannot run work, isolate the GPU)",
    3: "UNKNOWN",
    4: "TRIAGE (triage the error)",
    5: "CONFIG (fixable by configuration)",
    6: "RESET (drain and reset the GPU)",
}
ERROR_CATEGORY = {
    0: "NONE",
    1: "PERF_THRESHOLD",
    2: "PERF_VIOLATION",
    3: "SOFTWARE_CONFIG",
    4: "SOFTWARE_LIBRARY",
    5: "SOFTWARE_XID",
    6: "SOFTWARE_CUDA",
    7: "SOFTWARE_EUD",
    8: "SOFTWARE_OTHER",
    9: "HARDWARE_THERMAL",
    10: "HARDWARE_MEMORY",
    11: "HARDWARE_NVLINK",
    12: "HARDWARE_NVSWITCH",
    13: "HARDWARE_PCIE",
    14: "HARDWARE_POWER",
    15: "HARDWARE_OTHER",
    16: "INTERNAL_OTHER",
}
# A few dcgmError_t codes (DCGM_FR_*) worth naming.
ERROR_NAMES = {
    5: "VOLATILE_SBE_DETECTED",
    6: "PENDING_PAGE_RETIREMENTS",
    7: "RETIRED_PAGES_LIMIT",
    8: "RETIRED_PAGES_DBE_LIMIT",
    9: "CORRUPT_INFOROM",
    10: "CLOCK_THROTTLE_THERMAL",
    12: "CLOCK_THROTTLE_POWER",
    13: "NVLINK_ERROR_THRESHOLD",
    14: "NVLINK_DOWN",
    15: "NVSWITCH_FATAL_ERROR",
    16: "NVSWITCH_NON_FATAL_ERROR",
    23: "DENYLISTED_DRIVER",
    25: "GRAPHICS_PROCESSES",
    28: "BAD_CUDA_ENV",
    29: "PERSISTENCE_MODE",
    30: "LOW_BANDWIDTH",
    31: "HIGH_LATENCY",
    40: "THERMAL_VIOLATIONS",
    42: "TEMP_VIOLATION",
    43: "THROTTLING_VIOLATION",
    45: "PCIE_GENERATION",
    46: "PCIE_WIDTH",
    50: "STRESS_LEVEL",
    52: "FAULTY_MEMORY",
    57: "CUDA_DBE",
    58: "MEMORY_MISMATCH",
    62: "MEMORY_BANDWIDTH",
    63: "TARGET_POWER",
    70: "NVLINK_CRC_ERROR_THRESHOLD",
    71: "NVLINK_ERROR_CRITICAL",
    80: "ROW_REMAP_FAILURE",
    81: "UNCONTAINED_ERROR",
    84: "UNCORRECTABLE_ROW_REMAP",
    85: "PENDING_ROW_REMAP",
    98: "PCIE_H_REPLAY_VIOLATION",
    99: "GPU_EXPECTED_NVLINKS_UP",
    101: "XID_ERROR",
    102: "SBE_VIOLATION",
    103: "DBE_VIOLATION",
    104: "PCIE_REPLAY_VIOLATION",
    108: "CUDA_FM_NOT_INITIALIZED",
    109: "SXID_ERROR",
}


class DcgmWarning(Model):
    text: str
    error_id: int | None = Field(default=None, description="DCGM_FR_* code")
    error_name: str | None = Field(default=None, description="DCGM_FR_* name, where known")
    error_category: int | None = None
    error_category_name: str | None = None
    error_severity: int | None = None
    error_severity_name: str | None = None


class DcgmResult(Model):
    """One result of one test: for one GPU (or, for 3.x software tests, for several GPUs at once)."""

    category: str | None = None
    test: str
    entity_group: str = "GPU"
    entity_ids: list[int] = Field(default_factory=list, description="GPU ids (DCGM's numbering) it covers")
    status: DcgmWord
    raw_status: str
    warnings: list[DcgmWarning] = Field(default_factory=list, description=f"at most {MAX_PER_RESULT}, each clipped")
    warnings_omitted: int = 0
    info: list[str] = Field(default_factory=list, description=f"at most {MAX_PER_RESULT}, each clipped")
    info_omitted: int = 0


class DcgmTest(Model):
    category: str | None = None
    name: str
    status: DcgmWord = Field(description="worst of the test's results (and of its summary, in 4.x)")
    summary_status: DcgmWord | None = Field(default=None, description="DCGM 4.x test_summary status")
    summary_info: list[str] = Field(default_factory=list)
    results: int = Field(description="number of results")


class DcgmGpuSummary(Model):
    gpu_id: int
    status: DcgmWord
    failed_tests: list[str] = Field(default_factory=list)
    warned_tests: list[str] = Field(default_factory=list)
    skipped_tests: list[str] = Field(default_factory=list)
    device_id: str | None = None
    serial: str | None = None


class DcgmDiagReport(Model):
    layout: Literal["3.x", "4.x"]
    dcgm_version: str | None = None
    driver_version: str | None = None
    verdict: Overall = Field(description="fail if any result failed, else warn, pass, skip; error without results")
    summary: str
    runtime_error: str | None = None
    global_warning: str | None = None
    tests: list[DcgmTest] = Field(default_factory=list, description=f"at most {MAX_TESTS}; see tests_omitted")
    tests_omitted: int = 0
    results: list[DcgmResult] = Field(
        default_factory=list, description=f"at most {MAX_RESULTS} (failed and warned ones first); see results_omitted"
    )
    results_total: int = 0
    results_omitted: int = 0
    gpus: list[DcgmGpuSummary] = Field(default_factory=list, description=f"at most {MAX_GPUS}; see gpus_omitted")
    gpus_omitted: int = 0
    warnings: list[str] = Field(default_factory=list, description="what the parser could not read")

    def listing_note(self) -> str:
        """What the report leaves out, for the text summary ('' when it lists everything)."""
        parts = [
            f"{omitted} of {omitted + len(listed)} {what}"
            for what, listed, omitted in (
                ("results", self.results, self.results_omitted),
                ("tests", self.tests, self.tests_omitted),
                ("GPUs", self.gpus, self.gpus_omitted),
            )
            if omitted
        ]
        return f" Not listed (counted in the verdict all the same): {', '.join(parts)}." if parts else ""


def normalise_status(raw: object) -> DcgmWord | None:
    """pass, fail, warn or skip for DCGM's status words; None when the word is not recognised."""
    if not isinstance(raw, str):
        return None
    return _STATUS.get(" ".join(raw.strip().lower().replace("-", " ").split()))  # type: ignore[return-value]


def _text(value: object) -> str:
    return clip_str(value if isinstance(value, str) else json.dumps(value)[: MAX_LINE_TEXT + 1], MAX_LINE_TEXT)


def _texts(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [_text(value)] if value.strip() else []
    if isinstance(value, list):
        return [_text(v) for v in value if v is not None and v != ""]
    return [_text(value) if not isinstance(value, (int, float)) else str(value)]


_INT_LIMIT = 2**63


def _opt_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < _INT_LIMIT else None
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) < _INT_LIMIT:
        return int(value)
    if isinstance(value, str):
        return safe_int(value.strip())
    return None


def _warning(value: object) -> DcgmWarning | None:
    if isinstance(value, str):
        return DcgmWarning(text=_text(value)) if value.strip() else None
    if not isinstance(value, dict):
        return None
    text = value.get("warning", value.get("message", ""))
    error_id = _opt_int(value.get("error_id", value.get("error_code")))
    category = _opt_int(value.get("error_category"))
    severity = _opt_int(value.get("error_severity"))
    return DcgmWarning(
        text=_text(text),
        error_id=error_id,
        error_name=ERROR_NAMES.get(error_id) if error_id is not None else None,
        error_category=category,
        error_category_name=ERROR_CATEGORY.get(category) if category is not None else None,
        error_severity=severity,
        error_severity_name=ERROR_SEVERITY.get(severity) if severity is not None else None,
    )


def _warnings(value: object) -> list[DcgmWarning]:
    items = value if isinstance(value, list) else [value]
    return [w for w in (_warning(v) for v in items) if w is not None]


def _ids(value: object, depth: int = 0) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value] if 0 <= value < _INT_LIMIT else []
    if isinstance(value, str):
        return [i for i in (safe_int(p) for p in value.replace(" ", "").split(",")) if i is not None and i >= 0]
    if isinstance(value, list) and depth < 3:
        return [i for v in value for i in _ids(v, depth + 1)]
    return []


def _decode(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        raise InputError(
            "this is not DCGM JSON: no '{' found; run 'dcgmi diag -r LEVEL -j' (the -j asks for JSON) and paste "
            "its whole output"
        )
    try:
        document, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise InputError(f"the DCGM output is not valid JSON ({exc}); paste the whole output of dcgmi diag -j") from exc
    except RecursionError:
        raise InputError("the DCGM JSON is nested too deeply to be dcgmi diag output") from None
    except ValueError:  # an integer of more than 4300 digits
        raise InputError("the DCGM JSON holds a number too long to be dcgmi diag output") from None
    return document


def _first(*candidates: object) -> str | None:
    for value in candidates:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value).strip():
            return str(value)
    return None


def parse_dcgm_diag(text: str) -> DcgmDiagReport:
    """Parse `dcgmi diag -j` output of DCGM 3.x or 4.x into per-test, per-GPU results and an overall verdict.

    The report lists at most MAX_RESULTS results, MAX_TESTS tests and MAX_GPUS GPUs (counts in *_omitted); the
    verdict and the per-GPU statuses are made from all of them."""
    try:
        return _bounded(_parse(text))
    except RecursionError:
        raise InputError("the DCGM JSON is nested too deeply to be dcgmi diag output") from None


def _parse(text: str) -> DcgmDiagReport:
    if not isinstance(text, str) or not text.strip():
        raise InputError("the DCGM output is empty; paste the whole output of 'dcgmi diag -r LEVEL -j'")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"the DCGM output is {len(text)} characters; at most {MAX_TEXT_CHARS} are read")
    document = _decode(text)
    if not isinstance(document, dict):
        raise InputError("the DCGM JSON must be an object with a 'DCGM Diagnostic' (4.x) or 'DCGM GPU Diagnostic' key")
    if isinstance(document.get(ROOT_KEY_4X), dict):
        root, layout = document[ROOT_KEY_4X], "4.x"
    elif isinstance(document.get(ROOT_KEY_3X), dict):
        root, layout = document[ROOT_KEY_3X], "3.x"
    elif "test_categories" in document or "tests" in document:
        root, layout = document, "3.x"
    else:
        keys = ", ".join(repr(k) for k in list(document)[:8])
        raise InputError(
            f"this JSON has no 'DCGM Diagnostic' (DCGM 4.x) or 'DCGM GPU Diagnostic' (DCGM 3.x) key (keys: {keys}); "
            "paste the output of 'dcgmi diag -r LEVEL -j'"
        )
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    parser_warnings: list[str] = []

    categories = root.get("test_categories")
    pairs: list[tuple[str | None, Any]] = []
    if isinstance(categories, list):
        for category in categories:
            if not isinstance(category, dict):
                continue
            name = category.get("category")
            tests = category.get("tests")
            for test in tests if isinstance(tests, list) else []:
                pairs.append((clip(name, MAX_NAME) if isinstance(name, str) else None, test))
    elif categories is not None:
        parser_warnings.append("'test_categories' is not a list; it was skipped")
    hoisted = root.get("tests")
    if isinstance(hoisted, list):
        pairs.extend((None, test) for test in hoisted)

    results: list[DcgmResult] = []
    tests: list[DcgmTest] = []
    for category, test in pairs:
        if not isinstance(test, dict):
            continue
        name = test.get("name") or test.get("test_name")
        if not isinstance(name, str) or not name.strip():
            parser_warnings.append("a test without a name was skipped")
            continue
        name = clip_str(name, MAX_NAME)
        own: list[DcgmResult] = []
        raw_results = test.get("results")
        for raw in raw_results if isinstance(raw_results, list) else []:
            if not isinstance(raw, dict):
                continue
            raw_status = raw.get("status")
            status = normalise_status(raw_status)
            raw_text = clip_str(raw_status if isinstance(raw_status, str) else json.dumps(raw_status)[:100], MAX_NAME)
            if status is None:
                parser_warnings.append(f"{name}: status {raw_text!r} not recognised; counted as warn")
                status = "warn"
            group = raw.get("entity_group")
            id_field = raw.get("entity_id") if "entity_id" in raw else raw.get("gpu_ids", raw.get("gpu_id"))
            ids = _ids(id_field)
            if len(ids) > MAX_IDS:
                parser_warnings.append(f"{name}: a result names {len(ids)} entities; the first {MAX_IDS} are used")
                ids = ids[:MAX_IDS]
            warnings, warnings_omitted = pick(_warnings(raw.get("warnings", [])), MAX_PER_RESULT)
            info, info_omitted = pick(_texts(raw.get("info")), MAX_PER_RESULT)
            own.append(
                DcgmResult(
                    category=category,
                    test=name,
                    entity_group=clip_str(group, MAX_NAME) if isinstance(group, str) and group else "GPU",
                    entity_ids=ids,
                    status=status,
                    raw_status=raw_text,
                    warnings=warnings,
                    warnings_omitted=warnings_omitted,
                    info=info,
                    info_omitted=info_omitted,
                )
            )
        summary = test.get("test_summary") if isinstance(test.get("test_summary"), dict) else None
        summary_status = normalise_status(summary.get("status")) if summary else None
        ranked = [r.status for r in own] + ([summary_status] if summary_status else [])
        if not ranked:
            parser_warnings.append(f"{name}: no results; counted as skip")
        worst: DcgmWord = max(ranked, key=lambda s: _RANK[s]) if ranked else "skip"
        tests.append(
            DcgmTest(
                category=category,
                name=name,
                status=worst,
                summary_status=summary_status,
                summary_info=cap_notes(_texts(summary.get("info")), MAX_PER_RESULT) if summary else [],
                results=len(own),
            )
        )
        results.extend(own)

    entities = _entities(document.get("entity_groups"), root)
    gpus = _gpu_summaries(results, entities)
    runtime_error = clip(_first(root.get("runtime_error"), document.get("runtime_error")), MAX_LINE_TEXT)
    global_warning = clip(_first(root.get("Warning"), document.get("Warning")), MAX_LINE_TEXT)
    version = clip(_first(metadata.get("version"), root.get("version"), document.get("version")), 64)
    driver = clip(_first(metadata.get(DRIVER_KEY), root.get(DRIVER_KEY), document.get(DRIVER_KEY)), 64)
    verdict, summary_text = _overall(tests, gpus, runtime_error)
    return DcgmDiagReport(
        layout=layout,  # type: ignore[arg-type]
        dcgm_version=version,
        driver_version=driver,
        verdict=verdict,
        summary=summary_text,
        runtime_error=runtime_error,
        global_warning=global_warning,
        tests=tests,
        results=results,
        gpus=gpus,
        warnings=parser_warnings,
    )


def _bounded(report: DcgmDiagReport) -> DcgmDiagReport:
    """The report with its lists capped (failed and warned results first); counts of the rest in *_omitted."""

    def build(scale: float) -> DcgmDiagReport:
        results, results_omitted = pick(
            report.results, scaled(MAX_RESULTS, scale), lambda r: _LIST_FIRST.get(r.status, 0)
        )
        tests, tests_omitted = pick(report.tests, scaled(MAX_TESTS, scale), lambda t: _LIST_FIRST.get(t.status, 0))
        gpus, gpus_omitted = pick(report.gpus, scaled(MAX_GPUS, scale), lambda g: _LIST_FIRST.get(g.status, 0))
        return report.model_copy(
            update={
                "results": [
                    r.model_copy(update={"entity_ids": r.entity_ids[:MAX_LISTED_IDS]})
                    if len(r.entity_ids) > MAX_LISTED_IDS
                    else r
                    for r in results
                ],
                "results_total": len(report.results),
                "results_omitted": results_omitted,
                "tests": tests,
                "tests_omitted": tests_omitted,
                "gpus": gpus,
                "gpus_omitted": gpus_omitted,
                "warnings": cap_notes(report.warnings, scaled(MAX_NOTES, scale)),
            }
        )

    return fit(build)


def _entities(groups: object, root: dict[str, Any]) -> dict[int, tuple[str | None, str | None]]:
    """GPU id -> (PCI device id, serial) from 4.x entity_groups or 3.x 'GPU Device IDs' / 'GPU Device Serials'."""
    out: dict[int, tuple[str | None, str | None]] = {}
    if isinstance(groups, list):
        for group in groups:
            if not isinstance(group, dict) or group.get("entity_group") not in (None, "GPU"):
                continue
            for entity in group.get("entities") or []:
                if not isinstance(entity, dict):
                    continue
                gpu = _opt_int(entity.get("entity_id"))
                if gpu is not None:
                    serial = clip(_first(entity.get("serial_num")), MAX_NAME)
                    device = clip(_first(entity.get("device_id")), MAX_NAME)
                    out[gpu] = (device, None if serial == "<<<NOT_SUPPORTED>>>" else serial)
    device_ids = root.get("GPU Device IDs")
    serials = root.get("GPU Device Serials")
    if isinstance(device_ids, list):
        for index, device in enumerate(device_ids):
            out.setdefault(index, (clip(_first(device), MAX_NAME), None))
    if isinstance(serials, dict):
        for key, serial in serials.items():
            gpu = _opt_int(key)
            if gpu is not None:
                out[gpu] = (out.get(gpu, (None, None))[0], clip(_first(serial), MAX_NAME))
    return out


def _gpu_summaries(
    results: list[DcgmResult], entities: dict[int, tuple[str | None, str | None]]
) -> list[DcgmGpuSummary]:
    per_gpu: dict[int, DcgmGpuSummary] = {}
    for result in results:
        if result.entity_group.upper() != "GPU":
            continue
        for gpu in result.entity_ids:
            device, serial = entities.get(gpu, (None, None))
            summary = per_gpu.setdefault(
                gpu, DcgmGpuSummary(gpu_id=gpu, status="skip", device_id=device, serial=serial)
            )
            if _RANK[result.status] > _RANK[summary.status]:
                summary.status = result.status
            bucket = {"fail": summary.failed_tests, "warn": summary.warned_tests, "skip": summary.skipped_tests}
            names = bucket.get(result.status)
            if names is not None and len(names) < MAX_NAMES and result.test not in names:
                names.append(result.test)
    return [per_gpu[g] for g in sorted(per_gpu)]


def _names(names: list[str], limit: int = 10) -> str:
    """'a, b, c' for at most `limit` names, then 'and N more'."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _overall(tests: list[DcgmTest], gpus: list[DcgmGpuSummary], runtime_error: str | None) -> tuple[Overall, str]:
    if not tests:
        reason = f": {runtime_error}" if runtime_error else ""
        return "error", f"ERROR: the document holds no test results{reason}."
    worst = max((t.status for t in tests), key=lambda s: _RANK[s])
    failed = _names([t.name for t in tests if t.status == "fail"])
    warned = _names([t.name for t in tests if t.status == "warn"])
    bad_gpus = _names([str(g.gpu_id) for g in gpus if g.status == "fail"])
    if worst == "fail":
        where = f" on GPU {bad_gpus}" if bad_gpus else ""
        return "fail", (
            f"FAIL: {failed} failed{where}; drain the affected GPUs, read the warnings (error ids) and "
            "rerun at the same level after the fix."
        )
    if worst == "warn":
        return "warn", f"WARN: {warned} passed with warnings; read them before trusting the node."
    if worst == "pass":
        skipped = [t.name for t in tests if t.status == "skip"]
        extra = f" ({len(skipped)} skipped: {_names(skipped)})" if skipped else ""
        return "pass", f"PASS: {sum(t.status == 'pass' for t in tests)} tests passed{extra}."
    return "skip", "SKIP: every test was skipped or not run; nothing was checked."


def dcgm_available() -> tuple[bool, str]:
    """(True, where dcgmi is) or (False, why not and how to install it). Runs nothing."""
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        return False, f"dcgmi not found on PATH: {INSTALL_HINT}"
    engine = shutil.which("nv-hostengine")
    if engine is None:
        return True, (
            f"dcgmi at {dcgmi}; nv-hostengine is not on PATH, so dcgmi needs a host engine running elsewhere "
            "(systemctl start nvidia-dcgm)"
        )
    return True, f"dcgmi at {dcgmi}, nv-hostengine at {engine}"


def _spec_level(spec: dict[str, Any]) -> int:
    level = spec.get("level", 1)
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 4:
        raise InputError(f"level must be 1, 2, 3 or 4 (dcgmi diag -r LEVEL), not {level!r}")
    return level


def _spec_timeout(spec: dict[str, Any], level: int) -> float:
    timeout = spec.get("timeout_s")
    if timeout is None:
        return float(LEVEL_DEFAULT_TIMEOUT_S[level])
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout):
        raise InputError(f"timeout_s must be a number of seconds, not {timeout!r}")
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise InputError(f"timeout_s must be between 0 and {MAX_TIMEOUT_S} seconds, not {timeout}")
    return float(timeout)


def _tail(path: Any, limit: int = 2000) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()[-limit:].strip()
    except OSError:
        return ""


def run_dcgm_diag_job(spec: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Job work function: run `dcgmi diag -r LEVEL -j`, keep its output as a log, return the parsed report.

    spec: {"level": 1..4, "timeout_s": seconds (default by level)}. ctx: the job context (progress, log_path).
    Raises RuntimeError when dcgmi is missing, times out, or prints no DCGM JSON.
    """
    level = _spec_level(spec)
    timeout_s = _spec_timeout(spec, level)
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        raise RuntimeError(f"dcgmi not found: {INSTALL_HINT}")
    argv = [dcgmi, "diag", "-r", str(level), "-j"]
    stdout_path = ctx.log_path("dcgmi-diag")
    stderr_path = ctx.log_path("dcgmi-diag-stderr")
    expected = LEVEL_EXPECTED_S[level]
    ctx.progress(0, expected, f"running dcgmi diag -r {level} (about {expected} s)")
    started = time.monotonic()
    with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        try:
            while True:
                elapsed = time.monotonic() - started
                remaining = timeout_s - elapsed
                if remaining <= 0:
                    raise subprocess.TimeoutExpired(argv, timeout_s)
                try:
                    process.wait(timeout=min(2.0, remaining))
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    ctx.progress(
                        min(elapsed, expected * 0.99), expected, f"dcgmi diag -r {level}: {elapsed:.0f} s elapsed"
                    )
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise RuntimeError(
                f"dcgmi diag -r {level} did not finish within {timeout_s:g} s and was stopped; raise timeout_s or "
                f"use a lower level (log: {stdout_path})"
            ) from None
        except BaseException:
            process.kill()
            process.wait()
            raise
    code = process.returncode
    with open(stdout_path, errors="replace") as handle:
        output = handle.read()
    if not output.strip():
        raise RuntimeError(f"dcgmi diag -r {level} exited {code} with no output; stderr: {_tail(stderr_path)!r}")
    try:
        report = parse_dcgm_diag(output)
    except InputError as exc:
        raise RuntimeError(
            f"dcgmi diag -r {level} exited {code} and its output is not DCGM JSON ({exc}); stderr: "
            f"{_tail(stderr_path)!r}"
        ) from exc
    ctx.progress(expected, expected, f"dcgmi diag -r {level}: {report.verdict}")
    result = report.model_dump(mode="json")
    result["run"] = {
        "level": level,
        "argv": argv,
        "exit_code": code,
        "seconds": round(time.monotonic() - started, 1),
        "log": "dcgmi-diag",
    }
    return result


def dcgm_report(report: DcgmDiagReport) -> CheckReport:
    """The diagnostic as findings for triage: one per GPU (its worst test, with the warnings of the tests it failed
    or warned on), and DCGM's runtime error about the node."""
    findings = []
    for summary in report.gpus:
        failed = ", ".join(summary.failed_tests)
        warned = ", ".join(summary.warned_tests)
        headline = f"failed {failed}" if failed else (f"warned on {warned}" if warned else None)
        texts = []
        for result in report.results:
            mine = result.entity_group.upper() == "GPU" and summary.gpu_id in result.entity_ids
            if mine and result.status in ("fail", "warn"):
                for warning in result.warnings:
                    name = f" [{warning.error_name}]" if warning.error_name else ""
                    texts.append(f"{result.test} {result.status}{name}: {warning.text}")
                if not result.warnings:
                    texts.append(f"{result.test} {result.status}")
        action: str | None
        if summary.status in ("fail", "warn"):
            severity: Severity = "critical" if summary.status == "fail" else "warning"
            what = f"dcgmi diag {summary.status}: " + ("; ".join(texts) if texts else headline or summary.status)
            action = (
                "Drain the GPU; act on the error ids above (DCGM's severity ISOLATE or RESET means take it out of "
                "service), then rerun dcgmi diag at the same level."
                if summary.status == "fail"
                else "Read the warnings before trusting the GPU; rerun dcgmi diag -r 3 when it is idle."
            )
        else:
            severity, action = "info", None
            tested = len(summary.skipped_tests)
            what = f"dcgmi diag {summary.status}" + (f" ({tested} test(s) skipped)" if tested else "")
        findings.append(
            Finding(
                check="dcgm",
                rule="dcgmi_diag",
                status=DCGM_STATUS[summary.status],
                severity=severity,
                what=what,
                action=action,
                gpu=GpuRef(serial=summary.serial, dcgm_gpu_id=summary.gpu_id, index_hint=True),
                headline=headline,
                detail={"failed_tests": summary.failed_tests, "warned_tests": summary.warned_tests},
            )
        )
    if report.runtime_error:
        findings.append(
            Finding(
                check="dcgm",
                rule="runtime_error",
                status=None,
                severity="warning",
                what=f"DCGM runtime error: {report.runtime_error}",
            )
        )
    warnings = []
    if report.gpus_omitted:
        warnings.append(f"the DCGM report lists {report.gpus_omitted} more GPU(s) than were read; they are left out")
    return CheckReport(
        check="dcgm",
        findings=findings,
        summary=f"DCGM {report.layout} {report.verdict}: {clip(report.summary, 200)}",
        warnings=warnings,
        lists_every_gpu=bool(report.gpus),
        missing_means="DCGM did not test {it} (it could not reach {it}, or the run excluded {it})",
        index_note="DCGM GPU ids were matched to nvidia-smi indexes (DCGM numbers GPUs in NVML order, nvidia-smi's), "
        "as no serials tie them: DCGM GPU(s) {ids}",
    )
