"""The Xid catalog (resources/xid-catalog.json), its builder (scripts/build_xid_catalog.py) and
servers/diagnostics/xid.py: explain_xid and the kernel-log classifier."""

import csv
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from servers.core.errors import InputError
from servers.core.paths import resources_dir
from servers.diagnostics.xid import (
    XidCatalog,
    XidEntry,
    XidExplanation,
    classify,
    explain_xid,
    load_xid_catalog,
)

REPO = Path(__file__).resolve().parents[1]
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
CSV_PATH = SAMPLES / "xid-catalog-compared.csv"
SCRIPT = REPO / "scripts" / "build_xid_catalog.py"
SEVERITIES = {"info", "warning", "critical"}

needs_source = pytest.mark.skipif(
    not (CSV_PATH.is_file() and SCRIPT.is_file()), reason="the source CSV or the builder script is not here"
)
needs_script = pytest.mark.skipif(not SCRIPT.is_file(), reason="the builder script is not here")

# The action normalisation, stated here on its own so that the whole-catalog test does not trust the code it checks.
# Two words share an action only when they ask the operator for the same thing; RESET_GPU is not RebootSystem.
NVIDIA_ACTION = {
    "IGNORE": "none",
    "RESTART_APP": "app_first",
    "CHECK_UVM": "check_uvm",
    "UPDATE_SWFW": "update_sw",
    "RESET_GPU": "reset_gpu",
    "RESTART_VM": "restart_vm",
    "RESTART_BM": "reboot_node",
    "CHECK_MECHANICALS": "hardware_inspection",
    "CONTACT_SUPPORT": "contact_support",
}
NVIDIA_WORKFLOW_PREFIXES = ("WORKFLOW_", "XID_")  # a named workflow decides from the message: "per_message"
GPUD_ACTION = {
    "IgnoreNoActionRequired": "none",
    "CheckUserAppAndGPU": "app_first",
    "RebootSystem": "reboot_node",
    "HardwareInspection": "hardware_inspection",
}
NVIDIA_LEVEL = {
    "IGNORE": "info",
    "RESTART_APP": "warning",
    "RESTART_VM": "warning",
    "CHECK_UVM": "warning",
    "UPDATE_SWFW": "warning",
    "RESET_GPU": "critical",
    "RESTART_BM": "critical",
    "CHECK_MECHANICALS": "critical",
    "CONTACT_SUPPORT": "critical",  # warning on codes NVIDIA lists as unused
}


def nvidia_action_set(word: str | None) -> frozenset[str] | None:
    if word is None:
        return None
    if word.startswith(NVIDIA_WORKFLOW_PREFIXES):
        return frozenset({"per_message"})
    return frozenset({NVIDIA_ACTION[word]})


def gpud_action_set(words: str | None) -> frozenset[str] | None:
    return None if words is None else frozenset(GPUD_ACTION[w] for w in words.split("+"))


def severity_levels(entry: XidEntry) -> dict[str, str]:
    """Each source's level, from the entry's raw fields (not from its readings)."""
    out = {}
    word = entry.nvidia.immediate
    if word in NVIDIA_LEVEL:
        unused = entry.description.lower() == "unused"
        out["nvidia"] = "warning" if word == "CONTACT_SUPPORT" and unused else NVIDIA_LEVEL[word]
    repair, event = entry.gpud.repair_actions or "", entry.gpud.event_type
    if event == "Fatal":
        out["gpud"] = "critical"
    elif "IgnoreNoActionRequired" in repair:
        out["gpud"] = "info"
    elif event in ("Warning", "Info"):
        out["gpud"] = event.lower()
    if entry.k8s_device_plugin.ignored:
        out["k8s_device_plugin"] = "not_critical"
    if entry.meta_gcm.noncritical:
        out["meta_gcm"] = "not_critical"
    if entry.azure_nhc.critical:
        out["azure_nhc"] = "critical"
    return out


def levels_differ(a: str, b: str) -> bool:
    if a == b:
        return False
    if "not_critical" in (a, b):  # a list that only says "not critical" agrees with info and warning
        return "critical" in (a, b)
    return True


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_xid_catalog", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the catalog file ---------------------------------------------------------------------------------------------


