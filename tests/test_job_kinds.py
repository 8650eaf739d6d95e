"""What a job kind declares of itself instead of core knowing it: how a listing reads its jobs' backend and name
(JobKind.listed), and its poll interval (JobKind.poll_interval; the tasks' pollIntervalMs is tested in
test_tasks_extension.py)."""

from typing import Any

import pytest

from servers.core.job_tools import job_row
from servers.core.jobs import JobKind
from servers.core.jobstore import JobRecord, JobState
from servers.core.jobview import JobView, job_view


def view(kind: str, spec: dict[str, Any], tmp_path: Any) -> JobView:
    record = JobRecord(
        id=f"{kind}-1",
        kind=kind,
        spec=spec,
        state=JobState.QUEUED,
        created_at=1.0,
        timeout_s=60.0,
        owner="t",
        job_dir=str(tmp_path / "job"),
    )
    return job_view(record)


def test_a_kind_that_declares_nothing_is_listed_by_its_specs_own_backend_and_name(tmp_path: Any) -> None:
    row = job_row(view("probe", {"backend": "slurm", "name": "p1", "training_spec": {"name": "x"}}, tmp_path))
    assert (row.backend, row.name) == ("slurm", "p1")
    row = job_row(view("probe", {"training_spec": {"backend": "local", "name": "x"}}, tmp_path))
    assert (row.backend, row.name) == (None, None)  # core reads no other server's spec layout


def test_a_training_job_is_listed_as_launch_declares(tmp_path: Any) -> None:
    from servers.launch.server import JOB_KINDS

    kinds = {k.name: k for k in JOB_KINDS}
    local = view("training", {"training_spec": {"backend": "local", "name": "tiny"}}, tmp_path)
    assert (lambda r: (r.backend, r.name))(job_row(local, kinds["training"])) == ("local", "tiny")
    remote = view("training_remote", {"backend": "ray", "training_spec": {"backend": "ray", "name": "r"}}, tmp_path)
    assert (lambda r: (r.backend, r.name))(job_row(remote, kinds["training_remote"])) == ("ray", "r")


@pytest.mark.parametrize("listed", [lambda spec: 1 / 0, lambda spec: ["not", "a", "mapping"]])
def test_a_kind_whose_listing_fails_is_listed_by_its_spec(tmp_path: Any, listed: Any) -> None:
    kind = JobKind("probe", "m:f", "d", listed=listed)
    row = job_row(view("probe", {"backend": "b", "name": "n"}, tmp_path), kind)
    assert (row.backend, row.name) == ("b", "n")


def test_poll_interval() -> None:
    assert JobKind("a", "m:f", "d").poll_interval({}) is None
    assert JobKind("a", "m:f", "d", poll_s=2).poll_interval({}) == 2.0
    assert JobKind("a", "m:f", "d", poll_s=0).poll_interval({}) is None
    per_job = JobKind("a", "m:f", "d", poll_s=4.0, poll_s_of=lambda spec: spec.get("s"))
    assert per_job.poll_interval({"s": 0.5}) == 0.5 and per_job.poll_interval({}) == 4.0
    assert per_job.poll_interval({"s": float("inf")}) == 4.0 and per_job.poll_interval({"s": -1}) == 4.0
