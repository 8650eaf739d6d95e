"""Build resources/xid-catalog.json from the side-by-side Xid table plus facts from the diagnostics reference.

Usage:
    python scripts/build_xid_catalog.py [CSV] [--out PATH] [--check]

CSV defaults to ../shared/samples/xid-catalog-compared.csv relative to the repository root; --out defaults to
resources/xid-catalog.json; --check compares instead of writing and exits 1 when the file is stale.

The CSV puts five readings of each Xid side by side: NVIDIA's catalog (immediate and investigatory action), gpud
(repair actions and event type), the Kubernetes device plugin (ignored or not), Meta GCM (non-critical or not) and
Azure NHC (critical or not). Each source's reading is turned into a level (info, warning, critical), then a
consensus is made with these rules, in order:

1. Explicit decisions, from the project's diagnostics reference: Xid 45 is info (preemptive cleanup that follows
   other errors; floods of thousands per job are normal); Xid 63 is warning (row-remap / page-retirement event:
   NVIDIA says ignore, gpud says fatal, Azure says critical, Meta says non-critical); Xid 144-150 are warning by
   default and decided per NVLink5 sub-unit from the log message (e.g. a LINK_DOWN event resets the GPU, a
   BER_EVENT is ignored but the cables are checked); Xid 154 is warning and its action is the recovery action
   named in the message; Xid 171/172 are critical (detail records of an uncorrectable Xid 48).
2. Otherwise NVIDIA's immediate action sets the level: IGNORE -> info; RESTART_APP, RESTART_VM, CHECK_UVM,
   UPDATE_SWFW -> warning (application or software level); RESET_GPU, RESTART_BM, CHECK_MECHANICALS -> critical;
   CONTACT_SUPPORT -> critical for codes current drivers emit, warning for codes NVIDIA lists as unused.
3. Critical drops to warning when the Kubernetes device plugin ignores the code or Meta GCM calls it non-critical
   (fleet operators survive single occurrences; e.g. 109).
4. Warning rises to critical when gpud calls the code fatal and Azure NHC counts it critical and neither the device
   plugin nor Meta GCM treat it as benign (e.g. 69).
5. Info rises to warning when gpud calls the code fatal or Azure NHC counts it critical (NVIDIA says ignore, but a
   fleet tool acts on it; e.g. 92).
6. Where NVIDIA names only a workflow or nothing, gpud's event type decides (Fatal -> critical, Warning -> warning,
   Info or IgnoreNoActionRequired -> info); Azure NHC counting the code raises warning to critical.

Disagreements are derived, never written: each source's reading is recorded (its own words, its action normalised
through VOCABULARY below, its level), and every difference is a disagreement, listed with every source's position:
- action: NVIDIA's immediate action and gpud's repair actions, normalised (e.g. RESET_GPU -> reset_gpu,
  RebootSystem -> reboot_node, so NVIDIA RESET_GPU against gpud RebootSystem+HardwareInspection is a disagreement);
  two sources disagree when their sets of normalised actions differ. A word the vocabulary lacks stops the build.
- severity: NVIDIA's level, gpud's level, and the list-based sources (the device plugin and Meta GCM: not critical;
  Azure NHC: critical) disagree when one level differs from another; "not critical" agrees with info and warning.
The derivation is servers.diagnostics.xid.find_disagreements, which the catalog loader re-runs on every entry. Reboot
and reset advice carries gpud's escalation rule: when the same Xid keeps asking for a reboot after 2 reboots, the
advice becomes hardware inspection.

The sentences (actions, likely causes, notes) are this project's own wording. tests/test_diag_xid.py checks that
the committed JSON equals what this script builds from the CSV, so the file cannot go stale.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: make the project's package importable
    sys.path.insert(0, str(REPO_ROOT))

from servers.diagnostics.xid import (  # noqa: E402
    ActionVocabulary,
    SourceReading,
    disagreement_summary,
    find_disagreements,
    gpud_actions,
    nvidia_actions,
)

DEFAULT_CSV = REPO_ROOT.parent / "shared" / "samples" / "xid-catalog-compared.csv"
DEFAULT_OUT = REPO_ROOT / "resources" / "xid-catalog.json"

EXPECTED_COLUMNS = (
    "xid",
    "mnemonic",
    "description",
    "nvidia_immediate",
    "nvidia_investigatory",
    "gpud_repair_actions",
    "gpud_event_type",
    "k8s_device_plugin_ignored",
    "meta_gcm_noncritical",
    "azure_nhc_critical",
)

ESCALATION = (
    "When the same Xid keeps asking for a reboot after 2 reboots of the node, stop rebooting and send the node for "
    "hardware inspection (gpud's escalation rule)."
)

CONSENSUS_RULES = [
    "1. Explicit decisions: Xid 45 info (cleanup after other errors, floods are normal); 63 warning (sources "
    "disagree); 144-150 warning by default, decided per NVLink5 sub-unit from the message; 154 warning, acting on "
    "the recovery action the message names; 171/172 critical (details of an uncorrectable Xid 48).",
    "2. Otherwise NVIDIA's immediate action sets the level: IGNORE -> info; RESTART_APP, RESTART_VM, CHECK_UVM, "
    "UPDATE_SWFW -> warning; RESET_GPU, RESTART_BM, CHECK_MECHANICALS -> critical; CONTACT_SUPPORT -> critical, "
    "or warning for codes NVIDIA lists as unused.",
    "3. Critical drops to warning when the Kubernetes device plugin ignores the code or Meta GCM calls it "
    "non-critical.",
    "4. Warning rises to critical when gpud calls it fatal and Azure NHC counts it critical and neither the device "
    "plugin nor Meta GCM treat it as benign.",
    "5. Info rises to warning when gpud calls it fatal or Azure NHC counts it critical.",
    "6. Where NVIDIA names only a workflow or nothing, gpud's event type decides (Fatal critical, Warning warning, "
    "Info or IgnoreNoActionRequired info), and Azure NHC counting it raises warning to critical.",
    "Disagreements are derived from the readings: any two sources whose normalised actions differ (see vocabulary), "
    "or whose severities differ, are a disagreement, listed with every source's position.",
]

DESCRIPTION = (
    "NVIDIA GPU Xid error codes with five sources side by side (NVIDIA's Xid catalog, gpud, the Kubernetes device "
    "plugin, Meta GCM, Azure NHC), a consensus severity (info, warning, critical) and one actionable sentence per "
    "code, every source's reading, every disagreement between sources (derived from the readings with the stated "
    "action vocabulary), likely causes and the NVML recovery-action codes. Consensus rules: "
    + " ".join(CONSENSUS_RULES)
    + " Escalation: "
    + ESCALATION
    + " Built by scripts/build_xid_catalog.py from xid-catalog-compared.csv; do not edit by hand."
)

SOURCES = [
    {
        "name": "nvidia",
        "what": "immediate and investigatory actions, mnemonic and description",
        "source": "NVIDIA Xid catalog, https://docs.nvidia.com/deploy/xid-errors/",
    },
    {
        "name": "gpud",
        "what": "repair actions and event type per Xid; escalation after repeated reboots",
        "source": "leptonai/gpud (Apache-2.0), components/accelerator/nvidia/xid",
    },
    {
        "name": "k8s_device_plugin",
        "what": "Xids that do not mark a device unhealthy: 13, 31, 43, 45, 68, 109",
        "source": "NVIDIA/k8s-device-plugin (Apache-2.0)",
    },
    {
        "name": "meta_gcm",
        "what": "Xids treated as non-critical: 13, 31, 43, 45, 63, 68, 92, 109",
        "source": "facebookresearch/gcm (MIT)",
    },
    {
        "name": "azure_nhc",
        "what": "Xids counted as critical within a 2-hour window: "
        "48 56 57 58 62 63 64 65 68 69 73 74 79 80 81 92 119 120",
        "source": "Azure/azurehpc-health-checks (MIT)",
    },
    {
        "name": "reference",
        "what": "Xid 63 disagreement, NVLink5 144-150 per-unit decisions, Xid 154 text, Xid 45 floods, NVML recovery "
        "actions 0-7",
        "source": "this catalog's own decisions (consensus rule 1): NVIDIA's Xid catalog (above) for 144-150 and "
        "154, the NVML API reference (https://docs.nvidia.com/deploy/nvml-api/, the GPU recovery-action field) for "
        "the recovery actions, the sources above side by side for 45 and 63",
    },
]

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values; Xid 154 names the new one.
RECOVERY_ACTIONS: dict[str, dict[str, str]] = {
    "0": {"name": "None", "severity": "info", "action": "No recovery is needed; the earlier request was cleared."},
    "1": {
        "name": "GPU Reset",
        "severity": "critical",
        "action": "Move the work off this GPU and reset it (nvidia-smi -r, or reboot the node when reset is refused).",
    },
    "2": {
        "name": "Node Reboot",
        "severity": "critical",
        "action": "Drain the node and reboot it; after 2 reboots with the same request, send it for hardware "
        "inspection.",
    },
    "3": {
        "name": "Drain P2P",
        "severity": "warning",
        "action": "Stop peer-to-peer (NVLink / PCIe P2P) traffic to this GPU: let running jobs finish, place no new "
        "multi-GPU work on it, then reset it.",
    },
    "4": {
        "name": "Drain and Reset",
        "severity": "critical",
        "action": "Drain the GPU (let running work finish, accept nothing new), then reset it.",
    },
    "5": {
        "name": "Recover IMEX domain",
        "severity": "warning",
        "action": "Recover the multi-node NVLink (IMEX) domain: restart the IMEX service on the domain's nodes once "
        "their jobs are drained.",
    },
    "6": {
        "name": "Bus Reset",
        "severity": "critical",
        "action": "Drain the node and reset the GPU's PCIe bus (or reboot the node).",
    },
    "7": {
        "name": "System Reboot",
        "severity": "critical",
        "action": "Drain the node and reboot the whole system; power-cycle it if a warm reboot does not clear it.",
    },
}

# The stated mapping that puts the sources' action words on one scale (the catalog's "vocabulary"). Two words map to
# the same action only when they ask the operator for the same thing; anything else stays apart, so a difference is
# listed rather than hidden.
VOCABULARY: dict[str, Any] = {
    "actions": {
        "none": "no action",
        "app_first": "treat it as an application error: restart or check the job, the GPU only if it follows the GPU",
        "check_uvm": "check UVM / CPU-GPU coherence",
        "update_sw": "update the driver and firmware",
        "reset_gpu": "reset the GPU",
        "restart_vm": "restart the VM",
        "reboot_node": "reboot the node",
        "hardware_inspection": "inspect the hardware",
        "contact_support": "contact NVIDIA support",
        "per_message": "follow NVIDIA's named workflow, which decides from the log message",
    },
    "nvidia": {
        "IGNORE": "none",
        "RESTART_APP": "app_first",
        "CHECK_UVM": "check_uvm",
        "UPDATE_SWFW": "update_sw",
        "RESET_GPU": "reset_gpu",
        "RESTART_VM": "restart_vm",
        "RESTART_BM": "reboot_node",
        "CHECK_MECHANICALS": "hardware_inspection",
        "CONTACT_SUPPORT": "contact_support",
    },
    "nvidia_prefixes": {"WORKFLOW_": "per_message", "XID_": "per_message"},
    "gpud": {
        "IgnoreNoActionRequired": "none",
        "CheckUserAppAndGPU": "app_first",
        "RebootSystem": "reboot_node",
        "HardwareInspection": "hardware_inspection",
    },
    "rules": [
        "NVIDIA's action is its immediate action (the investigatory one is a follow-up); gpud's is its set of repair "
        "actions ('+' joins them). Each is normalised with the tables here; two sources disagree on the action when "
        "their sets of normalised actions differ (e.g. NVIDIA RESET_GPU = {reset_gpu} against gpud "
        "RebootSystem+HardwareInspection = {reboot_node, hardware_inspection}).",
        "Kept apart on purpose: RESET_GPU (reset_gpu) is not RebootSystem (reboot_node); RESTART_VM (restart_vm) is "
        "not RebootSystem; a named NVIDIA workflow (per_message) equals no fixed action.",
        "Severity: NVIDIA's level comes from its immediate action (consensus rule 2), gpud's from its event type "
        "(Fatal critical, Warning warning, Info or IgnoreNoActionRequired info); the Kubernetes device plugin and "
        "Meta GCM read not_critical for the codes on their lists, Azure NHC critical for the codes on its list. Any "
        "two levels that differ disagree, except that not_critical agrees with info and warning.",
        "A list-based source says nothing about a code its list does not name; nothing is inferred from absence.",
    ],
}
ACTION_VOCABULARY = ActionVocabulary.model_validate(VOCABULARY)

NVIDIA_LEVEL = {
    "IGNORE": "info",
    "RESTART_APP": "warning",
    "RESTART_VM": "warning",
    "CHECK_UVM": "warning",
    "UPDATE_SWFW": "warning",
    "RESET_GPU": "critical",
    "RESTART_BM": "critical",
    "CHECK_MECHANICALS": "critical",
    "CONTACT_SUPPORT": "critical",
}

NVIDIA_ACTION = {
    "IGNORE": "No action on its own; watch how often it appears and act on any other Xid logged around it.",
    "RESTART_APP": "Restart the application (the job); if the same GPU logs it again under different jobs, drain "
    "it and run dcgmi diag -r 3.",
    "RESTART_VM": "Restart the VM; if it repeats, update the driver and firmware to matching versions and contact "
    "NVIDIA.",
    "CHECK_UVM": "Restart the application and check the host's UVM / CPU-GPU coherence logs; contact NVIDIA if it "
    "repeats.",
    "UPDATE_SWFW": "Update the GPU driver, vGPU software and firmware to matching versions, then retry.",
    "RESET_GPU": "Drain the GPU and reset it (nvidia-smi -r, or reboot the node); if it returns after 2 "
    "resets or reboots, send the node for hardware inspection.",
    "RESTART_BM": "Drain and reboot the node; if it returns after 2 reboots, send the node for hardware inspection.",
    "CHECK_MECHANICALS": "Drain the node and check the GPU's auxiliary power cables and seating, then reboot.",
    "CONTACT_SUPPORT": "Drain the node, collect nvidia-bug-report.sh and open a case with NVIDIA support.",
}

NVIDIA_WORDS = {
    "IGNORE": "ignore",
    "RESTART_APP": "restart the application",
    "RESTART_VM": "restart the VM",
    "CHECK_UVM": "check UVM",
    "UPDATE_SWFW": "update software/firmware",
    "RESET_GPU": "reset the GPU",
    "RESTART_BM": "reboot the node",
    "CHECK_MECHANICALS": "check power cabling",
    "CONTACT_SUPPORT": "contact support",
}

UNUSED_ACTION = (
    "Not emitted by current drivers: check the driver version, collect nvidia-bug-report.sh and contact NVIDIA support."
)

# Per-code decisions and wording. severity overrides the rules (rule 1); action and likely_causes replace the
# generated text; note is appended to the notes.
CODE_FACTS: dict[int, dict[str, str]] = {
    8: {
        "likely_causes": "A channel stopped making progress: a hung kernel, an application bug or an earlier "
        "hardware error."
    },
    11: {"likely_causes": "A corrupted or invalid command stream from the application or driver."},
    13: {
        "action": "Treat it as an application error: restart the job and check it for bad memory accesses "
        "(compute-sanitizer); if the same GPU logs it under different jobs, drain it and run dcgmi diag -r 3.",
        "likely_causes": "Most often an application bug (out-of-bounds access, illegal instruction); a driver bug "
        "or a faulty GPU when it follows the GPU rather than the job.",
    },
    25: {"likely_causes": "A corrupted or illegal command stream from the application or driver."},
    31: {
        "action": "Treat it as an application error: restart the job and look for invalid GPU pointers or "
        "use-after-free; if the same GPU logs it under different jobs, drain it and run dcgmi diag -r 3.",
        "likely_causes": "The application touched an unmapped or protected GPU address (bug, freed buffer, bad "
        "pointer); occasionally driver or UVM trouble; hardware only when it follows one GPU.",
    },
    32: {"likely_causes": "A corrupted push buffer: driver bug, corrupted host memory or a PCIe problem."},
    38: {"likely_causes": "A watchdog in the driver's firmware fired: firmware or driver bug, sometimes hardware."},
    43: {
        "likely_causes": "The GPU stopped a channel after the application faulted; it usually follows an "
        "application error such as Xid 13 or 31.",
    },
    44: {"likely_causes": "A fault while the graphics engine switched contexts: driver bug or hardware."},
    45: {
        "severity": "info",
        "action": "Do not act on Xid 45 itself: find the Xid logged just before it (often 48, 63, 79, 94 or 95) and "
        "act on that; only a 45 with no other Xid (on NVSwitch systems) calls for restarting the fabric manager.",
        "likely_causes": "Preemptive cleanup: the driver tears down channels after another error (a double-bit ECC "
        "error, a fallen GPU, a killed process); one failing job can log thousands of these, and such floods "
        "are normal.",
        "note": "Floods: count 45s per incident, not per line, or they drown every other signal.",
    },
    46: {"likely_causes": "The GPU stopped processing and timed out: hung engine, firmware or hardware fault."},
    48: {
        "action": "Drain the node and reset the GPU so the failing memory is retired or remapped, then check "
        "nvidia-smi -q Remapped Rows; if the remap failed (Xid 64) or the error returns after 2 resets, send "
        "the GPU for hardware inspection.",
        "likely_causes": "An uncorrectable double-bit ECC error in GPU memory (HBM/DRAM or on-chip SRAM); the "
        "running application's data is lost.",
    },
    54: {"likely_causes": "The board's auxiliary power connector is missing or loose."},
    61: {"likely_causes": "An internal micro-controller hit a breakpoint: firmware fault."},
    62: {"likely_causes": "An internal micro-controller (PMU) halted: firmware fault or failing hardware."},
    63: {
        "severity": "warning",
        "action": "Running jobs may continue; reset the GPU at the next drain so the pending remap takes effect, "
        "and check nvidia-smi -q Remapped Rows: a remap failure (Xid 64), remaps that stay pending or a rising "
        "count mean RMA.",
        "likely_causes": "The driver remapped a memory row (Ampere and later) or retired a page (earlier GPUs) "
        "after ECC errors; the fault was handled and the repair applies after a GPU reset.",
        "note": "The remap needs a GPU reset to take effect; until then the row stays pending.",
    },
    64: {
        "likely_causes": "A row remap or page retirement failed: no spare rows left or the InfoROM write failed; "
        "the memory has a fault that cannot be repaired in the field.",
    },
    68: {
        "likely_causes": "The video decoder (NVDEC0) raised an exception: application or driver bug, rarely "
        "hardware; seldom relevant for training jobs."
    },
    69: {"likely_causes": "The graphics engine rejected a class or method: application or driver bug, or hardware."},
    74: {
        "action": "Drain the node, read nvidia-smi nvlink -e (error counters) and the fabric manager log, reset the "
        "GPU (or reboot); if the same link errs again after 2 resets, inspect the NVLink / NVSwitch hardware.",
        "likely_causes": "An NVLink error: link training, CRC or replay trouble from a cable, connector, NVSwitch "
        "tray or the GPU's own NVLink.",
    },
    79: {
        "action": "Drain and reboot the node (the GPU is gone until then); if it falls off again after 2 reboots, "
        "send the node for hardware inspection (power, PCIe riser/slot, board).",
        "likely_causes": "The GPU dropped off the PCIe bus: power delivery, overheating, a PCIe link/riser/board "
        "problem or a failing GPU.",
    },
    80: {
        "likely_causes": "Data reached the GPU corrupted (push-buffer CRC mismatch): PCIe link or host memory "
        "corruption."
    },
    92: {
        "likely_causes": "A high rate of corrected single-bit ECC errors: the memory is degrading and row remaps "
        "usually follow.",
    },
    93: {"likely_causes": "The InfoROM passed its provisioned write-wear limit; it still works."},
    94: {
        "likely_causes": "An uncorrectable memory error that the driver contained: only the affected application "
        "was stopped; other work on the GPU continues.",
    },
    95: {
        "likely_causes": "An uncorrectable memory error that could not be contained: every application on the GPU "
        "is affected.",
    },
    109: {
        "likely_causes": "A context-switch timeout: a hung or extremely long kernel, or a GPU / driver fault.",
    },
    110: {"likely_causes": "A security fault on the GPU: firmware or driver problem, rarely hardware."},
    119: {
        "likely_causes": "The GPU System Processor (GSP) firmware did not answer a driver call in time: GSP hang, "
        "driver/firmware bug or hardware fault; GSP is among the most failure-prone components on H100 fleets.",
    },
    120: {"likely_causes": "The GSP firmware reported an error: firmware or driver bug, or hardware fault."},
    121: {"likely_causes": "A chip-to-chip (C2C, Grace-Hopper) link error."},
    136: {"likely_causes": "NVLink link training failed: cable, tray, connector or signal-integrity problem."},
    137: {"likely_causes": "An NVLink privilege violation, usually from an application's access pattern."},
    140: {"likely_causes": "An uncorrectable ECC error escaped containment: the memory is faulty."},
    143: {"likely_causes": "The GPU failed to initialise: firmware, power or hardware fault."},
    154: {
        "severity": "warning",
        "action": "Read the message: it names the new recovery action (None, GPU Reset, Node Reboot, Drain P2P, "
        "Drain and Reset, ...); do that, and act on the Xid that triggered the change.",
        "likely_causes": "Informational: the driver changed the GPU's required recovery action because of another Xid.",
        "note": "Log form: 'GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)'.",
    },
    155: {"likely_causes": "An NVLink error defined by software (driver-side link state checks)."},
    156: {
        "likely_causes": "The driver retired a faulty resource (e.g. memory); a GPU reset applies the retirement.",
    },
    157: {"likely_causes": "A resource retirement could not be completed."},
    158: {"likely_causes": "A fatal GPU timeout: hung engine, firmware or hardware fault."},
    159: {
        "likely_causes": "A coherent-interconnect (CHI) non-data error, often a sympathetic report of another fault."
    },
    162: {"likely_causes": "The power-smoothing hardware came back into service."},
    163: {"likely_causes": "The power-smoothing hardware was disengaged."},
    164: {"likely_causes": "The power-smoothing hardware is near the end of its rated lifetime."},
    165: {"likely_causes": "The power-smoothing hardware's rated lifetime is exhausted."},
    166: {"likely_causes": "Confidential-computing traffic arrived on an NVLink before encryption was configured."},
    167: {"likely_causes": "A fatal PCIe timeout between the host and the GPU."},
    168: {"likely_causes": "Errors in the write-protected region: the GPU runs with reduced memory capacity."},
    169: {"likely_causes": "The SEC2 security micro-controller halted: firmware or hardware fault."},
    170: {"likely_causes": "An unexpected interrupt while in confidential-computing mode."},
    171: {
        "severity": "critical",
        "action": "Handle it as Xid 48 (it details one): drain the node and reset the GPU, then check Remapped "
        "Rows; hardware inspection if it returns after 2 resets.",
        "likely_causes": "Detail record of an uncorrectable DRAM (HBM) error reported with Xid 48.",
    },
    172: {
        "severity": "critical",
        "action": "Handle it as Xid 48 (it details one): drain the node and reset the GPU; SRAM errors that "
        "return after 2 resets mean hardware inspection.",
        "likely_causes": "Detail record of an uncorrectable on-chip SRAM error reported with Xid 48.",
    },
}

NVLINK5_UNITS = {144: "SAW", 145: "RLW", 146: "TLW", 147: "TREX", 148: "NVLPW_CTRL", 149: "NETIR", 150: "MSE"}
for _code, _unit in NVLINK5_UNITS.items():
    CODE_FACTS[_code] = {
        "severity": "warning",
        "action": "Decide from the message: a link-down event (e.g. NETIR_LINK_DOWN) means drain and reset the GPU; "
        "a bit-error-rate event (e.g. NETIR_BER_EVENT) needs no reset but the NVLink cables/trays should be "
        "checked if it repeats; otherwise follow NVIDIA's NVLink5 workflow for the sub-unit.",
        "likely_causes": f"An error in the NVLink5 (Blackwell) {_unit} sub-unit; its weight depends on the event "
        "name, the intrinfo subcode (bits 20-25) and the error status, from benign bit-error-rate events to a "
        "link going down.",
        "note": "Log form: '<code>, <UNIT>_<EVENT> Fatal|Nonfatal XC0 i0 Link NN (0xINTRINFO 0xERRSTATUS ...)'.",
    }


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _opt(text: str) -> str | None:
    value = text.strip()
    return value or None


def nvidia_level(immediate: str | None, unused: bool) -> str | None:
    if immediate is None:
        return None
    if immediate == "CONTACT_SUPPORT" and unused:
        return "warning"
    return NVIDIA_LEVEL.get(immediate)


def gpud_level(repair_actions: str | None, event_type: str | None) -> str | None:
    if event_type == "Fatal":
        return "critical"
    if repair_actions and "IgnoreNoActionRequired" in repair_actions:
        return "info"
    return {"Warning": "warning", "Info": "info"}.get(event_type or "")


def readings(row: dict[str, Any], unused: bool) -> dict[str, str]:
    """Each source's own level for this code (sources with no opinion are left out)."""
    out: dict[str, str] = {}
    level = nvidia_level(row["nvidia_immediate"], unused)
    if level:
        out["nvidia"] = level
    level = gpud_level(row["gpud_repair_actions"], row["gpud_event_type"])
    if level:
        out["gpud"] = level
    if row["k8s_device_plugin_ignored"]:
        out["k8s_device_plugin"] = "info"
    if row["meta_gcm_noncritical"]:
        out["meta_gcm"] = "info"
    if row["azure_nhc_critical"]:
        out["azure_nhc"] = "critical"
    return out


