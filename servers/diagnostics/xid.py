"""Xid error codes: the catalog (resources/xid-catalog.json), one code explained, and the severity and action the
kernel-log scanner attaches to each finding. Plain module (no MCP imports).

The catalog is built by scripts/build_xid_catalog.py from five sources side by side (NVIDIA, gpud, the Kubernetes
device plugin, Meta GCM, Azure NHC); its "description" states the consensus rules. `explain_xid` answers for any
code 1-999 (an uncatalogued code comes back with known=False); `classify` maps a scanner finding (an Xid, an
NVSwitch SXid, an NCCL crash, a GPU fallen off the bus, an NVML recovery action) to (severity, action), reading the
log message where the catalog says the answer depends on it (Xid 144-150 NVLink5 sub-units, Xid 154).

Disagreements are not written by hand: each entry carries every source's reading (its own words, its action
normalised through the catalog's stated `vocabulary`, its severity), and `find_disagreements` derives the
disagreements from the readings: any two sources whose normalised actions differ, or whose severities differ, are a
disagreement, listed with every source's position. The catalog refuses to load when an entry's readings do not
follow the vocabulary or its listed disagreements are not exactly the derived ones, so a disagreement cannot be
hidden (e.g. Xid 119: NVIDIA RESET_GPU against gpud RebootSystem+HardwareInspection).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from servers.core.errors import InputError
from servers.core.models import Model
from servers.core.paths import resources_dir
from servers.diagnostics.findings import Severity

CATALOG_FILE = "xid-catalog.json"
NVIDIA_XID_DOCS = "https://docs.nvidia.com/deploy/xid-errors/"

FindingSeverity = Literal["info", "warning", "critical", "unknown"]  # published: Severity, or unknown (uncatalogued)


class _Frozen(Model):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NvidiaAdvice(_Frozen):
    immediate: str | None = Field(description="NVIDIA's immediate action, e.g. RESET_GPU, RESTART_APP, IGNORE")
    investigatory: str | None = Field(description="NVIDIA's investigatory action or workflow")


class GpudAdvice(_Frozen):
    repair_actions: str | None = Field(description="gpud's repair actions, e.g. RebootSystem+HardwareInspection")
    event_type: str | None = Field(description="gpud's event type: Fatal, Warning or Info")


class K8sDevicePluginView(_Frozen):
    ignored: bool = Field(description="True when the Kubernetes device plugin does not mark the GPU unhealthy")


class MetaGcmView(_Frozen):
    noncritical: bool = Field(description="True when Meta GCM treats the code as non-critical")


class AzureNhcView(_Frozen):
    critical: bool = Field(description="True when Azure NHC counts the code as critical")


class Consensus(_Frozen):
    severity: Severity
    action: str = Field(description="one sentence an operator can act on")


SourceName = Literal["nvidia", "gpud", "k8s_device_plugin", "meta_gcm", "azure_nhc"]
# A list-based source (device plugin, Meta GCM, Azure NHC) only says "not critical" or "critical" for the codes on its
# list; "not_critical" agrees with info and warning and disagrees with critical.
ReadingSeverity = Literal["info", "warning", "critical", "not_critical"]
SOURCE_LABELS: dict[str, str] = {
    "nvidia": "NVIDIA",
    "gpud": "gpud",
    "k8s_device_plugin": "the Kubernetes device plugin",
    "meta_gcm": "Meta GCM",
    "azure_nhc": "Azure NHC",
}
_SOURCE_ORDER = tuple(SOURCE_LABELS)


class ActionVocabulary(_Frozen):
    """The stated mapping that puts the sources' action words on one scale before they are compared."""

    actions: dict[str, str] = Field(description="normalised action -> what it means")
    nvidia: dict[str, str] = Field(description="NVIDIA immediate action -> normalised action")
    nvidia_prefixes: dict[str, str] = Field(description="NVIDIA word prefix (named workflows) -> normalised action")
    gpud: dict[str, str] = Field(description="gpud repair action -> normalised action; '+' joins several")
    rules: tuple[str, ...] = Field(description="how readings are compared, in words")

    @model_validator(mode="after")
    def _targets_are_actions(self) -> ActionVocabulary:
        for table in (self.nvidia, self.nvidia_prefixes, self.gpud):
            unknown = sorted(set(table.values()) - set(self.actions))
            if unknown:
                raise ValueError(f"the vocabulary maps onto actions it does not define: {unknown}")
        return self


