"""servers/engines/admission.py without MCP: the rule, the decision flow (ask, token ceiling, the person's approval
in the store), the audit records, the approval's life (taken, used, given back) and the quotas any job meets."""

import json
from pathlib import Path

import pytest

from servers.core.errors import InputError, QuotaError
from servers.core.settings import Settings
from servers.engines import admission
from servers.engines.admission import APPROVED_BY_PERSON, Approvals, Launch

pytestmark = [pytest.mark.anyio]


def launch(gpu_hours: float = 2.0, node_hours: float = 2.0, plan_id: str = "0123456789abcdef") -> Launch:
    return Launch(
        plan_id=plan_id,
        gpu_hours=gpu_hours,
        node_hours=node_hours,
        message="start it?",
        summary={"estimated_gpu_hours": gpu_hours},
        plan_tool="plan_x",
        submit_tool="submit_x",
        token_name="x_token",
    )


def answering(answer: bool | None) -> admission.Ask:
    asked: list[Launch] = []

    async def ask(what: Launch) -> bool | None:
        asked.append(what)
        return answer

    ask.asked = asked  # type: ignore[attr-defined]
    return ask


def events(settings: Settings) -> list[dict]:
    path = settings.home / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize(
    ("backend", "gpus_per_node", "gpu_hours", "node_hours", "needed"),
    [
        ("local", 1, 1.5, 1.5, True),  # GPU-hours above 1.0: everywhere
        ("slurm", 1, 0.5, 5.0, False),  # GPUs asked for: decided on GPU-hours only
        ("slurm", 0, 0.0, 1.5, True),  # no GPU on a cluster: the node-hours rule
        ("ray", 0, 0.0, 1.5, True),
        ("local", 0, 0.0, 1.5, False),  # this machine's own cores cost nothing
        ("slurm", 0, 0.0, 1.0, False),  # at the ceiling, not above
    ],
)
def test_the_rule(
    settings: Settings, backend: str, gpus_per_node: int, gpu_hours: float, node_hours: float, needed: bool
) -> None:
    got = admission.confirmation_needed(
        settings, backend=backend, gpus_per_node=gpus_per_node, gpu_hours=gpu_hours, node_hours=node_hours
    )
    assert got is needed


def test_hours_are_jobs_nodes_gpus_and_wall_time() -> None:
    assert admission.hours(jobs=4, nodes=2, gpus_per_node=8, wall_s=1800) == (32.0, 4.0)
    assert admission.hours(jobs=3, nodes=1, gpus_per_node=0, wall_s=600) == (0.0, 0.5)


async def test_the_person_answers_when_they_can_be_asked(settings: Settings) -> None:
    yes, no = answering(True), answering(False)
    assert (
        await admission.decide(settings, launch(), ask=yes, has_token=False) == "confirmed by the person (elicitation)"
    )
    assert await admission.decide(settings, launch(), ask=no, has_token=True) is None
    assert [a.plan_id for a in yes.asked] == ["0123456789abcdef"]  # type: ignore[attr-defined]
    assert Approvals(settings).pending() == []  # nothing waits for the terminal


async def test_no_asking_and_no_token_is_told_to_plan_first(settings: Settings) -> None:
    with pytest.raises(InputError, match="call plan_x, show the plan to the person, then submit with its x_token"):
        await admission.decide(settings, launch(), ask=admission.never_ask, has_token=False)
    assert Approvals(settings).pending() == []


async def test_a_token_alone_approves_only_up_to_the_auto_approve_ceiling(settings: Settings) -> None:
    relaxed = settings.model_copy(update={"auto_approve_gpu_hours": 3.0})
    how = await admission.decide(relaxed, launch(2.0, 2.0), ask=admission.never_ask, has_token=True)
    assert how == "auto-approved: at most LLM_INFRA_MCP_AUTO_APPROVE_GPU_HOURS=3"
    # node-hours count against the same ceiling: 0 GPU-hours but 4 node-hours is above it
    with pytest.raises(InputError, match="llm-infra-mcp approve"):
        await admission.decide(relaxed, launch(0.0, 4.0), ask=admission.never_ask, has_token=True)


async def test_above_the_ceiling_the_person_approves_once_in_a_terminal(settings: Settings) -> None:
    wanted = launch()
    with pytest.raises(InputError) as refused:
        await admission.decide(settings, wanted, ask=admission.never_ask, has_token=True)
    text = str(refused.value)
    assert f"llm-infra-mcp approve {wanted.plan_id}" in text and "call submit_x again with the same x_token" in text
    assert "2 GPU-hours, above LLM_INFRA_MCP_CONFIRM_ABOVE_GPU_HOURS=1" in text
    approvals = Approvals(settings)
    assert [r["plan_id"] for r in approvals.pending()] == [wanted.plan_id]
    assert approvals.approve(wanted.plan_id, "a person")
    assert await admission.decide(settings, wanted, ask=admission.never_ask, has_token=True) == APPROVED_BY_PERSON
    assert approvals.get(wanted.plan_id)["used_by_job"] == "(starting)"
    # taken: a second launch of the same plan is not approved by it
    with pytest.raises(InputError, match="llm-infra-mcp approve"):
        await admission.decide(settings, wanted, ask=admission.never_ask, has_token=True)


