"""`llm-infra-mcp config claude`: the printed fragment has the shape Claude Desktop reads, and `--write PATH` merges
it into a claude_desktop_config.json (other servers and keys kept, ours replaced, a backup first, bad files refused
untouched, a missing file created)."""

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, StrictStr

from servers.cli import main


class ClaudeServer(BaseModel):
    """One entry of claude_desktop_config.json's mcpServers, as Claude Desktop reads a stdio server (args and env
    optional there; ours always has both: see the shape test)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    command: StrictStr
    args: list[StrictStr] = []
    env: dict[StrictStr, StrictStr] = {}


class ClaudeDesktopConfig(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    mcpServers: dict[StrictStr, ClaudeServer]  # noqa: N815 (Claude's key)


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An explicit root (so that nothing is created in the home folder) and a state folder of the test's own."""
    monkeypatch.setenv("LLM_INFRA_MCP_HOME", str(tmp_path / "state"))
    root = tmp_path / "workspace"
    root.mkdir()
    return root


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = 0
    try:
        main(["config", "claude", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def other_config() -> dict[str, Any]:
    return {
        "globalShortcut": "Ctrl+Space",
        "mcpServers": {
            "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/x"]},
            "llm-infra-suite": {"command": "/old/python", "args": ["old"], "env": {"A": "1"}},
        },
        "preferences": {"theme": "dark"},
    }


def test_printed_config_has_the_shape_claude_desktop_reads(roots: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--server", "suite", "--server", "launch", "--roots", str(roots))
    assert code == 0, err
    raw = json.loads(out)
    assert list(raw) == ["mcpServers"]
    config = ClaudeDesktopConfig.model_validate(raw)
    assert sorted(config.mcpServers) == ["llm-infra-launch", "llm-infra-suite"]
    assert all(sorted(entry) == ["args", "command", "env"] for entry in raw["mcpServers"].values())
    for name, entry in config.mcpServers.items():
        assert Path(entry.command).is_absolute() and os.access(entry.command, os.X_OK), entry.command
        assert entry.args == ["-m", "servers.cli", "serve", name.removeprefix("llm-infra-")]
        assert entry.env["LLM_INFRA_MCP_ALLOWED_ROOTS"] == str(roots.resolve())
        assert entry.env["LLM_INFRA_MCP_HOME"] == str(roots.parent / "state")


def test_write_merges_keeps_the_others_and_backs_up(
    roots: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "Claude" / "claude_desktop_config.json"
    path.parent.mkdir()
    old_text = json.dumps(other_config(), indent=4)
    path.write_text(old_text)
    path.chmod(0o640)
    code, out, err = run(
        capsys, "--server", "suite", "--server", "overlap", "--roots", str(roots), "--write", str(path)
    )
    assert code == 0, err
    new = json.loads(path.read_text())
    config = ClaudeDesktopConfig.model_validate(new)
    assert new["globalShortcut"] == "Ctrl+Space" and new["preferences"] == {"theme": "dark"}
    assert new["mcpServers"]["filesystem"] == other_config()["mcpServers"]["filesystem"]
    assert set(config.mcpServers) == {"filesystem", "llm-infra-suite", "llm-infra-overlap"}
    assert config.mcpServers["llm-infra-suite"].args[-2:] == ["serve", "suite"]  # ours replaced
    assert "old" not in config.mcpServers["llm-infra-suite"].args
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    [backup] = list(path.parent.glob("claude_desktop_config.json.bak-*"))
    assert backup.read_text() == old_text
    assert not list(path.parent.glob(".*.tmp")), "the temporary file was left behind"
    assert "updated" in out and "llm-infra-overlap" in out and "filesystem" in out and str(backup) in out

    code, out, err = run(capsys, "--roots", str(roots), "--write", str(path))  # again: a second backup, not overwritten
    assert code == 0, err
    backups = sorted(path.parent.glob("claude_desktop_config.json.bak-*"))
    assert len(backups) == 2 and backup.read_text() == old_text
    assert {b.read_text() for b in backups} == {old_text, json.dumps(new, indent=2) + "\n"}


@pytest.mark.parametrize(
    "text",
    ["{not json", "[1, 2]", '"a string"', "", '{"mcpServers": ["x"]}', b"\xff\xfe{}"],
    ids=["broken", "list", "string", "empty", "servers-not-object", "not-utf8"],
)
def test_write_refuses_a_file_that_is_not_a_json_object(
    roots: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes
) -> None:
    path = tmp_path / "claude_desktop_config.json"
    data = text if isinstance(text, bytes) else text.encode()
    path.write_bytes(data)
    before = path.stat().st_mtime_ns
    listing = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(capsys, "--roots", str(roots), "--write", str(path))
    assert code == 2 and not out
    assert str(path) in err and "nothing was changed" in err
    assert path.read_bytes() == data and path.stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # no backup, no temporary file


def test_write_creates_a_missing_file(roots: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fresh" / "claude_desktop_config.json"
    code, out, err = run(capsys, "--roots", str(roots), "--write", str(path))
    assert code == 0, err
    config = ClaudeDesktopConfig.model_validate(json.loads(path.read_text()))
    assert list(config.mcpServers) == ["llm-infra-suite"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["claude_desktop_config.json"]  # no backup, no temp file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert f"created {path}" in out


def test_write_through_a_symlink_updates_the_target(
    roots: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "dotfiles" / "claude.json"
    target.parent.mkdir()
    target.write_text(json.dumps(other_config()))
    link = tmp_path / "claude_desktop_config.json"
    link.symlink_to(target)
    code, _, err = run(capsys, "--roots", str(roots), "--write", str(link))
    assert code == 0, err
    assert link.is_symlink() and "filesystem" in json.loads(target.read_text())["mcpServers"]