def consensus_severity(code: int, row: dict[str, Any], unused: bool) -> tuple[str, str]:
    """(severity, which rule decided it)."""
    if "severity" in CODE_FACTS.get(code, {}):
        return CODE_FACTS[code]["severity"], "explicit"
    benign = row["k8s_device_plugin_ignored"] or row["meta_gcm_noncritical"]
    gpud = gpud_level(row["gpud_repair_actions"], row["gpud_event_type"])
    azure = row["azure_nhc_critical"]
    level = nvidia_level(row["nvidia_immediate"], unused)
    if level is not None:
        if level == "critical" and benign:
            return "warning", "downgraded"
        if level == "warning" and gpud == "critical" and azure and not benign:
            return "critical", "upgraded"
        if level == "info" and (gpud == "critical" or azure):
            return "warning", "raised"
        return level, "nvidia"
    level = gpud or "info"
    if level == "warning" and azure:
        level = "critical"
    return level, "gpud"


def _subject(names: list[str]) -> str:
    """'gpud treats' or 'gpud and Azure NHC treat'."""
    if not names:
        return "fleet tools treat"
    return " and ".join(names) + (" treats" if len(names) == 1 else " treat")


def _who_critical(reading: dict[str, str]) -> str:
    names = {"gpud": "gpud", "azure_nhc": "Azure NHC"}
    return _subject([names[s] for s in ("gpud", "azure_nhc") if reading.get(s) == "critical"])


