"""Settings, allowed roots, log chunks, prompts and resources: unit and property tests."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from mcp import Client

from servers.core.errors import InputError
from servers.core.jobstore import JobRecord, JobState
from servers.core.jobview import _trim_partial_utf8, read_log_chunk
from servers.core.mcp_layer import App
from servers.core.paths import resolve_inside_roots
from servers.core.resources import MIME_TYPES, PromptFile
from servers.core.settings import Settings, default_home


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LLM_INFRA_MCP_HOME", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_home() == tmp_path / "xdg" / "llm-infra-mcp"
    assert Settings().home == (tmp_path / "xdg" / "llm-infra-mcp").resolve()
    monkeypatch.chdir(tmp_path)
    assert Settings().roots() == [tmp_path.resolve(), Settings().home]
    monkeypatch.setenv("LLM_INFRA_MCP_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("LLM_INFRA_MCP_ALLOWED_ROOTS", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    monkeypatch.setenv("LLM_INFRA_MCP_MAX_CONCURRENT_JOBS", "2")
    monkeypatch.setenv("LLM_INFRA_MCP_HTTP_TOKEN", "s3cret")
    s = Settings()
    assert s.home == tmp_path / "h" and s.roots() == [tmp_path / "a", tmp_path / "b"]
    assert s.max_concurrent_jobs == 2 and s.http_token is not None and s.http_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)
    monkeypatch.setenv("LLM_INFRA_MCP_MAX_CONCURRENT_JOBS", "0")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        Settings()


def test_paths_inside_roots(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "train.py").write_text("")
    assert resolve_inside_roots("sub/train.py", [root]) == root / "sub" / "train.py"
    assert resolve_inside_roots(root / "sub", [root]) == root / "sub"
    with pytest.raises(InputError, match="outside the allowed roots"):
        resolve_inside_roots("../escape.py", [root])
    (root / "link").symlink_to(tmp_path)  # a symlink out of the root does not get out
    with pytest.raises(InputError, match="outside the allowed roots"):
        resolve_inside_roots("link/x.py", [root])
    with pytest.raises(InputError, match="LLM_INFRA_MCP_ALLOWED_ROOTS"):
        resolve_inside_roots("x", [])
    with pytest.raises(InputError, match="NUL"):
        resolve_inside_roots("a\x00b", [root])


def test_long_path_components_are_input_errors(tmp_path: Path) -> None:
    # ENAMETOOLONG used to surface as an internal error from whatever touched the path first
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(InputError, match="at most 255 bytes"):
        resolve_inside_roots("a" * 256, [root])
    with pytest.raises(InputError, match="at most 255 bytes"):
        resolve_inside_roots(f"sub/{'é' * 128}/x.csv", [root])  # 256 bytes in UTF-8
    with pytest.raises(InputError, match="at most 4096 bytes"):
        resolve_inside_roots("/".join(["d" * 200] * 25), [root])
    assert resolve_inside_roots("a" * 255, [root]) == root / ("a" * 255)
    with pytest.raises(InputError, match="not valid text"):
        resolve_inside_roots("bad\ud800name", [root])


def test_symlink_loops_are_input_errors(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "loop_a").symlink_to(root / "loop_b")
    (root / "loop_b").symlink_to(root / "loop_a")
    (root / "self").symlink_to(root / "self")
    for path in ("loop_a", "loop_a/x.csv", str(root / "self" / "y")):
        with pytest.raises(InputError, match="symlink loop"):
            resolve_inside_roots(path, [root])
    # a root that is itself a loop holds nothing, and does not break the others
    looped_root = tmp_path / "looped_root"
    looped_root.symlink_to(looped_root)
    (root / "ok.csv").write_text("")
    assert resolve_inside_roots(root / "ok.csv", [looped_root, root]) == root / "ok.csv"
    with pytest.raises(InputError, match="none of the allowed roots can be resolved"):
        resolve_inside_roots("x", [looped_root])
    with pytest.raises(InputError, match="unknown ~user"):
        resolve_inside_roots("~no-such-user-here/x", [root])


def test_outside_path_errors_do_not_reveal_where_a_symlink_leads(tmp_path: Path) -> None:
    root = tmp_path / "root"
    secret = tmp_path / "secret-place" / "deeper"
    secret.mkdir(parents=True)
    root.mkdir()
    (root / "innocent").symlink_to(secret)
    for path in ("innocent", "innocent/file.txt", "innocent/../../secret-place"):
        with pytest.raises(InputError) as caught:
            resolve_inside_roots(path, [root])
        text = str(caught.value)
        assert "outside the allowed roots" in text and str(root) in text and repr(path) in text
        assert "secret-place" not in text.replace(repr(path), ""), text
    with pytest.raises(InputError) as caught:
        resolve_inside_roots("/etc/../etc/passwd", [root])
    assert "resolves to" not in str(caught.value)


@given(st.lists(st.sampled_from(["a", "..", ".", "b", "/", "//", "~", "c.py"]), max_size=8))
@hsettings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200)
def test_no_path_escapes_its_root(tmp_path: Path, parts: list[str]) -> None:
    root = (tmp_path / "r").resolve()
    root.mkdir(exist_ok=True)
    try:
        resolved = resolve_inside_roots("/".join(parts) or ".", [root])
    except InputError:
        return
    assert resolved == root or resolved.is_relative_to(root)


@given(st.text(max_size=300), st.integers(min_value=1, max_value=16))
@hsettings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=150)
def test_log_chunks_reassemble_the_log_exactly(tmp_path: Path, text: str, chunk: int) -> None:
    job_dir = tmp_path / "job"
    (job_dir / "logs").mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")
    (job_dir / "logs" / "main.log").write_bytes(data)
    record = JobRecord(
        id="j-1",
        kind="k",
        spec={},
        state=JobState.SUCCEEDED,
        created_at=0,
        timeout_s=1,
        owner="t",
        job_dir=str(job_dir),
    )
    pieces, offset = [], 0
    for _ in range(len(data) + 2):
        part = read_log_chunk(record, None, offset, max(chunk, 4))  # 4 bytes hold any one character
        pieces.append(part.text)
        offset = part.next_offset
        if part.eof:
            break
    assert "".join(pieces) == text and offset == len(data)


def test_trim_partial_utf8() -> None:
    euro = "€".encode()  # 3 bytes
    assert _trim_partial_utf8(b"ab" + euro[:2]) == b"ab"
    assert _trim_partial_utf8(b"ab" + euro) == b"ab" + euro
    assert _trim_partial_utf8(b"abc") == b"abc"


def test_prompt_files_parse_and_render(tmp_path: Path) -> None:
    path = tmp_path / "p.md"
    path.write_text(
        "---\nname: check_node\ndescription: d\narguments:\n  - name: node\n    required: true\n"
        '---\nNode {node}; keep {braces} and {"json": 1}.\n'
    )
    prompt = PromptFile(path)
    assert prompt.name == "check_node" and prompt.arguments[0].required
    assert prompt.render({"node": "gpu-1"}) == 'Node gpu-1; keep {braces} and {"json": 1}.\n'
    with pytest.raises(ValueError, match="unknown argument"):
        prompt.render({"nod": "x"})
    path.write_text("no front matter")
    with pytest.raises(ValueError, match="front matter"):
        PromptFile(path)


@pytest.mark.anyio
async def test_resources_and_prompts_are_served(app: App) -> None:
    from servers.scaling.server import create_server

    async with Client(create_server(app), mode="legacy") as client:
        resources = {str(r.uri): r for r in (await client.list_resources()).resources}
        gpus = resources["infra://gpus.json"]
        assert gpus.mime_type == MIME_TYPES[".json"] and gpus.description
        [content] = (await client.read_resource("infra://gpus.json")).contents
        names = [g["name"] for g in json.loads(content.text)["gpus"]]
        assert {"A100-SXM-80GB", "H100-SXM", "H200-SXM", "B200", "L40S", "H20", "H800-SXM", "A800-SXM-80GB"} <= set(
            names
        )
        assert resources["infra://jobs.md"].mime_type == "text/markdown"
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        assert [a.name for a in prompts["triage-gpu-node"].arguments] == ["node", "symptom"]
        rendered = await client.get_prompt("triage-gpu-node", {"node": "gpu-9", "symptom": "Xid 79"})
        assert "gpu-9" in rendered.messages[0].content.text and "Xid 79" in rendered.messages[0].content.text


def test_scaling_laws_numbers() -> None:
    from servers.scaling import laws

    params = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.1}
    at_mid = laws.evaluate("scalerl", params, [laws.EvaluationPoint(compute=2542.0)])[0].value
    assert at_mid == pytest.approx((0.61 + 0.1) / 2)  # half the gain at C_mid
    big = laws.evaluate("scalerl", params, [laws.EvaluationPoint(compute=1e12)])[0].value
    assert big == pytest.approx(0.61, abs=1e-9)
    with pytest.raises(InputError, match="missing: R0"):
        laws.evaluate("scalerl", {"A": 0.6, "B": 1, "C_mid": 1}, [laws.EvaluationPoint(compute=1.0)])
    with pytest.raises(InputError, match="needs 'params'"):
        laws.evaluate("chinchilla", laws.CHINCHILLA_PUBLISHED, [laws.EvaluationPoint(compute=1.0)])
    # Compute-optimal allocation: 6 N D spends the budget, and N_opt minimises loss along that budget.
    c = 5.76e23
    opt = laws.compute_optimal(c, laws.CHINCHILLA_PUBLISHED)
    assert 6 * opt.params * opt.tokens == pytest.approx(c, rel=1e-9)
    for factor in (0.8, 1.25):
        n = opt.params * factor
        assert laws.chinchilla(n, c / (6 * n), **laws.CHINCHILLA_PUBLISHED) > opt.loss


@pytest.mark.anyio
async def test_a_wrong_prompt_or_prompt_argument_is_invalid_params_in_both_eras(app: App, mode: str) -> None:
    from mcp.shared.exceptions import MCPError
    from mcp.types import INVALID_PARAMS

    from servers.suite import create_server

    async with Client(create_server(app), mode=mode) as client:
        for name, args, expected in [
            ("no_such_prompt", None, "unknown prompt 'no_such_prompt'; prompts: "),
            ("triage-gpu-node", {"node": "n1", "bogus": "1"}, "bogus: unknown argument"),
            ("triage-gpu-node", {}, "node: required argument missing"),
        ]:
            with pytest.raises(MCPError) as caught:
                await client.get_prompt(name, args)
            assert caught.value.code == INVALID_PARAMS and expected in caught.value.message, caught.value.message
        assert (await client.get_prompt("triage-gpu-node", {"node": "n1", "symptom": "x"})).messages
