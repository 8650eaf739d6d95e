"""What tools/list publishes (servers.core.schemas) and the cache that lets a later start skip generating it
(servers.core.toolcache): small, true to what the server enforces and returns, and the same from the cache as
from a fresh build."""

import json
import logging
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client
from pydantic import BaseModel, Field

from servers.core import toolcache
from servers.core.arguments import StrictArguments
from servers.core.mcp_layer import App
from servers.core.schemas import description_text, published_input, published_output
from servers.core.settings import Settings
from servers.suite import create_server
from tests.conftest import CHILD_ENV

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


class Color(str, Enum):
    red = "red"
    blue = "blue"


class Inner(BaseModel):
    """A part,
    described on two lines."""

    size: int = Field(ge=0, le=10, description="a size")
    label: str | None = None
    code: str = Field(default="ab", pattern="^[a-z]{2}$")
    warm: int = Field(default=3, ge=2, le=1000)
    shift: float = Field(default=0.0, ge=-1e12, le=5)


class Outer(BaseModel):
    name: str = Field(max_length=4096, title="Name", description="what it is called")
    count: int | None = Field(default=None, ge=0, le=10**9)
    ratio: float = Field(default=0.5, gt=0, lt=1)
    color: Color = Color.red
    mode: Literal["a", "b"] | None = None
    inner: Inner | None = None
    inners: list[Inner] = Field(default_factory=list, max_length=64)
    words: list[str] = []
    table: dict[str, float] = {}
    either: int | str = 0
    anything: Any = None
    flag: bool = False


def test_the_published_input_drops_what_a_model_does_not_need_and_keeps_what_it_does() -> None:
    full = Outer.model_json_schema()
    published = published_input(full)
    text = json.dumps(published)
    assert '"title"' not in text
    props = published["properties"]
    assert props["name"] == {"description": "what it is called", "type": "string"}  # cap and title gone
    assert props["count"] == {"type": "integer"}  # optional: the value's own schema; its floor 0 and 1e9 cap gone
    assert props["ratio"] == {"default": 0.5, "exclusiveMaximum": 1, "type": "number"}  # exclusiveMinimum 0 gone
    assert props["mode"] == {"enum": ["a", "b"], "type": "string"}
    assert props["inner"] == {"$ref": "#/$defs/Inner"}
    assert "default" not in props["inners"] and "maxItems" not in props["inners"]
    assert published["$defs"]["Inner"]["description"] == "A part, described on two lines."
    inner = published["$defs"]["Inner"]["properties"]
    assert inner["size"] == {"description": "a size", "maximum": 10, "type": "integer"}  # a small bound stays
    assert inner["code"] == {"default": "ab", "type": "string"}  # patterns guard, they are not published
    assert inner["warm"] == {"default": 3, "minimum": 2, "type": "integer"}  # a floor other than 0/1 stays
    assert inner["shift"] == {"default": 0.0, "maximum": 5, "type": "number"}  # a bound beyond a million goes
    assert published["properties"]["flag"] == {"type": "boolean"}
    # what the full schema accepts without nulls the published one accepts (it only drops keywords), and more
    value = {"name": "x" * 50, "count": 10, "inner": {"size": 3}, "inners": [{"size": 1}] * 3, "words": []}
    jsonschema.validate(value, full)
    jsonschema.validate(value, published)
    jsonschema.validate({**value, "name": "x" * 5000}, published)  # the server refuses this one, with the cap


def test_the_published_output_is_the_top_level_and_every_result_validates_against_it() -> None:
    published = published_output(Outer.model_json_schema())
    assert published["title"] == "Outer"
    assert published["required"] == ["name"]
    props = published["properties"]
    assert props["count"] == {"type": ["integer", "null"]}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["inner"] == {"type": ["object", "null"]}
    assert props["inners"] == {"type": "array"}
    assert props["words"] == {"type": "array", "items": {"type": "string"}}
    assert props["either"] == {"type": ["integer", "string"]}
    assert props["anything"] == {}
    assert len(json.dumps(published)) < len(json.dumps(Outer.model_json_schema())) / 2


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    name=st.text(max_size=20),
    count=st.none() | st.integers(0, 10**9),
    ratio=st.floats(0.01, 0.99),
    color=st.sampled_from(list(Color)),
    mode=st.none() | st.sampled_from(["a", "b"]),
    inner=st.none() | st.builds(Inner, size=st.integers(0, 10), label=st.none() | st.text(max_size=5)),
    words=st.lists(st.text(max_size=5), max_size=3),
    either=st.integers(-5, 5) | st.text(max_size=3),
    anything=st.none() | st.integers() | st.lists(st.integers(), max_size=2),
)
def test_any_instance_validates_against_its_published_output_schema(**fields: Any) -> None:
    published = published_output(Outer.model_json_schema())
    jsonschema.validate(Outer(**fields).model_dump(mode="json"), published)


