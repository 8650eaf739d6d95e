"""A kernel-log scan as findings for triage (servers.diagnostics.findings): one per GPU and code row, about the GPU
at its PCI address, or about the node for NVSwitch SXids and NCCL crashes (an SXid's address is the NVSwitch's, a
crash names no GPU); the identity lines only say which GPUs the log saw."""

from servers.diagnostics.bounds import MAX_LINE_TEXT, clip_str
from servers.diagnostics.findings import CheckReport, Finding, GpuRef, Severity, normalise_bus_id, severity_status
from servers.diagnostics.kmsg.models import KernelLogScan

_LABELS = {
    "xid": "Xid {code}",
    "sxid": "NVSwitch SXid {code}",
    "nccl_segfault": "NCCL segfault",
    "fallen_off_bus": "fallen off the bus",
    "recovery_action": "recovery action changed",
}


def kernel_severity(severity: str) -> Severity:
    """The one Severity for a classifier's word (the scanner keeps the classifier's own words)."""
    key = severity.strip().lower()
    if key in ("critical", "fatal"):
        return "critical"
    if key in ("info", "informational", "ignore", "none"):
        return "info"
    return "warning"  # warning, error, non-critical, and unknown codes: worth a look, not a verdict of failure


def kernel_log_report(scan: KernelLogScan) -> CheckReport:
    """The scan's summary rows as findings; silence about a GPU is no verdict (a log is seen, not judged)."""
    seen = []
    for identity in scan.gpus:
        bus = normalise_bus_id(identity.pci_bus_id)
        if bus is not None:  # logged at driver load: seen, but silence is no verdict
            seen.append(GpuRef(bus_id=bus, uuid=identity.uuid, serial=identity.serial))
    findings = []
    gpu_rows = 0
    for row in scan.summary:
        severity = kernel_severity(row.severity)
        label = _LABELS[row.kind].format(code=row.code)
        when = (
            f", {row.first_time or row.first_uptime_s} .. {row.last_time or row.last_uptime_s}" if row.count > 1 else ""
        )
        boots = f", {row.boots} boots" if row.boots > 1 else ""
        flags = (", a flood" if row.flood else "") + (
            ", rate-limited by the driver (a lower bound)" if row.rate_limited else ""
        )
        what = clip_str(
            f"{label}: {row.count} line(s){when} (first at line {row.first_line}{boots}){flags}: {row.example}",
            MAX_LINE_TEXT,
        )
        action = row.action + (f" ({row.escalation})" if row.escalation else "")
        bus = normalise_bus_id(row.pci_bus_id)
        about_node = row.kind in ("sxid", "nccl_segfault") or bus is None
        gpu_rows += not about_node
        findings.append(
            Finding(
                check="kernel_log",
                rule=f"{row.kind}_{row.code}" if row.code is not None else row.kind,
                status=None if about_node else severity_status(severity),
                severity=severity,
                what=what,
                action=action,
                gpu=None if about_node else GpuRef(bus_id=bus, uuid=row.uuid),
                headline=f"{label} ({row.severity})",
                detail={"count": row.count, "boots": row.boots, "flood": row.flood},
            )
        )
    warnings = []
    if scan.summary_omitted:
        warnings.append(
            f"the kernel log has {scan.summary_rows} GPU/code rows; the {scan.summary_omitted} least severe were not "
            "listed by the scanner and are not in this triage"
        )
    return CheckReport(
        check="kernel_log",
        findings=findings,
        summary=f"{scan.lines_read} line(s), {scan.summary_rows} GPU/code row(s) ({gpu_rows} about a GPU), "
        f"{len(scan.gpus)} GPU identity line(s), {scan.boots} boot(s)",
        seen=seen,
        warnings=warnings,
    )