@needs_source
def test_the_committed_catalog_is_exactly_what_the_builder_makes_from_the_csv() -> None:
    module = builder()
    built = module.build_catalog(CSV_PATH)
    path = resources_dir() / "xid-catalog.json"
    assert json.loads(path.read_text(encoding="utf-8")) == built, "stale: run scripts/build_xid_catalog.py"
    assert path.read_text(encoding="utf-8") == module.render(built)


@needs_source
def test_the_builder_check_mode(tmp_path: Path) -> None:
    module = builder()
    out = tmp_path / "xid-catalog.json"
    assert module.main([str(CSV_PATH), "--out", str(out), "--check"]) == 1  # absent -> stale
    assert module.main([str(CSV_PATH), "--out", str(out)]) == 0
    assert module.main([str(CSV_PATH), "--out", str(out), "--check"]) == 0


@needs_source
def test_every_code_in_the_csv_is_catalogued_with_its_sources() -> None:
    with CSV_PATH.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    codes = {int(r["xid"]) for r in rows}
    assert codes == {e.code for e in load_xid_catalog().xids}
    for row in rows:
        explained = explain_xid(int(row["xid"]))
        assert explained.known
        assert explained.mnemonic == row["mnemonic"]
        assert explained.nvidia is not None and explained.nvidia.immediate == (row["nvidia_immediate"] or None)
        assert explained.azure_nhc is not None
        assert explained.azure_nhc.critical == (row["azure_nhc_critical"] == "True")
        assert explained.k8s_device_plugin is not None
        assert explained.k8s_device_plugin.ignored == (row["k8s_device_plugin_ignored"] == "True")


def test_every_entry_has_a_severity_one_actionable_sentence_and_causes() -> None:
    catalog = load_xid_catalog()
    assert "consensus" in catalog.description.lower() and "rule" in catalog.description.lower()
    assert set(catalog.recovery_actions) == {str(i) for i in range(8)}
    assert catalog.recovery_actions["4"].name == "Drain and Reset"
    for entry in catalog.xids:
        assert entry.consensus.severity in SEVERITIES
        action = entry.consensus.action
        assert action and action[0].isupper() and action.endswith(".") and "\n" not in action, entry.code
        assert entry.likely_causes


def test_xid_63_states_the_disagreement_between_sources() -> None:
    e = explain_xid(63)
    assert e.consensus.severity == "warning"
    text = e.disagreement or ""
    for source in ("NVIDIA", "gpud", "Azure", "Meta"):
        assert source in text, text
    assert "ignore" in text.lower() and "fatal" in text.lower()
    assert "reset" in e.consensus.action.lower()


def test_xid_119_lists_nvidia_reset_gpu_against_gpud_reboot_and_inspection() -> None:
    # reproduction: the disagreement was null although NVIDIA says RESET_GPU and gpud RebootSystem+HardwareInspection
    e = explain_xid(119)
    assert e.nvidia is not None and e.nvidia.immediate == "RESET_GPU"
    assert e.gpud is not None and e.gpud.repair_actions == "RebootSystem+HardwareInspection"
    assert e.disagreement is not None
    assert "RESET_GPU" in e.disagreement and "RebootSystem+HardwareInspection" in e.disagreement
    [action] = [d for d in e.disagreements if d.about == "action"]
    positions = {p.source: (p.says, p.reading) for p in action.positions}
    assert positions == {
        "nvidia": ("RESET_GPU", "reset_gpu"),
        "gpud": ("RebootSystem+HardwareInspection", "reboot_node+hardware_inspection"),
    }
    assert not [d for d in e.disagreements if d.about == "severity"]  # all three call it critical
    assert {r.source for r in e.readings} == {"nvidia", "gpud", "azure_nhc"}


def test_the_catalog_states_the_action_vocabulary_this_test_uses() -> None:
    vocabulary = load_xid_catalog().vocabulary
    assert vocabulary.nvidia == NVIDIA_ACTION
    assert vocabulary.gpud == GPUD_ACTION
    assert vocabulary.nvidia_prefixes == dict.fromkeys(NVIDIA_WORKFLOW_PREFIXES, "per_message")
    assert vocabulary.nvidia["RESET_GPU"] != vocabulary.gpud["RebootSystem"]
    assert any("nothing is inferred from absence" in rule for rule in vocabulary.rules)