def _who_benign(row: dict[str, Any]) -> str:
    who = []
    if row["k8s_device_plugin_ignored"]:
        who.append("the Kubernetes device plugin")
    if row["meta_gcm_noncritical"]:
        who.append("Meta GCM")
    return _subject(who)


def consensus_action(code: int, row: dict[str, Any], severity: str, rule: str, unused: bool) -> str:
    facts = CODE_FACTS.get(code, {})
    if "action" in facts:
        return facts["action"]
    if unused:
        if severity == "critical":
            return (
                "Drain the node; this code is not emitted by current drivers, so collect nvidia-bug-report.sh and "
                "contact NVIDIA support."
            )
        return UNUSED_ACTION
    immediate = row["nvidia_immediate"]
    reading = readings(row, unused)
    if rule == "downgraded":
        return (
            f"Restart the job first, and drain and reset the GPU (NVIDIA's advice) if it repeats on the same GPU, "
            f"since {_who_benign(row)} a single occurrence as survivable."
        )
    if rule == "upgraded":
        return (
            f"Restart the job and drain the node for a reboot and dcgmi diag -r 3, since {_who_critical(reading)} "
            "it as a hardware fault; if it returns after 2 reboots, send the node for hardware inspection."
        )
    if rule == "raised":
        return (
            "No immediate action for running jobs, but count it: if it repeats, drain the node for a GPU reset and "
            f"dcgmi diag -r 3, since {_who_critical(reading)} it as a failure."
        )
    if rule == "nvidia" and immediate in NVIDIA_ACTION:
        return NVIDIA_ACTION[immediate]
    repair = row["gpud_repair_actions"] or ""
    if severity == "critical":
        return "Drain the node and reboot it; if the same Xid returns after 2 reboots, send it for hardware inspection."
    if severity == "warning":
        if "RebootSystem" in repair:
            return (
                "Reboot the node at the next drain window; if it returns after 2 reboots, send it for hardware "
                "inspection."
            )
        return "Watch for repeats and for other Xids around it; collect nvidia-bug-report.sh if it keeps coming back."
    return "No action needed; it is informational."


