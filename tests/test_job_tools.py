"""The job tools through an in-process MCP client, in both protocol eras."""

import json

import anyio
import pytest
from mcp import Client

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def call(client: Client, tool: str, args: dict) -> dict:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text
    assert result.content[0].type == "text" and result.content[0].text  # a readable summary beside the data
    return result.structured_content


async def test_long_work_returns_the_result_within_wait_s(suite_client: Client) -> None:
    job = await call(suite_client, "start_test_job", {"kind": "test_count", "spec": {"steps": 3}, "wait_s": 30})
    assert job["state"] == "SUCCEEDED" and job["finished"] and job["result"]["steps"] == 3
    assert job["resource_uri"] == f"infra://jobs/{job['job_id']}"


async def test_handle_then_wait_with_progress_notifications(suite_client: Client) -> None:
    job = await call(
        suite_client, "start_test_job", {"kind": "test_count", "spec": {"steps": 6, "step_s": 0.5}, "wait_s": 0}
    )
    assert not job["finished"] and "wait_for_job" in job["next_step"]
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    result = await suite_client.call_tool(
        "wait_for_job", {"job_id": job["job_id"], "wait_s": 40}, progress_callback=on_progress
    )
    waited = result.structured_content
    assert not result.is_error and waited["job"]["state"] == "SUCCEEDED" and not waited["timed_out"]
    await anyio.sleep(0.1)
    assert seen, "no progress notification arrived while waiting"
    values = [p for p, _, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values)  # strictly increasing, as MCP requires
    assert any(m and "RUNNING" in m for _, _, m in seen)


async def test_wait_times_out_and_cancel_ends_the_job(suite_client: Client) -> None:
    job = await call(suite_client, "start_test_job", {"kind": "test_sleep", "spec": {"seconds": 60}})
    waited = await call(suite_client, "wait_for_job", {"job_id": job["job_id"], "wait_s": 1})
    assert waited["timed_out"] and waited["job"]["state"] in ("STARTING", "RUNNING")
    cancelled = await call(suite_client, "cancel_job", {"job_id": job["job_id"]})
    assert cancelled["state"] == "CANCELLED"
    again = await call(suite_client, "cancel_job", {"job_id": job["job_id"]})
    assert again["state"] == "CANCELLED" and again["ended_at"] == cancelled["ended_at"]


async def test_logs_page_by_offset(suite_client: Client) -> None:
    job = await call(suite_client, "start_test_job", {"kind": "test_count", "spec": {"steps": 5}, "wait_s": 30})
    whole = await call(suite_client, "read_job_logs", {"job_id": job["job_id"]})
    assert whole["eof"] and whole["job_finished"] and "step 4 done" in whole["text"]
    text, offset = "", 0
    while True:
        chunk = await call(suite_client, "read_job_logs", {"job_id": job["job_id"], "offset": offset, "limit": 7})
        text += chunk["text"]
        offset = chunk["next_offset"]
        if chunk["eof"]:
            break
    assert text == whole["text"] and offset == whole["size_bytes"]
    supervisor = await call(suite_client, "read_job_logs", {"job_id": job["job_id"], "process": "supervisor"})
    assert "ended" in supervisor["text"]


async def test_metrics_filter_and_page(suite_client: Client) -> None:
    job = await call(suite_client, "start_test_job", {"kind": "test_count", "spec": {"steps": 5}, "wait_s": 30})
    page = await call(suite_client, "read_job_metrics", {"job_id": job["job_id"], "limit": 2})
    assert [r["step"] for r in page["rows"]] == [0, 1] and page["truncated"] and page["last_step"] == 1
    rest = await call(
        suite_client, "read_job_metrics", {"job_id": job["job_id"], "since_step": page["last_step"], "keys": ["loss"]}
    )
    assert [r["step"] for r in rest["rows"]] == [2, 3, 4] and not rest["truncated"]
    assert set(rest["rows"][0]) == {"step", "time", "loss"}