def test_every_difference_in_action_or_severity_across_the_catalog_is_listed() -> None:
    catalog = load_xid_catalog()
    differing_actions = differing_levels = 0
    for entry in catalog.xids:
        about = {d.about: d for d in entry.disagreements}
        if entry.disagreements:
            assert entry.disagreement is not None
            for d in entry.disagreements:
                assert d.text in entry.disagreement, entry.code
        else:
            assert entry.disagreement is None, entry.code
        # actions: NVIDIA's immediate action against gpud's repair actions, normalised with the mapping above
        nvidia, gpud = nvidia_action_set(entry.nvidia.immediate), gpud_action_set(entry.gpud.repair_actions)
        if nvidia is not None and gpud is not None and nvidia != gpud:
            differing_actions += 1
            assert "action" in about, f"Xid {entry.code}: {entry.nvidia.immediate} vs {entry.gpud.repair_actions}"
            says = {p.source: p.says for p in about["action"].positions}
            assert says == {"nvidia": entry.nvidia.immediate, "gpud": entry.gpud.repair_actions}, entry.code
            assert entry.nvidia.immediate in about["action"].text
            assert entry.gpud.repair_actions in about["action"].text
        else:
            assert "action" not in about, entry.code
        # severity: any two sources' levels that differ
        levels = severity_levels(entry)
        pairs = [(a, b) for a in levels for b in levels if a < b and levels_differ(levels[a], levels[b])]
        if pairs:
            differing_levels += 1
            assert "severity" in about, f"Xid {entry.code}: {pairs}"
            listed = {p.source: p.reading for p in about["severity"].positions}
            assert listed == levels, entry.code  # every source's position, not just the two that differ
        else:
            assert "severity" not in about, entry.code
    assert differing_actions > 20 and differing_levels > 20  # the check has something to bite on


def test_a_catalog_that_hides_a_disagreement_refuses_to_load() -> None:
    document = json.loads((resources_dir() / "xid-catalog.json").read_text(encoding="utf-8"))
    XidCatalog.model_validate(document)  # the committed one is consistent
    [x119] = [x for x in document["xids"] if x["code"] == 119]
    x119["disagreements"], x119["disagreement"] = [], None
    with pytest.raises(ValidationError, match="Xid 119"):
        XidCatalog.model_validate(document)

    document = json.loads((resources_dir() / "xid-catalog.json").read_text(encoding="utf-8"))
    [x119] = [x for x in document["xids"] if x["code"] == 119]
    x119["readings"][1]["actions"] = ["reset_gpu"]  # gpud's words misnormalised to agree with NVIDIA
    x119["disagreements"], x119["disagreement"] = [], None
    with pytest.raises(ValidationError, match="gpud's reading"):
        XidCatalog.model_validate(document)

    document = json.loads((resources_dir() / "xid-catalog.json").read_text(encoding="utf-8"))
    [x63] = [x for x in document["xids"] if x["code"] == 63]
    x63["disagreement"] = x63["disagreements"][0]["text"]  # states one of two
    with pytest.raises(ValidationError, match="every listed disagreement"):
        XidCatalog.model_validate(document)


def test_an_explanation_cannot_drop_its_disagreement_text() -> None:
    e = explain_xid(119)
    with pytest.raises(ValidationError):
        XidExplanation.model_validate({**e.model_dump(), "disagreement": None})


@needs_script
def test_the_builder_refuses_an_action_word_outside_the_vocabulary() -> None:
    module = builder()
    row = {
        "xid": 500,
        "mnemonic": "NEW",
        "description": "A new code",
        "nvidia_immediate": "RESET_GPU",
        "nvidia_investigatory": None,
        "gpud_repair_actions": "RebootSystem",
        "gpud_event_type": "Fatal",
        "k8s_device_plugin_ignored": False,
        "meta_gcm_noncritical": False,
        "azure_nhc_critical": False,
    }
    entry = module.build_entry(row)
    assert [d["about"] for d in entry["disagreements"]] == ["action"]  # reset_gpu vs reboot_node
    with pytest.raises(ValueError, match="REPLACE_GPU"):
        module.build_entry({**row, "nvidia_immediate": "REPLACE_GPU"})
    with pytest.raises(ValueError, match="DrainNode"):
        module.build_entry({**row, "gpud_repair_actions": "RebootSystem+DrainNode"})


