"""Files under resources/ served as MCP resources, and markdown files under prompts/ served as prompts.

Resources: every file, at infra://<path relative to resources/>, with a mime type from its extension.
Prompts: markdown with YAML front matter naming the prompt and its arguments; the body is the message,
with {argument} replaced by the value given (other braces are left alone).
"""

import logging
import re
from pathlib import Path
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver.prompts.base import Prompt, PromptArgument
from mcp.server.mcpserver.resources import FileResource

from servers.core.paths import prompts_dir, resources_dir

log = logging.getLogger(__name__)

URI_SCHEME = "infra"
MIME_TYPES = {
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".md": "text/markdown",
    ".csv": "text/csv",
    ".txt": "text/plain",
    ".log": "text/plain",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
}
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n(.*)\Z", re.DOTALL)


def data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def register_file_resources(server: MCPServer, root: Path | None = None) -> None:
    root = root or resources_dir()
    for path in data_files(root):
        relative = path.relative_to(root).as_posix()
        mime = MIME_TYPES.get(path.suffix.lower(), "application/octet-stream")
        server.add_resource(
            FileResource(
                uri=f"{URI_SCHEME}://{relative}",
                name=relative,
                mime_type=mime,
                path=path.resolve(),
                description=_describe(path),
            )
        )


def _json_description(text: str) -> str | None:
    """The top-level "description" string of a JSON object, reading its members in order only until it (the
    catalogs put it first, and the Xid catalog is 330 KB that a server start need not parse); None without one."""
    import json

    decoder = json.JSONDecoder()
    ws = re.compile(r"[ \t\n\r]*")
    pos = ws.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("{", pos):
        return None
    pos += 1
    while True:
        pos = ws.match(text, pos).end()  # type: ignore[union-attr]
        if not text.startswith('"', pos):
            return None
        key, pos = decoder.raw_decode(text, pos)
        pos = ws.match(text, pos).end()  # type: ignore[union-attr]
        if not text.startswith(":", pos):
            return None
        pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
        value, pos = decoder.raw_decode(text, pos)
        if key == "description":
            return value if isinstance(value, str) else None
        pos = ws.match(text, pos).end()  # type: ignore[union-attr]
        if not text.startswith(",", pos):
            return None
        pos += 1


def _describe(path: Path) -> str:
    """A file's description: the `description` field of a JSON document, else its first markdown heading."""
    if path.suffix == ".json":
        try:
            found = _json_description(path.read_text())
        except ValueError:
            return path.name
        if found is not None:
            return found
    if path.suffix == ".md":
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                return line.lstrip("# ").strip()
    return path.name


class PromptFile:
    """One prompt file, parsed: name, title, description, arguments and the body template."""

    def __init__(self, path: Path) -> None:
        match = _FRONT_MATTER.match(path.read_text())
        if not match:
            raise ValueError(f"{path}: a prompt file starts with YAML front matter between '---' lines")
        import yaml  # only when a prompt file is read: a start from the tool cache reads none

        meta: dict[str, Any] = yaml.safe_load(match.group(1)) or {}
        self.path = path
        self.name: str = meta.get("name") or path.stem
        self.title: str | None = meta.get("title")
        self.description: str = meta.get("description") or ""
        self.arguments = [
            PromptArgument(name=a["name"], description=a.get("description"), required=bool(a.get("required", False)))
            for a in meta.get("arguments") or []
        ]
        self.body = match.group(2).strip() + "\n"
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", self.name):
            raise ValueError(f"{path}: prompt name {self.name!r} must be lowercase letters, digits, '_' or '-'")

    def render(self, values: dict[str, Any]) -> str:
        known = {a.name for a in self.arguments}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown argument(s) {sorted(unknown)}; prompt {self.name} takes {sorted(known)}")

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in known:
                return match.group(0)
            value = values.get(name)
            return "(not given)" if value in (None, "") else str(value)

        return re.sub(r"\{([a-z_][a-z0-9_]*)\}", substitute, self.body)


def prompt_entries(root: Path) -> list[dict[str, Any]]:
    """What prompts/list shows of each prompt file (what the tool cache keeps)."""
    entries = []
    for path in sorted(root.glob("*.md")):
        parsed = PromptFile(path)
        entries.append(
            {
                "file": path.name,
                "name": parsed.name,
                "title": parsed.title,
                "description": parsed.description,
                "arguments": [a.model_dump(mode="json", exclude_none=True) for a in parsed.arguments],
            }
        )
    return entries


def register_prompts(server: MCPServer, root: Path | None = None, entries: list[dict[str, Any]] | None = None) -> None:
    """Every prompt file as a prompt; from `entries` (prompt_entries, kept by the tool cache) without reading the
    files, each then read at its first use. An entry names its file by name only, and only a file of `root` is
    read: what the cache says is never taken as a path."""
    root = root or prompts_dir()
    parsed: dict[str, PromptFile] = {}
    present = {p.name for p in root.glob("*.md")}

    def render_of(name: str) -> Any:
        def render(**values: Any) -> str:
            if name not in parsed:
                parsed[name] = PromptFile(root / name)
            return parsed[name].render(values)

        return render

    for entry in entries if entries is not None else prompt_entries(root):
        name = entry.get("file")
        if name not in present:
            log.warning("prompt entry %r left out: it names no prompt file of %s", str(name)[:100], root)
            continue
        server.add_prompt(
            Prompt(
                name=entry["name"],
                title=entry["title"],
                description=entry["description"],
                arguments=[PromptArgument(**a) for a in entry["arguments"]],
                fn=render_of(name),
            )
        )
