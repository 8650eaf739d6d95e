"""Every tool's default result in the scripted agent's workflows stays under 16 KB (issue 22, defect 9).

The calls are benchmarks/result_sizes.py's, without the workflows that start jobs (a training job, a sweep, the
bandwidth check, the GEMM and collective benchmarks, tuning: minutes of work; the benchmark measures them, and the
job tools' own results, get_job, list_jobs, read_job_logs, read_job_metrics, wait_for_job, cancel_job, with them).
One in-process suite runs them all once (a few seconds); each tool is then one test, so that a tool over the bound
is named. The bound counts what a model reads: structured content and text blocks as compact JSON.
"""

from __future__ import annotations

import anyio
import pytest

from benchmarks.result_sizes import GOAL_BYTES, Call, measure, result_bytes

TOOLS = [
    "check_extrapolation",
    "compare_scaling_fits",
    "convert_compute_units",
    "detect_stragglers",
    "explain_xid",
    "fit_scaling_law",
    "gpu_health",
    "list_scaling_fits",
    "list_shape_presets",
    "localize_network_fault",
    "parse_dcgm_diag",
    "parse_nccl_tests",
    "plan_network_probes",
    "plot_scaling_fit",
    "predict_overlap",
    "predict_scaling",
    "read_dcgm_exporter",
    "scan_kernel_log",
    "triage_node",
]


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> list[Call]:
    home = tmp_path_factory.mktemp("result-sizes") / "state"
    return anyio.run(lambda: measure(jobs=False, home=home))


@pytest.mark.timeout(120)
def test_the_workflows_call_every_tool_listed_here(calls: list[Call]) -> None:
    assert sorted({c.tool for c in calls}) == TOOLS
    assert all(not c.error for c in calls if c.tool != "scan_kernel_log")  # dmesg may be unreadable here


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "tool",
    TOOLS,
)
def test_a_default_result_is_under_16_kb(calls: list[Call], tool: str) -> None:
    mine = [c for c in calls if c.tool == tool]
    assert mine
    over = [(c.workflow, c.args, c.bytes) for c in mine if c.bytes > GOAL_BYTES]
    assert not over, over


def test_the_measure_counts_text_and_structured_content_and_not_images() -> None:
    from mcp.types import CallToolResult, ImageContent, TextContent

    text = CallToolResult(content=[TextContent(type="text", text="x" * 1000)], structured_content={"a": "y" * 2000})
    read, other = result_bytes(text)
    assert 3000 < read < 3200 and other == 0
    image = CallToolResult(
        content=[TextContent(type="text", text="plot"), ImageContent(type="image", data="A" * 50_000, mime_type="p")],
        structured_content={},
    )
    read, other = result_bytes(image)
    assert read < 200 and other > 50_000