def source_readings(row: dict[str, Any], unused: bool) -> list[SourceReading]:
    """Every source's reading of this code: its own words, its action normalised through VOCABULARY, its level."""
    out: list[dict[str, Any]] = []
    immediate = row["nvidia_immediate"]
    level = nvidia_level(immediate, unused)
    if immediate is not None:
        out.append(
            {
                "source": "nvidia",
                "action_words": immediate,
                "actions": nvidia_actions(immediate, ACTION_VOCABULARY),
                "severity_words": None if level is None else f"{immediate} on an unused code" if unused else immediate,
                "severity": level,
            }
        )
    repair, event = row["gpud_repair_actions"], row["gpud_event_type"]
    level = gpud_level(repair, event)
    if repair is not None or level is not None:
        words = event
        if level == "info" and event != "Info" and repair and "IgnoreNoActionRequired" in repair:
            words = f"{event} with IgnoreNoActionRequired" if event else "IgnoreNoActionRequired"
        out.append(
            {
                "source": "gpud",
                "action_words": repair,
                "actions": gpud_actions(repair, ACTION_VOCABULARY),
                "severity_words": words if level is not None else None,
                "severity": level,
            }
        )
    for source, listed, words, level in (
        ("k8s_device_plugin", row["k8s_device_plugin_ignored"], "ignore list", "not_critical"),
        ("meta_gcm", row["meta_gcm_noncritical"], "non-critical list", "not_critical"),
        ("azure_nhc", row["azure_nhc_critical"], "critical list", "critical"),
    ):
        if listed:
            out.append(
                {"source": source, "action_words": None, "actions": None, "severity_words": words, "severity": level}
            )
    return [SourceReading.model_validate(reading) for reading in out]


