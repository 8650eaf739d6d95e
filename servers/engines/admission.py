"""Admission: whether a job that holds GPUs or cluster nodes may start. One place for every such job (a training
launch, a sweep, the bandwidth check's probe jobs): what it costs at most, the rule that decides whether the person
must approve it, the store of their approvals, the ceiling a token alone approves, the decision flow, and the
quotas that apply to any job.

The flow (`decide`): a launch that needs the person is put to them by elicitation when the client can ask; else a
token (or, for a tool with no plan step, its arguments) stands for the plan and approves it alone only up to
LLM_INFRA_MCP_AUTO_APPROVE_GPU_HOURS (GPU-hours and node-hours both: the agent holds the token, so it cannot stand
for the person); above that the person approves it in a terminal (`llm-infra-mcp approve PLAN_ID`, the Approvals
store), once, within a day.

Plain module (no MCP): the MCP layer gives `decide` an "ask the person" callable (`elicit_asker` makes one from a
tool's Context by duck typing).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import Field

from servers.core.audit import AuditLog
from servers.core.db import connect, initialise
from servers.core.errors import InputError, QuotaError
from servers.core.models import Model
from servers.core.settings import Settings

APPROVED_BY_PERSON = "approved by the person (llm-infra-mcp approve)"
APPROVAL_TTL_S = 24 * 3600.0
PLAN_ID_PATTERN = re.compile(r"[0-9a-f]{16}")


# ---- cost and the rule ---------------------------------------------------------------------------------------------
def hours(*, jobs: int, nodes: int, gpus_per_node: int, wall_s: float) -> tuple[float, float]:
    """(GPU-hours, node-hours) at most of `jobs` jobs of `nodes` nodes each, each held for its wall-time limit."""
    node_hours = jobs * nodes * wall_s / 3600
    return gpus_per_node * node_hours, node_hours


def spec_plan_id(layout: str, spec: Any) -> str:
    """The approval id of a tool whose arguments stand for its plan: the digest of its normalised spec under its
    summary layout (another node, size or wall time: another plan)."""
    import hashlib

    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{layout}\n{canonical}".encode()).hexdigest()[:16]


def confirmation_needed(
    settings: Settings, *, backend: str, gpus_per_node: int, gpu_hours: float, node_hours: float
) -> bool:
    """Whether a launch needs the person: above LLM_INFRA_MCP_CONFIRM_ABOVE_GPU_HOURS, or, on a cluster with no
    GPUs asked for (GPU-hours 0, yet every node held costs), above LLM_INFRA_MCP_CONFIRM_ABOVE_NODE_HOURS. A
    careful operator's rule: nodes count whether or not their GPUs are asked for."""
    if gpu_hours > settings.confirm_above_gpu_hours:
        return True
    return backend != "local" and gpus_per_node == 0 and node_hours > settings.confirm_above_node_hours


# ---- quotas any job meets ------------------------------------------------------------------------------------------
def check_wall(settings: Settings, wall_s: float, *, name: str = "max_wall_s") -> None:
    if wall_s > settings.max_job_wall_s:
        raise QuotaError(
            f"{name} {wall_s:g} s is above the quota of {settings.max_job_wall_s:g} s (LLM_INFRA_MCP_MAX_JOB_WALL_S)"
        )


def check_gpus_per_job(settings: Settings, gpus: int, *, what: str = "the job") -> None:
    if gpus > settings.max_gpus_per_job:
        raise QuotaError(
            f"{what} would use {gpus} GPUs; the quota is {settings.max_gpus_per_job} per job "
            "(LLM_INFRA_MCP_MAX_GPUS_PER_JOB)"
        )


def check_gpus_here(settings: Settings, gpus: int, in_use: int, *, shared: bool) -> None:
    """The GPUs of this machine: a job asking for more than may be held at once is refused, shared or not; an
    unshared job also needs them free of the other jobs'."""
    if gpus > settings.max_concurrent_gpus:
        raise QuotaError(
            f"the job would use {gpus} GPUs and at most {settings.max_concurrent_gpus} may be in use at once, "
            "shared or not (LLM_INFRA_MCP_MAX_CONCURRENT_GPUS)"
        )
    if gpus and in_use + gpus > settings.max_concurrent_gpus and not shared:
        raise QuotaError(
            f"{in_use} GPUs are in use and this job needs {gpus}; at most "
            f"{settings.max_concurrent_gpus} at once (LLM_INFRA_MCP_MAX_CONCURRENT_GPUS)"
        )