async def test_list_jobs_filters_and_pages(suite_client: Client) -> None:
    ids = []
    for steps in (1, 2, 3):
        ids.append(
            (
                await call(
                    suite_client, "start_test_job", {"kind": "test_count", "spec": {"steps": steps}, "wait_s": 30}
                )
            )["job_id"]
        )
    failed = await call(suite_client, "start_test_job", {"kind": "test_fail", "spec": {}, "wait_s": 30})
    assert failed["state"] == "FAILED" and failed["exit_code"] == 3
    everything = await call(suite_client, "list_jobs", {})
    assert everything["total"] == 4
    first = await call(suite_client, "list_jobs", {"kind": "test_count", "limit": 2})
    assert first["total"] == 3 and len(first["jobs"]) == 2 and first["next_offset"] == 2
    second = await call(suite_client, "list_jobs", {"kind": "test_count", "limit": 2, "offset": 2})
    assert second["next_offset"] is None
    assert {j["job_id"] for j in first["jobs"] + second["jobs"]} == set(ids)
    only_failed = await call(suite_client, "list_jobs", {"state": "FAILED"})
    assert [j["job_id"] for j in only_failed["jobs"]] == [failed["job_id"]]


async def test_every_job_is_a_resource(suite_client: Client) -> None:
    job = await call(suite_client, "start_test_job", {"kind": "test_count", "spec": {"steps": 2}, "wait_s": 30})
    [content] = (await suite_client.read_resource(f"infra://jobs/{job['job_id']}")).contents
    assert content.mime_type == "application/json" and json.loads(content.text)["state"] == "SUCCEEDED"
    [log] = (await suite_client.read_resource(f"infra://jobs/{job['job_id']}/logs/main")).contents
    assert "step 1 done" in log.text


async def test_gemm_benchmark_runs_as_a_job_on_cpu(suite_client: Client) -> None:
    job = await call(
        suite_client,
        "benchmark_gemm",
        {"m": 64, "n": 32, "k": 16, "dtype": "fp32", "iters": 3, "warmup": 1, "wait_s": 45},
    )
    assert job["state"] == "SUCCEEDED", job["reason"]
    result = job["result"]
    assert result["device"] == "cpu" and result["m"] == 64 and result["iters"] == 3
    assert 0 < result["min_ms"] <= result["median_ms"] <= result["max_ms"]
    assert result["tflops"] == pytest.approx(2 * 64 * 32 * 16 / (result["median_ms"] * 1e-3) / 1e12)
    assert result["fraction_of_peak"] is None and "plumbing" in result["note"]
    rows = (await call(suite_client, "read_job_metrics", {"job_id": job["job_id"]}))["rows"]
    assert [r["step"] for r in rows] == [0, 1, 2]


async def test_gemm_benchmark_asking_for_cuda_here_fails_clearly(suite_client: Client) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    # Refused before any job starts, with the same words the worker would use (one probe of the machine).
    result = await suite_client.call_tool("benchmark_gemm", {"m": 8, "n": 8, "k": 8, "device": "cuda", "wait_s": 45})
    assert result.is_error and "device 'cuda' cannot run here" in result.content[0].text
    assert (await call(suite_client, "list_jobs", {}))["total"] == 0


@pytest.mark.parametrize(
    ("tool", "args", "expected"),
    [
        ("get_job", {"job_id": "no-such-job"}, "no job with id 'no-such-job'"),
        ("get_job", {"job_id": "../../etc/passwd"}, "should match pattern"),
        ("wait_for_job", {"job_id": "x", "wait_s": 51}, "less than or equal to 50"),
        ("read_job_logs", {"job_id": "no-such-job"}, "no job with id"),
        ("read_job_metrics", {"job_id": "no-such-job", "limit": 0}, "greater than or equal to 1"),
        ("list_jobs", {"state": "DONE"}, "QUEUED"),
        ("cancel_job", {"job_id": "no-such-job"}, "list_jobs"),
    ],
)
async def test_bad_job_tool_input_is_a_readable_error(
    suite_client: Client, tool: str, args: dict, expected: str
) -> None:
    result = await suite_client.call_tool(tool, args)
    assert result.is_error and expected in result.content[0].text
    assert (await suite_client.list_tools()).tools  # the server keeps serving


async def test_log_of_unknown_process_and_offset_past_end(suite_client: Client) -> None:
    job = await call(suite_client, "start_test_job", {"kind": "test_count", "spec": {"steps": 1}, "wait_s": 30})
    result = await suite_client.call_tool("read_job_logs", {"job_id": job["job_id"], "process": "rank7"})
    assert result.is_error and "its logs: main, supervisor" in result.content[0].text
    result = await suite_client.call_tool("read_job_logs", {"job_id": job["job_id"], "offset": 10**9})
    assert result.is_error and "past the end of the log" in result.content[0].text