def test_xid_79_fallen_off_the_bus_is_critical() -> None:
    e = explain_xid(79)
    assert e.consensus.severity == "critical"
    assert "reboot" in e.consensus.action.lower()
    assert "2 reboots" in e.consensus.action and "hardware inspection" in e.consensus.action


def test_xid_45_is_not_critical_and_explains_floods() -> None:
    e = explain_xid(45)
    assert e.consensus.severity != "critical"
    text = f"{e.consensus.action} {e.likely_causes} {e.notes}".lower()
    assert "flood" in text and "preemptive" in text


def test_xid_13_is_application_level() -> None:
    e = explain_xid(13)
    assert e.nvidia is not None and e.nvidia.immediate == "RESTART_APP"
    assert e.consensus.severity == "warning"
    assert "application" in e.consensus.action.lower()
    assert e.k8s_device_plugin is not None and e.k8s_device_plugin.ignored


def test_the_consensus_rules_on_known_cases() -> None:
    assert explain_xid(48).consensus.severity == "critical"  # workflow code, gpud fatal, Azure critical
    assert explain_xid(95).consensus.severity == "critical"  # RESET_GPU
    assert explain_xid(119).consensus.severity == "critical"
    assert explain_xid(43).consensus.severity == "info"  # IGNORE, nobody calls it critical
    e109 = explain_xid(109)  # RESET_GPU, but the device plugin ignores it and Meta calls it non-critical
    assert e109.consensus.severity == "warning" and e109.disagreement
    assert explain_xid(92).consensus.severity == "warning"  # NVIDIA IGNORE, Azure critical
    assert explain_xid(69).consensus.severity == "critical"  # gpud fatal and Azure critical
    assert explain_xid(154).consensus.severity == "warning"
    assert explain_xid(171).consensus.severity == "critical"


def test_an_uncatalogued_code_is_answered_not_raised() -> None:
    e = explain_xid(999)
    assert e.known is False
    assert "not in this catalog" in e.description and "docs.nvidia.com" in e.description
    assert e.consensus.severity == "unknown"


@pytest.mark.parametrize("bad", [0, 1000, -1, 10**9, True, "13", 13.0, None])
def test_codes_outside_1_to_999_are_input_errors(bad: object) -> None:
    with pytest.raises(InputError):
        explain_xid(bad)  # type: ignore[arg-type]


# --- classify -----------------------------------------------------------------------------------------------------


def test_classify_plain_xids_from_the_catalog() -> None:
    assert classify("xid", 79, "GPU has fallen off the bus.")[0] == "critical"
    assert classify("xid", 13, "Graphics SM Warp Exception")[0] == "warning"
    assert classify("xid", 43, "")[0] == "info"
    severity, action = classify("xid", 500, "something new")
    assert severity == "unknown" and action.startswith("not in the catalog")
    assert classify("xid", None, "no code")[0] == "unknown"


def test_classify_149_link_down_versus_ber_event() -> None:
    down = classify("xid", 149, "NETIR_LINK_DOWN Fatal XC0 i0 Link 17 (0x02a001c6 0x00000000)")
    ber = classify("xid", 149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00000226 0x00000001)")
    assert down[0] == "critical" and "reset the GPU" in down[1]
    assert ber[0] == "info" and "no reset" in ber[1] and "cable" in ber[1]
    # the pre-R575 form names only NETIR_LINK_EVT; the intrinfo register says it is a link down
    decoded = classify("xid", 149, "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000)")
    assert decoded[0] == "critical" and "LINK_DOWN" in decoded[1] and "link 9" in decoded[1]