def test_descriptions_lose_their_code_indentation() -> None:
    doc = """First line of a tool,
        continued here.

        A second paragraph
          indented more.
        """
    assert description_text(doc) == "First line of a tool, continued here.\nA second paragraph indented more."


def _app(home: Path) -> App:
    return App(Settings(home=home, allowed_roots=[home]), owner="test", child_env=CHILD_ENV)


async def _listing(server: Any, mode: str) -> list[dict[str, Any]]:
    async with Client(server, mode=mode) as client:
        return [t.model_dump(mode="json", by_alias=True) for t in (await client.list_tools()).tools]


async def test_a_start_from_the_cache_publishes_and_behaves_exactly_as_a_fresh_build(tmp_path: Path, mode: str) -> None:
    fresh_server = create_server(_app(tmp_path / "fresh"))
    fresh = toolcache.for_server(fresh_server)
    assert fresh is not None and fresh.built and not fresh.loaded and fresh.path.is_file()
    cached_server = create_server(_app(tmp_path / "fresh"))
    cached = toolcache.for_server(cached_server)
    assert cached is not None and not cached.built and set(cached.loaded) == set(fresh.built)
    # nothing was generated: every tool waits for its first call to build its models, and the diagnostics part
    # (tools only) is not even registered until then
    waiting = {t.name: t.fn_metadata for t in cached_server._tool_manager.list_tools()}
    assert all(m._source is not None or m._loader is not None for m in waiting.values())
    assert waiting["explain_xid"]._loader is not None and waiting["get_job"]._source is not None
    assert await _listing(cached_server, mode) == await _listing(fresh_server, mode)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("explain_xid", {"code": 79}),
        ("convert_compute_units", {"value": 1000, "unit": "gpu_hours", "gpu": "H100-SXM"}),
        ("list_jobs", {"limit": "many"}),
        ("plan_training_job", {"spec": {"recipe": "tiny-gpt", "no_such_field": 1}}),
        ("fit_scaling_law", {"model": "scalerl", "data": {"points": [{"compute": True}]}}),
    ]
    answers = []
    for server in (fresh_server, cached_server):
        async with Client(server, mode=mode) as client:  # the client validates structured content too
            results = [await client.call_tool(name, args) for name, args in calls]
            answers.append([r.model_dump(mode="json", by_alias=True) for r in results])
    assert answers[0] == answers[1]
    async with Client(cached_server, mode=mode) as client:  # a tool of the part not loaded yet: its full schema
        read = await client.read_resource("infra://tools/scan_kernel_log/output-schema")
        fresh_tool = fresh_server._tool_manager.get_tool("scan_kernel_log")
        assert json.loads(read.contents[0].text) == fresh_tool.fn_metadata.full_output_schema
    assert not answers[1][0]["isError"] and answers[1][0]["structuredContent"]
    assert not answers[1][1]["isError"] and answers[1][1]["structuredContent"]["flops"] > 0
    assert answers[1][2]["isError"] and "limit: got" in answers[1][2]["content"][0]["text"]


async def test_the_full_output_schema_is_a_resource(tmp_path: Path) -> None:
    server = create_server(_app(tmp_path))
    tool = server._tool_manager.get_tool("get_job")
    assert isinstance(tool.fn_metadata, StrictArguments)
    async with Client(server) as client:
        read = await client.read_resource("infra://tools/get_job/output-schema")
        full = json.loads(read.contents[0].text)
        assert full == tool.fn_metadata.full_output_schema and "$defs" in full
        assert set(full["properties"]) == set(tool.output_schema["properties"])
        with pytest.raises(Exception, match="no such tool"):
            await client.read_resource("infra://tools/nope/output-schema")