# ---- the person's approvals ----------------------------------------------------------------------------------------
_APPROVALS_SCHEMA = """
CREATE TABLE IF NOT EXISTS launch_approvals (
    plan_id TEXT PRIMARY KEY,
    summary TEXT NOT NULL,
    created_at REAL NOT NULL,
    approved_at REAL,
    approved_by TEXT,
    used_by_job TEXT
);
"""


class Approvals:
    """A person's approval of one plan, given outside the MCP session (`llm-infra-mcp approve PLAN_ID` in a
    terminal), for clients that cannot ask the person themselves. An approval is for one launch of exactly that
    plan and lapses after a day; the agent has no tool that gives one."""

    def __init__(self, settings: Settings) -> None:
        self.db_path = settings.db_path
        initialise(self.db_path, _APPROVALS_SCHEMA)

    def request(self, plan_id: str, summary_fields: dict[str, Any]) -> None:
        """Record that this plan waits for a person (again, if an earlier approval of it was used). The summary is
        what `llm-infra-mcp approve` shows; it must hold estimated_gpu_hours."""
        summary = json.dumps(summary_fields, default=str)
        with connect(self.db_path) as conn:
            conn.execute(
                "INSERT INTO launch_approvals (plan_id, summary, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT(plan_id) DO UPDATE SET summary = excluded.summary, created_at = excluded.created_at, "
                "approved_at = NULL, approved_by = NULL, used_by_job = NULL WHERE used_by_job IS NOT NULL",
                (plan_id, summary, time.time()),
            )

    def pending(self) -> list[dict[str, Any]]:
        with connect(self.db_path) as conn:
            rows = conn.execute(
                "SELECT * FROM launch_approvals WHERE used_by_job IS NULL AND created_at > ? ORDER BY created_at",
                (time.time() - APPROVAL_TTL_S,),
            ).fetchall()
        return [dict(r) for r in rows]

    def get(self, plan_id: str) -> dict[str, Any] | None:
        with connect(self.db_path) as conn:
            row = conn.execute("SELECT * FROM launch_approvals WHERE plan_id = ?", (plan_id,)).fetchone()
        return None if row is None else dict(row)

    def approve(self, plan_id: str, who: str) -> bool:
        with connect(self.db_path) as conn:
            cursor = conn.execute(
                "UPDATE launch_approvals SET approved_at = ?, approved_by = ? "
                "WHERE plan_id = ? AND used_by_job IS NULL",
                (time.time(), who, plan_id),
            )
        return cursor.rowcount > 0

    def take(self, plan_id: str) -> bool:
        """Whether the person approved this plan (within the last day, not used yet); marks it in use."""
        with connect(self.db_path) as conn:
            cursor = conn.execute(
                "UPDATE launch_approvals SET used_by_job = '(starting)' WHERE plan_id = ? AND approved_at > ? "
                "AND used_by_job IS NULL",
                (plan_id, time.time() - APPROVAL_TTL_S),
            )
        return cursor.rowcount > 0

    def used(self, plan_id: str, job_id: str | None) -> None:
        """Bind a taken approval to the job it started (None: the start failed, the approval stands again)."""
        with connect(self.db_path) as conn:
            if job_id is None:
                conn.execute(
                    "UPDATE launch_approvals SET used_by_job = NULL WHERE plan_id = ? AND used_by_job = '(starting)'",
                    (plan_id,),
                )
            else:
                conn.execute("UPDATE launch_approvals SET used_by_job = ? WHERE plan_id = ?", (job_id, plan_id))


# ---- the decision --------------------------------------------------------------------------------------------------
class Launch(Model):
    """What a launch that needs the person's approval shows them, whatever it is (a job, a sweep, probe jobs)."""

    plan_id: str
    gpu_hours: float
    node_hours: float = Field(default=0.0, description="Nodes x wall-time limit: the token-alone ceiling bounds both")
    message: str
    summary: dict[str, Any]
    plan_tool: str
    submit_tool: str
    token_name: str
    confirm_label: str = Field(default="Start this training job", description="The elicitation form's one box")


# The person's answer: True to start, False declined, None when they could not be asked (no elicitation).
Ask = Callable[[Launch], Awaitable[bool | None]]


async def never_ask(launch: Launch) -> None:
    """The asker of a caller that cannot reach the person."""
    return None


def elicit_asker(ctx: Any) -> Ask:
    """An Ask from an MCP tool's Context (duck-typed: `client_capabilities` and `elicit`): an elicitation form with
    one confirm box when the client declared elicitation; None when it did not, or the elicitation failed."""

    async def ask(launch: Launch) -> bool | None:
        caps = getattr(ctx, "client_capabilities", None)
        if caps is None or getattr(caps, "elicitation", None) is None:
            return None
        try:
            answer = await ctx.elicit(launch.message, _form(launch.confirm_label))
        except Exception:
            return None
        if answer is None:
            return None
        return answer.action == "accept" and bool(getattr(answer.data, "confirm", False))

    return ask