def likely_causes(code: int, row: dict[str, Any], unused: bool) -> str:
    facts = CODE_FACTS.get(code, {})
    if "likely_causes" in facts:
        return facts["likely_causes"]
    mnemonic = row["mnemonic"]
    if unused:
        return "Not emitted by current drivers (a legacy code); seeing it points to an old driver or something unusual."
    if re.search(r"_CE\d+_", mnemonic):
        return "A copy-engine fault: usually an application error or the echo of an earlier memory or PCIe error."
    if re.search(r"NVDEC|NVJPG|NVENC|OFA", mnemonic):
        return (
            "A video decode/encode, JPEG or optical-flow engine fault: application or driver bug; seldom relevant "
            "for training jobs."
        )
    if "RETIREMENT" in mnemonic:
        return "A resource or channel retirement by the driver after an error."
    return f"See NVIDIA's Xid catalog entry for {mnemonic}."


def notes(code: int, row: dict[str, Any], severity: str) -> str:
    parts = []
    if row["nvidia_investigatory"]:
        parts.append(f"NVIDIA's investigatory step: {row['nvidia_investigatory']}.")
    if row["gpud_repair_actions"]:
        parts.append(f"gpud repair actions: {row['gpud_repair_actions']}.")
    if "note" in CODE_FACTS.get(code, {}):
        parts.append(CODE_FACTS[code]["note"])
    if severity == "critical" or "RebootSystem" in (row["gpud_repair_actions"] or ""):
        parts.append("Escalation: after 2 reboots with the same Xid, send the node for hardware inspection.")
    return " ".join(parts)


