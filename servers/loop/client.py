"""The loop's MCP client: it starts `llm-infra-mcp serve suite` over stdio (exactly as Claude Desktop would), calls
tools, and records every call (its inputs, whether it succeeded, the text summary and the structured result) so
that study.json can show what the loop saw. A tool error is never fatal here: it is recorded, and the caller
decides whether the study can go on without that result.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

# What the server needs from this process's environment: its settings, where the default state directory is, the
# cluster engines' configuration, and the import path (a checkout that is not installed).
FORWARDED_PREFIXES = ("LLM_INFRA_MCP_", "SLURM_", "RAY_")
FORWARDED_NAMES = ("XDG_STATE_HOME", "PYTHONPATH", "TMPDIR", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES")
SECRET_ARGS = ("sweep_token", "plan_token")
WAIT_CALL_S = 30.0  # one wait_for_job call (the tool allows 50; clients cut calls at about a minute)


class ToolCallError(Exception):
    """A tool answered with an error result; `message` is its text."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"{tool}: {message}")
        self.tool = tool
        self.message = message


@dataclass
class CallRecord:
    index: int
    tool: str
    args: dict[str, Any]
    ok: bool
    text: str
    result: Any
    started_at: float
    duration_s: float


@dataclass
class SuiteClient:
    """Calls the suite's tools and keeps the record of every call."""

    client: Client
    say: Callable[[str], None] = print
    calls: list[CallRecord] = field(default_factory=list)

    async def call(self, tool: str, args: dict[str, Any] | None = None, *, progress: Any = None) -> dict[str, Any]:
        """The tool's structured result; ToolCallError when it answered with an error."""
        result, _ = await self._call(tool, args or {}, progress)
        return result

    async def call_image(self, tool: str, args: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
        """The tool's structured result and the first PNG image of its content (None when it sent none)."""
        return await self._call(tool, args, None, want_image=True)

    async def _call(
        self, tool: str, args: dict[str, Any], progress: Any, *, want_image: bool = False
    ) -> tuple[dict[str, Any], bytes | None]:
        started = time.time()
        t0 = time.monotonic()
        try:
            result = await self.client.call_tool(tool, args, progress_callback=progress)
        except Exception as exc:  # the transport failed (the server died): recorded, then raised as a tool failure
            text = f"the call failed: {type(exc).__name__}: {exc}"
            self._record(tool, args, False, text, None, started, time.monotonic() - t0)
            raise ToolCallError(tool, text) from exc
        text = "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")
        image = None
        if want_image:
            for c in result.content:
                if getattr(c, "type", None) == "image" and getattr(c, "mime_type", None) == "image/png":
                    image = base64.b64decode(c.data)
                    break
        if result.is_error:
            self._record(tool, args, False, text, None, started, time.monotonic() - t0)
            raise ToolCallError(tool, text.strip() or "error without text")
        structured = result.structured_content or {}
        self._record(tool, args, True, text, structured, started, time.monotonic() - t0)
        return structured, image

    def _record(
        self, tool: str, args: dict[str, Any], ok: bool, text: str, result: Any, started: float, duration: float
    ) -> None:
        shown = {k: ("<token>" if k in SECRET_ARGS else v) for k, v in args.items()}
        self.calls.append(
            CallRecord(
                index=len(self.calls),
                tool=tool,
                args=shown,
                ok=ok,
                text=text,
                result=result,
                started_at=started,
                duration_s=round(duration, 4),
            )
        )

    async def _wait(self, job_id: str, label: str, limit_s: float, done: Callable[[dict[str, Any]], bool]) -> Any:
        """wait_for_job until `done(answer)` (at most limit_s in all, then the last answer), printing progress."""
        deadline = time.monotonic() + limit_s
        while True:
            remaining = deadline - time.monotonic()
            waited = await self.call(
                "wait_for_job",
                {"job_id": job_id, "wait_s": max(0.0, min(WAIT_CALL_S, remaining))},
                progress=self._progress(label),
            )
            if done(waited) or remaining <= 0:
                return waited

    async def wait_job(self, job_id: str, label: str, limit_s: float) -> dict[str, Any]:
        """wait_for_job until the job ends (at most limit_s in all, then the last view), printing progress."""
        return (await self._wait(job_id, label, limit_s, lambda w: bool(w["job"]["finished"])))["job"]

    async def full_result(self, job: dict[str, Any]) -> Any:
        """A finished job's whole result: the view's, or, when the view carries only part of it (result_truncated),
        the resource it names. ToolCallError when that resource cannot be read."""
        uri = job.get("result_uri")
        if not job.get("result_truncated") or not isinstance(uri, str):
            return job.get("result")
        try:
            contents = (await self.client.read_resource(uri)).contents
        except Exception as exc:  # the SDK raises its own error types for a resource error
            raise ToolCallError("resources/read", f"{uri}: {exc}") from exc
        text = getattr(contents[0], "text", None) if contents else None
        if not isinstance(text, str):
            raise ToolCallError("resources/read", f"{uri}: no text content")
        return json.loads(text)

    async def wait_sweep(self, sweep_id: str, label: str, limit_s: float) -> dict[str, Any]:
        """wait_for_job on a sweep id until every run ends (at most limit_s in all), printing progress."""

        def done(waited: dict[str, Any]) -> bool:
            sweep = waited["sweep"]
            counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep["states"].items()))
            self.say(f"   {label}: {sweep['finished']}/{sweep['runs']} runs done ({counts})")
            return not waited["timed_out"]

        return (await self._wait(sweep_id, label, limit_s, done))["sweep"]

    def _progress(self, label: str) -> Callable[[float, float | None, str | None], Any]:
        last = [0.0]

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            if progress - last[0] >= 5.0:  # one line every 5 s of waiting, not one per notification
                last[0] = progress
                self.say(f"   {label}: {message or ''} ({progress:.0f} s into this wait)")

        return on_progress


def server_environment() -> dict[str, str]:
    """The variables of this process that the server should see (merged over the SDK's safe defaults)."""
    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES) or k in FORWARDED_NAMES}


def suite_parameters() -> StdioServerParameters:
    """`python -m servers.cli serve suite` with this interpreter, as a stdio server."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "servers.cli", "serve", "suite"], env=server_environment()
    )


@contextlib.asynccontextmanager
async def connect(server: Any = None, say: Callable[[str], None] = print) -> AsyncIterator[SuiteClient]:
    """A SuiteClient on `server`: by default the suite over stdio; tests may pass an in-process server."""
    async with Client(server if server is not None else suite_parameters()) as client:
        yield SuiteClient(client, say)