async def test_the_refusal_names_the_node_hours_rule_when_it_is_the_one_that_applies(settings: Settings) -> None:
    with pytest.raises(InputError) as refused:
        await admission.decide(settings, launch(0.0, 5.0), ask=admission.never_ask, has_token=True)
    text = str(refused.value)
    assert "5 node-hours, no GPU, above LLM_INFRA_MCP_CONFIRM_ABOVE_NODE_HOURS=1" in text
    assert "GPU-hours, above" not in text  # not "0 GPU-hours above a GPU-hour ceiling": its own figures deny that


async def test_admit_records_the_answer_and_the_approval_is_used_or_given_back(settings: Settings) -> None:
    common = {"who": "tester", "audit": {"plan_hash": "h"}, "declined": "not started: declined"}
    free = await admission.admit(settings, launch(), needed=False, ask=answering(False), has_token=False, **common)
    assert free.how is None and not free.holds_approval and events(settings) == []
    with pytest.raises(InputError, match="not started: declined"):
        await admission.admit(settings, launch(), needed=True, ask=answering(False), has_token=True, **common)
    assert [(e["event"], e["how"], e["plan_hash"]) for e in events(settings)] == [
        ("decline", "declined by the person", "h")
    ]
    approvals = Approvals(settings)
    approvals.request("0123456789abcdef", {"estimated_gpu_hours": 2.0})
    approvals.approve("0123456789abcdef", "a person")
    taken = await admission.admit(settings, launch(), needed=True, ask=admission.never_ask, has_token=True, **common)
    assert taken.holds_approval and events(settings)[-1]["event"] == "confirm"
    await taken.started(settings, None)  # the start failed: the approval stands again
    assert approvals.get("0123456789abcdef")["used_by_job"] is None
    again = await admission.admit(settings, launch(), needed=True, ask=admission.never_ask, has_token=True, **common)
    await again.started(settings, "job-1")
    assert approvals.get("0123456789abcdef")["used_by_job"] == "job-1"
    assert approvals.pending() == []


async def test_elicit_asker_reads_a_context_without_mcp() -> None:
    class Answer:
        def __init__(self, action: str, confirm: bool) -> None:
            self.action, self.data = action, type("Data", (), {"confirm": confirm})()

    class Ctx:
        def __init__(self, elicitation: object, answer: object) -> None:
            self.client_capabilities = type("Caps", (), {"elicitation": elicitation})()
            self.answer, self.forms = answer, []

        async def elicit(self, message: str, schema: type) -> object:
            self.forms.append(schema.model_json_schema()["properties"]["confirm"]["description"])
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    probes = launch().model_copy(update={"confirm_label": "Start these probe jobs"})
    accepting = Ctx(object(), Answer("accept", True))
    assert await admission.elicit_asker(accepting)(probes) is True
    assert accepting.forms == ["Start these probe jobs"]
    assert await admission.elicit_asker(Ctx(object(), Answer("accept", False)))(launch()) is False
    assert await admission.elicit_asker(Ctx(object(), Answer("decline", True)))(launch()) is False
    assert await admission.elicit_asker(Ctx(None, Answer("accept", True)))(launch()) is None  # cannot elicit
    assert await admission.elicit_asker(Ctx(object(), RuntimeError("gone")))(launch()) is None


def test_the_quotas_any_job_meets(settings: Settings) -> None:
    tight = settings.model_copy(update={"max_job_wall_s": 600.0, "max_gpus_per_job": 4, "max_concurrent_gpus": 4})
    admission.check_wall(tight, 600)
    with pytest.raises(QuotaError, match="probe_wall_s 601 s is above the quota of 600 s"):
        admission.check_wall(tight, 601, name="probe_wall_s")
    admission.check_gpus_per_job(tight, 4)
    with pytest.raises(QuotaError, match="a probe job would use 5 GPUs; the quota is 4 per job"):
        admission.check_gpus_per_job(tight, 5, what="a probe job")
    admission.check_gpus_here(tight, 2, 2, shared=False)
    with pytest.raises(QuotaError, match="2 GPUs are in use and this job needs 3"):
        admission.check_gpus_here(tight, 3, 2, shared=False)
    admission.check_gpus_here(tight, 3, 2, shared=True)  # shared GPUs count once
    with pytest.raises(QuotaError, match="shared or not"):
        admission.check_gpus_here(tight, 5, 0, shared=True)


def test_engines_admission_imports_no_server_package() -> None:
    import ast

    source = Path(admission.__file__).read_text()
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    servers = {m for m in imported if m and m.startswith("servers.")}
    assert servers and all(m.startswith("servers.core.") for m in servers), servers
    assert not any(m and m.split(".")[0] == "mcp" for m in imported)