def test_a_cache_of_other_code_or_a_broken_file_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = toolcache.ToolCache(tmp_path, digest="a" * 32)
    cache.put("t", {"description": "d", "input": {}, "output": None, "context": None, "title": "T", "annotations": {}})
    cache.save()
    assert toolcache.ToolCache(tmp_path, digest="a" * 32).get("t") is not None
    assert toolcache.ToolCache(tmp_path, digest="b" * 32).get("t") is None  # another digest: another file
    (tmp_path / f"tools-{'c' * 32}.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        broken = toolcache.ToolCache(tmp_path, digest="c" * 32)
    assert broken.get("t") is None and "not used" in caplog.text
    broken.put("t", {"description": "d", "input": {}, "output": None, "context": None, "title": "T", "annotations": {}})
    broken.save()  # replaces the broken file and removes the other digests' files
    assert [p.name for p in tmp_path.glob("tools-*.json")] == [f"tools-{'c' * 32}.json"]


def test_the_digest_follows_the_code_and_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    first = toolcache.code_digest()
    assert toolcache.code_digest() == first
    monkeypatch.setenv("LLM_INFRA_MCP_MAX_CONCURRENT_JOBS", "3")
    assert toolcache.code_digest() != first
    monkeypatch.delenv("LLM_INFRA_MCP_MAX_CONCURRENT_JOBS")
    monkeypatch.setattr(toolcache, "_SOURCES_AT_START", "0" * 64)  # a process that started with other sources
    assert toolcache.code_digest() != first


def test_a_process_whose_files_changed_since_it_started_writes_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may hold modules older than the files: what it built must not be kept under the files' digest."""
    entry = {"description": "d", "input": {}, "output": None, "context": None, "title": "T", "annotations": {}}
    monkeypatch.setattr(toolcache, "_SOURCES_AT_START", "0" * 64)
    changed = toolcache.ToolCache(tmp_path)
    changed.put("t", entry)
    changed.save()
    assert not list(tmp_path.glob("tools-*.json"))
    monkeypatch.setattr(toolcache, "_SOURCES_AT_START", toolcache.source_digest())
    same = toolcache.ToolCache(tmp_path)
    same.put("t", entry)
    same.save()
    assert toolcache.ToolCache(tmp_path).get("t") is not None


async def test_prompts_from_the_cache_are_the_same_and_read_their_file_at_first_use(tmp_path: Path) -> None:
    fresh = create_server(_app(tmp_path / "p"))
    cached = create_server(_app(tmp_path / "p"))
    cache = toolcache.for_server(cached)
    assert cache is not None and cache.prompts()
    listings, rendered = [], []
    for server in (fresh, cached):
        async with Client(server) as client:
            listings.append([p.model_dump(mode="json") for p in (await client.list_prompts()).prompts])
            got = await client.get_prompt("triage-gpu-node", {"node": "n1", "symptom": "Xid 79"})
            rendered.append(got.model_dump(mode="json"))
    assert listings[0] == listings[1] and rendered[0] == rendered[1]


@pytest.mark.anyio
async def test_a_rewritten_cache_never_makes_prompts_get_read_a_file_of_its_choosing(tmp_path: Path) -> None:
    """Issue 21, 6: a job had rewritten the cache so that a prompt's path named a 0600 file outside the roots, and
    prompts/get returned it. A cached entry names its prompt file only, looked up in the package's prompts folder;
    an entry naming anything else is left out."""
    create_server(_app(tmp_path / "p"))  # writes the cache
    secret = tmp_path / "secret.md"
    secret.write_text("---\nname: stolen\n---\nTHE SECRET\n")
    secret.chmod(0o600)
    (path,) = (tmp_path / "p" / "cache").glob("tools-*.json")
    data = json.loads(path.read_text())
    planted = {"name": "stolen", "title": None, "description": "", "arguments": []}
    data["prompts"] += [
        {**planted, "path": str(secret)},
        {**planted, "file": str(secret)},
        {**planted, "file": "../x.md"},
    ]
    path.write_text(json.dumps(data))
    async with Client(create_server(_app(tmp_path / "p"))) as client:
        names = [p.name for p in (await client.list_prompts()).prompts]
        assert "stolen" not in names and "triage-gpu-node" in names