def read_rows(csv_path: Path) -> list[dict[str, Any]]:
    with csv_path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in EXPECTED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{csv_path}: missing columns {missing}")
        rows = []
        for raw in reader:
            rows.append(
                {
                    "xid": int(raw["xid"]),
                    "mnemonic": raw["mnemonic"].strip(),
                    "description": raw["description"].strip(),
                    "nvidia_immediate": _opt(raw["nvidia_immediate"]),
                    "nvidia_investigatory": _opt(raw["nvidia_investigatory"]),
                    "gpud_repair_actions": _opt(raw["gpud_repair_actions"]),
                    "gpud_event_type": _opt(raw["gpud_event_type"]),
                    "k8s_device_plugin_ignored": _bool(raw["k8s_device_plugin_ignored"]),
                    "meta_gcm_noncritical": _bool(raw["meta_gcm_noncritical"]),
                    "azure_nhc_critical": _bool(raw["azure_nhc_critical"]),
                }
            )
    codes = [r["xid"] for r in rows]
    if len(codes) != len(set(codes)):
        raise ValueError(f"{csv_path}: an Xid appears twice")
    return sorted(rows, key=lambda r: r["xid"])


def build_entry(row: dict[str, Any]) -> dict[str, Any]:
    code = row["xid"]
    unused = row["description"].lower() == "unused"
    severity, rule = consensus_severity(code, row, unused)
    reading = source_readings(row, unused)
    disagreements = find_disagreements(reading, ACTION_VOCABULARY)
    return {
        "code": code,
        "mnemonic": row["mnemonic"],
        "description": row["description"],
        "nvidia": {"immediate": row["nvidia_immediate"], "investigatory": row["nvidia_investigatory"]},
        "gpud": {"repair_actions": row["gpud_repair_actions"], "event_type": row["gpud_event_type"]},
        "k8s_device_plugin": {"ignored": row["k8s_device_plugin_ignored"]},
        "meta_gcm": {"noncritical": row["meta_gcm_noncritical"]},
        "azure_nhc": {"critical": row["azure_nhc_critical"]},
        "consensus": {"severity": severity, "action": consensus_action(code, row, severity, rule, unused)},
        "readings": [r.model_dump(mode="json") for r in reading],
        "disagreements": [d.model_dump(mode="json") for d in disagreements],
        "disagreement": disagreement_summary(disagreements),
        "likely_causes": likely_causes(code, row, unused),
        "notes": notes(code, row, severity),
    }


def build_catalog(csv_path: Path = DEFAULT_CSV) -> dict[str, Any]:
    """The whole xid-catalog.json document, built from the CSV."""
    rows = read_rows(Path(csv_path))
    return {
        "description": DESCRIPTION,
        "consensus_rules": CONSENSUS_RULES,
        "escalation": ESCALATION,
        "sources": SOURCES,
        "vocabulary": VOCABULARY,
        "recovery_actions": RECOVERY_ACTIONS,
        "xids": [build_entry(row) for row in rows],
    }


def render(catalog: dict[str, Any]) -> str:
    return json.dumps(catalog, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", type=Path, default=DEFAULT_CSV, help="xid-catalog-compared.csv")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing")
    args = parser.parse_args(argv)
    text = render(build_catalog(args.csv))
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run scripts/build_xid_catalog.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(json.loads(text)['xids'])} Xids)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
