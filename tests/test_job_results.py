"""A job's large result in a tool's answer (issue 22, defect 9): every tool that answers with a job's view carries
the result whole up to RESULT_SHOWN_BYTES, and above it its small top-level fields, the names of the others, and the
resource infra://jobs/{id}/result that has it all."""

import json

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from servers.core.jobstore import JobState
from servers.core.jobview import RESULT_SHOWN_BYTES, JobView, shown_to_agent
from tests.helpers import call_ok

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

BOUND = 16 * 1024


def size(result: object) -> int:
    return len(json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode())


async def test_a_large_result_is_cut_in_every_answer_and_whole_in_its_resource(suite_client: Client) -> None:
    started = await suite_client.call_tool("start_test_job", {"kind": "test_big", "spec": {"rows": 2000}, "wait_s": 30})
    job = started.structured_content
    assert job["state"] == "SUCCEEDED"
    job_id = job["job_id"]
    got = await suite_client.call_tool("get_job", {"job_id": job_id})
    waited = await suite_client.call_tool("wait_for_job", {"job_id": job_id, "wait_s": 1})
    listed = await suite_client.call_tool("list_jobs", {"detail": True, "limit": 1})
    views = [
        job,
        got.structured_content,
        waited.structured_content["job"],
        listed.structured_content["details"][0],
    ]
    for answer in (started, got, waited, listed):
        assert size(answer.model_dump(mode="json", by_alias=True, exclude_none=True)) < BOUND
    for view in views:
        assert view["result_truncated"] is True
        assert view["result"] == {"verdict": "all rows valid", "table": "size busbw\n" + "x" * 3000}
        assert view["result_omitted"] == ["rows"]
        assert view["result_uri"] == f"infra://jobs/{job_id}/result"
        assert view["result_uri"] in view["next_step"]
    [content] = (await suite_client.read_resource(f"infra://jobs/{job_id}/result")).contents
    whole = json.loads(content.text)
    assert len(whole["rows"]) == 2000 and whole["rows"][1999]["note"] == "row 1999"
    [shown] = (await suite_client.read_resource(f"infra://jobs/{job_id}")).contents
    assert json.loads(shown.text)["result_omitted"] == ["rows"]  # the job resource is what get_job shows


async def test_a_small_result_stays_whole(suite_client: Client) -> None:
    job = await call_ok(suite_client, "start_test_job", {"kind": "test_big", "spec": {"rows": 3}, "wait_s": 30})
    assert job["result_truncated"] is False and job["result_uri"] is None and job["result_omitted"] == []
    assert len(job["result"]["rows"]) == 3


async def test_the_result_resource_of_a_job_without_a_result_says_why(suite_client: Client) -> None:
    failed = await call_ok(suite_client, "start_test_job", {"kind": "test_fail", "spec": {}, "wait_s": 30})
    with pytest.raises(MCPError, match="FAILED: only a SUCCEEDED job has a result"):
        await suite_client.read_resource(f"infra://jobs/{failed['job_id']}/result")


def test_a_result_that_is_not_an_object_is_pointed_at_whole() -> None:
    view = JobView(
        job_id="j-1",
        kind="k",
        state=JobState.SUCCEEDED,
        finished=True,
        created_at=None,
        timeout_s=60,
        spec={},
        result=list(range(RESULT_SHOWN_BYTES)),
        resource_uri="infra://jobs/j-1",
        next_step="the result is above",
    )
    shown = shown_to_agent(view)
    assert shown.result is None and shown.result_truncated and shown.result_uri == "infra://jobs/j-1/result"
    assert shown_to_agent(view.model_copy(update={"result": [1, 2]})).result == [1, 2]