def nvidia_actions(word: str | None, vocabulary: ActionVocabulary) -> tuple[str, ...] | None:
    """NVIDIA's immediate action, normalised; None when NVIDIA names none. A word the vocabulary lacks is an error."""
    if word is None:
        return None
    if word in vocabulary.nvidia:
        return (vocabulary.nvidia[word],)
    for prefix, action in vocabulary.nvidia_prefixes.items():
        if word.startswith(prefix):
            return (action,)
    raise ValueError(f"NVIDIA action {word!r} is not in the action vocabulary")


def gpud_actions(words: str | None, vocabulary: ActionVocabulary) -> tuple[str, ...] | None:
    """gpud's repair actions ('A+B'), normalised, in gpud's order; None when gpud names none."""
    if words is None:
        return None
    out: list[str] = []
    for word in words.split("+"):
        word = word.strip()
        if word not in vocabulary.gpud:
            raise ValueError(f"gpud repair action {word!r} is not in the action vocabulary")
        if vocabulary.gpud[word] not in out:
            out.append(vocabulary.gpud[word])
    return tuple(out)


class SourceReading(_Frozen):
    """What one source says about one code, in its own words and normalised."""

    source: SourceName
    action_words: str | None = Field(description="the source's own action words, e.g. RESET_GPU")
    actions: tuple[str, ...] | None = Field(description="the action words normalised through the vocabulary")
    severity_words: str | None = Field(description="what the source's severity comes from, e.g. Fatal, ignored")
    severity: ReadingSeverity | None


class Position(_Frozen):
    source: SourceName
    says: str = Field(description="the source's own words")
    reading: str = Field(description="normalised: actions joined by '+', or a severity")


class Disagreement(_Frozen):
    about: Literal["action", "severity"]
    positions: tuple[Position, ...] = Field(description="every source with a reading on this, in catalog order")
    text: str


def _severities_agree(a: str, b: str) -> bool:
    if a == b:
        return True
    return "not_critical" in (a, b) and "critical" not in (a, b)


def _position_text(position: Position, about: str, vocabulary: ActionVocabulary) -> str:
    label = SOURCE_LABELS[position.source]
    if about == "action":
        meaning = "; ".join(vocabulary.actions[a] for a in position.reading.split("+"))
        return f"{label} {position.says} ({meaning})"
    return f"{label} {position.says} ({position.reading.replace('_', ' ')})"


def find_disagreements(
    readings: tuple[SourceReading, ...] | list[SourceReading], vocabulary: ActionVocabulary
) -> tuple[Disagreement, ...]:
    """Every disagreement the readings hold: normalised actions that differ, severities that do not agree."""
    ordered = sorted(readings, key=lambda r: _SOURCE_ORDER.index(r.source))
    out: list[Disagreement] = []
    acting = [r for r in ordered if r.actions is not None]
    if len({frozenset(r.actions or ()) for r in acting}) > 1:  # the same actions in another order agree
        positions = tuple(
            Position(source=r.source, says=r.action_words or "", reading="+".join(r.actions or ())) for r in acting
        )
        out.append(
            Disagreement(
                about="action",
                positions=positions,
                text="Action: " + " vs ".join(_position_text(p, "action", vocabulary) for p in positions) + ".",
            )
        )
    rated = [r for r in ordered if r.severity is not None]
    if any(not _severities_agree(a.severity or "", b.severity or "") for a in rated for b in rated):
        positions = tuple(
            Position(source=r.source, says=r.severity_words or "", reading=r.severity or "") for r in rated
        )
        out.append(
            Disagreement(
                about="severity",
                positions=positions,
                text="Severity: " + " vs ".join(_position_text(p, "severity", vocabulary) for p in positions) + ".",
            )
        )
    return tuple(out)


def disagreement_summary(disagreements: tuple[Disagreement, ...] | list[Disagreement]) -> str | None:
    """The one-paragraph text of every disagreement, or None when the sources agree."""
    return " ".join(d.text for d in disagreements) or None


