"""Issue 21, defect 8: share_gpus escaped the GPU quota. With LLM_INFRA_MCP_MAX_CONCURRENT_GPUS=2 on an 8-GPU
machine, two jobs with share_gpus and gpus_per_node 8 were both given GPUs 0-7 (without share_gpus the plan was
refused). The rule now: the quota bounds the distinct GPUs active training jobs hold, shared or not (a GPU that
share_gpus jobs share counts once), and a job that asks for more GPUs than the quota is refused, shared or not.
A job without share_gpus gets GPUs no active job uses; one with it never gets a GPU a non-sharing job holds.

The machine's GPUs are faked (servers.core.machine.gpus_present); the jobs are real, of the engine's test kind
that sleeps, so the admission runs in the engine's transaction exactly as a training job's does."""

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from servers.core.errors import QuotaError
from servers.core.jobs import JobEngine
from servers.core.settings import Settings
from servers.engines.backend import BackendPlan, SubmitRequest
from servers.launch import training
from servers.launch.local import LocalBackend
from servers.launch.training import TrainingJobSpec
from tests.conftest import CHILD_ENV
from tests.jobkinds import TEST_KINDS

KIND = "test_sleep"  # the backend's jobs are this kind here: admission counts the GPUs of jobs of its own kind


@pytest.fixture
def eight_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import servers.core.machine as machine

    monkeypatch.setattr(machine, "gpus_present", lambda: 8)


def make_engine(settings: Settings, max_gpus: int) -> JobEngine:
    engine = JobEngine(
        settings.model_copy(update={"max_concurrent_gpus": max_gpus, "max_concurrent_jobs": 16}),
        owner="test",
        child_env=CHILD_ENV,
    )
    for kind in TEST_KINDS:
        engine.register_kind(kind)
    return engine


@pytest.fixture
def quota_of_two(settings: Settings, eight_gpus: None) -> Iterator[LocalBackend]:
    engine = make_engine(settings, 2)
    backend = LocalBackend(engine, kind=KIND)
    yield backend
    for job in engine.list_jobs(limit=100).jobs:
        engine.cancel(job.id)


def submit(backend: LocalBackend, key: str, gpus: int, *, share: bool) -> list[int]:
    """Submit a sleeping job that wants `gpus` GPUs; the GPUs it was given."""
    plan = BackendPlan(backend="local", argv=["true"], cwd="/", gpus_wanted=gpus)
    request = SubmitRequest(key=key, spec={"options": {"share_gpus": share}, "seconds": 120}, timeout_s=300)
    handle = backend.submit(plan, request)
    assert backend.engine is not None
    return list(backend.engine.get(handle.native_id).spec["gpus"])


def test_two_shared_jobs_of_eight_gpus_under_a_quota_of_two_are_refused(quota_of_two: LocalBackend) -> None:
    """The attack of the issue: each asks for all 8 GPUs with share_gpus; before, both got GPUs 0-7."""
    for key in ("first", "second"):
        with pytest.raises(QuotaError, match=r"needs 8 GPUs and at most 2 .*share_gpus does not change that"):
            submit(quota_of_two, key, 8, share=True)
    assert quota_of_two.engine is not None
    assert quota_of_two.engine.list_jobs(limit=10).total == 0  # nothing was admitted


def test_shared_gpus_count_once_against_the_quota(quota_of_two: LocalBackend) -> None:
    assert submit(quota_of_two, "a", 2, share=True) == [0, 1]
    assert submit(quota_of_two, "b", 2, share=True) == [0, 1]  # the same two: still 2 distinct GPUs in use
    assert submit(quota_of_two, "c", 1, share=True) in ([0], [1])  # no room for a third GPU: shares one
    with pytest.raises(QuotaError, match="2 GPUs are in use and this job needs 1; at most 2"):
        submit(quota_of_two, "d", 1, share=False)  # without share_gpus it needs a GPU of its own: over the quota


def test_a_shared_job_never_lands_on_a_non_sharing_jobs_gpus(settings: Settings, eight_gpus: None) -> None:
    engine = make_engine(settings, 3)
    backend = LocalBackend(engine, kind=KIND)
    try:
        assert submit(backend, "own", 2, share=False) == [0, 1]
        with pytest.raises(QuotaError, match=r"room for 1 more, and 0 are shared"):
            submit(backend, "greedy", 2, share=True)  # before: given GPUs 0-1 of the job that does not share
        assert submit(backend, "small", 1, share=True) == [2]
        with pytest.raises(QuotaError, match="3 GPUs are in use and this job needs 1; at most 3"):
            submit(backend, "late", 1, share=False)  # GPU 2 is shared, GPUs 0-1 are held: none free in the quota
    finally:
        for job in engine.list_jobs(limit=100).jobs:
            engine.cancel(job.id)


def _admit(backend: LocalBackend, wanted: int, share: bool, active: list[tuple[list[int], bool]]) -> list[int]:
    plan = BackendPlan(backend="local", argv=["true"], cwd="/", gpus_wanted=wanted)
    admit = backend._admission(plan, {"options": {"share_gpus": share}})
    assert admit is not None
    records: list[Any] = [SimpleNamespace(kind=KIND, spec={"gpus": g, "options": {"share_gpus": s}}) for g, s in active]
    return list(admit(records)["gpus"])


def test_the_admission_rule(settings: Settings, eight_gpus: None) -> None:
    backend = LocalBackend(make_engine(settings, 4), kind=KIND)
    # a job without share_gpus gets GPUs no active job uses, shared or not
    assert _admit(backend, 2, False, [([0, 1], True)]) == [2, 3]
    # a shared job: free GPUs first, as far as the quota allows, then the shared GPUs fewest jobs use
    assert _admit(backend, 3, True, [([0, 1], True), ([0], True), ([2], False)]) == [0, 1, 3]
    assert _admit(backend, 2, True, [([0, 1], True), ([0], True), ([2, 3], False)]) == [0, 1]
    with pytest.raises(QuotaError, match="at most 4 may be in use at once"):
        _admit(backend, 5, True, [])  # more than the quota, shared or not
    with pytest.raises(QuotaError, match="room for 0 more, and 1 are shared"):
        _admit(backend, 2, True, [([0], True), ([1, 2, 3], False)])


def test_the_plan_refuses_a_shared_job_above_the_quota(settings: Settings, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    quota = settings.model_copy(update={"max_concurrent_gpus": 2})
    spec = TrainingJobSpec(script=str(script), nproc_per_node=8, gpus_per_node=8, options={"share_gpus": True})
    with pytest.raises(QuotaError, match="at most 2 may be in use at once, shared or not"):
        training.plan(quota, spec, gpus_present=8, gpus_in_use=0)


def test_plans_count_a_shared_gpu_once_as_admission_does() -> None:
    from servers.core.jobstore import JobRecord, JobState
    from servers.launch.server import TRAINING_KIND, gpus_in_use

    def job(n: int, gpus: list[int]) -> JobRecord:
        return JobRecord(
            id=f"train-{n}",
            kind=TRAINING_KIND,
            spec={"gpus": gpus, "options": {"share_gpus": True}},
            state=JobState.RUNNING,
            created_at=0.0,
            timeout_s=60.0,
            owner="test",
            job_dir=f"/nowhere/{n}",
        )

    assert gpus_in_use([job(1, [0, 1]), job(2, [0, 1]), job(3, [2])]) == 3