_FORMS: dict[str, type[Model]] = {}


def _form(label: str) -> type[Model]:
    """The elicitation form (one boolean, `confirm`) with this label; one class per label, made once."""
    from pydantic import create_model

    if label not in _FORMS:
        fields: dict[str, Any] = {"confirm": (bool, Field(description=label))}
        _FORMS[label] = create_model("Confirmation", __base__=Model, **fields)
    return _FORMS[label]


def approval_needed(settings: Settings, launch: Launch) -> str:
    """What the person must do to let a launch start when the client cannot ask them."""
    from servers.core.settings import default_home

    home = "" if settings.home == default_home().resolve() else f"LLM_INFRA_MCP_HOME={settings.home} "
    if launch.gpu_hours > settings.confirm_above_gpu_hours or launch.node_hours <= settings.confirm_above_node_hours:
        above = f"up to {launch.gpu_hours:.3g} GPU-hours, above LLM_INFRA_MCP_CONFIRM_ABOVE_GPU_HOURS="
        above += f"{settings.confirm_above_gpu_hours:g}"
    else:  # no GPU asked for: the node-hours rule
        above = f"up to {launch.node_hours:.3g} node-hours, no GPU, above LLM_INFRA_MCP_CONFIRM_ABOVE_NODE_HOURS="
        above += f"{settings.confirm_above_node_hours:g}"
    return (
        f"not started: this launch ({above}) needs the person's approval, and this client cannot ask them. Ask the "
        f"person to run, in a terminal on this machine: `{home}llm-infra-mcp approve {launch.plan_id}` (it shows "
        f"the plan and asks), then call {launch.submit_tool} again with the same {launch.token_name}. An agent "
        "cannot approve its own launch"
    )


async def decide(settings: Settings, launch: Launch, *, ask: Ask, has_token: bool) -> str | None:
    """How a launch that needs the person was approved, or None when the person declined. Raises InputError when
    nobody approved it: a client that cannot ask and has no token is told to plan first; above the token-alone
    ceiling the approval is requested and the person is told how to give it."""
    from anyio import to_thread

    answer = await ask(launch)
    if answer is not None:
        return "confirmed by the person (elicitation)" if answer else None
    if not has_token:
        raise InputError(
            f"this launch (up to {launch.gpu_hours:.3g} GPU-hours) needs the person's approval and this client "
            f"cannot ask: call {launch.plan_tool}, show the plan to the person, then submit with its "
            f"{launch.token_name}"
        )
    if max(launch.gpu_hours, launch.node_hours) <= settings.auto_approve_gpu_hours:
        return f"auto-approved: at most LLM_INFRA_MCP_AUTO_APPROVE_GPU_HOURS={settings.auto_approve_gpu_hours:g}"
    approvals = Approvals(settings)
    if await to_thread.run_sync(approvals.take, launch.plan_id):
        return APPROVED_BY_PERSON
    await to_thread.run_sync(approvals.request, launch.plan_id, launch.summary)
    raise InputError(approval_needed(settings, launch))


class Admission(Model):
    """A launch let through: how (None: it needed nobody), and whether it holds the person's approval, which the
    start then uses (`started`) or gives back (`started(None)`, the start failed)."""

    plan_id: str
    how: str | None = None

    @property
    def holds_approval(self) -> bool:
        return self.how == APPROVED_BY_PERSON

    async def started(self, settings: Settings, job_id: str | None) -> None:
        from anyio import to_thread

        if self.holds_approval:
            await to_thread.run_sync(Approvals(settings).used, self.plan_id, job_id)


async def admit(
    settings: Settings,
    launch: Launch,
    *,
    needed: bool,
    ask: Ask,
    has_token: bool,
    who: str,
    audit: dict[str, Any],
    declined: str,
) -> Admission:
    """`decide` for a launch that needs the person (`needed`), its answer in the audit log (confirm or decline,
    with `audit`'s fields); InputError(`declined`) when the person declined. The caller starts the job, then calls
    `started` with its id (or None when the start failed)."""
    if not needed:
        return Admission(plan_id=launch.plan_id)
    how = await decide(settings, launch, ask=ask, has_token=has_token)
    AuditLog(settings).record("confirm" if how else "decline", who=who, **audit, how=how or "declined by the person")
    if not how:
        raise InputError(declined)
    return Admission(plan_id=launch.plan_id, how=how)