class XidEntry(_Frozen):
    code: int
    mnemonic: str
    description: str
    nvidia: NvidiaAdvice
    gpud: GpudAdvice
    k8s_device_plugin: K8sDevicePluginView
    meta_gcm: MetaGcmView
    azure_nhc: AzureNhcView
    consensus: Consensus
    readings: tuple[SourceReading, ...] = Field(description="every source that says something about the code")
    disagreements: tuple[Disagreement, ...] = Field(description="every pair of readings that differ, by topic")
    disagreement: str | None = Field(description="the disagreements in one text; None only when there are none")
    likely_causes: str
    notes: str


class CatalogSource(_Frozen):
    name: str
    what: str
    source: str


class RecoveryAction(_Frozen):
    name: str
    severity: Severity
    action: str


class XidCatalog(_Frozen):
    description: str
    consensus_rules: tuple[str, ...]
    escalation: str
    sources: tuple[CatalogSource, ...]
    vocabulary: ActionVocabulary
    recovery_actions: dict[str, RecoveryAction]
    xids: tuple[XidEntry, ...]

    @model_validator(mode="after")
    def _disagreements_follow_from_the_readings(self) -> XidCatalog:
        """Refuse a catalog whose readings misstate a source or whose disagreements are not the derived ones."""
        for entry in self.xids:
            problems = _entry_problems(entry, self.vocabulary)
            if problems:
                raise ValueError(f"Xid {entry.code}: " + "; ".join(problems))
        return self


def _entry_problems(entry: XidEntry, vocabulary: ActionVocabulary) -> list[str]:
    problems = []
    by_source = {r.source: r for r in entry.readings}
    if len(by_source) != len(entry.readings):
        problems.append("a source has two readings")
    nvidia = by_source.get("nvidia")
    expected = nvidia_actions(entry.nvidia.immediate, vocabulary)
    if (nvidia.actions if nvidia else None) != expected or (nvidia and nvidia.action_words != entry.nvidia.immediate):
        problems.append(f"NVIDIA's reading does not normalise {entry.nvidia.immediate!r} to {expected}")
    gpud = by_source.get("gpud")
    expected = gpud_actions(entry.gpud.repair_actions, vocabulary)
    if (gpud.actions if gpud else None) != expected or (gpud and gpud.action_words != entry.gpud.repair_actions):
        problems.append(f"gpud's reading does not normalise {entry.gpud.repair_actions!r} to {expected}")
    for source, listed, level in (
        ("k8s_device_plugin", entry.k8s_device_plugin.ignored, "not_critical"),
        ("meta_gcm", entry.meta_gcm.noncritical, "not_critical"),
        ("azure_nhc", entry.azure_nhc.critical, "critical"),
    ):
        reading = by_source.get(source)
        if listed != (reading is not None) or (reading is not None and reading.severity != level):
            problems.append(f"{source}'s reading does not match its list")
    derived = find_disagreements(entry.readings, vocabulary)
    if derived != entry.disagreements:
        problems.append(
            "the listed disagreements are not the ones the readings hold: " + (disagreement_summary(derived) or "none")
        )
    if entry.disagreement != disagreement_summary(entry.disagreements):
        problems.append("the disagreement text does not state every listed disagreement")
    return problems


class ExplainedConsensus(Model):
    severity: FindingSeverity = Field(description="info, warning or critical; unknown for an uncatalogued code")
    action: str


class XidExplanation(Model):
    """Everything the catalog says about one Xid, or a clear 'not catalogued' answer (known=False)."""

    code: int
    known: bool = Field(description="False when the code is not in the catalog")
    mnemonic: str | None = None
    description: str
    nvidia: NvidiaAdvice | None = None
    gpud: GpudAdvice | None = None
    k8s_device_plugin: K8sDevicePluginView | None = None
    meta_gcm: MetaGcmView | None = None
    azure_nhc: AzureNhcView | None = None
    consensus: ExplainedConsensus
    readings: list[SourceReading] = Field(
        default_factory=list, description="each source's own words, normalised action and severity"
    )
    disagreements: list[Disagreement] = Field(
        default_factory=list,
        description="every difference between sources: normalised actions that differ, severities that do not agree",
    )
    disagreement: str | None = Field(default=None, description="all disagreements in one text; None when none")
    likely_causes: str | None = None
    notes: str | None = None
    escalation: str | None = Field(default=None, description="what to do when the same Xid keeps coming back")

    @model_validator(mode="after")
    def _disagreement_text_states_them_all(self) -> XidExplanation:
        if self.disagreement != disagreement_summary(self.disagreements):
            raise ValueError("disagreement must state every listed disagreement, and be None only when none is")
        return self