def test_classify_other_nvlink5_units_by_error_status() -> None:
    assert classify("xid", 145, "RLW_SRC_TRACK Fatal XC0 i1 Link 00 (0x00000001 0x00000004)")[0] == "critical"
    assert classify("xid", 146, "TLW_RX_PIPE0 Nonfatal XC0 i0 Link 02 (0x00a00143 0x80000000)")[0] == "info"
    assert classify("xid", 150, "MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000)")[0] == "critical"
    assert classify("xid", 147, "")[0] == "warning"  # nothing to decode: the catalog default


def test_classify_154_uses_the_new_recovery_action() -> None:
    severity, action = classify("xid", 154, "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)")
    assert severity == "critical" and "Drain and Reset" in action
    assert classify("xid", 154, "GPU recovery action changed from 0x1 (GPU Reset) to 0x0 (None)")[0] == "info"
    severity, action = classify("xid", 154, "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)")
    assert severity == "warning" and "peer-to-peer" in action
    assert "Node Reboot" in classify("xid", 154, "recovery action changed to 0x2 (Node Reboot)")[1]


def test_classify_sxid_segfault_fallen_off_bus_and_recovery_actions() -> None:
    severity, action = classify("sxid", 20034, "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 48")
    assert severity == "critical" and "fabric" in action and "fabric manager" in action
    assert classify("sxid", 12028, "SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress")[0] == "warning"
    assert classify("nccl_segfault", None, "segfault at 0 ip ... in libnccl.so.2") == (
        "warning",
        "application crash in NCCL: check the job's logs and the GPUs' Xids",
    )
    severity, action = classify("fallen_off_bus", None, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")
    assert severity == "critical" and "reboot the node" in action
    assert classify("recovery_action", 2, "")[0] == "critical"
    assert classify("recovery_action", None, "Drain P2P")[0] == "warning"
    assert classify("recovery_action", None, "0x4")[1].startswith("Recovery action 4 (Drain and Reset)")
    assert classify("recovery_action", 0, "")[0] == "info"
    assert classify("recovery_action", 9, "")[0] == "unknown"
    severity, action = classify("kernel_panic", None, "whatever")
    assert severity == "unknown" and action.startswith("not in the catalog")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    kind=st.one_of(st.sampled_from(["xid", "sxid", "nccl_segfault", "fallen_off_bus", "recovery_action"]), st.text()),
    code=st.one_of(st.none(), st.integers(min_value=-(10**12), max_value=10**12)),
    message=st.text(max_size=300),
)
def test_classify_never_raises(kind: str, code: int | None, message: str) -> None:
    severity, action = classify(kind, code, message)
    assert severity in SEVERITIES | {"unknown"}
    assert isinstance(action, str) and action


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    code=st.integers(min_value=144, max_value=154),
    message=st.text(alphabet="0123456789abcdefxX_ ()[]LinkFatlNETIRBDOWN", max_size=120),
)
def test_classify_nvlink_and_154_messages_never_raise(code: int, message: str) -> None:
    severity, _ = classify("xid", code, message)
    assert severity in SEVERITIES | {"unknown"}


def test_classify_recovery_action_events_as_the_kernel_log_scanner_sends_them() -> None:
    # the scanner sends Xid 154 lines as kind "recovery_action" with code 154
    message = "Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot)"
    severity, action = classify("recovery_action", 154, message)
    assert severity == "critical" and "Node Reboot" in action and action.startswith("Xid 154")
    assert (
        classify("recovery_action", None, "GPU recovery action changed from 0x4 (Drain and Reset) to 0x0 (None)")[0]
        == "info"
    )
    assert classify("recovery_action", 154, "no action named")[0] == "warning"  # the catalog's Xid 154 entry


def test_the_catalog_cites_sources_a_client_can_read() -> None:
    """Issue 22, defect 11: a source was 'project reference notes (diagnostics.md)', a file no client can open."""
    document = json.loads((resources_dir() / "xid-catalog.json").read_text(encoding="utf-8"))
    for source in document["sources"]:
        assert "reference note" not in source["source"] and ".md" not in source["source"], source
        assert "https://" in source["source"] or "(" in source["source"], source  # a URL or a named project
