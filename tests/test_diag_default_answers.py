"""gpu_health and triage_node answer within ~16 KB by default (issue 22, defect 9), and give everything on request:
a healthy GPU without findings by its identity, the GPUs that are not healthy whole, GPUs missing from a source in
one warning per group, and detail=true for every reading."""

import json
from pathlib import Path

import pytest
from mcp import Client

from servers.diagnostics.bounds import fit, summary_text
from servers.diagnostics.triage import triage_node
from tests.helpers import call_ok

pytestmark = pytest.mark.timeout(60)

FIXTURES = Path(__file__).parent / "fixtures" / "diagnostics"
SMI = (FIXTURES / "smi" / "nvidia-smi-q.8xH100.550.synthetic.txt").read_text()
DCGM_OTHER_NODE = (FIXTURES / "dcgm" / "dcgmi-diag-r3.dcgm4.8xH100.json").read_text()  # another node's 8 GPUs
BOUND = 16 * 1024


def answer_bytes(result: object) -> int:
    data = result.model_dump(mode="json", by_alias=True, exclude_none=True)  # type: ignore[attr-defined]
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


@pytest.mark.anyio
async def test_gpu_health_lists_every_gpu_of_a_node_within_the_bound(suite_client: Client) -> None:
    default = await suite_client.call_tool("gpu_health", {"text": SMI})
    full = await call_ok(suite_client, "gpu_health", {"text": SMI, "detail": True})
    health = default.structured_content
    assert answer_bytes(default) < BOUND and len(health["gpus"]) == 8 and health["gpus_omitted"] == 0
    for shown, whole in zip(health["gpus"], full["gpus"], strict=True):
        assert shown["status"] == whole["status"] and not whole["identity_only"]
        if whole["status"] == "healthy" and not whole["findings"]:
            assert shown["identity_only"] and set(shown["gpu"]) <= {
                "index", "name", "uuid", "pci_bus_id", "serial", "memory_total_mib", "unreachable"
            }  # fmt: skip
            assert shown["gpu"]["uuid"] == whole["gpu"]["uuid"] and "temperature_c" in whole["gpu"]
        else:
            assert shown == whole  # a GPU with findings keeps every reading
    assert sum(not g["identity_only"] for g in health["gpus"]) >= 4  # the fixture's unhealthy and degraded ones


def test_gpus_missing_from_a_source_are_one_warning_and_sources_of_two_nodes_are_named() -> None:
    report = triage_node(nvidia_smi=SMI, dcgm=DCGM_OTHER_NODE)
    assert report.gpu_count == 16
    first, *groups = report.warnings
    assert first.startswith("The nvidia-smi output (8 GPUs) and the DCGM diagnostic (8 GPUs) have no GPU in common")
    assert len(groups) == 2
    assert any(
        w.startswith("8 GPUs (0000:18:00 (nvidia-smi index 0), ") and "DCGM did not test them" in w for w in groups
    )
    assert any(w.startswith("8 GPUs (DCGM GPU 0, DCGM GPU 1, ") and "nvidia-smi cannot see them" in w for w in groups)
    one_node = triage_node(nvidia_smi=SMI)
    assert not any("no GPU in common" in w for w in one_node.warnings)


@pytest.mark.anyio
async def test_triage_node_default_answer_is_bounded_and_detail_lists_all(suite_client: Client) -> None:
    args = {"nvidia_smi_text": SMI, "dcgm_text": DCGM_OTHER_NODE}
    default = await suite_client.call_tool("triage_node", args)
    full = await call_ok(suite_client, "triage_node", {**args, "detail": True})
    short = default.structured_content
    assert answer_bytes(default) < BOUND and len(full["gpus"]) == 16 and full["gpus_omitted"] == 0
    assert len(short["gpus"]) + short["gpus_omitted"] == 16 and short["counts"] == full["counts"]
    unhealthy = {g["label"] for g in full["gpus"] if g["verdict"] == "unhealthy"}
    assert unhealthy <= {g["label"] for g in short["gpus"]}  # the worst are listed first


def test_fit_lists_close_to_what_the_budget_holds() -> None:
    from pydantic import BaseModel

    class Listing(BaseModel):
        items: list[str]

    def build(scale: float) -> Listing:
        return Listing(items=["x" * 90] * max(1, int(100 * scale)))

    listed = len(fit(build, budget=6000).items)
    assert 58 <= listed <= 64  # 64 fit (93 bytes each); halving alone would stop at 50


def test_a_cut_summary_keeps_whole_lines_within_its_bytes_and_says_where_the_rest_is() -> None:
    cut = summary_text(["a" * 10] * 8, 70, "warnings has them all")
    assert cut == "\n".join(["a" * 10] * 2) + "\n... (summary cut; warnings has them all)"
    assert len(json.dumps(cut).encode()) <= 70
    assert summary_text(["short"], 100) == "short"