@lru_cache(maxsize=1)
def load_xid_catalog() -> XidCatalog:
    """The validated catalog, read once per process from resources/xid-catalog.json."""
    with (resources_dir() / CATALOG_FILE).open(encoding="utf-8") as handle:
        return XidCatalog.model_validate(json.load(handle))


@lru_cache(maxsize=1)
def _by_code() -> dict[int, XidEntry]:
    return {entry.code: entry for entry in load_xid_catalog().xids}


def xid_entry(code: int) -> XidEntry | None:
    """The catalog entry for `code`, or None when it is not catalogued."""
    return _by_code().get(code)


def _check_code(code: object) -> int:
    if isinstance(code, bool) or not isinstance(code, int):
        raise InputError(f"an Xid code is a whole number between 1 and 999, not {code!r}")
    if not 0 < code < 1000:
        raise InputError(f"Xid {code} is out of range: Xid codes are whole numbers between 1 and 999")
    return code


def explain_xid(code: int) -> XidExplanation:
    """What the catalog says about Xid `code` (1-999). An uncatalogued code answers known=False, not an error."""
    code = _check_code(code)
    catalog = load_xid_catalog()
    entry = xid_entry(code)
    if entry is None:
        codes = [e.code for e in catalog.xids]
        text = (
            f"Xid {code} is not in this catalog (it covers {min(codes)}-{max(codes)}); newer drivers add codes, so "
            f"look it up in NVIDIA's Xid catalog ({NVIDIA_XID_DOCS}) for the driver version that logged it."
        )
        return XidExplanation(
            code=code,
            known=False,
            description=text,
            consensus=ExplainedConsensus(
                severity="unknown",
                action="Not in the catalog: read the full kernel-log line and NVIDIA's catalog entry for this driver, "
                "and act on any catalogued Xid logged around it.",
            ),
        )
    return XidExplanation(
        code=entry.code,
        known=True,
        mnemonic=entry.mnemonic,
        description=entry.description,
        nvidia=entry.nvidia,
        gpud=entry.gpud,
        k8s_device_plugin=entry.k8s_device_plugin,
        meta_gcm=entry.meta_gcm,
        azure_nhc=entry.azure_nhc,
        consensus=ExplainedConsensus(severity=entry.consensus.severity, action=entry.consensus.action),
        readings=list(entry.readings),
        disagreements=list(entry.disagreements),
        disagreement=entry.disagreement,
        likely_causes=entry.likely_causes,
        notes=entry.notes,
        escalation=catalog.escalation,
    )


# --- classification for the kernel-log scanner -----------------------------------------------------------------

NVLINK5_CODES = range(144, 151)
_UNIT_TOKEN = re.compile(r"\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|MSE|SAW|TREX|NETIR)\b")
_REGISTERS = re.compile(r"[(\[]\s*(0x[0-9a-fA-F]+)(?:[\s,]+(0x[0-9a-fA-F]+))?")
_LINK = re.compile(r"\bLink\s+(\d+)", re.IGNORECASE)
_FATAL = re.compile(r"(?<![-\w])Fatal\b")
_NONFATAL = re.compile(r"\bNon-?fatal\b", re.IGNORECASE)
# Low 10 bits of intrinfo name the NETIR event (NVIDIA's 144-150 decode table).
_NETIR_EVENTS = {0x1C6: "LINK_DOWN", 0x226: "BER_EVENT", 0x246: "MFDE_EVENT", 0x006: "NETIR_INT"}
# LINK_DOWN subcodes (intrinfo bits 20-25) for which NVIDIA's decode says no GPU reset.
_LINK_DOWN_NO_RESET = {0x26, 0x28}


