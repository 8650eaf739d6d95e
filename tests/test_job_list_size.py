"""Issue 22, defect 9 (list_jobs): each job cost ~4 KB (its whole view: spec, plan, rendered batch script), so a
listing of 20 cluster jobs cost an agent ~80 KB. The default listing is now one short row per job (id, kind,
state, backend, name, run time, a one-line summary), at most 20 rows saying how many more there are; the full views
come with detail=true (at most 10) or from get_job."""

import json
import time
from pathlib import Path

import pytest
from mcp import Client

from servers.core.jobstore import JobRecord, JobState, JobStore
from servers.core.jobview import job_view
from servers.core.mcp_layer import App
from tests.helpers import call_error, call_ok, create_test_suite

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
BOUND = 16 * 1024


def remote_job(index: int, home: Path) -> JobRecord:
    """A row as a Slurm training job leaves it: its spec holds the plan and the rendered batch script (~4 KB)."""
    script = "#!/bin/bash\n" + "".join(f"#SBATCH --option-{i}=value-{i}\n" for i in range(40)) + "srun torchrun ...\n"
    spec = {
        "backend": "slurm",
        "name": f"run-{index}",
        "script": "/data/recipes/tiny_gpt.py",
        "args": ["--steps", "2000", "--lr", "3e-4"],
        "plan": {
            "backend": "slurm",
            "argv": ["sbatch", "--parsable", "x"],
            "rendered": script,
            "notes": ["n" * 300] * 4,
        },
        "training_spec": {"recipe": "tiny-gpt", "backend": "slurm", "nnodes": 2, "name": f"run-{index}"},
    }
    created = time.time() - 1000 + index
    return JobRecord(
        id=f"training_remote-{index:04d}",
        kind="training_remote",
        spec=spec,
        state=JobState.SUCCEEDED if index % 3 else JobState.FAILED,
        created_at=created,
        started_at=created + 5,
        ended_at=created + 65,
        reason=None if index % 3 else "slurm job 17 ended FAILED: rank 1 failed (exit 3) " + "x" * 400,
        timeout_s=3600,
        owner="test",
        job_dir=str(home / "jobs" / f"training_remote-{index:04d}"),
    )


async def test_the_default_listing_stays_small_with_many_jobs(app: App) -> None:
    store = JobStore(app.settings.db_path)
    records = [remote_job(i, app.settings.home) for i in range(60)]
    for record in records:
        store.insert(record)
    full_view = len(job_view(records[0]).model_dump_json())
    assert full_view > 3000  # what each job cost before
    async with Client(create_test_suite(app), mode="legacy") as client:
        result = await client.call_tool("list_jobs", {})
        listed = result.structured_content
        size = len(json.dumps(listed)) + len(result.content[0].text)
        assert size < BOUND, size
        assert listed["total"] == 60 and len(listed["jobs"]) == 20 and listed["next_offset"] == 20
        assert listed["details"] == [] and "40 more (offset 20)" in result.content[0].text
        first = listed["jobs"][0]
        assert first["job_id"] == "training_remote-0059" and first["backend"] == "slurm" and first["name"] == "run-59"
        assert first["elapsed_s"] == pytest.approx(60) and first["summary"].startswith("SUCCEEDED")
        failed = next(j for j in listed["jobs"] if j["state"] == "FAILED")
        assert "rank 1 failed (exit 3)" in failed["summary"] and len(failed["summary"]) <= 200
        # Every page of rows, the largest allowed too, stays far below the full views it replaces.
        biggest = await call_ok(client, "list_jobs", {"limit": 200})
        assert len(biggest["jobs"]) == 60 and len(json.dumps(biggest)) < 60 * full_view / 5
        detailed = await call_ok(client, "list_jobs", {"limit": 2, "detail": True})
        assert [d["job_id"] for d in detailed["details"]] == [j["job_id"] for j in detailed["jobs"]]
        assert detailed["details"][0]["spec"]["plan"]["rendered"].startswith("#!/bin/bash")
        refused = await call_error(client, "list_jobs", {"limit": 20, "detail": True})
        assert "accepted: at most 10 full views a page" in refused


async def test_a_row_takes_only_short_text_from_a_jobs_spec(app: App) -> None:
    store = JobStore(app.settings.db_path)
    record = remote_job(1, app.settings.home)
    store.insert(record.model_copy(update={"spec": {"backend": {"evil": 1}, "name": "n" * 10_000, "training_spec": 7}}))
    async with Client(create_test_suite(app), mode="legacy") as client:
        (row,) = (await call_ok(client, "list_jobs", {}))["jobs"]
        assert row["backend"] is None and row["name"] == "n" * 100