def _hex(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _classify_nvlink5(code: int, message: str, entry: XidEntry | None) -> tuple[str, str]:
    unit_match = _UNIT_TOKEN.search(message)
    unit = unit_match.group(1) if unit_match else None
    registers = _REGISTERS.search(message)
    intrinfo = _hex(registers.group(1)) if registers else None
    status = _hex(registers.group(2)) if registers else None
    link_match = _LINK.search(message)
    where = f" on link {int(link_match.group(1))}" if link_match else ""
    event = None
    if unit and "LINK_DOWN" in unit:
        event = "LINK_DOWN"
    elif unit and "BER" in unit:
        event = "BER_EVENT"
    elif unit and "MFDE" in unit:
        event = "MFDE_EVENT"
    elif code == 149 and intrinfo is not None:
        event = _NETIR_EVENTS.get(intrinfo & 0x3FF)
    subcode = (intrinfo >> 20) & 0x3F if intrinfo is not None else None
    label = f"Xid {code} {unit or 'NVLink5'}" + (f" ({event})" if event and unit and event not in unit else "")
    sub = f" (intrinfo subcode 0x{subcode:02x})" if subcode is not None else ""

    if event == "LINK_DOWN":
        if subcode in _LINK_DOWN_NO_RESET:
            return "warning", (
                f"{label}: NVLink link down{where}{sub}, a subcode NVIDIA's decode handles without a GPU reset: "
                "investigate the host and software side and reset only if the link stays down."
            )
        peer = " and the device at the other end of the link" if subcode is not None and 0x20 <= subcode <= 0x25 else ""
        return "critical", (
            f"{label}: NVLink link down{where}{sub}: drain and reset the GPU; if it repeats, inspect the link's "
            f"cables / cartridge{peer}."
        )
    if event == "BER_EVENT":
        return "info", (
            f"{label}: bit-error-rate event{where}: no reset needed (ignore), but check and reseat the NVLink "
            "cables / trays if it repeats on the same link."
        )
    if event == "MFDE_EVENT":
        if status == 0x3:
            return "info", f"{label}{where}: non-fatal status 0x3, no action needed."
        return "critical", f"{label}{where}: fatal NETIR event: drain and reset the GPU; contact NVIDIA if it repeats."
    if code == 150:
        return "critical", f"{label}{where}: NVLink management (MSE) firmware fault: drain and reset the GPU."
    if status == 0x4:
        return "critical", f"{label}{where}: error status 0x4 (fatal): drain and reset the GPU."
    if status in (0x1, 0x2, 0x80000000):
        extra = "; status 0x2 can precede Xid 48/94/95, so watch for those" if status == 0x2 else ""
        return "info", f"{label}{where}: error status 0x{status:x} (non-fatal): no reset needed{extra}."
    if _NONFATAL.search(message):
        return "info", f"{label}{where}: non-fatal NVLink5 event: no reset needed; watch for repeats on the link."
    if _FATAL.search(message):
        return "critical", f"{label}{where}{sub}: fatal NVLink5 event: drain and reset the GPU."
    if entry is not None:
        return entry.consensus.severity, entry.consensus.action
    return "warning", f"{label}: decode the sub-unit with NVIDIA's NVLink5 (Xid 144-150) table."


_RECOVERY_TO = re.compile(r"\bto\s+(0x[0-9a-fA-F]+|\d+)(?:\s*\(([^)]*)\))?", re.IGNORECASE)
_RECOVERY_NUMBER = re.compile(r"\b(0x[0-9a-fA-F]+|\d+)\b")
_RECOVERY_SYNONYMS = {
    "none": 0,
    "reset": 1,
    "gpureset": 1,
    "reboot": 2,
    "nodereboot": 2,
    "drainp2p": 3,
    "drainandreset": 4,
    "recoverimexdomain": 5,
    "imex": 5,
    "busreset": 6,
    "systemreboot": 7,
}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _recovery_from_text(text: str) -> int | None:
    key = _norm(text)
    if not key:
        return None
    for name, number in sorted(_RECOVERY_SYNONYMS.items(), key=lambda kv: -len(kv[0])):
        if key == name:
            return number
    for name, number in sorted(_RECOVERY_SYNONYMS.items(), key=lambda kv: -len(kv[0])):
        if name in key and name not in ("none", "reset", "reboot"):
            return number
    return None


def _recovery_action(number: int | None) -> tuple[str, str]:
    catalog = load_xid_catalog()
    if number is None or str(number) not in catalog.recovery_actions:
        known = ", ".join(f"{k} {v.name}" for k, v in catalog.recovery_actions.items())
        return "unknown", f"not in the catalog: recovery action {number!r} is not one of {known}."
    action = catalog.recovery_actions[str(number)]
    return action.severity, f"Recovery action {number} ({action.name}): {action.action}"


def _number(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def _recovery_number(message: str) -> int | None:
    """The recovery action a message names: 'to 0x4 (Drain and Reset)', a bare name, or a bare number."""
    match = _RECOVERY_TO.search(message)
    if match:
        number = _number(match.group(1))
        if str(number) in load_xid_catalog().recovery_actions:
            return number
        return _recovery_from_text(match.group(2) or "")
    named = _recovery_from_text(message)
    if named is not None:
        return named
    match = _RECOVERY_NUMBER.search(message)
    return _number(match.group(1)) if match else None


def _classify_154(message: str) -> tuple[str, str]:
    number = _recovery_number(message)
    if number is None:
        entry = xid_entry(154)
        if entry is not None:
            return entry.consensus.severity, entry.consensus.action
        return "warning", "Xid 154: read the message for the new recovery action and do it."
    severity, action = _recovery_action(number)
    return severity, f"Xid 154 (GPU recovery action changed): {action}"


def classify(kind: str, code: int | None, message: str) -> tuple[str, str]:
    """(severity, action) for one kernel-log finding.

    kind: "xid" (code = the Xid), "sxid" (NVSwitch; the message says Fatal or Non-fatal), "nccl_segfault",
    "fallen_off_bus", "recovery_action" (code = NVML recovery action 0-7, or the message names it).
    Severity is info, warning, critical, or unknown for anything the catalog does not cover.
    """
    message = message if isinstance(message, str) else ""
    kind_key = (kind or "").strip().lower() if isinstance(kind, str) else ""
    if kind_key == "xid":
        if code is None or isinstance(code, bool) or not isinstance(code, int):
            return "unknown", "not in the catalog: an Xid finding without a code cannot be classified."
        entry = xid_entry(code)
        if code in NVLINK5_CODES:
            return _classify_nvlink5(code, message, entry)
        if code == 154:
            return _classify_154(message)
        if entry is None:
            return "unknown", (
                f"not in the catalog: Xid {code} is unknown here; read NVIDIA's catalog ({NVIDIA_XID_DOCS}) for "
                "this driver version and act on any catalogued Xid around it."
            )
        return entry.consensus.severity, entry.consensus.action
    if kind_key == "sxid":
        if _FATAL.search(message) and not _NONFATAL.search(message):
            return "critical", (
                "NVSwitch fatal SXid: reset the fabric / NVSwitch (drain the node's GPUs, restart fabric manager or "
                "reboot the node); inspect the NVSwitch tray and link if it repeats."
            )
        return "warning", "NVSwitch non-fatal SXid: no reset needed; watch the same link for repeats and fatal SXids."
    if kind_key == "nccl_segfault":
        return "warning", "application crash in NCCL: check the job's logs and the GPUs' Xids"
    if kind_key == "fallen_off_bus":
        return "critical", "GPU fell off the bus: reboot the node; if it repeats, hardware inspection"
    if kind_key == "recovery_action":
        if code == 154:  # the scanner passes Xid 154 lines here: the message names the new action
            return _classify_154(message)
        number = _recovery_number(message) if _RECOVERY_TO.search(message) else None
        if number is None and isinstance(code, int) and not isinstance(code, bool):
            number = code
        if number is None:
            number = _recovery_number(message)
        return _recovery_action(number)
    return "unknown", f"not in the catalog: finding kind {kind!r} is not one this classifier knows"
